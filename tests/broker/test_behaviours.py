"""Apache Kafka's own behaviours, each produced by a real Apache Kafka broker configured to
produce it (``tests/support/apache_kafka.py``: 4.4.0 from Maven unless KAFKA_TXN_KAFKA_VERSION
names another), and checked through the real client stack: librdkafka through
TransactionalProducer and ExactlyOnceProcessor, kafka-txn's own coordinator client
through recovery.

The behaviours the local broker lacks, on Apache Kafka itself:

- KIP-467: a batch the broker refuses for some of its records (a keyless record in a
  compacted topic, uncompressed and compressed; a timestamp out of the topic's range):
  which records librdkafka fails how, and what re-sending the others does;
- the coordinator's timeout abort (a short ``transaction.timeout.ms``, a small
  ``transaction.abort.timed.out.transaction.cleanup.interval.ms``) of a prepared
  transaction, of the next unprepared one after the stored one committed, and between
  recovery's DescribeTransactions and its EndTxn, on a ``transaction.version`` 2 cluster
  and on one formatted at version 0 (no KIP-890 part 2): every DescribeTransactions
  answer seen while it aborts is recorded (``record_property``) and decided, and
  recovery's verdict checked;
- an expired transactional id (a short ``transactional.id.expiration.ms``), then
  initialised again under a fresh producer id;
- CONCURRENT_TRANSACTIONS while a commit's markers are written (on a broker whose
  inter-broker link, which the markers take, is slowed by a KafkaProxy), answered to
  recovery's EndTxn and to the ``init_transactions()`` right after it, and
  UNSTABLE_OFFSET_COMMIT under the exactly-once loop while a dead instance's open
  transaction holds the group's offsets;
- a producer ``transaction.timeout.ms`` above the broker's ``transaction.max.timeout.ms``.

Each test starts no broker of its own: the module starts one Apache Kafka per
configuration it needs, on first use, and stops them all at its end. A machine without
``java`` and ``mvn`` fails these tests (never skips them).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import tenacity
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_txn import (
    CommitFailedException,
    FatalError,
    PreparedTxnState,
    ProduceFailedException,
    TransactionalProducer,
    TransactionDivergedError,
    TransactionOutcome,
    TransactionOutcomeUnknowableError,
)
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient, TransactionDescription
from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord
from kafka_txn.errors import FailureType
from kafka_txn.twophase.decisions import Verdict, decide
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy, Request
from tests.support.apache_kafka import ApacheKafka, free_port, require_java_and_maven
from tests.support.rig import Broker, transaction_version

TIMEOUT_MS = 3000
"""The producers' transaction.timeout.ms where the coordinator is to time them out."""

_ABORT_SWEEP = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}
_KINDS: dict[str, tuple[int | None, dict[str, str]]] = {
    # transaction.version of the release (2 on 4.x): KIP-890 part 2 on the server
    "tv2": (None, _ABORT_SWEEP),
    # formatted with transaction.version=0: what clusters without KIP-890 part 2 do
    "tv1": (0, _ABORT_SWEEP),
    # an idle transactional id is forgotten after 3 s, looked for every 200 ms
    "expiring": (
        None,
        {
            "transactional.id.expiration.ms": "3000",
            "transaction.remove.expired.transaction.cleanup.interval.ms": "200",
        },
    ),
    # its inter-broker listener behind a slow link (_slow_inter_broker_link)
    "slow-markers": (None, {}),
}
MARKER_LINK_DELAY_MS = 50
"""One-way delay of the "slow-markers" broker's inter-broker link: a commit's markers
(WriteTxnMarkers, sent by the coordinator over that link even to itself) take at least
twice this to be written, so its PrepareCommit lasts that long."""


@dataclass
class _Kafka:
    server: ApacheKafka
    rig: Broker
    """The rig's helpers (topics, read_committed reads) pointed at this broker."""
    transaction_version: int
    """The finalized transaction.version feature the broker reports."""
    link: KafkaProxy | None = None
    """The slow inter-broker link, for the "slow-markers" broker."""

    @property
    def bootstrap_servers(self) -> str:
        return self.server.bootstrap_servers

    def config(self, tid: str, **extra: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, "transactional.id": tid, **extra}

    def abort_epoch_bump(self) -> int:
        """By how much the coordinator's own abort (timeout or fencing) moves the epoch of
        a transaction it aborts: TransactionCoordinator.abortTimedOutTransactions calls
        TransactionMetadata.prepareFenceProducerEpoch (+1), then endTransaction(ABORT)
        with the cluster's transaction version. At version 0/1 (endTransactionWithTV1)
        the abort keeps that epoch; at version 2, Apache Kafka 4.1 and later let
        prepareAbortOrCommit's own bump stand for the fence's (+1 in all), while 4.0
        sets the fenced epoch first and then bumps again (+2)."""
        if self.transaction_version >= 2 and self.server.version.startswith("4.0."):
            return 2
        return 1


