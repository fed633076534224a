"""DualWriter's database sessions under attack: PostgreSQL pipeline mode for the dual
write, guarantee 4.14; the completion marks, 4.7; the state-row lock, 4.9; start(), 4.8.

Each test states the promise it attacks. Some guard it against a specific session
setup (an engine in autocommit mode, a session statement timeout, pools of one
connection, a body's own session lock wait on MariaDB and SQLite, start() after its
fence); the others cover schedules no other test covers. Real PostgreSQL and
MariaDB, the local broker; Kafka is checked with kafka-python's read_committed consumer,
the database with direct SQL."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, insert, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import (
    ConfigurationError,
    KafkaTxnError,
    TransactionAbortableError,
)
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary


def _names() -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:10]
    return f"rt_state_{suffix}", f"rt_rows_{suffix}"


def _rows_table(name: str) -> Table:
    return Table(name, MetaData(), Column("id", Integer, primary_key=True))


@pytest.fixture
def pg_tables(postgres_jdbc: str) -> Iterator[tuple[str, str, Engine]]:
    """A state table name and a data table (created) on PostgreSQL, and a plain engine to
    check them with; both dropped afterwards."""
    state, rows = _names()
    admin = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    _rows_table(rows).create(admin)
    try:
        yield state, rows, admin
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {rows}"))
            conn.execute(text(f"DROP TABLE IF EXISTS {state}"))
        admin.dispose()


def _count(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def _terminate(admin: Engine, pid: int) -> None:
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        conn.commit()


def _is_driver_error(exc: BaseException) -> bool:
    """A raw DBAPI exception (psycopg's or PyMySQL's), not SQLAlchemy's wrapping."""
    module = type(exc).__module__
    return module.startswith(("psycopg", "pymysql")) and not isinstance(exc, SQLAlchemyError)


# --------------------------------------------------------------------------- autocommit
@pytest.mark.parametrize("database", ["postgresql", "mariadb"])
@pytest.mark.guarantee("4.2")
def test_an_autocommit_engine_is_refused_or_rolls_back_both(
    broker: Broker,
    topic: str,
    producer_config: dict[str, Any],
    database: str,
    request: pytest.FixtureRequest,
) -> None:
    jdbc = str(
        request.getfixturevalue(f"{'postgres' if database == 'postgresql' else database}_jdbc")
    )
    state, rows = _names()
    admin = create_engine(jdbc_to_sqlalchemy(jdbc))
    _rows_table(rows).create(admin)
    try:
        first = DualWriter(producer_config, jdbc, state_table=state)
        first.start()  # an earlier deployment of the same id: the state row exists
        first.close()
        engine = create_engine(jdbc_to_sqlalchemy(jdbc), isolation_level="AUTOCOMMIT")
        writer = DualWriter(producer_config, engine, state_table=state)
        try:
            try:
                writer.start()
            except ConfigurationError:
                return  # refused up front: the promise holds
            with pytest.raises(RuntimeError, match="body fails"), writer.transaction() as tx:
                tx.connection.execute(insert(_rows_table(rows)).values(id=1))
                tx.produce(topic, b"1")
                raise RuntimeError("body fails")
        finally:
            writer.close()
        assert broker.read_committed(topic, expected=0) == []
        assert _count(admin, rows) == 0, "rolled back in Kafka, committed in the database"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {rows}"))
            conn.execute(text(f"DROP TABLE IF EXISTS {state}"))
        admin.dispose()


# --------------------------------------------------------------- sessions ended mid-body
def _pg_writer(
    producer_config: dict[str, Any], engine: Engine, state: str, **kwargs: Any
) -> DualWriter:
    return DualWriter(producer_config, engine, state_table=state, **kwargs)


def _check_pool_is_clean(engine: Engine) -> None:
    """Every pooled connection is out of autocommit mode and idle."""
    conns = [engine.connect() for _ in range(engine.pool.size())]  # type: ignore[attr-defined]
    try:
        for conn in conns:
            driver = conn.connection.driver_connection
            assert driver is not None
            assert driver.autocommit is False, "pooled connection handed out in autocommit"
            assert driver.info.transaction_status.name == "IDLE"
    finally:
        for conn in conns:
            conn.close()


