"""The kafka-txn console script as an on-call operator meets it: against the real broker,
PostgreSQL, MariaDB and SQLite, an unreachable broker, a live writer, a terminal (a
pseudo-terminal) and bad arguments. In-process through ``main()`` where stdin/stderr
need no terminal, else as a subprocess of the installed console script."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, insert, inspect, text

from kafka_txn import (
    ProducerFencedError,
    TransactionalProducer,
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
)
from kafka_txn.cli.database import open_database, read_state_row
from kafka_txn.cli.exits import CommandError
from kafka_txn.cli.main import _parser, main
from kafka_txn.cli.recover import settle
from kafka_txn.cli.settings import kafka_settings
from kafka_txn.cli.terminal import Deadline
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.twophase.recovery import TransactionOutcome
from tests.apps.dualwrite_app import events_table
from tests.proxies.secure_proxy import SecureProxy
from tests.support.certificates import make_certificates
from tests.support.dual_writes import Scenario, diverged

ROOT = Path(__file__).resolve().parent.parent.parent
EXE = shutil.which("kafka-txn") or str(Path(sys.executable).parent / "kafka-txn")
STATE = "kafka_transaction_state"


# ---------------------------------------------------------------------- helpers
def _run(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The console script in a subprocess, stdin not a terminal."""
    return subprocess.run(
        [EXE, *argv], capture_output=True, text=True, timeout=timeout, check=False,
        stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )  # fmt: skip


def _call(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """main() in-process (stdin is pytest's, not a terminal): code, stdout, stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# A child process started by _in_terminal opens its terminal by name as a session leader
# without a controlling terminal, which makes it its controlling terminal (Linux); getpass
# reads /dev/tty, and isatty() holds for stdin, stdout and stderr.
_TAKE_TTY = (
    "import os, sys; os.close(os.open(os.ttyname(0), os.O_RDWR)); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def _in_terminal(
    argv: list[str], replies: dict[str, str | Callable[[], str]] | None = None,
    timeout: float = 120,
) -> tuple[int, str]:  # fmt: skip
    """The console script on a pseudo-terminal: whenever the output shows a key of
    ``replies`` (once each), type its value (a callable's result: it runs while the
    question is open). Returns the exit code and all output."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", _TAKE_TTY, EXE, *argv],
        stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    os.close(slave)
    pending = dict(replies or {})
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
                for prompt in list(pending):
                    if prompt.encode() in output:
                        reply = pending.pop(prompt)
                        answer = reply() if callable(reply) else reply
                        os.write(master, answer.encode() + b"\n")
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, output.decode(errors="replace")


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """A loopback port that accepts TCP connections (the kernel's backlog does) and never
    answers: a broker that hangs."""
    server = socket.create_server(("127.0.0.1", 0))
    try:
        yield int(server.getsockname()[1])
    finally:
        server.close()


@contextlib.contextmanager
def _http_server() -> Iterator[int]:
    """A loopback port that answers like an HTTP server refusing a malformed request: a
    Kafka request gets "400 Bad Request" at once (http.server instead waits for a line
    end that a Kafka request need not contain)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except OSError:
                return
            with client, contextlib.suppress(OSError):
                client.recv(4096)
                client.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                               b"Connection: close\r\n\r\n")  # fmt: skip

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        server.close()
        thread.join(10)


def _coordinator_knows(broker, txn_id: str) -> bool:
    settings = ConnectionSettings.from_librdkafka({"bootstrap.servers": broker.bootstrap_servers})
    with CoordinatorClient(settings, txn_id, deadline_s=30) as client:
        return client.describe().found


def _state_rows(jdbc_url: str, table: str = STATE) -> dict[str, tuple[str, str | None]]:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(f"SELECT transactional_id, prepared_txn_state, owner FROM {table}")
            )
            return {r[0]: (r[1], r[2]) for r in rows}
    finally:
        engine.dispose()


def _started_writer(broker, jdbc_url: str, txn_id: str) -> None:
    """A DualWriter that started (state table and row exist, the id is registered) and
    closed."""
    writer = DualWriter(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}, jdbc_url
    )
    writer.start()
    writer.close()


def _open_transaction(broker, topic: str, txn_id: str) -> TransactionalProducer:
    p = TransactionalProducer({"bootstrap.servers": broker.bootstrap_servers,
                               "transactional.id": txn_id})  # fmt: skip
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic, b"open", partition=0)
    p.flush()
    return p


def _initialised(broker, txn_id: str) -> None:
    """An id the coordinator knows, with no transaction (start time -1) and no producer
    left using it."""
    p = TransactionalProducer({"bootstrap.servers": broker.bootstrap_servers,
                               "transactional.id": txn_id})  # fmt: skip
    p.init_transactions()
    p.close()


def _set_row(jdbc_url: str, txn_id: str, **values: object) -> None:
    """Overwrite columns of a state row (an old last write, another owner)."""
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        with engine.begin() as conn:
            sets = ", ".join(f"{name} = :{name}" for name in values)
            conn.execute(text(f"UPDATE {STATE} SET {sets} WHERE transactional_id = :tid"),
                         {**values, "tid": txn_id})  # fmt: skip
    finally:
        engine.dispose()


LONG_AGO = datetime(2000, 1, 1)
"""A last write far older than any transaction timeout."""

JSON_KEYS = {"transactional_id", "found", "state", "producer_id", "producer_epoch",
             "transaction_start_time_ms", "started_at", "age_s", "transaction_timeout_ms",
             "partitions"}  # fmt: skip
"""describe --json's keys, as docs/guide/operations.md lists them."""


# ---------------------------------------------------------------------- describe
@pytest.mark.broker
def test_describe_shows_an_open_transaction(broker, capsys, txn_id):
    topic = broker.create_topic(partitions=2)
    p = _open_transaction(broker, topic, txn_id)
    code, out, _ = _call(["describe", "--bootstrap-servers", broker.bootstrap_servers,
                          "--transactional-id", txn_id], capsys)  # fmt: skip
    assert code == 0
    assert "state            : Ongoing" in out
    assert f"{topic}[0]" in out and "s ago)" in out
    code, out, _ = _call(["describe", "--bootstrap-servers", broker.bootstrap_servers,
                          "--transactional-id", txn_id, "--json"], capsys)  # fmt: skip
    info = json.loads(out)
    assert code == 0 and info["found"] is True
    assert info["state"] == "Ongoing" and info["partitions"] == {topic: [0]}
    assert info["age_s"] >= 0 and set(info) == JSON_KEYS
    p.abort_transaction()
    p.close()