@pytest.fixture(scope="module")
def apache_kafka() -> Iterator[Callable[[str], _Kafka]]:
    """The module's brokers by kind (``_KINDS``), each started on first use and all
    stopped at the module's end."""
    require_java_and_maven()
    started: dict[str, _Kafka] = {}

    def get(kind: str) -> _Kafka:
        if kind not in started:
            tv, properties = _KINDS[kind]
            server = ApacheKafka(transaction_version=tv, properties=properties)
            link = _slow_inter_broker_link(server) if kind == "slow-markers" else None
            try:
                server.start()
            except BaseException:
                if link is not None:
                    link.close()
                raise
            started[kind] = _Kafka(
                server,
                Broker(server.bootstrap_servers, server.description),
                transaction_version(server.bootstrap_servers),
                link,
            )
        return started[kind]

    try:
        yield get
    finally:
        for kafka in started.values():
            kafka.server.stop()
            if kafka.link is not None:
                kafka.link.close()


def _slow_inter_broker_link(server: ApacheKafka) -> KafkaProxy:
    """Give ``server`` (not started yet) an inter-broker listener of its own, INTERNAL,
    advertised at a KafkaProxy that delays every byte MARKER_LINK_DELAY_MS each way: the
    transaction coordinator's TransactionMarkerChannelManager reaches the partition
    leaders (here, itself) at their inter-broker endpoint, so a commit stays in
    PrepareCommit while its markers cross the slow link. Clients keep the fast PLAINTEXT
    listener."""
    internal = free_port()
    link = KafkaProxy(f"127.0.0.1:{internal}", delay_ms=MARKER_LINK_DELAY_MS)
    client, controller = server.port, server.controller_port
    server.properties.update(
        {
            "listeners": f"PLAINTEXT://127.0.0.1:{client},INTERNAL://127.0.0.1:{internal},"
            f"CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{client},"
            f"INTERNAL://{link.bootstrap_servers}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,"
            "CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
        }
    )
    return link


@pytest.fixture
def kafka(apache_kafka: Callable[[str], _Kafka]) -> _Kafka:
    """Apache Kafka at its release's transaction version (2)."""
    return apache_kafka("tv2")


@pytest.fixture(params=["tv2", "tv1"])
def timing_out(request: pytest.FixtureRequest, apache_kafka: Callable[[str], _Kafka]) -> _Kafka:
    """Apache Kafka at transaction version 2, then at 0, sweeping for timed-out
    transactions every 500 ms."""
    kafka = apache_kafka(request.param)
    assert (kafka.transaction_version >= 2) == (request.param == "tv2"), kafka.server.description
    return kafka


@pytest.fixture
def tid() -> str:
    return f"txn-{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------- helpers
def _two_phase(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "transaction.two.phase.commit.enable": True}


def _via(config: dict[str, Any], proxy: KafkaProxy) -> dict[str, Any]:
    return {**config, "bootstrap.servers": proxy.bootstrap_servers}


def _recover(config: dict[str, Any], state: PreparedTxnState) -> TransactionOutcome:
    """A fresh process's recovery of ``state``. Its calls may take 30 s (the operation
    timeout is otherwise the short transaction.timeout.ms these tests set)."""
    producer = TransactionalProducer(_two_phase(config), operation_timeout=30)
    try:
        producer.init_transactions(keep_prepared_txn=True)
        return producer.complete_transaction(state)
    finally:
        producer.close()


def _identity(state: PreparedTxnState) -> tuple[int, int, int]:
    p, e, s = state.producer_id, state.producer_epoch, state.txn_start_ms
    assert p is not None and e is not None and s is not None, state
    return p, e, s


Key = tuple[str, int, int, int]


def _key(seen: TransactionDescription) -> Key:
    """What recovery decides from: state, producer id, epoch, start time."""
    return (seen.state, seen.producer_id, seen.producer_epoch, seen.start_time_ms)


def _describe(kafka: _Kafka, tid: str) -> TransactionDescription:
    settings = ConnectionSettings.from_librdkafka({"bootstrap.servers": kafka.bootstrap_servers})
    with CoordinatorClient(settings, tid) as client:
        return client.describe()


def _watch(
    kafka: _Kafka,
    tid: str,
    until: Callable[[TransactionDescription], bool],
    *,
    hurry_at_ms: int = 0,
    within_s: float = 30.0,
) -> list[TransactionDescription]:
    """Every distinct answer (``_key``) DescribeTransactions gives for ``tid``, in order,
    until one satisfies ``until``. From ``hurry_at_ms`` (wall clock, the coordinator's
    clock on this machine) on it asks back to back, so that an answer that lasts a few
    milliseconds (the transaction Ongoing under the fenced epoch while PrepareAbort is
    appended) is likely caught; before, every 20 ms."""
    settings = ConnectionSettings.from_librdkafka({"bootstrap.servers": kafka.bootstrap_servers})
    seen: list[TransactionDescription] = []
    deadline = time.monotonic() + within_s
    with CoordinatorClient(settings, tid) as client:
        while True:
            answer = client.describe()
            if not seen or _key(seen[-1]) != _key(answer):
                seen.append(answer)
            if until(answer):
                return seen
            assert time.monotonic() < deadline, f"{tid}: still waiting, seen {_render(seen)}"
            if time.time() * 1000 < hurry_at_ms:
                time.sleep(0.02)


