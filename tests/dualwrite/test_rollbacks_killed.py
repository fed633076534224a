"""A DualWriter body that catches an error after which the database rolled back the whole
transaction (SQLite's ``RAISE(ROLLBACK)``; PostgreSQL: the transaction left failed;
MariaDB: a deadlock) and goes on, and the process SIGKILLed right after, before the
writer's RollbackWatch check (guarantees 4.1, 4.2): the next writer's start() leaves
nothing of the killed transaction on either side. The same schedules without the kill
are tests/dualwrite/test_rollbacks.py's. Every outcome is checked with an independent
read_committed consumer (kafka-python, tests/support/rig.py) and direct SQL.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from tests.support import adversaries as support
from tests.support.adversaries import committed_values, jdbc_of, names_fixture, run_child, values_in
from tests.support.databases import id_value_table, unique_name
from tests.support.rig import Broker

pytestmark = [pytest.mark.broker, pytest.mark.adversary]

names = names_fixture("killed")
cleanup = support.cleanup


# ---------------------------------------------------------------------------------------
# A whole-transaction rollback caught by the body, then SIGKILL before the writer looks
# ---------------------------------------------------------------------------------------

_ROLLED_BACK_THEN_KILLED = """
import os, signal, sys
from sqlalchemy.exc import DBAPIError
from kafka_txn.dualwrite.writer import DualWriter
from tests.support.databases import id_value_table

bootstrap, tid, jdbc, state, events_name, topic, kill_at, invalid_id = sys.argv[1:9]
events = id_value_table(events_name)

def die():
    os.kill(os.getpid(), signal.SIGKILL)

armed = []  # the steps of the first transaction run through

def on_step(step):
    if armed and step == kill_at:
        die()

writer = DualWriter({"bootstrap.servers": bootstrap, "transactional.id": tid}, jdbc,
                    state_table=state, on_step=on_step)
writer.start()
with writer.transaction() as tx:  # committed on both sides
    tx.connection.execute(events.insert(), {"id": 1, "value": "kept"})
    tx.produce(topic, b"kept")
print("committed=kept", flush=True)
armed.append(True)
with writer.transaction() as tx:  # a loader skipping a bad row, as in dual-write.md
    for ident, value in ((2, "first"), (int(invalid_id), "invalid"), (3, "second")):
        try:
            tx.connection.execute(events.insert(), {"id": ident, "value": value})
        except DBAPIError as exc:
            print(f"caught={type(exc.orig).__name__}", flush=True)
            if kill_at == "caught":
                writer.producer.flush()  # the records sent so far are on the broker
                die()
            continue
        tx.produce(topic, value.encode())
    writer.producer.flush()  # every record of the body is on the broker before the kill
os._exit(3)  # not killed: the test fails
"""


def _mariadb_deadlock_child() -> str:
    """The same application on MariaDB, where the caught error is a deadlock (1213):
    another session of the child holds row 2 of a lock table and waits for row 1, which
    the body holds; the body then asks for row 2, and InnoDB picks the body's
    transaction (the other has done more work) as the victim and rolls it back whole."""
    return """
import os, signal, sys, threading, time
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from tests.support.databases import id_value_table

bootstrap, tid, jdbc, state, events_name, topic, kill_at, locks, heavy = sys.argv[1:10]
events = id_value_table(events_name)

def die():
    os.kill(os.getpid(), signal.SIGKILL)

armed = []  # the steps of the first transaction run through

def on_step(step):
    if armed and step == kill_at:
        die()

writer = DualWriter({"bootstrap.servers": bootstrap, "transactional.id": tid}, jdbc,
                    state_table=state, on_step=on_step)
writer.start()
with writer.transaction() as tx:
    tx.connection.execute(events.insert(), {"id": 1, "value": "kept"})
    tx.produce(topic, b"kept")
print("committed=kept", flush=True)
armed.append(True)
other = create_engine(jdbc_to_sqlalchemy(jdbc)).connect()
other.begin()
thread_id = other.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
other.execute(text(f"INSERT INTO {heavy} VALUES (:i)"), [{"i": i} for i in range(300)])
other.exec_driver_sql(f"SELECT id FROM {locks} WHERE id = 2 FOR UPDATE").all()
waiter = threading.Thread(
    target=lambda: other.exec_driver_sql(f"SELECT id FROM {locks} WHERE id = 1 FOR UPDATE").all(),
    daemon=True,
)
watch = create_engine(jdbc_to_sqlalchemy(jdbc))

def wait_until_waiting():
    for _ in range(600):
        with watch.connect() as conn:
            if conn.execute(text(
                "SELECT COUNT(*) FROM information_schema.innodb_trx "
                "WHERE trx_state = 'LOCK WAIT' AND trx_mysql_thread_id = :t"
            ), {"t": thread_id}).scalar_one():
                return
        time.sleep(0.05)
    os._exit(5)

