"""A body that catches a statement's error and goes on (skips a bad row), on each
database: after an error that makes the database roll back the WHOLE transaction (a
MariaDB deadlock, SQLite's RAISE(ROLLBACK)), or leaves it failed (PostgreSQL), the
writer fails the transaction with TransactionAbortableError, and neither the database
nor Kafka keeps any of it; after an error that undoes only the statement (SQLite's
RAISE(ABORT), MariaDB's lock wait timeout with innodb_rollback_on_timeout off, a
PostgreSQL savepoint), the transaction commits whole on both sides (guarantee 4.2).

Checked with a direct SQL query and kafka-python's read_committed consumer.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import TransactionAbortableError
from kafka_txn.spark.settle import shared_engine
from tests.support.adversaries import both_sides
from tests.support.databases import sqlite_jdbc
from tests.support.rig import Broker


@pytest.fixture
def events() -> Table:
    return Table(
        f"rb_events_{uuid.uuid4().hex[:10]}", MetaData(),
        Column("id", Integer, primary_key=True), Column("value", String(64)),
    )  # fmt: skip


@pytest.fixture
def writer_for(broker: Broker, txn_id: str, events: Table) -> Iterator[Any]:
    made: list[DualWriter] = []
    state = f"rb_state_{uuid.uuid4().hex[:10]}"

    def make(jdbc: str) -> DualWriter:
        writer = DualWriter(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id},
            jdbc,
            state_table=state,
        )
        made.append(writer)
        events.metadata.create_all(writer.engine)
        writer.start()
        return writer

    yield make
    for writer in made:
        engine = create_engine(writer.engine.url)
        writer.close()
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {events.name}"))
            conn.execute(text(f"DROP TABLE IF EXISTS {state}"))
        engine.dispose()


def _in_database(engine: Engine, events: Table) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(events.c.value)).scalars())


def _in_kafka(broker: Broker, topic: str, expected: int) -> list[str]:
    return sorted((v or b"").decode() for _, v in broker.read_committed(topic, expected=expected))


def _commit_next(writer: DualWriter, events: Table, topic: str) -> None:
    """The writer is still usable: its next transaction commits on both sides."""
    with writer.transaction() as tx:
        tx.connection.execute(events.insert(), {"id": 100, "value": "next"})
        tx.produce(topic, b"next")


def _sqlite_trigger(writer: DualWriter, events: Table, action: str) -> None:
    with writer.engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TRIGGER {events.name}_check BEFORE INSERT ON {events.name} "
            f"WHEN NEW.id < 0 BEGIN SELECT RAISE({action}, 'negative id'); END"
        )


def _skip_invalid(writer: DualWriter, events: Table, topic: str) -> None:
    """A loader's body: rows 1, -1, 2; the invalid one is skipped."""
    with writer.transaction() as tx:
        for ident, value in ((1, "first"), (-1, "invalid"), (2, "second")):
            try:
                tx.connection.execute(events.insert(), {"id": ident, "value": value})
            except IntegrityError:
                continue
            tx.produce(topic, value.encode())


@pytest.mark.guarantee("4.2")
def test_sqlite_rollback_of_the_whole_transaction_caught_by_the_body_commits_nothing(
    broker: Broker, tmp_path: Any, writer_for: Any, events: Table
) -> None:
    topic = broker.create_topic()
    writer = writer_for(sqlite_jdbc(tmp_path))
    _sqlite_trigger(writer, events, "ROLLBACK")
    with pytest.raises(TransactionAbortableError, match="rolled back the whole transaction"):
        _skip_invalid(writer, events, topic)
    assert _in_database(writer.engine, events) == []
    _commit_next(writer, events, topic)
    assert _in_database(writer.engine, events) == ["next"]
    assert _in_kafka(broker, topic, expected=1) == ["next"]


@pytest.mark.guarantee("4.2")
def test_sqlite_statement_rollback_caught_by_the_body_commits_the_rest(
    broker: Broker, tmp_path: Any, writer_for: Any, events: Table
) -> None:
    topic = broker.create_topic()
    writer = writer_for(sqlite_jdbc(tmp_path))
    _sqlite_trigger(writer, events, "ABORT")  # undoes the statement only
    _skip_invalid(writer, events, topic)
    assert _in_database(writer.engine, events) == ["first", "second"]
    assert _in_kafka(broker, topic, expected=2) == ["first", "second"]


