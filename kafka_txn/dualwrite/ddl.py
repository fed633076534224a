"""DDL that many processes and threads may run at once: create a table, add a column.

Spark tasks, DualWriters starting together and several drivers all create the same
tables on a fresh database. Checking first and then creating is a race on every database,
so each function here does one of two things, and both end in "the object exists":

PostgreSQL
    The DDL runs in a READ COMMITTED transaction that first takes a transaction-scoped
    advisory lock on the table's schema-qualified name (``pg_advisory_xact_lock``), then
    looks again and creates only if the object is still missing. ``CREATE TABLE IF NOT
    EXISTS`` alone is not enough: its existence check does not see a concurrent creator's
    uncommitted catalog rows, so both sessions go on to insert into ``pg_type`` /
    ``pg_class``, and the second fails on the catalog's unique index
    (``pg_type_typname_nsp_index``) or with ``duplicate_table`` (42P07) once the first
    commits (Stack Overflow 29908840, "CREATE SCHEMA IF NOT EXISTS raises duplicate key
    error"; pgsql-hackers, message-id
    CAKU4AWpGFMgp3zF-8TUkpydPZ5kJcY-yWcdN92mwRnSbJW2zhQ@mail.gmail.com). The advisory lock
    is released only after the holder's COMMIT (docs, "Advisory Lock Functions": released
    at the end of the transaction; "Locks are always released after the transaction has
    committed", Tom Lane, pgsql-general, "Transaction-level advisory lock unlocking and
    transaction end", 2015-01-15), and under READ COMMITTED each statement takes a new
    snapshot (docs, "Read Committed Isolation Level"), so the waiter's second look sees
    the winner's table. Advisory locks are local to the database, and a wait for one is
    bounded by ``lock_timeout`` as any lock wait (ProcSleep, src/backend/storage/lmgr/
    proc.c). The key uses ``current_schema()`` for a table given without its schema (the
    schema CREATE TABLE puts it in), so ``orders`` and ``public.orders`` share one lock.
MySQL / MariaDB and SQLite
    The DDL simply runs. MariaDB serializes DDL on one name with an exclusive metadata lock,
    so the loser fails with ER_TABLE_EXISTS_ERROR (1050) or ER_DUP_FIELDNAME (1060); SQLite
    serializes every write on the database file lock, and the loser's statement, prepared
    again against the new schema, fails with "table ... already exists" or "duplicate
    column name". Those errors count as success only once a fresh look shows the object
    exists; any other error is raised.

The same lost-race errors are also accepted on PostgreSQL, for a creator that does not
take the lock (another program, an older kafka-txn).

On MySQL/MariaDB and SQLite a table's separate ``CREATE INDEX`` statements (SQLAlchemy
``Index`` objects) are not atomic with its ``CREATE TABLE``: a loser may return before the
winner created them. The tables kafka-txn creates have none (keys are declared inline).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from sqlalchemy import Column, Table, inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

__all__ = ["add_column_if_missing", "add_column_statement", "create_table_if_missing"]

log = logging.getLogger("kafka_txn.ddl")

Session = Callable[[Connection], AbstractContextManager[Any]]
"""Wraps the DDL inside its transaction: entered after BEGIN, before the lock and the DDL;
exited before COMMIT or ROLLBACK (on PostgreSQL, after an error, it must run no SQL)."""

# The key is 64 bits of md5 over the schema-qualified name, computed by the server so that
# an unqualified name resolves to the schema CREATE TABLE would use (current_schema()).
_PG_LOCK = text(
    "SELECT pg_advisory_xact_lock(('x' || left(md5('kafka_txn.ddl:' || "
    "coalesce(CAST(:schema AS text), current_schema(), '') || '.' || CAST(:name AS text)), 16)"
    ")::bit(64)::bigint)"
)


def create_table_if_missing(engine: Engine, table: Table) -> bool:
    """Create ``table`` (with its ``schema``, if set) unless it exists; safe when many
    processes and threads call it at once. True if this call created it. Any other
    error (permissions, a missing schema, a lock wait that timed out) is raised."""
    if _has_table(engine, table):
        return False
    try:
        with _serialized(engine, table) as conn:
            if inspect(conn).has_table(table.name, schema=table.schema):
                return False
            table.create(conn)
    except DBAPIError as exc:
        if _already_exists(exc) and _has_table(engine, table):
            log.debug("table %s was created concurrently: %s", _name(table), exc.orig)
            return False
        raise
    log.info("created table %s", _name(table))
    return True


def add_column_if_missing(
    engine: Engine, table: Table, column: Column[Any], *, session: Session | None = None
) -> bool:
    """``ALTER TABLE table ADD COLUMN column`` unless the column exists; safe when many
    processes and threads call it at once. True if this call added it. ``session`` wraps
    the DDL inside its transaction (to bound lock waits, say)."""
    try:
        with _serialized(engine, table, session) as conn:
            if _has_column(conn, table, column):
                return False
            conn.exec_driver_sql(add_column_statement(engine, table, column))
    except DBAPIError as exc:
        if _duplicate_column(exc):
            with engine.connect() as conn:
                if _has_column(conn, table, column):
                    log.debug("column %s was added concurrently: %s", column.name, exc.orig)
                    return False
        raise
    log.info("added column %s to table %s", column.name, _name(table))
    return True


def add_column_statement(engine: Engine, table: Table, column: Column[Any]) -> str:
    """The ``ALTER TABLE ... ADD COLUMN ...`` statement, quoted for ``engine``'s dialect
    (also for telling a user which statement to run)."""
    dialect = engine.dialect
    prep = dialect.identifier_preparer
    return (
        f"ALTER TABLE {prep.format_table(table)} ADD COLUMN {prep.format_column(column)} "
        f"{column.type.compile(dialect=dialect)}"
    )


@contextmanager
def _serialized(
    engine: Engine, table: Table, session: Session | None = None
) -> Iterator[Connection]:
    """A connection in a transaction for DDL on ``table``; on PostgreSQL, READ COMMITTED
    and holding the table's advisory lock until COMMIT (see the module docstring)."""
    postgresql = engine.dialect.name == "postgresql"
    with engine.connect() as conn:
        if postgresql:
            # Reset to the engine's default when the connection goes back to the pool.
            conn.execution_options(isolation_level="READ COMMITTED")
        with conn.begin(), session(conn) if session is not None else nullcontext():
            if postgresql:
                conn.execute(_PG_LOCK, {"schema": table.schema, "name": table.name})
            yield conn