def _settle_and_check(
    broker: Broker,
    topic: str,
    producer_config: dict[str, Any],
    engine: Engine,
    admin: Engine,
    state: str,
    rows: str,
    raised: BaseException,
) -> None:
    """After the failed transaction: a fresh writer (or the same one, if it goes on)
    commits one more transaction; the database and Kafka agree."""
    assert not _is_driver_error(raised), f"raw driver exception escaped: {raised!r}"
    assert isinstance(raised, (DBAPIError, KafkaTxnError)), repr(raised)
    writer = _pg_writer(producer_config, engine, state)
    try:
        writer.start()
        with writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=2))
            tx.produce(topic, b"2")
    finally:
        writer.close()
    with admin.connect() as conn:
        in_db = sorted(r[0] for r in conn.execute(text(f"SELECT id FROM {rows}")))
    in_kafka = sorted(int(v) for _, v in broker.read_committed(topic, expected=len(in_db)))
    assert in_db == in_kafka, f"database {in_db} != Kafka {in_kafka}"
    assert 2 in in_db
    assert broker.open_partitions(topic) == {}


def test_a_session_terminated_during_prepare_writes_nothing_and_raises_sqlalchemys_error(
    broker: Broker, topic: str, producer_config: dict[str, Any], pg_tables: Any, postgres_jdbc: str
) -> None:
    """4.14's pipelined UPDATE+COMMIT on a session that PostgreSQL ended while it was
    idle in the transaction (pg_terminate_backend from a second connection, after the
    Kafka prepare): the error is SQLAlchemy's (or DatabaseCommitUnknownError), nothing
    is committed on either side, no connection goes back to the pool in autocommit mode,
    and the next writer works."""
    state, rows, admin = pg_tables
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc), pool_size=2)
    pids: list[int] = []

    def on_step(step: str) -> None:
        if step == "after_prepare":
            _terminate(admin, pids[-1])
            time.sleep(0.2)  # the FATAL message is in the client's socket

    writer = _pg_writer(producer_config, engine, state, on_step=on_step)
    raised: BaseException | None = None
    try:
        writer.start()
        try:
            with writer.transaction() as tx:
                pids.append(tx.connection.execute(text("SELECT pg_backend_pid()")).scalar_one())
                tx.connection.execute(insert(_rows_table(rows)).values(id=1))
                tx.produce(topic, b"1")
        except BaseException as exc:
            raised = exc
    finally:
        writer.close()
    assert raised is not None
    assert _count(admin, rows) == 0
    _check_pool_is_clean(engine)
    _settle_and_check(broker, topic, producer_config, engine, admin, state, rows, raised)
    engine.dispose()


def test_idle_in_transaction_timeout_during_the_body_writes_nothing(
    broker: Broker, topic: str, producer_config: dict[str, Any], pg_tables: Any, postgres_jdbc: str
) -> None:
    """idle_in_transaction_session_timeout set on the writer's connections ends the
    session while the body (or Kafka) takes longer: the pipelined UPDATE+COMMIT meets a
    dead session. SQLAlchemy's error (or DatabaseCommitUnknownError), nothing committed
    on either side, the pool clean, the next writer works."""
    state, rows, admin = pg_tables
    engine = create_engine(
        jdbc_to_sqlalchemy(postgres_jdbc),
        connect_args={"options": "-c idle_in_transaction_session_timeout=300"},
    )
    writer = _pg_writer(producer_config, engine, state)
    raised: BaseException | None = None
    try:
        writer.start()
        try:
            with writer.transaction() as tx:
                tx.connection.execute(insert(_rows_table(rows)).values(id=1))
                tx.produce(topic, b"1")
                time.sleep(1.0)
        except BaseException as exc:
            raised = exc
    finally:
        writer.close()
    assert raised is not None
    assert _count(admin, rows) == 0
    plain = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    try:
        _settle_and_check(broker, topic, producer_config, plain, admin, state, rows, raised)
    finally:
        plain.dispose()
    engine.dispose()


