"""DualWriter's own statements on PostgreSQL (psycopg 3) take one round trip each way
in: BEGIN goes with the state-row lock (one simple query), the state UPDATE with the
COMMIT (pipeline mode, kafka_txn.dualwrite.pg_pipeline), and the connection it puts in autocommit
mode for that never reaches the pool in autocommit mode, whichever way the transaction
ended."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
import uuid

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from kafka_txn import DatabaseCommitUnknownError, TransactionAbortableError, TransactionOutcome
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from tests.support.rig import Broker

pytestmark = pytest.mark.broker


class _Answers:
    """A loopback proxy in front of PostgreSQL that counts the ReadyForQuery messages
    ('Z') the server sends: one per round trip the client waits for (a simple query, or
    a Sync of the extended protocol or of a pipeline). The client must not ask for TLS
    (sslmode=disable): the server's stream is then typed messages from the start.

    ``end_session(where)`` makes the next session to get there end as
    ``pg_terminate_backend`` ends it: a FATAL error (57P01), then, a moment later, the
    connection closed. ``where="after commit"``: PostgreSQL's answer to the COMMIT
    reaches the client, and the FATAL error takes the place of the Sync's answer (the
    database committed); ``"instead of commit"``: the FATAL error takes the place of the
    COMMIT's answer (the database committed); ``"instead of begin"``: it takes the
    place of the answer to a BEGIN (the transaction's lock is held until the session
    ends)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self.ready = 0
        self.sessions_ended = 0
        self._armed: str | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = [self._server]
        threading.Thread(target=self._accept, daemon=True).start()

    def end_session(self, where: str) -> None:
        with self._lock:
            self._armed = where

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream)
            self._sockets += [client, upstream]
            threading.Thread(target=self._copy, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._count, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _copy(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)

    def _count(self, source: socket.socket, target: socket.socket) -> None:
        committed = False
        with contextlib.suppress(OSError):
            while head := _exactly(source, 5):
                kind, length = head[:1], struct.unpack(">i", head[1:])[0]
                body = _exactly(source, length - 4)
                commit = kind == b"C" and body.startswith(b"COMMIT\x00")
                begin = kind == b"C" and body.startswith(b"BEGIN\x00")
                with self._lock:
                    if kind == b"Z":
                        self.ready += 1
                    where = self._armed
                    end = (
                        (where == "instead of commit" and commit)
                        or (where == "after commit" and committed)
                        or (where == "instead of begin" and begin)
                    )
                    if end:
                        self._armed = None
                        self.sessions_ended += 1
                if end:
                    target.sendall(_FATAL)
                    time.sleep(0.3)  # the client reads the error before the end of stream
                    for sock in (source, target):
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                    return
                committed = commit and where == "after commit"
                target.sendall(head + body)


def _error_response(*fields: tuple[bytes, bytes]) -> bytes:
    body = b"".join(code + value + b"\x00" for code, value in fields) + b"\x00"
    return b"E" + struct.pack(">i", len(body) + 4) + body


_FATAL = _error_response(
    (b"S", b"FATAL"), (b"V", b"FATAL"), (b"C", b"57P01"),
    (b"M", b"terminating connection due to administrator command"),
)  # fmt: skip


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


@pytest.fixture
def events() -> Table:
    return Table(
        f"events_{uuid.uuid4().hex[:10]}",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("value", String(64)),
    )


@pytest.mark.guarantee("4.14")
def test_a_dual_write_waits_for_postgresql_three_times(
    broker: Broker, postgres_jdbc: str, txn_id: str, events: Table
) -> None:
    """Per transaction whose body runs one INSERT: BEGIN with the lock, the INSERT,
    the state UPDATE with the COMMIT. (Statement by statement it would be five.)"""
    answers = _Answers(("127.0.0.1", 5432))
    jdbc = f"jdbc:postgresql://127.0.0.1:{answers.port}/test?user=postgres&sslmode=disable"
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    topic = broker.create_topic()
    writer = DualWriter(conf, jdbc, mark_completed_after=None)
    try:
        writer.start()
        events.create(writer.engine)
        for value in ("warm-up", "one", "two", "three"):
            if value == "one":
                before = answers.ready
            with writer.transaction() as tx:
                tx.connection.execute(events.insert().values(value=value))
                tx.produce(topic, value.encode())
        assert answers.ready - before == 3 * 3
        with writer.engine.connect() as conn:
            rows = conn.execute(select(events.c.value).order_by(events.c.id)).scalars().all()
        assert rows == ["warm-up", "one", "two", "three"]
        events.drop(writer.engine)
    finally:
        writer.close()
        answers.close()
    values = sorted(v for _, v in broker.read_committed(topic, expected=4))
    assert values == [b"one", b"three", b"two", b"warm-up"]


@pytest.mark.guarantee("4.14")
def test_a_transactional_id_with_quotes_is_one_literal_in_the_lock_sent_with_begin(
    broker: Broker, postgres_jdbc: str, txn_id: str
) -> None:
    """BEGIN and the lock go as one simple query, the lock's parameters rendered as
    literals by psycopg: a transactional id with quotes, a backslash, a semicolon, a
    second statement and placeholders finds its own row, and nothing of it runs as SQL
    (the table it would create does not exist)."""
    injected = f"kt_injected_{uuid.uuid4().hex[:10]}"
    tid = f"{txn_id}'o\\brien\"; CREATE TABLE {injected} (i int); -- %s %(tid)s é"
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid}
    topic = broker.create_topic()
    writer = DualWriter(conf, postgres_jdbc, mark_completed_after=None)
    try:
        writer.start()
        for value in (b"one", b"two"):
            with writer.transaction() as tx:
                tx.produce(topic, value)
        with writer.engine.connect() as conn:
            stored = conn.execute(
                text(
                    "SELECT prepared_txn_state FROM kafka_transaction_state "
                    "WHERE transactional_id = :t"
                ),
                {"t": tid},
            ).scalar_one()
            exists = conn.execute(text("SELECT to_regclass(:n)"), {"n": injected}).scalar_one()
    finally:
        writer.close()
    assert stored.startswith("kafka-txn:1;")
    assert exists is None
    assert sorted(v for _, v in broker.read_committed(topic, expected=2)) == [b"one", b"two"]