@pytest.mark.broker
def test_describe_json_has_every_key_even_without_a_transaction(broker, capsys, txn_id):
    """No transaction started (start time -1): started_at and age_s are there, null; an
    unknown id has every key too."""
    _initialised(broker, txn_id)
    argv = ["describe", "--bootstrap-servers", broker.bootstrap_servers, "--json"]
    code, out, err = _call([*argv, "--transactional-id", txn_id], capsys)
    assert code == 0, err
    info = json.loads(out)
    assert set(info) == JSON_KEYS
    assert info["started_at"] is None and info["age_s"] is None
    assert info["transaction_start_time_ms"] == -1 and info["partitions"] == {}
    code, out, _ = _call([*argv, "--transactional-id", f"{txn_id}-unknown"], capsys)
    assert code == 4
    assert set(json.loads(out)) == JSON_KEYS


@pytest.mark.broker
def test_describe_an_unknown_id_says_unknown_and_exits_4(broker, capsys, txn_id):
    code, out, err = _call(["describe", "--bootstrap-servers", broker.bootstrap_servers,
                            "--transactional-id", txn_id], capsys)  # fmt: skip
    assert code == 4
    assert out == ""
    assert f"transactional id {txn_id!r} is unknown" in _one_line(err)
    code, out, err = _call(["describe", "--bootstrap-servers", broker.bootstrap_servers,
                            "--transactional-id", txn_id, "--json"], capsys)  # fmt: skip
    assert code == 4
    assert json.loads(out)["found"] is False
    assert "is unknown" in _one_line(err)
    assert not _coordinator_knows(broker, txn_id)  # describing registered nothing


# ---------------------------------------------------------------------- force-terminate
@pytest.mark.broker
def test_force_terminate_asks_before_fencing_a_live_producer(broker, capsys, txn_id):
    """A producer mid-transaction is not fenced without a confirmation: without a terminal
    and without --yes, exit 3 and it commits afterwards as if nothing happened; with
    --yes its transaction is aborted and the producer fenced."""
    topic = broker.create_topic()
    p = _open_transaction(broker, topic, txn_id)
    argv = ["force-terminate", "--bootstrap-servers", broker.bootstrap_servers,
            "--transactional-id", txn_id]  # fmt: skip
    code, out, err = _call(argv, capsys)
    assert code == 3, err
    line = _one_line(err)
    assert line.startswith("kafka-txn: refused: ") and "is still open" in line
    assert "--yes" in line and out == ""
    p.commit_transaction()  # not fenced
    assert broker.read_committed(topic, expected=1) == [(None, b"open")]

    p.begin_transaction()
    p.produce(topic, b"doomed", partition=0)
    p.flush()
    code, out, err = _call([*argv, "--yes"], capsys)
    assert code == 0, err
    assert "was Ongoing" in out and "open transaction aborted" in out
    with pytest.raises(ProducerFencedError):
        p.commit_transaction()
    p.close()
    assert broker.read_committed(topic, expected=1) == [(None, b"open")]


@pytest.mark.adversary
@pytest.mark.broker
def test_force_terminate_refuses_when_the_transaction_changed_while_it_asked(broker, txn_id):
    """The question is about one transaction; while it is open, its producer commits and
    begins another. "y" is then about what is gone: refused (exit 3), and the producer
    is not fenced."""
    topic = broker.create_topic()
    p = _open_transaction(broker, topic, txn_id)

    def move_on() -> str:
        p.commit_transaction()
        p.begin_transaction()
        p.produce(topic, b"next", partition=0)
        p.flush()  # the coordinator now shows the new transaction
        return "y"

    code, output = _in_terminal(
        ["force-terminate", "--bootstrap-servers", broker.bootstrap_servers,
         "--transactional-id", txn_id],
        {"Proceed with force-terminate? [y/N]": move_on},
    )  # fmt: skip
    assert code == 3, output
    assert f"transactional id {txn_id!r} changed while you were asked" in output
    assert "nothing was done" in output
    p.commit_transaction()  # not fenced
    p.close()
    assert broker.read_committed(topic, expected=2) == [(None, b"open"), (None, b"next")]


@pytest.mark.broker
def test_force_terminate_refuses_a_never_used_id(broker, capsys, txn_id):
    code, out, err = _call(["force-terminate", "--bootstrap-servers", broker.bootstrap_servers,
                            "--transactional-id", txn_id, "--yes"], capsys)  # fmt: skip
    assert code == 4
    line = _one_line(err)
    assert "is unknown" in line and "does not register" in line and "nothing was done" in line
    assert out == ""
    assert not _coordinator_knows(broker, txn_id)


@pytest.mark.broker
def test_force_terminate_of_an_old_idle_id_needs_no_confirmation(broker, capsys, txn_id):
    """An id whose producer only initialised (no transaction: start time -1) is settled
    without a question, even without a terminal."""
    p = TransactionalProducer({"bootstrap.servers": broker.bootstrap_servers,
                               "transactional.id": txn_id})  # fmt: skip
    p.init_transactions()
    p.close()
    code, out, err = _call(["force-terminate", "--bootstrap-servers", broker.bootstrap_servers,
                            "--transactional-id", txn_id], capsys)  # fmt: skip
    assert code == 0, err
    assert "was Empty" in out and "no transaction was open" in out


@pytest.mark.adversary
@pytest.mark.broker
def test_force_terminate_with_a_hung_broker_says_what_may_have_happened(broker, txn_id):
    """The broker answers DescribeTransactions but never InitProducerId (the fence): one
    line saying the fence may or may not have happened, to run the command again and to
    check with describe; not the library's "call init_transactions() again"."""
    _initialised(broker, txn_id)
    with SecureProxy(broker.bootstrap_servers, stall=frozenset({22})) as proxy:
        done = _run("force-terminate", "--bootstrap-servers", proxy.bootstrap_servers,
                    "--transactional-id", txn_id, "--timeout", "4", "--yes")  # fmt: skip
        assert proxy.stalled  # the InitProducerId was sent, and left unanswered
    assert done.returncode == 1
    line = _one_line(done.stderr)
    assert f"force-terminate of {txn_id!r} did not complete within 4s" in line
    assert "may or may not have aborted" in line and "kafka-txn describe" in line
    assert "run the same command again" in line.lower()
    assert "call init_transactions() again" not in line