# --------------------------------------------------------------------- statement_timeout
@pytest.mark.guarantee("4.9")
def test_statement_timeout_ending_the_lock_wait_is_the_lock_timeout_error(
    broker: Broker, topic: str, producer_config: dict[str, Any], pg_tables: Any, postgres_jdbc: str
) -> None:
    state, rows, admin = pg_tables
    engine = create_engine(
        jdbc_to_sqlalchemy(postgres_jdbc),
        connect_args={"options": "-c statement_timeout=500"},
    )
    writer = _pg_writer(producer_config, engine, state, lock_timeout=5.0)
    holder = admin.connect()
    try:
        writer.start()
        holder.begin()
        holder.execute(
            text(f"SELECT 1 FROM {state} WHERE transactional_id = :t FOR UPDATE"),
            {"t": producer_config["transactional.id"]},
        )
        expected = pytest.raises(TransactionAbortableError, match="Nothing was written")
        with expected, writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=1))
            tx.produce(topic, b"1")
    finally:
        holder.rollback()
        holder.close()
        writer.close()
        engine.dispose()
    assert _count(admin, rows) == 0


# ------------------------------------------------------- a connection handed over in a txn
def test_a_connection_left_in_a_transaction_by_a_connect_hook_still_commits_both(
    broker: Broker, topic: str, producer_config: dict[str, Any], pg_tables: Any, postgres_jdbc: str
) -> None:
    """A pool ``connect`` hook that runs SQL on the driver (SQLAlchemy's documented
    search_path recipe) leaves psycopg's connection in a transaction: the writer falls
    back to statement-by-statement for the lock, and the transaction still commits on
    both sides; one that fails in the body still rolls back both."""
    from sqlalchemy import event

    state, rows, admin = pg_tables
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))

    @event.listens_for(engine, "connect")
    def _set_search_path(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("SET search_path TO public")
        cursor.close()

    writer = _pg_writer(producer_config, engine, state)
    try:
        writer.start()
        with writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=1))
            tx.produce(topic, b"1")
        with pytest.raises(RuntimeError), writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=2))
            tx.produce(topic, b"2")
            raise RuntimeError("body fails")
        with writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=3))
            tx.produce(topic, b"3")
    finally:
        writer.close()
        engine.dispose()
    with admin.connect() as conn:
        in_db = sorted(r[0] for r in conn.execute(text(f"SELECT id FROM {rows}")))
    assert in_db == [1, 3]
    assert sorted(int(v) for _, v in broker.read_committed(topic, expected=2)) == [1, 3]


# ------------------------------------------------------------------- a pool of one
@pytest.mark.guarantee("4.2")
def test_a_body_failure_on_a_pool_of_one_connection_rolls_back_both_and_goes_on(
    broker: Broker, topic: str, producer_config: dict[str, Any], pg_tables: Any, postgres_jdbc: str
) -> None:
    state, rows, admin = pg_tables
    engine = create_engine(
        jdbc_to_sqlalchemy(postgres_jdbc), pool_size=1, max_overflow=0, pool_timeout=2
    )
    writer = _pg_writer(producer_config, engine, state, mark_completed_after=None)
    try:
        writer.start()
        with writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=1))
            tx.produce(topic, b"1")
        with pytest.raises(RuntimeError), writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=2))
            tx.produce(topic, b"2")
            raise RuntimeError("body fails")
        with writer.transaction() as tx:  # "the writer goes on"
            tx.connection.execute(insert(_rows_table(rows)).values(id=3))
            tx.produce(topic, b"3")
    finally:
        writer.close()
        engine.dispose()
    with admin.connect() as conn:
        in_db = sorted(r[0] for r in conn.execute(text(f"SELECT id FROM {rows}")))
    assert in_db == [1, 3]
    assert sorted(int(v) for _, v in broker.read_committed(topic, expected=2)) == [1, 3]


