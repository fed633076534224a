"""The dual-write recipe on PostgreSQL, MariaDB and SQLite: writers killed at every step,
racing writers, an unknown COMMIT outcome, a Kafka commit failing after the database
commit, a committed state marked completed before an epoch bump, start() called again
after the coordinator was unreachable, the owner column added to an older state table,
and bad input. After each, the database rows equal what a read_committed consumer sees:
nothing lost, nothing twice. (Zombie writers and lock holders: test_dualwrite_zombie.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError
from sqlalchemy import Column, DateTime, MetaData, String, Table, create_engine, event, select, text
from sqlalchemy.exc import IntegrityError

from kafka_txn import (
    ConfigurationError,
    DatabaseCommitUnknownError,
    InvalidPreparedStateError,
    PreparedTxnState,
    ProducerFencedError,
    TransactionalProducer,
    TransactionDivergedError,
    TransactionInDoubtError,
    TransactionOutcome,
    TransactionOutcomeUnknowableError,
    TransactionOutcomeUnknownError,
)
from kafka_txn.cli.local_broker import LocalBroker
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.coordinator.client import TransactionDescription
from kafka_txn.dualwrite import state_table as state_table_module
from kafka_txn.dualwrite.engine import validate_identifier
from kafka_txn.dualwrite.exact_ids import exact_string
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import STEPS, DualWriter
from kafka_txn.testing import ApiKey, FaultProxy
from tests.apps.dualwrite_app import events_table
from tests.proxies.pg_proxy import PostgresProxy
from tests.support.adversaries import stand_in_describe
from tests.support.dual_writes import Scenario, diverged
from tests.support.rig import Broker, freeze

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.broker


@pytest.mark.adversary
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.guarantee("3.1", "4.1")
def test_killed_at_every_step_then_recovered(broker, jdbc_url, step):
    s = Scenario(broker, jdbc_url)
    first = s.run("--batch", "0")
    assert first.returncode == 0, first.stdout + first.stderr
    crashed = s.run("--batch", "1", "--crash-at", step)
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    recovered = s.run("--mode", "recover")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    committed = STEPS.index(step) >= STEPS.index("after_db_commit")
    outcome = recovered.stdout.splitlines()[0].removeprefix("outcome=")
    expected_outcome = {
        "after_db_commit": TransactionOutcome.COMMITTED,
        "after_kafka_commit": TransactionOutcome.ALREADY_COMMITTED,
    }.get(step, TransactionOutcome.NOTHING_TO_COMMIT)
    assert outcome == expected_outcome
    s.assert_equal_sides(8 if committed else 4)
    # ... and the application carries on.
    assert s.run("--batch", "2").returncode == 0
    s.assert_equal_sides(12 if committed else 8)


@pytest.mark.adversary
@pytest.mark.guarantee("4.4")
def test_two_writers_with_one_transactional_id(broker, jdbc_url, tmp_path):
    """A second writer starts while the first is provably still at work: the first has
    committed two of its forty batches and waits, between two transactions, until the
    second has started and written its three batches (a file handshake, no timing). Its
    next transaction is then fenced before it writes anything: it stops cleanly, and
    the rows equal what Kafka holds, with nothing of the first writer after the
    takeover."""
    s = Scenario(broker, jdbc_url)
    assert s.run("--batch", "0").returncode == 0  # creates the tables and the state row
    go_on = tmp_path / "second-writer-done"
    first = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "apps" / "dualwrite_app.py"),
         "--jdbc-url", s.jdbc_url, "--bootstrap-servers", broker.bootstrap_servers,
         "--topic", s.topic, "--transactional-id", s.txn_id, "--events-table", s.table,
         "--batch", "100", "--batches", "40", "--hold-after", "101",
         "--hold-until", str(go_on)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert first.stdout is not None
        lines = [first.stdout.readline().strip() for _ in range(4)]
        assert lines[0].startswith("outcome="), lines
        assert lines[1:] == ["committed=100", "committed=101", f"holding={go_on}"], lines
        second = s.run("--batch", "500", "--batches", "3")  # the first is waiting meanwhile
        assert second.returncode == 0, second.stdout + second.stderr
        assert first.poll() is None  # still at work, 38 batches to go
        go_on.touch()
        out, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # The first writer was fenced by the second's start(): it stopped cleanly.
    assert first.returncode == 3, out + err
    assert "fenced=" in out and "committed=" not in out  # not one batch after the takeover
    rows = s.rows()
    assert {r.split(b"-")[0] for r in rows} == {b"b0", b"b100", b"b101", b"b500", b"b501", b"b502"}
    s.assert_equal_sides(len(rows))


@pytest.mark.guarantee("4.2")
def test_exception_in_the_body_rolls_back_both(broker, jdbc_url, txn_id):
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    # send() in the body needs every delivery report: the documented opt-out of the
    # writer's error-only default.
    conf = {
        "bootstrap.servers": broker.bootstrap_servers,
        "transactional.id": txn_id,
        "delivery.report.only.error": False,
    }
    with DualWriter(conf, jdbc_url) as writer:
        events.metadata.create_all(writer.engine, checkfirst=True)
        with pytest.raises(ZeroDivisionError), writer.transaction() as tx:
            tx.connection.execute(events.insert(), [{"batch": 0, "value": "never"}])
            tx.produce(topic, b"never")
            1 / 0  # noqa: B018
        with writer.transaction() as tx:
            tx.connection.execute(events.insert(), [{"batch": 1, "value": "kept"}])
            tx.send(topic, b"kept")
        with writer.engine.connect() as conn:
            assert list(conn.execute(select(events.c.value)).scalars()) == ["kept"]
    assert broker.read_committed(topic, expected=1) == [(None, b"kept")]


def test_start_runs_once_whoever_calls_it_first(broker, tmp_path, txn_id):
    """The first transaction() of a writer not started starts it (recovery, then the
    fence); start() called afterwards returns that start's outcome without a second
    recovery or init: the producer's epoch is the same, and the writer goes on."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    writer = DualWriter(conf, f"jdbc:sqlite:{tmp_path / 'db.sqlite'}")
    try:
        events.metadata.create_all(writer.engine)
        with writer.transaction() as tx:
            tx.connection.execute(events.insert(), [{"batch": 0, "value": "first"}])
            tx.produce(topic, b"first")
        epoch = _describe_ended(broker, txn_id).producer_epoch
        assert writer.start() is TransactionOutcome.NOTHING_TO_COMMIT
        assert writer.start() is TransactionOutcome.NOTHING_TO_COMMIT
        assert _describe(broker, txn_id).producer_epoch == epoch
        with writer.transaction() as tx:
            tx.connection.execute(events.insert(), [{"batch": 1, "value": "second"}])
            tx.produce(topic, b"second")
        with writer.engine.connect() as conn:
            assert sorted(conn.execute(select(events.c.value)).scalars()) == ["first", "second"]
    finally:
        writer.close()
    assert sorted(broker.read_committed(topic, expected=2)) == [(None, b"first"), (None, b"second")]


