"""The exactly-once processor on the broker: poison records, rejected outputs, fencing,
rebalances, the offset reset, the group refusing a zombie's offsets (through the Kafka
proxy); on the mock cluster: delivery failures, abort before rewind, commits whose
outcome is unknown."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import warnings
from collections import Counter

import pytest
import tenacity
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from kafka_txn import FatalError, TransactionalProducer, TransactionOutcomeUnknownError
from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord
from kafka_txn.testing import ApiKey, MockCluster
from tests.proxies.kafka_proxy import KafkaProxy
from tests.support.eos_topics import (
    committed_offsets,
    positions_after_last_record,
    read_committed_consumer,
    seed_topic,
)

pytestmark = pytest.mark.broker


def _processor(
    broker, source, sink, group, process, txn_id=None, cls=ExactlyOnceProcessor, **kw
) -> ExactlyOnceProcessor:
    return cls(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
         "session.timeout.ms": 6000},
        {"bootstrap.servers": broker.bootstrap_servers,
         "transactional.id": txn_id or f"eos-{uuid.uuid4().hex[:8]}"},
        [source],
        process,
        backoff=tenacity.wait_fixed(0.01),
        batch_size=25,
        **kw,
    )  # fmt: skip


@pytest.mark.guarantee("6.1")
def test_poison_record_is_retried_then_dead_lettered(broker):
    source, sink, dlq = (broker.create_topic(2) for _ in range(3))
    values = [b"ok-%02d" % i for i in range(30)]
    values[17] = b"poison"
    seed_topic(broker, source, values)
    calls: Counter[bytes] = Counter()

    def process(record):
        calls[record.value()] += 1
        if record.value() == b"poison":
            raise ValueError("cannot parse")
        return [OutputRecord(sink, record.value().upper(), record.key())]

    group = f"g-{uuid.uuid4().hex[:8]}"
    processor = _processor(broker, source, sink, group, process, max_attempts=3,
                           dead_letter_topic=dlq)  # fmt: skip
    stats = processor.run(idle_timeout=3)
    assert calls[b"poison"] == 3  # max_attempts, then the recoverer
    assert stats.recovered == 1 and stats.aborts == 3
    out = Counter(v for _, v in broker.read_committed(sink, expected=29))
    assert out == Counter(v.upper() for v in values if v != b"poison")  # exactly once
    [(key, value)] = broker.read_committed(dlq, expected=1)
    assert (key, value) == (b"17", b"poison")
    # Every offset committed, the poison record's too.
    assert committed_offsets(broker, group, source, 2) == positions_after_last_record(
        broker, source, 30
    )


def test_dead_letter_headers_say_where_and_why(broker):
    source, sink, dlq = (broker.create_topic(1) for _ in range(3))
    seed_topic(broker, source, [b"bad"])

    def process(record):
        raise RuntimeError("boom")

    _processor(broker, source, sink, f"g-{uuid.uuid4().hex[:8]}", process, max_attempts=1,
               dead_letter_topic=dlq).run(idle_timeout=3)  # fmt: skip
    c = read_committed_consumer(broker)
    c.subscribe([dlq])
    msg = None
    deadline = time.monotonic() + 15
    while msg is None and time.monotonic() < deadline:
        m = c.poll(0.5)
        msg = m if m is not None and m.error() is None else None
    c.close()
    assert msg is not None
    headers = dict(msg.headers())
    assert headers["kafka_txn.dlt.original.topic"] == source.encode()
    assert headers["kafka_txn.dlt.exception.class"] == b"RuntimeError"
    assert headers["kafka_txn.dlt.exception.message"] == b"boom"


@pytest.mark.adversary
@pytest.mark.guarantee("1.4", "6.7")
def test_fenced_producer_stops_the_loop(broker):
    source, sink = broker.create_topic(1), broker.create_topic(1)
    seed_topic(broker, source, [b"first"])
    txn_id = f"eos-{uuid.uuid4().hex[:8]}"
    processor = _processor(broker, source, sink, f"g-{uuid.uuid4().hex[:8]}",
                           lambda r: [(sink, r.value())], txn_id=txn_id)  # fmt: skip
    outcome: list[BaseException | object] = []
    worker = threading.Thread(
        target=lambda: outcome.append(_capture(lambda: processor.run(idle_timeout=60)))
    )
    worker.start()
    assert broker.read_committed(sink, expected=1) == [(None, b"first")]
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    with TransactionalProducer(conf) as usurper:
        usurper.init_transactions()
        seed_topic(broker, source, [b"second"])
        worker.join(timeout=60)
    assert not worker.is_alive()
    assert isinstance(outcome[0], FatalError), outcome
    assert broker.read_committed(sink, expected=1) == [(None, b"first")]


# A transaction timeout no test waits out: a transaction still open after the fatal error
# was not aborted by close(), whatever the coordinator does later.
_LONG_TXN_TIMEOUT_MS = 180_000


def _open_partitions_after_close(broker, topic: str) -> dict[int, tuple[int, int]]:
    """The partitions of ``topic`` a transaction still holds open, once the abort's
    markers had a moment to land (Apache Kafka writes them after EndTxn's answer): empty
    within seconds if close() aborted, for transaction.timeout.ms if it did not."""
    deadline = time.monotonic() + 20
    while (open_ := broker.open_partitions(topic)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return open_


@pytest.mark.adversary
@pytest.mark.parametrize("code", ["ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID"])
@pytest.mark.guarantee("1.13")
def test_close_aborts_a_transaction_whose_offsets_the_group_refused(broker, txn_id, code):
    """The group refuses the transaction's offsets (the member's generation moved on, or
    it left the group): KIP-691 makes that fatal, but librdkafka can still abort. close()
    aborts at once, without warnings, rather than leaving the transaction to the
    coordinator's timeout, which holds read_committed readers of the output back until
    then. Nothing is lost (the offsets did not commit: the input is read again) and
    nothing duplicated (the output is aborted)."""
    source, sink = broker.create_topic(1), broker.create_topic(1)
    seed_topic(broker, source, [b"in"])
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
                         "enable.auto.commit": False})  # fmt: skip
    with contextlib.closing(consumer), KafkaProxy(broker.bootstrap_servers) as proxy:
        producer = TransactionalProducer(
            {"bootstrap.servers": proxy.bootstrap_servers, "transactional.id": txn_id,
             "transaction.timeout.ms": _LONG_TXN_TIMEOUT_MS},
        )  # fmt: skip
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(sink, b"out", partition=0)
        producer.flush()
        refused = proxy.fail(ApiKey.TXN_OFFSET_COMMIT, getattr(KafkaError, code), times=1)
        with pytest.raises(FatalError, match=code):
            producer.send_offsets_to_transaction(
                [TopicPartition(source, 0, 1)], consumer.consumer_group_metadata()
            )
        assert refused.hits == 1
        assert broker.open_partitions(sink)  # the output's transaction is open
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            producer.close()
        assert [str(w.message) for w in caught] == []
        assert proxy.count(ApiKey.END_TXN) == 1  # close() sent the abort
    assert _open_partitions_after_close(broker, sink) == {}
    assert broker.read_committed(sink, expected=0) == []
    assert committed_offsets(broker, group, source, 1) == {0: -1001}  # OFFSET_INVALID: none


@pytest.mark.adversary
@pytest.mark.guarantee("1.12", "1.13")
def test_close_after_the_group_refused_the_offsets_is_bounded_when_the_abort_hangs(broker, txn_id):
    """The same fatal refusal, then a coordinator that keeps answering the abort's EndTxn
    with a retriable error: close(timeout) gives up within its timeout (confluent-kafka's
    own close() would wait for that abort without end) and warns nothing; the transaction
    is left to librdkafka, which goes on with the abort once the coordinator answers."""
    source, sink = broker.create_topic(1), broker.create_topic(1)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                         "group.id": f"g-{uuid.uuid4().hex[:8]}"})  # fmt: skip
    with contextlib.closing(consumer), KafkaProxy(broker.bootstrap_servers) as proxy:
        producer = TransactionalProducer(
            {"bootstrap.servers": proxy.bootstrap_servers, "transactional.id": txn_id,
             "transaction.timeout.ms": _LONG_TXN_TIMEOUT_MS},
        )  # fmt: skip
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(sink, b"out", partition=0)
        producer.flush()
        proxy.fail(ApiKey.TXN_OFFSET_COMMIT, KafkaError.ILLEGAL_GENERATION, times=1)
        with pytest.raises(FatalError):
            producer.send_offsets_to_transaction(
                [TopicPartition(source, 0, 1)], consumer.consumer_group_metadata()
            )
        busy = proxy.fail(ApiKey.END_TXN, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
        caught: list[warnings.WarningMessage] = []

        def close() -> None:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                producer.close(timeout=2)
            caught.extend(seen)

        closing = threading.Thread(target=close)
        closing.start()
        try:
            closing.join(60)  # a bound for a hang, not a timing check: 2 s are asked for
            assert not closing.is_alive(), "close(timeout=2) did not return"
            assert busy.hits >= 1 and [str(w.message) for w in caught] == []
            assert producer.state == "closed"
        finally:
            proxy.remove(busy)
            closing.join(60)
        assert _open_partitions_after_close(broker, sink) == {}
    assert broker.read_committed(sink, expected=0) == []


@pytest.mark.adversary
@pytest.mark.guarantee("1.13", "6.9")
def test_processor_whose_offsets_the_group_refused_stops_and_its_successor_loses_nothing(broker):
    """run() stops with FatalError when the group refuses its offsets (a member removed
    while it worked); its close() aborts the transaction at once, so read_committed
    readers of the output are not held back until transaction.timeout.ms and the group
    has no pending offsets. The next member of the group (its own transactional id)
    reads every input again and outputs each once, seen by an independent read_committed
    consumer (kafka-python)."""
    source, sink = broker.create_topic(1), broker.create_topic(1)
    values = [b"a", b"b", b"c"]
    seed_topic(broker, source, values)
    group = f"g-{uuid.uuid4().hex[:8]}"
    with KafkaProxy(broker.bootstrap_servers) as proxy:
        refused = proxy.fail(ApiKey.TXN_OFFSET_COMMIT, KafkaError.ILLEGAL_GENERATION, times=1)
        zombie = ExactlyOnceProcessor(
            {"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
             "session.timeout.ms": 6000},
            {"bootstrap.servers": proxy.bootstrap_servers,
             "transactional.id": f"eos-{uuid.uuid4().hex[:8]}",
             "transaction.timeout.ms": _LONG_TXN_TIMEOUT_MS},
            [source], lambda r: [(sink, r.value())], batch_size=25,
        )  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(FatalError, match="ILLEGAL_GENERATION"):
                zombie.run(idle_timeout=60)
        assert [str(w.message) for w in caught] == []
        assert refused.hits == 1
    assert _open_partitions_after_close(broker, sink) == {}
    assert broker.read_committed(sink, expected=0) == []
    assert committed_offsets(broker, group, source, 1) == {0: -1001}
    successor = _processor(broker, source, sink, group, lambda r: [(sink, r.value())])
    successor.run(idle_timeout=3)
    assert sorted(v for _, v in broker.read_committed(sink, expected=3)) == values


@pytest.mark.adversary
@pytest.mark.guarantee("6.1")
def test_processor_whose_commit_was_applied_then_answered_with_an_error_outputs_once(broker):
    """6.1 with a commit the coordinator applied and then answered with an error that is
    not a refusal (REQUEST_TIMED_OUT): the processor must not take it as "not committed"
    (abort, rewind, write again). run() stops with FatalError saying the outcome is
    unknown; the group's offsets moved with the committed transaction, so a successor
    with the same transactional id reads nothing again, and every input is in the output
    once (kafka-python's read_committed consumer)."""
    source, sink = broker.create_topic(1), broker.create_topic(1)
    values = [b"a", b"b", b"c"]
    seed_topic(broker, source, values)
    group, txn_id = f"g-{uuid.uuid4().hex[:8]}", f"eos-{uuid.uuid4().hex[:8]}"
    with KafkaProxy(broker.bootstrap_servers) as proxy:
        lost = proxy.fail(ApiKey.END_TXN, KafkaError.REQUEST_TIMED_OUT, forward=True, times=1)
        first = ExactlyOnceProcessor(
            {"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
             "session.timeout.ms": 6000},
            {"bootstrap.servers": proxy.bootstrap_servers, "transactional.id": txn_id},
            [source], lambda r: [(sink, r.value())], batch_size=25,
        )  # fmt: skip
        with pytest.raises(FatalError, match="whether it committed is unknown"):
            first.run(idle_timeout=60)
        assert lost.hits == 1
    assert sorted(v for _, v in broker.read_committed(sink, expected=3)) == values
    assert committed_offsets(broker, group, source, 1) == {0: 3}
    successor = _processor(broker, source, sink, group, lambda r: [(sink, r.value())], txn_id)
    successor.run(idle_timeout=3)
    assert sorted(v for _, v in broker.read_committed(sink, expected=3)) == values


def _capture(fn):
    try:
        return fn()
    except BaseException as exc:
        return exc


class _Watched(ExactlyOnceProcessor):
    """An ExactlyOnceProcessor that records the partitions revoked from it while run()
    goes on (a rebalance), not the revocation its own close() causes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.revoked_while_running: list[list[int]] = []
        self._closing = False

    def _on_revoke(self, consumer, partitions) -> None:
        if partitions and not self._closing:
            self.revoked_while_running.append(sorted(tp.partition for tp in partitions))
        super()._on_revoke(consumer, partitions)

    def close(self) -> None:
        self._closing = True
        super().close()


@pytest.mark.adversary
@pytest.mark.guarantee("6.1")
def test_rebalance_loses_and_duplicates_nothing(broker):
    """A second member joins the group while the first is at work: the first member's
    partitions are revoked while it runs, both members process records, and the sink
    holds every input exactly once, with the committed offsets past every record. Input
    keeps arriving until the first member was revoked mid-run and the second has
    processed records (no timing: the work cannot run out before the rebalance)."""
    source, sink = broker.create_topic(4), broker.create_topic(2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    handled: dict[str, Counter[bytes]] = {"a": Counter(), "b": Counter()}

    def process_for(name):
        def process(record):
            handled[name][record.value()] += 1
            return [(sink, record.value())]

        return process

    a = _processor(broker, source, sink, group, process_for("a"), cls=_Watched)
    b = _processor(broker, source, sink, group, process_for("b"), cls=_Watched)
    sent: list[bytes] = []

    def feed(count: int) -> None:
        values = [b"v-%05d" % i for i in range(len(sent), len(sent) + count)]
        seed_topic(broker, source, values)
        sent.extend(values)

    def wait_for(condition, what: str) -> None:
        deadline = time.monotonic() + 120
        while not condition():
            assert time.monotonic() < deadline, what
            feed(20)
            time.sleep(0.1)

    results: dict[str, object] = {}
    ta = threading.Thread(target=lambda: results.update(a=_capture(lambda: a.run(idle_timeout=8))))
    tb = threading.Thread(target=lambda: results.update(b=_capture(lambda: b.run(idle_timeout=8))))
    feed(100)
    ta.start()
    wait_for(lambda: handled["a"], "the first member never processed a record")
    tb.start()  # the group rebalances while a works, and input keeps coming
    wait_for(
        lambda: a.revoked_while_running and handled["b"],
        "no rebalance during the run: the first member was never revoked, or the second "
        "never processed a record",
    )
    ta.join(timeout=120)
    tb.join(timeout=120)
    assert not ta.is_alive() and not tb.is_alive()
    assert a.revoked_while_running and handled["a"] and handled["b"]
    got = Counter(v for _, v in broker.read_committed(sink, expected=len(sent)))
    assert got == Counter(sent)  # nothing lost, nothing twice
    assert committed_offsets(broker, group, source, 4) == positions_after_last_record(
        broker, source, len(sent)
    )
    for name, result in results.items():  # a stop is only ever a KIP-691 fatal error
        assert not isinstance(result, BaseException) or isinstance(result, FatalError), name


@pytest.mark.parametrize(
    ("consumer", "kwargs", "needle"),
    [
        ({}, {}, "group.id"),
        ({"group.id": "g", "enable.auto.commit": True}, {}, "enable.auto.commit is set by"),
        ({"group.id": "g"}, {"max_attempts": 0}, "max_attempts"),
        ({"group.id": "g"}, {"topics": "orders"}, "non-empty list"),
        ({"group.id": "g"}, {"topics": []}, "non-empty list"),
        ({"group.id": "g"}, {"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_processor_settings_are_refused(consumer, kwargs, needle):
    from kafka_txn import ConfigurationError

    topics = kwargs.pop("topics", ["t"])
    with pytest.raises(ConfigurationError, match=needle):
        ExactlyOnceProcessor(
            {"bootstrap.servers": "127.0.0.1:1", **consumer},
            {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "x"},
            topics,
            lambda r: [],
            **kwargs,
        )


# ---------------------------------------------------------------- failures of the output
def _run_in_thread(processor: ExactlyOnceProcessor, **kw) -> dict[str, object]:
    """run() in a thread; a livelock the test detects ends it with stop()."""
    result: dict[str, object] = {}
    worker = threading.Thread(
        target=lambda: result.update(out=_capture(lambda: processor.run(**kw)))
    )
    worker.start()
    worker.join(timeout=120)
    if worker.is_alive():  # pragma: no cover - only when the loop hangs
        processor.stop()
        worker.join(timeout=60)
    return result


def _topic_with_limit(broker, max_message_bytes: int) -> str:
    """A one-partition topic whose max.message.bytes is below the producer's limit: the
    broker refuses a larger record at delivery."""
    name = f"small-{uuid.uuid4().hex[:12]}"
    admin = broker.admin()
    config = {"max.message.bytes": str(max_message_bytes)}
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(timeout=60)
    deadline = time.monotonic() + 30
    while name not in admin.list_topics(name, timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.1)
    return name


@pytest.mark.parametrize("where", ["at_produce", "at_delivery"])
@pytest.mark.guarantee("6.2")
def test_rejected_output_is_retried_alone_then_dead_lettered(broker, where):
    """An input whose output Kafka refuses as bad (MESSAGE_REJECTED: larger than
    message.max.bytes, refused by produce() itself, or larger than the topic's
    max.message.bytes, refused by the broker at delivery) counts against that input: its
    batch goes again one record per transaction, the other records commit, the bad one
    is tried max_attempts times with backoff (alone, when the broker refused its whole
    record batch) and then goes to the dead-letter topic, and the partition flows on."""
    source, dlq = broker.create_topic(2), broker.create_topic(1)
    if where == "at_produce":  # over the producer's message.max.bytes (1 MB)
        sink, huge = broker.create_topic(2), b"x" * 2_000_000
    else:  # the client lets it through, the broker refuses it
        sink, huge = _topic_with_limit(broker, 10_000), b"x" * 20_000
    values = [b"ok-%02d" % i for i in range(30)]
    values[11] = b"huge"
    seed_topic(broker, source, values)
    calls: Counter[bytes] = Counter()
    pauses: list[float] = []
    processor: ExactlyOnceProcessor

    def process(record):
        calls[record.value()] += 1
        if calls[b"huge"] > 10:  # the old loop never gives up: end the test
            processor.stop()
        if record.value() == b"huge":
            return [OutputRecord(sink, huge, record.key())]
        return [OutputRecord(sink, record.value().upper(), record.key())]

    group = f"g-{uuid.uuid4().hex[:8]}"
    processor = _processor(broker, source, sink, group, process, max_attempts=2,
                           dead_letter_topic=dlq, sleep=pauses.append)  # fmt: skip
    stats = _run_in_thread(processor, idle_timeout=3)["out"]
    assert not isinstance(stats, BaseException), stats
    # Tried max_attempts times, then recovered. Refused by produce(), the first try in
    # its batch counts; refused by the broker, its whole record batch failed with it, so
    # that try blames no input and it is tried max_attempts more times alone.
    assert calls[b"huge"] == (2 if where == "at_produce" else 3)
    assert stats.recovered == 1
    assert len(pauses) >= 1  # a pause before each retry, never a tight loop
    out = Counter(v for _, v in broker.read_committed(sink, expected=29))
    assert out == Counter(v.upper() for v in values if v != b"huge")  # exactly once
    assert broker.read_committed(dlq, expected=1) == [(b"11", b"huge")]
    assert committed_offsets(broker, group, source, 2) == positions_after_last_record(
        broker, source, 30
    )


@pytest.mark.guarantee("6.3")
def test_delivery_failure_retries_the_batch_with_backoff_and_never_dead_letters(
    mock_cluster,
):
    """A record that cannot be delivered now (DELIVERY_FAILED: message.timeout.ms ran
    out while the partition refused writes) is not the input's fault: the batch is
    aborted and retried after a backoff pause, uncounted, and nothing is recovered even
    with max_attempts=1."""
    _mock_topics(mock_cluster, 3)
    recovered: list[bytes] = []
    pauses: list[float] = []
    calls: Counter[bytes] = Counter()

    def process(record):
        calls[record.value()] += 1
        if sum(calls.values()) > 30:  # the old loop retried without pause: end the test
            processor.stop()
        if sum(calls.values()) == 1:  # the first batch's outputs will time out
            mock_cluster.push_request_errors(
                ApiKey.PRODUCE, *[KafkaError.NOT_ENOUGH_REPLICAS] * 100_000
            )
        return [("dst", record.value())]

    def pause(seconds: float) -> None:  # the partition heals during the backoff pause
        pauses.append(seconds)
        mock_cluster.clear_request_errors(ApiKey.PRODUCE)

    processor = _mock_processor(
        mock_cluster, process, max_attempts=1, sleep=pause,
        recoverer=lambda record, error, producer: recovered.append(record.value()),
        producer_extra={"message.timeout.ms": 1000},
    )  # fmt: skip
    stats = processor.run(idle_timeout=30, max_batches=1)
    assert recovered == []
    assert pauses == [0.05]
    assert (stats.transactions, stats.aborts, stats.recovered) == (1, 1, 0)
    assert calls == Counter({b"v0": 2, b"v1": 2, b"v2": 2})


# ---------------------------------------------------------------- abort, then rewind
def _mock_topics(cluster: MockCluster, count: int) -> None:
    cluster.create_topic("src", partitions=1)
    cluster.create_topic("dst", partitions=1)
    seed = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    for i in range(count):
        seed.produce("src", b"v%d" % i)
    assert seed.flush(30) == 0


def _mock_processor(cluster, process, *, producer_extra=None, **kw) -> ExactlyOnceProcessor:
    kw.setdefault("backoff", tenacity.wait_fixed(0.05))
    return ExactlyOnceProcessor(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": "g"},
        {"bootstrap.servers": cluster.bootstrap_servers,
         "transactional.id": f"eos-{uuid.uuid4().hex[:8]}", "retry.backoff.ms": 10,
         "transaction.timeout.ms": 2000, **(producer_extra or {})},
        ["src"], process, **kw,
    )  # fmt: skip


@pytest.mark.guarantee("6.4")
def test_failed_transaction_is_aborted_before_the_consumer_rewinds(mock_cluster):
    """While a transaction holds offsets for the group, Apache Kafka answers a
    read_committed consumer's OffsetFetch with UNSTABLE_OFFSET_COMMIT (librdkafka retries
    it until its timeout, then committed() raises). The mock cluster answers so from the
    failure until the abort: the loop must abort first and rewind after, without
    fetching the committed offsets of a transaction still open."""
    _mock_topics(mock_cluster, 5)
    calls: list[bytes] = []
    events: list[str] = []

    def process(record):
        calls.append(record.value())
        if len(calls) == 2:  # the transaction now has pending offsets on a real broker
            mock_cluster.push_request_errors(
                ApiKey.OFFSET_FETCH, *[KafkaError.UNSTABLE_OFFSET_COMMIT] * 100_000
            )
            raise ValueError("cannot parse")
        return [("dst", record.value())]

    processor = _mock_processor(mock_cluster, process)
    abort = processor.producer.abort_transaction

    def abort_then_settle(*args, **kwargs):
        abort(*args, **kwargs)
        events.append("aborted")
        mock_cluster.clear_request_errors(ApiKey.OFFSET_FETCH)  # no pending offsets now

    processor.producer.abort_transaction = abort_then_settle
    stats = processor.run(idle_timeout=30, max_batches=1)
    assert events == ["aborted"]
    assert calls == [b"v0", b"v1", b"v0", b"v1", b"v2", b"v3", b"v4"]
    assert (stats.transactions, stats.records, stats.aborts) == (1, 5, 1)


# ---------------------------------------------------------------- unknown commit outcome
def _commit_spy(processor, cluster, *, heal_after: int | None) -> list[str]:
    """Every commit_transaction() is answered with retriable EndTxn errors until its
    deadline (outcome unknown); after ``heal_after`` such calls, EndTxn works again."""
    calls: list[str] = []
    commit, abort = processor.producer.commit_transaction, processor.producer.abort_transaction

    def spy_commit(*args, **kwargs):
        calls.append("commit")
        if heal_after is None or calls.count("commit") <= heal_after:
            cluster.push_request_errors(
                ApiKey.END_TXN, *[KafkaError.COORDINATOR_LOAD_IN_PROGRESS] * 100_000
            )
        try:
            return commit(*args, **kwargs)
        finally:
            cluster.clear_request_errors(ApiKey.END_TXN)

    def spy_abort(*args, **kwargs):
        calls.append("abort")
        return abort(*args, **kwargs)

    processor.producer.commit_transaction = spy_commit
    processor.producer.abort_transaction = spy_abort
    return calls


@pytest.mark.adversary
@pytest.mark.guarantee("6.5")
def test_commit_with_unknown_outcome_is_tried_again_until_it_settles(mock_cluster):
    """commit_transaction() ran out of time with retriable errors: the outcome is
    unknown, so the loop commits again (never aborts) and the batch commits once."""
    _mock_topics(mock_cluster, 3)
    processor = _mock_processor(mock_cluster, lambda r: [("dst", r.value())])
    calls = _commit_spy(processor, mock_cluster, heal_after=1)
    stats = processor.run(idle_timeout=30, max_batches=1)
    assert calls == ["commit", "commit"]
    assert (stats.transactions, stats.records, stats.aborts) == (1, 3, 0)


@pytest.mark.adversary
@pytest.mark.guarantee("6.5")
def test_commit_outcome_still_unknown_after_the_bound_stops_the_loop_unaborted(mock_cluster):
    """A commit still unsettled after commit_attempts tries stops run() with
    TransactionOutcomeUnknownError saying so; the transaction is never aborted."""
    _mock_topics(mock_cluster, 3)
    processor = _mock_processor(mock_cluster, lambda r: [("dst", r.value())], commit_attempts=2)
    calls = _commit_spy(processor, mock_cluster, heal_after=None)
    with pytest.raises(TransactionOutcomeUnknownError, match=r"outcome .* is unknown") as info:
        processor.run(idle_timeout=30, max_batches=1)
    assert calls == ["commit", "commit"]
    assert "not aborted" in str(info.value) and "same transactional.id" in str(info.value)
    assert processor.stats.transactions == 0


@pytest.mark.adversary
@pytest.mark.guarantee("6.5")
def test_abort_that_does_not_complete_is_tried_again(mock_cluster):
    """abort_transaction() ran out of time (EndTxn kept failing with a retriable error):
    the loop aborts again rather than dying, and the batch then commits once."""
    _mock_topics(mock_cluster, 3)
    calls: list[str] = []

    def process(record):
        calls.append("process")
        if len(calls) == 2:
            processor.producer.flush()  # the output of v0 is in: EndTxn has work to do
            raise ValueError("second record fails")
        return [("dst", record.value())]

    processor = _mock_processor(mock_cluster, process)
    abort = processor.producer.abort_transaction

    def abort_spy(*args, **kwargs):
        calls.append("abort")
        if calls.count("abort") == 1:
            mock_cluster.push_request_errors(
                ApiKey.END_TXN, *[KafkaError.COORDINATOR_LOAD_IN_PROGRESS] * 100_000
            )
        try:
            return abort(*args, **kwargs)
        finally:
            mock_cluster.clear_request_errors(ApiKey.END_TXN)

    processor.producer.abort_transaction = abort_spy
    stats = processor.run(idle_timeout=30, max_batches=1)
    assert calls == ["process"] * 2 + ["abort"] * 2 + ["process"] * 3
    assert (stats.transactions, stats.records, stats.aborts) == (1, 3, 1)


# ---------------------------------------------------------------- auto.offset.reset
@pytest.mark.guarantee("6.6")
def test_rollback_with_latest_reset_rewinds_to_the_batch_not_to_old_history(broker):
    """With auto.offset.reset=latest and no committed offset yet, a rolled-back batch is
    read again from its own first offset, not from the beginning of the partition."""
    source, sink = broker.create_topic(1), broker.create_topic(1)
    old = [b"old-%d" % i for i in range(3)]
    seed_topic(broker, source, old)
    seen: list[bytes] = []
    started = threading.Event()

    def process(record):
        seen.append(record.value())
        started.set()
        if len(seen) == 1:
            raise ValueError("first try fails")
        return [(sink, record.value().upper())]

    group = f"g-{uuid.uuid4().hex[:8]}"
    processor = ExactlyOnceProcessor(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
         "auto.offset.reset": "latest"},
        {"bootstrap.servers": broker.bootstrap_servers,
         "transactional.id": f"eos-{uuid.uuid4().hex[:8]}"},
        [source], process, backoff=tenacity.wait_fixed(0.01),
    )  # fmt: skip
    result: dict[str, object] = {}
    worker = threading.Thread(
        target=lambda: result.update(out=_capture(lambda: processor.run(idle_timeout=3)))
    )
    worker.start()
    # Write until the processor, positioned at the end, sees a record: what it saw
    # first and everything after is new, everything before is history.
    probes: list[bytes] = []
    while not started.is_set() and len(probes) < 60:
        probes.append(b"new-%02d" % len(probes))
        seed_topic(broker, source, [probes[-1]])
        started.wait(1.0)
    assert started.is_set()
    worker.join(timeout=60)
    assert not isinstance(result.get("out"), BaseException), result
    first = probes.index(seen[0])
    expected = [p.upper() for p in probes[first:]]
    assert [v for _, v in broker.read_committed(sink, expected=len(expected))] == expected


@pytest.mark.parametrize(
    "bad_output",
    [lambda sink: [OutputRecord(sink, 12345)], lambda sink: [(sink,)]],
    ids=["value_of_wrong_type", "malformed_tuple"],
)
@pytest.mark.guarantee("6.2")
def test_an_output_process_got_wrong_is_that_records_failure(broker, bad_output):
    """process() returns an output confluent-kafka cannot take (an int value) or a tuple
    that is no OutputRecord: that record fails like one whose process() raises (retried,
    then dead-lettered), and the rest of the partition flows: run() must not die with
    TypeError, nor a restart on the same record."""
    source, sink, dlq = (broker.create_topic(1) for _ in range(3))
    seed_topic(broker, source, [b"a", b"bad", b"c"])

    def process(record):
        if record.value() == b"bad":
            return bad_output(sink)
        return [OutputRecord(sink, record.value().upper())]

    processor = _processor(broker, source, sink, f"g-{uuid.uuid4().hex[:8]}", process,
                           max_attempts=2, dead_letter_topic=dlq)  # fmt: skip
    stats = processor.run(idle_timeout=3)
    assert stats.recovered == 1
    assert sorted(v for _, v in broker.read_committed(sink, expected=2)) == [b"A", b"C"]
    assert [v for _, v in broker.read_committed(dlq, expected=1)] == [b"bad"]


@pytest.mark.guarantee("6.3")
def test_a_recoverer_that_raises_is_tried_again(broker):
    """A custom recoverer raising a non-Kafka exception (its database is away, say) aborts
    the transaction and is tried again; run() goes on."""
    source, sink = (broker.create_topic(1) for _ in range(2))
    seed_topic(broker, source, [b"bad", b"ok"])
    calls: list[bytes] = []

    def process(record):
        if record.value() == b"bad":
            raise ValueError("cannot parse")
        return [OutputRecord(sink, record.value())]

    def recoverer(record, error, producer):
        calls.append(record.value())
        if len(calls) == 1:
            raise OSError("the side store is away")

    processor = _processor(broker, source, sink, f"g-{uuid.uuid4().hex[:8]}", process,
                           max_attempts=1, recoverer=recoverer)  # fmt: skip
    stats = processor.run(idle_timeout=3)
    assert calls == [b"bad", b"bad"] and stats.recovered == 1
    assert [v for _, v in broker.read_committed(sink, expected=1)] == [b"ok"]


@pytest.mark.guarantee("6.2")
def test_a_record_batch_refused_as_a_whole_blames_no_single_input(broker):
    """Three inputs whose outputs each fit the topic's max.message.bytes, but not
    together: librdkafka puts them in one record batch, the broker refuses it, and every
    output fails. No input is dead-lettered for that; one record per transaction, all
    three commit (none of the three goes to the dead-letter topic)."""
    source, dlq = broker.create_topic(1), broker.create_topic(1)
    sink = _topic_with_limit(broker, 1500)
    seed_topic(broker, source, [b"a", b"b", b"c"])

    def process(record):
        return [OutputRecord(sink, record.value() * 650)]

    processor = _processor(broker, source, sink, f"g-{uuid.uuid4().hex[:8]}", process,
                           max_attempts=1, dead_letter_topic=dlq)  # fmt: skip
    stats = processor.run(idle_timeout=5)
    assert stats.recovered == 0
    out = sorted(v[:1] for _, v in broker.read_committed(sink, expected=3))
    assert out == [b"a", b"b", b"c"]
    assert broker.read_committed(dlq, expected=0) == []
