"""Fidelity to Apache Kafka through ``tests/proxies/kafka_proxy.py``: the proxy itself, and the
answers of Apache Kafka that a real broker gives only by chance, made deterministic by
the proxy in front of the real broker and tested through the real client stack
(librdkafka through TransactionalProducer and ExactlyOnceProcessor, kafka-txn's own
coordinator client through recovery).

Each emulation test names the Apache Kafka behaviour it stands for and where it lives in
apache/kafka. What a real broker can be configured to produce (KIP-467 record errors,
the coordinator's timeout abort, an expired transactional id, CONCURRENT_TRANSACTIONS
and UNSTABLE_OFFSET_COMMIT as they really come) is tested on Apache Kafka itself, in
``tests/broker/test_behaviours.py``. Against a real Apache Kafka cluster
(``KAFKA_BOOTSTRAP_SERVERS``) the same emulation runs in front of it: the rules only
make the broker answer as Apache Kafka itself would in the situation emulated.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import tenacity
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient

from kafka_txn import PreparedTxnState, TransactionalProducer, TransactionOutcome
from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord
from tests.proxies.kafka_proxy import ApiKey, Delay, KafkaProxy, Request, Rule, message_class
from tests.support.rig import Broker

pytestmark = [pytest.mark.broker, pytest.mark.conformance]


@pytest.fixture
def proxy(broker: Broker) -> Iterator[KafkaProxy]:
    with KafkaProxy(broker.bootstrap_servers) as kafka_proxy:
        yield kafka_proxy


def _values(records: list[tuple[bytes | None, bytes | None]]) -> list[bytes]:
    """The values of ``records``, sorted (none of these tests writes a null value)."""
    assert all(v is not None for _, v in records)
    return sorted(v for _, v in records if v is not None)


def _via(config: dict[str, Any], proxy: KafkaProxy, **extra: Any) -> dict[str, Any]:
    return {**config, "bootstrap.servers": proxy.bootstrap_servers, **extra}


# ---------------------------------------------------------------- the proxy itself
def test_every_connection_of_the_client_stack_passes_through_the_proxy(
    broker: Broker, topic: str, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """Metadata and FindCoordinator answers point at the proxy, so librdkafka's
    connections to the partition leaders and coordinators, and the coordinator client's,
    all pass through it: each request of a transaction is seen there."""
    brokers = (
        AdminClient({"bootstrap.servers": proxy.bootstrap_servers}).list_topics(timeout=10).brokers
    )
    assert brokers and all(b.host == "127.0.0.1" for b in brokers.values())
    config = _via(producer_config, proxy, **{"transaction.two.phase.commit.enable": True})
    with TransactionalProducer(config) as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.produce(topic, b"through the proxy")
        producer.begin_transaction()
        producer.produce(topic, b"prepared")
        state = producer.prepare_transaction()  # DescribeTransactions, coordinator client
        producer.complete_transaction(state)
    for api in (
        ApiKey.FIND_COORDINATOR,
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.PRODUCE,
        ApiKey.ADD_PARTITIONS_TO_TXN,
        ApiKey.END_TXN,
        ApiKey.DESCRIBE_TRANSACTIONS,
    ):
        assert proxy.count(api) > 0, api  # fmt: skip
    got = _values(broker.read_committed(topic, expected=2))
    assert got == [b"prepared", b"through the proxy"]


def test_pipelined_answers_keep_their_order_when_one_is_held_back(
    broker: Broker, proxy: KafkaProxy
) -> None:
    """librdkafka keeps several requests in flight on one connection and matches the
    answers by order: a held-back answer (Delay) must hold back those after it, and a
    made-up answer (Fail, never forwarded) must take its place in the line."""
    held = proxy.add(Rule(ApiKey.METADATA, Delay(300), times=1))
    failed = proxy.fail(ApiKey.FIND_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE, times=1)
    requests: list[tuple[int, int, dict[str, Any]]] = [
        (ApiKey.METADATA, 1, {"topics": None}),
        (ApiKey.API_VERSIONS, 0, {}),
        (ApiKey.FIND_COORDINATOR, 1, {"key": "g", "key_type": 0}),
        (ApiKey.METADATA, 1, {"topics": None}),
        (ApiKey.API_VERSIONS, 0, {}),
    ]
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        out = b""
        for correlation, (api, version, fields) in enumerate(requests, start=100):
            message = message_class(api, request=True)(version=version, **fields)
            message.with_header(correlation_id=correlation, client_id="pipeline")
            out += bytes(message.encode(version=version, header=True, framed=True))
        sock.sendall(out)  # all five in flight at once
        answers = []
        for _ in requests:
            size = struct.unpack(">i", _recv(sock, 4))[0]
            answers.append(_recv(sock, size))
    assert [struct.unpack(">i", a[:4])[0] for a in answers] == [100, 101, 102, 103, 104]
    find = message_class(ApiKey.FIND_COORDINATOR, request=False).decode(answers[2][4:], version=1)
    assert find.error_code == KafkaError.COORDINATOR_NOT_AVAILABLE
    metadata = message_class(ApiKey.METADATA, request=False).decode(answers[3][4:], version=1)
    assert {(b.host, b.port) for b in metadata.brokers} <= {("127.0.0.1", p) for p in _ports(proxy)}
    assert (held.hits, failed.hits) == (1, 1)


def _recv(sock: Any, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the proxy closed the connection"
        data += chunk
    return data


def _ports(proxy: KafkaProxy) -> set[int]:
    return set(proxy._listeners.values())


def test_one_way_delay_on_every_byte_keeps_the_stack_working(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """``delay_ms`` (the latency benchmarks' knob) delays both directions of
    every connection; a transaction and a read through it still work."""
    with KafkaProxy(broker.bootstrap_servers, delay_ms=20) as slow:
        with TransactionalProducer(_via(producer_config, slow)) as producer:
            producer.init_transactions()
            with producer.transaction():
                for i in range(20):
                    producer.produce(topic, b"%d" % i, partition=i % 3)
        assert slow.count(ApiKey.PRODUCE) > 0
    assert len(broker.read_committed(topic, expected=20)) == 20


# ---------------------------------------------------------------- recovery
def _two_phase(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "transaction.two.phase.commit.enable": True}


def _recover(config: dict[str, Any], state: PreparedTxnState) -> TransactionOutcome:
    producer = TransactionalProducer(_two_phase(config))
    try:
        producer.init_transactions(keep_prepared_txn=True)
        return producer.complete_transaction(state)
    finally:
        producer.close()


# ---------------------------------------------------------------- CONCURRENT_TRANSACTIONS
@pytest.mark.adversary
@pytest.mark.guarantee("3.7")
def test_concurrent_transactions_on_recoverys_end_txn_is_retried_until_it_commits(
    broker: Broker, topic: str, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """TransactionCoordinator.endTransaction answers CONCURRENT_TRANSACTIONS while the
    transaction has a pending state transition (``pendingTransitionInProgress``), or an
    EndTxn(commit) finds it in PrepareCommit (markers still being written). Recovery's
    coordinator client retries it with backoff, re-sending the same EndTxn, until the
    coordinator takes it; the transaction commits once."""
    config = _via(producer_config, proxy)
    producer = TransactionalProducer(_two_phase(config))
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce(topic, b"prepared")
    state = producer.prepare_transaction()
    busy = proxy.fail(ApiKey.END_TXN, KafkaError.CONCURRENT_TRANSACTIONS, times=3,
                      when=lambda r: bool(r.body.committed))  # fmt: skip
    assert _recover(config, state) is TransactionOutcome.COMMITTED
    assert busy.hits == 3
    sent = [(r.body.producer_id, r.body.producer_epoch) for r in busy.requests]
    assert sent == [(state.producer_id, state.producer_epoch)] * 3  # the same EndTxn again
    assert broker.read_committed(topic, expected=1) == [(None, b"prepared")]
    producer.close()


@pytest.mark.adversary
@pytest.mark.guarantee("3.7")
def test_concurrent_transactions_on_librdkafkas_own_commit_is_retried(
    broker: Broker, topic: str, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """The same answer to the producer's own EndTxn (librdkafka: RETRY action in
    rd_kafka_txn_handle_EndTxn): commit_transaction() still commits, once."""
    busy = proxy.fail(ApiKey.END_TXN, KafkaError.CONCURRENT_TRANSACTIONS, times=2)
    with TransactionalProducer(_via(producer_config, proxy)) as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.produce(topic, b"once")
    assert busy.hits == 2
    assert broker.read_committed(topic, expected=1) == [(None, b"once")]


# ---------------------------------------------------------------- UNSTABLE_OFFSET_COMMIT
@pytest.mark.guarantee("6.4")
def test_exactly_once_loop_rewinds_without_fetching_offsets_while_they_are_unstable(
    broker: Broker, proxy: KafkaProxy
) -> None:
    """Apache Kafka answers OffsetFetch with UNSTABLE_OFFSET_COMMIT (require_stable, as
    librdkafka sends it) for a partition whose group has transactional offsets whose
    markers are not written yet: the group coordinator's
    OffsetMetadataManager.fetchOffsets (hasPendingTransactionalOffsets; classic:
    GroupMetadata.hasPendingOffsetCommitsForTopicPartition), i.e. while a transaction
    that sent the group's offsets is open or its markers are still on their way. Here
    every OffsetFetch from the first transaction's commit on is answered so, which is
    harsher than Apache Kafka (tests/broker/test_behaviours.py shows the real
    answers, a dead instance's open transaction holding the offsets): whatever the
    answer, the loop's rewind after a failure seeks to the batch's first offsets and
    fetches nothing, so it proceeds; a rewind through committed() would hang in
    librdkafka's retries instead."""
    source, sink = broker.create_topic(1), broker.create_topic(1)
    with TransactionalProducer({"bootstrap.servers": broker.bootstrap_servers,
                                "transactional.id": uuid.uuid4().hex}) as seed:  # fmt: skip
        seed.init_transactions()
        with seed.transaction():
            for i in range(10):
                seed.produce(source, b"v%d" % i)
    unstable: list[Rule] = []
    failed: list[bytes] = []

    def process(record: Any) -> list[OutputRecord]:
        if record.value() == b"v7" and not failed:
            failed.append(record.value())
            raise ValueError("fails once, after the first batch committed")
        return [OutputRecord(sink, record.value())]

    def commit_then_unstable(request: Request) -> None:
        if not unstable:
            unstable.append(proxy.fail(ApiKey.OFFSET_FETCH, KafkaError.UNSTABLE_OFFSET_COMMIT))

    proxy.before(ApiKey.END_TXN, commit_then_unstable, when=lambda r: bool(r.body.committed))
    processor = ExactlyOnceProcessor(
        {"bootstrap.servers": proxy.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:8]}",
         "session.timeout.ms": 6000, "auto.offset.reset": "earliest"},
        {"bootstrap.servers": proxy.bootstrap_servers,
         "transactional.id": f"eos-{uuid.uuid4().hex[:8]}"},
        [source], process, backoff=tenacity.wait_fixed(0.01), batch_size=5,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    stats = processor.run(idle_timeout=3)
    assert time.monotonic() < deadline
    assert failed == [b"v7"] and stats.aborts == 1
    assert unstable and unstable[0].hits == 0  # the rewind fetched no offsets
    got = _values(broker.read_committed(sink, expected=10))
    assert got == sorted(b"v%d" % i for i in range(10))  # each once