def _describe(broker: Broker, txn_id: str) -> TransactionDescription:
    settings = ConnectionSettings.from_librdkafka({"bootstrap.servers": broker.bootstrap_servers})
    with CoordinatorClient(settings, txn_id) as client:
        return client.describe()


def _describe_ended(broker: Broker, txn_id: str) -> TransactionDescription:
    """The transaction once its markers are written. The coordinator answers an EndTxn
    once PrepareCommit or PrepareAbort is in its log, and records CompleteCommit or
    CompleteAbort only when the partitions acknowledged the markers it sends afterwards
    (``TransactionCoordinator.endTransaction``, ``TransactionMarkerChannelManager``), so
    a describe right after the call may still show the Prepare state."""
    deadline = time.monotonic() + 30
    seen = _describe(broker, txn_id)
    while seen.state in ("PrepareCommit", "PrepareAbort") and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = _describe(broker, txn_id)
    return seen


@pytest.mark.adversary
@pytest.mark.guarantee("4.3")
def test_lost_connection_during_commit_never_aborts_kafka_blindly(broker, postgres_jdbc, txn_id):
    """The database connection dies at COMMIT (its backend terminated before the COMMIT
    reaches it): the writer refuses to guess and leaves the Kafka transaction prepared,
    as the coordinator shows (Ongoing, holding back the partition's last stable offset);
    the next start() makes Kafka match what the database did (here: nothing, so it is
    aborted: ended, its record in the log but not visible)."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    killer = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    backend: list[int] = []

    def on_step(step: str) -> None:
        if step == "after_state_write":
            with killer.begin() as conn:
                conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": backend[0]})

    writer = DualWriter(conf, postgres_jdbc, on_step=on_step)
    events.metadata.create_all(writer.engine, checkfirst=True)
    writer.start()
    with pytest.raises(DatabaseCommitUnknownError), writer.transaction() as tx:
        backend.append(tx.connection.execute(text("SELECT pg_backend_pid()")).scalar_one())
        tx.connection.execute(events.insert(), [{"batch": 0, "value": "lost"}])
        tx.produce(topic, b"lost")
    seen = _describe(broker, txn_id)
    assert seen.state == "Ongoing", seen  # not aborted, not committed: prepared
    assert seen.partitions.get(topic) and broker.open_partitions(topic)
    with pytest.raises(DatabaseCommitUnknownError), writer.transaction():
        pass  # the writer stays stopped
    writer.close()
    killer.dispose()
    assert _describe(broker, txn_id).state == "Ongoing"  # close() left it prepared too

    with DualWriter(conf, postgres_jdbc) as restarted, restarted.engine.connect() as conn:
        assert list(conn.execute(select(events.c.value)).scalars()) == []
    assert broker.open_partitions(topic) == {}  # ended ...
    assert (None, b"lost") in broker.read_uncommitted(topic, expected=1)  # ... written ...
    assert broker.read_committed(topic, expected=0) == []  # ... and not visible: aborted


@pytest.mark.adversary
@pytest.mark.guarantee("4.3")
def test_commit_whose_reply_is_lost_is_committed_by_the_next_start(broker, postgres_jdbc, txn_id):
    """PostgreSQL commits, and the connection drops before its answer reaches the writer
    (a proxy closes it right after the CommandComplete "COMMIT"). The writer cannot tell
    this from a COMMIT that never arrived: DatabaseCommitUnknownError, and the Kafka
    transaction stays prepared (the coordinator shows it Ongoing under the stored
    producer id, epoch and start time), never aborted. The next start() reads the
    committed state row and commits Kafka: the rows equal the records, each once."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    with PostgresProxy(("127.0.0.1", 5432)) as proxy:
        proxied = f"jdbc:postgresql://127.0.0.1:{proxy.port}/test?user=postgres"

        def on_step(step: str) -> None:
            if step == "after_state_write":
                proxy.lose_next_commit_reply()

        writer = DualWriter(conf, proxied, on_step=on_step, mark_completed_after=None)
        events.metadata.create_all(writer.engine, checkfirst=True)
        writer.start()
        with pytest.raises(DatabaseCommitUnknownError), writer.transaction() as tx:
            tx.connection.execute(events.insert(), [{"batch": 0, "value": "kept"}])
            tx.produce(topic, b"kept")
        assert proxy.commits_lost == 1
        writer.close()
    stored = PreparedTxnState(_state_row(postgres_jdbc, txn_id))  # the database committed
    assert not stored.is_empty and not stored.completed
    seen = _describe(broker, txn_id)
    assert seen.state == "Ongoing", seen
    assert (seen.producer_id, seen.producer_epoch, seen.start_time_ms) == (
        stored.producer_id, stored.producer_epoch, stored.txn_start_ms,
    )  # fmt: skip
    assert broker.read_committed(topic, expected=0) == []  # prepared: not visible yet
    restarted = DualWriter(conf, postgres_jdbc)
    try:
        assert restarted.start() is TransactionOutcome.COMMITTED
        assert _rows(restarted.engine, events) == ["kept"]
    finally:
        restarted.close()
    assert broker.read_committed(topic, expected=1) == [(None, b"kept")]