def _render(seen: list[TransactionDescription]) -> list[str]:
    return [
        f"{d.state} pid={d.producer_id} epoch={d.producer_epoch} start={d.start_time_ms}"
        if d.found
        else "TRANSACTIONAL_ID_NOT_FOUND"
        for d in seen
    ]


def _answers(
    proxy: KafkaProxy, api: int, when: Callable[[Request], bool] | None = None
) -> list[str]:
    """The error codes the broker answers ``api`` with through ``proxy``, by name, in
    order (the answers pass unchanged)."""
    names: list[str] = []

    def note(request: Request, response: Any) -> None:
        code = response.error_code
        names.append("NONE" if code == 0 else KafkaError(code).name())

    proxy.rewrite(api, note, when=when)
    return names


def _committed(request: Request) -> bool:
    return bool(request.body.committed)


def _end_txns(proxy: KafkaProxy) -> int:
    return proxy.count(ApiKey.END_TXN)


def _topic(kafka: _Kafka, partitions: int = 1, **config: str) -> str:
    """A new topic with these topic configs, visible in metadata."""
    if not config:
        return kafka.rig.create_topic(partitions=partitions)
    name = f"t-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)
    admin.create_topics([topic], operation_timeout=30)[name].result(timeout=60)
    for _ in range(300):
        found = admin.list_topics(name, timeout=10).topics.get(name)
        if found is not None and found.error is None and len(found.partitions) == partitions:
            return name
        time.sleep(0.1)
    raise AssertionError(f"topic {name} did not appear in metadata")


def _values(records: list[tuple[bytes | None, bytes | None]]) -> list[bytes]:
    assert all(v is not None for _, v in records)
    return sorted(v for _, v in records if v is not None)


# ---------------------------------------------------------------- KIP-467
_TWO_DAYS_MS = 2 * 24 * 3600 * 1000
# kind: (topic configs, producer settings, the code Apache Kafka gives the partition).
# A culprit of "compacted-*" has no key, one of "timestamp-*" a CreateTime two days old.
_CULPRITS = {
    "compacted-keyless": ({"cleanup.policy": "compact"}, {}, KafkaError.INVALID_RECORD),
    "compacted-keyless-lz4": (
        {"cleanup.policy": "compact"}, {"compression.type": "lz4"}, KafkaError.INVALID_RECORD,
    ),
    "timestamp-out-of-range": (
        {"message.timestamp.before.max.ms": "3600000"}, {}, KafkaError.INVALID_TIMESTAMP,
    ),
}  # fmt: skip


def _produce_five(
    producer: TransactionalProducer, topic: str, culprits: set[int], kind: str
) -> dict[bytes, ProduceFailedException | None]:
    """Five records to partition 0 in one batch (linger.ms), those at ``culprits`` bad
    in the way ``kind`` says; each record's delivery report."""
    reports: dict[bytes, ProduceFailedException | None] = {}

    def report(error: ProduceFailedException | None, message: Any) -> None:
        reports[message.value()] = error

    for i in range(5):
        bad = i in culprits
        key = None if bad and kind.startswith("compacted") else b"k%d" % i
        timestamp = int(time.time() * 1000) - _TWO_DAYS_MS if bad and kind.startswith("time") else 0
        producer.produce(
            topic, b"r%d" % i, key=key, partition=0, on_delivery=report, timestamp=timestamp
        )
    producer.flush(30)
    return reports


@pytest.mark.parametrize("kind", sorted(_CULPRITS))
@pytest.mark.guarantee("1.2")
def test_kip467_the_culprits_of_a_refused_batch_are_rejected_and_the_others_go_again(
    kafka: _Kafka, tid: str, kind: str, record_property: Callable[[str, object], None]
) -> None:
    """A batch of five with records 1 and 3 bad, refused by Apache Kafka's
    LogValidator (validateKey: "Compacted topic cannot accept message without key";
    validateTimestamp: a CreateTime outside message.timestamp.before.max.ms; both in the
    uncompressed and the compressed validation path), which throws
    RecordValidationException with one RecordError per bad record
    (processRecordErrors): the partition's INVALID_RECORD or INVALID_TIMESTAMP with
    ``record_errors``, nothing of the batch appended. librdkafka
    (rd_kafka_msgbatch_handle_Produce_result_record_errors) gives each culprit
    INVALID_RECORD when there is more than one record error, whatever the partition's
    code (MESSAGE_REJECTED), and each other record _INVALID_DIFFERENT_RECORD
    (DELIVERY_FAILED: retriable in a new transaction); the commit's cause is a culprit.
    Sent again without the culprits, the others commit once each."""
    topic_config, producer_extra, _ = _CULPRITS[kind]
    topic = _topic(kafka, 1, **topic_config)
    config = kafka.config(tid, **{"linger.ms": 50, **producer_extra})
    attempts = 0
    with TransactionalProducer(config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        reports = _produce_five(producer, topic, {1, 3}, kind)
        assert sorted(reports) == [b"r0", b"r1", b"r2", b"r3", b"r4"]
        culprits = {v: e for v, e in reports.items() if v in (b"r1", b"r3")}
        innocents = {v: e for v, e in reports.items() if v not in culprits}
        record_property(
            "reports", {v.decode(): e and e.kafka_error.name() for v, e in reports.items()}
        )
        for error in culprits.values():
            assert error is not None and error.failure_type is FailureType.MESSAGE_REJECTED
            assert error.kafka_error.code() == KafkaError.INVALID_RECORD  # not partition_code
        for error in innocents.values():
            assert error is not None and error.failure_type is FailureType.DELIVERY_FAILED
            assert error.kafka_error.code() == KafkaError._INVALID_DIFFERENT_RECORD
        with pytest.raises(CommitFailedException) as info:
            producer.commit_transaction()
        cause = info.value.__cause__
        assert isinstance(cause, ProduceFailedException)
        assert cause.failure_type is FailureType.MESSAGE_REJECTED
        producer.abort_transaction()
        # The innocent records go again, keyed and timely. librdkafka may fail the first
        # transaction after the refused batch once more (its sequence numbers ran ahead
        # of what the broker appended; it then bumps the epoch, KIP-360): retried.
        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(CommitFailedException),
            stop=tenacity.stop_after_attempt(3), reraise=True,
        ):  # fmt: skip
            with attempt, producer.transaction():
                attempts += 1
                for value in sorted(innocents):
                    producer.produce(topic, value, key=b"again", partition=0)
    record_property("transactions to re-send the innocent records", attempts)
    assert _values(kafka.rig.read_committed(topic, expected=3)) == [b"r0", b"r2", b"r4"]