@pytest.mark.adversary
@pytest.mark.guarantee("3.7")
def test_concurrent_transactions_on_add_partitions_while_the_last_commit_completes(
    broker: Broker, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """TransactionCoordinator.handleAddPartitionsToTransaction answers
    CONCURRENT_TRANSACTIONS while the previous transaction is still in PrepareCommit or
    PrepareAbort (its markers on their way), per partition in AddPartitionsToTxn v0-v3.
    The proxy's made-up answer has the request's topics and partitions, so librdkafka
    reads it as that refusal and retries; the next transaction commits once."""
    topic = broker.create_topic(partitions=2)
    busy = proxy.fail(ApiKey.ADD_PARTITIONS_TO_TXN, KafkaError.CONCURRENT_TRANSACTIONS, times=2)
    with TransactionalProducer(_via(producer_config, proxy)) as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.produce(topic, b"first", partition=1)
        with producer.transaction():
            producer.produce(topic, b"second", partition=0)
    assert busy.hits == 2
    assert _values(broker.read_committed(topic, expected=2)) == [b"first", b"second"]


def test_fail_rules_answer_successive_requests_in_turn(
    broker: Broker, topic: str, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """Two one-shot Fail rules for one API answer two successive requests, first the
    first (only the Fail rule that applies is used up): as FaultProxy.push_errors did."""
    first = proxy.fail(ApiKey.END_TXN, KafkaError.CONCURRENT_TRANSACTIONS, times=1)
    second = proxy.fail(ApiKey.END_TXN, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, times=1)
    with TransactionalProducer(_via(producer_config, proxy)) as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.produce(topic, b"once")
    assert (first.hits, second.hits) == (1, 1)
    assert first.requests[0] is not second.requests[0]
    assert broker.read_committed(topic, expected=1) == [(None, b"once")]
