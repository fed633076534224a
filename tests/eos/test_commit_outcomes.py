"""The exactly-once loop (``ExactlyOnceProcessor``) when its commit's outcome is unknown:
the coordinator applied the commit and the answer is lost, or refused it with an error
that says nothing of whether it applied, or applied it while a successor with the same
transactional id initialised before the answer arrived. run() stops instead of aborting
and writing the batch again, and a successor with the same transactional id resumes from
the offsets committed with the outputs: every input is in the output once (guarantees
6.1 and 6.7, docs/guide/eos.md). On the real broker, through tests/proxies/kafka_proxy.py;
the output is read with an independent read_committed consumer (kafka-python,
tests/support/rig.py)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
import tenacity
from confluent_kafka import Consumer, KafkaError, TopicPartition

from kafka_txn import TransactionalProducer
from kafka_txn.eos import ExactlyOnceProcessor
from kafka_txn.errors import FatalError
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support import adversaries as support
from tests.support.adversaries import (
    committed_values,
    prefixing_processor,
    successor_initialises_before_the_answer,
    three_inputs,
)
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary

proxy = support.proxy


def test_processor_outputs_once_when_the_commits_answer_is_lost_after_it_applied(
    broker: Broker, proxy: KafkaProxy, txn_id: str
) -> None:
    """Guarantee 6.1: the processor outputs each input once when the commit's answer is
    lost after the coordinator applied it."""
    source, sink = three_inputs(broker, txn_id)
    processor = prefixing_processor(broker, proxy.bootstrap_servers, txn_id, source, sink)
    proxy.fail(ApiKey.END_TXN, KafkaError.REQUEST_TIMED_OUT, forward=True, times=1)
    try:
        processor.run(idle_timeout=5)
    except FatalError:  # the outcome is unknown: a successor with the same id resumes
        successor = prefixing_processor(broker, broker.bootstrap_servers, txn_id, source, sink)
        successor.run(idle_timeout=5)
    assert sorted(broker.read_committed(sink, expected=3)) == [
        (None, b"out-in-0"),
        (None, b"out-in-1"),
        (None, b"out-in-2"),
    ]


def test_processor_outputs_once_when_a_commit_not_applied_is_answered_unknown(
    broker: Broker, proxy: KafkaProxy, txn_id: str
) -> None:
    """The reverse of the applied-then-failed commit: the coordinator refuses EndTxn
    with UNKNOWN without applying it (not one of librdkafka's listed refusals), so
    commit_transaction() says the outcome is unknown (FatalError). run() stops; the
    successor with the same transactional id aborts the open transaction on its init,
    resumes from the offsets committed before it, and the output holds every input
    once (6.1, docs/guide/eos.md)."""
    source, sink = three_inputs(broker, txn_id)

    def processor(bootstrap: str) -> ExactlyOnceProcessor:
        return prefixing_processor(broker, bootstrap, txn_id, source, sink)

    rule = proxy.fail(ApiKey.END_TXN, KafkaError.UNKNOWN, times=1)
    try:
        processor(proxy.bootstrap_servers).run(idle_timeout=5)
    except FatalError as exc:
        assert "unknown" in str(exc)
        processor(broker.bootstrap_servers).run(idle_timeout=5)
    assert rule.hits == 1
    assert sorted(broker.read_committed(sink, expected=3)) == [
        (None, b"out-in-0"),
        (None, b"out-in-1"),
        (None, b"out-in-2"),
    ]


def _seed(broker: Broker, topic: str, values: list[bytes]) -> None:
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
    with TransactionalProducer(conf) as producer:
        producer.init_transactions()
        with producer.transaction():
            for value in values:
                producer.produce(topic, value, partition=0)


def _committed_offset(broker: Broker, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def test_processor_with_unknown_commit_outcome_and_a_successor_initialising_meanwhile(
    broker: Broker, txn_id: str
) -> None:
    """6.1/6.7 with an unknown EndTxn(commit) outcome: the coordinator applied the
    processor's commit (outputs and offsets), and before the lost answer reaches it, a
    successor's producer with the same transactional id initialises. run() stops with
    FatalError (outcome unknown) instead of aborting and writing the batch again; the
    group's offsets moved with the committed transaction; a successor
    ExactlyOnceProcessor with the same transactional id and group resumes from them:
    every input is in the output once, the later input too."""
    source, sink = broker.create_topic(1), broker.create_topic(1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    values = [b"a", b"b", b"c"]
    _seed(broker, source, values)
    started: list[TransactionalProducer] = []
    errors: list[BaseException] = []
    processed: list[bytes] = []
    lock = threading.Lock()

    def process(record: Any) -> list[tuple[str, bytes]]:
        with lock:
            processed.append(record.value())
        return [(sink, b"out-" + record.value())]

    def processor(bootstrap: str) -> ExactlyOnceProcessor:
        return ExactlyOnceProcessor(
            {"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
             "session.timeout.ms": 6000},
            {"bootstrap.servers": bootstrap, "transactional.id": txn_id},
            [source], process, batch_size=25, backoff=tenacity.wait_fixed(0.01),
        )  # fmt: skip

    with KafkaProxy(broker.bootstrap_servers) as fault_proxy:
        lost = fault_proxy.fail(
            ApiKey.END_TXN, KafkaError.REQUEST_TIMED_OUT, forward=True, times=1,
            edit=successor_initialises_before_the_answer(broker, txn_id, started, errors),
        )  # fmt: skip
        first = processor(fault_proxy.bootstrap_servers)
        try:
            with pytest.raises(FatalError, match="whether it committed is unknown"):
                first.run(idle_timeout=30)
        finally:
            for producer in started:
                producer.close(timeout=5)
        assert lost.hits == 1
        assert not errors, errors
        assert fault_proxy.count(ApiKey.END_TXN) == 1  # never aborted after the unknown commit
    # The batch whose commit was applied (all three inputs, unless the consumer handed
    # them over in more than one batch) is in the output once, its offsets committed.
    first_batch = list(processed)
    assert first_batch == values[: len(first_batch)] and first_batch, first_batch
    assert committed_values(broker, sink, expected=len(first_batch)) == [
        "out-" + v.decode() for v in first_batch
    ]
    assert _committed_offset(broker, group, source) == len(first_batch)  # offsets 0, 1, 2
    _seed(broker, source, [b"d"])
    processed.clear()
    processor(broker.bootstrap_servers).run(idle_timeout=3)
    # Resumed from the offsets committed with the outputs: nothing of the batch again.
    assert processed == [*values[len(first_batch) :], b"d"]
    assert committed_values(broker, sink, expected=4) == ["out-a", "out-b", "out-c", "out-d"]