@pytest.mark.parametrize("kind", sorted(_CULPRITS))
@pytest.mark.guarantee("1.2")
def test_kip467_with_one_culprit_every_record_of_the_batch_reports_the_partitions_error(
    kafka: _Kafka, tid: str, kind: str
) -> None:
    """One bad record (index 2) in the batch: Apache Kafka sends one RecordError with
    the partition's code, and librdkafka 2.16's rd_kafka_dr_msgq0 passes that code as
    ``force_err`` whenever fewer than two record errors came back, overwriting every
    record's own: all five report the partition's INVALID_RECORD or INVALID_TIMESTAMP,
    MESSAGE_REJECTED. This pins that behaviour: when librdkafka changes it, this test
    fails and the docs' KIP-467 note must change. Nothing of the batch is visible."""
    topic_config, producer_extra, partition_code = _CULPRITS[kind]
    topic = _topic(kafka, 1, **topic_config)
    config = kafka.config(tid, **{"linger.ms": 50, **producer_extra})
    with TransactionalProducer(config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        reports = _produce_five(producer, topic, {2}, kind)
        assert sorted(reports) == [b"r0", b"r1", b"r2", b"r3", b"r4"]
        for error in reports.values():
            assert error is not None and error.failure_type is FailureType.MESSAGE_REJECTED
            assert error.kafka_error.code() == partition_code
        with pytest.raises(CommitFailedException):
            producer.commit_transaction()
        producer.abort_transaction()
    assert kafka.rig.read_committed(topic, expected=0, linger=0.5) == []


# ---------------------------------------------------------------- transaction timeout
@pytest.mark.adversary
@pytest.mark.guarantee("3.3")
def test_a_prepared_transaction_the_coordinator_timed_out_is_divergence(
    timing_out: _Kafka, tid: str, record_property: Callable[[str, object], None]
) -> None:
    """The prepared transaction outlives transaction.timeout.ms and the process that
    prepared it is gone. TransactionStateManager.timedOutTransactions picks it and
    TransactionCoordinator.abortTimedOutTransactions fences its epoch
    (TransactionMetadata.prepareFenceProducerEpoch) and aborts it with the cluster's
    transaction version, keeping its start time: DescribeTransactions shows it Ongoing
    under e, then (at version 0/1, for the few milliseconds PrepareAbort takes to be
    appended) Ongoing under e + 1, then PrepareAbort and CompleteAbort under e + 1
    (``abort_epoch_bump``). Recovery decides COMMIT only for the first of these and
    DIVERGED for every later one; on the settled answer it raises
    TransactionDivergedError, sends no EndTxn, and nothing of it is visible."""
    kafka = timing_out
    topic = kafka.rig.create_topic(1)
    config = kafka.config(tid, **{"transaction.timeout.ms": TIMEOUT_MS})
    producer = TransactionalProducer(_two_phase(config))
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce(topic, b"prepared")
    state = producer.prepare_transaction()
    producer.close()  # the process is gone; the prepared transaction stays open
    p, e, s = _identity(state)
    bump = kafka.abort_epoch_bump()
    seen = _watch(kafka, tid, lambda d: d.state == "CompleteAbort", hurry_at_ms=s + TIMEOUT_MS - 50)
    record_property("DescribeTransactions", _render(seen))
    keys = [_key(d) for d in seen]
    assert keys[0] == ("Ongoing", p, e, s) and keys[-1] == ("CompleteAbort", p, e + bump, s)
    possible = {("Ongoing", p, e, s), ("Ongoing", p, e + 1, s), ("PrepareAbort", p, e + bump, s)}
    assert set(keys[:-1]) <= possible, keys
    if kafka.transaction_version >= 2 and bump == 1:  # no fenced epoch is set before the append
        assert ("Ongoing", p, e + 1, s) not in keys, keys
    verdicts = [decide(state, d).verdict for d in seen]
    assert verdicts == [Verdict.COMMIT] + [Verdict.DIVERGED] * (len(seen) - 1), keys
    with KafkaProxy(kafka.bootstrap_servers) as proxy:
        with pytest.raises(TransactionDivergedError, match=r"transaction\.timeout\.ms") as info:
            _recover(_via(config, proxy), state)
        assert _end_txns(proxy) == 0  # no commit was attempted
    observed = info.value.observed
    assert (observed["state"], observed["producer_epoch"]) == ("CompleteAbort", e + bump)
    assert observed["transaction_start_time_ms"] == s
    assert kafka.rig.read_committed(topic, expected=0, linger=0.5) == []


@pytest.mark.adversary
@pytest.mark.guarantee("3.3")
def test_the_next_unprepared_transaction_timed_out_after_the_stored_one_committed(
    timing_out: _Kafka, tid: str, record_property: Callable[[str, object], None]
) -> None:
    """The stored transaction committed, the process began the next one, sent a record
    and died before storing the state completed; the coordinator then timed that next
    transaction out (TransactionCoordinator.abortTimedOutTransactions), under the same
    producer id: Ongoing under e with a later start, then PrepareAbort and CompleteAbort
    under e + ``abort_epoch_bump`` with that later start. A later transaction under the
    stored epoch means the stored one ended, committed (row 8), and one epoch bump after
    it is that later one aborted (row 11): recovery says ALREADY_COMMITTED and sends
    nothing. (Where the abort bumps twice, Apache Kafka 4.0 at version 2, the answer is
    the same as an aborted stored transaction followed by an init and an aborted later
    one: unknowable, row 12.)"""
    kafka = timing_out
    topic = kafka.rig.create_topic(1)
    config = kafka.config(tid, **{"transaction.timeout.ms": TIMEOUT_MS})
    producer = TransactionalProducer(_two_phase(config))
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce(topic, b"stored")
    state = producer.prepare_transaction()
    producer.complete_transaction(state)  # committed; the state is never stored completed
    producer.begin_transaction()
    producer.produce(topic, b"next, never prepared")
    producer.flush(30)
    producer._close(abort_open=False)  # dies: the open transaction is left to the coordinator
    p, e, s = _identity(state)
    bump = kafka.abort_epoch_bump()
    seen = _watch(
        kafka, tid, lambda d: d.state == "CompleteAbort",
        hurry_at_ms=int(time.time() * 1000) + TIMEOUT_MS - 300,
    )  # fmt: skip
    record_property("DescribeTransactions", _render(seen))
    keys = [_key(d) for d in seen]
    later = keys[0][3]
    assert keys[0] == ("Ongoing", p, e, later) and later > s, keys
    assert keys[-1] == ("CompleteAbort", p, e + bump, later), keys
    possible = {("Ongoing", p, e, later), ("Ongoing", p, e + 1, later)}
    assert set(keys[:-1]) <= possible | {("PrepareAbort", p, e + bump, later)}, keys
    settled = Verdict.ALREADY_COMMITTED if bump == 1 else Verdict.UNKNOWABLE
    for answer in seen:
        expected = settled if answer.producer_epoch == e + bump else Verdict.ALREADY_COMMITTED
        assert decide(state, answer).verdict is expected, _key(answer)
    with KafkaProxy(kafka.bootstrap_servers) as proxy:
        if settled is Verdict.ALREADY_COMMITTED:
            assert _recover(_via(config, proxy), state) is TransactionOutcome.ALREADY_COMMITTED
        else:
            with pytest.raises(TransactionOutcomeUnknowableError):
                _recover(_via(config, proxy), state)
        assert _end_txns(proxy) == 0
    assert kafka.rig.read_committed(topic, expected=1) == [(None, b"stored")]


@pytest.mark.adversary
@pytest.mark.guarantee("3.3")
def test_a_timeout_between_recoverys_describe_and_its_end_txn_is_divergence(
    timing_out: _Kafka, tid: str, record_property: Callable[[str, object], None]
) -> None:
    """Recovery's DescribeTransactions sees the prepared transaction Ongoing under the
    stored epoch (COMMIT); its EndTxn(commit) is held back until the coordinator has
    timed the transaction out for real. TransactionCoordinator.endTransactionWithTV1
    (EndTxn v4 and below, as the coordinator client sends it) answers PRODUCER_FENCED:
    the stored epoch is not the fenced one. Recovery describes again, sees CompleteAbort
    with the stored start time, and reports the divergence with the refusal's code."""
    kafka = timing_out
    topic = kafka.rig.create_topic(1)
    config = kafka.config(tid, **{"transaction.timeout.ms": TIMEOUT_MS})
    producer = TransactionalProducer(_two_phase(config))
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce(topic, b"prepared")
    state = producer.prepare_transaction()
    producer.close()
    p, e, s = _identity(state)
    seen: list[TransactionDescription] = []

    def until_timed_out(request: Request) -> None:
        seen.extend(
            _watch(kafka, tid, lambda d: d.state == "CompleteAbort", hurry_at_ms=s + TIMEOUT_MS)
        )

    with KafkaProxy(kafka.bootstrap_servers) as proxy:
        ends = _answers(proxy, ApiKey.END_TXN)
        held = proxy.before(ApiKey.END_TXN, until_timed_out, times=1, when=_committed)
        with pytest.raises(TransactionDivergedError, match="PRODUCER_FENCED") as info:
            _recover(_via(config, proxy), state)
    record_property("DescribeTransactions while EndTxn was held", _render(seen))
    assert held.hits == 1 and ends == ["PRODUCER_FENCED"]
    assert info.value.kafka_error.code() == KafkaError.PRODUCER_FENCED
    observed = info.value.observed
    assert (observed["state"], observed["producer_id"]) == ("CompleteAbort", p)
    assert observed["producer_epoch"] == e + kafka.abort_epoch_bump()
    assert observed["transaction_start_time_ms"] == s
    assert kafka.rig.read_committed(topic, expected=0, linger=0.5) == []


# ---------------------------------------------------------------- transactional id expiry
@pytest.mark.adversary
@pytest.mark.guarantee("3.4")
def test_an_expired_transactional_id_is_unknowable_also_once_initialised_again(
    apache_kafka: Callable[[str], _Kafka], tid: str, record_property: Callable[[str, object], None]
) -> None:
    """The stored transaction committed and the id then stayed idle longer than
    transactional.id.expiration.ms: TransactionStateManager.removeExpiredTransactionalIds
    (ids in Empty or Complete* only, shouldExpire) writes its tombstone, and
    TransactionCoordinator.handleDescribeTransactions answers TRANSACTIONAL_ID_NOT_FOUND.
    Whether the stored transaction committed cannot be learnt from Kafka: recovery
    raises TransactionOutcomeUnknowableError (row 1), sends no EndTxn, and says to check
    the topic. Another process then initialises the id: handleInitProducerId finds no
    metadata and allocates a fresh producer id (epoch 0, Empty, no start time); recovery
    is still unknowable (row 2), committing nothing."""
    kafka = apache_kafka("expiring")
    topic = kafka.rig.create_topic(1)
    config = kafka.config(tid)
    with TransactionalProducer(_two_phase(config)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"stored")
        state = producer.prepare_transaction()
        producer.complete_transaction(state)  # committed; never stored completed
    p, e, s = _identity(state)
    seen = _watch(kafka, tid, lambda d: not d.found)
    record_property("DescribeTransactions until forgotten", _render(seen))
    # (PrepareCommit first if the commit's markers were still on their way)
    assert [_key(d) for d in seen[:-1]][-1] == ("CompleteCommit", p, e, s), _render(seen)
    assert {_key(d) for d in seen[:-1]} <= {
        (c, p, e, s) for c in ("PrepareCommit", "CompleteCommit")
    }
    assert not seen[-1].found
    with KafkaProxy(kafka.bootstrap_servers) as proxy:
        with pytest.raises(TransactionOutcomeUnknowableError, match="forgotten") as info:
            _recover(_via(config, proxy), state)
        assert _end_txns(proxy) == 0
    assert info.value.observed["found"] is False
    assert "read_committed" in str(info.value)
    # Another process initialises the id again.
    with TransactionalProducer(config) as other:
        other.init_transactions()
    again = _describe(kafka, tid)
    record_property("DescribeTransactions after the new init", _render([again]))
    assert again.found and again.producer_id != p
    assert (again.state, again.producer_epoch, again.start_time_ms) == ("Empty", 0, -1)
    with pytest.raises(TransactionOutcomeUnknowableError, match="another producer id") as info:
        _recover(config, state)
    assert info.value.observed["producer_id"] == again.producer_id
    assert kafka.rig.read_committed(topic, expected=1) == [(None, b"stored")]


# ---------------------------------------------------------------- CONCURRENT_TRANSACTIONS
@pytest.fixture
def slow_markers(apache_kafka: Callable[[str], _Kafka]) -> _Kafka:
    """Apache Kafka (transaction version 2) whose commits stay in PrepareCommit for at
    least 2 x MARKER_LINK_DELAY_MS while their markers cross a slow inter-broker link."""
    return apache_kafka("slow-markers")


PARTITIONS = 4


def _prepare_wide(config: dict[str, Any], topic: str) -> tuple[
    TransactionalProducer, PreparedTxnState, list[bytes]
]:  # fmt: skip
    """A prepared transaction with one record on every partition of ``topic``."""
    producer = TransactionalProducer(_two_phase(config), operation_timeout=30)
    producer.init_transactions()
    producer.begin_transaction()
    values = [b"p%d" % partition for partition in range(PARTITIONS)]
    for partition, value in enumerate(values):
        producer.produce(topic, value, partition=partition)
    return producer, producer.prepare_transaction(), values


_ANSWERS = {"NONE", "CONCURRENT_TRANSACTIONS"}


@pytest.mark.adversary
@pytest.mark.guarantee("3.7")
def test_recoverys_end_txn_while_the_markers_of_the_same_commit_are_written(
    slow_markers: _Kafka, tid: str, record_property: Callable[[str, object], None]
) -> None:
    """The process that prepared the stored transaction commits it at the very moment
    recovery sends its EndTxn(commit): recovery's EndTxn is held until that commit's
    EndTxn was answered (the coordinator appended PrepareCommit and handed the markers
    to TransactionMarkerChannelManager, whose WriteTxnMarkers cross the slow link), then
    let go at once. TransactionCoordinator.endTransactionWithTV1 answers
    CONCURRENT_TRANSACTIONS to EndTxn(commit) in PrepareCommit, which the coordinator
    client retries with backoff; once CompleteCommit is written it answers NONE (a
    commit already done). Recovery confirms the stored transaction committed, and every
    record is visible once."""
    kafka = slow_markers
    topic = kafka.rig.create_topic(PARTITIONS)
    config = kafka.config(tid)
    zombie, state, values = _prepare_wide(config, topic)

    def zombie_commits(request: Request) -> None:
        zombie.complete_transaction(state)

    try:
        with KafkaProxy(kafka.bootstrap_servers) as proxy:
            ends = _answers(proxy, ApiKey.END_TXN, when=_committed)
            inits = _answers(proxy, ApiKey.INIT_PRODUCER_ID)
            proxy.before(ApiKey.END_TXN, zombie_commits, times=1, when=_committed)
            outcome = _recover(_via(config, proxy), state)
    finally:
        zombie.close()
    record_property("recovery's EndTxn answers", ends)
    record_property("InitProducerId answers", inits)
    assert outcome in (TransactionOutcome.COMMITTED, TransactionOutcome.ALREADY_COMMITTED)
    assert ends[0] == "CONCURRENT_TRANSACTIONS", ends  # PrepareCommit: the markers' link
    assert ends[-1] == "NONE" and set(ends) <= _ANSWERS, ends
    assert inits[-1] == "NONE" and set(inits) <= _ANSWERS, inits
    assert _values(kafka.rig.read_committed(topic, expected=PARTITIONS)) == values


@pytest.mark.adversary
@pytest.mark.guarantee("3.7")
def test_init_transactions_right_after_recoverys_commit_while_its_markers_are_written(
    slow_markers: _Kafka, tid: str, record_property: Callable[[str, object], None]
) -> None:
    """Recovery commits the stored transaction (its EndTxn is answered once PrepareCommit
    is appended; the markers then cross the slow link), confirms it with one
    DescribeTransactions (PrepareCommit counts), and initialises transactions right
    after. TransactionCoordinator.prepareInitProducerIdTransit answers
    CONCURRENT_TRANSACTIONS while the transaction is in PrepareCommit, and librdkafka
    retries its InitProducerId until CompleteCommit, then gets the bumped epoch. The
    outcome is COMMITTED, the producer works, and every record is visible once."""
    kafka = slow_markers
    topic = kafka.rig.create_topic(PARTITIONS)
    config = kafka.config(tid)
    crashed, state, values = _prepare_wide(config, topic)
    crashed.close()
    with KafkaProxy(kafka.bootstrap_servers) as proxy:
        ends = _answers(proxy, ApiKey.END_TXN, when=_committed)
        inits = _answers(proxy, ApiKey.INIT_PRODUCER_ID)
        fresh = TransactionalProducer(_two_phase(_via(config, proxy)), operation_timeout=30)
        try:
            fresh.init_transactions(keep_prepared_txn=True)
            outcome = fresh.complete_transaction(state)
            after_recovery = (list(ends), list(inits))
            with fresh.transaction():
                fresh.produce(topic, b"after recovery", partition=0)
        finally:
            fresh.close()
    ends, inits = after_recovery
    record_property("recovery's EndTxn answers", ends)
    record_property("InitProducerId answers", inits)
    assert outcome is TransactionOutcome.COMMITTED and ends == ["NONE"]
    assert inits[0] == "CONCURRENT_TRANSACTIONS", inits  # PrepareCommit: the markers' link
    assert inits[-1] == "NONE" and set(inits) <= _ANSWERS, inits
    got = _values(kafka.rig.read_committed(topic, expected=PARTITIONS + 1))
    assert got == sorted([*values, b"after recovery"])


# ---------------------------------------------------------------- UNSTABLE_OFFSET_COMMIT
@pytest.mark.guarantee("6.4")
def test_exactly_once_loop_waits_out_unstable_offsets_and_rewinds_without_fetching_them(
    kafka: _Kafka, record_property: Callable[[str, object], None]
) -> None:
    """A previous instance of the processor (another transactional id) sent the
    group's offsets in a transaction and died before committing it. The group
    coordinator's OffsetMetadataManager.fetchOffsets answers OffsetFetch with
    require_stable (librdkafka sends it under read_committed) UNSTABLE_OFFSET_COMMIT
    while those transactional offsets are pending (hasPendingTransactionalOffsets), until
    the transaction coordinator times that transaction out and its markers are written.
    librdkafka retries the OffsetFetch of the new assignment; the loop then starts from
    the beginning (the offsets were aborted), fails a record once after its first
    commit, and rewinds by seeking to the batch's first offsets without another
    OffsetFetch. Each record reaches the sink once; the dead instance's outputs never."""
    source, sink = kafka.rig.create_topic(1), kafka.rig.create_topic(1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    with TransactionalProducer(kafka.config(f"seed-{uuid.uuid4().hex[:8]}")) as seed:
        seed.init_transactions()
        with seed.transaction():
            for i in range(10):
                seed.produce(source, b"v%d" % i, partition=0)
    _dead_instance_holds_offsets(kafka, source, sink, group)
    failed_at: list[float] = []
    done = threading.Event()

    def process(record: Any) -> list[OutputRecord]:
        if record.value() == b"v7" and not failed_at:
            failed_at.append(time.monotonic())
            raise ValueError("fails once, after the first batch committed")
        if record.value() == b"v9":
            done.set()
        return [OutputRecord(sink, record.value())]

    fetches: list[tuple[float, str]] = []

    def note_fetch(request: Request, response: Any) -> None:
        # OffsetFetch v8+ answers per group, earlier versions per topic, plus a top-level
        # code up to v7: the worst code anywhere in the answer.
        groups = getattr(response, "groups", None) or [response]
        codes = {getattr(g, "error_code", 0) or 0 for g in groups} | {
            p.error_code for g in groups for t in getattr(g, "topics", None) or ()
            for p in t.partitions
        }  # fmt: skip
        worst = max(codes, key=abs)
        fetches.append((time.monotonic(), "NONE" if worst == 0 else KafkaError(worst).name()))

    with KafkaProxy(kafka.bootstrap_servers) as proxy:
        proxy.rewrite(ApiKey.OFFSET_FETCH, note_fetch)
        processor = ExactlyOnceProcessor(
            {"bootstrap.servers": proxy.bootstrap_servers, "group.id": group,
             "session.timeout.ms": 6000, "auto.offset.reset": "earliest"},
            {"bootstrap.servers": proxy.bootstrap_servers,
             "transactional.id": f"eos-{uuid.uuid4().hex[:8]}"},
            [source], process, backoff=tenacity.wait_fixed(0.01), batch_size=5,
        )  # fmt: skip
        stopper = threading.Thread(target=lambda: done.wait(60) and processor.stop())
        stopper.start()
        stats = processor.run(idle_timeout=30)
        done.set()
        stopper.join()
    record_property("OffsetFetch answers", [name for _, name in fetches])
    assert "UNSTABLE_OFFSET_COMMIT" in [name for _, name in fetches]
    assert fetches[-1][1] == "NONE"
    assert failed_at and stats.aborts == 1
    assert all(at < failed_at[0] for at, _ in fetches), "the rewind fetched offsets"
    assert _values(kafka.rig.read_committed(sink, expected=10)) == sorted(
        b"v%d" % i for i in range(10)
    )


def _dead_instance_holds_offsets(kafka: _Kafka, source: str, sink: str, group: str) -> None:
    """An instance of ``group`` consumed the first five records, wrote their outputs and
    the offset 5 in a transaction (TxnOffsetCommit) that it never ended: it dies, and the
    coordinator aborts the transaction after its transaction.timeout.ms."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})  # fmt: skip
    try:
        consumer.subscribe([source])
        taken: list[Any] = []
        deadline = time.monotonic() + 30
        while len(taken) < 5 and time.monotonic() < deadline:
            taken += [m for m in consumer.consume(5 - len(taken), 0.5) if m.error() is None]
        assert len(taken) == 5, taken
        dead = TransactionalProducer(
            kafka.config(f"dead-{uuid.uuid4().hex[:8]}", **{"transaction.timeout.ms": 4000})
        )
        dead.init_transactions()
        dead.begin_transaction()
        for message in taken:
            dead.produce(sink, b"dead " + message.value())
        dead.send_offsets_to_transaction(
            [TopicPartition(source, 0, 5)], consumer.consumer_group_metadata()
        )
        dead.flush(30)
        dead._close(abort_open=False)  # dies: the transaction is left to the coordinator
    finally:
        consumer.close()


# ---------------------------------------------------------------- transaction.max.timeout.ms
@pytest.mark.parametrize("two_phase", [False, True], ids=["init", "recovery-then-init"])
def test_a_transaction_timeout_above_the_brokers_maximum_names_both_settings(
    kafka: _Kafka, tid: str, two_phase: bool
) -> None:
    """TransactionCoordinator.handleInitProducerId refuses a transaction timeout above
    transaction.max.timeout.ms (TransactionStateManager.validateTransactionTimeoutMs,
    15 minutes by default) with INVALID_TRANSACTION_TIMEOUT; librdkafka makes it a fatal
    error whose text names a "max.transaction.timeout.ms" Apache Kafka does not have.
    init_transactions() (with two-phase commit, the init complete_transaction() runs
    after recovery) raises FatalError naming the producer's transaction.timeout.ms and
    the broker's transaction.max.timeout.ms, and the fix."""
    config = kafka.config(tid, **{"transaction.timeout.ms": 15 * 60_000 + 1})
    producer = TransactionalProducer(_two_phase(config) if two_phase else config)
    try:
        with pytest.raises(FatalError) as info:
            if two_phase:
                producer.init_transactions(keep_prepared_txn=True)
                producer.complete_transaction(PreparedTxnState.EMPTY)
            else:
                producer.init_transactions()
    finally:
        producer.close()
    assert info.value.kafka_error.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT
    message = str(info.value)
    assert "transaction.timeout.ms is larger than the broker's transaction.max.timeout.ms" in (
        message
    )
    assert "set transaction.timeout.ms to at most" in message
    assert not _describe(kafka, tid).found  # nothing was registered
