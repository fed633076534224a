"""One DualWriter used from several threads, and interruptions once the database may have
decided. Guarded against: threads calling transaction() on one writer aborting each
other's prepared transactions after their database commit, and an exception right after
the COMMIT leaving the writer running, so that the next transaction aborts the
committed one. Each schedule here ends with the database rows equal to what an
independent read_committed consumer (kafka-python) sees, each once."""

from __future__ import annotations

import contextlib
import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import Table, create_engine, select
from sqlalchemy.pool import StaticPool

from kafka_txn import (
    IllegalStateError,
    InvalidPreparedStateError,
    TransactionInDoubtError,
    TransactionOutcome,
)
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from tests.apps.dualwrite_app import events_table
from tests.support.adversaries import both_sides
from tests.support.databases import id_value_table, unique_name

pytestmark = [pytest.mark.broker, pytest.mark.adversary]


class Interrupted(BaseException):
    """Stands for a KeyboardInterrupt or a timeout signal (not an Exception)."""


def _setup(broker: Any, jdbc_url: str, txn_id: str) -> tuple[str, Table, dict[str, Any]]:
    topic = broker.create_topic(partitions=2)
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    return topic, events, conf


def _write(writer: DualWriter, events: Table, topic: str, value: str) -> None:
    with writer.transaction() as tx:
        tx.connection.execute(events.insert(), [{"batch": 0, "value": value}])
        tx.produce(topic, value.encode())


def _assert_equal_sides(broker: Any, jdbc_url: str, events: Table, topic: str) -> list[str]:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        with engine.connect() as conn:
            rows = sorted(conn.execute(select(events.c.value)).scalars())
    finally:
        engine.dispose()
    kafka = sorted(v.decode() for _, v in broker.read_committed(topic, expected=len(rows)))
    assert kafka == rows, "database and Kafka disagree"
    assert len(set(rows)) == len(rows), "a row twice"
    return rows


@pytest.mark.guarantee("4.13")
def test_threads_sharing_one_writer_take_turns(broker, jdbc_url, txn_id):
    """Four threads run transactions on one writer, also before it has started: each
    waits its turn, every transaction commits, and both sides hold each row once."""
    topic, events, conf = _setup(broker, jdbc_url, txn_id)
    writer = DualWriter(conf, jdbc_url)
    events.create(writer.engine, checkfirst=True)
    errors: list[BaseException] = []
    go = threading.Barrier(4)

    def run(n: int) -> None:
        go.wait()
        for i in range(8):
            try:
                _write(writer, events, topic, f"t{n}-{i}")
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    assert errors == []
    assert len(_assert_equal_sides(broker, jdbc_url, events, topic)) == 32


@pytest.mark.guarantee("4.13")
def test_a_thread_waits_while_another_is_between_its_database_and_kafka_commits(
    broker, jdbc_url, txn_id
):
    """Thread 1 pauses right after its database COMMIT, before its Kafka commit. Thread 2's
    transaction waits for it instead of aborting thread 1's prepared transaction; once
    thread 1 resumes, both commit on both sides."""
    topic, events, conf = _setup(broker, jdbc_url, txn_id)
    paused, resume = threading.Event(), threading.Event()

    def hook(step: str) -> None:
        if step == "after_db_commit" and threading.current_thread().name == "t1":
            paused.set()
            assert resume.wait(30)

    writer = DualWriter(conf, jdbc_url, on_step=hook)
    events.create(writer.engine, checkfirst=True)
    writer.start()
    errors: list[BaseException] = []

    def run(value: str) -> None:
        try:
            _write(writer, events, topic, value)
        except BaseException as exc:
            errors.append(exc)

    t1 = threading.Thread(target=run, args=("a1",), name="t1")
    t1.start()
    assert paused.wait(30)
    t2 = threading.Thread(target=run, args=("b1",), name="t2")
    t2.start()
    t2.join(0.5)  # t2 is waiting for t1's turn (it would have failed by now otherwise)
    resume.set()
    t1.join()
    t2.join()
    writer.close()
    assert errors == []
    assert _assert_equal_sides(broker, jdbc_url, events, topic) == ["a1", "b1"]