@pytest.mark.guarantee("4.2")
def test_database_refusing_commit_aborts_kafka(broker, postgres_jdbc, txn_id):
    """PostgreSQL refuses the COMMIT itself (a unique constraint checked at COMMIT,
    DEFERRABLE INITIALLY DEFERRED): nothing committed in the database, so the writer
    aborts the Kafka transaction. The coordinator shows it CompleteAbort under the same
    producer id; its record is in the log, and a read_committed consumer never sees it.
    The writer goes on."""
    topic = broker.create_topic()
    name = f"events_{uuid.uuid4().hex[:10]}"
    events = events_table(name)
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    writer = DualWriter(conf, postgres_jdbc)
    try:
        with writer.engine.begin() as conn:
            conn.execute(
                text(f"CREATE TABLE {name} (batch INTEGER, value VARCHAR(64), "
                     f"CONSTRAINT {name}_once UNIQUE (value) DEFERRABLE INITIALLY DEFERRED)")
            )  # fmt: skip
        writer.start()
        _write(writer, events, topic, "first")
        committed = _describe(broker, txn_id)
        with pytest.raises(IntegrityError, match=f"{name}_once"), writer.transaction() as tx:
            tx.connection.execute(events.insert(), [{"batch": 1, "value": "twice"}] * 2)
            tx.produce(topic, b"twice")  # the statement passed: the check waits for COMMIT
        aborted = _describe_ended(broker, txn_id)
        assert aborted.state == "CompleteAbort", aborted
        assert aborted.producer_id == committed.producer_id
        assert broker.open_partitions(topic) == {}
        assert (None, b"twice") in broker.read_uncommitted(topic, expected=2)
        assert _rows(writer.engine, events) == ["first"]
        _write(writer, events, topic, "next")  # the writer goes on
    finally:
        writer.close()
    assert sorted(v for _, v in broker.read_committed(topic, expected=2)) == [b"first", b"next"]


# ---------------------------------------------------------------- helpers
def _state_row(jdbc_url: str, txn_id: str, table: str = "kafka_transaction_state") -> str:
    """The stored state of ``txn_id``, read with a connection of its own."""
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        with engine.connect() as conn:
            return str(
                conn.execute(
                    text(f"SELECT prepared_txn_state FROM {table} WHERE transactional_id = :t"),
                    {"t": txn_id},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def _write(writer: DualWriter, events: Table, topic: str, value: str) -> None:
    with writer.transaction() as tx:
        tx.connection.execute(events.insert(), [{"batch": 0, "value": value}])
        tx.produce(topic, value.encode())


def _rows(engine: Any, events: Table) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(events.c.value)).scalars())


