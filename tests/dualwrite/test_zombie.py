"""Two DualWriters with one transactional id, scheduled deterministically on PostgreSQL,
MariaDB and SQLite:

- a zombie writer that takes the state-row lock after the new writer's recovery but
  before its fence (scenario 1);
- a hung session that holds the state-row lock (scenario 7);
- a zombie that finishes its last transaction and goes for the next one while the new
  writer's recovery is between DescribeTransactions and EndTxn (scenario 8);
- a writer whose session died after its start() fenced, while another took the id over,
  calling start() again.

After each, the database rows equal what an independent read_committed consumer
(kafka-python) sees, and the zombie's refused transaction is on neither side."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Table, create_engine, select, text

from kafka_txn import ProducerFencedError, TransactionAbortableError, TransactionOutcome
from kafka_txn.coordinator.client import TransactionDescription
from kafka_txn.dualwrite.engine import database_url
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import FatalError, KafkaTxnError
from tests.apps.dualwrite_app import events_table
from tests.support.rig import Broker

pytestmark = [pytest.mark.broker, pytest.mark.adversary]

WAIT_S = 60.0
"""Upper bound of every wait for another thread: a hang fails the test, never blocks it."""


class Sides:
    """One topic and events table: writes a tagged transaction through a writer, and
    compares the database with Kafka."""

    def __init__(self, broker: Broker, jdbc_url: str, txn_id: str) -> None:
        self.broker = broker
        self.jdbc_url = jdbc_url
        self.topic = broker.create_topic(partitions=2)
        self.events: Table = events_table(f"events_{uuid.uuid4().hex[:10]}")
        self.conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}

    def writer(self, **options: Any) -> DualWriter:
        writer = DualWriter(self.conf, self.jdbc_url, **options)
        self.events.create(writer.engine, checkfirst=True)
        return writer

    def write(self, writer: DualWriter, tag: str) -> None:
        """One dual write of two rows/records, ``<tag>-0`` and ``<tag>-1``."""
        values = [f"{tag}-{i}" for i in range(2)]
        with writer.transaction() as tx:
            tx.connection.execute(self.events.insert(), [{"batch": 0, "value": v} for v in values])
            for value in values:
                tx.produce(self.topic, value.encode())

    def rows(self) -> list[str]:
        engine = create_engine(jdbc_to_sqlalchemy(self.jdbc_url))
        try:
            with engine.connect() as conn:
                return sorted(conn.execute(select(self.events.c.value)).scalars())
        finally:
            engine.dispose()

    def assert_equal_sides(self, expected_tags: set[str]) -> None:
        rows = self.rows()
        assert {r.rsplit("-", 1)[0] for r in rows} == expected_tags
        kafka = sorted(v.decode() for _, v in self.broker.read_committed(self.topic, len(rows)))
        assert kafka == rows


def _wait_for_any(*events: threading.Event) -> None:
    deadline = time.monotonic() + WAIT_S
    while not any(e.is_set() for e in events):
        assert time.monotonic() < deadline, "the other thread never got there"
        time.sleep(0.005)


class Zombie:
    """Runs writes of ``writer`` in a thread; ``pause_at`` makes them stop at that step
    until ``release`` is set, and ``reached[step]`` is set as each step is passed."""

    def __init__(self, pause_at: str | None = None) -> None:
        self.pause_at = pause_at
        self.release = threading.Event()
        self.reached: dict[str, threading.Event] = {}
        self.done = threading.Event()
        self.errors: list[BaseException | None] = []
        self._thread: threading.Thread | None = None

    def on_step(self, step: str) -> None:
        self.reached.setdefault(step, threading.Event()).set()
        if step == self.pause_at:
            assert self.release.wait(WAIT_S)

    def event(self, step: str) -> threading.Event:
        return self.reached.setdefault(step, threading.Event())

    def run(self, *writes: Callable[[], None]) -> None:
        def body() -> None:
            try:
                for write in writes:
                    try:
                        write()
                        self.errors.append(None)
                    except BaseException as exc:
                        self.errors.append(exc)
                        return
            finally:
                self.done.set()

        self._thread = threading.Thread(target=body, name="zombie")
        self._thread.start()

    def join(self) -> None:
        self.release.set()
        if self._thread is not None:
            self._thread.join(WAIT_S)
            assert not self._thread.is_alive()


@pytest.mark.guarantee("4.4")
def test_zombie_is_fenced_between_recovery_and_fence(broker, jdbc_url, txn_id):
    """Scenario 1. Writer A runs; writer B's start() has recovered and committed its
    settle transaction but has not fenced A in Kafka yet (a test hook pauses it there).
    A's next transaction gets the free row lock in that window: it must fail with
    ProducerFencedError and write nothing, rather than commit the database while B's
    fence then aborts its Kafka side."""
    sides = Sides(broker, jdbc_url, txn_id)
    zombie = Zombie(pause_at="after_db_commit")
    a = sides.writer(on_step=zombie.on_step)
    a.start()
    zombie.pause_at = None
    sides.write(a, "a0")
    zombie.pause_at = "after_db_commit"
    zombie.reached.clear()
    b = sides.writer()

    def in_the_window() -> None:
        # B's settle is committed (lock released), its init_transactions() not yet run.
        zombie.run(lambda: sides.write(a, "a1"))
        _wait_for_any(zombie.done, zombie.event("after_db_commit"))

    b._after_settle = in_the_window
    try:
        outcome = b.start()
        zombie.join()
        assert outcome in (
            TransactionOutcome.ALREADY_COMMITTED,
            TransactionOutcome.NOTHING_TO_COMMIT,
        )
        fenced = zombie.errors[0]
        assert isinstance(fenced, ProducerFencedError), fenced
        message = str(fenced)
        assert txn_id in message and b.owner in message and a.owner in message
        assert "nothing of this transaction was written" in message
        assert not zombie.event("after_begin").is_set()  # it never began in Kafka
        with pytest.raises(ProducerFencedError), a.transaction():
            pass  # fenced for good
        sides.write(b, "b0")
    finally:
        zombie.join()
        a.close()
        b.close()
    sides.assert_equal_sides({"a0", "b0"})


@pytest.mark.guarantee("4.5")
def test_zombie_cannot_begin_its_next_transaction_during_recovery(broker, jdbc_url, txn_id):
    """Scenario 8. Recovery's DescribeTransactions -> EndTxn is check-then-act: a zombie
    that committed its last transaction and began the next one in between would have that
    one committed by the recovery's EndTxn (same producer id and epoch). DualWriter holds
    the state-row lock across recovery, so the zombie, released right after B's
    DescribeTransactions, commits its last transaction in Kafka but then waits for the
    lock, never begins the next one during B's recovery, and is fenced afterwards."""
    sides = Sides(broker, jdbc_url, txn_id)
    zombie = Zombie()
    a = sides.writer(on_step=zombie.on_step)
    a.start()
    sides.write(a, "a0")
    zombie.pause_at = "after_db_commit"
    zombie.reached.clear()
    # a1: committed in the database, paused before its Kafka commit; then a2.
    zombie.run(lambda: sides.write(a, "a1"), lambda: sides.write(a, "a2"))
    _wait_for_any(zombie.event("after_db_commit"))
    zombie.reached.clear()  # from now on: a1's Kafka commit, then a2's steps
    b = sides.writer()
    assert b.producer._twophase is not None
    client = b.producer._twophase.client
    describe = client.describe
    began_during_recovery: list[bool] = []

    def describe_then_let_the_zombie_go() -> TransactionDescription:
        seen = describe()
        if not began_during_recovery:  # B's recovery, not its later prepares
            zombie.release.set()  # A commits a1 in Kafka, then goes for a2
            _wait_for_any(zombie.event("after_kafka_commit"), zombie.done)
            # Give a broken writer time to show itself: a2 beginning in Kafka now.
            zombie.event("after_begin").wait(2.0)
            began_during_recovery.append(zombie.event("after_begin").is_set())
        return seen

    client.describe = describe_then_let_the_zombie_go  # type: ignore[method-assign]
    try:
        outcome = b.start()
        zombie.join()
        assert began_during_recovery == [False]
        assert outcome in (TransactionOutcome.COMMITTED, TransactionOutcome.ALREADY_COMMITTED)
        assert zombie.errors[0] is None  # a1 committed on both sides
        assert isinstance(zombie.errors[1], ProducerFencedError), zombie.errors[1]
        sides.write(b, "b0")
    finally:
        zombie.join()
        a.close()
        b.close()
    sides.assert_equal_sides({"a0", "a1", "b0"})