@pytest.mark.guarantee("4.13")
def test_transaction_inside_its_own_body_is_refused(broker, jdbc_url, txn_id):
    """A nested transaction() on the same writer would deadlock: it is refused, and the
    outer transaction rolls back on both sides."""
    topic, events, conf = _setup(broker, jdbc_url, txn_id)
    writer = DualWriter(conf, jdbc_url)
    events.create(writer.engine, checkfirst=True)
    with (
        pytest.raises(IllegalStateError, match="inside a transaction"),
        writer.transaction() as tx,
    ):
        tx.connection.execute(events.insert(), [{"batch": 0, "value": "outer"}])
        tx.produce(topic, b"outer")
        _write(writer, events, topic, "inner")
    _write(writer, events, topic, "after")
    writer.close()
    assert _assert_equal_sides(broker, jdbc_url, events, topic) == ["after"]


@pytest.mark.guarantee("4.13")
def test_an_interruption_after_the_database_commit_stops_the_writer(broker, jdbc_url, txn_id):
    """An interruption (not an Exception) right after the database COMMIT: the transaction
    stays prepared, the writer refuses every later call instead of aborting it, and the
    next writer's start() commits it."""
    topic, events, conf = _setup(broker, jdbc_url, txn_id)
    armed = [True]

    def hook(step: str) -> None:
        if step == "after_db_commit" and armed[0]:
            armed[0] = False
            raise Interrupted

    writer = DualWriter(conf, jdbc_url, on_step=hook)
    events.create(writer.engine, checkfirst=True)
    with pytest.raises(Interrupted):
        _write(writer, events, topic, "decided")
    with pytest.raises(TransactionInDoubtError) as caught:
        _write(writer, events, topic, "never")
    writer.close()
    successor = DualWriter(conf, jdbc_url)
    try:
        # Its prepared state is not something to resolve() by hand: recovery commits it.
        with pytest.raises(InvalidPreparedStateError, match="start\\(\\) first"):
            successor.resolve(caught.value.prepared_state)
        assert successor.start() is TransactionOutcome.COMMITTED
    finally:
        successor.close()
    assert _assert_equal_sides(broker, jdbc_url, events, topic) == ["decided"]


# close() from another thread while a transaction runs, on an engine of one connection
# (StaticPool: SQLAlchemy's recipe for sharing one SQLite connection between threads).
# dual-write.md / DualWriter.close(): "A transaction in flight aborts". close() is not
# serialized with transaction() (only start() and transaction() are, 4.13): it stores the
# last commit's completion mark through the pool's one connection, which is the one the
# running transaction holds, so a COMMIT of that mark must not commit the running
# transaction's rows while its Kafka transaction aborts and the caller is told it failed
# (4.2: "rolls back both").


@pytest.mark.guarantee("4.2")
def test_close_from_another_thread_on_a_one_connection_pool_commits_nothing(
    broker: Any, tmp_path: Any, txn_id: str
) -> None:
    """A shutdown handler's close() in another thread, mid-transaction, on a pool of one
    SQLite connection: the database and Kafka hold the same rows."""
    topic = broker.create_topic()
    events = id_value_table(unique_name("events"))
    path = tmp_path / "one.sqlite"
    engine = create_engine(
        f"sqlite:///{path}", poolclass=StaticPool, connect_args={"check_same_thread": False}
    )
    writer = DualWriter(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id},
        engine,
        state_table=unique_name("state"),
    )
    events.metadata.create_all(engine)
    writer.start()
    with writer.transaction() as tx:
        tx.connection.execute(events.insert(), {"id": 1, "value": "one"})
        tx.produce(topic, b"one")
    closer = threading.Thread(target=writer.close)
    with contextlib.suppress(Exception), writer.transaction() as tx:
        tx.connection.execute(events.insert(), {"id": 2, "value": "two"})
        tx.produce(topic, b"two")
        closer.start()  # a shutdown handler, say
        closer.join(timeout=30)  # (a close() that waits for the transaction goes on after)
        tx.produce(topic, b"two, more")  # the producer is closed: the body fails
    closer.join(timeout=120)
    checker = create_engine(f"sqlite:///{path}")
    try:
        in_db, in_kafka = both_sides(broker, checker, events, topic, expected=1, linger=2.0)
        assert in_db == in_kafka, (in_db, in_kafka)
    finally:
        checker.dispose()