def _bump_epoch(conf: dict[str, Any]) -> None:
    """What any later epoch bump does to the stored state's producer epoch (a KIP-360
    abort, a coordinator timeout of a later transaction, another init)."""
    bumper = TransactionalProducer(conf)
    bumper.init_transactions()
    bumper.close()


# ---------------------------------------------------------------- scenario 3: in doubt
@pytest.mark.adversary
@pytest.mark.mock
@pytest.mark.parametrize(
    "codes",
    [
        [KafkaError.INVALID_PRODUCER_ID_MAPPING],  # abortable in librdkafka
        [KafkaError.UNKNOWN],  # UNKNOWN_SERVER_ERROR: abortable in librdkafka
        [KafkaError.PRODUCER_FENCED],  # fatal
        [KafkaError.COORDINATOR_NOT_AVAILABLE] * 500,  # retried until the deadline
    ],
    ids=lambda codes: KafkaError(codes[0]).name(),
)
@pytest.mark.guarantee("4.6")
def test_kafka_commit_failing_after_the_database_commit_is_never_aborted(
    mock_cluster, mock_config, tmp_path, codes
):
    """The database committed; Kafka's EndTxn then fails. The writer stops with a
    TransactionInDoubtError that says what is true, refuses every later call, and neither
    it nor its close() (here through `with DualWriter`, exiting with that error) aborts
    the transaction: the producer is released with the transaction left open."""
    mock_cluster.create_topic("t", partitions=1)
    database = f"jdbc:sqlite:{tmp_path / 'db.sqlite'}"
    events = events_table("events")
    aborts: list[str] = []
    released: list[bool] = []
    writer = DualWriter(mock_config(), database, operation_timeout=2.0)
    events.create(writer.engine)
    producer = writer.producer
    abort, release = producer.abort_transaction, producer._io.release

    def recording_abort(timeout: float | None = None) -> None:
        aborts.append(producer.state)
        abort(timeout)

    def recording_release(*, close_handle: bool) -> None:
        released.append(close_handle)
        release(close_handle=close_handle)

    producer.abort_transaction = recording_abort  # type: ignore[method-assign]
    producer._io.release = recording_release  # type: ignore[method-assign]
    with pytest.raises(TransactionInDoubtError) as caught, writer:
        stand_in_describe(producer)
        mock_cluster.push_request_errors(ApiKey.END_TXN, *codes)
        _write(writer, events, "t", "decided")
    message = str(caught.value)
    assert "committed in the database" in message and "left prepared" in message
    assert "never aborted" in message and "next start()" in message
    assert caught.value.prepared_state == _state_row(database, producer.transactional_id)
    with pytest.raises(TransactionInDoubtError):
        writer.start()
    with pytest.raises(TransactionInDoubtError), writer.transaction():
        pass
    assert aborts == []
    assert released == [False]  # closed, handle not closed: transaction left open
    engine = create_engine(jdbc_to_sqlalchemy(database))
    try:
        assert _rows(engine, events) == ["decided"]
    finally:
        engine.dispose()


@pytest.mark.adversary
@pytest.mark.guarantee("4.6")
def test_kafka_commit_failing_after_the_database_commit_is_recovered(jdbc_url):
    """The same on a real broker (a private one: the test freezes it with SIGSTOP right
    after the database commit, so the Kafka commit times out). The writer leaves the
    transaction to recovery; the next start() commits it, and the database rows equal
    what an independent read_committed consumer sees, exactly once."""
    with LocalBroker() as local:
        rig = Broker(local.bootstrap_servers, local.description)
        topic = rig.create_topic()
        events = events_table(f"events_{uuid.uuid4().hex[:10]}")
        txn_id = f"dw-in-doubt-{uuid.uuid4().hex[:8]}"
        conf = {
            "bootstrap.servers": local.bootstrap_servers,
            "transactional.id": txn_id,
            "socket.timeout.ms": 10_000,
        }

        def freeze_broker(step: str) -> None:
            if step == "after_db_commit":
                freeze(local._proc.pid)

        writer = DualWriter(conf, jdbc_url, on_step=freeze_broker, operation_timeout=1.5)
        events.create(writer.engine, checkfirst=True)
        writer.start()
        try:
            with pytest.raises(TransactionInDoubtError) as caught:
                _write(writer, events, topic, "decided")
            writer.close()
        finally:
            os.kill(local._proc.pid, signal.SIGCONT)
        stored = PreparedTxnState(caught.value.prepared_state)
        with CoordinatorClient(ConnectionSettings.from_librdkafka(conf), txn_id) as client:
            seen = client.describe()
        assert seen.state in ("Ongoing", "PrepareCommit", "CompleteCommit"), seen  # not aborted
        assert seen.start_time_ms == stored.txn_start_ms
        successor = DualWriter(conf, jdbc_url)
        try:
            outcome = successor.start()
            assert outcome in (TransactionOutcome.COMMITTED, TransactionOutcome.ALREADY_COMMITTED)
            assert _rows(successor.engine, events) == ["decided"]
        finally:
            successor.close()
        assert rig.read_committed(topic, expected=1) == [(None, b"decided")]


