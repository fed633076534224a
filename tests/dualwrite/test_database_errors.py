"""A database that cannot be reached or refuses the login is named with its fix by
``DualWriter`` (``start()``, the first ``transaction()``), the Spark sink and
``kafka-txn recover`` alike: ``DatabaseUnavailableError`` with the driver's error as its
cause and the URL without its password, never a raw SQLAlchemy ``OperationalError``.
Real PostgreSQL (a private server with password authentication for the wrong password),
MariaDB and SQLite; no broker is needed (the database is opened before Kafka)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.exc import DatabaseError, OperationalError

from kafka_txn import DatabaseUnavailableError, DualWriter
from kafka_txn.cli.database import DatabaseUnusableError, open_database, read_state_row
from tests.cli.test_cli import postgres_with_passwords  # noqa: F401 - a fixture

FAST_S = 5.0
"""A refused port, a wrong password or a missing database answers at once; the bound
leaves room for a loaded machine."""


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kafka() -> dict[str, str]:
    # Never reached: the database is opened first.
    return {"bootstrap.servers": f"127.0.0.1:{_refused_port()}", "transactional.id": "db-errors"}


# (database fixture, how to spoil its URL, what the message must say)
Case = tuple[str, Callable[[str], str], tuple[str, ...]]
CASES: dict[str, Case] = {
    "pg-refused": ("postgres_jdbc", lambda u: u.replace(":5432/", f":{_refused_port()}/"),
                   ("nothing accepts connections at 127.0.0.1:", "connection refused",
                    "is PostgreSQL running?")),
    "pg-unknown-db": ("postgres_jdbc", lambda u: u.replace("/test?", "/nope?"),
                      ("there is no database 'nope'", "create it")),
    "pg-wrong-password": ("postgres_with_passwords", lambda u: u + "&password=wrong",
                          ("wrong password for user 'postgres' at 127.0.0.1:",)),
    "pg-unresolvable-host": ("postgres_jdbc",
                             lambda u: u.replace("127.0.0.1:", "no-such-host.invalid:"),
                             ("the host 'no-such-host.invalid' does not resolve",)),
    "maria-refused": ("mariadb_jdbc", lambda u: u.replace(":3306/", f":{_refused_port()}/"),
                      ("cannot connect to 127.0.0.1:", "connection refused",
                       "is the server running?")),
    "maria-unknown-db": ("mariadb_jdbc", lambda u: u.replace("/test?", "/nope?"),
                         ("there is no database 'nope'", "create it")),
    "maria-wrong-password": ("mariadb_jdbc", lambda u: u + "&password=wrong",
                             ("access denied for user 'root': wrong password",)),
}  # fmt: skip


def _url(request: pytest.FixtureRequest, case: str) -> tuple[str, tuple[str, ...]]:
    fixture, spoil, needles = CASES[case]
    return spoil(request.getfixturevalue(fixture)), needles


def _start_failure(url: str) -> DatabaseUnavailableError:
    writer = DualWriter(_kafka(), url)
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailableError) as caught:
            writer.start()
        assert time.monotonic() - started < FAST_S
    finally:
        writer.close()
    return caught.value


@pytest.mark.guarantee("4.16")
@pytest.mark.parametrize("case", sorted(CASES))
def test_dual_writer_start_names_the_database_and_the_fix(
    request: pytest.FixtureRequest, case: str
) -> None:
    """start() raises DatabaseUnavailableError naming the fix in DualWriter's terms, at
    once, with the driver's OperationalError as its cause and no password in the URL."""
    url, needles = _url(request, case)
    exc = _start_failure(url)
    message = str(exc)
    assert message.startswith("DualWriter.start(): cannot use ")
    for needle in needles:
        assert needle in message, message
    assert "DualWriter's" in message and "nothing was written" in message
    assert isinstance(exc.__cause__, OperationalError)
    if "password=" in url:
        assert "wrong" not in exc.url and "***" in exc.url, exc.url


