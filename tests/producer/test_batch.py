"""TransactionalProducer.produce_batch() (guarantee 1.21): a batch it returned from is in
the transaction whole, in order, and committed exactly once; a batch it raised for left
the transaction either unchanged (arguments of the wrong shape, an iterable that raised
before its first record) or unable to commit (a record refused on the way, an iterable
that raised after some records were queued, a signal). Read back on the real broker
with an independent read_committed consumer (kafka-python, tests/support/rig.py); the
faults a real broker cannot be made to show (a queue that stays full, Produce errors)
come from librdkafka's mock cluster.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kafka_txn import (
    CommitFailedException,
    FailureType,
    FatalError,
    IllegalStateError,
    KafkaTxnError,
    ProduceFailedException,
    TransactionAbortableError,
    TransactionalProducer,
)
from kafka_txn.testing import ApiKey, MockCluster
from tests.support.fuzzing import assert_every_branch, reached_branches
from tests.support.rig import Broker

Record = tuple[bytes | None, bytes | None]
"""(key, value) as the read_committed consumer returns them."""

ERRORS_ONLY = {"delivery.report.only.error": True}
LONE_SURROGATE = "order-\ud800"
"""A str that is no valid UTF-8: confluent-kafka cannot encode it."""


class IterableBrokeError(Exception):
    """The exception a batch's iterable raises in these tests."""


def _note(exc: BaseException) -> str:
    return " ".join(getattr(exc, "__notes__", ()))


def _position_note(k: int) -> str:
    return f"record {k} of the batch (counting from 0): the {k} before it were queued"