@pytest.mark.broker
@pytest.mark.parametrize("command", ["force-terminate", "recover"])
def test_a_timeout_the_broker_refuses_is_one_line(broker, capsys, tmp_path, txn_id, command):
    """transaction.timeout.ms above the broker's maximum: the broker refuses the init.
    Exactly one line on stderr naming the setting: no log record of the library (it logs
    the producer becoming unusable at ERROR) without -v."""
    argv = [command, "--bootstrap-servers", broker.bootstrap_servers, "--transactional-id",
            txn_id, "-X", "transaction.timeout.ms=900001", "--yes"]  # fmt: skip
    if command == "recover":
        jdbc_url = f"jdbc:sqlite:{tmp_path}/state.db"
        _started_writer(broker, jdbc_url, txn_id)
        argv += ["--jdbc-url", jdbc_url]
    else:
        _initialised(broker, txn_id)
    code, out, err = _call(argv, capsys)
    assert code == 1 and out == ""
    line = _one_line(err)
    assert "transaction.timeout.ms=900001" in line and "transaction.max.timeout.ms" in line
    assert "nothing was fenced" in line


@pytest.mark.broker
@pytest.mark.parametrize("command", ["describe", "force-terminate"])
def test_librdkafka_debug_stays_off_stderr_without_verbose(broker, command, txn_id):
    """-X debug=all without -v: not one librdkafka line on stderr, neither from the
    settings check nor from the producer; with -v, no "No bootstrap.servers configured"
    from the settings check (it is a throwaway handle without brokers)."""
    _initialised(broker, txn_id)
    argv = [command, "--bootstrap-servers", broker.bootstrap_servers, "--transactional-id",
            txn_id, "-X", "debug=all"]  # fmt: skip
    if command == "force-terminate":
        argv.append("--yes")
    done = _run(*argv)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    verbose = _run(*argv, "-v")
    assert verbose.returncode == 0, verbose.stderr
    assert "bootstrap.servers` configured" not in verbose.stderr


# ---------------------------------------------------------------------- recover
@pytest.mark.adversary
@pytest.mark.broker
def test_recover_settles_a_crashed_dual_write_once_confirmed(broker, capsys, jdbc_url):
    s = Scenario(broker, jdbc_url)
    assert s.run("--batch", "0", "--crash-at", "after_db_commit").returncode == -9
    argv = ["recover", "--bootstrap-servers", broker.bootstrap_servers,
            "--jdbc-url", s.jdbc_url, "--transactional-id", s.txn_id]  # fmt: skip
    before = _state_rows(s.jdbc_url)[s.txn_id]
    code, out, err = _call(argv, capsys)
    assert code == 3, err  # the crashed writer's transaction is recent: not without --yes
    assert "is still open" in err and "state row last written" in err
    assert "is not running" in err  # its owner is a process of this host, and gone
    assert "a writer may still be using it" not in err  # (it said so, of the dead one)
    assert "another writer (on another host, or one that took the id over since)" in err
    assert _state_rows(s.jdbc_url)[s.txn_id] == before  # (other tests share the table)
    assert broker.read_committed(s.topic, expected=0, timeout=1) == []
    code, out, err = _call([*argv, "--yes"], capsys)
    assert code == 0, err
    assert out.strip() == f"{s.txn_id}: committed"
    s.assert_equal_sides(4)


def _execute(jdbc_url: str, statement: str) -> int:
    """Run one SQL statement as an operator pasting it would; the rows it changed."""
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        with engine.begin() as conn:
            return int(conn.exec_driver_sql(statement).rowcount)
    finally:
        engine.dispose()


@pytest.mark.broker
@pytest.mark.parametrize("verdict", ["diverged", "unknowable"])
@pytest.mark.guarantee("3.10")
def test_recover_that_cannot_settle_tells_a_command_line_user_what_to_do(
    broker, capsys, jdbc_url, txn_id, verdict
):
    """The database committed a transaction that Kafka aborted (diverged: the writer's
    own abort, as a coordinator timeout would) or whose fate Kafka forgot (unknowable: a
    writer crashed after its database commit, then force-terminate moved the epoch on).
    recover exits 1 with one line a command-line user can act on: no Python call (the
    library's own advice is DualWriter.resolve()), what to check and do by hand and in
    which order, the UPDATE of the state row to run, and what not to do. That UPDATE,
    run as printed, lets the writer start again (it is the compare-and-set resolve()
    runs: a second run changes nothing), and recover then finds nothing to commit."""
    if verdict == "diverged":
        topic, _, conf, _ = diverged(broker, jdbc_url, txn_id)
    else:
        s = Scenario(broker, jdbc_url)
        assert s.run("--batch", "0", "--crash-at", "after_db_commit").returncode == -9
        topic, txn_id = s.topic, s.txn_id
        conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    kafka = ["--bootstrap-servers", broker.bootstrap_servers, "--transactional-id", txn_id,
             "--yes"]  # fmt: skip
    if verdict == "unknowable":
        code, _, err = _call(["force-terminate", *kafka], capsys)
        assert code == 0, err
    stored = _state_rows(jdbc_url)[txn_id][0]
    recover = ["recover", *kafka, "--jdbc-url", jdbc_url]
    code, out, err = _call(recover, capsys)
    line = _one_line(err)
    assert code == 1 and out == ""
    assert "resolve()" not in line and "DualWriter" not in line
    assert f"stored state {stored!r}" in line
    assert "Do not run force-terminate" in line and "do not delete the state row" in line
    if verdict == "diverged":
        assert "Kafka aborted the transaction that the database committed" in line
        assert "1. read the topics it wrote with a read_committed consumer" in line
        assert "produce again that database transaction's records that are not there" in line
        assert "Do not update the row before the records are sent again" in line
    else:
        assert "cannot be known" in line
        assert "Do not send all its records again" in line and "not just mark it" in line
        assert "--isolation-level read_committed" in line and "2. produce only the missing" in line
    assert broker.read_committed(topic, expected=0, timeout=1) == []
    match = re.search(r": (UPDATE .*?); \(it changes 1 row", line)
    assert match is not None, line
    writer = DualWriter(conf, jdbc_url)
    try:
        with pytest.raises((TransactionDivergedError, TransactionOutcomeUnknowableError)):
            writer.start()  # the writer cannot start yet
        assert _execute(jdbc_url, match[1]) == 1
        assert _execute(jdbc_url, match[1]) == 0  # a compare-and-set: nothing twice
    finally:
        writer.close()
    writer = DualWriter(conf, jdbc_url)
    try:
        assert writer.start() is TransactionOutcome.NOTHING_TO_COMMIT
    finally:
        writer.close()
    code, out, err = _call(recover, capsys)
    assert code == 0, err
    assert out.strip() == f"{txn_id}: nothing_to_commit"