@pytest.mark.guarantee("4.16")
def test_an_unwritable_sqlite_path_is_named(tmp_path: Path) -> None:
    """A SQLite file whose directory does not exist: the path and the fix."""
    path = tmp_path / "missing" / "dir" / "w.db"
    exc = _start_failure(f"jdbc:sqlite:{path}")
    assert f"cannot open the SQLite file {path}" in str(exc)
    assert "check that its directory exists and is writable" in str(exc)


@pytest.mark.guarantee("4.16")
def test_a_file_that_is_not_a_sqlite_database_is_named(tmp_path: Path) -> None:
    """A text file given as the SQLite database: start() names the path and the fix
    (DatabaseUnavailableError, the driver's DatabaseError as its cause), and the file is
    left as it was."""
    path = tmp_path / "notadb.txt"
    path.write_text("not a database\n" * 100)
    exc = _start_failure(f"jdbc:sqlite:{path}")
    message = str(exc)
    assert message.startswith(
        f"DualWriter.start(): the SQLite file {path} is not a SQLite "
        "database: check the path in DualWriter's database"
    ), message
    assert "nothing was written" in message
    assert isinstance(exc.__cause__, DatabaseError)
    assert path.read_text() == "not a database\n" * 100


@pytest.mark.guarantee("4.16")
def test_the_first_transaction_names_it_too(postgres_jdbc: str) -> None:
    """transaction() on a writer that has not started starts it: the same error, before
    its body runs."""
    writer = DualWriter(_kafka(), postgres_jdbc.replace("/test?", "/nope?"))
    ran = False
    try:
        with (
            pytest.raises(DatabaseUnavailableError, match="there is no database 'nope'"),
            writer.transaction(),
        ):
            ran = True
    finally:
        writer.close()
    assert not ran


@pytest.mark.guarantee("4.16")
@pytest.mark.parametrize("case", ["pg-unknown-db", "maria-refused", "maria-wrong-password"])
def test_the_cli_says_the_same_in_its_options(request: pytest.FixtureRequest, case: str) -> None:
    """kafka-txn recover's database step (open_database, read_state_row) gives the same
    translation, naming its own options (--jdbc-url, --user, --password-env)."""
    url, needles = _url(request, case)
    engine, sa_url = open_database(url, None, None, timeout=5)
    try:
        with pytest.raises(DatabaseUnusableError) as caught:
            read_state_row(engine, sa_url, "kafka_transaction_state", "db-errors")
    finally:
        engine.dispose()
    message = str(caught.value)
    for needle in needles:
        assert needle in message, message
    assert "--" in message and "DualWriter" not in message


@pytest.mark.guarantee("4.16")
def test_the_spark_sink_names_it_in_its_options(mariadb_jdbc: str) -> None:
    """The sink's driver opens its database before the first batch (the code path of
    every batch, without starting Spark): DatabaseUnavailableError names the sink and
    its url option; a DualWriter's error on an executor is restated in the sink's terms."""
    pytest.importorskip("pyspark")
    from kafka_txn.spark import KafkaJdbcSink
    from kafka_txn.spark.unavailable import in_sink_terms

    url = mariadb_jdbc.replace("/test?", "/nope?")
    sink = KafkaJdbcSink(
        transactional_id_prefix="db-errors", kafka={"bootstrap.servers": "127.0.0.1:9"},
        topic="t", url=url,
        dbtable="rows",
    )  # fmt: skip
    with pytest.raises(DatabaseUnavailableError) as caught:
        sink._prepare(None)  # type: ignore[arg-type]  # fails before the mapping is read
    message = str(caught.value)
    assert message.startswith("KafkaJdbcSink: cannot use MySQL/MariaDB")
    assert "there is no database 'nope'" in message and "the sink's url option" in message

    writer = DualWriter(_kafka(), url)
    try:
        with (
            pytest.raises(DatabaseUnavailableError) as caught,
            in_sink_terms("KafkaJdbcSink batch 3 partition 0", writer.engine),
        ):
            writer.start()
    finally:
        writer.close()
    message = str(caught.value)
    assert message.startswith("KafkaJdbcSink batch 3 partition 0: cannot use")
    assert "the sink's url option" in message and "DualWriter" not in message
    assert isinstance(caught.value.__cause__, OperationalError)
