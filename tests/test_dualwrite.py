"""The dual-write recipe on PostgreSQL, MariaDB and SQLite: writers killed at every step,
racing writers, an unknown COMMIT outcome, and bad input. After each, the database rows
equal what a read_committed consumer sees: nothing lost, nothing twice."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import create_engine, select, text

from kafka_txn import ConfigurationError, DatabaseCommitUnknownError, TransactionOutcome
from kafka_txn.dualwrite import STEPS, DualWriter, validate_identifier
from kafka_txn.jdbc import jdbc_to_sqlalchemy
from tests.dualwrite_app import events_table

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.broker


class Scenario:
    """One topic, transactional id, events table and database, and the app around them."""

    def __init__(self, broker, jdbc_url: str) -> None:
        self.broker = broker
        self.jdbc_url = jdbc_url
        self.topic = broker.create_topic(partitions=2)
        suffix = uuid.uuid4().hex[:10]
        self.txn_id = f"dw-{suffix}"
        self.table = f"events_{suffix}"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "tests" / "dualwrite_app.py"),
             "--jdbc-url", self.jdbc_url, "--bootstrap-servers", self.broker.bootstrap_servers,
             "--topic", self.topic, "--transactional-id", self.txn_id,
             "--events-table", self.table, *args],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip

    def rows(self) -> list[bytes]:
        engine = create_engine(jdbc_to_sqlalchemy(self.jdbc_url))
        try:
            with engine.connect() as conn:
                values = conn.execute(select(events_table(self.table).c.value)).scalars()
                return sorted(v.encode() for v in values)
        finally:
            engine.dispose()

    def assert_equal_sides(self, expected: int) -> None:
        rows = self.rows()
        assert len(rows) == expected
        kafka = sorted(v for _, v in self.broker.read_committed(self.topic, expected=expected))
        assert kafka == rows


@pytest.mark.parametrize("step", STEPS)
def test_killed_at_every_step_then_recovered(broker, jdbc_url, step):
    s = Scenario(broker, jdbc_url)
    first = s.run("--batch", "0")
    assert first.returncode == 0, first.stdout + first.stderr
    crashed = s.run("--batch", "1", "--crash-at", step)
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    recovered = s.run("--mode", "recover")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    committed = STEPS.index(step) >= STEPS.index("after_db_commit")
    outcome = recovered.stdout.splitlines()[0].removeprefix("outcome=")
    expected_outcome = {
        "after_db_commit": TransactionOutcome.COMMITTED,
        "after_kafka_commit": TransactionOutcome.ALREADY_COMMITTED,
    }.get(step, TransactionOutcome.NOTHING_TO_COMMIT)
    assert outcome == expected_outcome
    s.assert_equal_sides(8 if committed else 4)
    # ... and the application carries on.
    assert s.run("--batch", "2").returncode == 0
    s.assert_equal_sides(12 if committed else 8)


def test_two_writers_with_one_transactional_id(broker, jdbc_url):
    s = Scenario(broker, jdbc_url)
    assert s.run("--batch", "0").returncode == 0  # creates the tables and the state row
    first = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "dualwrite_app.py"),
         "--jdbc-url", s.jdbc_url, "--bootstrap-servers", broker.bootstrap_servers,
         "--topic", s.topic, "--transactional-id", s.txn_id, "--events-table", s.table,
         "--batch", "100", "--batches", "40", "--pause", "0.05"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert first.stdout is not None
    assert first.stdout.readline().startswith("outcome=")
    assert first.stdout.readline().startswith("committed=")  # it is under way
    second = s.run("--batch", "500", "--batches", "3")
    out, err = first.communicate(timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    # The first writer was fenced by the second's start(): it stopped cleanly.
    assert first.returncode == 3, out + err
    assert "fenced=" in out
    rows = s.rows()
    assert {r.split(b"-")[0] for r in rows} >= {b"b0", b"b500", b"b501", b"b502"}
    s.assert_equal_sides(len(rows))


def test_exception_in_the_body_rolls_back_both(broker, jdbc_url, txn_id):
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    with DualWriter(conf, jdbc_url) as writer:
        events.metadata.create_all(writer.engine, checkfirst=True)
        with pytest.raises(ZeroDivisionError), writer.transaction() as tx:
            tx.connection.execute(events.insert(), [{"batch": 0, "value": "never"}])
            tx.produce(topic, b"never")
            1 / 0  # noqa: B018
        with writer.transaction() as tx:
            tx.connection.execute(events.insert(), [{"batch": 1, "value": "kept"}])
            tx.send(topic, b"kept")
        with writer.engine.connect() as conn:
            assert list(conn.execute(select(events.c.value)).scalars()) == ["kept"]
    assert broker.read_committed(topic, expected=1) == [(None, b"kept")]


def test_lost_connection_during_commit_never_aborts_kafka_blindly(broker, postgres_jdbc, txn_id):
    """The database connection dies at COMMIT: the writer refuses to guess, and the next
    start() makes Kafka match what the database did (here: nothing)."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    killer = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    backend: list[int] = []

    def on_step(step: str) -> None:
        if step == "after_state_write":
            with killer.begin() as conn:
                conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": backend[0]})

    writer = DualWriter(conf, postgres_jdbc, on_step=on_step)
    events.metadata.create_all(writer.engine, checkfirst=True)
    writer.start()
    with pytest.raises(DatabaseCommitUnknownError), writer.transaction() as tx:
        backend.append(tx.connection.execute(text("SELECT pg_backend_pid()")).scalar_one())
        tx.connection.execute(events.insert(), [{"batch": 0, "value": "lost"}])
        tx.produce(topic, b"lost")
    with pytest.raises(DatabaseCommitUnknownError), writer.transaction():
        pass  # the writer stays stopped
    writer.close()
    killer.dispose()

    with DualWriter(conf, postgres_jdbc) as restarted, restarted.engine.connect() as conn:
        assert list(conn.execute(select(events.c.value)).scalars()) == []
    assert broker.read_committed(topic, expected=0) == []


