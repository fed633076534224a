"""The documented way out of a divergence (guarantee 4.12, docs/guide/dual-write.md's
error table, DualWriter.resolve()): "call writer.resolve(error.stored_state), then
start(), and re-send those rows in the first transaction", against the schedules that
break it: two writers of one id following it at once, a state row written by a newer
kafka-txn, and a process killed after resolve() (before the re-send, or between the
re-send's database and Kafka commits). Whatever happens, the rows the database holds
are in Kafka once, or the next start() reports the divergence again. Real broker,
PostgreSQL, MariaDB and SQLite, processes killed with SIGKILL; Kafka is read with a
read_committed consumer, the database with SQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from kafka_txn import (
    TransactionDivergedError,
    TransactionOutcome,
    TransactionOutcomeUnknowableError,
)
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import KafkaTxnError
from tests.support import adversaries as support
from tests.support.adversaries import (
    both_sides,
    committed_values,
    diverge,
    jdbc_of,
    names_fixture,
    run_child,
    values_in,
)
from tests.support.databases import id_value_table, sorted_values, sqlite_jdbc
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary

names = names_fixture("resolve")
cleanup = support.cleanup

_UNSETTLED = (TransactionDivergedError, TransactionOutcomeUnknowableError)


def _state_row(engine: Engine, state_table: str, txn_id: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text(f"SELECT prepared_txn_state FROM {state_table} WHERE transactional_id = :t"),
                {"t": txn_id},
            ).scalar_one()
        )


# ---------------------------------------------------------------------------------------
# A second writer of the same id (a zombie, or a second operator following the same
# advice): A's start() reports the divergence, A.resolve() accepts it (the row holds it),
# then B does the same and completes the documented way out first: resolve(), start(),
# the re-send committed. A then calls start() as documented and re-sends the records in
# its first transaction. resolve() refuses a state the row no longer holds; start() after
# it must not go on as if A's resolution still applied.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.12")
def test_two_writers_resolving_one_divergence_resend_it_once(
    broker: Broker, tmp_path: Any, names: dict[str, str], txn_id: str
) -> None:
    """Two writers resolve the same divergence and both re-send: the database and Kafka
    end up holding the same rows, or A's second start() raises."""
    topic = broker.create_topic()
    jdbc = sqlite_jdbc(tmp_path)
    events = id_value_table(names["events"])
    state = names["state"]
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    diverge(conf, jdbc, state, topic, events)
    a = DualWriter(conf, jdbc, state_table=state)
    b = DualWriter(conf, jdbc, state_table=state)
    reported: Any = None
    try:
        with pytest.raises(_UNSETTLED) as a_error:
            a.start()
        a.resolve(a_error.value.stored_state)
        with pytest.raises(_UNSETTLED) as b_error:
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
# "Every start() raises it again until it is resolved: writer.resolve(
# error.stored_state) (refused for a state the row no longer holds)". The error's
# stored_state is the state as kafka-txn serializes it; the row may hold the same state
# written another way that parses to it: a key from a newer kafka-txn (state.py: "a reader
# ignores keys it does not know", KIP-915). resolve() must take it: the row still holds
# that very state and nobody moved on, so refusing it would close the way out for good.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.12")
def test_resolve_accepts_the_reported_state_written_with_a_newer_key(
    broker: Broker, tmp_path: Any, names: dict[str, str], txn_id: str
) -> None:
    """A diverged state row carrying a key only a newer kafka-txn writes is resolved, and
    the re-send reaches Kafka once."""
    topic = broker.create_topic()
    jdbc = sqlite_jdbc(tmp_path)
    events = id_value_table(names["events"])
    state = names["state"]
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    diverge(conf, jdbc, state, topic, events)
    writer = DualWriter(conf, jdbc, state_table=state)
    try:
        with writer.engine.begin() as conn:  # as a newer kafka-txn would have written it
            conn.execute(
                text(f"UPDATE {state} SET prepared_txn_state = prepared_txn_state || ';next=1'")
            )
        with pytest.raises(_UNSETTLED) as error:
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
# A crash between resolve() and the re-send. resolve() stores the state completed; a
# process killed after it and before that first transaction commits (the failure model:
# SIGKILL between any two network calls) would leave a row that says "settled" for
# records that are in no topic, and the next start() must not go on without a word
# (4.12: "never skipped silently"). The CLI's own advice (operations.md) orders it the
# other way round and warns: "Updating the row first would lose those records."
# ---------------------------------------------------------------------------------------

