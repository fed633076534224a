"""Every public call checks its arguments before anything changes (guarantee 1.16): a
wrong type raises TypeError, a value out of range ValueError, the message names the
argument, and the producer's state is what it was; the producer goes on working. Records
the client refuses before sending them (an invalid topic name, a record over
message.max.bytes) fail at once and say so.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kafka_txn import (
    CommitFailedException,
    ConfigurationError,
    FailureType,
    ProduceFailedException,
    TransactionalProducer,
)
from kafka_txn.eos import ExactlyOnceProcessor
from kafka_txn.producer import arguments
from tests.support.rig import Broker

_FAST = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)

# ---------------------------------------------------------------- what is valid
_NUMBERS_AND_OTHERS = st.one_of(
    st.text(max_size=4),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=3),
    st.floats(max_value=3.0),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, -1e-9, 0, 0.0]),
    st.builds(object),
    st.lists(st.integers(), max_size=2),
    st.just(b"5"),
)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _seconds(minimum_exclusive: bool, none: bool) -> Callable[[object], type[Exception] | None]:
    """The error a value of a seconds argument must raise (None: it is valid)."""

    def expected(value: object) -> type[Exception] | None:
        if value is None:
            return None if none else TypeError
        if not _is_number(value):
            return TypeError
        assert isinstance(value, numbers.Real)
        ok = math.isfinite(value) and (value > 0 if minimum_exclusive else value >= 0)
        return None if ok else ValueError

    return expected


_TIMEOUT = _seconds(minimum_exclusive=True, none=True)  # > 0 or None
_WAIT = _seconds(minimum_exclusive=False, none=False)  # >= 0
_WAIT_OR_NONE = _seconds(minimum_exclusive=False, none=True)  # >= 0 or None


def _flag(value: object) -> type[Exception] | None:
    return None if isinstance(value, bool) else TypeError


def _callable(value: object) -> type[Exception] | None:
    return None if value is None or callable(value) else TypeError


def _prepared_state(value: object) -> type[Exception] | None:
    return None if isinstance(value, str) else TypeError


def _offsets(value: object) -> type[Exception] | None:
    if not isinstance(value, (list, tuple)):
        return TypeError
    if not value:
        return None  # nothing to send: valid
    if not all(isinstance(item, TopicPartition) for item in value):
        return TypeError
    return ValueError  # the strategy draws only bad TopicPartitions


def _group_metadata(value: object) -> type[Exception] | None:
    if not isinstance(value, bytes):
        return TypeError
    return None if value else ValueError


def _batch_iterable(value: object) -> type[Exception] | None:
    """produce_batch()'s values or keys: any iterable but one record's bytes or str, or
    a mapping."""
    single = (str, bytes, bytearray, memoryview)
    if isinstance(value, (*single, Mapping)) or not isinstance(value, Iterable):
        return TypeError
    return None


def _batch_keys(value: object) -> type[Exception] | None:
    return None if value is None else _batch_iterable(value)


def _partition(value: object) -> type[Exception] | None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        return TypeError
    return None if value >= -1 else ValueError


def _bad_item(item: object) -> bool:
    return not isinstance(item, TopicPartition) or (
        item.partition < 0 or item.offset < 0 or arguments.topic_problem(item.topic) is not None
    )


@dataclass(frozen=True)
class _Call:
    """One public call with one argument drawn: how to make it, and the error each value
    must raise."""

    name: str
    argument: str
    make: Callable[[TransactionalProducer, Any], object]
    expected: Callable[[object], type[Exception] | None]
    values: st.SearchStrategy[Any] = _NUMBERS_AND_OTHERS


_META = b"group-metadata"
_BAD_OFFSETS = st.one_of(
    _NUMBERS_AND_OTHERS,
    st.sampled_from(
        [
            [TopicPartition("t", -1, 5)],
            [TopicPartition("t", 0, -1)],
            [TopicPartition("t", 0)],  # no offset: OFFSET_INVALID (-1001)
            [TopicPartition("bad topic!", 0, 1)],
            (TopicPartition("t", 0, 3), TopicPartition("", 0, 1)),
            ["t"],
            {TopicPartition("t", 0, 1)},
            "t",
        ]
    ),
)

_BATCH_SHAPES = st.sampled_from(
    [b"one record", bytearray(b"v"), memoryview(b"v"), {b"k": b"v"}, None]
)
"""Single records and mappings produce_batch() refuses as values or keys, and others."""

CALLS = [
    _Call("init_transactions", "timeout", lambda p, v: p.init_transactions(v), _TIMEOUT),
    _Call(
        "init_transactions",
        "keep_prepared_txn",
        lambda p, v: p.init_transactions(keep_prepared_txn=v),
        _flag,
    ),
    _Call("commit_transaction", "timeout", lambda p, v: p.commit_transaction(v), _TIMEOUT),
    _Call("abort_transaction", "timeout", lambda p, v: p.abort_transaction(v), _TIMEOUT),
    _Call("prepare_transaction", "timeout", lambda p, v: p.prepare_transaction(v), _TIMEOUT),
    _Call(
        "send_offsets_to_transaction",
        "offsets",
        lambda p, v: p.send_offsets_to_transaction(v, _META),
        _offsets,
        _BAD_OFFSETS,
    ),
    _Call(
        "send_offsets_to_transaction",
        "group_metadata",
        lambda p, v: p.send_offsets_to_transaction([TopicPartition("t", 0, 1)], v),
        _group_metadata,
        st.one_of(_NUMBERS_AND_OTHERS, st.just(b"")),
    ),
    _Call(
        "send_offsets_to_transaction",
        "timeout",
        lambda p, v: p.send_offsets_to_transaction([TopicPartition("t", 0, 1)], _META, v),
        _TIMEOUT,
    ),
    _Call(
        "complete_transaction",
        "state",
        lambda p, v: p.complete_transaction(v),
        _prepared_state,
        st.one_of(_NUMBERS_AND_OTHERS, st.none()),
    ),
    _Call(
        "complete_transaction",
        "before_init",
        lambda p, v: p.complete_transaction("x", before_init=v),
        _callable,
    ),
    _Call(
        "complete_transaction",
        "timeout",
        lambda p, v: p.complete_transaction("x", timeout=v),
        _TIMEOUT,
    ),
    _Call("poll", "timeout", lambda p, v: p.poll(v), _WAIT),
    _Call("flush", "timeout", lambda p, v: p.flush(v), _WAIT_OR_NONE),
    _Call("close", "timeout", lambda p, v: p.close(v), _WAIT),
    _Call(
        "produce_batch",
        "values",
        lambda p, v: p.produce_batch("t", v),
        _batch_iterable,
        st.one_of(_BATCH_SHAPES, _NUMBERS_AND_OTHERS),
    ),
    _Call(
        "produce_batch",
        "keys",
        lambda p, v: p.produce_batch("t", [b"v"], v),
        _batch_keys,
        st.one_of(_BATCH_SHAPES, _NUMBERS_AND_OTHERS),
    ),
    _Call(
        "produce_batch",
        "partition",
        lambda p, v: p.produce_batch("t", [], partition=v),
        _partition,
    ),
]


@st.composite
def bad_calls(draw: st.DrawFn) -> tuple[_Call, Any, type[Exception]]:
    """A public call and a value of one of its arguments that the call must refuse."""
    call = draw(st.sampled_from(CALLS))
    value = draw(call.values)
    error = call.expected(value)
    assume(error is not None)
    assert error is not None
    return call, value, error


def _refuse_every_bad_argument(producer: TransactionalProducer) -> None:
    """Drive the producer, in its current state, with bad arguments: each call raises
    the error its argument's kind says, naming the call and the argument, and leaves the
    state as it was."""
    state = producer.state

    @_FAST
    @given(bad_calls())
    def check(case: tuple[_Call, Any, type[Exception]]) -> None:
        call, value, error = case
        with pytest.raises((TypeError, ValueError)) as info:
            call.make(producer, value)
        assert type(info.value) is error, (call.name, value, info.value)
        message = str(info.value)
        assert f"{call.name}({call.argument}=...)" in message, message
        shown = value
        if call.argument == "offsets" and isinstance(value, (list, tuple)) and value:
            shown = next(i for i in value if _bad_item(i))  # the item named
        assert "must be" in message and f"({type(shown).__name__})" in message, message
        assert producer.state == state

    check()


@pytest.mark.guarantee("1.16")
def test_every_public_call_refuses_bad_arguments_in_every_state_and_changes_nothing(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """Wrong-typed and out-of-range arguments (str, bool, negative, nan, inf, objects,
    lists) to every public call with arguments, in the states new, ready and in
    transaction: TypeError or ValueError naming the call and the argument, the state
    unchanged, close() with a bad timeout closes nothing; then the producer commits a
    transaction that a read_committed consumer sees."""
    topic = broker.create_topic(partitions=1)
    producer = TransactionalProducer(producer_config)
    try:
        _refuse_every_bad_argument(producer)
        assert producer.state == "new"
        producer.init_transactions()
        _refuse_every_bad_argument(producer)
        assert producer.state == "ready"
        producer.begin_transaction()
        _refuse_every_bad_argument(producer)
        assert producer.state == "in transaction"
        producer.produce(topic, b"after-the-bad-calls")
        producer.commit_transaction(5)
        assert producer.state == "ready"
    finally:
        producer.close()
    assert [v for _, v in broker.read_committed(topic, 1)] == [b"after-the-bad-calls"]


@pytest.mark.guarantee("1.16")
def test_a_commit_with_a_timeout_of_the_wrong_type_leaves_the_transaction_abortable(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """commit_transaction(timeout="5") raises TypeError before the commit starts: the
    producer stays in transaction (never 'committing', where abort is refused as if the
    broker might have committed), and abort_transaction() then aborts."""
    topic = broker.create_topic(partitions=1)
    with TransactionalProducer(producer_config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"aborted")
        with pytest.raises(TypeError, match=r"commit_transaction\(timeout=\.\.\.\) must be "
                           r"a number of seconds > 0 or None, got '5' \(str\)"):  # fmt: skip
            producer.commit_transaction(timeout="5")  # type: ignore[arg-type]
        assert producer.state == "in transaction"
        with pytest.raises(ValueError, match=r"abort_transaction\(timeout=\.\.\.\)"):
            producer.abort_transaction(timeout=-1)
        assert producer.state == "in transaction"
        producer.abort_transaction()
        producer.begin_transaction()
        producer.produce(topic, b"committed")
        producer.commit_transaction()
    assert [v for _, v in broker.read_committed(topic, 1)] == [b"committed"]


def test_bad_constructor_arguments_are_named_before_anything_is_built() -> None:
    """TransactionalProducer's keyword arguments are checked like the calls' (no broker
    is needed: nothing connects)."""
    conf = {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t"}
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"operation_timeout": "30"}, TypeError, "operation_timeout=..."),
        ({"operation_timeout": math.nan}, ConfigurationError, "operation_timeout=nan"),
        ({"operation_timeout": 0}, ConfigurationError, "operation_timeout=0"),
        ({"queue_full_timeout": -1}, ValueError, "queue_full_timeout=..."),
        ({"queue_full_timeout": None}, TypeError, "queue_full_timeout=..."),
        ({"prepare_min_time_left": True}, TypeError, "prepare_min_time_left=..."),
        ({"key_serializer": "utf-8"}, TypeError, "key_serializer=..."),
        ({"value_serializer": 5}, TypeError, "value_serializer=..."),
        ({"metrics": "prometheus"}, TypeError, "metrics=..."),
        ({"sleep": None}, TypeError, "sleep=..."),
    ]
    for kwargs, error, needle in cases:
        with pytest.raises(error) as info:
            TransactionalProducer(conf, **kwargs)
        assert needle in str(info.value), (kwargs, info.value)


def test_exactly_once_processor_names_bad_arguments() -> None:
    """ExactlyOnceProcessor's arguments, and run()'s, are checked before its consumer
    and producer exist (run()'s before anything connects)."""
    consumer = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}
    producer = {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t"}

    def build(**kwargs: Any) -> ExactlyOnceProcessor:
        return ExactlyOnceProcessor(consumer, producer, kwargs.pop("topics", ["in"]),
                                    kwargs.pop("process", lambda r: []), **kwargs)  # fmt: skip

    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"max_attempts": "3"}, TypeError, "max_attempts=..."),
        ({"max_attempts": True}, TypeError, "max_attempts=..."),
        ({"max_attempts": 0}, ConfigurationError, "max_attempts must be >= 1"),
        ({"batch_size": 2.5}, TypeError, "batch_size=..."),
        ({"commit_attempts": None}, TypeError, "commit_attempts=..."),
        ({"poll_timeout": -0.5}, ValueError, "poll_timeout=..."),
        ({"topics": ["bad topic!"]}, ValueError, "topics=..."),
        ({"topics": [7]}, TypeError, "topics=..."),
        ({"topics": ["^("]}, ValueError, "a valid '^' regular expression (missing ), "),
        ({"dead_letter_topic": ".."}, ValueError, "dead_letter_topic=..."),
        ({"process": "upper"}, TypeError, "process=..."),
        ({"recoverer": "dlq"}, TypeError, "recoverer=..."),
        ({"backoff": 1.0}, TypeError, "backoff=..."),
    ]
    for kwargs, error, needle in cases:
        with pytest.raises(error) as info:
            build(**kwargs)
        assert needle in str(info.value), (kwargs, info.value)
    processor = build(topics=["^in-.*"])  # a regex subscription is no topic name
    try:
        for run_kwargs, needle in (
            ({"idle_timeout": "1"}, "run(idle_timeout=...)"),
            ({"max_batches": 1.0}, "run(max_batches=...)"),
            ({"max_batches": -1}, "run(max_batches=...)"),
        ):
            with pytest.raises((TypeError, ValueError), match=re.escape(needle)):
                processor.run(**run_kwargs)
        assert processor.producer.state == "new"
    finally:
        processor.close()


