"""DualWriter and the database session it is given: an engine in autocommit mode is
refused before anything is written, engines set up the ways their drivers' documentation
recommends (the pysqlite recipe, an explicit BEGIN over the driver's autocommit) are
accepted and roll back both sides on a body failure, and a session statement timeout that
ends the wait for the state-row lock is the lock-timeout error (guarantees 4.2 and 4.9).
The adversarial schedules of tests/dualwrite/test_session_faults.py cover the same
promises with an earlier deployment's state row; these start from a fresh state table."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import create_engine, event, inspect, text

from kafka_txn.dualwrite.engine import database_url
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import ConfigurationError, TransactionAbortableError
from tests.support.rig import Broker


@pytest.mark.guarantee("4.2")
def test_an_autocommit_engine_is_refused_before_anything_is_written(
    broker: Broker, topic: str, producer_config: dict[str, Any], jdbc_url: str
) -> None:
    """Each statement of an AUTOCOMMIT session commits on its own: the state row would
    not stay locked, and a body's rows would stay when Kafka aborts. start() refuses it
    with the fix, on every database, before a Kafka transaction or the state row
    exists."""
    state = f"state_{uuid.uuid4().hex[:8]}"
    url = jdbc_to_sqlalchemy(jdbc_url)
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    writer = DualWriter(producer_config, engine, state_table=state)
    try:
        with pytest.raises(ConfigurationError, match="autocommit mode") as raised:
            writer.start()
        assert "Nothing was written" in str(raised.value)
        assert "isolation_level='READ COMMITTED'" in str(raised.value)
        refused = pytest.raises(ConfigurationError, match="autocommit mode")
        with refused, writer.transaction() as tx:  # the body never runs
            tx.produce(topic, b"never")
    finally:
        writer.close()
    assert broker.read_committed(topic, expected=0) == []
    assert broker.open_partitions(topic) == {}
    admin = create_engine(url)
    try:
        if inspect(admin).has_table(state):
            with admin.connect() as conn:
                rows = conn.execute(text(f"SELECT prepared_txn_state FROM {state}")).all()
            assert all(row[0] == "" for row in rows), "no transaction state was stored"
            with admin.begin() as conn:
                conn.execute(text(f"DROP TABLE {state}"))
    finally:
        admin.dispose()


@pytest.mark.guarantee("4.9")
def test_mariadb_max_statement_time_ending_the_lock_wait_is_the_lock_timeout_error(
    broker: Broker, topic: str, producer_config: dict[str, Any], mariadb_jdbc: str
) -> None:
    """MariaDB's max_statement_time (ER_STATEMENT_TIMEOUT, 1969) cancels the wait for
    the state-row lock before lock_timeout: TransactionAbortableError naming the cancel,
    nothing written, and the writer goes on once the holder is gone."""
    state = f"state_{uuid.uuid4().hex[:8]}"
    url = jdbc_to_sqlalchemy(mariadb_jdbc)
    admin = create_engine(url)
    engine = create_engine(url, connect_args={"init_command": "SET max_statement_time=0.5"})
    writer = DualWriter(producer_config, engine, state_table=state, lock_timeout=5.0)
    holder = admin.connect()
    try:
        writer.start()
        holder.begin()
        holder.execute(
            text(f"SELECT 1 FROM {state} WHERE transactional_id = :t FOR UPDATE"),
            {"t": producer_config["transactional.id"]},
        )
        cancelled = pytest.raises(TransactionAbortableError, match="cancelled the statement")
        with cancelled as raised, writer.transaction() as tx:
            tx.produce(topic, b"1")
        assert "Nothing was written" in str(raised.value)
        holder.rollback()
        with writer.transaction() as tx:
            tx.produce(topic, b"2")
    finally:
        holder.rollback()
        holder.close()
        writer.close()
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {state}"))
        admin.dispose()
    assert [v for _, v in broker.read_committed(topic, expected=1)] == [b"2"]


def _tid() -> str:
    return f"sessions-{uuid.uuid4().hex[:10]}"


def _sqlite_recipe_engine(path: str) -> Any:
    """SQLAlchemy's recommended pysqlite setup: the driver's own transaction handling
    off (isolation_level=None), BEGIN emitted by SQLAlchemy's begin event."""
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 30})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


