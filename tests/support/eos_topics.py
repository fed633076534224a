"""Helpers the exactly-once loop's tests share (tests/eos/, tests/broker/test_restarts.py):
an input topic seeded in one committed transaction, a read_committed consumer, a group's
committed offsets, and where a group that consumed everything stands."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from kafka_txn import TransactionalProducer
from tests.support.rig import Broker


def seed_topic(broker: Broker, topic: str, values: list[bytes]) -> None:
    """``values`` in ``topic``, keyed by their index, committed in one transaction."""
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
    with TransactionalProducer(conf) as p:
        p.init_transactions()
        with p.transaction():
            for i, v in enumerate(values):
                p.produce(topic, v, key=b"%d" % i)


def read_committed_consumer(broker: Broker) -> Consumer:
    """A consumer of a fresh group, read_committed, from the earliest offset."""
    return Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )


def committed_offsets(broker: Broker, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The offsets ``group`` committed for each of the topic's ``partitions``."""
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def positions_after_last_record(broker: Broker, topic: str, count: int) -> dict[int, int]:
    """Per partition, one past its last record: where a group that consumed everything
    stands (transaction markers take offsets too, so this is not a record count)."""
    c = read_committed_consumer(broker)
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