# ---------------------------------------------------------------- records the client refuses
@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("orders", True),
        ("a.b_c-D9", True),
        ("x" * 249, True),
        ("x" * 250, False),
        ("", False),
        (".", False),
        ("..", False),
        ("...", True),
        ("bad topic!", False),
        ("ordérs", False),
        ("orders/1", False),
    ],
)
def test_topic_names_follow_kafkas_rule(name: str, valid: bool) -> None:
    """Kafka's rule (Topic.validate): 1 to 249 of [a-zA-Z0-9._-], not '.' or '..'."""
    assert (arguments.topic_problem(name) is None) is valid


@given(st.text(max_size=300))
def test_topic_problem_agrees_with_kafkas_rule(name: str) -> None:
    """For any text, topic_problem() accepts exactly what Kafka's rule accepts."""
    kafka_valid = re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", name) is not None and name not in (
        ".",
        "..",
    )
    assert (arguments.topic_problem(name) is None) is kafka_valid


@pytest.mark.guarantee("1.2", "1.16")
def test_a_record_for_an_invalid_topic_name_is_refused_at_once(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """produce()/send() to an invalid topic name raise ProduceFailedException
    (MESSAGE_REJECTED, TOPIC_EXCEPTION) saying the client refused it before sending it,
    instead of failing at commit; the transaction cannot commit, and after the abort the
    producer goes on."""
    topic = broker.create_topic(partitions=1)
    with TransactionalProducer(producer_config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"fine")
        for bad in ("bad topic!", "", "x" * 250, ".", ".."):
            for send in (producer.produce, producer.send):
                with pytest.raises(ProduceFailedException) as info:
                    send(bad, b"lost")
                failure = info.value
                assert failure.failure_type is FailureType.MESSAGE_REJECTED
                assert failure.name() == "TOPIC_EXCEPTION"
                assert "refused by the client before it was sent" in failure.message
                assert "not a valid topic name" in failure.message
        assert producer.state == "in transaction"
        with pytest.raises(CommitFailedException) as commit:
            producer.commit_transaction()
        assert "not a valid topic name" in str(commit.value.__cause__)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.produce(topic, b"next")
        producer.commit_transaction()
    assert [v for _, v in broker.read_committed(topic, 1)] == [b"next"]


@pytest.mark.guarantee("1.2")
def test_a_record_over_message_max_bytes_says_the_client_refused_it(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """librdkafka refuses a record over the producer's message.max.bytes before sending
    it (MSG_SIZE_TOO_LARGE, worded "Broker: Message size too large" by confluent-kafka):
    the ProduceFailedException says the client refused it, its size, and names
    message.max.bytes as the fix."""
    topic = broker.create_topic(partitions=1)
    with TransactionalProducer({**producer_config, "message.max.bytes": 1000}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(ProduceFailedException) as info:
            producer.produce(topic, b"v" * 1990, key=b"k" * 10)
        failure = info.value
        assert failure.failure_type is FailureType.MESSAGE_REJECTED
        assert failure.name() == "MSG_SIZE_TOO_LARGE"
        assert "Broker:" not in failure.message
        assert "refused by the client before it was sent" in failure.message
        assert "2000 bytes" in failure.message
        assert "message.max.bytes (1000)" in failure.message
        with pytest.raises(CommitFailedException):
            producer.commit_transaction()
        producer.abort_transaction()


def test_dual_writer_names_bad_arguments(tmp_path: Any) -> None:
    """DualWriter's own arguments, and resolve()'s, are checked before anything is
    written (its producer's are checked as TransactionalProducer's); no broker is
    reached."""
    from kafka_txn.dualwrite import DualWriter

    conf = {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t"}
    url = f"sqlite:///{tmp_path}/state.db"
    with pytest.raises(TypeError, match=r"DualWriter\(create_state_table=\.\.\.\)"):
        DualWriter(conf, url, create_state_table="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"DualWriter\(on_step=\.\.\.\)"):
        DualWriter(conf, url, on_step="print")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"TransactionalProducer\(queue_full_timeout=\.\.\.\)"):
        DualWriter(conf, url, queue_full_timeout="60")  # type: ignore[arg-type]
    writer = DualWriter(conf, url)
    try:
        with pytest.raises(TypeError, match=r"resolve\(stored_state=\.\.\.\)"):
            writer.resolve(5)  # type: ignore[arg-type]
        assert writer.producer.state == "new"
    finally:
        writer.close()


@pytest.mark.guarantee("1.16")
def test_dual_writer_names_bad_credentials(tmp_path: Any) -> None:
    """DualWriter's user= and password= are a str or None, named by call and argument
    (a password by its type, never its value); SQLite has no login, so either given
    with a SQLite URL (JDBC or SQLAlchemy) is a ConfigurationError, not dropped."""
    from kafka_txn.dualwrite import DualWriter

    conf = {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t"}
    postgres = "jdbc:postgresql://127.0.0.1:1/test"  # never connected: checked first
    with pytest.raises(TypeError, match=r"^DualWriter\(user=\.\.\.\) must be a str or None, "):
        DualWriter(conf, postgres, user=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^DualWriter\(password=\.\.\.\)") as info:
        DualWriter(conf, postgres, password=b"s3cret")  # type: ignore[arg-type]
    assert "s3cret" not in str(info.value) and "bytes" in str(info.value)
    for url in (f"jdbc:sqlite:{tmp_path}/state.db", f"sqlite:///{tmp_path}/state.db"):
        for kwargs in ({"user": "app"}, {"password": "pw"}, {"user": "app", "password": ""}):
            with pytest.raises(ConfigurationError, match="SQLite takes no user or password"):
                DualWriter(conf, url, **kwargs)
    DualWriter(conf, postgres, user="app", password="pw").close()


@pytest.mark.guarantee("1.16")
def test_an_on_delivery_that_cannot_be_called_is_refused_before_the_record_is_queued(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """produce(on_delivery=5) raises TypeError naming the argument before the record is
    queued (a callback that cannot be called would otherwise fail only when its report is
    served, after the commit); the transaction goes on and commits without that record."""
    topic = broker.create_topic(partitions=1)
    with TransactionalProducer(producer_config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"kept")
        with pytest.raises(TypeError, match=r"produce\(on_delivery=\.\.\.\) must be a callable"):
            producer.produce(topic, b"never", on_delivery=5)  # type: ignore[arg-type]
        assert producer.state == "in transaction"
        producer.commit_transaction()
    assert [v for _, v in broker.read_committed(topic, 1)] == [b"kept"]