@pytest.mark.parametrize(
    "name", ["state; DROP TABLE x", 'a"b', "1abc", "", "x" * 64, "naïve", "a-b", "a b"]
)
def test_sql_identifiers_are_validated(name, broker, tmp_path):
    with pytest.raises(ConfigurationError, match="not a plain SQL identifier"):
        validate_identifier(name, "state_table")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "t"}
    with pytest.raises(ConfigurationError, match="state_table"):
        DualWriter(conf, f"jdbc:sqlite:{tmp_path}/x.db", state_table=name)


# ---------------------------------------------------------------- JDBC URLs
@pytest.mark.parametrize(
    ("jdbc", "expected"),
    [
        ("jdbc:postgresql://db.example:5433/app?user=u&password=p%40ss&sslmode=require",
         "postgresql+psycopg://u:***@db.example:5433/app?sslmode=require"),
        ("jdbc:postgresql://h/app", "postgresql+psycopg://h:5432/app"),
        ("jdbc:mysql://h:3307/app?user=root", "mysql+pymysql://root@h:3307/app"),
        ("jdbc:mariadb://h/app?user=root&password=", "mysql+pymysql://root:***@h:3306/app"),
        ("jdbc:postgresql://[::1]:5432/app", "postgresql+psycopg://[::1]:5432/app"),
        ("jdbc:sqlite:/var/data/app.db", "sqlite:////var/data/app.db"),
        ("jdbc:sqlite:rel.db", "sqlite:///rel.db"),
        ("jdbc:sqlite::memory:", "sqlite://"),
    ],
)  # fmt: skip
def test_jdbc_urls_map_to_sqlalchemy(jdbc, expected):
    assert jdbc_to_sqlalchemy(jdbc).render_as_string(hide_password=True) == expected


def test_jdbc_credentials_from_arguments_win():
    url = jdbc_to_sqlalchemy("jdbc:postgresql://h/app?user=a&password=b", user="c", password="d")
    assert (url.username, url.password) == ("c", "d")


@pytest.mark.parametrize(
    ("jdbc", "needle"),
    [
        ("postgresql://h/app", "does not start with 'jdbc:'"),
        ("jdbc:oracle:thin:@h:1521:x", "unsupported subprotocol 'oracle'"),
        ("jdbc:postgresql:h/app", "expected jdbc:postgresql://host"),
        ("jdbc:postgresql://h", "exactly one database"),
        ("jdbc:postgresql://h/a/b", "exactly one database"),
        ("jdbc:postgresql://h:notaport/app", "bad host or port"),
        ("jdbc:postgresql:///app", "no host"),
        ("jdbc:postgresql://u:p@h/app", "credentials"),
        ("jdbc:sqlite://h/x", "SQLite takes a file path"),
        ("jdbc:postgresql://h/app\nDROP", "control character"),
        ("jdbc", "does not start with 'jdbc:'"),
    ],
)
def test_bad_jdbc_urls_say_what_and_list_the_supported(jdbc, needle):
    with pytest.raises(ConfigurationError) as info:
        jdbc_to_sqlalchemy(jdbc)
    assert needle in str(info.value)
    assert "jdbc:postgresql://" in str(info.value)  # the list of what is supported


@given(st.text(max_size=120))
def test_fuzz_jdbc_parser_raises_only_configuration_error(text_):
    try:
        url = jdbc_to_sqlalchemy("jdbc:" + text_)
    except ConfigurationError:
        return
    assert url.drivername in ("postgresql+psycopg", "mysql+pymysql", "sqlite")


def test_unsupported_database_and_missing_driver_are_clear(broker):
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "t"}
    with pytest.raises(ConfigurationError, match="neither a JDBC URL nor a SQLAlchemy URL"):
        DualWriter(conf, "::::")
    with pytest.raises(ConfigurationError, match="no dialect/driver"):
        DualWriter(conf, "postgresql+nosuchdriver://h/db")