with writer.transaction() as tx:
    tx.connection.execute(events.insert(), {"id": 2, "value": "first"})
    tx.produce(topic, b"first")
    tx.connection.exec_driver_sql(f"SELECT id FROM {locks} WHERE id = 1 FOR UPDATE").all()
    waiter.start()
    wait_until_waiting()
    try:
        tx.connection.exec_driver_sql(f"SELECT id FROM {locks} WHERE id = 2 FOR UPDATE").all()
    except DBAPIError as exc:
        print(f"caught={exc.orig.args[0]}", flush=True)
        if kill_at == "caught":
            writer.producer.flush()
            die()
    tx.connection.execute(events.insert(), {"id": 3, "value": "second"})
    tx.produce(topic, b"second")
    writer.producer.flush()
os._exit(3)
"""


@pytest.mark.parametrize("kill_at", ["caught", "after_send"])
@pytest.mark.parametrize("database", ["sqlite", "postgresql", "mariadb"])
def test_killed_right_after_a_caught_whole_transaction_rollback_leaves_both_sides_agreeing(
    broker: Broker,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    names: dict[str, str],
    cleanup: list[tuple[str, list[str]]],
    txn_id: str,
    database: str,
    kill_at: str,
) -> None:
    """4.1/4.2: the body catches an error after which the database rolled the whole
    transaction back (SQLite RAISE(ROLLBACK); PostgreSQL: the transaction left failed;
    MariaDB: a deadlock) and goes on; the process is SIGKILLed in the body right after
    the catch, or at on_step 'after_send' (before the writer's RollbackWatch check and
    before prepare), its records flushed to the broker. A fresh writer's start() leaves
    nothing of the killed transaction on either side (its Kafka transaction aborted, not
    left open) and the writer goes on; the rows equal what read_committed shows."""
    jdbc = jdbc_of(database, request, tmp_path)
    topic = broker.create_topic(partitions=2)
    events, state = names["events"], names["state"]
    tables = [events, state]
    cleanup.append((jdbc, tables))
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        id_value_table(events).create(engine)
        extra: list[str] = []
        if database == "sqlite":
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    f"CREATE TRIGGER {events}_check BEFORE INSERT ON {events} "
                    f"WHEN NEW.id < 0 BEGIN SELECT RAISE(ROLLBACK, 'negative id'); END"
                )
            script, extra = _ROLLED_BACK_THEN_KILLED, ["-1"]
        elif database == "postgresql":
            script, extra = _ROLLED_BACK_THEN_KILLED, ["2"]  # a duplicate key: failed
        else:
            locks, heavy = unique_name("ua_locks"), unique_name("ua_heavy")
            tables += [locks, heavy]
            with engine.begin() as conn:
                conn.exec_driver_sql(f"CREATE TABLE {locks} (id INT PRIMARY KEY) ENGINE=InnoDB")
                conn.exec_driver_sql(f"CREATE TABLE {heavy} (id INT PRIMARY KEY) ENGINE=InnoDB")
                conn.exec_driver_sql(f"INSERT INTO {locks} VALUES (1), (2)")
            script, extra = _mariadb_deadlock_child(), [locks, heavy]
    finally:
        engine.dispose()

    killed = run_child(
        script, broker.bootstrap_servers, txn_id, jdbc, state, events, topic, kill_at, *extra
    )
    assert killed.returncode == -9, killed.stdout + killed.stderr[-3000:]
    caught = {
        "sqlite": "caught=IntegrityError",
        "postgresql": "caught=UniqueViolation",
        "mariadb": "caught=1213",
    }
    assert caught[database] in killed.stdout, killed.stdout
    # The killed transaction's records reached the broker and are still open there.
    sent = sorted((v or b"").decode() for _, v in broker.read_uncommitted(topic, expected=2))
    assert "first" in sent, sent
    assert broker.open_partitions(topic) != {}

    successor = DualWriter(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id},
        jdbc, state_table=state, lock_timeout=10.0,
    )  # fmt: skip
    try:
        successor.start()
        assert broker.open_partitions(topic) == {}  # aborted by the fence, not left open
        assert values_in(jdbc, events) == ["kept"]
        assert committed_values(broker, topic, expected=1) == ["kept"]
        with successor.transaction() as tx:  # ... and the writer goes on
            tx.connection.execute(id_value_table(events).insert(), {"id": 10, "value": "next"})
            tx.produce(topic, b"next")
    finally:
        successor.close()
    assert values_in(jdbc, events) == ["kept", "next"]
    assert committed_values(broker, topic, expected=2) == ["kept", "next"]
