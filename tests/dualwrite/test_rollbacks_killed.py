"""Three adversary schedules the other tests did not cover, on real parts: the session's
broker, PostgreSQL, MariaDB and SQLite, processes killed with SIGKILL. Every outcome is
checked with an independent read_committed consumer (kafka-python, tests/support/rig.py) and
direct SQL. A strict xfail would mark a documented promise that the schedule breaks.

1. The body of a ``DualWriter`` transaction catches an error after which the database
   rolled back the whole transaction (SQLite's ``RAISE(ROLLBACK)``; PostgreSQL: left
   failed; MariaDB: a deadlock) and the process is SIGKILLed right after, before the
   writer's RollbackWatch check (guarantees 4.1, 4.2).
2. ``resolve()`` after a divergence, then the re-send killed between its database commit
   and its Kafka commit (guarantees 4.1, 4.12, docs/guide/dual-write.md's error table).
3. EndTxn(commit) applied by the coordinator, then answered with REQUEST_TIMED_OUT (the
   commit's outcome unknown: ``FatalError``), while a successor with the same
   transactional id initialises before that answer arrives (guarantees 1.3, 1.4, 6.1).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tenacity
from confluent_kafka import Consumer, KafkaError, TopicPartition
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from kafka_txn import (
    FatalError,
    TransactionalProducer,
    TransactionDivergedError,
    TransactionOutcome,
    TransactionOutcomeUnknowableError,
)
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.eos import ExactlyOnceProcessor
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy, Request
from tests.support.databases import (
    drop_tables,
    id_value_table,
    sorted_values,
    sqlite_jdbc,
    unique_name,
)
from tests.support.rig import Broker

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.broker


def _jdbc(database: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if database == "sqlite":
        return sqlite_jdbc(tmp_path)
    fixture = "mariadb_jdbc" if database == "mariadb" else "postgres_jdbc"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def names() -> Iterator[dict[str, str]]:
    yield {"events": unique_name("ua_events"), "state": unique_name("ua_state")}


@pytest.fixture
def cleanup() -> Iterator[list[tuple[str, list[str]]]]:
    """(jdbc, tables) to drop at the end of the test."""
    todo: list[tuple[str, list[str]]] = []
    yield todo
    for jdbc, tables in todo:
        engine = create_engine(jdbc_to_sqlalchemy(jdbc))
        try:
            drop_tables(engine, *tables)
        finally:
            engine.dispose()


def _child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _kafka(broker: Broker, topic: str, expected: int) -> list[str]:
    return sorted((v or b"").decode() for _, v in broker.read_committed(topic, expected))


def _rows(jdbc: str, table: str) -> list[str]:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        return sorted_values(engine, id_value_table(table))
    finally:
        engine.dispose()


def _state_row(engine: Engine, state_table: str, txn_id: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text(f"SELECT prepared_txn_state FROM {state_table} WHERE transactional_id = :t"),
                {"t": txn_id},
            ).scalar_one()
        )


# ---------------------------------------------------------------------------------------
# 1. A whole-transaction rollback caught by the body, then SIGKILL before the writer looks
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
    jdbc = _jdbc(database, request, tmp_path)
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

    killed = _child(
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
        assert _rows(jdbc, events) == ["kept"]
        assert _kafka(broker, topic, expected=1) == ["kept"]
        with successor.transaction() as tx:  # ... and the writer goes on
            tx.connection.execute(id_value_table(events).insert(), {"id": 10, "value": "next"})
            tx.produce(topic, b"next")
    finally:
        successor.close()
    assert _rows(jdbc, events) == ["kept", "next"]
    assert _kafka(broker, topic, expected=2) == ["kept", "next"]


# ---------------------------------------------------------------------------------------
# 2. resolve(), then the re-send killed between its database and its Kafka commit
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
    jdbc = _jdbc(database, request, tmp_path)
    topic = broker.create_topic(partitions=2)
    events, state = names["events"], names["state"]
    cleanup.append((jdbc, [events, state]))
    diverged = _diverge(broker, jdbc, txn_id, topic, events, state)

    killed = _child(
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
    assert _rows(jdbc, events) == ["lost", "with-resend"]
    # ... and Kafka holds it prepared, not yet visible.
    assert broker.open_partitions(topic) != {}

    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    successor = DualWriter(conf, jdbc, state_table=state)
    try:
        assert successor.start() is TransactionOutcome.COMMITTED
        assert _kafka(broker, topic, expected=2) == ["lost", "with-resend"]
        with successor.transaction() as tx:
            tx.connection.execute(id_value_table(events).insert(), {"id": 3, "value": "next"})
            tx.produce(topic, b"next")
    finally:
        successor.close()
    later = DualWriter(conf, jdbc, state_table=state)
    try:
        try:
            outcome: Any = later.start()
        except (TransactionDivergedError, TransactionOutcomeUnknowableError) as exc:
            outcome = exc
        assert outcome in (
            TransactionOutcome.ALREADY_COMMITTED,
            TransactionOutcome.NOTHING_TO_COMMIT,
        )
    finally:
        later.close()
    assert _rows(jdbc, events) == ["lost", "next", "with-resend"]
    assert _kafka(broker, topic, expected=3) == ["lost", "next", "with-resend"]


# ---------------------------------------------------------------------------------------
# 3. EndTxn(commit) applied, answered REQUEST_TIMED_OUT, a successor initialising meanwhile
# ---------------------------------------------------------------------------------------


def _successor_initialises_before_the_answer(
    broker: Broker, txn_id: str, started: list[TransactionalProducer], errors: list[BaseException]
) -> Any:
    """A Fail rule's edit: runs once the broker has answered the forwarded EndTxn(commit)
    (the coordinator applied it) and before the proxy hands the made-up error to the
    client. A successor with the same transactional id, talking to the broker directly,
    initialises meanwhile (fencing the first producer); the first gets its answer only
    once that init returned."""

    def edit(_request: Request, _response: Any) -> None:
        successor = TransactionalProducer(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id},
            operation_timeout=20,
        )
        started.append(successor)
        try:
            successor.init_transactions()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    return edit


def test_unknown_commit_outcome_with_a_successor_initialising_meanwhile_commits_once(
    broker: Broker, txn_id: str
) -> None:
    """1.3/1.4: the coordinator applied EndTxn(commit) and the answer is lost
    (REQUEST_TIMED_OUT); before it reaches the producer, a successor with the same
    transactional id initialises. The first producer's commit raises FatalError (outcome
    unknown, never CommitFailedException); as a zombie it then tries to abort and is
    closed, while the successor's own transaction is open: it sends no EndTxn(abort)
    (the proxy counts one EndTxn in all), the successor's transaction commits, and the
    records of both are visible exactly once; nothing the coordinator committed is
    aborted."""
    topic = broker.create_topic(partitions=2)
    started: list[TransactionalProducer] = []
    errors: list[BaseException] = []
    with KafkaProxy(broker.bootstrap_servers) as proxy:
        zombie = TransactionalProducer(
            {"bootstrap.servers": proxy.bootstrap_servers, "transactional.id": txn_id},
            operation_timeout=20,
        )
        try:
            zombie.init_transactions()
            lost = proxy.fail(
                ApiKey.END_TXN, KafkaError.REQUEST_TIMED_OUT, forward=True, times=1,
                edit=_successor_initialises_before_the_answer(broker, txn_id, started, errors),
            )  # fmt: skip
            zombie.begin_transaction()
            zombie.produce(topic, b"first-1", partition=0)
            zombie.produce(topic, b"first-2", partition=1)
            with pytest.raises(FatalError, match="whether it committed is unknown"):
                zombie.commit_transaction()
            assert lost.hits == 1
            assert not errors, errors
            (successor,) = started
            successor.begin_transaction()
            successor.produce(topic, b"successor-1", partition=0)
            successor.produce(topic, b"successor-2", partition=1)
            successor.flush()
            with pytest.raises(FatalError):  # the zombie acts while the successor's is open
                zombie.abort_transaction()
        finally:
            zombie.close(timeout=5)
        assert proxy.count(ApiKey.END_TXN) == 1  # the commit only: no abort ever sent
    try:
        successor.commit_transaction()
        with successor.transaction():
            successor.produce(topic, b"successor-3")
    finally:
        for producer in started:
            producer.close(timeout=5)
    assert _kafka(broker, topic, expected=5) == [
        "first-1", "first-2", "successor-1", "successor-2", "successor-3",
    ]  # fmt: skip
    assert broker.open_partitions(topic) == {}


def _seed(broker: Broker, topic: str, values: list[bytes]) -> None:
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
    with TransactionalProducer(conf) as producer:
        producer.init_transactions()
        with producer.transaction():
            for value in values:
                producer.produce(topic, value, partition=0)


def _committed_offset(broker: Broker, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def test_processor_with_unknown_commit_outcome_and_a_successor_initialising_meanwhile(
    broker: Broker, txn_id: str
) -> None:
    """6.1/6.7 with the unknown EndTxn(commit) outcome of schedule 3: the coordinator
    applied the processor's commit (outputs and offsets), and before the lost answer
    reaches it, a successor's producer with the same transactional id initialises.
    run() stops with FatalError (outcome unknown) instead of aborting and writing the
    batch again; the group's offsets moved with the committed transaction; a successor
    ExactlyOnceProcessor with the same transactional id and group resumes from them:
    every input is in the output once, the later input too."""
    source, sink = broker.create_topic(1), broker.create_topic(1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    values = [b"a", b"b", b"c"]
    _seed(broker, source, values)
    started: list[TransactionalProducer] = []
    errors: list[BaseException] = []
    processed: list[bytes] = []
    lock = threading.Lock()

    def process(record: Any) -> list[tuple[str, bytes]]:
        with lock:
            processed.append(record.value())
        return [(sink, b"out-" + record.value())]

    def processor(bootstrap: str) -> ExactlyOnceProcessor:
        return ExactlyOnceProcessor(
            {"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
             "session.timeout.ms": 6000},
            {"bootstrap.servers": bootstrap, "transactional.id": txn_id},
            [source], process, batch_size=25, backoff=tenacity.wait_fixed(0.01),
        )  # fmt: skip

    with KafkaProxy(broker.bootstrap_servers) as proxy:
        lost = proxy.fail(
            ApiKey.END_TXN, KafkaError.REQUEST_TIMED_OUT, forward=True, times=1,
            edit=_successor_initialises_before_the_answer(broker, txn_id, started, errors),
        )  # fmt: skip
        first = processor(proxy.bootstrap_servers)
        try:
            with pytest.raises(FatalError, match="whether it committed is unknown"):
                first.run(idle_timeout=30)
        finally:
            for producer in started:
                producer.close(timeout=5)
        assert lost.hits == 1
        assert not errors, errors
        assert proxy.count(ApiKey.END_TXN) == 1  # never aborted after the unknown commit
    # The batch whose commit was applied (all three inputs, unless the consumer handed
    # them over in more than one batch) is in the output once, its offsets committed.
    first_batch = list(processed)
    assert first_batch == values[: len(first_batch)] and first_batch, first_batch
    assert _kafka(broker, sink, expected=len(first_batch)) == [
        "out-" + v.decode() for v in first_batch
    ]
    assert _committed_offset(broker, group, source) == len(first_batch)  # offsets 0, 1, 2
    _seed(broker, source, [b"d"])
    processed.clear()
    processor(broker.bootstrap_servers).run(idle_timeout=3)
    # Resumed from the offsets committed with the outputs: nothing of the batch again.
    assert processed == [*values[len(first_batch) :], b"d"]
    assert _kafka(broker, sink, expected=4) == ["out-a", "out-b", "out-c", "out-d"]