_FOLLOW_THE_DOCS_THEN_DIE = """
import os, sys
from kafka_txn import TransactionDivergedError, TransactionOutcomeUnknowableError
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import KafkaTxnError
conf = {"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2]}
writer = DualWriter(conf, sys.argv[3], state_table=sys.argv[4])
try:
    writer.start()
except (TransactionDivergedError, TransactionOutcomeUnknowableError) as exc:
    # The rows of exc.stored_state that a read_committed consumer does not show: all.
    writer.resolve(exc.stored_state)  # as dual-write.md says: resolve, then start(),
    writer.start()  # then re-send the rows in the first transaction ...
    os._exit(9)  # ... which this process never gets to (killed)
os._exit(3)  # start() did not report it
"""


@pytest.mark.guarantee("4.12")
def test_crash_between_resolve_and_the_resend_loses_nothing(
    broker: Broker, tmp_path: Any, names: dict[str, str], txn_id: str
) -> None:
    """A process that resolves, starts and dies before its re-send: the next start()
    reports the divergence again, or the database and Kafka hold the same rows."""
    topic = broker.create_topic()
    jdbc = sqlite_jdbc(tmp_path)
    events = id_value_table(names["events"])
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    # The database commits, the writer stops: the transaction stays prepared (4.13). Kafka
    # aborts what the database committed: another producer initialises the id (the local
    # broker then shows the id Empty under a later epoch: recovery says unknowable; a
    # coordinator showing CompleteAbort would say diverged; the advice is the same).
    diverge(conf, jdbc, names["state"], topic, events)
    done = subprocess.run(
        [sys.executable, "-c", _FOLLOW_THE_DOCS_THEN_DIE, broker.bootstrap_servers, txn_id,
         jdbc, names["state"]],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 9, done.stderr[-2000:]
    last = DualWriter(conf, jdbc, state_table=names["state"])
    try:
        try:
            last.start()
            reported = False
        except _UNSETTLED:
            reported = True
        in_db = sorted_values(last.engine, events)
        in_kafka = [v.decode() for _, v in broker.read_committed(topic, expected=0, linger=2.0)]
        assert reported or in_db == in_kafka, (in_db, in_kafka)
    finally:
        last.close()


# ---------------------------------------------------------------------------------------
# resolve(), then the re-send killed between its database and its Kafka commit
# ---------------------------------------------------------------------------------------

_RESOLVE_THEN_KILLED_AFTER_DB_COMMIT = """
import os, signal, sys
from kafka_txn import TransactionDivergedError, TransactionOutcomeUnknowableError
from kafka_txn.dualwrite.writer import DualWriter
from tests.support.databases import id_value_table

bootstrap, tid, jdbc, state, events_name, topic = sys.argv[1:7]
events = id_value_table(events_name)

def on_step(step):
    if step == "after_db_commit":
        os.kill(os.getpid(), signal.SIGKILL)

writer = DualWriter({"bootstrap.servers": bootstrap, "transactional.id": tid}, jdbc,
                    state_table=state, on_step=on_step)
try:
    writer.start()
except (TransactionDivergedError, TransactionOutcomeUnknowableError) as exc:
    print(f"reported={type(exc).__name__}", flush=True)
    writer.resolve(exc.stored_state)  # dual-write.md: resolve, start(), re-send first
    writer.start()
    with writer.transaction() as tx:
        tx.produce(topic, b"lost")  # the row is in the database; Kafka lost the record
        tx.connection.execute(events.insert(), {"id": 2, "value": "with-resend"})
        tx.produce(topic, b"with-resend")
os._exit(3)  # not reported, or not killed: the test fails
"""


def _diverge(
    broker: Broker, jdbc: str, txn_id: str, topic: str, events: str, state_table: str
) -> str:
    """The database commits the row ``lost`` with the transaction's state; Kafka then
    aborts that transaction (as after transaction.timeout.ms). Returns the stored state."""
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    writer = DualWriter(conf, jdbc, state_table=state_table, mark_completed_after=None)
    try:
        id_value_table(events).create(writer.engine)
        writer.start()
        writer.producer.begin_transaction()
        writer.producer.produce(topic, b"lost")
        prepared = writer.producer.prepare_transaction()
        with writer.engine.begin() as conn:
            conn.execute(id_value_table(events).insert(), {"id": 1, "value": "lost"})
            conn.execute(
                writer.state_table.update()
                .where(writer.state_table.c.transactional_id == txn_id)
                .values(prepared_txn_state=str(prepared))
            )
        writer.producer.abort_transaction()
    finally:
        writer.close()
    return str(prepared)


@pytest.mark.parametrize("database", ["sqlite", "postgresql", "mariadb"])
def test_resend_after_resolve_killed_between_its_two_commits_is_committed_once(
    broker: Broker,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    names: dict[str, str],
    cleanup: list[tuple[str, list[str]]],
    txn_id: str,
    database: str,
) -> None:
    """4.1/4.12: after TransactionDivergedError the user calls resolve(), start(), and
    re-sends the lost record (plus a new row and record) in the first transaction; the
    process is SIGKILLed at on_step 'after_db_commit' of that re-send. A fresh writer's
    start() commits the re-send (COMMITTED), never reports the old divergence again, and
    the records are visible exactly once, the rows there exactly once; the writer goes
    on, and a later start() reports nothing either."""
    jdbc = jdbc_of(database, request, tmp_path)
    topic = broker.create_topic(partitions=2)
    events, state = names["events"], names["state"]
    cleanup.append((jdbc, [events, state]))
    diverged = _diverge(broker, jdbc, txn_id, topic, events, state)

    killed = run_child(
        _RESOLVE_THEN_KILLED_AFTER_DB_COMMIT,
        broker.bootstrap_servers, txn_id, jdbc, state, events, topic,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stdout + killed.stderr[-3000:]
    assert "reported=TransactionDivergedError" in killed.stdout, killed.stdout
    # The database committed the re-send (its state replaced the diverged one) ...
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        stored = _state_row(engine, state, txn_id)
    finally:
        engine.dispose()
    assert stored not in (diverged, "") and not stored.endswith(";done=1"), stored
    assert values_in(jdbc, events) == ["lost", "with-resend"]
    # ... and Kafka holds it prepared, not yet visible.
    assert broker.open_partitions(topic) != {}

    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    successor = DualWriter(conf, jdbc, state_table=state)
    try:
        assert successor.start() is TransactionOutcome.COMMITTED
        assert committed_values(broker, topic, expected=2) == ["lost", "with-resend"]
        with successor.transaction() as tx:
            tx.connection.execute(id_value_table(events).insert(), {"id": 3, "value": "next"})
            tx.produce(topic, b"next")
    finally:
        successor.close()
    later = DualWriter(conf, jdbc, state_table=state)
    try:
        try:
            outcome: Any = later.start()
        except _UNSETTLED as exc:
            outcome = exc
        assert outcome in (
            TransactionOutcome.ALREADY_COMMITTED,
            TransactionOutcome.NOTHING_TO_COMMIT,
        )
    finally:
        later.close()
    assert values_in(jdbc, events) == ["lost", "next", "with-resend"]
    assert committed_values(broker, topic, expected=3) == ["lost", "next", "with-resend"]
