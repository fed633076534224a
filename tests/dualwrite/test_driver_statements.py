"""DualWriter's own statements on PostgreSQL with psycopg 3 run on the driver connection
(kafka_txn.dualwrite.pg_pipeline): their SQL is what SQLAlchemy compiles for the
dialect, their errors take SQLAlchemy's own error path (a ``DBAPIError``, the engine's
``handle_error`` listeners called, a lost connection invalidated), and the caller's
statements still go through SQLAlchemy's execution. Real broker and PostgreSQL; Kafka is
read with a read_committed consumer, the database with SQL."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import ExceptionContext

from kafka_txn.dualwrite import pg_pipeline
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import TransactionAbortableError
from tests.support.adversaries import both_sides, names_fixture
from tests.support.databases import drop_tables as _drop
from tests.support.databases import id_value_table as _events
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary

names = names_fixture("drv")


def test_the_state_write_takes_the_parameters_the_writer_passes(postgres_jdbc: str) -> None:
    """The state write's compiled SQL names exactly the parameters ``write()`` passes
    (a name SQLAlchemy escaped or added would be missing at execution), and the lock's
    are bound at construction."""
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    try:
        conf = {"bootstrap.servers": "127.0.0.1:9", "transactional.id": "driver-sql"}
        writer = DualWriter(conf, engine, lock_timeout=2.5)
        try:
            statements = writer._row.driver
            assert statements is not None  # psycopg 3 with pipeline mode
            assert statements.write_params == {"tid", "state", "xid"}
            assert statements.lock_params["tid"] == "driver-sql"
            assert statements.lock_params["lock_ms"] == "2500"
            assert "FOR UPDATE" in statements.lock and "txid_current()" in statements.lock
        finally:
            writer.close()
    finally:
        engine.dispose()


@pytest.mark.guarantee("4.14")
def test_a_lock_wait_running_out_goes_through_sqlalchemys_error_path(
    broker: Broker, postgres_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    """Another session holds the state row past lock_timeout: the engine's handle_error
    listener sees the lock sent with BEGIN fail with PostgreSQL's 55P03, the writer
    raises its lock-timeout error, and its next transaction commits on both sides."""
    topic = broker.create_topic()
    events = _events(names["events"])
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    seen: list[tuple[str, str, bool]] = []

    @event.listens_for(engine, "handle_error")
    def record(ctx: ExceptionContext) -> None:
        code = getattr(ctx.original_exception, "sqlstate", "")
        seen.append((str(ctx.statement), str(code), ctx.is_disconnect))

    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    try:
        events.metadata.create_all(engine)
        writer = DualWriter(conf, engine, state_table=state, lock_timeout=0.5)
        try:
            writer.start()
            holder = engine.connect()
            holder.execute(text(f"SELECT * FROM {state} FOR UPDATE"))
            try:
                with (
                    pytest.raises(TransactionAbortableError, match=r"lock_timeout=0\.5s"),
                    writer.transaction() as tx,
                ):
                    tx.produce(topic, b"never")
            finally:
                holder.rollback()
                holder.close()
            assert len(seen) == 1
            statement, code, lost = seen[0]
            assert statement.startswith("BEGIN") and "FOR UPDATE" in statement
            assert code == "55P03" and not lost
            with writer.transaction() as tx:
                tx.connection.execute(events.insert(), {"id": 1, "value": "one"})
                tx.produce(topic, b"one")
        finally:
            writer.close()
        in_db, in_kafka = both_sides(broker, engine, events, topic, expected=1)
        assert in_db == in_kafka == ["one"]
    finally:
        _drop(engine, names["events"], state)
        engine.dispose()


@pytest.mark.guarantee("4.14")
def test_the_callers_statements_still_go_through_sqlalchemys_execution(
    broker: Broker, postgres_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    """before_cursor_execute listeners see every statement of the body, on the
    transaction's own connection, and none of the writer's state-row statements; the
    transaction commits on both sides."""
    topic = broker.create_topic()
    events = _events(names["events"])
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    seen: list[str] = []
    body_threads: set[int] = set()

    def record(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if threading.get_ident() in body_threads:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    try:
        events.metadata.create_all(engine)
        writer = DualWriter(conf, engine, state_table=state, mark_completed_after=None)
        try:
            writer.start()
            body_threads.add(threading.get_ident())
            with writer.transaction() as tx:
                tx.connection.execute(events.insert(), {"id": 1, "value": "one"})
                tx.connection.execute(text("SELECT 1"))
                tx.produce(topic, b"one")
            body_threads.clear()
        finally:
            writer.close()
        assert [s.split(None, 1)[0] for s in seen] == ["INSERT", "SELECT"]
        assert not any(state in s for s in seen)
        in_db, in_kafka = both_sides(broker, engine, events, topic, expected=1)
        assert in_db == in_kafka == ["one"]
    finally:
        _drop(engine, names["events"], state)
        engine.dispose()


def test_sqlalchemy_without_its_error_path_runs_the_statements_one_by_one(
    postgres_jdbc: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SQLAlchemy without ``Connection._handle_dbapi_exception`` (which the driver
    statements' errors need): the writer's statements go through SQLAlchemy."""
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    try:
        assert pg_pipeline.pipelining(engine)
        monkeypatch.delattr("sqlalchemy.engine.Connection._handle_dbapi_exception")
        assert not pg_pipeline.pipelining(engine)
    finally:
        engine.dispose()


def test_an_engine_translating_schemas_runs_the_statements_one_by_one(postgres_jdbc: str) -> None:
    """An engine with a schema_translate_map (applied by SQLAlchemy at execution): the
    writer's statements go through SQLAlchemy, so that they name the same table as
    start()'s."""
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    try:
        translated = engine.execution_options(schema_translate_map={None: "public"})
        assert pg_pipeline.pipelining(engine)
        assert not pg_pipeline.pipelining(translated)
    finally:
        engine.dispose()
