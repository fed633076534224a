"""The BEGIN and state-row lock DualWriter sends PostgreSQL as one simple query
(kafka_txn.dualwrite.pg_pipeline, guarantee 4.14), its literals rendered by psycopg and
the rendered text cached on the pooled connection: it stays the same literal whatever
the body changes in the session (quoting, encoding), on connections that prepare every
statement, at the isolation level an engine's options set, and with two writers taking
turns on one pooled connection; and the connection switched to autocommit mode for it
goes back to the pool out of autocommit mode even when a signal's exception strikes
while it is switched. Real broker and PostgreSQL; Kafka is read with a read_committed
consumer, the database with SQL."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from kafka_txn.dualwrite import pg_pipeline as _pg_pipeline
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import KafkaTxnError
from kafka_txn.spark.settle import shared_engine
from kafka_txn.state import PreparedTxnState
from tests.support.adversaries import both_sides, interrupt_at_line, names_fixture
from tests.support.databases import drop_tables as _drop
from tests.support.databases import id_value_table as _events
from tests.support.databases import unique_name as _name
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary

names = names_fixture("lock")


# ---------------------------------------------------------------------------------------
# 4.14: the BEGIN and the state-row lock go as one simple query whose literals psycopg
# renders, and the rendered text is cached on the pooled connection. The body changes the
# session's quoting and encoding settings (committed with its transaction, so they stay
# on the pooled connection): standard_conforming_strings off, then client_encoding
# LATIN1. The cached text, rendered before, must still be the same literal: the writer
# finds its own row and both sides hold the same rows.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.14")
def test_postgresql_cached_lock_survives_the_body_changing_quoting_and_encoding(
    broker: Broker, postgres_jdbc: str, names: dict[str, str]
) -> None:
    """A transactional id full of quotes and backslashes, the body switching
    standard_conforming_strings and client_encoding between transactions on a pool of one
    connection: the writer always finds its own row, and both sides hold every row."""
    topic = broker.create_topic()
    events = _events(names["events"])
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc), pool_size=1, max_overflow=0)
    tid = f"lock \\' é\\\\''; -- {uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid}
    settings = [
        "SET standard_conforming_strings = off",
        "SET client_encoding = 'LATIN1'",
        "SET standard_conforming_strings = on",
        "SET client_encoding = 'UTF8'",
    ]
    try:
        events.metadata.create_all(engine)
        writer = DualWriter(conf, engine, state_table=state, mark_completed_after=None)
        try:
            writer.start()
            for i in range(len(settings) + 1):
                with writer.transaction() as tx:
                    tx.connection.execute(events.insert(), {"id": i, "value": f"v{i}"})
                    tx.produce(topic, f"v{i}".encode())
                    if i < len(settings):
                        tx.connection.exec_driver_sql(settings[i])
        finally:
            writer.close()
        with engine.connect() as conn:
            conn.exec_driver_sql("SET client_encoding = 'UTF8'")
            rows = conn.execute(
                text(f"SELECT transactional_id, prepared_txn_state FROM {state}")
            ).all()
        assert [r[0] for r in rows] == [tid]
        stored = PreparedTxnState(rows[0][1])
        assert stored.transactional_id == tid and stored.completed
        in_db, in_kafka = both_sides(broker, engine, events, topic)
        assert in_db == in_kafka == [f"v{i}" for i in range(len(settings) + 1)]
    finally:
        _drop(engine, names["events"], state)
        engine.dispose()


# ---------------------------------------------------------------------------------------
# 4.14: BEGIN and the lock as one simple query. psycopg prepares a query once it
# has run ``prepare_threshold`` times on a connection (default 5; it gives up on a query
# that turned out to hold several statements); with ``prepare_threshold=0`` it prepares
# every query at its first run, and PostgreSQL refuses to prepare "BEGIN; SELECT ...".
# Sent as two statements of a pipeline, the two would be prepared one by one by such a
# connection.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.14")
def test_postgresql_engine_preparing_every_statement_still_commits(
    broker: Broker, postgres_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    """psycopg with prepare_threshold=0 (every query prepared at its first run): the
    BEGIN and the lock, one simple query, still run, and the transaction commits."""
    topic = broker.create_topic()
    events = _events(names["events"])
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc), connect_args={"prepare_threshold": 0})
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    try:
        events.metadata.create_all(engine)
        writer = DualWriter(conf, engine, state_table=state)
        try:
            writer.start()
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


# ---------------------------------------------------------------------------------------
# 4.14: the BEGIN sent with the lock is built from the driver's settings
# (_pg_pipeline._begin_statement). The Spark sink's isolationLevel and a caller's
# engine.execution_options(isolation_level=...) set them per connection (an OptionEngine,
# as the sink's shared worker engine): the body must run at that level, and the pool
# must get the connection back at its own level.
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["SERIALIZABLE", "REPEATABLE READ"])
def test_postgresql_isolation_level_of_an_option_engine_reaches_the_begin_sent_with_the_lock(
    broker: Broker, postgres_jdbc: str, names: dict[str, str], txn_id: str, level: str
) -> None:
    """The body runs at the isolation level the engine's execution options set, and the
    pool's connection goes back at its own level."""
    state = names["state"]
    base = create_engine(jdbc_to_sqlalchemy(postgres_jdbc), pool_size=1, max_overflow=0)
    engine = shared_engine(base.execution_options(isolation_level=level))
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    seen: list[str] = []
    try:
        writer = DualWriter(conf, engine, state_table=state)
        try:
            writer.start()
            for _ in range(2):
                with writer.transaction() as tx:
                    seen.append(
                        tx.connection.exec_driver_sql(
                            "SELECT current_setting('transaction_isolation')"
                        ).scalar_one()
                    )
        finally:
            writer.close()
        with base.connect() as conn:  # the pool's one connection, back at its own level
            default = conn.exec_driver_sql(
                "SELECT current_setting('transaction_isolation')"
            ).scalar_one()
        assert seen == [level.lower()] * 2 and default == "read committed", (seen, default)
    finally:
        _drop(base, state)
        base.dispose()