# ---------------------------------------------------------------- scenario 4: completed
@pytest.mark.adversary
@pytest.mark.guarantee("4.7")
def test_committed_state_is_marked_completed_before_an_abort(broker, jdbc_url, txn_id):
    """An abort may bump the epoch (KIP-360), after which recovery could no longer tell
    that the last committed transaction was settled: its state is stored completed first.
    Until then, the happy path stores nothing extra (the mark is deferred)."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    writer = DualWriter(conf, jdbc_url, mark_completed_after=None)
    try:
        events.create(writer.engine, checkfirst=True)
        _write(writer, events, topic, "kept")
        committed = PreparedTxnState(_state_row(jdbc_url, txn_id))
        assert not committed.is_empty and not committed.completed
        at_abort: list[str] = []
        abort = writer.producer.abort_transaction

        def recording_abort(timeout: float | None = None) -> None:
            at_abort.append(_state_row(jdbc_url, txn_id))
            abort(timeout)

        writer.producer.abort_transaction = recording_abort  # type: ignore[method-assign]
        with pytest.raises(ZeroDivisionError), writer.transaction() as tx:
            tx.produce(topic, b"never")
            1 / 0  # noqa: B018
        assert at_abort == [str(committed.mark_completed())]
        assert _rows(writer.engine, events) == ["kept"]
    finally:
        writer.close()
    assert broker.read_committed(topic, expected=1) == [(None, b"kept")]


@pytest.mark.adversary
@pytest.mark.guarantee("4.7")
def test_close_marks_the_last_commit_completed_so_an_epoch_bump_is_harmless(
    broker, jdbc_url, txn_id
):
    """close() stores the last commit's state completed before the producer closes. A
    later epoch bump then cannot make the next start() report a divergence (whose advice,
    re-sending from the database, would duplicate the records)."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    writer = DualWriter(conf, jdbc_url, mark_completed_after=None)
    events.create(writer.engine, checkfirst=True)
    _write(writer, events, topic, "once")
    committed = PreparedTxnState(_state_row(jdbc_url, txn_id))
    at_close: list[tuple[str, bool]] = []
    close = writer.producer._close

    def recording_close(timeout: float = 10.0, *, abort_open: bool = True) -> None:
        at_close.append((_state_row(jdbc_url, txn_id), abort_open))
        close(timeout, abort_open=abort_open)

    writer.producer._close = recording_close  # type: ignore[method-assign]
    writer.close()
    assert at_close == [(str(committed.mark_completed()), True)]
    _bump_epoch(conf)
    successor = DualWriter(conf, jdbc_url)
    try:
        assert successor.start() is TransactionOutcome.NOTHING_TO_COMMIT
    finally:
        successor.close()
    assert broker.read_committed(topic, expected=1) == [(None, b"once")]


