"""The exactly-once processor on the broker: poison records, fencing, rebalances."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest
import tenacity
from confluent_kafka import Consumer, TopicPartition

from kafka_txn import FatalError, TransactionalProducer
from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord

pytestmark = pytest.mark.broker


def _seed(broker, topic: str, values: list[bytes]) -> None:
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
    with TransactionalProducer(conf) as p:
        p.init_transactions()
        with p.transaction():
            for i, v in enumerate(values):
                p.produce(topic, v, key=b"%d" % i)


def _processor(broker, source, sink, group, process, txn_id=None, **kw) -> ExactlyOnceProcessor:
    return ExactlyOnceProcessor(
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


def _reader(broker) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )


def _committed(broker, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def _positions_after_last_record(broker, topic: str, count: int) -> dict[int, int]:
    """Per partition, one past its last record: where a group that consumed everything
    stands (transaction markers take offsets too, so this is not a record count)."""
    c = _reader(broker)
    c.subscribe([topic])
    last: dict[int, int] = {}
    seen = 0
    deadline = time.monotonic() + 30
    while seen < count and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            last[m.partition()] = max(last.get(m.partition(), -1), m.offset())
            seen += 1
    c.close()
    return {p: o + 1 for p, o in last.items()}


def test_poison_record_is_retried_then_dead_lettered(broker):
    source, sink, dlq = (broker.create_topic(2) for _ in range(3))
    values = [b"ok-%02d" % i for i in range(30)]
    values[17] = b"poison"
    _seed(broker, source, values)
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
    assert _committed(broker, group, source, 2) == _positions_after_last_record(broker, source, 30)


def test_dead_letter_headers_say_where_and_why(broker):
    source, sink, dlq = (broker.create_topic(1) for _ in range(3))
    _seed(broker, source, [b"bad"])

    def process(record):
        raise RuntimeError("boom")

    _processor(broker, source, sink, f"g-{uuid.uuid4().hex[:8]}", process, max_attempts=1,
               dead_letter_topic=dlq).run(idle_timeout=3)  # fmt: skip
    c = _reader(broker)
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


def test_fenced_producer_stops_the_loop(broker):
    source, sink = broker.create_topic(1), broker.create_topic(1)
    _seed(broker, source, [b"first"])
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
        _seed(broker, source, [b"second"])
        worker.join(timeout=60)
    assert not worker.is_alive()
    assert isinstance(outcome[0], FatalError), outcome
    assert broker.read_committed(sink, expected=1) == [(None, b"first")]


def _capture(fn):
    try:
        return fn()
    except BaseException as exc:
        return exc


def test_rebalance_loses_and_duplicates_nothing(broker):
    source, sink = broker.create_topic(4), broker.create_topic(2)
    first = [b"a-%03d" % i for i in range(200)]
    _seed(broker, source, first)
    group = f"g-{uuid.uuid4().hex[:8]}"

    def slow(record):
        time.sleep(0.002)
        return [(sink, record.value())]

    a = _processor(broker, source, sink, group, slow)
    b = _processor(broker, source, sink, group, slow)
    results: dict[str, object] = {}
    ta = threading.Thread(target=lambda: results.update(a=_capture(lambda: a.run(idle_timeout=8))))
    ta.start()
    time.sleep(1.0)  # a is under way with all four partitions
    tb = threading.Thread(target=lambda: results.update(b=_capture(lambda: b.run(idle_timeout=8))))
    tb.start()  # the group rebalances while a works
    second = [b"b-%03d" % i for i in range(200)]
    _seed(broker, source, second)
    ta.join(timeout=120)
    tb.join(timeout=120)
    expected = Counter(first + second)
    got = Counter(v for _, v in broker.read_committed(sink, expected=400))
    assert got == expected  # nothing lost, nothing twice
    assert _committed(broker, group, source, 4) == _positions_after_last_record(broker, source, 400)
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
