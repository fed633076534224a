"""Adversarial tests of DualWriter, recovery, the recover CLI, JDBC URLs and the
Spark sink: schedules aimed at the promises of docs/guarantees.md section 4,
docs/guide/dual-write.md and docs/guide/operations.md. Real broker, PostgreSQL, MariaDB and SQLite;
no mocks. A test that shows a broken promise is a strict xfail naming the promise;
the others guard the promise they name. The whole-transaction rollback schedules live
in tests/dualwrite/test_rollbacks.py."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from typing import Any

import pytest
from sqlalchemy import (
    create_engine,
    text,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

from kafka_txn import (
    DatabaseCommitUnknownError,
    TransactionDivergedError,
    TransactionOutcome,
    TransactionOutcomeUnknowableError,
)
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import KafkaTxnError
from kafka_txn.state import PreparedTxnState
from tests.support.adversaries import (
    Interrupted,
    both_sides,
    diverge,
    mariadb_non_strict,
    names_fixture,
    stop_after_db_commit,
)
from tests.support.databases import drop_tables as _drop
from tests.support.databases import id_value_table as _events
from tests.support.databases import sorted_values as _values
from tests.support.databases import sqlite_jdbc
from tests.support.rig import Broker

names = names_fixture("rt2")


# ---------------------------------------------------------------------------------------
# MariaDB: the COMMIT is applied, and the connection drops before its OK reaches the
# writer (4.3: "committed when the database committed and only its reply was lost").
# Proven on PostgreSQL through tests/proxies/pg_proxy.py; here through a MySQL-protocol proxy.
# ---------------------------------------------------------------------------------------


class _MysqlCommitReplyLoser:
    """Loopback proxy in front of MariaDB (plaintext: the URL says sslMode=DISABLED).
    Reads the MySQL wire protocol's framing (3-byte length, sequence id); once armed, the
    next ``COM_QUERY "COMMIT"`` is forwarded, and the server's answer to it (the OK: the
    transaction is committed) is swallowed and both sockets closed."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._armed = threading.Event()
        self.lost = 0
        self._sockets: list[socket.socket] = [self._server]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self._armed.set()

    def close(self) -> None:
        self._closed = True
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream, timeout=30)
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            cut = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, cut), daemon=True).start()

    @staticmethod
    def _packet(sock: socket.socket) -> bytes:
        head = _read_exact(sock, 4)
        return head + _read_exact(sock, int.from_bytes(head[:3], "little"))

    def _up(self, client: socket.socket, upstream: socket.socket, cut: threading.Event) -> None:
        try:
            while True:
                packet = self._packet(client)
                if packet[4:] == b"\x03COMMIT" and self._armed.is_set():
                    self._armed.clear()
                    cut.set()
                upstream.sendall(packet)
        except OSError:
            pass

    def _down(self, upstream: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        try:
            while True:
                packet = self._packet(upstream)
                if cut.is_set():
                    self.lost += 1
                    break  # the COMMIT's answer: never passed on
                client.sendall(packet)
        except OSError:
            pass
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("peer closed")
        data += chunk
    return data


def test_mariadb_commit_whose_ok_is_lost_is_unknown_then_committed_by_the_next_start(
    broker: Broker, mariadb_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    topic = broker.create_topic()
    events = _events(names["events"])
    direct = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    proxy = _MysqlCommitReplyLoser(("127.0.0.1", 3306))
    proxied = f"jdbc:mariadb://127.0.0.1:{proxy.port}/test?user=root&sslMode=DISABLED"
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}

    def on_step(step: str) -> None:
        if step == "after_state_write":
            proxy.arm()

    try:
        events.metadata.create_all(direct)
        writer = DualWriter(
            conf, proxied, state_table=names["state"], on_step=on_step, mark_completed_after=None
        )
        writer.start()
        with pytest.raises(DatabaseCommitUnknownError), writer.transaction() as tx:
            tx.connection.execute(events.insert(), {"id": 1, "value": "kept"})
            tx.produce(topic, b"kept")
        writer.close()
        assert proxy.lost == 1
        assert _values(direct, events) == ["kept"]  # MariaDB committed
        with direct.connect() as conn:
            stored = PreparedTxnState(
                conn.execute(text(f"SELECT prepared_txn_state FROM {names['state']}")).scalar_one()
            )
        assert not stored.is_empty and not stored.completed
        again = DualWriter(conf, mariadb_jdbc, state_table=names["state"])
        assert again.start() is TransactionOutcome.COMMITTED
        again.close()
        assert broker.read_committed(topic, expected=1) == [(None, b"kept")]
    finally:
        proxy.close()
        _drop(direct, names["events"], names["state"])
        direct.dispose()


# ---------------------------------------------------------------------------------------
# The documented way out of a divergence, with a crash in it.
#
# dual-write.md ("What happens on each error", last row) and DualWriter.resolve()'s
# docstring: "call writer.resolve(error.stored_state), then start(), and re-send those
# rows in the first transaction". resolve() stores the state completed first; a process
# killed after it and before that first transaction commits (the failure model: SIGKILL
# between any two network calls) leaves a row that says "settled" for records that are in
# no topic: the next start() goes on without a word (4.12 "never skipped silently"). The
# CLI's own advice (operations.md) orders it the other way round and warns: "Updating the
# row first would lose those records."
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
    topic = broker.create_topic()
    jdbc = sqlite_jdbc(tmp_path)
    events = _events(names["events"])
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
        except (TransactionDivergedError, TransactionOutcomeUnknowableError):
            reported = True
        in_db = _values(last.engine, events)
        in_kafka = [v.decode() for _, v in broker.read_committed(topic, expected=0, linger=2.0)]
        assert reported or in_db == in_kafka, (in_db, in_kafka)
    finally:
        last.close()


# ---------------------------------------------------------------------------------------
# 4.13 / dual-write.md "Threads, and interruptions after the database decided": "Once the
# database COMMIT was sent, ... any exception from your on_step hook. The writer refuses
# every later call with TransactionInDoubtError." The hook's last step, after_kafka_commit,
# comes after the COMMIT too: its exception reaches the caller as it is (saying nothing of
# a committed transaction), and the writer takes the next call, so a caller that retries
# what raised writes it twice on both sides.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.13")
def test_a_hook_failing_after_the_kafka_commit_says_both_committed(
    broker: Broker, tmp_path: Any, names: dict[str, str], txn_id: str
) -> None:
    topic = broker.create_topic()
    events = _events(names["events"])

    raised: list[str] = []

    def hook(step: str) -> None:
        if step == "after_kafka_commit" and not raised:
            raised.append(step)
            raise RuntimeError("tracing backend down")

    writer = DualWriter(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id},
        sqlite_jdbc(tmp_path),
        state_table=names["state"],
        on_step=hook,
    )
    try:
        events.metadata.create_all(writer.engine)
        writer.start()
        with pytest.raises(RuntimeError) as hook_error, writer.transaction() as tx:
            tx.connection.execute(events.insert(), {"id": 1, "value": "once"})
            tx.produce(topic, b"once")
        # 4.13: both sides committed, and the error says so (a caller must not retry)
        assert any("do not retry" in note for note in hook_error.value.__notes__)
        assert _values(writer.engine, events) == ["once"]
        assert broker.read_committed(topic, expected=1) == [(None, b"once")]
        with writer.transaction() as tx:  # nothing is in doubt: the writer goes on
            tx.connection.execute(events.insert(), {"id": 2, "value": "next"})
            tx.produce(topic, b"next")
        assert _values(writer.engine, events) == ["next", "once"]
        assert sorted(v for _, v in broker.read_committed(topic, expected=2)) == [b"next", b"once"]
    finally:
        writer.close()