@pytest.mark.guarantee("4.7")
def test_commit_is_marked_completed_soon_after_without_another_transaction(
    broker, jdbc_url, txn_id
):
    """A writer that commits and then sits idle (the Spark sink's per-partition ids, for
    days) has its last state stored completed mark_completed_after seconds later, in the
    background: an epoch bump or the id's expiry after that is harmless, even if the
    process then dies without close()."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    writer = DualWriter(conf, jdbc_url, mark_completed_after=0.2)
    try:
        events.create(writer.engine, checkfirst=True)
        _write(writer, events, topic, "idle")
        deadline = time.monotonic() + 30
        while not PreparedTxnState(_state_row(jdbc_url, txn_id)).completed:
            assert time.monotonic() < deadline, "the commit was never marked completed"
            time.sleep(0.05)
        _bump_epoch(conf)  # while the writer is still open: no close() involved
        successor = DualWriter(conf, jdbc_url)
        try:
            assert successor.start() is TransactionOutcome.NOTHING_TO_COMMIT
        finally:
            successor.close()
    finally:
        writer.close()
    assert broker.read_committed(topic, expected=1) == [(None, b"idle")]


@pytest.mark.adversary
@pytest.mark.guarantee("4.7")
def test_marking_completed_never_overwrites_a_newer_state(broker, jdbc_url, txn_id):
    """The deferred mark is a compare-and-set on the committed state: if the row holds
    anything else by then (a newer writer's state), it is left alone."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    writer = DualWriter(conf, jdbc_url, mark_completed_after=None)
    events.create(writer.engine, checkfirst=True)
    _write(writer, events, topic, "x")
    newer = "kafka-txn:1;pid=999;epoch=9;start=1"
    with writer.engine.begin() as conn:
        conn.execute(
            text("UPDATE kafka_transaction_state SET prepared_txn_state = :s "
                 "WHERE transactional_id = :t"),
            {"s": newer, "t": txn_id},
        )  # fmt: skip
    writer.close()  # would store the mark now
    assert _state_row(jdbc_url, txn_id) == newer


@pytest.mark.guarantee("4.7")
def test_the_happy_path_adds_no_statement_for_the_mark(broker, jdbc_url, txn_id):
    """The next transaction's state write replaces the committed state, so it carries the
    mark: a transaction with a mark pending runs the same state-row statements as one
    without, and none of them is the mark's compare-and-set (which SQLAlchemy's events
    see: it runs through SQLAlchemy, also on PostgreSQL, where the lock and the state
    write go to the driver)."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    statements: list[str] = []
    with DualWriter(conf, jdbc_url, mark_completed_after=None) as writer:
        events.create(writer.engine, checkfirst=True)

        @event.listens_for(writer.engine, "before_cursor_execute")
        def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "kafka_transaction_state" in statement:
                statements.append(statement)

        _write(writer, events, topic, "first")  # nothing pending before it
        first = list(statements)
        statements.clear()
        _write(writer, events, topic, "second")  # "first" pending before it
        assert statements == first
        assert PreparedTxnState(_state_row(jdbc_url, txn_id)).txn_start_ms is not None
        statements.clear()
        assert writer.store_completed()  # "second"'s mark, written now: the events see it
        assert len(statements) == 1 and "UPDATE" in statements[0]


# ---------------------------------------------------------------- scenario 6: start again
@pytest.mark.adversary
@pytest.mark.mock
@pytest.mark.guarantee("4.8")
def test_start_can_be_called_again_after_init_could_not_reach_the_coordinator(
    mock_cluster, mock_config, txn_id, tmp_path
):
    """The transaction coordinator is down: start() raises
    TransactionOutcomeUnknownError ("call it again"); called again once the coordinator
    is back, it succeeds."""
    mock_cluster.set_coordinator("transaction", txn_id, 1)
    mock_cluster.set_broker_down(1)
    writer = DualWriter(
        mock_config(), f"jdbc:sqlite:{tmp_path / 'db.sqlite'}", operation_timeout=2.0
    )
    try:
        with pytest.raises(TransactionOutcomeUnknownError, match="again"):
            writer.start()
        mock_cluster.set_broker_down(1, down=False)
        assert writer.start() is TransactionOutcome.NOTHING_TO_COMMIT
        assert writer.producer.state == "ready"
    finally:
        writer.close()


class _CrashError(BaseException):
    """Stands for the process dying at a step (the transaction stays as it is): not an
    Exception, so the writer re-raises it as it is."""


def _heal(proxy: FaultProxy) -> None:
    """Drop the errors still queued in ``proxy`` (FaultProxy has no public call for it)."""
    with proxy._lock:
        proxy._faults.clear()


@pytest.mark.adversary
@pytest.mark.guarantee("4.8")
def test_start_can_be_called_again_after_recovery_could_not_reach_the_coordinator(
    broker, jdbc_url, txn_id
):
    """A prepared transaction the database committed waits for recovery, and the
    coordinator does not answer DescribeTransactions (FaultProxy): start() raises
    TransactionOutcomeUnknownError; called again once it answers, it commits the
    transaction, exactly once."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    direct = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}

    def crash_after_db_commit(step: str) -> None:
        if step == "after_db_commit":
            raise _CrashError

    crashed = DualWriter(direct, jdbc_url, on_step=crash_after_db_commit)
    events.create(crashed.engine, checkfirst=True)
    crashed.start()
    with pytest.raises(_CrashError):
        _write(crashed, events, topic, "pending")
    crashed.close()  # the prepared transaction stays open
    with FaultProxy(broker.bootstrap_servers) as proxy:
        conf = {**direct, "bootstrap.servers": proxy.bootstrap_servers}
        writer = DualWriter(conf, jdbc_url, operation_timeout=1.0)
        try:
            codes = [KafkaError.COORDINATOR_NOT_AVAILABLE] * 1000
            proxy.push_errors(ApiKey.DESCRIBE_TRANSACTIONS, *codes)
            with pytest.raises(TransactionOutcomeUnknownError, match="again"):
                writer.start()
            _heal(proxy)
            assert writer.start() is TransactionOutcome.COMMITTED
            assert _rows(writer.engine, events) == ["pending"]
        finally:
            writer.close()
    assert broker.read_committed(topic, expected=1) == [(None, b"pending")]


# ---------------------------------------------------------------- the owner column
def _old_state_table(jdbc_url: str, name: str) -> None:
    """A state table as kafka-txn created it before the owner column existed (its id
    column case-sensitive on MariaDB, as the ALTER TABLE start() asks for makes it)."""
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        Table(
            name,
            MetaData(),
            Column("transactional_id", exact_string(255), primary_key=True),
            Column("prepared_txn_state", String(4096), nullable=False),
            Column("updated_at", DateTime),
        ).create(engine)
    finally:
        engine.dispose()


@pytest.mark.adversary
@pytest.mark.guarantee("4.10")
def test_state_table_without_owner_column_is_upgraded_by_racing_writers(
    broker, jdbc_url, txn_id, monkeypatch
):
    """Writers starting at once on a state table without the owner column each add it,
    and the loser of that race carries on; with create_state_table=False the writer
    refuses to run unfenced and names the statement to run."""
    name = f"state_{uuid.uuid4().hex[:10]}"
    _old_state_table(jdbc_url, name)
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    with pytest.raises(ConfigurationError, match="ALTER TABLE"):
        DualWriter(conf, jdbc_url, state_table=name, create_state_table=False).start()
    # The loser's path, made certain: it saw no owner column, but the winner has just
    # added it, so its ALTER TABLE fails with a duplicate column.
    real_inspect = state_table_module.inspect

    class Stale:
        def __init__(self, engine: Any) -> None:
            self._real = real_inspect(engine)

        def get_columns(self, table: str) -> list[dict[str, Any]]:
            return [c for c in self._real.get_columns(table) if c["name"] != "owner"]

    winner = DualWriter(conf, jdbc_url, state_table=name)
    loser = DualWriter(conf, jdbc_url, state_table=name)
    try:
        winner.start()
        monkeypatch.setattr(state_table_module, "inspect", Stale)
        assert loser.start() is TransactionOutcome.NOTHING_TO_COMMIT
    finally:
        winner.close()
        loser.close()
    monkeypatch.undo()
    # And a real race, on a fresh old-style table.
    name = f"state_{uuid.uuid4().hex[:10]}"
    _old_state_table(jdbc_url, name)
    racers = [DualWriter(conf, jdbc_url, state_table=name) for _ in range(2)]
    barrier = threading.Barrier(len(racers))
    errors: list[BaseException | None] = [None] * len(racers)

    def race(i: int) -> None:
        barrier.wait()
        try:
            racers[i].start()
        except BaseException as exc:
            errors[i] = exc

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(racers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        # Each start() succeeds; one of them may find itself replaced by the other's.
        assert all(e is None or isinstance(e, ProducerFencedError) for e in errors), errors
        assert any(e is None for e in errors), errors
        with racers[0].engine.connect() as conn:
            owner = conn.execute(text(f"SELECT owner FROM {name}")).scalar_one()
        assert owner in {r.owner for r in racers}
    finally:
        for r in racers:
            r.close()


@pytest.mark.parametrize(
    "name", ["state; DROP TABLE x", 'a"b', "1abc", "", "x" * 64, "naïve", "a-b", "a b"]
)
def test_sql_identifiers_are_validated(name, broker, tmp_path):
    with pytest.raises(ConfigurationError, match="not a plain SQL identifier"):
        validate_identifier(name, "state_table")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "t"}
    with pytest.raises(ConfigurationError, match="state_table"):
        DualWriter(conf, f"jdbc:sqlite:{tmp_path}/x.db", state_table=name)


def test_unsupported_database_and_missing_driver_are_clear(broker):
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "t"}
    with pytest.raises(ConfigurationError, match="neither a JDBC URL nor a SQLAlchemy URL"):
        DualWriter(conf, "::::")
    with pytest.raises(ConfigurationError, match="no dialect/driver"):
        DualWriter(conf, "postgresql+nosuchdriver://h/db")