@pytest.mark.broker
def test_recover_asks_on_a_terminal(broker, tmp_path):
    """On a terminal, recover asks: "n" leaves everything as it was (exit 3), "y" settles."""
    s = Scenario(broker, f"jdbc:sqlite:{tmp_path}/tty.db")
    assert s.run("--batch", "0", "--crash-at", "after_db_commit").returncode == -9
    argv = ["recover", "--bootstrap-servers", broker.bootstrap_servers,
            "--jdbc-url", s.jdbc_url, "--transactional-id", s.txn_id]  # fmt: skip
    code, output = _in_terminal(argv, {"Proceed with recover? [y/N]": "n"})
    assert code == 3, output
    assert "not confirmed; nothing was done" in output
    assert broker.read_committed(s.topic, expected=0, timeout=1) == []
    code, output = _in_terminal(argv, {"Proceed with recover? [y/N]": "y"})
    assert code == 0, output
    assert f"{s.txn_id}: committed" in output
    s.assert_equal_sides(4)


@pytest.mark.adversary
@pytest.mark.broker
def test_recover_refuses_when_the_id_changed_hands_while_it_asked(broker, jdbc_url):
    """The question is about a crashed writer; while it is open, a new writer starts on
    the id (it recovers the crashed transaction and takes the id over). "y" is then about
    a writer that is gone: refused (exit 3), and the new writer is not fenced."""
    s = Scenario(broker, jdbc_url)
    assert s.run("--batch", "0", "--crash-at", "after_db_commit").returncode == -9
    newcomer = DualWriter({"bootstrap.servers": broker.bootstrap_servers,
                           "transactional.id": s.txn_id}, s.jdbc_url)  # fmt: skip

    def take_over() -> str:
        newcomer.start()
        return "y"

    try:
        code, output = _in_terminal(
            ["recover", "--bootstrap-servers", broker.bootstrap_servers,
             "--jdbc-url", s.jdbc_url, "--transactional-id", s.txn_id],
            {"Proceed with recover? [y/N]": take_over},
        )  # fmt: skip
        assert code == 3, output
        assert f"transactional id {s.txn_id!r} changed while you were asked" in output
        assert f"the state row's owner is now {newcomer.owner}" in output
        assert "nothing was done" in output
        assert _state_rows(s.jdbc_url)[s.txn_id][1] == newcomer.owner
        topic = broker.create_topic()
        with newcomer.transaction() as tx:  # not fenced
            tx.produce(topic, b"still mine")
        assert broker.read_committed(topic, expected=1) == [(None, b"still mine")]
    finally:
        newcomer.close()
    s.assert_equal_sides(4)  # the crashed transaction: committed, by the newcomer


@pytest.mark.adversary
@pytest.mark.broker
def test_recover_checks_the_state_row_again_under_its_lock(broker, jdbc_url, txn_id):
    """The last check, inside the DualWriter's start() under the state-row lock, before
    anything is settled, written or fenced: a row that changed hands since recover read it
    is refused (exit 3), and the writer now holding the id carries on."""
    _started_writer(broker, jdbc_url, txn_id)
    engine, url = open_database(jdbc_url, None, None, 30)
    try:
        checked = read_state_row(engine, url, STATE, txn_id)
        assert checked is not None
        newcomer = DualWriter({"bootstrap.servers": broker.bootstrap_servers,
                               "transactional.id": txn_id}, jdbc_url)  # fmt: skip
        newcomer.start()
        try:
            args = _parser().parse_args(["recover", "--bootstrap-servers",
                                         broker.bootstrap_servers, "--jdbc-url", jdbc_url,
                                         "--transactional-id", txn_id])  # fmt: skip
            with pytest.raises(CommandError) as info:
                settle(kafka_settings(args), engine, args, Deadline(30), checked)
            assert info.value.code == 3
            assert "changed hands before recover could lock its state row" in str(info.value)
            assert newcomer.owner in str(info.value) and "Nothing was done" in str(info.value)
            assert _state_rows(jdbc_url)[txn_id][1] == newcomer.owner
            topic = broker.create_topic()
            with newcomer.transaction() as tx:  # not fenced
                tx.produce(topic, b"still mine")
            assert broker.read_committed(topic, expected=1) == [(None, b"still mine")]
        finally:
            newcomer.close()
    finally:
        engine.dispose()


@pytest.mark.broker
def test_recover_asks_before_fencing_an_idle_writer_of_this_host(broker, jdbc_url, capsys, txn_id):
    """A writer between transactions, idle for longer than any window (its state row
    last written long ago, no transaction started): its owner token names this host and a
    process that runs (this one), so recover asks; without a terminal it refuses, and the
    writer carries on."""
    writer = DualWriter(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}, jdbc_url
    )
    writer.start()
    try:
        _set_row(jdbc_url, txn_id, updated_at=LONG_AGO)
        code, out, err = _call(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                                "--jdbc-url", jdbc_url, "--transactional-id", txn_id],
                               capsys)  # fmt: skip
        assert code == 3, err
        line = _one_line(err)
        assert f"owned by process {os.getpid()} of this host, which is running" in line
        assert writer.owner in line and "last written" in line and out == ""
        topic = broker.create_topic()
        with writer.transaction() as tx:  # not fenced
            tx.produce(topic, b"still mine")
        assert broker.read_committed(topic, expected=1) == [(None, b"still mine")]
    finally:
        writer.close()


@pytest.mark.broker
def test_recover_of_an_old_row_owned_on_another_host_does_not_ask(broker, capsys, tmp_path, txn_id):
    """An owner on another host cannot be checked: only recency applies, and a row and a
    transaction older than the window need no confirmation."""
    jdbc_url = f"jdbc:sqlite:{tmp_path}/elsewhere.db"
    _started_writer(broker, jdbc_url, txn_id)
    _set_row(jdbc_url, txn_id, updated_at=LONG_AGO, owner="elsewhere.invalid:4242:0badcafe")
    code, out, err = _call(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                            "--jdbc-url", jdbc_url, "--transactional-id", txn_id],
                           capsys)  # fmt: skip
    assert code == 0, err
    assert out.startswith(f"{txn_id}: ") and err == ""