# ---------------------------------------------------------------------------------------
# 4.14 / 4.4: the rendered BEGIN+lock cached on a pooled connection, with two writers (two
# transactional ids, two lock timeouts, two state tables) taking turns on a pool of one
# PostgreSQL connection, as a Python worker's kept writers share its engine: each finds
# and writes its own row, never the other's.
# ---------------------------------------------------------------------------------------


def test_postgresql_writers_taking_turns_on_one_pooled_connection_keep_their_own_rows(
    broker: Broker, postgres_jdbc: str, names: dict[str, str]
) -> None:
    """Two writers (two ids, lock timeouts and state tables) alternating on one pooled
    connection each write only their own state row."""
    topic = broker.create_topic()
    events = _events(names["events"])
    other_state = _name("lock_state")
    base = create_engine(jdbc_to_sqlalchemy(postgres_jdbc), pool_size=1, max_overflow=0)
    engine = shared_engine(base)
    ids = [f"lock-a-{uuid.uuid4().hex[:8]}", f"lock-b-{uuid.uuid4().hex[:8]}"]
    writers: list[DualWriter] = []
    try:
        events.metadata.create_all(base)
        for tid, table, timeout in zip(
            ids, [names["state"], other_state], [5.0, 30.0], strict=True
        ):
            conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid}
            writer = DualWriter(
                conf, engine, state_table=table, lock_timeout=timeout, mark_completed_after=None
            )
            writers.append(writer)
            writer.start()
        for i in range(6):
            writer = writers[i % 2]
            with writer.transaction() as tx:
                tx.connection.execute(events.insert(), {"id": i, "value": f"v{i}"})
                tx.produce(topic, f"v{i}".encode())
        for writer in writers:
            writer.close()
        for tid, table in zip(ids, [names["state"], other_state], strict=True):
            with base.connect() as conn:
                rows = conn.execute(
                    text(f"SELECT transactional_id, prepared_txn_state FROM {table}")
                ).all()
            assert [r[0] for r in rows] == [tid]
            assert PreparedTxnState(rows[0][1]).transactional_id == tid
        in_db, in_kafka = both_sides(broker, base, events, topic)
        assert in_db == in_kafka == [f"v{i}" for i in range(6)]
    finally:
        for writer in writers:
            writer.close()
        _drop(base, names["events"], names["state"], other_state)
        base.dispose()