@contextmanager
def _hung_holder(jdbc_url: str, txn_id: str) -> Iterator[None]:
    """A raw database session that takes the state row's lock and sits on it (released
    after WAIT_S at the latest, so that a writer that does not give up fails the test
    rather than hanging it)."""
    if jdbc_url.startswith("jdbc:sqlite:"):
        raw = sqlite3.connect(jdbc_url.removeprefix("jdbc:sqlite:"), isolation_level=None,
                              check_same_thread=False)  # fmt: skip
        raw.execute("BEGIN IMMEDIATE")  # SQLite's write lock: the whole file
        release: Callable[[], None] = raw.rollback
        close: Callable[[], None] = raw.close
    else:
        engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
        conn = engine.connect()
        conn.begin()
        conn.execute(
            text("SELECT * FROM kafka_transaction_state WHERE transactional_id = :t FOR UPDATE"),
            {"t": txn_id},
        )
        release = conn.rollback

        def close() -> None:
            conn.close()
            engine.dispose()

    lock = threading.Lock()
    released = False

    def let_go() -> None:
        nonlocal released
        with lock:
            if not released:
                released = True
                release()

    safety = threading.Timer(WAIT_S, let_go)
    safety.start()
    try:
        yield
    finally:
        safety.cancel()
        let_go()
        close()


