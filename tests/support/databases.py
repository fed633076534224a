"""The databases of the test rig: PostgreSQL and MariaDB as the machine runs them (started
here if they are down, with the machine's own commands), and SQLite files. Each is given
as the JDBC URL a Spark user would write."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy

POSTGRES_JDBC = "jdbc:postgresql://127.0.0.1:5432/test?user=postgres"
MARIADB_JDBC = "jdbc:mariadb://127.0.0.1:3306/test?user=root"

_START = {
    "postgresql": ("pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"),
    "mariadb": "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd",
}


def _reachable(jdbc: str) -> bool:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return True
    except OperationalError:
        return False
    finally:
        engine.dispose()


def ensure_running(name: str, jdbc: str, timeout: float = 60.0) -> str:
    """``jdbc`` once its server answers; starts the server if it does not. Raises (so
    the run fails, never skips) if it cannot be had."""
    if _reachable(jdbc):
        return jdbc
    command = _START[name]
    if shutil.which(command.split()[0]) is None:
        raise RuntimeError(f"{name} is down and {command.split()[0]} is not installed")
    subprocess.run(command, shell=True, check=False, timeout=60)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _reachable(jdbc):
            return jdbc
        time.sleep(0.5)
    raise RuntimeError(f"{name} did not come up at {jdbc} within {timeout:g}s")


# The tables the writers and the sink create under their default names, shared by every
# test run on a database, and their columns that hold ids.
_DEFAULT_ID_COLUMNS = {
    "kafka_transaction_state": ("transactional_id",),
    "kafka_txn_sink_commits": ("sink", "query_id"),
    "kafka_txn_sink_commits_queries": ("sink", "query_id"),
    "kafka_txn_sink_commits_batches": ("sink", "query_id"),
}


def upgrade_default_tables(jdbc: str) -> None:
    """MariaDB tables under the default names whose id columns ignore case (MariaDB's
    default collation) get the ALTER that start()'s refusal names (docs/guide/dual-write.md),
    so that a machine whose database already holds such tables runs the tests too. Only
    case-insensitive id columns are changed; nothing is dropped."""
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.begin() as conn:
            rows = conn.execute(
                text(
                    "SELECT table_name, column_name, character_maximum_length, is_nullable "
                    "FROM information_schema.columns WHERE table_schema = DATABASE() "
                    "AND collation_name NOT LIKE '%\\_bin' AND collation_name IS NOT NULL"
                )
            ).all()
            for table, column, length, nullable in rows:
                if column not in _DEFAULT_ID_COLUMNS.get(table, ()):
                    continue
                null = "NULL" if nullable == "YES" else "NOT NULL"
                conn.execute(
                    text(
                        f"ALTER TABLE {table} MODIFY {column} VARCHAR({length}) "
                        f"CHARACTER SET utf8mb4 COLLATE utf8mb4_bin {null}"
                    )
                )
    finally:
        engine.dispose()


def sqlite_jdbc(folder: Path) -> str:
    return f"jdbc:sqlite:{folder / 'kafka-txn.sqlite'}"


def unique_name(prefix: str) -> str:
    """A table name no other test run uses."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def id_value_table(name: str) -> Table:
    """A table of (id, value) rows, as the adversarial dual-write tests write."""
    return Table(
        name, MetaData(), Column("id", Integer, primary_key=True), Column("value", String(64))
    )


def drop_tables(engine: Engine, *tables: str) -> None:
    with engine.begin() as conn:
        for table in tables:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))


def sorted_values(engine: Engine, table: Table) -> list[str]:
    """The table's values, read back with a direct SQL query."""
    with engine.connect() as conn:
        return sorted(conn.execute(select(table.c.value)).scalars())
