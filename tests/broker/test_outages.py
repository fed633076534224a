"""A broker that stops answering for longer than every timeout, then answers again, on
Apache Kafka: after the outage, the next transaction either runs or raises an error that
says what to do; an abort that ran out of time is finished before the next begin.

The outage is ``ApacheKafka.pause()`` (SIGSTOP): the process keeps its sockets, so the
clients see requests time out rather than refused connections, and the broker's clocks
go on, so a transaction it holds may time out meanwhile. Once resumed, the coordinator's
periodic check (``TransactionCoordinator.abortTimedOutTransactions``, every second
here) aborts a transaction older than ``transaction.timeout.ms`` with an epoch bump
(``TransactionStateManager.timedOutTransactions``, ``prepareFenceProducerEpoch``), after
which the producer's own EndTxn is answered PRODUCER_FENCED
(``TransactionCoordinator.endTransaction``: the epoch no longer matches).

What it checks, each against kafka-python read_committed (and SQL for the dual write):

- ``TransactionalProducer``: an abort that ran out of time leaves the producer
  ``aborting``; ``begin_transaction()`` while the broker is still away says the abort
  has not completed and begins nothing; once the broker answers, it finishes the abort
  and begins;
- the same after an outage longer than ``transaction.timeout.ms``: the coordinator
  aborted the transaction itself, and the producer's error names that cause and says
  to close it; a new producer goes on;
- ``DualWriter`` (PostgreSQL) with the broker paused inside the body: after a short
  outage the next transaction commits; after one past ``transaction.timeout.ms`` the
  next one raises ``FatalError`` saying to start a new writer, and a new writer
  commits; the database and Kafka hold the same rows, each once;
- ``ExactlyOnceProcessor``: paused mid-run for longer than every timeout, then resumed:
  the processor goes on or stops with an error, a processor started again finishes,
  and every input is in the output exactly once.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from kafka_txn import (
    DualWriter,
    FatalError,
    ProducerFencedError,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord
from kafka_txn.errors import KafkaTxnError
from tests.support.apache_kafka import FAST_TIMEOUT_ABORTS, running
from tests.support.rig import OwnKafka

pytestmark = pytest.mark.adversary

_TXN_TIMEOUT_MS = 6000
"""transaction.timeout.ms of the producers here: a long outage is longer than this."""
_OPERATION_TIMEOUT_S = 2.0
"""How long commit/abort/init retry: a short outage is longer than this."""
_SHORT_OUTAGE_S = 4.0
_LONG_OUTAGE_S = 10.0


class _Kafka(OwnKafka):
    """The module's broker, with the producer settings and the outage of its tests."""

    def config(self, **extra: Any) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "transactional.id": f"outage-{uuid.uuid4().hex[:10]}",
            "transaction.timeout.ms": _TXN_TIMEOUT_MS,
            **extra,
        }

    def outage(self, seconds: float) -> None:
        """Pause the broker for ``seconds`` (it is resumed whatever happens)."""
        self.server.pause()
        try:
            time.sleep(seconds)
        finally:
            self.server.resume()


@pytest.fixture(scope="module")
def kafka() -> Iterator[_Kafka]:
    with running(properties=FAST_TIMEOUT_ABORTS) as server:
        yield _Kafka(server)


class _Paused:
    """The broker paused by hand: ``end()`` resumes it once (also at exit)."""

    def __init__(self, kafka: _Kafka) -> None:
        self.kafka = kafka
        self.since = time.monotonic()
        kafka.server.pause()
        self._resumed = False

    def end(self, after: float) -> None:
        """Resume the broker once ``after`` seconds have passed since the pause."""
        if self._resumed:
            return
        time.sleep(max(0.0, after - (time.monotonic() - self.since)))
        self.kafka.server.resume()
        self._resumed = True

    def __enter__(self) -> _Paused:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end(0.0)


