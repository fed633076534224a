"""Fidelity to Apache Kafka (issue 14): what the local broker cannot show, emulated by
``tests/kafka_proxy.py`` in front of the real broker and tested through the real client
stack (librdkafka through TransactionalProducer and ExactlyOnceProcessor, kafka-txn's
own coordinator client through recovery).

Each test names the Apache Kafka behaviour it emulates and where it lives in
apache/kafka (read at trunk, 2024-10). Against a real Apache Kafka cluster
(``KAFKA_BOOTSTRAP_SERVERS``) the same emulation runs in front of it: the rules only
make the broker answer as Apache Kafka itself would in the situation emulated.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tenacity
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient
from kafka.record import MemoryRecords

from kafka_txn import (
    CommitFailedException,
    PreparedTxnState,
    ProduceFailedException,
    TransactionalProducer,
    TransactionDivergedError,
    TransactionOutcome,
    TransactionOutcomeUnknowableError,
)
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord
from kafka_txn.errors import FailureType
from tests.kafka_proxy import ApiKey, Delay, KafkaProxy, Request, Rule, message_class
from tests.rig import Broker

pytestmark = [pytest.mark.broker, pytest.mark.conformance]

TRANSACTIONAL_ID_NOT_FOUND = 105


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
    """``delay_ms`` (the latency benchmarks' knob, issue 13) delays both directions of
    every connection; a transaction and a read through it still work."""
    with KafkaProxy(broker.bootstrap_servers, delay_ms=20) as slow:
        with TransactionalProducer(_via(producer_config, slow)) as producer:
            producer.init_transactions()
            with producer.transaction():
                for i in range(20):
                    producer.produce(topic, b"%d" % i, partition=i % 3)
        assert slow.count(ApiKey.PRODUCE) > 0
    assert len(broker.read_committed(topic, expected=20)) == 20


# ---------------------------------------------------------------- KIP-467
def _compacted_topic_validation(topic: str) -> Callable[[Request, Any], None]:
    """What Apache Kafka answers a Produce to a compacted ``topic`` holding keyless
    records: LogValidator.validateKey gives each one a RecordError(batch index,
    "Compacted topic cannot accept message without key in topic partition ..."),
    LogValidator.processRecordErrors throws RecordValidationException with them, and
    ReplicaManager.appendToLocalLog turns it into the partition's INVALID_RECORD with
    ``record_errors`` and ``error_message`` (storage/.../log/LogValidator.java,
    core/.../server/ReplicaManager.scala). Nothing of the batch is appended."""

    def edit(request: Request, response: Any) -> None:
        sent = {
            (t.name, p.index): p.records
            for t in request.body.topic_data
            for p in t.partition_data
        }  # fmt: skip
        for t in response.responses:
            for p in t.partition_responses:
                batch = MemoryRecords(bytes(sent[(t.name, p.index)])).next_batch()
                where = f"{topic}-{p.index}"
                item = p._struct.fields["record_errors"].data_class
                p.record_errors = [
                    item(batch_index=i, batch_index_error_message=(
                        f"Compacted topic cannot accept message without key in topic "
                        f"partition {where}."))
                    for i, record in enumerate(batch) if record.key is None
                ]  # fmt: skip
                p.error_message = (
                    f"One or more records have been rejected due to {len(p.record_errors)} "
                    "record errors in total, and only showing the first three errors at most"
                )

    return edit


def _to(topic: str) -> Callable[[Request], bool]:
    return lambda request: any(t.name == topic for t in request.body.topic_data)


def _produce_five(producer: TransactionalProducer, topic: str, keyless: set[int]) -> dict[
    bytes, ProduceFailedException | None
]:  # fmt: skip
    reports: dict[bytes, ProduceFailedException | None] = {}

    def report(error: ProduceFailedException | None, message: Any) -> None:
        reports[message.value()] = error

    for i in range(5):
        key = None if i in keyless else b"k%d" % i
        producer.produce(topic, b"r%d" % i, key=key, partition=0, on_delivery=report)
    producer.flush(30)
    return reports


def test_kip467_culprits_are_rejected_and_the_innocent_records_of_their_batch_are_retriable(
    broker: Broker, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """KIP-467 end to end: a batch of five to a compacted topic in which records 1 and 3
    have no key. librdkafka (rd_kafka_msgbatch_handle_Produce_result_record_errors)
    fails the culprits with INVALID_RECORD (MESSAGE_REJECTED: the record is bad) and
    the other three with _INVALID_DIFFERENT_RECORD (DELIVERY_FAILED: retriable in a new
    transaction); the commit's cause names a culprit, not the innocent record reported
    first. Retried without the culprits, the innocent records commit once."""
    topic = broker.create_topic(partitions=1)
    rule = proxy.fail(ApiKey.PRODUCE, KafkaError.INVALID_RECORD, when=_to(topic), times=1,
                      edit=_compacted_topic_validation(topic))  # fmt: skip
    with TransactionalProducer(_via(producer_config, proxy, **{"linger.ms": 50})) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        reports = _produce_five(producer, topic, keyless={1, 3})
        assert rule.hits == 1  # one batch of five, refused once
        culprits = {v: e for v, e in reports.items() if v in (b"r1", b"r3")}
        innocents = {v: e for v, e in reports.items() if v not in culprits}
        assert len(culprits) == 2 and len(innocents) == 3
        for error in culprits.values():
            assert error is not None and error.failure_type is FailureType.MESSAGE_REJECTED
            assert error.kafka_error.code() == KafkaError.INVALID_RECORD
        for error in innocents.values():
            assert error is not None and error.failure_type is FailureType.DELIVERY_FAILED
            assert error.kafka_error.code() == KafkaError._INVALID_DIFFERENT_RECORD
        with pytest.raises(CommitFailedException) as info:
            producer.commit_transaction()
        cause = info.value.__cause__
        assert isinstance(cause, ProduceFailedException)
        assert cause.failure_type is FailureType.MESSAGE_REJECTED
        assert cause.kafka_error.code() == KafkaError.INVALID_RECORD
        producer.abort_transaction()
        # The innocent records go again; the first transaction after a failed batch may
        # fail once more on the sequence gap (librdkafka then bumps the epoch, KIP-360;
        # docs/errors.md), as it does on Apache Kafka, which appended nothing either.
        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(CommitFailedException),
            stop=tenacity.stop_after_attempt(3), reraise=True,
        ):  # fmt: skip
            with attempt, producer.transaction():  # aborts when the commit fails
                for value in sorted(innocents):
                    producer.produce(topic, value, key=b"again", partition=0)
    got = _values(broker.read_committed(topic, expected=3))
    assert got == [b"r0", b"r2", b"r4"]  # once each; nothing of the refused batch


def test_kip467_with_one_culprit_librdkafka_fails_the_whole_batch_as_invalid_record(
    broker: Broker, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """The same batch with a single keyless record (index 2). librdkafka 2.16 marks the
    innocent records _INVALID_DIFFERENT_RECORD, but then rd_kafka_dr_msgq0
    (src/rdkafka_broker.c) passes the partition's error as ``force_err`` to
    rd_kafka_interceptors_on_acknowledgement_queue whenever fewer than two record errors
    came back, which overwrites every record's error: all five report INVALID_RECORD
    (MESSAGE_REJECTED). This pins that behaviour: when librdkafka fixes it, this test
    fails and the docs' KIP-467 note must change. The broker's messages
    (``record_errors``, ``error_message``) never reach Python: confluent-kafka builds a
    producer's delivery error from the code alone (Message_new0)."""
    topic = broker.create_topic(partitions=1)
    proxy.fail(ApiKey.PRODUCE, KafkaError.INVALID_RECORD, when=_to(topic), times=1,
               edit=_compacted_topic_validation(topic))  # fmt: skip
    with TransactionalProducer(_via(producer_config, proxy, **{"linger.ms": 50})) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        reports = _produce_five(producer, topic, keyless={2})
        assert sorted(reports) == [b"r0", b"r1", b"r2", b"r3", b"r4"]
        for error in reports.values():
            assert error is not None and error.failure_type is FailureType.MESSAGE_REJECTED
            assert error.kafka_error.code() == KafkaError.INVALID_RECORD
            assert "Compacted topic" not in str(error)
        with pytest.raises(CommitFailedException):
            producer.commit_transaction()
        producer.abort_transaction()
    assert broker.read_committed(topic, expected=0, linger=0.5) == []


# ---------------------------------------------------------------- transaction timeout
def _two_phase(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "transaction.two.phase.commit.enable": True}


def _recover(config: dict[str, Any], state: PreparedTxnState) -> TransactionOutcome:
    producer = TransactionalProducer(_two_phase(config))
    try:
        producer.init_transactions(keep_prepared_txn=True)
        return producer.complete_transaction(state)
    finally:
        producer.close()


class _ApacheTimeout:
    """Apache Kafka's timeout abort, emulated for one transactional id.
    TransactionStateManager.timedOutTransactions picks an Ongoing transaction older
    than its timeout; TransactionCoordinator.abortTimedOutTransactions first bumps the
    epoch (TransactionMetadata.prepareFenceProducerEpoch), then ends it with
    endTransaction(ABORT, isFromClient = false), which keeps txnStartTimestamp
    (core/src/main/scala/kafka/coordinator/transaction/). DescribeTransactions then
    shows CompleteAbort, epoch e + 1, the aborted transaction's start time; an EndTxn
    with epoch e is answered PRODUCER_FENCED (endTransaction: ``!isValidEpoch``).

    The local broker never times a transaction out: ``fire()`` aborts it there with
    EndTxn(abort) (same producer id and epoch, so the start time is kept), and from
    then on the proxy adds the epoch bump to the answers."""

    def __init__(self, config: dict[str, Any], proxy: KafkaProxy) -> None:
        self.config, self.proxy = config, proxy
        self.tid: str = config["transactional.id"]
        self.rules: list[Rule] = []

    def fire(self, producer_id: int, epoch: int) -> None:
        settings = ConnectionSettings.from_librdkafka(self.config)  # the broker itself
        with CoordinatorClient(settings, self.tid) as client:
            client.end_txn(producer_id, epoch, commit=False)
        self.rules.append(self.proxy.rewrite(ApiKey.DESCRIBE_TRANSACTIONS, self._bumped))
        self.rules.append(self.proxy.fail(
            ApiKey.END_TXN, KafkaError.PRODUCER_FENCED,
            when=lambda r: r.body.transactional_id == self.tid
            and r.body.producer_epoch <= epoch,
        ))  # fmt: skip

    def _bumped(self, request: Request, response: Any) -> None:
        for entry in response.transaction_states:
            if entry.transactional_id == self.tid and entry.error_code == 0:
                # PrepareAbort while the markers are on their way (a real cluster behind
                # the proxy), then CompleteAbort; both under the bumped epoch.
                assert entry.transaction_state in ("PrepareAbort", "CompleteAbort"), entry
                entry.producer_epoch += 1


def test_a_prepared_transaction_that_timed_out_is_divergence_never_committed(
    broker: Broker, topic: str, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """Apache Kafka timed the prepared transaction out (epoch bump, then CompleteAbort,
    start time kept; see _ApacheTimeout). The database committed it, Kafka aborted it:
    recovery raises TransactionDivergedError, sends no EndTxn(commit), and nothing of it
    is visible."""
    config = _via(producer_config, proxy)
    producer = TransactionalProducer(_two_phase(config))
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce(topic, b"prepared")
    state = producer.prepare_transaction()
    assert state.producer_id is not None and state.producer_epoch is not None
    _ApacheTimeout(producer_config, proxy).fire(state.producer_id, state.producer_epoch)
    ends_before = proxy.count(ApiKey.END_TXN)
    with pytest.raises(TransactionDivergedError, match=r"transaction\.timeout\.ms") as info:
        _recover(config, state)
    assert proxy.count(ApiKey.END_TXN) == ends_before  # no commit was attempted
    assert info.value.observed["state"] in ("PrepareAbort", "CompleteAbort")
    assert info.value.observed["producer_epoch"] == state.producer_epoch + 1
    assert info.value.observed["transaction_start_time_ms"] == state.txn_start_ms
    assert broker.read_committed(topic, expected=0, linger=0.5) == []
    producer.close()


def test_the_next_unprepared_transaction_timing_out_means_the_stored_one_committed(
    broker: Broker, topic: str, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """The stored transaction committed, the process died before storing it completed,
    and Apache Kafka then timed out the NEXT transaction, never prepared (epoch bump,
    CompleteAbort, a later start time). That is no divergence: recovery reports the
    stored one ALREADY_COMMITTED and sends nothing."""
    config = _via(producer_config, proxy)
    producer = TransactionalProducer(_two_phase(config))
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce(topic, b"stored")
    state = producer.prepare_transaction()
    producer.complete_transaction(state)  # committed; "crash" before storing completed
    producer.begin_transaction()
    producer.produce(topic, b"next, never prepared")
    producer.flush(30)
    assert state.producer_id is not None and state.producer_epoch is not None
    _ApacheTimeout(producer_config, proxy).fire(state.producer_id, state.producer_epoch)
    ends_before = proxy.count(ApiKey.END_TXN)
    assert _recover(config, state) is TransactionOutcome.ALREADY_COMMITTED
    assert proxy.count(ApiKey.END_TXN) == ends_before
    assert broker.read_committed(topic, expected=1) == [(None, b"stored")]
    producer.close()


def test_a_timeout_between_recoverys_describe_and_its_end_txn_is_divergence(
    broker: Broker, topic: str, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """Apache Kafka's timeout fires after recovery's DescribeTransactions saw the
    transaction Ongoing and before its EndTxn(commit) arrives: the coordinator answers
    PRODUCER_FENCED (epoch e < e + 1). Recovery describes again, sees the bumped
    CompleteAbort, and reports the divergence with the refusal's code."""
    config = _via(producer_config, proxy)
    producer = TransactionalProducer(_two_phase(config))
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce(topic, b"prepared")
    state = producer.prepare_transaction()
    assert state.producer_id is not None and state.producer_epoch is not None
    timeout = _ApacheTimeout(producer_config, proxy)
    pid, epoch = state.producer_id, state.producer_epoch
    proxy.before(ApiKey.END_TXN, lambda _: timeout.fire(pid, epoch), times=1,
                 when=lambda r: bool(r.body.committed))  # fmt: skip
    with pytest.raises(TransactionDivergedError, match="PRODUCER_FENCED") as info:
        _recover(config, state)
    assert info.value.kafka_error.code() == KafkaError.PRODUCER_FENCED
    assert info.value.observed["state"] in ("PrepareAbort", "CompleteAbort")
    assert broker.read_committed(topic, expected=0, linger=0.5) == []
    producer.close()


# ---------------------------------------------------------------- transactional id expiry
def _committed_then_forgotten(
    topic: str, config: dict[str, Any]
) -> PreparedTxnState:  # fmt: skip
    with TransactionalProducer(_two_phase(config)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"stored")
        state = producer.prepare_transaction()
        producer.complete_transaction(state)  # committed; its state never stored completed
    return state


def test_an_expired_transactional_id_is_unknowable(
    broker: Broker, topic: str, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """After transactional.id.expiration.ms without a transaction, Apache Kafka forgets
    the id (TransactionStateManager.removeExpiredTransactionalIds, for ids in Empty or
    Complete* only) and TransactionCoordinator.handleDescribeTransactions answers
    TRANSACTIONAL_ID_NOT_FOUND. Whether the stored transaction committed cannot be
    learnt from Kafka: recovery raises TransactionOutcomeUnknowableError (row 1 of the
    table), commits nothing, and says to check the topic rather than re-send."""
    config = _via(producer_config, proxy)
    state = _committed_then_forgotten(topic, config)
    tid = producer_config["transactional.id"]
    forgotten = proxy.fail(ApiKey.DESCRIBE_TRANSACTIONS, TRANSACTIONAL_ID_NOT_FOUND,
                           when=lambda r: tid in r.body.transactional_ids)  # fmt: skip
    ends_before = proxy.count(ApiKey.END_TXN)
    with pytest.raises(TransactionOutcomeUnknowableError, match="forgotten") as info:
        _recover(config, state)
    assert forgotten.hits >= 1
    assert proxy.count(ApiKey.END_TXN) == ends_before
    assert info.value.observed["found"] is False
    assert "read_committed" in str(info.value)
    assert broker.read_committed(topic, expected=1) == [(None, b"stored")]


def test_an_expired_id_initialised_again_under_a_fresh_producer_id_is_unknowable(
    broker: Broker, topic: str, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """The id expired and another process initialised it again: Apache Kafka's
    handleInitProducerId found no metadata and allocated a fresh producer id
    (producerIdManager.generateProducerId, epoch 0), so DescribeTransactions shows
    another producer id, Empty, start -1. The stored transaction's history is gone:
    recovery raises TransactionOutcomeUnknowableError (row 2), committing nothing."""
    config = _via(producer_config, proxy)
    state = _committed_then_forgotten(topic, config)
    tid = producer_config["transactional.id"]
    assert state.producer_id is not None

    def fresh(request: Request, response: Any) -> None:
        for entry in response.transaction_states:
            if entry.transactional_id == tid:
                entry.producer_id = state.producer_id + 1000  # type: ignore[operator]
                entry.producer_epoch, entry.transaction_state = 0, "Empty"
                entry.transaction_start_time_ms, entry.topics = -1, []

    proxy.rewrite(ApiKey.DESCRIBE_TRANSACTIONS, fresh)
    with pytest.raises(TransactionOutcomeUnknowableError, match="another producer id") as info:
        _recover(config, state)
    assert info.value.observed["producer_id"] == state.producer_id + 1000
    assert broker.read_committed(topic, expected=1) == [(None, b"stored")]


# ---------------------------------------------------------------- CONCURRENT_TRANSACTIONS
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
def test_exactly_once_loop_rewinds_without_fetching_offsets_while_they_are_unstable(
    broker: Broker, proxy: KafkaProxy
) -> None:
    """Apache Kafka answers OffsetFetch with UNSTABLE_OFFSET_COMMIT (require_stable, as
    librdkafka sends it) for a partition whose group has transactional offsets whose
    markers are not written yet: the group coordinator's
    OffsetMetadataManager.fetchOffsets (hasPendingTransactionalOffsets; classic:
    GroupMetadata.hasPendingOffsetCommitsForTopicPartition), i.e. right after a commit
    or abort returned, while the markers are still on their way. From the first
    transaction's commit on, every OffsetFetch is answered so. The loop's rewind after
    a failure seeks to the batch's first offsets and fetches nothing, so it proceeds;
    a rewind through committed() would hang in librdkafka's retries instead."""
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