# ---------------------------------------------------------------------------------------
# 4.14: "psycopg's autocommit flag is on only while the lock's query is sent ... the
# connection goes back to the pool out of autocommit mode however the transaction ended
# (..., an interruption right after the flag was switched on)". A signal whose handler
# raises (KeyboardInterrupt, a timeout signal) strikes _pg_pipeline.Decision.lock right
# after it switched the flag on, before the query is sent; or as it switches the flag
# back off, the query answered and the transaction open: simulated with a trace
# function raising at that line. The transaction fails; the pooled connection must come
# back with autocommit off (or be discarded), and the writer's next transaction commit
# on both sides.
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    ["cursor.execute(query, prepare=False)", "driver._autocommit = False"],
    ids=["flag_switched_on", "flag_switching_off"],
)
@pytest.mark.guarantee("4.14")
def test_postgresql_interrupt_around_the_lock_never_returns_autocommit_to_the_pool(
    broker: Broker, postgres_jdbc: str, names: dict[str, str], txn_id: str, line: str
) -> None:
    """A KeyboardInterrupt while psycopg's autocommit flag is on for the lock: the pool's
    one connection comes back with autocommit off, and the next transaction commits
    (rows and records equal); a transaction of another user of the engine that rolls
    back keeps nothing."""
    armed: list[bool] = []
    tracer = interrupt_at_line(_pg_pipeline.Decision.lock, line, armed)
    topic = broker.create_topic()
    events = _events(names["events"])
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc), pool_size=1, max_overflow=0)
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    try:
        events.metadata.create_all(engine)
        writer = DualWriter(conf, engine, state_table=state, mark_completed_after=None)
        try:
            writer.start()
            armed.append(True)
            sys.settrace(tracer)
            try:
                with pytest.raises(KeyboardInterrupt), writer.transaction() as tx:
                    tx.produce(topic, b"never")
            finally:
                sys.settrace(None)
            assert not armed  # the interruption struck where intended
            with engine.connect() as conn:  # the pool's one connection
                driver: Any = conn.connection.driver_connection
                assert driver.autocommit is False
                conn.execute(events.insert(), {"id": 99, "value": "rolled back"})
                conn.rollback()
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


# ---------------------------------------------------------------------------------------
# 4.13 / 4.14: a signal's exception striking Decision.commit() right after the pipelined
# database COMMIT was answered, before SQLAlchemy's transaction ends (simulated with a
# trace function raising at that line). 4.13: "Anything that interrupts the writer once
# the database COMMIT was sent ... leaves the transaction prepared, the writer refuses
# every later call, and the next start() commits it"; 4.14: the connection goes back to
# the pool out of autocommit mode however the transaction ended.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.13", "4.14")
def test_postgresql_interrupt_right_after_the_commit_stops_the_writer_and_resets_the_pool(
    broker: Broker, postgres_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    """A KeyboardInterrupt in Decision.commit() after PostgreSQL answered the COMMIT:
    the pooled connection is out of autocommit mode, the next call raises
    DatabaseCommitUnknownError (the writer cannot tell the COMMIT was answered), and the
    successor's start() leaves both sides equal."""
    armed: list[bool] = []
    tracer = interrupt_at_line(_pg_pipeline.Decision.commit, "self._conn.commit()", armed)
    topic = broker.create_topic()
    events = _events(names["events"])
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc), pool_size=1, max_overflow=0)
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    observed: dict[str, Any] = {}
    try:
        events.metadata.create_all(engine)
        writer = DualWriter(conf, engine, state_table=state, mark_completed_after=None)
        try:
            writer.start()
            sys.settrace(tracer)
            try:
                with pytest.raises(KeyboardInterrupt), writer.transaction() as tx:
                    tx.connection.execute(events.insert(), {"id": 1, "value": "one"})
                    tx.produce(topic, b"one")
                    armed.append(True)  # from here on: the prepare, the COMMIT
            finally:
                sys.settrace(None)
            assert not armed  # the interruption struck where intended
            with engine.connect() as conn:  # the pool's one connection (close() disposes it)
                observed["autocommit"] = conn.connection.driver_connection.autocommit  # type: ignore[union-attr]
            try:
                with writer.transaction() as tx:
                    tx.connection.execute(events.insert(), {"id": 2, "value": "two"})
                    tx.produce(topic, b"two")
                observed["next call"] = "ran"
            except KafkaTxnError as exc:
                observed["next call"] = type(exc).__name__
        finally:
            writer.close()
        successor = DualWriter(conf, engine, state_table=state)
        try:
            observed["successor"] = successor.start().value
        finally:
            successor.close()
        observed["db"], observed["kafka"] = both_sides(broker, engine, events, topic, linger=2.0)
        assert observed["autocommit"] is False, observed
        assert observed["next call"] == "DatabaseCommitUnknownError", observed
        assert observed["db"] == observed["kafka"], observed
    finally:
        _drop(engine, names["events"], state)
        engine.dispose()