# ---------------------------------------------------------------- resolving a divergence


# noida-db times no transaction out, so there diverged() makes the divergence with the
# producer's own abort under the stored epoch: docs/guarantees.md, "not guaranteed".
_CALLER_MADE_DIVERGENCE = pytest.mark.xfail(
    strict=True,
    reason="not guaranteed (docs/guarantees.md: a divergence the caller made by aborting "
    "a prepared transaction itself): after a writer's start() moved the epoch on by one "
    "and its re-send aborted under it, Kafka shows what a committed transaction followed "
    "by a timed-out one shows (row 11), and the next start() reports it committed",
)


@pytest.mark.adversary
@pytest.mark.guarantee("4.12")
def test_a_divergence_is_resolved_by_hand_then_the_writer_goes_on(broker, jdbc_url, txn_id):
    """The database committed a transaction that Kafka aborted (as when the coordinator
    times it out). start() reports the divergence and keeps reporting it; after
    resolve(), start() goes on and the first transaction re-sends the rows, its commit
    replacing the stored state; the database rows equal what a read_committed consumer
    sees, each once. resolve() with any other state than the one start() reported is
    refused and changes nothing."""
    topic, events, conf, state = diverged(broker, jdbc_url, txn_id)
    successor = DualWriter(conf, jdbc_url)
    try:
        for _ in range(2):  # it stays diverged until resolved
            with pytest.raises(TransactionDivergedError) as caught:
                successor.start()
        assert caught.value.stored_state == str(state)
        other = PreparedTxnState(
            transactional_id=txn_id, producer_id=1, producer_epoch=0, txn_start_ms=1
        )
        with pytest.raises(InvalidPreparedStateError, match="is not it"):
            successor.resolve(other)  # only the state start() reported can be resolved
        assert _state_row(jdbc_url, txn_id) == str(state)  # nothing changed
        successor.resolve(caught.value.stored_state)
        successor.resolve(caught.value.stored_state)  # harmless
        assert _state_row(jdbc_url, txn_id) == str(state)  # until the re-send commits
        assert successor.start() is TransactionOutcome.NOTHING_TO_COMMIT
        assert _state_row(jdbc_url, txn_id) == str(state)
        with successor.transaction() as tx:  # re-send what Kafka does not hold
            tx.produce(topic, b"lost")
        assert _state_row(jdbc_url, txn_id) != str(state)
        _write(successor, events, topic, "next")
    finally:
        successor.close()
    assert sorted(v for _, v in broker.read_committed(topic, expected=2)) == [b"lost", b"next"]
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        assert _rows(engine, events) == ["lost", "next"]
    finally:
        engine.dispose()


