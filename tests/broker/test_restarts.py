"""Broker restarts on Apache Kafka: the broker (a one-node KRaft broker+controller this
module starts, ``tests/support/apache_kafka.py``, with a data directory of its own) is SIGKILLed
or SIGTERMed, then started again on the same data directory and port, while kafka-txn is
at work:

- ``DualWriter`` on PostgreSQL (SIGKILL at every step ``on_step`` names) and MariaDB (a
  sample of steps), and SIGTERM at a sample of steps;
- the two-phase API (``prepare_transaction()``, the state stored with the rows,
  ``complete_transaction()``), the broker taken down between two of those calls, with
  recovery in a fresh process (``tests/apps/crash_app.py --mode recover``:
  ``init_transactions(keep_prepared_txn=True)`` and ``complete_transaction(stored)``);
- ``ExactlyOnceProcessor`` over a known input, the broker taken down at seeded random
  moments while it works.

After each, the broker is up again and the application resumes as a user's would (a new
writer's ``start()``, a fresh recovery process, the processor started again); then the
invariant is checked with clients independent of kafka-txn: direct SQL for the database,
kafka-python for Kafka (a ``read_committed`` consumer that reads every partition to its
last stable offset, the last stable offset equal to the high watermark, and
ListTransactions showing none of the test's transactional ids ongoing). The database
equals Kafka, every record once, nothing left open.

Why a restart keeps what it must (the mirror's apache/kafka source): an append is
acknowledged once it is in the log (``acks=all``); a SIGKILL of the process leaves the
written log in the page cache, and the restarted broker recovers its segments and
rebuilds each partition's producer state and open transactions from them
(``UnifiedLog.rebuildProducerState``). The transaction coordinator reloads its
partitions of ``__transaction_state`` (``TransactionCoordinator.onElection``,
``TransactionStateManager.loadTransactionsForTxnTopicPartition``): a transaction
recorded Ongoing is Ongoing again with the same producer id, epoch and start time, and
one recorded PrepareCommit or PrepareAbort has its markers sent again. The group
coordinator reloads the committed offsets the same way.

The broker's ``broker.session.timeout.ms`` is 2 s (default 9 s): a broker restarted
after a SIGKILL registers with a new incarnation id, which its controller refuses while
the dead incarnation's session is still valid
(``ClusterControlManager.registerBroker``: ``DuplicateBrokerRegistrationException``
while ``BrokerHeartbeatManager.hasValidSession``), so the restart would wait out the
whole default session. The clients' ``reconnect.backoff.max.ms`` is 1 s (default 10 s)
for the same reason: time. Nothing else differs from the rig's broker.

Every random moment comes from a ``random.Random`` seeded with the test's id, so a
failure reproduces with the same schedule; the seed is in every assertion message.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tenacity
from confluent_kafka import KafkaException, Message
from sqlalchemy import Table, insert, select
from sqlalchemy.engine import Engine

from kafka_txn import (
    FatalError,
    KafkaTxnError,
    PreparedTxnState,
    TransactionalProducer,
    TransactionInDoubtError,
    TransactionOutcome,
    TransactionOutcomeUnknownError,
)
from kafka_txn.dualwrite.writer import STEPS, DualWriter
from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord
from tests.apps.crash_app import _db as crash_app_db
from tests.apps.crash_app import store_state, stored_state
from tests.apps.dualwrite_app import events_table
from tests.support.apache_kafka import START_TIMEOUT_S, ApacheKafka, require_java_and_maven
from tests.support.databases import drop_tables
from tests.support.eos_topics import committed_offsets, positions_after_last_record, seed_topic
from tests.support.rig import OwnKafka

ROOT = Path(__file__).resolve().parent.parent.parent

# Apache Kafka only, with a broker of its own restarted a few dozen times: `make test`
# runs it, the conformance matrix's other brokers do not (-m "conformance and not slow").
pytestmark = [pytest.mark.slow, pytest.mark.adversary]

# How the broker is taken down: a crash, or an operator's controlled shutdown.
KILL, TERMINATE = "SIGKILL", "SIGTERM"

_BROKER_PROPERTIES = {"broker.session.timeout.ms": "2000", "broker.heartbeat.interval.ms": "500"}
_CLIENT = {"reconnect.backoff.max.ms": 1000}
# A writer's calls give up this soon when the broker stays down (default: the 60 s of
# transaction.timeout.ms): the failure, and then the recovery, are what is tested.
_OPERATION_TIMEOUT_S = 3.0
_RECORDS = 4


class _Kafka(OwnKafka):
    """The module's broker, taken down by its PID and started again in the background."""

    def __init__(self, server: ApacheKafka) -> None:
        super().__init__(server)
        self._starting: threading.Thread | None = None
        self._start_failed: BaseException | None = None
        self._lock = threading.Lock()
        # Held by whoever takes the broker down or brings it up, so that two outages
        # close together (two threads of _Outages) never start it twice at once: a
        # second start of the same data directory fails, and a failed start deletes the
        # directory (ApacheKafka.start calls stop()).
        self._up_down = threading.RLock()

    def down(self, how: str) -> None:
        """Take the broker (the only one: every coordinator and leader) down, by its PID;
        its data directory stays for the next start."""
        with self._up_down:
            self.wait_up()
            if how == KILL:
                self.server.kill()
            else:
                self.server.terminate()

    def up_in_background(self, after: float = 0.0) -> None:
        """Start the broker again on the same port and data ``after`` seconds from now,
        while the caller goes on (a start takes a few seconds)."""

        def start() -> None:
            time.sleep(after)
            try:
                self.server.start()
            except BaseException as exc:  # reported by wait_up()
                self._start_failed = exc

        with self._lock:
            assert self._starting is None, "the broker is already being started"
            self._starting = threading.Thread(target=start, name="restart-broker", daemon=True)
            self._starting.start()

    def bounce_in_background(self, how: str, after: float) -> None:
        """Down now, up again ``after`` seconds later (in the background)."""
        with self._up_down:
            self.down(how)
            self.up_in_background(after)

    def wait_up(self) -> None:
        """Return once the broker is up (started again if it is down and no start is
        under way): it answers Metadata and its transaction log and offsets topic are
        loaded (``ApacheKafka.start``)."""
        with self._up_down:
            with self._lock:
                starting = self._starting
            if starting is not None:
                starting.join(START_TIMEOUT_S + 30)
                assert not starting.is_alive(), "the broker did not start again"
                with self._lock:
                    self._starting = None
            failed, self._start_failed = self._start_failed, None
            if failed is not None:
                raise failed
            if self.server.pid is None:
                self.server.start()
        self._wait_unfenced()

    def _wait_unfenced(self) -> None:
        """Wait until the running incarnation of the broker is registered and unfenced.
        A broker restarted after a SIGKILL answers clients (``ApacheKafka.start`` returns)
        while its controller still refuses its registration; when the dead
        incarnation's session expires the controller fences it, and its partitions have
        no leader until it registers again. The application resumes after that."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            text = self.server.log.read_text(errors="replace") if self.server.log.exists() else ""
            started = text.rfind("is now STARTING")
            if started >= 0 and text.find("The broker has been unfenced", started) >= 0:
                return
            assert time.monotonic() < deadline, f"the broker was never unfenced:\n{text[-3000:]}"
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the broker by its PID (after any start under way) and delete its folder."""
        with self._lock:
            starting = self._starting
        if starting is not None:
            starting.join(START_TIMEOUT_S + 30)
        self.server.stop()