# ---------------------------------------------------------------------------------------
# A state table managed by hand (create_state_table=False, or narrowed since) whose state
# column is shorter than the states the writer stores, on a MySQL/MariaDB server that is
# not in strict mode (sql_mode='', the default before MySQL 5.7 and common on old
# installs): the server truncates the state with a warning, the writer commits, and a
# crash before the Kafka commit leaves a state whose start time lost its last digits.
# Recovery reads it as "a later transaction ran" (row 8: ALREADY_COMMITTED), commits
# nothing, and the init aborts the prepared transaction: the row is in the database, its
# record nowhere, no error. start() checks the owner column of such a table, not whether
# the state column can hold a state (4.10 checks the table; 4.1 is what breaks).
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.10")
def test_mariadb_non_strict_state_column_too_short_never_loses_a_committed_transaction(
    broker: Broker, mariadb_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    topic = broker.create_topic()
    events = _events(names["events"])
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    mariadb_non_strict(engine)

    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    interrupt: list[bool] = []
    try:
        events.metadata.create_all(engine)
        first = DualWriter(
            conf, engine, state_table=state, on_step=stop_after_db_commit(interrupt),
            mark_completed_after=None,
        )  # fmt: skip
        first.start()
        with first.transaction() as tx:  # a first transaction: its state shows the layout
            tx.connection.execute(events.insert(), {"id": 1, "value": "one"})
            tx.produce(topic, b"one")
        with engine.connect() as conn:
            stored = conn.execute(text(f"SELECT prepared_txn_state FROM {state}")).scalar_one()
            # Narrowed (by hand, or created so by another tool): the start time's last
            # three digits no longer fit.
            width = stored.index(";start=") + len(";start=") + 10
            conn.execute(text(f"ALTER TABLE {state} MODIFY prepared_txn_state VARCHAR({width})"))
            conn.commit()
        interrupt.append(True)
        outcome: Any = None
        try:  # a writer that refuses the narrow column, or the truncated state, says so
            with pytest.raises(Interrupted), first.transaction() as tx:
                tx.connection.execute(events.insert(), {"id": 2, "value": "two"})
                tx.produce(topic, b"two")
            first.close()  # prepared, the database committed (4.13)
            second = DualWriter(conf, engine, state_table=state, create_state_table=False)
            try:
                outcome = second.start()
            finally:
                second.close()
        except (KafkaTxnError, DBAPIError) as exc:
            outcome = exc
        in_db, in_kafka = both_sides(broker, engine, events, topic, expected=2, timeout=10.0)
        reported = isinstance(outcome, BaseException)
        assert reported or in_db == in_kafka, (outcome, in_db, in_kafka)
    finally:
        _drop(engine, names["events"], state)
        engine.dispose()


# ---------------------------------------------------------------------------------------
# close() from another thread while a transaction runs, on an engine of one connection
# (StaticPool: SQLAlchemy's recipe for sharing one SQLite connection between threads).
# dual-write.md / DualWriter.close(): "A transaction in flight aborts". close() is not
# serialized with transaction() (only start() and transaction() are, 4.13): it stores the
# last commit's completion mark through the pool's one connection, which is the one the
# running transaction holds, and its COMMIT commits that transaction's rows so far; then
# it aborts the Kafka transaction. The body's next call fails and the caller is told the
# transaction failed (4.2: "rolls back both"), yet its rows stay in the database.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.2")
def test_close_from_another_thread_on_a_one_connection_pool_commits_nothing(
    broker: Broker, tmp_path: Any, names: dict[str, str], txn_id: str
) -> None:
    topic = broker.create_topic()
    events = _events(names["events"])
    path = tmp_path / "one.sqlite"
    engine = create_engine(
        f"sqlite:///{path}", poolclass=StaticPool, connect_args={"check_same_thread": False}
    )
    writer = DualWriter(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id},
        engine,
        state_table=names["state"],
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