@pytest.mark.adversary
@pytest.mark.broker
def test_recover_with_a_hung_broker_says_what_may_have_happened(broker, tmp_path):
    """The broker never answers InitProducerId, the fence after recovery: one line saying
    what may have happened and to run recover again; then, with the broker back, recover
    finishes and both sides hold the batch."""
    s = Scenario(broker, f"jdbc:sqlite:{tmp_path}/hung.db")
    assert s.run("--batch", "0", "--crash-at", "after_db_commit").returncode == -9
    with SecureProxy(broker.bootstrap_servers, stall=frozenset({22})) as proxy:
        done = _run("recover", "--bootstrap-servers", proxy.bootstrap_servers,
                    "--jdbc-url", s.jdbc_url, "--transactional-id", s.txn_id,
                    "--timeout", "5", "--yes")  # fmt: skip
    assert done.returncode == 1
    line = _one_line(done.stderr)
    assert f"recover of {s.txn_id!r} did not complete within 5s" in line
    assert "may or may not have been fenced" in line and "run recover again" in line
    assert "kafka-txn describe" in line and "complete_transaction()" not in line
    again = _run("recover", "--bootstrap-servers", broker.bootstrap_servers,
                 "--jdbc-url", s.jdbc_url, "--transactional-id", s.txn_id, "--yes")  # fmt: skip
    assert again.returncode == 0, again.stderr
    s.assert_equal_sides(4)


@pytest.mark.broker
def test_recover_with_a_state_table_older_than_the_owner_column(broker, jdbc_url, capsys, txn_id):
    """A state table created before owner tokens: one line with the statement to run
    (recover never changes a schema), not a Python argument the CLI does not have."""
    table = f"old_state_{uuid.uuid4().hex[:8]}"
    _initialised(broker, txn_id)  # the coordinator knows the id: recover gets that far
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        with engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE {table} (transactional_id VARCHAR(255) PRIMARY "
                              "KEY, prepared_txn_state VARCHAR(4096) NOT NULL, "
                              "updated_at TIMESTAMP NULL)"))  # fmt: skip
            conn.execute(text(f"INSERT INTO {table} VALUES (:t, '', :u)"),
                         {"t": txn_id, "u": LONG_AGO})  # fmt: skip
        code, out, err = _call(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                                "--jdbc-url", jdbc_url, "--transactional-id", txn_id,
                                "--state-table", table, "--yes"], capsys)  # fmt: skip
        assert code == 1 and out == ""
        line = _one_line(err)
        assert f"the state table {table!r}" in line and "has no 'owner' column" in line
        assert "ALTER TABLE" in line and "ADD COLUMN" in line and "nothing was done" in line
        assert "create_state_table" not in line
        columns = {c["name"] for c in inspect(engine).get_columns(table)}
        assert "owner" not in columns  # the schema is as it was
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE {table}"))
        engine.dispose()


@pytest.mark.adversary
@pytest.mark.broker
def test_recover_does_not_fence_a_live_writer_mid_transaction(broker, jdbc_url, capsys, txn_id):
    """A DualWriter mid-transaction in another thread: recover without --yes and without a
    terminal refuses (exit 3) and touches nothing; the writer then commits both sides."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    writer = DualWriter(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "transactional.id": txn_id,
            "delivery.report.only.error": False,  # send() below: every delivery report
        },
        jdbc_url,
    )
    events.create(writer.engine, checkfirst=True)
    writer.start()
    inside, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def live() -> None:
        try:
            with writer.transaction() as tx:
                tx.connection.execute(insert(events), [{"batch": 0, "value": "live"}])
                tx.send(topic, b"live").result(30)  # the coordinator now shows it Ongoing
                inside.set()
                release.wait(60)
        except BaseException as exc:
            errors.append(exc)
            inside.set()

    thread = threading.Thread(target=live)
    thread.start()
    try:
        assert inside.wait(60) and not errors, errors
        before = _state_rows(jdbc_url)[txn_id]
        code, out, err = _call(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                                "--jdbc-url", jdbc_url, "--transactional-id", txn_id,
                                "--timeout", "20"], capsys)  # fmt: skip
    finally:
        release.set()
        thread.join(60)
    assert code == 3, err
    line = _one_line(err)
    assert "is still open" in line and "would fence it" in line and out == ""
    assert errors == []
    assert _state_rows(jdbc_url)[txn_id][1] == before[1] == writer.owner  # still its owner
    assert broker.read_committed(topic, expected=1) == [(None, b"live")]
    with writer.transaction() as tx:  # and it carries on
        tx.produce(topic, b"after")
    writer.close()


@pytest.mark.broker
def test_recover_asks_when_the_state_row_was_written_recently(broker, jdbc_url, capsys, txn_id):
    """A writer that has just started and not yet begun a transaction: the coordinator
    shows none (start time -1), but its state row, written by start() moments ago by the
    database's clock, is reason enough to ask. The writer carries on untouched."""
    topic = broker.create_topic()
    writer = DualWriter(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}, jdbc_url
    )
    writer.start()
    try:
        code, out, err = _call(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                                "--jdbc-url", jdbc_url, "--transactional-id", txn_id],
                               capsys)  # fmt: skip
        assert code == 3, err
        line = _one_line(err)
        assert "has a state row last written" in line and "started" not in line
        assert writer.owner in line and out == ""
        with writer.transaction() as tx:
            tx.produce(topic, b"still mine")
        assert broker.read_committed(topic, expected=1) == [(None, b"still mine")]
    finally:
        writer.close()


@pytest.mark.broker
def test_recover_an_id_without_a_state_row_is_unknown(broker, jdbc_url, capsys, txn_id):
    _started_writer(broker, jdbc_url, f"{txn_id}-other")  # the state table exists
    code, out, err = _call(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                            "--jdbc-url", jdbc_url, "--transactional-id", txn_id, "--yes"],
                           capsys)  # fmt: skip
    assert code == 4 and out == ""
    line = _one_line(err)
    assert f"transactional id {txn_id!r} is unknown" in line and "no row for it" in line
    assert txn_id not in _state_rows(jdbc_url)  # no state row inserted
    assert not _coordinator_knows(broker, txn_id)  # nothing registered


@pytest.mark.broker
@pytest.mark.guarantee("3.10")
def test_recover_an_id_the_coordinator_does_not_know_is_unknown(broker, capsys, tmp_path):
    """A state row whose id Kafka does not know (expired, or never initialised): exit 4,
    the row unchanged, nothing registered; since the row holds a transaction not settled,
    the line also gives recovery's unknowable steps (3.10): check the topics, re-send the
    missing records only, then the UPDATE."""
    jdbc_url = f"jdbc:sqlite:{tmp_path}/expired.db"
    _started_writer(broker, jdbc_url, f"known-{uuid.uuid4().hex[:8]}")
    ghost = f"ghost-{uuid.uuid4().hex[:8]}"
    stored = f"kafka-txn:1;tid={ghost};pid=9999;epoch=3;start=1700000000000"
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    with engine.begin() as conn:
        conn.execute(
            text(f"INSERT INTO {STATE} (transactional_id, prepared_txn_state) VALUES (:t, :s)"),
            {"t": ghost, "s": stored},
        )
    engine.dispose()
    code, out, err = _call(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                            "--jdbc-url", jdbc_url, "--transactional-id", ghost],
                           capsys)  # fmt: skip
    assert code == 4 and out == ""
    line = _one_line(err)
    assert "unknown to the transaction coordinator" in line and stored in line
    assert "Kafka forgot it" in line and "read_committed" in line and "UPDATE" in line
    assert _state_rows(jdbc_url)[ghost] == (stored, None)
    assert not _coordinator_knows(broker, ghost)