@pytest.mark.guarantee("4.2")
def test_postgresql_error_caught_without_a_savepoint_commits_nothing(
    broker: Broker, postgres_jdbc: str, writer_for: Any, events: Table
) -> None:
    topic = broker.create_topic()
    writer = writer_for(postgres_jdbc)
    caught = pytest.raises(TransactionAbortableError, match="after an error that the body caught")
    with caught, writer.transaction() as tx:
        tx.connection.execute(events.insert(), {"id": 1, "value": "first"})
        tx.produce(topic, b"first")
        with contextlib.suppress(IntegrityError):  # skipped; the transaction is failed now
            tx.connection.execute(events.insert(), {"id": 1, "value": "duplicate"})
        tx.produce(topic, b"after")
    assert _in_database(writer.engine, events) == []
    _commit_next(writer, events, topic)
    assert _in_database(writer.engine, events) == ["next"]
    assert _in_kafka(broker, topic, expected=1) == ["next"]


@pytest.mark.guarantee("4.2")
def test_postgresql_error_caught_in_a_savepoint_commits_the_rest(
    broker: Broker, postgres_jdbc: str, writer_for: Any, events: Table
) -> None:
    topic = broker.create_topic()
    writer = writer_for(postgres_jdbc)
    with writer.transaction() as tx:
        tx.connection.execute(events.insert(), {"id": 1, "value": "first"})
        tx.produce(topic, b"first")
        try:
            with tx.connection.begin_nested():
                tx.connection.execute(events.insert(), {"id": 1, "value": "duplicate"})
        except IntegrityError:
            pass
        tx.connection.execute(events.insert(), {"id": 2, "value": "second"})
        tx.produce(topic, b"second")
    assert _in_database(writer.engine, events) == ["first", "second"]
    assert _in_kafka(broker, topic, expected=2) == ["first", "second"]


def _mariadb_contention(
    mariadb_jdbc: str,
) -> tuple[Engine, str, str]:
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    locks, heavy = f"rb_locks_{uuid.uuid4().hex[:8]}", f"rb_heavy_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {locks} (id INT PRIMARY KEY) ENGINE=InnoDB")
        conn.exec_driver_sql(f"CREATE TABLE {heavy} (id INT PRIMARY KEY) ENGINE=InnoDB")
        conn.exec_driver_sql(f"INSERT INTO {locks} VALUES (1), (2)")
    return engine, locks, heavy


def _wait_until_waiting(engine: Engine, thread_id: int) -> None:
    with engine.connect() as watch:
        for _ in range(600):
            waiting = watch.execute(
                text(
                    "SELECT COUNT(*) FROM information_schema.innodb_trx "
                    "WHERE trx_state = 'LOCK WAIT' AND trx_mysql_thread_id = :t"
                ),
                {"t": thread_id},
            ).scalar_one()
            watch.rollback()
            if waiting:
                return
            time.sleep(0.05)
    raise AssertionError("the other session never waited for the lock")


@pytest.mark.adversary
@pytest.mark.guarantee("4.2")
def test_mariadb_deadlock_caught_by_the_body_commits_nothing(
    broker: Broker, mariadb_jdbc: str, writer_for: Any, events: Table
) -> None:
    topic = broker.create_topic()
    writer = writer_for(mariadb_jdbc)
    other, locks, heavy = _mariadb_contention(mariadb_jdbc)
    failures: list[BaseException] = []
    try:
        o = other.connect()
        o.begin()
        thread_id = o.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
        # The other session has done more work: InnoDB picks the writer as the victim.
        o.execute(text(f"INSERT INTO {heavy} VALUES (:i)"), [{"i": i} for i in range(300)])
        o.exec_driver_sql(f"SELECT id FROM {locks} WHERE id = 2 FOR UPDATE").all()

        def other_wants_row_1() -> None:
            try:
                o.exec_driver_sql(f"SELECT id FROM {locks} WHERE id = 1 FOR UPDATE").all()
            except BaseException as exc:  # reported by the test
                failures.append(exc)

        waiter = threading.Thread(target=other_wants_row_1)
        deadlocked: list[int] = []
        deadlock = pytest.raises(TransactionAbortableError, match="Deadlock")
        with deadlock, writer.transaction() as tx:
            tx.connection.execute(events.insert(), {"id": 1, "value": "first"})
            tx.produce(topic, b"first")
            tx.connection.exec_driver_sql(f"SELECT id FROM {locks} WHERE id = 1 FOR UPDATE").all()
            waiter.start()
            _wait_until_waiting(other, thread_id)
            try:
                tx.connection.exec_driver_sql(
                    f"SELECT id FROM {locks} WHERE id = 2 FOR UPDATE"
                ).all()
            except DBAPIError as exc:
                deadlocked.append(exc.orig.args[0])  # type: ignore[union-attr]
            tx.connection.execute(events.insert(), {"id": 2, "value": "second"})
            tx.produce(topic, b"second")
        waiter.join(timeout=60)
        o.rollback()
        o.close()
        assert not failures, failures
        assert deadlocked == [1213]
        assert _in_database(writer.engine, events) == []
        _commit_next(writer, events, topic)
        assert _in_database(writer.engine, events) == ["next"]
        assert _in_kafka(broker, topic, expected=1) == ["next"]
    finally:
        with other.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {locks}")
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {heavy}")
        other.dispose()