def _small_pool(jdbc: str) -> Engine:
    """Two connections at most (one kept in the pool, one overflow): the writer's, and
    the one its lock-timeout message reads the row's owner with."""
    return create_engine(jdbc_to_sqlalchemy(jdbc), pool_size=1, max_overflow=1)


def _pooled_connection_is_transactional(engine: Engine, events: Table) -> None:
    """Every connection the pool hands out is out of autocommit mode, and a rolled-back
    transaction on it leaves nothing behind."""
    with engine.connect() as first, engine.connect() as second:
        for conn in (first, second):
            assert conn.connection.driver_connection.autocommit is False  # type: ignore[union-attr]
            with contextlib.suppress(ZeroDivisionError), conn.begin():
                conn.execute(events.insert().values(value="rolled back"))
                raise ZeroDivisionError
            assert "rolled back" not in conn.execute(select(events.c.value)).scalars().all()


@pytest.mark.guarantee("4.14")
def test_the_pool_never_gets_a_connection_back_in_autocommit_mode(
    broker: Broker, postgres_jdbc: str, txn_id: str, events: Table
) -> None:
    """After a commit, a body that raised, a lock that timed out and a fenced writer
    (each ends the transaction another way), every connection of the engine's pool is
    transactional again."""
    engine = _small_pool(postgres_jdbc)
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    topic = broker.create_topic()
    events.create(engine)
    writer = DualWriter(conf, engine, mark_completed_after=None, lock_timeout=0.5)
    holder = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    try:
        writer.start()
        with writer.transaction() as tx:  # committed
            tx.connection.execute(events.insert().values(value="kept"))
            tx.produce(topic, b"kept")
        _pooled_connection_is_transactional(engine, events)

        with pytest.raises(ZeroDivisionError), writer.transaction() as tx:  # body raised
            tx.connection.execute(events.insert().values(value="dropped"))
            raise ZeroDivisionError
        _pooled_connection_is_transactional(engine, events)

        state = writer.state_table
        with holder.connect() as other:  # the lock stays taken: it times out
            other.begin()
            other.execute(select(state).where(state.c.transactional_id == txn_id).with_for_update())
            with pytest.raises(TransactionAbortableError), writer.transaction():
                pass
            other.rollback()
        _pooled_connection_is_transactional(engine, events)

        with holder.begin() as other:  # a newer owner: the writer is fenced at the lock
            other.execute(
                text(f"UPDATE {state.name} SET owner = 'newer' WHERE transactional_id = :t"),
                {"t": txn_id},
            )
        with pytest.raises(Exception, match="took it over"), writer.transaction():
            pass
        _pooled_connection_is_transactional(engine, events)

        with engine.connect() as conn:
            assert conn.execute(select(events.c.value)).scalars().all() == ["kept"]
    finally:
        writer.close()
        holder.dispose()
        with engine.begin() as conn:
            events.drop(conn)
        engine.dispose()
    assert broker.read_committed(topic, expected=1) == [(None, b"kept")]