@pytest.mark.adversary
@pytest.mark.guarantee("4.12")
def test_a_writer_stopped_between_resolve_and_the_resend_leaves_the_divergence_reported(
    broker, jdbc_url, txn_id, request
):
    """4.12 with the process gone after resolve() and start() but before the transaction
    that re-sends the records committed (its body failed, then the writer closed): the
    state row still holds the diverged state, so the next writer's start() reports the
    divergence again, and resolving it then and re-sending once leaves the database rows
    equal to what a read_committed consumer sees."""
    if broker.kind == "noida":
        request.applymarker(_CALLER_MADE_DIVERGENCE)
    topic, events, conf, state = diverged(broker, jdbc_url, txn_id)
    first = DualWriter(conf, jdbc_url)
    try:
        with pytest.raises(TransactionDivergedError) as caught:
            first.start()
        first.resolve(caught.value.stored_state)
        first.start()
        with pytest.raises(RuntimeError), first.transaction() as tx:
            tx.produce(topic, b"lost")
            raise RuntimeError("the re-send fails before its commit")
    finally:
        first.close()
    assert _state_row(jdbc_url, txn_id) == str(state)
    successor = DualWriter(conf, jdbc_url)
    try:
        # Reported again: unknowable now, since the first writer's init moved the epoch
        # on past the stored transaction (which recovery cannot tell from a commit).
        reported = (TransactionDivergedError, TransactionOutcomeUnknowableError)
        with pytest.raises(reported) as again:
            successor.start()
        assert again.value.stored_state == str(state)
        successor.resolve(again.value.stored_state)
        successor.start()
        with successor.transaction() as tx:
            tx.produce(topic, b"lost")
    finally:
        successor.close()
    assert [v for _, v in broker.read_committed(topic, expected=1)] == [b"lost"]
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        assert _rows(engine, events) == ["lost"]
    finally:
        engine.dispose()


@pytest.mark.parametrize("database", ["postgres_jdbc", "mariadb_jdbc"])
@pytest.mark.guarantee("4.10")
def test_a_state_column_too_short_for_the_states_is_refused_at_start(
    broker, request, database, txn_id
):
    """4.10 on a state table made by hand: a state column shorter than this writer's
    longest state (MySQL/MariaDB outside strict mode would cut states short, and a cut
    state can make recovery abort what the database committed) is refused by start()
    with ConfigurationError naming the fix, before anything is written."""
    jdbc = request.getfixturevalue(database)
    table = f"narrow_state_{uuid.uuid4().hex[:8]}"
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    f"CREATE TABLE {table} (transactional_id VARCHAR(255) PRIMARY KEY, "
                    "prepared_txn_state VARCHAR(60) NOT NULL, updated_at TIMESTAMP NULL, "
                    "owner VARCHAR(255) NULL)"
                )
            )
        conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
        writer = DualWriter(conf, jdbc, state_table=table, create_state_table=False)
        try:
            with pytest.raises(ConfigurationError, match=r"holds at most 60 characters"):
                writer.start()
        finally:
            writer.close()
        with engine.connect() as conn:
            assert conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one() == 0
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()


@pytest.mark.adversary
@pytest.mark.guarantee("4.12")
def test_resolve_refuses_once_a_newer_writer_moved_the_row_on(broker, jdbc_url, txn_id):
    """Two writers both see the divergence; one resolves it and writes its next
    transaction. The other's resolve() of the old state is refused (the row holds the
    newer transaction's state) and changes nothing."""
    topic, events, conf, state = diverged(broker, jdbc_url, txn_id)
    slow, fast = DualWriter(conf, jdbc_url), DualWriter(conf, jdbc_url)
    try:
        with pytest.raises(TransactionDivergedError):
            slow.start()
        with pytest.raises(TransactionDivergedError) as caught:
            fast.start()
        fast.resolve(caught.value.stored_state)
        fast.start()
        _write(fast, events, topic, "next")
        moved_on = _state_row(jdbc_url, txn_id)
        with pytest.raises(InvalidPreparedStateError, match="holds"):
            slow.resolve(str(state))
        assert _state_row(jdbc_url, txn_id) == moved_on
    finally:
        slow.close()
        fast.close()