# ---------------------------------------------------------------------- databases
@pytest.mark.broker
@pytest.mark.parametrize(
    ("database", "make_url", "needle"),
    [
        ("postgresql", lambda u, port: u.replace(":5432/", f":{port}/"),
         "nothing accepts connections at 127.0.0.1:"),
        ("postgresql", lambda u, port: u.replace("/test?", "/no_such_db?"),
         "there is no database 'no_such_db'"),
        ("postgresql", lambda u, port: u.replace("user=postgres", "user=no_such_role"),
         "there is no role 'no_such_role'"),
        ("mariadb", lambda u, port: u.replace(":3306/", f":{port}/"),
         "cannot connect to 127.0.0.1:"),
        ("mariadb", lambda u, port: u.replace("/test?", "/no_such_db?"),
         "there is no database 'no_such_db'"),
        ("mariadb", lambda u, port: u.replace("user=root", "user=no_such_user"),
         "access denied for user 'no_such_user'"),
        ("mariadb", lambda u, port: u + "&password=wrong",
         "access denied for user 'root': wrong password"),
    ],
    ids=["pg-refused", "pg-unknown-db", "pg-unknown-role", "maria-refused",
         "maria-unknown-db", "maria-unknown-user", "maria-wrong-password"],
)  # fmt: skip
def test_database_failures_are_one_line_and_exit_1(
    broker, request, capsys, txn_id, database, make_url, needle
):
    base = request.getfixturevalue("postgres_jdbc" if database == "postgresql" else "mariadb_jdbc")
    url = make_url(base, _closed_port())
    code, out, err = _call(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                            "--jdbc-url", url, "--transactional-id", txn_id, "--timeout", "10"],
                           capsys)  # fmt: skip
    assert code == 1
    line = _one_line(err)
    assert line.startswith("kafka-txn: error: ") and needle in line
    assert "password=wrong" not in line and out == ""
    assert not _coordinator_knows(broker, txn_id)


@pytest.mark.broker
def test_missing_state_table_is_one_line_and_nothing_is_created(broker, jdbc_url, capsys, txn_id):
    table = f"no_state_{uuid.uuid4().hex[:8]}"
    _started_writer(broker, jdbc_url, f"{txn_id}-other")  # the database exists (SQLite too)
    code, _, err = _call(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                          "--jdbc-url", jdbc_url, "--transactional-id", txn_id,
                          "--state-table", table], capsys)  # fmt: skip
    assert code == 1
    line = _one_line(err)
    assert f"the state table {table!r} does not exist" in line and "--state-table" in line
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        assert not inspect(engine).has_table(table)
    finally:
        engine.dispose()
    assert not _coordinator_knows(broker, txn_id)


@pytest.mark.broker
def test_sqlite_file_that_does_not_exist_is_not_created(broker, capsys, tmp_path, txn_id):
    for path in (tmp_path / "missing.db", tmp_path / "no_dir" / "missing.db"):
        code, _, err = _call(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                              "--jdbc-url", f"jdbc:sqlite:{path}", "--transactional-id", txn_id],
                             capsys)  # fmt: skip
        assert code == 1
        assert f"the SQLite database file {path} does not exist" in _one_line(err)
        assert not path.exists()
    (tmp_path / "junk.db").write_bytes(b"not a database at all, longer than a header" * 4)
    code, _, err = _call(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                          "--jdbc-url", f"jdbc:sqlite:{tmp_path}/junk.db",
                          "--transactional-id", txn_id], capsys)  # fmt: skip
    assert code == 1
    assert "is not a SQLite database" in _one_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.db"]