def _proxied_writer(
    broker: Broker, answers: _Answers, txn_id: str, events: Table
) -> tuple[DualWriter, str]:
    jdbc = f"jdbc:postgresql://127.0.0.1:{answers.port}/test?user=postgres&sslmode=disable"
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    writer = DualWriter(conf, jdbc, mark_completed_after=None)
    writer.start()
    events.create(writer.engine, checkfirst=True)
    return writer, jdbc


def _values(engine: Engine, events: Table) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(events.c.value).order_by(events.c.id)).scalars())


@pytest.mark.adversary
@pytest.mark.guarantee("4.14")
def test_a_session_ended_after_postgresql_answered_commit_is_a_commit_on_both_sides(
    broker: Broker, postgres_jdbc: str, txn_id: str, events: Table
) -> None:
    """PostgreSQL answers the COMMIT, then the session ends (FATAL 57P01, as
    pg_terminate_backend, before the Sync is answered): the transaction committed, so
    the writer commits Kafka too, and goes on with a new connection. (Read as a plain
    error, it would have aborted Kafka for a transaction the database holds.)"""
    answers = _Answers(("127.0.0.1", 5432))
    topic = broker.create_topic()
    writer, _ = _proxied_writer(broker, answers, txn_id, events)
    try:
        with writer.transaction() as tx:
            tx.connection.execute(events.insert().values(value="before"))
            tx.produce(topic, b"before")
        answers.end_session("after commit")
        with writer.transaction() as tx:
            tx.connection.execute(events.insert().values(value="kept"))
            tx.produce(topic, b"kept")
        assert answers.sessions_ended == 1
        with writer.transaction() as tx:  # the writer goes on
            tx.connection.execute(events.insert().values(value="after"))
            tx.produce(topic, b"after")
        assert _values(writer.engine, events) == ["before", "kept", "after"]
        events.drop(writer.engine)
    finally:
        writer.close()
        answers.close()
    values = sorted(v for _, v in broker.read_committed(topic, expected=3))
    assert values == [b"after", b"before", b"kept"]