def _values(n: int, prefix: str = "v") -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def _by_partition(
    broker: Broker, topic: str, expected: int, linger: float = 0.5
) -> dict[int, list[Record]]:
    """Every committed (key, value) of ``topic``, by partition and in offset order, read
    with kafka-python under read_committed up to each partition's last stable offset;
    waits up to 20 s for ``expected`` records, then reads ``linger`` seconds more, so that
    a duplicate or a record that should stay invisible is caught."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers,
        isolation_level="read_committed",
        enable_auto_commit=False,
        group_id=None,
    )
    try:
        deadline = time.monotonic() + 20
        ids = consumer.partitions_for_topic(topic)
        while not ids and time.monotonic() < deadline:
            time.sleep(0.1)
            ids = consumer.partitions_for_topic(topic)
        assert ids, f"topic {topic} has no partitions in metadata"
        partitions = [KafkaTopicPartition(topic, p) for p in sorted(ids)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        seen: dict[int, list[Record]] = {p.partition: [] for p in partitions}

        def read_to_end() -> None:
            ends = consumer.end_offsets(partitions)  # last stable offsets
            while any(consumer.position(tp) < ends[tp] for tp in partitions):
                assert time.monotonic() < deadline + 20, f"{topic}: LSO not reached"
                for tp, records in consumer.poll(timeout_ms=100).items():
                    seen[tp.partition].extend((r.key, r.value) for r in records)

        while True:
            read_to_end()
            if sum(map(len, seen.values())) >= expected or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        until = time.monotonic() + linger
        while time.monotonic() < until:
            read_to_end()
            time.sleep(0.05)
        return seen
    finally:
        consumer.close()


def _committed(broker: Broker, topic: str, expected: int) -> list[Record]:
    """The records of a one-partition ``topic``, in order."""
    return [r for records in _by_partition(broker, topic, expected).values() for r in records]


def _broken(items: Iterable[Any], after: int, exc: BaseException) -> Iterator[Any]:
    """``items``, raising ``exc`` once ``after`` of them were taken (or at their end)."""
    for i, item in enumerate(items):
        if i == after:
            raise exc
        yield item
    raise exc


def _assert_names(commit: CommitFailedException, failure: ProduceFailedException) -> None:
    """The commit's cause is the recorded failure raised by the batch: the same object,
    or for a record of the wrong type (raised as a ProduceFailedException that is also a
    TypeError, as produce() does) the recorded record it was made from."""
    cause = commit.__cause__
    if isinstance(failure, TypeError):
        assert isinstance(cause, ProduceFailedException), repr(cause)
        assert cause.kafka_error.code() == failure.kafka_error.code(), (cause, failure)
        assert cause.failure_type is failure.failure_type and cause.topic == failure.topic
    else:
        assert cause is failure, (cause, failure)


def _started(producer_config: dict[str, Any], **kwargs: Any) -> TransactionalProducer:
    producer = TransactionalProducer(producer_config, **kwargs)
    producer.init_transactions()
    producer.begin_transaction()
    return producer


# ---------------------------------------------------------------- batches that commit
@pytest.mark.parametrize(
    "shape", ["values", "keyed", "generators", "partition", "tuples", "serializers"]
)
@pytest.mark.guarantee("1.21")
def test_a_batch_commits_whole_in_order_exactly_once(
    broker: Broker, topic: str, producer_config: dict[str, Any], shape: str
) -> None:
    """A batch produce_batch() returned from (its count: every record) is committed
    whole: a read_committed consumer sees each record once, with its key, in the order
    of the batch within each partition; a given partition holds them all. The shapes:
    values alone, values with keys (lists), both as generators, a partition given, a
    tuple of str values, and serializers applied to each record."""
    n = 60
    keys = [f"k{i % 7}".encode() for i in range(n)]
    values = _values(n)
    kwargs: dict[str, Any] = {}
    if shape == "serializers":
        kwargs = {
            "key_serializer": lambda k, ctx: b"key:" + str(k).encode(),
            "value_serializer": lambda v, ctx: b"value:" + str(v).encode(),
        }
    with _started(producer_config, **kwargs) as producer:
        if shape == "values":
            queued = producer.produce_batch(topic, values)
            expected: list[Record] = [(None, v) for v in values]
        elif shape == "keyed":
            queued = producer.produce_batch(topic, values, keys)
            expected = list(zip(keys, values, strict=True))
        elif shape == "generators":
            queued = producer.produce_batch(topic, (v for v in values), iter(keys))
            expected = list(zip(keys, values, strict=True))
        elif shape == "partition":
            queued = producer.produce_batch(topic, values, keys, partition=2)
            expected = list(zip(keys, values, strict=True))
        elif shape == "tuples":
            queued = producer.produce_batch(topic, tuple(v.decode() for v in values))
            expected = [(None, v) for v in values]
        else:
            queued = producer.produce_batch(topic, range(n), (f"k{i % 7}" for i in range(n)))
            expected = [(b"key:" + k, b"value:%d" % i) for i, k in enumerate(keys)]
        assert queued == n
        producer.commit_transaction()
    seen = _by_partition(broker, topic, n)
    everything = [r for records in seen.values() for r in records]
    assert sorted(everything, key=repr) == sorted(expected, key=repr)  # each exactly once
    for records in seen.values():  # in the batch's order within each partition
        assert records == sorted(records, key=expected.index)
    if shape == "keyed":  # one key, one partition: each key's records all in order
        for key in set(keys):
            holding = [p for p, records in seen.items() if any(k == key for k, _ in records)]
            assert len(holding) == 1, (key, holding)
    if shape == "partition":
        assert seen[2] == expected and not seen[0] and not seen[1]


@pytest.mark.guarantee("1.21")
def test_an_empty_batch_returns_zero_and_commits_nothing(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """An empty list, an empty generator, empty keys and values: 0 queued, the state
    unchanged, and the transaction commits the records produced around them only."""
    topic = broker.create_topic(partitions=1)
    with _started(producer_config) as producer:
        assert producer.produce_batch(topic, []) == 0
        nothing: tuple[bytes, ...] = ()
        assert producer.produce_batch(topic, (v for v in nothing)) == 0
        assert producer.produce_batch(topic, [], []) == 0
        assert producer.produce_batch(topic, iter(()), (k for k in nothing), partition=0) == 0
        assert producer.state == "in transaction"
        producer.commit_transaction()
        producer.begin_transaction()
        producer.produce(topic, b"before")
        assert producer.produce_batch(topic, ()) == 0
        producer.produce(topic, b"after")
        producer.commit_transaction()
    assert _committed(broker, topic, 2) == [(None, b"before"), (None, b"after")]


@pytest.mark.guarantee("1.21")
def test_a_full_queue_is_waited_for_and_the_batch_goes_on(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """With room for 5 records in librdkafka's queue, a batch of 400 fills it over and
    over: each time produce_batch() serves delivery reports until there is room, as
    produce() does, and goes on; it returns 400, and all 400 commit once, in order."""
    topic = broker.create_topic(partitions=1)
    config = {**producer_config, "queue.buffering.max.messages": 5, "linger.ms": 1}
    n = 400
    with _started(config, queue_full_timeout=30) as producer:
        values = _values(n)
        assert producer.produce_batch(topic, values, (b"k%d" % (i % 3) for i in range(n))) == n
        producer.commit_transaction()
    assert _committed(broker, topic, n) == [(b"k%d" % (i % 3), v) for i, v in enumerate(values)]


# ---------------------------------------------------------------- records refused on the way
def _bad_type(k: int) -> list[Any]:
    values: list[Any] = _values(6)
    values[k] = {"amount": 5}
    return values


def _too_large(k: int) -> list[Any]:
    values: list[Any] = _values(6)
    values[k] = b"x" * 2_000
    return values


def _unencodable(k: int) -> list[Any]:
    values: list[Any] = _values(6)
    values[k] = LONE_SURROGATE
    return values


@dataclass(frozen=True)
class _Refused:
    """A batch whose record ``k`` is refused before it is queued: how it fails."""

    values: Callable[[int], list[Any]]
    code: int
    also: type[Exception] = ProduceFailedException
    serializing: bool = False


REFUSED = {
    "wrong type": _Refused(_bad_type, KafkaError._INVALID_ARG, also=TypeError),
    "over message.max.bytes": _Refused(_too_large, KafkaError.MSG_SIZE_TOO_LARGE),
    "not UTF-8": _Refused(_unencodable, KafkaError._VALUE_SERIALIZATION),
    "serializer raised": _Refused(
        lambda k: _values(6), KafkaError._VALUE_SERIALIZATION, serializing=True
    ),
}


def _serializer_failing_on(k: int) -> Callable[[Any, Any], bytes]:
    def serialize(value: Any, ctx: Any) -> bytes:
        if value == b"v-%d" % k:
            raise ValueError(f"cannot encode record {k}")
        return bytes(value)

    return serialize


@pytest.mark.parametrize("errors_only", [False, True], ids=["reports", "errors-only"])
@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("refusal", list(REFUSED))
@pytest.mark.guarantee("1.2", "1.20", "1.21")
def test_a_record_refused_at_once_stops_the_batch_and_fails_the_commit(
    broker: Broker,
    producer_config: dict[str, Any],
    refusal: str,
    k: int,
    errors_only: bool,
) -> None:
    """Record k of a batch is refused before it is queued (a value of the wrong type, a
    record over message.max.bytes, a str that is no UTF-8, a serializer that raises):
    produce_batch() raises its ProduceFailedException (a TypeError too for the type),
    whose note gives k and says the k before were queued and none after; the failure is
    recorded, so commit_transaction() raises CommitFailedException with that very
    failure as its cause, and nothing of the transaction is visible. The same with an
    error-only producer. After the abort the producer goes on."""
    case = REFUSED[refusal]
    topic = broker.create_topic(partitions=1)
    config = {**producer_config, "message.max.bytes": 1_000}
    if errors_only:
        config.update(ERRORS_ONLY)
    kwargs = {"value_serializer": _serializer_failing_on(k)} if case.serializing else {}
    with _started(config, **kwargs) as producer:
        assert producer.error_reports_only is errors_only
        taken: list[Any] = []

        def values() -> Iterator[Any]:
            for value in case.values(k):
                taken.append(value)
                yield value

        with pytest.raises(ProduceFailedException) as info:
            producer.produce_batch(topic, values(), _values(6, "k"))
        failure = info.value
        assert isinstance(failure, case.also)
        assert failure.failure_type is FailureType.MESSAGE_REJECTED
        assert failure.code() == case.code, failure
        assert _position_note(k) + ", none after it" in _note(failure)
        assert len(taken) == k + 1  # none after it was even taken
        assert producer.state == "in transaction"
        with pytest.raises(CommitFailedException) as commit:
            producer.commit_transaction()
        _assert_names(commit.value, failure)
        producer.abort_transaction()
        producer.begin_transaction()
        assert producer.produce_batch(topic, [b"next"]) == 1
        producer.commit_transaction()
    assert _committed(broker, topic, 1) == [(None, b"next")]


@pytest.mark.parametrize("errors_only", [False, True], ids=["reports", "errors-only"])
@pytest.mark.guarantee("1.2", "1.20", "1.21")
def test_an_invalid_topic_name_fails_the_batch_before_its_first_record(
    broker: Broker, producer_config: dict[str, Any], errors_only: bool
) -> None:
    """produce_batch() to an invalid topic name raises ProduceFailedException
    (MESSAGE_REJECTED, TOPIC_EXCEPTION) before anything is taken from the iterable; the
    failure is recorded (an empty batch too: the topic is checked once per batch), so the
    commit fails naming it, and nothing of the transaction is visible."""
    topic = broker.create_topic(partitions=1)
    config = {**producer_config, **(ERRORS_ONLY if errors_only else {})}
    for batch in ([b"lost"], []):
        with _started(config) as producer:
            producer.produce(topic, b"sibling")
            taken: list[bytes] = []

            def values(batch: list[bytes] = batch, taken: list[bytes] = taken) -> Iterator[bytes]:
                for value in batch:
                    taken.append(value)
                    yield value

            with pytest.raises(ProduceFailedException) as info:
                producer.produce_batch("bad topic!", values())
            assert taken == []
            assert info.value.failure_type is FailureType.MESSAGE_REJECTED
            assert info.value.name() == "TOPIC_EXCEPTION"
            assert "not a valid topic name" in info.value.message
            with pytest.raises(CommitFailedException) as commit:
                producer.commit_transaction()
            assert commit.value.__cause__ is info.value
            producer.abort_transaction()
    assert _committed(broker, topic, 0) == []


# ---------------------------------------------------------------- iterables that raise
@pytest.mark.parametrize("errors_only", [False, True], ids=["reports", "errors-only"])
@pytest.mark.guarantee("1.21")
def test_an_iterable_that_raises_after_some_records_makes_the_transaction_uncommittable(
    broker: Broker, producer_config: dict[str, Any], errors_only: bool
) -> None:
    """The values' iterable raises after 4 records were queued: produce_batch() raises
    ProduceFailedException from the iterable's exception, recorded, so the commit fails
    naming it and none of the 4 is ever visible. Keys that turn out shorter than the
    values (generators: no length to compare first) do the same, saying the lengths
    differ."""
    topic = broker.create_topic(partitions=1)
    config = {**producer_config, **(ERRORS_ONLY if errors_only else {})}
    with _started(config) as producer:
        broken = IterableBrokeError("the source went away")
        with pytest.raises(ProduceFailedException) as info:
            producer.produce_batch(topic, _broken(_values(10), 4, broken))
        assert info.value.__cause__ is broken
        assert "after 4 records were queued" in info.value.message
        assert "cannot commit a part of the batch" in info.value.message
        with pytest.raises(CommitFailedException) as commit:
            producer.commit_transaction()
        assert commit.value.__cause__ is info.value
        producer.abort_transaction()

        producer.begin_transaction()
        with pytest.raises(ProduceFailedException) as short:
            producer.produce_batch(
                topic, (v for v in _values(5)), (k for k in _values(3, "k")), partition=0
            )
        assert "keys and values differ in length after 3 records" in short.value.message
        with pytest.raises(CommitFailedException) as commit:
            producer.commit_transaction()
        assert commit.value.__cause__ is short.value
        producer.abort_transaction()
    assert _committed(broker, topic, 0) == []


@pytest.mark.guarantee("1.21")
def test_an_iterable_that_raises_before_its_first_record_leaves_the_transaction_as_it_was(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """Nothing queued yet: the iterable's own exception comes out as it is, and unsized
    keys and values of different lengths with nothing queued (an empty side) raise
    ValueError saying so; either way the transaction commits what was sent around it."""
    topic = broker.create_topic(partitions=1)
    with _started(producer_config) as producer:
        producer.produce(topic, b"before")
        broken = IterableBrokeError("the source is down")
        with pytest.raises(IterableBrokeError) as info:
            producer.produce_batch(topic, _broken(_values(3), 0, broken))
        assert info.value is broken
        with pytest.raises(ValueError, match="keys and values differ in length: pass one key"):
            producer.produce_batch(topic, (v for v in _values(3)), (k for k in _values(0)))
        with pytest.raises(ValueError, match="keys and values differ in length"):
            producer.produce_batch(topic, (v for v in _values(0)), iter([b"k"]))
        assert producer.state == "in transaction"
        producer.produce(topic, b"after")
        producer.commit_transaction()
    assert _committed(broker, topic, 2) == [(None, b"before"), (None, b"after")]


@pytest.mark.guarantee("1.21")
def test_a_keyboard_interrupt_during_a_batch_makes_the_transaction_uncommittable(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """A KeyboardInterrupt comes out of the batch's iterable after 3 records were queued
    (as a signal would, between two records): it is raised as it is, the batch counts as
    a failed record, and the commit fails; nothing of it is visible, and the producer
    goes on after the abort."""
    topic = broker.create_topic(partitions=1)
    with _started(producer_config) as producer:
        with pytest.raises(KeyboardInterrupt):
            producer.produce_batch(topic, _broken(_values(6), 3, KeyboardInterrupt()))
        with pytest.raises(CommitFailedException) as commit:
            producer.commit_transaction()
        cause = commit.value.__cause__
        assert isinstance(cause, ProduceFailedException)
        assert cause.code() == KafkaError._INTR and "KeyboardInterrupt" in cause.message
        producer.abort_transaction()
        producer.begin_transaction()
        producer.produce_batch(topic, [b"next"])
        producer.commit_transaction()
    assert _committed(broker, topic, 1) == [(None, b"next")]


# ---------------------------------------------------------------- argument shapes
def _wrong_shapes(topic: str) -> list[tuple[Callable[[TransactionalProducer], object], str]]:
    return [
        (lambda p: p.produce_batch(topic, b"one record"), r"produce_batch\(values=\.\.\.\) "
         r"must be an iterable of record values \(a list\.\.\.\), got b'one record' \(bytes\)"
         r": to send one record, call produce\(\)"),
        (lambda p: p.produce_batch(topic, "one record"), r"\(str\): to send one record"),
        (lambda p: p.produce_batch(topic, bytearray(b"v")), r"\(bytearray\)"),
        (lambda p: p.produce_batch(topic, memoryview(b"v")), r"\(memoryview\)"),
        (lambda p: p.produce_batch(topic, [b"v"], b"k"), r"produce_batch\(keys=\.\.\.\)"),
        (lambda p: p.produce_batch(topic, {b"k": b"v"}), r"got a mapping .*: pass "
         r"values=d\.values\(\), keys=d\.keys\(\)"),
        (lambda p: p.produce_batch(topic, [b"v"], {b"k": 1}), r"produce_batch\(keys=\.\.\.\) "
         r"must be an iterable of record keys, got a mapping"),
        (lambda p: p.produce_batch(topic, 5), r"produce_batch\(values=\.\.\.\) must be an "
         r"iterable of record values, got 5 \(int\)"),
        (lambda p: p.produce_batch(topic, None), r"got None \(NoneType\)"),
        (lambda p: p.produce_batch(topic, [b"v"], 7), r"produce_batch\(keys=\.\.\.\)"),
        (lambda p: p.produce_batch(topic, [b"v", b"w"], [b"k"]), r"produce_batch\(\) got 2 "
         r"values and 1 keys: pass one key per value \(None for a record without a key\)"),
        (lambda p: p.produce_batch(topic, [], [None]), r"got 0 values and 1 keys"),
        (lambda p: p.produce_batch(topic, [b"v"], partition=-2), r"produce_batch\(partition="
         r"\.\.\.\) must be a partition number >= 0, or -1 \(the partitioner chooses\), got "
         r"-2 \(int\)"),
        (lambda p: p.produce_batch(topic, [b"v"], partition="0"), r"got '0' \(str\)"),
        (lambda p: p.produce_batch(topic, [b"v"], partition=True), r"got True \(bool\)"),
        (lambda p: p.produce_batch(topic, [b"v"], partition=1.0), r"got 1\.0 \(float\)"),
    ]  # fmt: skip


_SHAPE_ERRORS = {
    "bytes": TypeError, "str": TypeError, "bytearray": TypeError, "memoryview": TypeError,
    "keys bytes": TypeError, "mapping": TypeError, "keys mapping": TypeError,
    "not iterable": TypeError, "None": TypeError, "keys not iterable": TypeError,
    "lengths": ValueError, "lengths empty": ValueError, "partition -2": ValueError,
    "partition str": TypeError, "partition bool": TypeError, "partition float": TypeError,
}  # fmt: skip


@pytest.mark.guarantee("1.16", "1.21")
def test_arguments_of_the_wrong_shape_are_refused_before_anything_is_queued(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """A single bytes/str/bytearray/memoryview as values or keys, a mapping, no iterable,
    sized keys and values of different lengths, a partition < -1 or no int: TypeError or
    ValueError naming the argument and the fix, in every state (the shape is checked
    before the state), the state unchanged; in a transaction nothing of it is queued and
    the transaction commits what was sent around it."""
    topic = broker.create_topic(partitions=1)
    cases = list(zip(_wrong_shapes(topic), _SHAPE_ERRORS.items(), strict=True))
    producer = TransactionalProducer(producer_config)
    try:
        for state in ("new", "ready", "in transaction"):
            if state == "ready":
                producer.init_transactions()
            if state == "in transaction":
                producer.begin_transaction()
                producer.produce(topic, b"before")
            for (call, pattern), (name, error) in cases:
                with pytest.raises((TypeError, ValueError)) as info:
                    call(producer)
                assert type(info.value) is error, (name, info.value)
                assert not isinstance(info.value, KafkaTxnError), (name, info.value)
                assert re.search(pattern, str(info.value)), (name, str(info.value))
                assert producer.state == state
        producer.produce(topic, b"after")
        producer.commit_transaction()
    finally:
        producer.close()
    assert _committed(broker, topic, 2) == [(None, b"before"), (None, b"after")]


# ---------------------------------------------------------------- states
@pytest.mark.guarantee("1.6", "1.21")
def test_a_batch_in_a_wrong_state_raises_what_produce_would(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """Before init, when ready, after a failed commit (abortable error) and after close:
    produce_batch() raises the error produce() raises there (IllegalStateError, and the
    transaction's TransactionAbortableError in the abortable state), takes nothing from
    its iterable and changes nothing."""
    topic = broker.create_topic(partitions=1)
    taken: list[bytes] = []

    def values() -> Iterator[bytes]:
        taken.append(b"v")
        yield b"v"

    def compare(producer: TransactionalProducer, expected: type[Exception]) -> None:
        state = producer.state
        with pytest.raises(KafkaTxnError) as single:
            producer.produce(topic, b"v")
        with pytest.raises(KafkaTxnError) as batch:
            producer.produce_batch(topic, values())
        assert type(batch.value) is type(single.value) is expected, (batch.value, single.value)
        assert str(batch.value) == str(single.value).replace("produce(", "produce_batch(")
        assert producer.state == state and taken == []

    producer = TransactionalProducer(producer_config)
    try:
        compare(producer, IllegalStateError)
        producer.init_transactions()
        compare(producer, IllegalStateError)
        producer.begin_transaction()
        with pytest.raises(ProduceFailedException):
            producer.produce_batch("bad topic!", [b"lost"])
        with pytest.raises(CommitFailedException):
            producer.commit_transaction()
        assert producer.state == "abortable error"
        compare(producer, TransactionAbortableError)
        producer.abort_transaction()
        producer.begin_transaction()
        assert producer.produce_batch(topic, [b"kept"]) == 1
        producer.commit_transaction()
    finally:
        producer.close()
    compare(producer, IllegalStateError)
    assert _committed(broker, topic, 1) == [(None, b"kept")]


# ---------------------------------------------------------------- other threads
def _paused_batch(
    producer: TransactionalProducer, topic: str, first: int, then: int
) -> tuple[threading.Thread, threading.Event, threading.Event, list[object]]:
    """A thread running produce_batch() of ``first + then`` records whose iterable
    pauses after ``first`` until released; the events: paused, release; the list gets
    the batch's count or its exception."""
    paused, release = threading.Event(), threading.Event()
    outcome: list[object] = []

    def values() -> Iterator[bytes]:
        yield from _values(first, "a")
        paused.set()
        assert release.wait(30)
        yield from _values(then, "b")

    def run() -> None:
        try:
            outcome.append(producer.produce_batch(topic, values()))
        except BaseException as exc:  # checked by the test
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert paused.wait(30)
    return thread, paused, release, outcome


def _release_once_state_leaves(
    producer: TransactionalProducer, release: threading.Event
) -> threading.Thread:
    """Release the batch a moment after commit, prepare or abort started (and waits for
    it): one that did not wait would be over by then, and the rest of the batch would
    miss it. The moment only makes that mistake show; nothing is timed."""

    def watch() -> None:
        while producer.state == "in transaction" and not release.is_set():
            time.sleep(0.001)
        time.sleep(0.3)
        release.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


@pytest.mark.adversary
@pytest.mark.parametrize("ending", ["commit", "prepare", "abort"])
@pytest.mark.guarantee("1.8", "1.21")
def test_commit_prepare_and_abort_wait_for_a_batch_under_way_in_another_thread(
    broker: Broker, producer_config: dict[str, Any], ending: str
) -> None:
    """A batch in another thread is paused between two records when commit, prepare or
    abort starts; it waits for the batch, which goes on to its end (its state check was
    done once, for the batch) and returns its count: a committed (or prepared, then
    completed) transaction holds every record of the batch, and an aborted one none,
    and no record of it joins the next transaction."""
    topic = broker.create_topic(partitions=1)
    two_phase = {"transaction.two.phase.commit.enable": True} if ending == "prepare" else {}
    config = {**producer_config, **two_phase}
    first, then = 5, 20
    batch = [(None, v) for v in _values(first, "a") + _values(then, "b")]
    with _started(config) as producer:
        thread, _, release, outcome = _paused_batch(producer, topic, first, then)
        watcher = _release_once_state_leaves(producer, release)
        try:
            if ending == "commit":
                producer.commit_transaction()
            elif ending == "prepare":
                stored = producer.prepare_transaction()
                thread.join(30)
                assert outcome == [first + then]
                producer.complete_transaction(stored)
            else:
                producer.abort_transaction()
            thread.join(30)
        finally:
            release.set()
            thread.join(30)
            watcher.join(30)
        assert outcome == [first + then], outcome
        producer.begin_transaction()
        producer.produce(topic, b"next")
        producer.commit_transaction()
    expected = ([] if ending == "abort" else batch) + [(None, b"next")]
    assert _committed(broker, topic, len(expected)) == expected


def _batch_closing_itself(
    producer: TransactionalProducer, topic: str
) -> tuple[BaseException | int, list[str]]:
    """A batch of 6 whose iterable calls close() before its fourth record, as a signal
    handler (SIGTERM calling close()) would on the batch's own thread; returns what the
    batch raised (or its count) and the producer's state when close() returned."""
    closed: list[str] = []

    def values() -> Iterator[bytes]:
        for i, value in enumerate(_values(6)):
            if i == 3:
                producer.close()
                closed.append(producer.state)
            yield value

    try:
        return producer.produce_batch(topic, values()), closed
    except BaseException as exc:  # checked by the test
        return exc, closed


@pytest.mark.adversary
@pytest.mark.guarantee("1.8", "1.21")
def test_a_close_on_the_batchs_own_thread_does_not_wait_for_it_and_commits_nothing(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """close() called on the batch's own thread between two of its records (a signal
    handler's): the batch cannot return while close() waits, so close() does not wait
    for it (produce_batch is one of the send frames it counts as its own) and aborts
    the transaction; the batch then raises instead of queuing the rest and returning,
    and nothing of it is ever committed."""
    topic = broker.create_topic(partitions=1)
    producer = TransactionalProducer(producer_config, operation_timeout=10)
    producer.init_transactions()
    producer.begin_transaction()
    outcome, closed = _batch_closing_itself(producer, topic)
    assert closed == ["closed"]
    assert isinstance(outcome, KafkaTxnError), outcome
    assert _committed(broker, topic, 0) == []


def test_a_batch_that_close_overtook_is_refused_as_after_close(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """As produce() overtaken by close(): the rest of the batch is refused with
    IllegalStateError saying close() was called, not taken for a rejected record."""
    topic = broker.create_topic(partitions=1)
    producer = TransactionalProducer(producer_config, operation_timeout=10)
    producer.init_transactions()
    producer.begin_transaction()
    outcome, _ = _batch_closing_itself(producer, topic)
    assert isinstance(outcome, IllegalStateError), repr(outcome)
    assert "after close()" in str(outcome)


# ---------------------------------------------------------------- the mock cluster's faults
def _mock_ready(config: dict[str, Any], **kwargs: Any) -> TransactionalProducer:
    producer = TransactionalProducer(config, operation_timeout=30, **kwargs)
    producer.init_transactions()
    producer.begin_transaction()
    return producer


@pytest.mark.mock
@pytest.mark.parametrize("errors_only", [False, True], ids=["reports", "errors-only"])
@pytest.mark.guarantee("1.2", "1.20", "1.21")
def test_a_queue_that_stays_full_fails_the_batch_at_its_record(
    mock_cluster: MockCluster, mock_config: Callable[..., dict[str, Any]], errors_only: bool
) -> None:
    """Every broker is down, so room in a queue of 4 never comes: the fifth record of the
    batch waits queue_full_timeout, then fails with _QUEUE_FULL, its note giving its
    position (4 queued, none after), and the commit fails naming it."""
    extra = {"delivery_report_only_error": True} if errors_only else {}
    producer = _mock_ready(
        mock_config(queue_buffering_max_messages=4, **extra), queue_full_timeout=0.5
    )
    try:
        for broker_id in (1, 2, 3):
            mock_cluster.set_broker_down(broker_id)
        with pytest.raises(ProduceFailedException) as info:
            producer.produce_batch("t", _values(10), _values(10, "k"), partition=0)
        failure = info.value
        assert failure.code() == KafkaError._QUEUE_FULL
        assert failure.key == b"k-4"
        assert _position_note(4) + ", none after it" in _note(failure)
        with pytest.raises(CommitFailedException) as commit:
            producer.commit_transaction(timeout=5)
        assert commit.value.__cause__ is failure
        for broker_id in (1, 2, 3):
            mock_cluster.set_broker_down(broker_id, down=False)
        producer.abort_transaction()
    finally:
        producer.close()


@pytest.mark.mock
@pytest.mark.parametrize("errors_only", [False, True], ids=["reports", "errors-only"])
@pytest.mark.guarantee("1.2", "1.20", "1.21")
def test_a_record_of_a_returned_batch_that_the_broker_refuses_fails_the_commit(
    mock_cluster: MockCluster, mock_config: Callable[..., dict[str, Any]], errors_only: bool
) -> None:
    """The broker refuses the Produce request of a batch produce_batch() returned from
    (NOT_ENOUGH_REPLICAS past the retries): the failed record is reported, and the
    commit raises CommitFailedException with its failure as the cause; a later batch is
    refused with the transaction's TransactionAbortableError (noting its position), as
    produce() is."""
    mock_cluster.create_topic("t", partitions=1, replication_factor=3)
    extra = {"delivery_report_only_error": True} if errors_only else {}
    producer = _mock_ready(mock_config(message_send_max_retries=1, **extra))
    try:
        mock_cluster.push_request_errors(ApiKey.PRODUCE, *[KafkaError.NOT_ENOUGH_REPLICAS] * 2)
        assert producer.produce_batch("t", _values(5), partition=0) == 5
        refused: Exception | None = None
        deadline = time.monotonic() + 10
        while refused is None and time.monotonic() < deadline:
            try:  # until librdkafka failed the records in the background
                producer.produce_batch("t", [b"later"], partition=0)
                time.sleep(0.05)
            except TransactionAbortableError as exc:
                refused = exc
        assert isinstance(refused, TransactionAbortableError), refused
        assert not isinstance(refused, ProduceFailedException)
        assert _position_note(0) in _note(refused)
        with pytest.raises(CommitFailedException) as commit:
            producer.commit_transaction()
        cause = commit.value.__cause__
        assert isinstance(cause, ProduceFailedException)
        assert cause.kafka_error.code() == KafkaError.NOT_ENOUGH_REPLICAS
        producer.abort_transaction()
        producer.begin_transaction()
        assert producer.produce_batch("t", [b"next"], partition=0) == 1
        producer.commit_transaction()
    finally:
        producer.close()


# ---------------------------------------------------------------- fuzz
_MAX_BYTES = 1_000
"""The fuzzed producer's message.max.bytes."""

_MUTATIONS = (
    "none", "values bytes", "values str", "values mapping", "values not iterable",
    "keys str", "keys mapping", "keys not iterable", "sized lengths", "unsized lengths",
    "partition bad", "partition out of range", "value wrong type", "key wrong type",
    "value not UTF-8", "record too large", "iterable raises", "invalid topic",
    "topic not a str",
)  # fmt: skip

BATCH_BRANCHES = (
    "committed",  # queued whole and committed
    "committed empty",  # nothing to queue: 0, nothing committed
    "refused: shape",  # TypeError/ValueError before anything was queued: unchanged
    "iterable's own error",  # raised before any record was queued: unchanged
    "record refused",  # ProduceFailedException at record k, recorded: uncommittable
    "batch broken",  # the iterable or the lengths broke after k records: uncommittable
    "delivery failed",  # returned, then failed in delivery (a partition not there)
)

_TEXT = st.text(st.characters(codec="utf-8"), max_size=6)
_PART = st.one_of(st.none(), st.binary(max_size=6), _TEXT)


@dataclass
class _Case:
    """A batch drawn from a valid one, with one mutation."""

    mutation: str
    values: Any  # a list of records, or what a mutation put there
    keys: Any
    partition: Any = -1
    topic: Any = None  # None: the fuzz's topic
    generators: bool = False
    k: int = 0  # the record a per-record mutation hits, or where the iterable breaks
    args: dict[str, Any] = field(default_factory=dict)

    def call(self, topic: str) -> tuple[Any, Any, Any, Any]:
        values: Any = self.values
        keys: Any = self.keys
        if self.generators:
            values = (v for v in values)
            keys = None if keys is None else (k for k in keys)
        if self.mutation == "iterable raises":
            values = _broken(self.values, self.k, IterableBrokeError("broke"))
        return (topic if self.topic is None else self.topic), values, keys, self.partition


@st.composite
def batch_cases(draw: st.DrawFn, mutations: st.SearchStrategy[str] | None = None) -> _Case:
    mutation = draw(mutations if mutations is not None else st.sampled_from(_MUTATIONS))
    n = draw(st.integers(0, 6))
    values = draw(st.lists(_PART, min_size=n, max_size=n))
    keyed = draw(st.booleans())
    keys = draw(st.lists(_PART, min_size=n, max_size=n)) if keyed else None
    partition = draw(st.sampled_from([-1, 0]))
    case = _Case(mutation, values, keys, partition=partition, generators=draw(st.booleans()))
    k = draw(st.integers(0, max(n - 1, 0)))
    case.k = k
    if mutation == "values bytes":
        case.values = draw(st.sampled_from([b"abc", bytearray(b"a"), memoryview(b"ab")]))
        case.generators = False
    elif mutation == "values str":
        case.values, case.generators = draw(st.text(max_size=3)), False
    elif mutation == "values mapping":
        case.values, case.generators = {b"k": b"v"}, False
    elif mutation == "values not iterable":
        case.values = draw(st.sampled_from([5, None, 1.5, object()]))
        case.generators = False
    elif mutation.startswith("keys "):
        bad = {"keys str": draw(st.sampled_from(["k", b"k", ""])), "keys mapping": {1: 2}}
        case.keys = bad.get(mutation, draw(st.sampled_from([5, 2.5, object()])))
        case.generators = False
    elif mutation in ("sized lengths", "unsized lengths"):
        case.keys = draw(st.lists(_PART, max_size=7).filter(lambda ks: len(ks) != n))
        case.generators = mutation == "unsized lengths"
    elif mutation == "partition bad":
        case.partition = draw(st.sampled_from([-2, -(2**40), "0", 0.0, True, None, [0]]))
    elif mutation == "partition out of range":
        case.partition = 1  # the topic has one partition
    elif n and mutation in ("value wrong type", "value not UTF-8", "record too large"):
        bad_value = {
            "value wrong type": draw(st.sampled_from([5, 2.5, {"a": 1}, [b"x"], object()])),
            "value not UTF-8": LONE_SURROGATE,
            "record too large": b"x" * (_MAX_BYTES + 1),
        }[mutation]
        case.values[k] = bad_value
    elif n and mutation == "key wrong type":
        case.keys = case.keys if case.keys is not None else [None] * n
        case.keys[k] = draw(st.sampled_from([7, 1.5, object(), (b"k",)]))
    elif mutation == "iterable raises":
        case.k = draw(st.integers(0, n))
    elif mutation == "invalid topic":
        case.topic = draw(st.sampled_from(["bad topic!", "", ".", "x" * 250, "ordérs"]))
    elif mutation == "topic not a str":
        case.topic = draw(st.sampled_from([5, b"topic", None.__class__]))
    else:
        case.mutation = "none"  # a per-record mutation of an empty batch
    return case


def _encoded(part: Any) -> bytes | None:
    return part.encode() if isinstance(part, str) else part


def _expected(case: _Case) -> tuple[str, list[Record]]:
    """The branch ``case`` must reach, and the records a commit then holds."""
    n = len(case.values) if isinstance(case.values, list) else 0
    m = case.mutation
    if m.startswith(("values ", "keys ", "partition bad", "topic not a str")) or (
        m == "sized lengths"
    ):
        return "refused: shape", []
    if m == "unsized lengths":
        shorter = min(n, len(case.keys or []))
        return ("refused: shape" if shorter == 0 else "batch broken"), []
    if m == "iterable raises":
        return ("iterable's own error" if case.k == 0 else "batch broken"), []
    if m == "invalid topic":
        return "record refused", []
    if n == 0:
        return "committed empty", []
    if m == "partition out of range":
        return "delivery failed", []
    if m != "none":  # a record refused
        return "record refused", []
    keys = case.keys if case.keys is not None else [None] * n
    return "committed", [(_encoded(k), _encoded(v)) for v, k in zip(case.values, keys, strict=True)]


@dataclass
class _Fuzz:
    """The fuzz's producer and topic, and every record its commits must hold."""

    producer: TransactionalProducer
    topic: str
    committed: list[Record] = field(default_factory=list)

    def check(self, case: _Case) -> str:
        """Run one batch in a transaction of its own; assert that its outcome is the one
        ``case`` must have; return the branch reached."""
        try:
            return self._check(case)
        finally:  # a failed check leaves the next example a producer ready to begin
            if self.producer.state != "ready":
                self.producer.abort_transaction()

    def _check(self, case: _Case) -> str:
        producer = self.producer
        branch, records = _expected(case)
        producer.begin_transaction()
        topic, values, keys, partition = case.call(self.topic)
        try:
            queued = producer.produce_batch(topic, values, keys, partition=partition)
        except ProduceFailedException as exc:  # recorded: the transaction cannot commit
            broke = "of the batch" not in _note(exc) and "records were queued" in exc.message
            reached = "batch broken" if broke else "record refused"
            if case.mutation == "partition out of range":  # refused at once, not later
                reached = "delivery failed"
            assert reached == branch, (case, exc)
            if reached == "record refused" and case.mutation != "invalid topic":
                assert _position_note(case.k) + ", none after it" in _note(exc), (case, exc)
            if reached == "batch broken":
                shorter = min(len(case.values), len(case.keys or ()))
                k = case.k if case.mutation == "iterable raises" else shorter
                assert f"after {k} records were queued" in exc.message, (case, exc)
            with pytest.raises(CommitFailedException) as commit:
                producer.commit_transaction()
            _assert_names(commit.value, exc)
            producer.abort_transaction()
            return branch
        except (TypeError, ValueError, IterableBrokeError) as exc:
            assert not isinstance(exc, KafkaTxnError), (case, exc)
            own = isinstance(exc, IterableBrokeError)
            reached = "iterable's own error" if own else "refused: shape"
            assert reached == branch, (case, exc)
            assert producer.state == "in transaction"
            producer.commit_transaction()  # unchanged: commits, holding nothing
            return branch
        if branch == "delivery failed":  # queued, then failed: never a partial commit
            with pytest.raises(CommitFailedException):
                producer.commit_transaction()
            producer.abort_transaction()
            return branch
        assert branch in ("committed", "committed empty"), (case, queued)
        assert queued == len(records)
        producer.commit_transaction()
        self.committed.extend(records)
        return branch


def _fuzz_producer(producer_config: dict[str, Any]) -> TransactionalProducer:
    producer = TransactionalProducer(
        {**producer_config, "message.max.bytes": _MAX_BYTES, "linger.ms": 0}
    )
    producer.init_transactions()
    return producer


@pytest.mark.guarantee("1.16", "1.21")
def test_fuzz_a_batch_is_committed_whole_or_refused_or_uncommittable(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """Batches drawn from valid ones with one mutation each (a values or keys argument
    of the wrong shape, lengths that differ, a bad or absent partition, a record of the
    wrong type, not UTF-8 or too large, an iterable that breaks, an invalid topic),
    plain or as generators, each in a transaction of its own: each one either returns
    its count and commits, or raises TypeError/ValueError (or the iterable's error)
    with the transaction unchanged, or raises a recorded ProduceFailedException that
    the commit names. The topic then holds exactly the committed batches' records, once
    each, in order: never a part of a batch. Every branch is reached."""
    topic = broker.create_topic(partitions=1)
    with _fuzz_producer(producer_config) as producer:
        fuzz = _Fuzz(producer, topic)
        counts = reached_branches(batch_cases(), fuzz.check, examples=20)
        for mutation in _MUTATIONS:  # each mutation for sure, whatever the draw favours
            examples = 12 if mutation == "none" else 4
            counts += reached_branches(
                batch_cases(st.just(mutation)), fuzz.check, examples=examples
            )
        assert_every_branch(counts, BATCH_BRANCHES)
        assert counts["committed"] >= 4, counts
    assert _committed(broker, topic, len(fuzz.committed)) == fuzz.committed


@pytest.mark.guarantee("1.21")
def test_fuzz_random_batches(broker: Broker, producer_config: dict[str, Any]) -> None:
    """As the derandomized fuzz, with Hypothesis's random draws."""
    topic = broker.create_topic(partitions=1)
    with _fuzz_producer(producer_config) as producer:
        fuzz = _Fuzz(producer, topic)

        @settings(max_examples=30, deadline=None, database=None)
        @given(batch_cases())
        def run(case: _Case) -> None:
            event(fuzz.check(case))
            event(f"mutation: {case.mutation}")

        run()
    assert _committed(broker, topic, len(fuzz.committed)) == fuzz.committed


# ------------------------------------------------------- calls from the batch's own thread
@pytest.mark.adversary
@pytest.mark.guarantee("1.8", "1.21")
@pytest.mark.parametrize("call", ["commit", "prepare", "abort"])
def test_a_transactional_call_on_the_batchs_own_thread_is_refused(
    broker: Broker, producer_config: dict[str, Any], call: str
) -> None:
    """Commit, prepare or abort called between two records of a batch, on the batch's own
    thread (a signal handler, a serializer, the iterable): it would not cover the records
    the batch has still to queue, so it raises IllegalStateError and changes nothing; the
    batch goes on, and its commit holds every record of it once. Had the commit run, a
    part of the batch would be committed and the rest land in the next transaction."""
    topic = broker.create_topic(partitions=1)
    conf = {**producer_config, "transaction.two.phase.commit.enable": True}
    producer = TransactionalProducer(conf, operation_timeout=20)
    refused: list[BaseException] = []

    def values() -> Iterator[bytes]:
        for i, value in enumerate(_values(8)):
            if i == 4:
                method = {
                    "commit": producer.commit_transaction,
                    "prepare": producer.prepare_transaction,
                    "abort": producer.abort_transaction,
                }[call]
                with pytest.raises(IllegalStateError, match="same thread") as info:
                    method()
                refused.append(info.value)
                assert producer.state == "in transaction"
            yield value

    try:
        producer.init_transactions()
        producer.begin_transaction()
        assert producer.produce_batch(topic, values()) == 8
        assert len(refused) == 1
        producer.commit_transaction()
        assert _committed(broker, topic, 8) == [(None, v) for v in _values(8)]
    finally:
        producer.close(timeout=5)


@pytest.mark.mock
@pytest.mark.guarantee("1.3", "1.20")
def test_unknown_server_error_on_produce_is_classified_on_an_error_only_producer(
    mock_cluster: MockCluster, mock_config: Callable[..., dict[str, Any]]
) -> None:
    """A Produce answered UNKNOWN_SERVER_ERROR (code -1, which confluent-kafka's
    KafkaError hashes to CPython's error value): an error-only producer's failure sink
    takes the report without hashing it, so the record's ProduceFailedException is
    recorded and classified (KIP-691: an unexpected error is fatal), and the commit
    raises the fatal error with that record as its cause, never a SystemError."""
    mock_cluster.create_topic("u", partitions=1)
    producer = TransactionalProducer(
        mock_config(delivery_report_only_error=True), operation_timeout=20
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce("u", b"warm-up")  # registers the partition first
        producer.flush(10)
        mock_cluster.push_request_errors(ApiKey.PRODUCE, KafkaError.UNKNOWN)
        producer.produce_batch("u", _values(3), _values(3, "k"))
        with pytest.raises(FatalError) as info:
            producer.commit_transaction()
        cause = info.value.__cause__
        assert isinstance(cause, ProduceFailedException), repr(cause)
        assert cause.code() == KafkaError.UNKNOWN
        assert cause.key == b"k-0"
        assert producer.state == "fatal error"
    finally:
        producer.close(timeout=5)
