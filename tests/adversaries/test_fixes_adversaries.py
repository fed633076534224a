"""Attacks on DualWriter's session handling: the autocommit check (guarantee 4.2), the
MariaDB SET STATEMENT lock (4.8/4.9) with identifiers validate_identifier accepts, and
engines set up the ways their documentation recommends. Kafka is checked with a
read_committed consumer, the database with SQL."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text

from kafka_txn.dualwrite.writer import DualWriter, database_url
from kafka_txn.errors import ConfigurationError, KafkaTxnError
from tests.support.rig import Broker


def _tid() -> str:
    return f"fixes-adv-{uuid.uuid4().hex[:10]}"


def test_mariadb_lock_with_reserved_and_mixed_case_identifiers(
    broker: Broker, mariadb_jdbc: str
) -> None:
    """validate_identifier accepts reserved words and mixed case; the SET STATEMENT lock
    quotes them itself (identifier_preparer.quote): a commit and a body failure both
    work, and the state row under those names holds the committed state."""
    topic = broker.create_topic()
    suffix = uuid.uuid4().hex[:8]
    table = f"Select_{suffix}"
    names = dict(
        state_table=table,
        id_column="key",
        state_column="Order",
        updated_column="select",
        owner_column="Group",
    )
    engine = create_engine(database_url(mariadb_jdbc, None, None))
    tid = _tid()
    try:
        with DualWriter(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid},
            engine,
            lock_timeout=2.0,
            mark_completed_after=None,
            **names,
        ) as writer:
            with writer.transaction() as tx:
                tx.produce(topic, b"one", key=b"1")
            with pytest.raises(RuntimeError), writer.transaction() as tx:
                tx.produce(topic, b"aborted", key=b"2")
                raise RuntimeError("body fails")
            with writer.transaction() as tx:
                tx.produce(topic, b"two", key=b"3")
        assert [v for _, v in broker.read_committed(topic, 2)] == [b"one", b"two"]
        assert broker.open_partitions(topic) == {}
        with engine.connect() as conn:
            state = conn.execute(
                text(f"SELECT `Order` FROM `{table}` WHERE `key` = :t"), {"t": tid}
            ).scalar_one()
        assert state
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS `{table}`"))
        engine.dispose()


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


@pytest.mark.guarantee("4.2")
def test_mariadb_explicit_begin_over_driver_autocommit_is_accepted(
    broker: Broker, mariadb_jdbc: str
) -> None:
    """Promised (4.2, dual-write.md): only a connection where each statement would
    commit on its own is refused. Observed: PyMySQL's SERVER_STATUS_AUTOCOMMIT flag is
    the session variable, set also inside an explicit BEGIN ... COMMIT, so this engine,
    whose statements all run in a transaction (PostgreSQL accepts the same engine), is
    refused with ConfigurationError 'is in autocommit mode' on every transaction."""
    table = f"eb_{uuid.uuid4().hex[:8]}"
    engine = _explicit_begin_engine(database_url(mariadb_jdbc, None, None))
    try:
        assert _explicit_begin_run(broker, engine, table) == [1]
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()


@pytest.mark.parametrize("body_fails", [True, False])
@pytest.mark.guarantee("4.2")
def test_mariadb_body_switching_autocommit_on_is_reported(
    broker: Broker, mariadb_jdbc: str, body_fails: bool
) -> None:
    """A body that switches the session's autocommit on (SET autocommit=1, which in
    MySQL/MariaDB commits the open transaction, the state-row lock with it), then fails
    or returns. What it wrote before cannot be rolled back; the writer aborts Kafka and
    raises ConfigurationError saying so (the body's own error chained), never a silent
    divergence (guarantee 4.2; the body must leave the transaction to the writer): the
    row staying committed while Kafka aborts, with nothing said, is the failure guarded
    against."""
    topic = broker.create_topic()
    table = f"ac_{uuid.uuid4().hex[:8]}"
    engine = create_engine(database_url(mariadb_jdbc, None, None))
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} (id INT PRIMARY KEY)"))
    try:
        with (
            DualWriter(
                {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": _tid()},
                engine,
                mark_completed_after=None,
            ) as writer,
            pytest.raises(ConfigurationError, match="no longer open after its body") as raised,
            writer.transaction() as tx,
        ):
            tx.connection.execute(text(f"INSERT INTO {table} VALUES (1)"))
            tx.connection.execute(text("SET autocommit = 1"))
            tx.produce(topic, b"aborted")
            if body_fails:
                raise RuntimeError("body fails")
        assert isinstance(raised.value.__cause__, RuntimeError) is body_fails
        assert "may be committed and stay in the database" in str(raised.value)
        assert broker.open_partitions(topic) == {}
        assert broker.read_committed(topic, expected=0) == []
        with engine.connect() as conn:
            ids = [r[0] for r in conn.execute(text(f"SELECT id FROM {table}"))]
        assert ids == [1], "committed by the body's own SET autocommit = 1, as reported"
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()


def test_start_again_after_its_last_commit_failed_and_another_writer_took_over(
    broker: Broker, postgres_jdbc: str
) -> None:
    """Writer A's start() recovers, settles and initialises (its fence in Kafka), then
    its session dies before the COMMIT that releases the lock; writer B takes the id
    over (owner B, its init fences A). A's start() again (_finish_start) must not start
    a writer that no longer owns the id: it raises, A commits nothing, B commits."""
    from kafka_txn.errors import FatalError

    topic = broker.create_topic()
    tid = _tid()
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