@pytest.mark.guarantee("4.9")
def test_hung_lock_holder_bounds_the_wait_and_names_the_owner(broker, jdbc_url, txn_id):
    """Scenario 7. A session holds the state-row lock and hangs. A running writer's
    transaction and a new writer's start() each give up after lock_timeout with a
    TransactionAbortableError that names the transactional id, the row's owner token and
    the fix, having written nothing; both work once the holder is gone (start() is
    simply called again)."""
    sides = Sides(broker, jdbc_url, txn_id)
    a = sides.writer(lock_timeout=1.0)
    b = sides.writer(lock_timeout=1.0)
    try:
        a.start()
        sides.write(a, "a0")
        with _hung_holder(jdbc_url, txn_id):
            with pytest.raises(TransactionAbortableError) as in_transaction:
                sides.write(a, "never")
            with pytest.raises(TransactionAbortableError) as in_start:
                b.start()
        for caught in (in_transaction.value, in_start.value):
            message = str(caught)
            assert txn_id in message and a.owner in message
            assert "lock_timeout=1s" in message and "Nothing was written" in message
            assert "stop its process" in message
        assert a.producer.state == "ready"  # the writer is still usable
        sides.write(a, "a1")
        assert b.start() is not None  # called again: now it takes over
        with pytest.raises(ProducerFencedError):
            sides.write(a, "never")
        sides.write(b, "b0")
    finally:
        a.close()
        b.close()
    sides.assert_equal_sides({"a0", "a1", "b0"})


@pytest.mark.guarantee("4.4")
def test_of_two_racing_starts_the_last_owner_is_left_working(broker, jdbc_url, txn_id):
    """Two start()s of one transactional id at once: B1 has recovered and stored its
    owner token, and B2 runs its whole start() before B1 fences. B1 must then give up
    with ProducerFencedError before init_transactions(), rather than fence B2 in Kafka
    (which would leave neither writer able to work: B2 fenced in Kafka, B1 in the
    database)."""
    sides = Sides(broker, jdbc_url, txn_id)
    b1 = sides.writer()
    b2 = sides.writer()
    b1._after_settle = b2.start
    try:
        with pytest.raises(ProducerFencedError) as caught:
            b1.start()
        message = str(caught.value)
        assert b2.owner in message and "did not initialise transactions" in message
        sides.write(b2, "b2")
        with pytest.raises(ProducerFencedError):
            sides.write(b1, "never")
    finally:
        b1.close()
        b2.close()
    sides.assert_equal_sides({"b2"})