@pytest.mark.adversary
@pytest.mark.guarantee("4.2")
def test_mariadb_lock_wait_timeout_caught_by_the_body_commits_the_rest(
    broker: Broker, mariadb_jdbc: str, writer_for: Any, events: Table
) -> None:
    """innodb_rollback_on_timeout is off (MariaDB's default, a server start option): a
    lock wait timeout undoes the statement only, and the transaction goes on."""
    topic = broker.create_topic()
    writer = writer_for(mariadb_jdbc)
    other, locks, heavy = _mariadb_contention(mariadb_jdbc)
    try:
        with other.connect() as check:
            assert not check.exec_driver_sql("SELECT @@innodb_rollback_on_timeout").scalar()
        with other.connect() as o:
            o.begin()
            o.exec_driver_sql(f"SELECT id FROM {locks} WHERE id = 2 FOR UPDATE").all()
            with writer.transaction() as tx:
                tx.connection.execute(events.insert(), {"id": 1, "value": "first"})
                tx.produce(topic, b"first")
                tx.connection.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
                try:
                    tx.connection.exec_driver_sql(
                        f"SELECT id FROM {locks} WHERE id = 2 FOR UPDATE"
                    ).all()
                except DBAPIError as exc:
                    assert exc.orig.args[0] == 1205  # type: ignore[union-attr]
                tx.connection.execute(events.insert(), {"id": 2, "value": "second"})
                tx.produce(topic, b"second")
            o.rollback()
        assert _in_database(writer.engine, events) == ["first", "second"]
        assert _in_kafka(broker, topic, expected=2) == ["first", "second"]
    finally:
        with other.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {locks}")
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {heavy}")
        other.dispose()


@pytest.mark.adversary
def test_sqlite_whole_rollback_caught_by_one_of_two_writers_sharing_an_engine(
    broker: Broker, tmp_path: Any, events: Table
) -> None:
    """Two writers on one engine and one pooled SQLite connection, as a Python worker's
    kept writers share theirs, each with its RollbackWatch on that engine: B's body
    catches an error after which SQLite rolled the whole transaction back (a trigger's
    RAISE(ROLLBACK)) and goes on. B's transaction fails with TransactionAbortableError;
    A, run just before on the same connection, neither takes that error for its own nor
    hides it from B, and goes on (4.2)."""
    topic = broker.create_topic()
    base = create_engine(f"sqlite:///{tmp_path / 'shared.sqlite'}", pool_size=1, max_overflow=0)
    engine = shared_engine(base)
    events.metadata.create_all(base)
    with base.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TRIGGER no_bad BEFORE INSERT ON {events.name} "
            "WHEN NEW.value = 'bad' BEGIN SELECT RAISE(ROLLBACK, 'bad row'); END"
        )
    state = f"rb_state_{uuid.uuid4().hex[:10]}"
    ids = [f"rb-a-{uuid.uuid4().hex[:8]}", f"rb-b-{uuid.uuid4().hex[:8]}"]
    a, b = (
        DualWriter(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid},
            engine,
            state_table=state,
        )
        for tid in ids
    )
    try:
        a.start()
        b.start()
        with a.transaction() as tx:
            tx.connection.execute(events.insert(), {"id": 1, "value": "a1"})
            tx.produce(topic, b"a1")
        with pytest.raises(TransactionAbortableError), b.transaction() as tx:
            tx.connection.execute(events.insert(), {"id": 2, "value": "b2"})
            tx.produce(topic, b"b2")
            with contextlib.suppress(DBAPIError):  # skip the bad row, go on
                tx.connection.execute(events.insert(), {"id": 3, "value": "bad"})
            tx.connection.execute(events.insert(), {"id": 4, "value": "b4"})
            tx.produce(topic, b"b4")
        with a.transaction() as tx:  # A goes on, its own transactions unaffected
            tx.connection.execute(events.insert(), {"id": 5, "value": "a5"})
            tx.produce(topic, b"a5")
        in_db, in_kafka = both_sides(broker, base, events, topic, linger=2.0)
        assert in_db == in_kafka == ["a1", "a5"]
    finally:
        a.close()
        b.close()
        base.dispose()