@pytest.mark.adversary
@pytest.mark.guarantee("4.2")
def test_sqlite_recipe_engine_is_accepted_and_rolls_back_both(
    broker: Broker, tmp_path: Any
) -> None:
    """The autocommit check reads sqlite3's in_transaction after the lock: with the
    recipe, the explicit BEGIN makes it true, so the engine is not refused, and a body
    failure rolls back the body's row as well as Kafka's records (4.2)."""
    topic = broker.create_topic()
    engine = _sqlite_recipe_engine(str(tmp_path / "recipe.db"))
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE rows_ (id INTEGER PRIMARY KEY)"))
    try:
        with DualWriter(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": _tid()},
            engine,
            mark_completed_after=None,
        ) as writer:
            with writer.transaction() as tx:
                tx.connection.execute(text("INSERT INTO rows_ VALUES (1)"))
                tx.produce(topic, b"one")
            with pytest.raises(RuntimeError), writer.transaction() as tx:
                tx.connection.execute(text("INSERT INTO rows_ VALUES (2)"))
                tx.produce(topic, b"aborted")
                raise RuntimeError("body fails")
            with writer.transaction() as tx:
                tx.connection.execute(text("INSERT INTO rows_ VALUES (3)"))
                tx.produce(topic, b"three")
        assert [v for _, v in broker.read_committed(topic, 2)] == [b"one", b"three"]
        with engine.connect() as conn:
            ids = [r[0] for r in conn.execute(text("SELECT id FROM rows_ ORDER BY id"))]
        assert ids == [1, 3]
    finally:
        engine.dispose()


def _explicit_begin_engine(url: Any) -> Any:
    """The pysqlite recipe applied to another driver: the driver's autocommit on
    (switched on in the pool's connect hook), BEGIN emitted by SQLAlchemy's begin event,
    so each SQLAlchemy transaction is an explicit database transaction."""
    engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        if callable(getattr(dbapi_connection, "autocommit", None)):
            dbapi_connection.autocommit(True)  # PyMySQL
        else:
            dbapi_connection.autocommit = True  # psycopg

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def _explicit_begin_run(broker: Broker, engine: Any, table: str) -> list[int]:
    """A commit then a body failure through ``engine``: the ids the table holds after."""
    topic = broker.create_topic()
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} (id INT PRIMARY KEY)"))
    with DualWriter(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": _tid()},
        engine,
        mark_completed_after=None,
    ) as writer:
        with writer.transaction() as tx:
            tx.connection.execute(text(f"INSERT INTO {table} VALUES (1)"))
            tx.produce(topic, b"one")
        with pytest.raises(RuntimeError), writer.transaction() as tx:
            tx.connection.execute(text(f"INSERT INTO {table} VALUES (2)"))
            tx.produce(topic, b"aborted")
            raise RuntimeError("body fails")
    assert [v for _, v in broker.read_committed(topic, 1)] == [b"one"]
    assert broker.open_partitions(topic) == {}
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(text(f"SELECT id FROM {table}"))]


@pytest.mark.adversary
def test_postgresql_explicit_begin_over_driver_autocommit_is_accepted(
    broker: Broker, postgres_jdbc: str
) -> None:
    """psycopg's transaction status reads INTRANS after an explicit BEGIN: accepted, and
    a body failure rolls back both (the same engine on MariaDB: next test)."""
    table = f"eb_{uuid.uuid4().hex[:8]}"
    engine = _explicit_begin_engine(database_url(postgres_jdbc, None, None))
    try:
        assert _explicit_begin_run(broker, engine, table) == [1]
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()


@pytest.mark.adversary
@pytest.mark.guarantee("4.2")
def test_mariadb_explicit_begin_over_driver_autocommit_is_accepted(
    broker: Broker, mariadb_jdbc: str
) -> None:
    """Promised (4.2, dual-write.md): only a connection where each statement would
    commit on its own is refused. PyMySQL's SERVER_STATUS_AUTOCOMMIT flag is the session
    variable, set also inside an explicit BEGIN ... COMMIT, so this engine, whose
    statements all run in a transaction (PostgreSQL accepts the same engine), must not be
    refused with ConfigurationError 'is in autocommit mode' on the strength of that flag."""
    table = f"eb_{uuid.uuid4().hex[:8]}"
    engine = _explicit_begin_engine(database_url(mariadb_jdbc, None, None))
    try:
        assert _explicit_begin_run(broker, engine, table) == [1]
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()