def _abort_during(kafka: _Kafka, producer: TransactionalProducer, topic: str) -> _Paused:
    """An open transaction with one delivered record and one sent into the outage,
    whose abort runs out of time: the producer is left 'aborting'."""
    producer.begin_transaction()
    producer.produce(topic, b"doomed-1")
    assert producer.flush(10) == 0
    paused = _Paused(kafka)
    producer.produce(topic, b"doomed-2")
    with pytest.raises(TransactionOutcomeUnknownError, match="abort_transaction"):
        producer.abort_transaction()
    assert producer.state == "aborting"
    return paused


@pytest.mark.guarantee("1.14")
def test_begin_finishes_an_abort_that_ran_out_of_time_once_the_broker_answers(
    kafka: _Kafka,
) -> None:
    """An abort that timed out during an outage is finished by the next
    ``begin_transaction()``: refused with a timeout error while the broker is away (the
    producer stays 'aborting', nothing begun), then finished and begun once it answers;
    only the next transaction's record is visible."""
    topic = kafka.broker.create_topic(partitions=1)
    producer = TransactionalProducer(kafka.config(), operation_timeout=_OPERATION_TIMEOUT_S)
    try:
        producer.init_transactions()
        with _abort_during(kafka, producer, topic) as paused:
            with pytest.raises(TransactionOutcomeUnknownError, match="has not completed") as err:
                producer.begin_transaction()
            assert "begin_transaction() again" in str(err.value)
            assert producer.state == "aborting"
            paused.end(after=_SHORT_OUTAGE_S)
        producer.begin_transaction()  # finishes the abort, then begins
        producer.produce(topic, b"after")
        producer.commit_transaction()
        assert producer.state == "ready"
    finally:
        producer.close()
    assert kafka.broker.read_committed(topic, expected=1) == [(None, b"after")]
    assert kafka.broker.open_partitions(topic) == {}


@pytest.mark.guarantee("1.14")
def test_an_outage_past_the_transaction_timeout_names_the_coordinators_abort(
    kafka: _Kafka,
) -> None:
    """The outage outlasts ``transaction.timeout.ms``: once resumed, the coordinator
    aborts the transaction with an epoch bump, so finishing the abort is refused
    PRODUCER_FENCED. The error names that cause (not only "a newer producer") and says
    to close the producer; a new producer with the same id then commits."""
    topic = kafka.broker.create_topic(partitions=1)
    config = kafka.config()
    producer = TransactionalProducer(config, operation_timeout=_OPERATION_TIMEOUT_S)
    try:
        producer.init_transactions()
        with _abort_during(kafka, producer, topic) as paused:
            paused.end(after=_LONG_OUTAGE_S)
        time.sleep(2.0)  # the coordinator's check (every second) aborts it first
        with pytest.raises(ProducerFencedError) as err:
            producer.begin_transaction()
        message = str(err.value)
        assert "transaction.timeout.ms" in message and "close it" in message
        assert producer.state == "fatal error"
    finally:
        producer.close()
    with TransactionalProducer(config, operation_timeout=10) as successor:
        successor.init_transactions()
        successor.begin_transaction()
        successor.produce(topic, b"after")
        successor.commit_transaction()
    assert kafka.broker.read_committed(topic, expected=1) == [(None, b"after")]
    assert kafka.broker.open_partitions(topic) == {}


def _rows(engine: sa.Engine, table: str) -> list[bytes]:
    with engine.connect() as conn:
        return sorted(bytes(r[0]) for r in conn.execute(sa.text(f"SELECT v FROM {table}")))