# ----------------------------------------------------------------- threads and the marks
def test_a_mark_racing_a_transaction_never_loses_the_new_state(
    broker: Broker, topic: str, producer_config: dict[str, Any], pg_tables: Any, postgres_jdbc: str
) -> None:
    """4.7's background mark (mark_completed_after, tiny) runs while the next transaction
    runs in another thread on the same writer: the row always ends with the last
    transaction's state (marked or not), never an older one, and both sides agree."""
    state, rows, admin = pg_tables
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    writer = _pg_writer(producer_config, engine, state, mark_completed_after=0.001)
    errors: list[BaseException] = []

    def work(first: int) -> None:
        try:
            for i in range(first, first + 20, 2):
                with writer.transaction() as tx:
                    tx.connection.execute(insert(_rows_table(rows)).values(id=i))
                    tx.produce(topic, str(i).encode())
        except BaseException as exc:
            errors.append(exc)

    try:
        writer.start()
        threads = [threading.Thread(target=work, args=(n,)) for n in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        time.sleep(0.5)  # the last mark
        last = writer.producer._twophase.last_start_ms  # type: ignore[union-attr]
    finally:
        writer.close()
        engine.dispose()
    assert errors == []
    with admin.connect() as conn:
        stored = conn.execute(text(f"SELECT prepared_txn_state FROM {state}")).scalar_one()
        in_db = sorted(r[0] for r in conn.execute(text(f"SELECT id FROM {rows}")))
    assert str(last) in stored
    assert in_db == list(range(20))
    assert sorted(int(v) for _, v in broker.read_committed(topic, expected=20)) == in_db


# ------------------------------------------------- the lock bound on MariaDB's pooled sessions
@pytest.mark.guarantee("4.9")
def test_a_body_changing_the_session_lock_wait_does_not_unbound_the_next_lock_wait(
    broker: Broker, topic: str, producer_config: dict[str, Any], mariadb_jdbc: str
) -> None:
    state, rows = _names()
    admin = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    _rows_table(rows).create(admin)
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc), pool_size=1, max_overflow=1)
    writer = DualWriter(producer_config, engine, state_table=state, lock_timeout=1.0)
    holder = admin.connect()
    released = threading.Event()
    try:
        writer.start()
        with writer.transaction() as tx:
            tx.connection.execute(text("SET SESSION innodb_lock_wait_timeout = 60"))
            tx.connection.execute(insert(_rows_table(rows)).values(id=1))
            tx.produce(topic, b"1")
        holder.begin()
        holder.execute(
            text(f"SELECT 1 FROM {state} WHERE transactional_id = :t FOR UPDATE"),
            {"t": producer_config["transactional.id"]},
        )

        def release_later() -> None:
            # Well past lock_timeout: a writer bounded by it has given up by then; one
            # that is not gets the lock and commits.
            if not released.wait(15):
                holder.rollback()

        threading.Thread(target=release_later, daemon=True).start()
        expected = pytest.raises(TransactionAbortableError, match="Nothing was written")
        with expected, writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=2))
            tx.produce(topic, b"2")
    finally:
        released.set()
        holder.rollback()
        holder.close()
        writer.close()
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {rows}"))
            conn.execute(text(f"DROP TABLE IF EXISTS {state}"))
        admin.dispose()


# ------------------------------------------------------------------- start() retried
@pytest.mark.guarantee("4.8")
def test_start_can_be_called_again_after_its_session_ended_between_settle_and_fence(
    broker: Broker, topic: str, producer_config: dict[str, Any], pg_tables: Any, postgres_jdbc: str
) -> None:
    """start() stores the settled state (its own commit), then takes the lock again for
    the fence: a session ended in between (pg_terminate_backend from a second
    connection) fails start() with SQLAlchemy's error, and start() called again on the
    same writer settles, fences and works; Kafka holds each record once."""
    state, rows, admin = pg_tables
    app = f"rt-{uuid.uuid4().hex[:8]}"
    engine = create_engine(
        jdbc_to_sqlalchemy(postgres_jdbc), connect_args={"application_name": app}
    )
    first = _pg_writer(producer_config, engine, state, mark_completed_after=None)
    first.start()
    with first.transaction() as tx:
        tx.connection.execute(insert(_rows_table(rows)).values(id=0))
        tx.produce(topic, b"0")
    first.close()

    def end_session() -> None:
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = :app AND pid <> pg_backend_pid()"
                ),
                {"app": app},
            )
            conn.commit()
        time.sleep(0.2)

    writer = _pg_writer(producer_config, engine, state)
    writer._after_settle = end_session
    try:
        with pytest.raises(DBAPIError) as raised:
            writer.start()
        assert not _is_driver_error(raised.value)
        writer._after_settle = None
        writer.start()
        with writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=1))
            tx.produce(topic, b"1")
    finally:
        writer.close()
        engine.dispose()
    with admin.connect() as conn:
        in_db = sorted(r[0] for r in conn.execute(text(f"SELECT id FROM {rows}")))
    assert in_db == [0, 1]
    assert sorted(int(v) for _, v in broker.read_committed(topic, expected=2)) == [0, 1]
    assert broker.open_partitions(topic) == {}