@pytest.fixture(scope="module")
def postgres_with_passwords() -> Iterator[str]:
    """A private PostgreSQL (initdb, as the postgres user, password authentication over
    TCP, on a free loopback port) for what the machine's trust-auth server cannot show: a
    wrong password. Stopped and deleted afterwards."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    assert bins, "PostgreSQL's server binaries are not installed"
    pg_bin = bins[-1]
    folder = Path(tempfile.mkdtemp(prefix="kafka-txn-pg-"))
    folder.chmod(0o755)
    shutil.chown(folder, "postgres")
    (folder / "pw").write_text("right-secret\n")
    shutil.chown(folder / "pw", "postgres")
    as_pg = ["runuser", "-u", "postgres", "--"]
    data = folder / "data"
    subprocess.run([*as_pg, str(pg_bin / "initdb"), "-D", str(data), "-U", "postgres",
                    "--auth-local=trust", "--auth-host=scram-sha-256",
                    f"--pwfile={folder / 'pw'}"],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    port = _closed_port()
    subprocess.run([*as_pg, str(pg_bin / "pg_ctl"), "-D", str(data), "-w", "-l",
                    str(folder / "log"), "-o",
                    f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    try:
        yield f"jdbc:postgresql://127.0.0.1:{port}/postgres?user=postgres"
    finally:
        subprocess.run([*as_pg, str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "-w", "stop"], check=False, capture_output=True, timeout=120)  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.broker
def test_postgres_password_from_the_environment(broker, postgres_with_passwords, txn_id):
    """Wrong password: one line naming it; the right one from --password-env or
    KAFKA_TXN_DB_PASSWORD gets in (the run then stops at the missing state table)."""
    argv = ["recover", "--bootstrap-servers", broker.bootstrap_servers,
            "--jdbc-url", postgres_with_passwords, "--transactional-id", txn_id]  # fmt: skip
    wrong = _run(*argv, "--password-env", "PW", env={"PW": "wrong"})
    assert wrong.returncode == 1
    assert "the password of 'postgres' is wrong" in _one_line(wrong.stderr)
    missing = _run(*argv)  # no password at all
    assert missing.returncode == 1
    assert "'postgres' needs a password" in _one_line(missing.stderr)
    for options, env in ((["--password-env", "PW"], {"PW": "right-secret"}),
                         ([], {"KAFKA_TXN_DB_PASSWORD": "right-secret"})):  # fmt: skip
        right = _run(*argv, *options, env=env)
        assert right.returncode == 1
        assert "the state table 'kafka_transaction_state' does not exist" in right.stderr
        assert "right-secret" not in right.stderr
    unset = _run(*argv, "--password-env", "KAFKA_TXN_TEST_UNSET_VARIABLE")
    assert unset.returncode == 2
    assert "KAFKA_TXN_TEST_UNSET_VARIABLE: that variable is not set" in unset.stderr


@pytest.mark.broker
def test_password_prompt_on_a_terminal(broker, postgres_with_passwords, txn_id):
    argv = ["recover", "--bootstrap-servers", broker.bootstrap_servers,
            "--jdbc-url", postgres_with_passwords, "--transactional-id", txn_id,
            "--password-prompt"]  # fmt: skip
    code, output = _in_terminal(argv, {"password for": "right-secret"})
    assert code == 1, output
    assert "the state table 'kafka_transaction_state' does not exist" in output
    assert "right-secret" not in output  # not echoed
    code, output = _in_terminal(argv, {"password for": "wrong"})
    assert code == 1 and "is wrong" in output, output


# ---------------------------------------------------------------------- timeouts
@pytest.mark.broker
@pytest.mark.parametrize("command", ["describe", "force-terminate", "recover"])
def test_unreachable_broker_honours_the_timeout(command, tmp_path, broker):
    """--timeout 5 against a closed port: exit 1 and one line naming the broker, in about
    the timeout (an upper bound only, as a hang guard: it took 122 s before)."""
    port = _closed_port()
    argv = [command, "--bootstrap-servers", f"127.0.0.1:{port}", "--transactional-id",
            "settled", "--timeout", "5"]  # fmt: skip
    if command == "recover":
        jdbc_url = f"jdbc:sqlite:{tmp_path}/state.db"
        _started_writer(broker, jdbc_url, "settled")  # a row, so the broker is asked
        argv += ["--jdbc-url", jdbc_url]
    started = time.monotonic()
    done = _run(*argv)
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    line = _one_line(done.stderr)
    assert f"no usable answer from a Kafka broker at 127.0.0.1:{port} within 5s" in line
    assert elapsed < 5 + 25


def test_a_broker_that_never_answers_honours_the_timeout():
    """Connections accepted, requests never answered: the per-request wait is bounded by
    --timeout too (the coordinator client's own default is 10 s per socket)."""
    with _silent_server() as port:
        started = time.monotonic()
        done = _run("describe", "--bootstrap-servers", f"127.0.0.1:{port}",
                    "--transactional-id", "x", "--timeout", "3")  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert f"127.0.0.1:{port} within 3s" in _one_line(done.stderr)
    assert elapsed < 3 + 25


def test_progress_on_a_terminal_and_verbose_logs():
    """A wait longer than two seconds shows a progress line on a terminal (erased before
    the error line); in a pipe stderr stays one line, and -v adds log lines."""
    with _silent_server() as port:
        argv = ["describe", "--bootstrap-servers", f"127.0.0.1:{port}",
                "--transactional-id", "x", "--timeout", "4"]  # fmt: skip
        code, output = _in_terminal(argv)
        assert code == 1
        assert f"kafka-txn: waiting for the transaction coordinator via 127.0.0.1:{port}" in output
        assert "\x1b[K" in output  # erased
        assert (
            output.rstrip()
            .splitlines()[-1]
            .split("\x1b[K")[-1]
            .startswith("kafka-txn: error: no usable answer")
        )
        verbose = _run(*argv, "-v")
    assert verbose.returncode == 1
    lines = verbose.stderr.strip().splitlines()
    assert len(lines) > 1
    assert any("INFO kafka_txn.cli: waiting for the transaction coordinator" in x for x in lines)
    assert lines[-1].startswith("kafka-txn: error: ")


@pytest.mark.parametrize(
    "jdbc", ["jdbc:postgresql://127.0.0.1:{port}/test?user=postgres",
             "jdbc:mysql://127.0.0.1:{port}/test?user=root"],
    ids=["postgresql", "mysql"],
)  # fmt: skip
def test_a_database_that_never_answers_honours_the_timeout(jdbc):
    """The database port accepts connections and never answers (PyMySQL's
    connect_timeout alone covers the TCP connect, not the server's greeting): exit 1 and
    one line, in about --timeout (an upper bound as a hang guard only)."""
    with _silent_server() as port:
        started = time.monotonic()
        done = _run("recover", "--bootstrap-servers", "127.0.0.1:1", "--transactional-id",
                    "x", "--jdbc-url", jdbc.format(port=port), "--timeout", "3",
                    timeout=60)  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    line = _one_line(done.stderr)
    assert f"no answer from 127.0.0.1:{port} in time" in line
    assert elapsed < 3 + 25


@pytest.mark.broker
def test_a_broker_certificate_kafka_txn_does_not_trust_is_named_as_such(broker, capsys, tmp_path):
    """kafka-txn refuses the broker's certificate (signed by a CA it was not given): said
    as kafka-txn not trusting the broker, not as the broker refusing kafka-txn."""
    certs = make_certificates(tmp_path / "certs")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(certs.server_cert, certs.server_key)
    with SecureProxy(broker.bootstrap_servers, tls=server) as proxy:
        code, out, err = _call(["describe", "--bootstrap-servers", proxy.bootstrap_servers,
                                "--transactional-id", "x", "-X", "security.protocol=SSL",
                                "-X", f"ssl.ca.location={certs.other_ca}", "--timeout", "10"],
                               capsys)  # fmt: skip
    assert code == 1 and out == ""
    line = _one_line(err)
    assert line.startswith(
        f"kafka-txn: error: kafka-txn does not trust the TLS certificate of the broker at "
        f"{proxy.bootstrap_servers}, and did not connect: "
    )
    assert "ssl.ca.location" in line and "refused to authenticate" not in line
    assert line.count("does not trust") == 1 and line.count(proxy.bootstrap_servers) == 1


@pytest.mark.parametrize("server", ["http", "postgresql"])
def test_a_port_that_is_not_kafka_says_so_in_one_line(server, request):
    """An HTTP server, or PostgreSQL's port: named as not Kafka at once, not retried until
    the timeout, and never as a nonsense "response size 1213486160"."""
    with contextlib.ExitStack() as stack:
        if server == "http":
            port = stack.enter_context(_http_server())
        else:
            request.getfixturevalue("postgres_jdbc")  # PostgreSQL runs on 5432
            port = 5432
        started = time.monotonic()
        done = _run("describe", "--bootstrap-servers", f"127.0.0.1:{port}",
                    "--transactional-id", "x", "--timeout", "20")  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 1
    line = _one_line(done.stderr)
    assert line.startswith(f"kafka-txn: error: 127.0.0.1:{port} is not a usable Kafka broker: ")
    assert "does not speak the Kafka protocol" in line and "response size" not in line
    assert line.count(f"127.0.0.1:{port}") == 1, line  # the address, said once
    assert elapsed < 20  # not retried until the timeout


# ---------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["describe", "--bootstrap-servers", "127.0.0.1:1"], "--transactional-id"),
        (["nonsense"], "invalid choice"),
        (["describe", "--bootstrap-servers", "h:1", "--transactional-id", "x", "-X", "novalue"],
         "-X 'novalue' is not key=value"),
        (["describe", "--bootstrap-servers", "h:1", "--transactional-id", "x",
          "-X", "no.such.property=1"], 'No such configuration property: "no.such.property"'),
        (["describe", "--bootstrap-servers", "h:1", "--transactional-id", "x",
          "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=GSSAPI"], "GSSAPI"),
        (["force-terminate", "--bootstrap-servers", "h:1", "--transactional-id", "x",
          "-X", "enable.idempotence=false"], "enable.idempotence"),
        (["recover", "--bootstrap-servers", "h:1", "--transactional-id", "x",
          "--jdbc-url", "jdbc:oracle:thin:@h:1:x"], "unsupported subprotocol 'oracle'"),
        (["describe", "--bootstrap-servers", "h:1", "--transactional-id", "x",
          "--timeout", "0"], "must be a positive number of seconds"),
        (["recover", "--bootstrap-servers", "h:1", "--transactional-id", "x", "--jdbc-url",
          "jdbc:sqlite:x.db", "--password", "a", "--password-env", "B"], "not allowed with"),
        (["demo", "--timeout", "3"], "unrecognized arguments: --timeout 3"),
        (["demo", "-X", "acks=all"], "unrecognized arguments: -X"),
    ],
)  # fmt: skip
def test_bad_arguments_exit_2(argv, needle, capsys):
    """Exit 2 and one line; argparse's own errors print the usage before it, and nothing
    else."""
    code, out, err = _call(argv, capsys)
    assert code == 2
    assert needle in err
    *usage, last = err.strip().splitlines()
    assert last.startswith("kafka-txn")
    if usage:
        assert usage[0].startswith("usage: kafka-txn"), err
        assert all(line.startswith(" ") for line in usage[1:]), err
    assert out == ""