@pytest.mark.guarantee("4.9")
def test_body_sql_waiting_for_a_metadata_lock_is_bounded_on_mariadb(broker, mariadb_jdbc, txn_id):
    """lock_timeout also bounds the body's own SQL on MariaDB when it waits for a table's
    metadata lock (LOCK TABLES here; any statement queued behind an ALTER TABLE alike),
    not only for row locks: the insert fails while the blocker still holds the table,
    nothing is written, and the writer stays usable (unbounded, the wait would be
    MariaDB's default lock_wait_timeout, a day)."""
    sides = Sides(broker, mariadb_jdbc, txn_id)
    writer = sides.writer(lock_timeout=1.0)
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    outcome: list[BaseException | str] = []
    try:
        writer.start()
        blocker = engine.connect()
        blocker.exec_driver_sql(f"LOCK TABLES `{sides.events.name}` WRITE")
        try:
            thread = threading.Thread(target=lambda: _write_into(sides, writer, outcome))
            thread.start()
            thread.join(120)  # a hang guard, not a timing assertion
            assert not thread.is_alive(), "the insert still waits for the metadata lock"
        finally:
            blocker.exec_driver_sql("UNLOCK TABLES")
            blocker.close()
        assert len(outcome) == 1 and not isinstance(outcome[0], str)
        assert "1205" in str(outcome[0]) or isinstance(outcome[0], TransactionAbortableError)
        assert writer.producer.state == "ready"
        sides.write(writer, "after")
    finally:
        writer.close()
        engine.dispose()
    sides.assert_equal_sides({"after"})


def _write_into(sides: Sides, writer: DualWriter, outcome: list[BaseException | str]) -> None:
    try:
        sides.write(writer, "blocked")
        outcome.append("committed")
    except Exception as exc:
        outcome.append(exc)


def test_start_again_after_its_last_commit_failed_and_another_writer_took_over(
    broker: Broker, postgres_jdbc: str
) -> None:
    """Writer A's start() recovers, settles and initialises (its fence in Kafka), then
    its session dies before the COMMIT that releases the lock; writer B takes the id
    over (owner B, its init fences A). A's start() again (_finish_start) must not start
    a writer that no longer owns the id: it raises, A commits nothing, B commits."""
    topic = broker.create_topic()
    tid = f"zombie-{uuid.uuid4().hex[:10]}"
    table = f"st_{uuid.uuid4().hex[:8]}"
    url = database_url(postgres_jdbc, None, None)
    engine_a = create_engine(url, connect_args={"application_name": f"a-{tid}"})
    engine_b = create_engine(url)
    admin = create_engine(url)
    config = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid}
    a = DualWriter(config, engine_a, state_table=table, mark_completed_after=None)
    b = DualWriter(config, engine_b, state_table=table, mark_completed_after=None)
    original = a.producer.complete_transaction

    def complete_then_lose_session(*args: Any, **kwargs: Any) -> Any:
        outcome = original(*args, **kwargs)  # settled, fenced: A's init ran
        with admin.begin() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = :n"
                ),
                {"n": f"a-{tid}"},
            )
        b.start()  # the lock went with A's session: B takes the id over
        return outcome

    a.producer.complete_transaction = complete_then_lose_session  # type: ignore[method-assign]
    try:
        with pytest.raises(Exception):  # noqa: B017 - the session's end, whatever its type
            a.start()
        with pytest.raises(FatalError, match="another took the id over"):
            a.start()  # _finish_start: the row's owner is B
        with pytest.raises((FatalError, KafkaTxnError)), a.transaction() as tx:
            tx.produce(topic, b"zombie")
        with b.transaction() as tx:
            tx.produce(topic, b"b")
        assert [v for _, v in broker.read_committed(topic, 1)] == [b"b"]
        assert broker.open_partitions(topic) == {}
        with admin.connect() as conn:
            owner = conn.execute(
                text(f"SELECT owner FROM {table} WHERE transactional_id = :t"), {"t": tid}
            ).scalar_one()
        assert owner == b.owner
    finally:
        for w in (a, b):
            with contextlib.suppress(Exception):  # a fenced writer's close may raise
                w.close()
        with admin.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        for e in (engine_a, engine_b, admin):
            e.dispose()
