"""Adversarial tests of DualWriter and the Spark sink: the narrow-state-column check at
start(), the BEGIN + state-row lock sent as one simple query with client-rendered
literals cached per pooled connection, and writers sharing one engine. Real broker,
PostgreSQL, MariaDB; no mocks. Some tests guard a promise against a specific schedule
(the TINYTEXT state column, start() after a resolve() another writer overtook, psycopg
connections that prepare every statement, a state column named in other case, resolve()
of a state stored in another spelling, an interruption while autocommit is restored
after COMMIT); the other tests show an adversary the promise holds against."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from kafka_txn import (
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
)
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import ConfigurationError, KafkaTxnError
from kafka_txn.state import PreparedTxnState
from tests.support.adversaries import (
    Interrupted,
    both_sides,
    diverge,
    hand_made_state_table,
    interrupt_at_line,
    mariadb_non_strict,
    names_fixture,
    stop_after_db_commit,
)
from tests.support.databases import drop_tables as _drop
from tests.support.databases import id_value_table as _events
from tests.support.databases import sqlite_jdbc
from tests.support.databases import unique_name as _name
from tests.support.rig import Broker

names = names_fixture("rt3")


# ---------------------------------------------------------------------------------------
# 4.10: "A state column shorter than the writer's longest state (a table made by hand or
# by another tool; MySQL/MariaDB outside strict mode would cut states short) is refused
# by start() with ConfigurationError before anything is written". The check
# (_StateRow._check_state_column) reads the reflected type's ``length``: a MariaDB
# TINYTEXT column (255 bytes) reflects with no length and is taken as unbounded.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.10")
def test_mariadb_tinytext_state_column_too_short_is_refused_at_start(
    broker: Broker, mariadb_jdbc: str, names: dict[str, str]
) -> None:
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    mariadb_non_strict(engine)

    tid = "t" + uuid.uuid4().hex + "x" * 172  # 205 characters: the states pass 255 bytes
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid}
    try:
        hand_made_state_table(engine, state, "prepared_txn_state TINYTEXT NOT NULL")
        writer = DualWriter(conf, engine, state_table=state, create_state_table=False)
        try:
            longest = PreparedTxnState(
                transactional_id=tid, producer_id=1000, producer_epoch=0,
                txn_start_ms=1_700_000_000_000, cluster_id="c" * 22, timeout_ms=60000,
            ).mark_completed()  # fmt: skip
            assert len(str(longest)) > 255  # even an ordinary state does not fit
            with pytest.raises(ConfigurationError):
                writer.start()
        finally:
            writer.close()
    finally:
        _drop(engine, state)
        engine.dispose()


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
    topic = broker.create_topic()
    events = _events(names["events"])
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc), pool_size=1, max_overflow=0)
    tid = f"rt3 \\' é\\\\''; -- {uuid.uuid4().hex[:8]}"
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


@pytest.mark.guarantee("4.10")
def test_mariadb_tinytext_state_column_never_loses_a_committed_transaction(
    broker: Broker, mariadb_jdbc: str, names: dict[str, str]
) -> None:
    topic = broker.create_topic()
    events = _events(names["events"])
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    mariadb_non_strict(engine)

    tid = "t" + uuid.uuid4().hex + "x" * 172  # 205 characters
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid}
    interrupt: list[bool] = []
    outcome: Any = None
    try:
        events.metadata.create_all(engine)
        hand_made_state_table(engine, state, "prepared_txn_state TINYTEXT NOT NULL")
        try:
            first = DualWriter(
                conf, engine, state_table=state, create_state_table=False,
                on_step=stop_after_db_commit(interrupt), mark_completed_after=None,
            )  # fmt: skip
            try:
                first.start()
                with first.transaction() as tx:
                    tx.connection.execute(events.insert(), {"id": 1, "value": "one"})
                    tx.produce(topic, b"one")
                interrupt.append(True)
                with pytest.raises(Interrupted), first.transaction() as tx:
                    tx.connection.execute(events.insert(), {"id": 2, "value": "two"})
                    tx.produce(topic, b"two")
            finally:
                first.close()  # prepared, the database committed (4.13)
            second = DualWriter(conf, engine, state_table=state, create_state_table=False)
            try:
                outcome = second.start()
            finally:
                second.close()
        except (KafkaTxnError, DBAPIError) as exc:
            outcome = exc
        in_db, in_kafka = both_sides(broker, engine, events, topic, timeout=10.0)
        reported = isinstance(outcome, BaseException)
        assert reported or in_db == in_kafka, (outcome, in_db, in_kafka)
    finally:
        _drop(engine, names["events"], state)
        engine.dispose()


# ---------------------------------------------------------------------------------------
# 4.12 with a second writer of the same id (a zombie, or a second operator following the
# same advice): A's start() reports the divergence, A.resolve() accepts it (the row holds
# it), then B does the same and completes the documented way out first: resolve(),
# start(), the re-send committed. A then calls start() as documented and re-sends the
# records in its first transaction. resolve() refuses a state the row no longer holds;
# start() after it must not go on as if A's resolution still applied.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.12")
def test_two_writers_resolving_one_divergence_resend_it_once(
    broker: Broker, tmp_path: Any, names: dict[str, str], txn_id: str
) -> None:
    topic = broker.create_topic()
    jdbc = sqlite_jdbc(tmp_path)
    events = _events(names["events"])
    state = names["state"]
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    unsettled = (TransactionDivergedError, TransactionOutcomeUnknowableError)
    diverge(conf, jdbc, state, topic, events)
    a = DualWriter(conf, jdbc, state_table=state)
    b = DualWriter(conf, jdbc, state_table=state)
    reported: Any = None
    try:
        with pytest.raises(unsettled) as a_error:
            a.start()
        a.resolve(a_error.value.stored_state)
        with pytest.raises(unsettled) as b_error:
            b.start()
        b.resolve(b_error.value.stored_state)
        b.start()
        with b.transaction() as tx:  # B re-sends the missing record
            tx.produce(topic, b"row-1")
        b.close()
        try:
            a.start()
            with a.transaction() as tx:  # A, as documented, re-sends it too
                tx.produce(topic, b"row-1")
        except KafkaTxnError as exc:
            reported = exc
        in_db, in_kafka = both_sides(broker, a.engine, events, topic, linger=2.0)
        assert in_db == in_kafka, (reported, in_db, in_kafka)
    finally:
        b.close()
        a.close()


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


@pytest.mark.guarantee("4.10")
def test_mariadb_state_column_spelled_in_capitals_is_checked_at_start(
    broker: Broker, mariadb_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    mariadb_non_strict(engine)

    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    try:
        hand_made_state_table(engine, state, "PREPARED_TXN_STATE VARCHAR(64) NOT NULL")
        writer = DualWriter(conf, engine, state_table=state, create_state_table=False)
        try:
            with pytest.raises(ConfigurationError):
                writer.start()
        finally:
            writer.close()
    finally:
        _drop(engine, state)
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
    from kafka_txn.spark.settle import shared_engine

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
# 4.12: "Every start() raises it again until it is resolved: writer.resolve(
# error.stored_state) (refused for a state the row no longer holds)". The error's
# stored_state is the state as kafka-txn serializes it; the row may hold the same state
# written another way that parses to it: a key from a newer kafka-txn (state.py: "a reader
# ignores keys it does not know", KIP-915), a percent-encoding kafka-txn would not write.
# resolve() compares the row's text with the serialized form and refuses: the row still
# holds that very state, nobody moved on, and the documented way out is closed for good.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.12")
def test_resolve_accepts_the_reported_state_written_with_a_newer_key(
    broker: Broker, tmp_path: Any, names: dict[str, str], txn_id: str
) -> None:
    topic = broker.create_topic()
    jdbc = sqlite_jdbc(tmp_path)
    events = _events(names["events"])
    state = names["state"]
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    unsettled = (TransactionDivergedError, TransactionOutcomeUnknowableError)
    diverge(conf, jdbc, state, topic, events)
    writer = DualWriter(conf, jdbc, state_table=state)
    try:
        with writer.engine.begin() as conn:  # as a newer kafka-txn would have written it
            conn.execute(
                text(f"UPDATE {state} SET prepared_txn_state = prepared_txn_state || ';next=1'")
            )
        with pytest.raises(unsettled) as error:
            writer.start()
        writer.resolve(error.value.stored_state)
        writer.start()
        with writer.transaction() as tx:  # the documented re-send
            tx.produce(topic, b"row-1")
        in_db, in_kafka = both_sides(broker, writer.engine, events, topic, linger=2.0)
        assert in_db == in_kafka == ["row-1"]
    finally:
        writer.close()


# ---------------------------------------------------------------------------------------
# 4.14 / 4.4: the rendered BEGIN+lock cached on a pooled connection, with two writers (two
# transactional ids, two lock timeouts, two state tables) taking turns on a pool of one
# PostgreSQL connection, as a Python worker's kept writers share its engine: each finds
# and writes its own row, never the other's.
# ---------------------------------------------------------------------------------------


def test_postgresql_writers_taking_turns_on_one_pooled_connection_keep_their_own_rows(
    broker: Broker, postgres_jdbc: str, names: dict[str, str]
) -> None:
    from kafka_txn.spark.settle import shared_engine

    topic = broker.create_topic()
    events = _events(names["events"])
    other_state = _name("rt3_state")
    base = create_engine(jdbc_to_sqlalchemy(postgres_jdbc), pool_size=1, max_overflow=0)
    engine = shared_engine(base)
    ids = [f"rt3-a-{uuid.uuid4().hex[:8]}", f"rt3-b-{uuid.uuid4().hex[:8]}"]
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
# 4.2 with writers sharing one engine (a Python worker's kept writers): each
# writer's RollbackWatch listens on the same engine. Writer B's body catches an error
# after which SQLite rolled the whole transaction back (a trigger's RAISE(ROLLBACK)) and
# goes on; writer A, registered on the same engine and run just before on the same
# pooled connection, must neither take that error for its own nor hide it from B.
# ---------------------------------------------------------------------------------------


def test_sqlite_whole_rollback_caught_by_one_of_two_writers_sharing_an_engine(
    broker: Broker, tmp_path: Any, names: dict[str, str]
) -> None:
    from kafka_txn.errors import TransactionAbortableError
    from kafka_txn.spark.settle import shared_engine

    topic = broker.create_topic()
    events = _events(names["events"])
    base = create_engine(f"sqlite:///{tmp_path / 'shared.sqlite'}", pool_size=1, max_overflow=0)
    engine = shared_engine(base)
    events.metadata.create_all(base)
    with base.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TRIGGER no_bad BEFORE INSERT ON {names['events']} "
            "WHEN NEW.value = 'bad' BEGIN SELECT RAISE(ROLLBACK, 'bad row'); END"
        )
    ids = [f"rt3-a-{uuid.uuid4().hex[:8]}", f"rt3-b-{uuid.uuid4().hex[:8]}"]
    a, b = (
        DualWriter(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid},
            engine,
            state_table=names["state"],
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


# ---------------------------------------------------------------------------------------
# 4.14: "the connection it switches to autocommit mode for the lock goes back to the pool
# out of autocommit mode however the transaction ended". A signal whose handler raises
# (KeyboardInterrupt, a timeout signal) strikes right after _pg_pipeline._hook switched
# psycopg's autocommit on and before it noted that it did (pipeline.autocommit_on):
# simulated with a trace function raising at that line. The transaction fails; the pooled
# connection must come back with autocommit off (or be discarded).
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.14")
def test_postgresql_interrupt_right_after_autocommit_on_never_returns_it_to_the_pool(
    broker: Broker, postgres_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    import sys

    from kafka_txn.dualwrite import pg_pipeline as _pg_pipeline

    armed: list[bool] = []
    tracer = interrupt_at_line(_pg_pipeline._hook, "pipeline.autocommit_on = True", armed)
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc), pool_size=1, max_overflow=0)
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    try:
        writer = DualWriter(conf, engine, state_table=state)
        try:
            writer.start()
            armed.append(True)
            sys.settrace(tracer)
            try:
                with pytest.raises(KeyboardInterrupt), writer.transaction() as tx:
                    tx.produce(broker.create_topic(), b"never")
            finally:
                sys.settrace(None)
            assert not armed  # the interruption struck where intended
            with engine.connect() as conn:  # the pool's one connection (close() disposes it)
                driver: Any = conn.connection.driver_connection
                assert driver.autocommit is False
        finally:
            writer.close()
    finally:
        _drop(engine, state)
        engine.dispose()


# ---------------------------------------------------------------------------------------
# 4.13 / 4.14: a signal's exception striking Decision.finish() after the database COMMIT,
# between clearing its autocommit note and switching psycopg's autocommit back off
# (simulated with a trace function raising at that line). 4.13: "Anything that
# interrupts the writer once the database COMMIT was sent ... leaves the transaction
# prepared, the writer refuses every later call, and the next start() commits it"; 4.14:
# the connection goes back to the pool out of autocommit mode however the transaction
# ended.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.14")
def test_postgresql_interrupt_in_finish_after_the_commit_stops_the_writer_and_resets_the_pool(
    broker: Broker, postgres_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    import sys

    from kafka_txn.dualwrite import pg_pipeline as _pg_pipeline

    armed: list[bool] = []
    tracer = interrupt_at_line(
        _pg_pipeline.Decision.finish, "driver_connection.autocommit = False", armed
    )
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
                    armed.append(True)  # from here on: the prepare, the COMMIT, finish()
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
        assert observed["next call"] == "TransactionInDoubtError", observed
        assert observed["db"] == observed["kafka"], observed
    finally:
        _drop(engine, names["events"], state)
        engine.dispose()