_PYTHON_OBJECTS = ["error_cb=x", "stats_cb=x", "throttle_cb=x", "oauth_cb=x", "on_delivery=x",
                   "logger=x"]  # fmt: skip
_NOT_TRANSACTIONAL = ["acks=1", "retries=0", "max.in.flight.requests.per.connection=6",
                      "message.timeout.ms=1000000"]  # fmt: skip


@pytest.mark.parametrize("command", ["describe", "force-terminate", "recover"])
@pytest.mark.parametrize("setting", [*_PYTHON_OBJECTS, *_NOT_TRANSACTIONAL])
def test_a_setting_no_transactional_producer_can_have_exits_2_on_one_line(command, setting, capsys):
    """Checked the same way for every command, before anything connects: a callback or
    logger (a Python object: a command line has only strings), and what librdkafka
    refuses for a transactional producer. One line, exit 2; nothing is reached (the
    broker's port is closed, the database file does not exist)."""
    argv = [command, "--bootstrap-servers", f"127.0.0.1:{_closed_port()}",
            "--transactional-id", "x", "-X", setting]  # fmt: skip
    if command == "recover":
        argv += ["--jdbc-url", "jdbc:sqlite:/nonexistent/state.db"]
    code, out, err = _call(argv, capsys)
    assert code == 2, err
    line = _one_line(err)
    assert line.startswith(f"kafka-txn: {command}: error: -X"), line
    key = setting.partition("=")[0].removesuffix(".requests.per.connection")
    assert key in line and out == ""


def test_version(capsys):
    code, out, _ = _call(["--version"], capsys)
    import confluent_kafka

    from kafka_txn import __version__

    assert code == 0
    assert out.startswith(f"kafka-txn {__version__} (confluent-kafka ")
    assert f"librdkafka {confluent_kafka.libversion()[0]}" in out


def test_every_option_has_help_and_fencing_commands_say_so():
    parser = _parser()
    [commands] = [a for a in parser._actions if a.dest == "command"]
    for name, sub in commands.choices.items():
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings} has no help"
        text = sub.format_help()
        fences = name in ("recover", "force-terminate")
        assert ("It FENCES" in text) == fences, name
        if fences:
            assert "--yes" in text and "exit code 3" in text
    recover = " ".join(commands.choices["recover"].format_help().split())
    assert "VISIBLE to other users in process lists" in recover
    assert "KAFKA_TXN_DB_PASSWORD" in recover
    assert set(commands.choices["demo"].format_help().split()) >= {"--batches", "--seed"}


# ---------------------------------------------------------------------- extras
_WITHOUT = "import sys; sys.modules[{module!r}] = None; from kafka_txn.cli.main import main; "


@pytest.mark.parametrize(
    ("module", "argv", "extra"),
    [
        ("psycopg", ["recover", "--jdbc-url", "jdbc:postgresql://127.0.0.1:1/db"], "postgres"),
        ("pymysql", ["recover", "--jdbc-url", "jdbc:mysql://127.0.0.1:1/db"], "mysql"),
        ("pymysql", ["recover", "--jdbc-url", "jdbc:mariadb://127.0.0.1:1/db"], "mysql"),
        ("sqlalchemy", ["recover", "--jdbc-url", "jdbc:sqlite:x.db"], "sql"),
        ("sqlalchemy", ["demo", "--bootstrap-servers", "127.0.0.1:1"], "demo"),
    ],
)  # fmt: skip
def test_a_missing_package_names_its_extra(module, argv, extra):
    """Run with ``module`` made unimportable (sys.modules[name] = None is how Python
    marks a module that cannot be imported)."""
    if argv[0] == "recover":
        argv = [*argv, "--bootstrap-servers", "127.0.0.1:1", "--transactional-id", "x"]
    code = _WITHOUT.format(module=module) + f"sys.exit(main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False, cwd=ROOT)  # fmt: skip
    assert done.returncode == 1, done.stderr
    line = _one_line(done.stderr)
    assert f"pip install 'kafka-txn[{extra}]'" in line
    assert "[test]" not in line


# ---------------------------------------------------------------------- demo
@pytest.mark.broker
def test_demo_runs_and_verifies(broker):
    done = _run("demo", "--bootstrap-servers", broker.bootstrap_servers, "--batches", "6",
                timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "VERIFIED" in done.stdout
    assert "[  6/6]" in done.stdout  # progress shown