@pytest.mark.guarantee("4.9")
def test_a_body_changing_the_busy_timeout_does_not_unbound_the_next_lock_wait_on_sqlite(
    broker: Broker, topic: str, producer_config: dict[str, Any], tmp_path: Any
) -> None:
    import sqlite3

    path = tmp_path / "rt.sqlite"
    _, rows = _names()
    writer = DualWriter(producer_config, f"jdbc:sqlite:{path}", lock_timeout=1.0)
    _rows_table(rows).create(writer.engine)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    released = threading.Event()
    try:
        writer.start()
        with writer.transaction() as tx:
            tx.connection.exec_driver_sql("PRAGMA busy_timeout = 60000")
            tx.connection.execute(insert(_rows_table(rows)).values(id=1))
            tx.produce(topic, b"1")
        holder.execute("BEGIN IMMEDIATE")

        def release_later() -> None:
            if not released.wait(15):
                holder.execute("ROLLBACK")

        threading.Thread(target=release_later, daemon=True).start()
        expected = pytest.raises(TransactionAbortableError, match="Nothing was written")
        with expected, writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=2))
            tx.produce(topic, b"2")
    finally:
        released.set()
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
        writer.close()


# ------------------------------------------------------------- the pipelined BEGIN's settings
@pytest.mark.parametrize("how", ["create_engine", "execution_options"])
@pytest.mark.parametrize("level", ["SERIALIZABLE", "REPEATABLE READ"])
def test_the_pipelined_begin_keeps_the_engines_isolation_level(
    broker: Broker,
    topic: str,
    producer_config: dict[str, Any],
    pg_tables: Any,
    postgres_jdbc: str,
    how: str,
    level: str,
) -> None:
    """docs/guide/dual-write.md, Round trips: BEGIN, sent by the writer with the lock, carries
    the connection's isolation level (as psycopg's own BEGIN would): the body's SQL runs
    at the engine's level, whether it was given to create_engine() or through
    execution_options() (as the Spark sink's isolationLevel option does), and the
    transaction commits on both sides."""
    state, rows, admin = pg_tables
    url = jdbc_to_sqlalchemy(postgres_jdbc)
    engine = (
        create_engine(url, isolation_level=level)
        if how == "create_engine"
        else create_engine(url).execution_options(isolation_level=level)
    )
    writer = _pg_writer(producer_config, engine, state)
    seen: list[str] = []
    try:
        writer.start()
        for i in range(2):  # the second one on a pooled connection
            with writer.transaction() as tx:
                seen.append(
                    tx.connection.execute(
                        text("SELECT current_setting('transaction_isolation')")
                    ).scalar_one()
                )
                tx.connection.execute(insert(_rows_table(rows)).values(id=i))
                tx.produce(topic, str(i).encode())
    finally:
        writer.close()
        engine.dispose()
    assert seen == [level.lower()] * 2
    assert _count(admin, rows) == 2
    assert sorted(int(v) for _, v in broker.read_committed(topic, expected=2)) == [0, 1]


# ------------------------------------------------ a body failing on a session already ended
@pytest.mark.parametrize("pool_size", [1, 5])
def test_a_body_failing_after_its_session_ended_rolls_back_both_and_the_writer_goes_on(
    broker: Broker,
    topic: str,
    producer_config: dict[str, Any],
    pg_tables: Any,
    postgres_jdbc: str,
    pool_size: int,
) -> None:
    """Guarantee 4.2 with the database session gone: the body's session is ended
    (pg_terminate_backend from a second connection) and then the body raises, while the
    last commit's completion mark is still pending (so the rollback stores it before
    aborting Kafka). The body's exception is raised, nothing of the transaction is
    visible on either side, and the same writer commits the next transaction; also on a
    pool of one connection."""
    state, rows, admin = pg_tables
    engine = create_engine(
        jdbc_to_sqlalchemy(postgres_jdbc), pool_size=pool_size, max_overflow=0, pool_timeout=5
    )
    writer = _pg_writer(producer_config, engine, state, mark_completed_after=None)
    try:
        writer.start()
        with writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=1))
            tx.produce(topic, b"1")
        with pytest.raises(RuntimeError, match="body fails"), writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=2))
            tx.produce(topic, b"2")
            pid = tx.connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
            _terminate(admin, pid)
            time.sleep(0.2)
            raise RuntimeError("body fails")
        with writer.transaction() as tx:  # "the writer goes on"
            tx.connection.execute(insert(_rows_table(rows)).values(id=3))
            tx.produce(topic, b"3")
    finally:
        writer.close()
        engine.dispose()
    with admin.connect() as conn:
        in_db = sorted(r[0] for r in conn.execute(text(f"SELECT id FROM {rows}")))
    assert in_db == [1, 3]
    assert sorted(int(v) for _, v in broker.read_committed(topic, expected=2)) == [1, 3]
    assert broker.open_partitions(topic) == {}