@pytest.mark.adversary
@pytest.mark.guarantee("4.14")
def test_a_session_ended_in_place_of_the_commits_answer_is_unknown_never_aborted(
    broker: Broker, postgres_jdbc: str, txn_id: str, events: Table
) -> None:
    """The session ends where PostgreSQL's answer to the COMMIT should be (FATAL 57P01):
    the writer cannot know whether it committed, so it raises
    DatabaseCommitUnknownError and leaves Kafka prepared; the next start() finds the
    state the database committed and commits Kafka."""
    answers = _Answers(("127.0.0.1", 5432))
    topic = broker.create_topic()
    writer, jdbc = _proxied_writer(broker, answers, txn_id, events)
    try:
        answers.end_session("instead of commit")
        with pytest.raises(DatabaseCommitUnknownError), writer.transaction() as tx:
            tx.connection.execute(events.insert().values(value="kept"))
            tx.produce(topic, b"kept")
        assert answers.sessions_ended == 1
    finally:
        writer.close()
    settings = ConnectionSettings.from_librdkafka({"bootstrap.servers": broker.bootstrap_servers})
    with CoordinatorClient(settings, txn_id) as client:
        assert client.describe().state == "Ongoing"  # prepared: neither aborted nor committed
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    restarted = DualWriter(conf, jdbc, mark_completed_after=None)
    try:
        assert restarted.start() is TransactionOutcome.COMMITTED
        assert _values(restarted.engine, events) == ["kept"]
        events.drop(restarted.engine)
    finally:
        restarted.close()
        answers.close()
    assert broker.read_committed(topic, expected=1) == [(None, b"kept")]


@pytest.mark.adversary
@pytest.mark.guarantee("4.14")
def test_a_session_ended_at_begin_and_lock_is_an_sqlalchemy_error_and_the_writer_goes_on(
    broker: Broker, postgres_jdbc: str, txn_id: str, events: Table
) -> None:
    """The session ends where PostgreSQL answers the BEGIN sent with the lock: the
    writer raises SQLAlchemy's OperationalError (the connection invalidated), never a
    driver exception; nothing was written on either side, and the next transaction
    works on a new connection."""
    answers = _Answers(("127.0.0.1", 5432))
    topic = broker.create_topic()
    writer, _ = _proxied_writer(broker, answers, txn_id, events)
    try:
        answers.end_session("instead of begin")
        with pytest.raises(DBAPIError) as raised, writer.transaction() as tx:
            tx.produce(topic, b"never")
        assert raised.value.connection_invalidated
        assert answers.sessions_ended == 1
        with writer.transaction() as tx:
            tx.connection.execute(events.insert().values(value="kept"))
            tx.produce(topic, b"kept")
        assert _values(writer.engine, events) == ["kept"]
        events.drop(writer.engine)
    finally:
        writer.close()
        answers.close()
    assert broker.read_committed(topic, expected=1) == [(None, b"kept")]


@pytest.mark.adversary
@pytest.mark.guarantee("4.14")
def test_a_pooled_session_ended_between_transactions_is_an_sqlalchemy_error(
    broker: Broker, postgres_jdbc: str, txn_id: str, events: Table
) -> None:
    """The pooled connection's session is terminated between two transactions
    (pg_terminate_backend): the next transaction fails with SQLAlchemy's
    OperationalError, never a driver exception, nothing written; the one after works."""
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    topic = broker.create_topic()
    engine = _small_pool(postgres_jdbc)
    writer = DualWriter(conf, engine, mark_completed_after=None)
    killer = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    try:
        writer.start()
        events.create(engine)
        with writer.transaction() as tx:
            pid = tx.connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
            tx.produce(topic, b"first")
        with killer.begin() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        gone = text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p")
        while True:  # its FATAL error and the end of its stream are then on our side
            with killer.connect() as conn:
                if conn.execute(gone, {"p": pid}).scalar_one() == 0:
                    break
            time.sleep(0.05)
        with pytest.raises(DBAPIError) as raised, writer.transaction() as tx:
            tx.produce(topic, b"never")
        assert raised.value.connection_invalidated
        with writer.transaction() as tx:
            tx.connection.execute(events.insert().values(value="kept"))
            tx.produce(topic, b"kept")
        assert _values(engine, events) == ["kept"]
        events.drop(engine)
    finally:
        writer.close()
        killer.dispose()
        engine.dispose()
    values = sorted(v for _, v in broker.read_committed(topic, expected=2))
    assert values == [b"first", b"kept"]