@pytest.mark.parametrize("outage", ["short", "past the transaction timeout"])
@pytest.mark.guarantee("4.15")
def test_a_dual_writer_goes_on_or_says_to_restart_after_an_outage(
    kafka: _Kafka, postgres_jdbc: str, outage: str
) -> None:
    """The broker pauses inside a dual write's body: that transaction fails and is rolled
    back, its Kafka abort runs out of time. After a short outage the writer's next
    transaction commits (it finishes the abort first); after one past
    ``transaction.timeout.ms`` it raises ``FatalError`` saying to start a new writer, and
    a new writer commits. Either way the database and Kafka (read_committed) hold the
    same rows, each once, and no transaction is left open."""
    seconds = _SHORT_OUTAGE_S if outage == "short" else _LONG_OUTAGE_S
    topic = kafka.broker.create_topic(partitions=1)
    table = f"outage_{uuid.uuid4().hex[:8]}"
    state_table = f"state_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (v BYTEA PRIMARY KEY)"))
    config = kafka.config()

    def write(writer: DualWriter, value: bytes, pause: bool = False) -> None:
        with writer.transaction() as tx:
            tx.connection.execute(sa.text(f"INSERT INTO {table} (v) VALUES (:v)"), {"v": value})
            if pause:
                # One record delivered (its partition is in the transaction), then the
                # outage: prepare's flush of the next one and the abort run out of time.
                tx.produce(topic, value + b"-delivered")
                assert writer.producer.flush(10) == 0
                kafka.server.pause()
                threading.Timer(seconds, kafka.server.resume).start()
            tx.produce(topic, value)

    writer = DualWriter(
        config, postgres_jdbc, state_table=state_table, operation_timeout=_OPERATION_TIMEOUT_S
    )
    try:
        writer.start()
        write(writer, b"before")
        with pytest.raises(KafkaTxnError):
            write(writer, b"lost", pause=True)
        time.sleep(seconds + 2.0)  # resumed, and the coordinator's check ran
        if outage == "short":
            write(writer, b"after")
        else:
            with pytest.raises(FatalError, match="start a new one") as err:
                write(writer, b"refused")
            assert "transaction.timeout.ms" in str(err.value)
            writer.close()
            writer = DualWriter(config, postgres_jdbc, state_table=state_table)
            writer.start()
            write(writer, b"after")
    finally:
        writer.close()
    expected = [b"after", b"before"]
    assert _rows(engine, table) == expected
    seen = kafka.broker.read_committed(topic, expected=2)
    assert sorted(v for _, v in seen if v is not None) == expected and len(seen) == 2
    assert kafka.broker.open_partitions(topic) == {}
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {table}"))
        conn.execute(sa.text(f"DROP TABLE {state_table}"))
    engine.dispose()


@pytest.mark.guarantee("6.11")
def test_an_exactly_once_processor_survives_or_restarts_after_a_long_outage(
    kafka: _Kafka,
) -> None:
    """The broker pauses mid-run for longer than the transaction timeout and every
    retry of the processor: it either goes on once the broker answers or stops with an
    error; a processor started again with the same ids finishes the input, and the
    output holds every input exactly once (kafka-python, read_committed)."""
    source = kafka.broker.create_topic(partitions=2)
    sink = kafka.broker.create_topic(partitions=2)
    total = 300
    plain = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(total):
        plain.produce(source, str(i).encode(), str(i).encode())
    assert plain.flush(20) == 0
    group = f"g-{uuid.uuid4().hex[:8]}"
    txn_id = f"eos-{uuid.uuid4().hex[:8]}"
    paused = threading.Event()

    def process(record: Any) -> list[OutputRecord]:
        if not paused.is_set() and int(record.value()) == total // 3:
            paused.set()
            threading.Thread(target=kafka.outage, args=(_LONG_OUTAGE_S,), daemon=True).start()
        return [OutputRecord(sink, record.value(), record.key())]

    def processor() -> ExactlyOnceProcessor:
        return ExactlyOnceProcessor(
            {"bootstrap.servers": kafka.bootstrap_servers, "group.id": group},
            {
                "bootstrap.servers": kafka.bootstrap_servers,
                "transactional.id": txn_id,
                "transaction.timeout.ms": _TXN_TIMEOUT_MS,
            },
            [source],
            process,
            batch_size=20,
            commit_attempts=2,
        )

    stops: list[str] = []
    for _ in range(4):
        try:
            processor().run(idle_timeout=_LONG_OUTAGE_S + 5.0)
        except KafkaTxnError as exc:
            stops.append(type(exc).__name__)
            time.sleep(1.0)
            continue
        break
    else:
        pytest.fail(f"the processor never finished: {stops}")
    assert paused.is_set()
    seen = kafka.broker.read_committed(sink, expected=total)
    values = sorted(int(v) for _, v in seen if v is not None)
    assert values == list(range(total)), (len(values), stops)
    assert kafka.broker.open_partitions(sink) == {}