# ------------------------------------- start() whose session ends while the coordinator is slow
@pytest.mark.guarantee("4.8")
def test_start_whose_session_ends_during_a_slow_recovery_commits_once_when_called_again(
    broker: Broker, topic: str, producer_config: dict[str, Any], pg_tables: Any, postgres_jdbc: str
) -> None:
    """start() holds the state-row lock while recovery asks the coordinator. With the
    coordinator slow (tests/proxies/kafka_proxy.py holding DescribeTransactions back) and
    idle_in_transaction_session_timeout on the writer's connections, PostgreSQL ends the
    session during recovery: start() raises SQLAlchemy's error, and start() called again
    on the same writer settles the transaction a predecessor left prepared after its
    database commit (4.13's interruption), exactly once on both sides; the writer then
    works."""
    from kafka_txn.errors import TransactionInDoubtError
    from tests.proxies.kafka_proxy import ApiKey, KafkaProxy

    state, rows, admin = pg_tables

    def interrupt(step: str) -> None:
        if step == "after_db_commit":
            raise KeyboardInterrupt

    first = _pg_writer(producer_config, postgres_jdbc, state, on_step=interrupt)
    first.start()
    with pytest.raises(KeyboardInterrupt), first.transaction() as tx:
        tx.connection.execute(insert(_rows_table(rows)).values(id=1))
        tx.produce(topic, b"1")
    with pytest.raises(TransactionInDoubtError):
        first.transaction().__enter__()
    first.close()  # leaves the prepared transaction open
    assert broker.open_partitions(topic) != {}

    engine = create_engine(
        jdbc_to_sqlalchemy(postgres_jdbc),
        connect_args={"options": "-c idle_in_transaction_session_timeout=500"},
    )
    with KafkaProxy(broker.bootstrap_servers) as proxy:
        conf = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
        writer = _pg_writer(conf, engine, state)
        try:
            slow = proxy.delay(ApiKey.DESCRIBE_TRANSACTIONS, 1500, times=1)
            with pytest.raises(DBAPIError) as raised:
                writer.start()
            assert slow.hits == 1
            assert not _is_driver_error(raised.value)
            writer.start()
            with writer.transaction() as tx:
                tx.connection.execute(insert(_rows_table(rows)).values(id=2))
                tx.produce(topic, b"2")
        finally:
            writer.close()
            engine.dispose()
    with admin.connect() as conn:
        in_db = sorted(r[0] for r in conn.execute(text(f"SELECT id FROM {rows}")))
    assert in_db == [1, 2]
    assert sorted(int(v) for _, v in broker.read_committed(topic, expected=2)) == [1, 2]
    assert broker.open_partitions(topic) == {}


@pytest.mark.guarantee("4.8")
def test_start_whose_session_ends_during_its_fence_can_be_called_again(
    broker: Broker, topic: str, producer_config: dict[str, Any], pg_tables: Any, postgres_jdbc: str
) -> None:
    """start() takes the state-row lock again for its fence (init_transactions()). With
    the coordinator slow to answer that init (tests/proxies/kafka_proxy.py holding InitProducerId
    back) and idle_in_transaction_session_timeout on the writer's connections,
    PostgreSQL ends the session before start()'s last COMMIT: start() raises
    SQLAlchemy's error, and start() called again on the same writer (4.8: "start() can
    be retried") works, or refuses with advice that works; nothing is lost or
    duplicated."""
    from tests.proxies.kafka_proxy import ApiKey, KafkaProxy

    state, rows, admin = pg_tables
    first = _pg_writer(producer_config, postgres_jdbc, state)
    first.start()
    with first.transaction() as tx:
        tx.connection.execute(insert(_rows_table(rows)).values(id=1))
        tx.produce(topic, b"1")
    first.close()
    engine = create_engine(
        jdbc_to_sqlalchemy(postgres_jdbc),
        connect_args={"options": "-c idle_in_transaction_session_timeout=500"},
    )
    with KafkaProxy(broker.bootstrap_servers) as proxy:
        conf = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
        writer = _pg_writer(conf, engine, state)
        slow: list[Any] = []
        writer._after_settle = lambda: slow.append(
            proxy.delay(ApiKey.INIT_PRODUCER_ID, 1500, times=1)
        )
        try:
            with pytest.raises(DBAPIError) as raised:
                writer.start()
            assert slow[0].hits == 1
            assert not _is_driver_error(raised.value)
            writer._after_settle = None
            writer.start()
            with writer.transaction() as tx:
                tx.connection.execute(insert(_rows_table(rows)).values(id=2))
                tx.produce(topic, b"2")
        finally:
            writer.close()
            engine.dispose()
    with admin.connect() as conn:
        in_db = sorted(r[0] for r in conn.execute(text(f"SELECT id FROM {rows}")))
    assert in_db == [1, 2]
    assert sorted(int(v) for _, v in broker.read_committed(topic, expected=2)) == [1, 2]
    assert broker.open_partitions(topic) == {}