def _has_table(engine: Engine, table: Table) -> bool:
    with engine.connect() as conn:
        return inspect(conn).has_table(table.name, schema=table.schema)


def _has_column(conn: Connection, table: Table, column: Column[Any]) -> bool:
    columns = inspect(conn).get_columns(table.name, schema=table.schema)
    return any(c["name"] == column.name for c in columns)


def _name(table: Table) -> str:
    return f"{table.schema}.{table.name}" if table.schema else table.name


def _codes(exc: DBAPIError) -> tuple[str | None, Any, str]:
    """(SQLSTATE from psycopg, MySQL error number from PyMySQL, message) of ``exc``."""
    orig = exc.orig
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return getattr(orig, "sqlstate", None), args[0] if args else None, str(orig).lower()


def _already_exists(exc: DBAPIError) -> bool:
    """CREATE TABLE (or one of its CREATE INDEX) lost a race: PostgreSQL duplicate_table
    (42P07) or unique_violation (23505, on a catalog's unique index), MySQL/MariaDB
    ER_TABLE_EXISTS_ERROR (1050) or ER_DUP_KEYNAME (1061), SQLite "... already exists".
    Only an object's renewed presence makes it success: the caller looks again."""
    sqlstate, number, message = _codes(exc)
    return sqlstate in ("42P07", "23505") or number in (1050, 1061) or "already exists" in message


def _duplicate_column(exc: DBAPIError) -> bool:
    """ALTER TABLE ... ADD COLUMN lost a race: PostgreSQL duplicate_column (42701),
    MySQL/MariaDB ER_DUP_FIELDNAME (1060), SQLite "duplicate column name"."""
    sqlstate, number, message = _codes(exc)
    return sqlstate == "42701" or number == 1060 or "duplicate column name" in message