@pytest.fixture(scope="module")
def kafka() -> Iterator[_Kafka]:
    require_java_and_maven()
    server = ApacheKafka(properties=_BROKER_PROPERTIES).start()
    restarted = _Kafka(server)
    try:
        yield restarted
    finally:
        restarted.stop()


@pytest.fixture(autouse=True)
def _broker_up(kafka: _Kafka) -> None:
    """Every test starts with the broker up, whatever the one before left."""
    kafka.wait_up()


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    """This test's random moments: seeded with its id, so a failure reproduces."""
    return random.Random(zlib.crc32(request.node.nodeid.encode()))


# ---------------------------------------------------------------- independent checks
_OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def _open_transactions(kafka: _Kafka, txn_ids: set[str]) -> dict[str, str]:
    """The transactional ids of ``txn_ids`` whose transaction the coordinator lists as
    not ended (ListTransactions, kafka-python's admin client): {id: state}."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        listed = admin.list_transactions(state_filters=list(_OPEN_STATES))
    finally:
        admin.close()
    return {
        t.transactional_id: str(getattr(t.state, "value", t.state))
        for listings in listed.values()
        for t in listings
        if t.transactional_id in txn_ids
    }


def _assert_nothing_open(kafka: _Kafka, topics: list[str], txn_ids: set[str], why: str) -> None:
    """No transaction of ``txn_ids`` is left open: ListTransactions shows none ongoing
    or preparing, and every partition's last stable offset is its high watermark.
    (Markers are written after EndTxn is answered: both are waited for a while.)"""
    deadline = time.monotonic() + 30
    while True:
        ongoing = _open_transactions(kafka, txn_ids)
        behind = {t: p for t in topics if (p := kafka.broker.open_partitions(t))}
        if not ongoing and not behind:
            return
        assert time.monotonic() < deadline, (
            f"{why}: left open: transactions {ongoing}, partitions whose last stable offset "
            f"is below the high watermark {{topic: {{partition: (LSO, HW)}}}} {behind}"
        )
        time.sleep(0.5)


def _assert_same_on_both_sides(
    kafka: _Kafka, topic: str, database: list[str], expected: list[str], why: str
) -> None:
    """The database holds ``expected`` (each once), and a read_committed consumer of
    ``topic`` (kafka-python) the same values, each once."""
    assert Counter(database) == Counter(expected), f"{why}: the database holds {database}"
    seen = [v for _, v in kafka.broker.read_committed(topic, expected=len(expected))]
    assert Counter(seen) == Counter(v.encode() for v in expected), (
        f"{why}: the database holds {sorted(database)}, read_committed Kafka shows {sorted(seen)}"
    )


def _wait_for_markers(kafka: _Kafka, topic: str, why: str) -> None:
    """Wait until every transaction that wrote to ``topic`` has its markers written
    (last stable offset = high watermark on every partition).

    The broker is not taken down between a commit's EndTxn answer and its markers: a
    one-node Apache Kafka 4.4 restarted after a SIGKILL there can drop them. The
    restarted coordinator reloads the PrepareCommit and queues its markers while the
    controller still refuses the new incarnation's registration; when it then fences the
    broker, the partitions have no leader, and
    ``TransactionMarkerChannelManager.addTxnMarkersToBrokerQueue`` skips them as "likely
    deleted already" and writes CompleteCommit: the transaction stays open on those
    partitions for good (docs/guarantees.md)."""
    deadline = time.monotonic() + 30
    while behind := kafka.broker.open_partitions(topic):
        assert time.monotonic() < deadline, f"{why}: markers not written: {behind}"
        time.sleep(0.05)


# ---------------------------------------------------------------- 1. DualWriter
def _values(batch: int) -> list[str]:
    return [f"b{batch}-r{i}" for i in range(_RECORDS)]


def _write(writer: DualWriter, events: Table, topic: str, batch: int) -> None:
    values = _values(batch)
    with writer.transaction() as tx:
        tx.connection.execute(insert(events), [{"batch": batch, "value": v} for v in values])
        for value in values:
            tx.produce(topic, value.encode(), key=value.encode())


def _rows(engine: Engine, events: Table) -> list[str]:
    with engine.connect() as conn:
        return [str(v) for v in conn.execute(select(events.c.value)).scalars()]


# (database, how, step, broker down): SIGKILL at every step on PostgreSQL and a sample
# on MariaDB, the broker kept down until the writer's transaction returned (its next
# Kafka call fails: the recovery path); SIGTERM at a sample, the broker started again at
# once, a seeded random pause later (the writer's calls ride through the restart).
UNTIL_RETURNED, AT_ONCE = "down-until-the-transaction-returned", "up-again-at-once"
_DUAL_WRITE_SCHEDULES = [
    *[("postgresql", KILL, step, UNTIL_RETURNED) for step in STEPS],
    ("mariadb", KILL, "after_send", UNTIL_RETURNED),
    ("mariadb", KILL, "after_db_commit", UNTIL_RETURNED),
    ("postgresql", TERMINATE, "after_prepare", AT_ONCE),
    ("postgresql", TERMINATE, "after_db_commit", AT_ONCE),
    ("mariadb", TERMINATE, "after_state_write", AT_ONCE),
]


@pytest.mark.parametrize(
    ("database", "how", "step", "down"),
    _DUAL_WRITE_SCHEDULES,
    ids=[f"{d}-{h}-{s}-{w}" for d, h, s, w in _DUAL_WRITE_SCHEDULES],
)
@pytest.mark.guarantee("7.1")
def test_dual_write_with_the_broker_going_down_at_a_step(
    kafka: _Kafka,
    request: pytest.FixtureRequest,
    rng: random.Random,
    database: str,
    how: str,
    step: str,
    down: str,
) -> None:
    """Batch 0 is committed; during batch 1 the broker is taken down (``how``) at
    ``step``, and either kept down until the writer's transaction has returned (so its
    next Kafka call fails: the prepare's flush before the database decided, the Kafka
    commit after) or started again at once. Then, the broker up, the writer is closed,
    a new writer's ``start()`` settles what it left (``TransactionInDoubtError`` before
    it: committed), and batch 2 is written.

    Checked: the writer raised nothing (the batch committed on both sides) or an error
    of kafka-txn's saying what to do; batch 1 is in the database exactly when its COMMIT
    ran (every step from ``after_prepare`` on, when the broker stayed down), and then in
    Kafka too, once; direct SQL equals a read_committed read of the topic; nothing is
    left open (ListTransactions, last stable offset = high watermark)."""
    jdbc = str(
        request.getfixturevalue("postgres_jdbc" if database == "postgresql" else "mariadb_jdbc")
    )
    topic = kafka.broker.create_topic(partitions=2)
    txn_id = f"restart-dw-{uuid.uuid4().hex[:10]}"
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": txn_id, **_CLIENT}
    pause = rng.uniform(0.0, 1.5)
    why = f"{database}, {how} at {step}, {down} (seed {request.node.nodeid!r}, pause {pause:.2f}s)"
    armed: list[bool] = []  # for batch 1 only
    fired: list[float] = []

    def on_step(at: str) -> None:
        if at == step and armed and not fired:
            fired.append(time.monotonic())
            if at == "after_kafka_commit":
                _wait_for_markers(kafka, topic, why)
            kafka.down(how)
            if down == AT_ONCE:
                kafka.up_in_background(pause)

    timeout = _OPERATION_TIMEOUT_S if down == UNTIL_RETURNED else None
    first = DualWriter(conf, jdbc, on_step=on_step, operation_timeout=timeout)
    engine = first.engine
    events.create(engine, checkfirst=True)
    try:
        assert first.start() is TransactionOutcome.NOTHING_TO_COMMIT
        _write(first, events, topic, 0)
        _wait_for_markers(kafka, topic, why)
        failed: BaseException | None = None
        armed.append(True)
        try:
            _write(first, events, topic, 1)
        except KafkaTxnError as exc:
            failed = exc
        assert fired, f"{why}: the hook never reached {step}"
        kafka.wait_up()  # started now if it was kept down
        first.close()

        db_committed = failed is None or isinstance(failed, TransactionInDoubtError)
        if down == UNTIL_RETURNED and STEPS.index(step) >= STEPS.index("after_prepare"):
            # The state write and COMMIT need no broker: the database decided.
            assert db_committed, f"{why}: the database did not commit: {failed!r}"
        if down == UNTIL_RETURNED and step != "after_kafka_commit":
            assert failed is not None, f"{why}: the writer's Kafka call did not fail"
        second = DualWriter(
            {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": txn_id},
            engine,
        )
        try:
            recovered = second.start()
            expected_outcome = (
                TransactionOutcome.COMMITTED
                if isinstance(failed, TransactionInDoubtError)
                else TransactionOutcome.NOTHING_TO_COMMIT
            )
            assert recovered is expected_outcome, f"{why}: start() after {failed!r}"
            _write(second, events, topic, 2)
        finally:
            second.close()
        expected = _values(0) + (_values(1) if db_committed else []) + _values(2)
        _assert_same_on_both_sides(kafka, topic, _rows(engine, events), expected, why)
        _assert_nothing_open(kafka, [topic], {txn_id}, why)
    finally:
        first.close()
        drop_tables(engine, events.name)
        engine.dispose()


# ---------------------------------------------------------------- 2. the two-phase API
class _TwoPhaseApp:
    """tests/apps/crash_app.py's application (rows and the prepared state in one SQLite
    transaction, the decision) against the module's broker: run as a process of its
    own, or its batch written here step by step with the broker taken down between two
    calls."""

    def __init__(self, kafka: _Kafka, folder: Path) -> None:
        self.kafka = kafka
        self.topic = kafka.broker.create_topic(partitions=2)
        self.txn_id = f"restart-2pc-{uuid.uuid4().hex[:10]}"
        self.db = folder / "app.sqlite"

    def process(self, *args: str) -> subprocess.CompletedProcess[str]:
        """tests/apps/crash_app.py in a fresh process: its first line says what its recovery
        (``init_transactions(keep_prepared_txn=True)``, ``complete_transaction(stored)``)
        did."""
        return subprocess.run(
            [sys.executable, str(ROOT / "tests" / "apps" / "crash_app.py"),
             "--bootstrap-servers", self.kafka.bootstrap_servers, "--topic", self.topic,
             "--transactional-id", self.txn_id, "--db", str(self.db), *args],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    def recover(self, why: str) -> str:
        done = self.process("--mode", "recover")
        assert done.returncode == 0, f"{why}: recovery failed:\n{done.stdout}{done.stderr}"
        return done.stdout.splitlines()[0].removeprefix("outcome=")

    def write_live(
        self, batch: int, between: Callable[[str], None], operation_timeout: float | None
    ) -> tuple[BaseException | None, bool]:
        """Batch ``batch`` written here as crash_app.py writes it (recovery first), with
        ``between(point)`` called between two calls: ``prepare|store``,
        ``store|complete``, ``complete|mark``. A failure of kafka-txn ends the batch
        as a user's would: the producer is closed (a prepared transaction stays open for
        recovery); returned are the failure and whether the decision was stored."""
        db = crash_app_db(str(self.db))
        decided = False
        producer = TransactionalProducer(
            {"bootstrap.servers": self.kafka.bootstrap_servers, "transactional.id": self.txn_id,
             "transaction.two.phase.commit.enable": True, **_CLIENT},
            operation_timeout=operation_timeout,
        )  # fmt: skip
        try:
            producer.init_transactions(keep_prepared_txn=True)
            stored = stored_state(db, self.txn_id)
            producer.complete_transaction(
                stored, before_init=lambda _: store_state(db, self.txn_id, stored.mark_completed())
            )
            values = [f"b{batch}-r{i}" for i in range(5)]
            producer.begin_transaction()
            for value in values:
                producer.produce(self.topic, value.encode(), key=value.encode())
            state: PreparedTxnState = producer.prepare_transaction()
            between("prepare|store")
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT INTO rows VALUES (?)", [(v,) for v in values])
            store_state(db, self.txn_id, state)
            db.execute("COMMIT")
            decided = True
            between("store|complete")
            producer.complete_transaction(state)
            between("complete|mark")
            store_state(db, self.txn_id, state.mark_completed())
        except KafkaTxnError as exc:
            return exc, decided
        finally:
            producer.close()
            db.close()
        return None, decided

    def rows(self) -> list[str]:
        with sqlite3.connect(self.db) as db:
            return [str(r[0]) for r in db.execute("SELECT value FROM rows")]


def _batch(batch: int) -> list[str]:
    return [f"b{batch}-r{i}" for i in range(5)]


# (where, how, the application): crash_app.py exits hard (os._exit) at its step and the
# broker goes down after it; or the application here goes on with its next call while
# the broker is down (kept down until that call failed) or restarting.
_TWO_PHASE_SCHEDULES = [
    ("after_prepare", KILL, "process-died"),
    ("after_decision", TERMINATE, "process-died"),
    ("after_commit", KILL, "process-died"),
    ("store|complete", KILL, UNTIL_RETURNED),
    ("prepare|store", KILL, AT_ONCE),
]


@pytest.mark.parametrize(
    ("where", "how", "app"),
    _TWO_PHASE_SCHEDULES,
    ids=[f"{w.replace('|', '-')}-{h}-{a}" for w, h, a in _TWO_PHASE_SCHEDULES],
)
@pytest.mark.guarantee("7.1")
def test_two_phase_commit_with_the_broker_going_down_between_the_calls(
    kafka: _Kafka,
    request: pytest.FixtureRequest,
    rng: random.Random,
    tmp_path: Path,
    where: str,
    how: str,
    app: str,
) -> None:
    """Batch 0 is committed by one process. Batch 1: the broker goes down (``how``)
    between two calls of the two-phase recipe, the application process dead there
    (crash_app.py's hard exit) or going on (its next call meets a broker kept down until
    the call failed, or one restarting). The broker is started again; a fresh process
    recovers from the stored state (``init_transactions(keep_prepared_txn=True)``,
    ``complete_transaction(stored)``), and another writes batch 2.

    Checked: recovery's outcome is what the stored state says (nothing to commit when
    the decision was not stored, committed when it was and Kafka had not committed, and
    already committed when it had, markers and all, which the restarted coordinator
    completes: ``TransactionStateManager.loadTransactionsForTxnTopicPartition`` sends the
    markers of a PrepareCommit it loads); the SQLite rows equal a read_committed read
    of the topic, each once; nothing is left open."""
    two_phase = _TwoPhaseApp(kafka, tmp_path)
    pause = rng.uniform(0.0, 1.5)
    why = f"{how} at {where}, {app} (seed {request.node.nodeid!r}, pause {pause:.2f}s)"
    first = two_phase.process("--batch", "0")
    assert first.returncode == 0, first.stdout + first.stderr

    failed: BaseException | None = None
    if app == "process-died":
        died = two_phase.process("--batch", "1", "--crash-at", where)
        code = {"after_prepare": 70, "after_decision": 71, "after_commit": 72}[where]
        assert died.returncode == code, died.stdout + died.stderr
        kafka.down(how)
        kafka.wait_up()
        decided, committed = where != "after_prepare", where == "after_commit"
    else:
        went_down: list[str] = []

        def between(point: str) -> None:
            if point == where:
                went_down.append(point)
                kafka.down(how)
                if app == AT_ONCE:
                    kafka.up_in_background(pause)

        timeout = _OPERATION_TIMEOUT_S if app == UNTIL_RETURNED else None
        failed, decided = two_phase.write_live(1, between, timeout)
        assert went_down == [where], why
        kafka.wait_up()
        if app == UNTIL_RETURNED:
            assert failed is not None, f"{why}: the call after the broker went down succeeded"
        committed = failed is None

    outcome = two_phase.recover(why)
    expected_outcome = (
        TransactionOutcome.NOTHING_TO_COMMIT
        if not decided or (committed and app != "process-died")  # stored marked completed
        else TransactionOutcome.ALREADY_COMMITTED
        if committed
        else TransactionOutcome.COMMITTED
    )
    assert outcome == expected_outcome, f"{why}: recovery after {failed!r}"
    then = two_phase.process("--batch", "2")
    assert then.returncode == 0, then.stdout + then.stderr
    expected = _batch(0) + (_batch(1) if decided else []) + _batch(2)
    _assert_same_on_both_sides(kafka, two_phase.topic, two_phase.rows(), expected, why)
    _assert_nothing_open(kafka, [two_phase.topic], {two_phase.txn_id}, why)


# ---------------------------------------------------------------- 3. ExactlyOnceProcessor
_INPUTS = 300


class _Outages:
    """Takes the broker down at chosen counts of processed records (in the background:
    the processor goes on meanwhile) and starts it again a random pause later."""

    def __init__(self, kafka: _Kafka, how: str, at: list[int], pauses: list[float]) -> None:
        self.kafka = kafka
        self.how = how
        self.pending = dict(zip(at, pauses, strict=True))
        self.processed = 0
        self.threads: list[threading.Thread] = []
        self.failures: list[BaseException] = []
        self._lock = threading.Lock()

    def record_processed(self) -> None:
        with self._lock:
            self.processed += 1
            pause = self.pending.pop(self.processed, None)
        if pause is not None:
            thread = threading.Thread(target=self._bounce, args=(pause,), name="outage")
            self.threads.append(thread)
            thread.start()

    def _bounce(self, pause: float) -> None:
        try:
            self.kafka.bounce_in_background(self.how, pause)
            self.kafka.wait_up()
        except BaseException as exc:
            self.failures.append(exc)

    @property
    def done(self) -> bool:
        return not self.pending and not any(t.is_alive() for t in self.threads)


def _offsets(kafka: _Kafka, group: str, topic: str) -> dict[int, int] | None:
    """The group's committed offsets of the two partitions of ``topic``; None while the
    broker cannot answer."""
    try:
        return committed_offsets(kafka.broker, group, topic, 2)
    except KafkaException:
        return None


@pytest.mark.parametrize("how", [KILL, TERMINATE])
@pytest.mark.guarantee("7.2")
def test_exactly_once_processor_with_the_broker_going_down_at_random_moments(
    kafka: _Kafka, request: pytest.FixtureRequest, rng: random.Random, how: str
) -> None:
    """A processor copies 300 known inputs (2 partitions) to a sink, 20 per transaction;
    the broker goes down (``how``) twice, when a seeded random count of records has been
    processed, and is started again a random pause later. A ``run()`` that raises is
    followed by a new processor with the same transactional id and group, as a user
    restarts one; the last is stopped once the group's committed offsets are past every
    input and both outages are over.

    Checked: only KIP-691 fatal errors or a commit whose outcome is unknown stopped a
    run; a read_committed consumer (kafka-python) sees every output exactly once; the
    group's committed offsets are one past each partition's last input; nothing is left
    open (ListTransactions, last stable offset = high watermark)."""
    source, sink = kafka.broker.create_topic(2), kafka.broker.create_topic(2)
    inputs = [b"in-%04d" % i for i in range(_INPUTS)]
    seed_topic(kafka.broker, source, inputs)
    ends = positions_after_last_record(kafka.broker, source, _INPUTS)
    group, txn_id = f"g-{uuid.uuid4().hex[:8]}", f"restart-eos-{uuid.uuid4().hex[:8]}"
    at = sorted(rng.sample(range(10, _INPUTS - 40), 2))
    pauses = [rng.uniform(0.0, 1.5) for _ in at]
    why = f"{how} after {at} records processed (seed {request.node.nodeid!r}, pauses {pauses})"
    outages = _Outages(kafka, how, at, pauses)

    def process(record: Message) -> list[OutputRecord]:
        outages.record_processed()
        time.sleep(0.005)  # a little work: the outages land mid-transaction
        return [OutputRecord(sink, b"out-" + (record.value() or b""), record.key())]

    stopped_by: list[BaseException] = []
    deadline = time.monotonic() + 45
    while True:
        processor = ExactlyOnceProcessor(
            {"bootstrap.servers": kafka.bootstrap_servers, "group.id": group,
             "session.timeout.ms": 6000, **_CLIENT},
            {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": txn_id,
             "transaction.timeout.ms": 10000, **_CLIENT},
            [source], process, batch_size=20, backoff=tenacity.wait_fixed(0.05),
        )  # fmt: skip
        result: list[BaseException | None] = []

        def run(p: ExactlyOnceProcessor = processor, out: list[Any] = result) -> None:
            try:
                p.run()
                out.append(None)
            except BaseException as exc:
                out.append(exc)

        worker = threading.Thread(target=run, name="processor", daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                if outages.done and _offsets(kafka, group, source) == ends:
                    processor.stop()
                assert time.monotonic() < deadline, (
                    f"{why}: not done within 45 s: {outages.processed} records "
                    f"processed, {processor.stats}, committed offsets "
                    f"{_offsets(kafka, group, source)} of {ends}; runs stopped by {stopped_by!r}"
                )
                worker.join(0.5)
        finally:
            processor.stop()  # a failed assertion must not leave the loop running
            worker.join(15)
        if result == [None]:
            break
        assert result, why
        stopped_by.append(result[0])  # type: ignore[arg-type]
        kafka.wait_up()

    for thread in outages.threads:
        thread.join(START_TIMEOUT_S)
    assert not outages.failures, f"{why}: {outages.failures}"
    assert outages.processed >= _INPUTS, why
    unexpected = [
        e for e in stopped_by if not isinstance(e, (FatalError, TransactionOutcomeUnknownError))
    ]
    assert not unexpected, f"{why}: run() stopped by {unexpected!r}"
    outputs = Counter(v for _, v in kafka.broker.read_committed(sink, expected=_INPUTS))
    assert outputs == Counter(b"out-" + v for v in inputs), (
        f"{why}: missing {sorted(set(b'out-' + v for v in inputs) - set(outputs))}, "
        f"twice or more {sorted(v for v, n in outputs.items() if n > 1)}; runs stopped by "
        f"{stopped_by!r}"
    )
    assert committed_offsets(kafka.broker, group, source, 2) == ends, why
    _assert_nothing_open(kafka, [sink], {txn_id}, why)