@pytest.mark.guarantee("4.9")
def test_a_lock_timeout_on_a_pool_of_one_connection_names_the_rows_owner(
    broker: Broker, topic: str, producer_config: dict[str, Any], pg_tables: Any, postgres_jdbc: str
) -> None:
    state, _, admin = pg_tables
    engine = create_engine(
        jdbc_to_sqlalchemy(postgres_jdbc), pool_size=1, max_overflow=0, pool_timeout=2
    )
    writer = _pg_writer(producer_config, engine, state, lock_timeout=1.0)
    holder = admin.connect()
    try:
        writer.start()
        holder.begin()
        holder.execute(
            text(f"SELECT 1 FROM {state} WHERE transactional_id = :t FOR UPDATE"),
            {"t": producer_config["transactional.id"]},
        )
        with pytest.raises(TransactionAbortableError) as raised, writer.transaction() as tx:
            tx.produce(topic, b"1")
    finally:
        holder.rollback()
        holder.close()
        writer.close()
        engine.dispose()
    assert "could not be read" not in str(raised.value)
    assert writer.owner in str(raised.value)


@pytest.mark.parametrize("pool_size", [1, 5])
def test_a_body_failing_after_its_mariadb_session_was_killed_rolls_back_both_and_goes_on(
    broker: Broker, topic: str, producer_config: dict[str, Any], mariadb_jdbc: str, pool_size: int
) -> None:
    """Guarantee 4.2 on MariaDB with the session gone (KILL from a second connection)
    before the body raises, the last commit's completion mark pending: the body's
    exception is raised, nothing of the transaction is visible on either side, and the
    same writer commits the next transaction; also on a pool of one connection."""
    state, rows = _names()
    admin = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    _rows_table(rows).create(admin)
    engine = create_engine(
        jdbc_to_sqlalchemy(mariadb_jdbc), pool_size=pool_size, max_overflow=0, pool_timeout=5
    )
    writer = DualWriter(producer_config, engine, state_table=state, mark_completed_after=None)
    try:
        writer.start()
        with writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=1))
            tx.produce(topic, b"1")
        with pytest.raises(RuntimeError, match="body fails"), writer.transaction() as tx:
            tx.connection.execute(insert(_rows_table(rows)).values(id=2))
            tx.produce(topic, b"2")
            session = tx.connection.execute(text("SELECT CONNECTION_ID()")).scalar_one()
            with admin.connect() as conn:
                conn.execute(text(f"KILL {int(session)}"))
            time.sleep(0.2)
            raise RuntimeError("body fails")
        with writer.transaction() as tx:  # "the writer goes on"
            tx.connection.execute(insert(_rows_table(rows)).values(id=3))
            tx.produce(topic, b"3")
    finally:
        writer.close()
        engine.dispose()
        try:
            with admin.connect() as conn:
                in_db = sorted(r[0] for r in conn.execute(text(f"SELECT id FROM {rows}")))
            with admin.begin() as conn:
                conn.execute(text(f"DROP TABLE IF EXISTS {rows}"))
                conn.execute(text(f"DROP TABLE IF EXISTS {state}"))
        finally:
            admin.dispose()
    assert in_db == [1, 3]
    assert sorted(int(v) for _, v in broker.read_committed(topic, expected=2)) == [1, 3]
    assert broker.open_partitions(topic) == {}
