"""The database side of ``kafka-txn recover``: open the writers' database without creating
anything, read one state row without writing, and say in one line what is wrong.

``recover`` must never create a database, a table or a row: SQLite would create a missing
file on connect, so it is opened through a ``file:`` URI with ``mode=rw`` (SQLite's own
"open, never create", https://www.sqlite.org/uri.html); the state table is looked up with
SQLAlchemy's inspector and read with a plain SELECT, which takes no row lock (PostgreSQL's
and InnoDB's MVCC reads; SQLite readers share the file with a writer's RESERVED lock), so
a live writer mid-transaction neither blocks it nor notices it.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:  # SQLAlchemy is an extra: imported once require_drivers() passed
    from sqlalchemy.engine import URL, Engine

__all__ = [
    "DatabaseUnusableError",
    "StoredRow",
    "describe_database",
    "explain",
    "extra_for",
    "open_database",
    "read_state_row",
    "require_drivers",
]

# The JDBC subprotocol -> the extra that installs its driver, and the modules it needs.
_EXTRAS = {"postgresql": "postgres", "mysql": "mysql", "mariadb": "mysql", "sqlite": "sql"}
_MODULES = {"postgresql": ("psycopg",), "mysql": ("pymysql",), "mariadb": ("pymysql",)}
ID_COLUMN = "transactional_id"
STATE_COLUMN = "prepared_txn_state"
OWNER_COLUMN = "owner"
_OPTIONAL_COLUMNS = (OWNER_COLUMN, "updated_at")


class DatabaseUnusableError(Exception):
    """What is wrong with the database, and the fix, in one line."""


@dataclass(frozen=True)
class StoredRow:
    """One state row as last committed: the stored state, its owner token
    (``host:pid:uuid8``, None where the table predates the owner column), its last write
    (``updated_at``) and how long ago that was."""

    state: str
    owner: str | None
    updated: Any
    age_s: float | None = None
    """Seconds since ``updated``, by the database's clock (None if unknown)."""


def extra_for(jdbc_url: str) -> str:
    """The kafka-txn extra whose packages a JDBC URL needs (``sql`` when unknown)."""
    scheme = jdbc_url.removeprefix("jdbc:").partition(":")[0]
    return _EXTRAS.get(scheme, "sql")


def require_drivers(jdbc_url: str) -> None:
    """Import SQLAlchemy and the URL's driver; ImportError names the extra to install."""
    scheme = jdbc_url.removeprefix("jdbc:").partition(":")[0]
    for module in ("sqlalchemy", *_MODULES.get(scheme, ())):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(
                f"{module} is not installed, and {jdbc_url.partition('//')[0] or 'this'} "
                f"needs it: pip install 'kafka-txn[{extra_for(jdbc_url)}]'"
            ) from exc


def describe_database(url: URL) -> str:
    """Where the database is, for messages; never the password
    (``kafka_txn.dualwrite.unavailable.describe_database``)."""
    from kafka_txn.dualwrite.unavailable import describe_database as describe  # noqa: PLC0415

    return describe(url)


def _sqlite_path(url: URL) -> str | None:
    path = url.database
    return None if path in (None, "", ":memory:") else path


def open_database(
    jdbc_url: str, user: str | None, password: str | None, timeout: float
) -> tuple[Engine, URL]:
    """An Engine on the writers' database that cannot create it, its connection attempts
    bounded by ``timeout`` seconds; and the URL, for messages."""
    from sqlalchemy import create_engine  # noqa: PLC0415 - an extra (require_drivers)
    from sqlalchemy.engine import URL as SqlUrl  # noqa: PLC0415, N811

    from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy  # noqa: PLC0415 - needs SQLAlchemy

    url = jdbc_to_sqlalchemy(jdbc_url, user=user, password=password)
    backend = url.get_backend_name()
    connect_args: dict[str, Any]
    target = url
    if backend == "sqlite":
        path = _sqlite_path(url)
        if path is not None and not Path(path).is_file():
            what = "is not a file" if Path(path).exists() else "does not exist"
            raise DatabaseUnusableError(
                f"the SQLite database file {path} {what} (recover never creates one): "
                "check the path in --jdbc-url, the file the writers use"
            )
        if path is not None:  # SQLite's URI form: mode=rw opens, never creates
            target = SqlUrl.create(
                "sqlite",
                database=f"file:{quote(str(Path(path).resolve()))}",
                query={"mode": "rw", "uri": "true"},
            )
        connect_args = {"timeout": timeout}  # busy timeout, seconds
    elif backend == "postgresql":
        connect_args = {"connect_timeout": max(2, math.ceil(timeout))}  # libpq: >= 2 s
    else:
        # PyMySQL's connect_timeout covers the TCP connect only: the server's greeting and
        # every later answer wait read_timeout, unbounded by default (a server that
        # accepts and never answers would hang recover). A little above the timeout: the
        # state-row lock wait (innodb_lock_wait_timeout, whole seconds) is bounded by it
        # and should end with its own, clearer, error.
        bound = max(1, math.ceil(timeout))
        connect_args = {"connect_timeout": bound, "read_timeout": bound + 2,
                        "write_timeout": bound + 2}  # fmt: skip
    return create_engine(target, connect_args=connect_args), url


def mark_settled_statement(
    engine: Engine, table: str, transactional_id: str, stored: str, completed: str
) -> str:
    """The SQL an operator runs to mark a transaction recovery could not settle as
    settled by hand: what ``DualWriter.resolve()`` runs, a compare-and-set (``UPDATE ...
    SET state = completed WHERE id = ... AND state = stored``) that changes nothing once
    another writer has moved on, with the values quoted for ``engine``'s database."""
    from sqlalchemy import String, column, update  # noqa: PLC0415 - an extra
    from sqlalchemy import table as table_clause  # noqa: PLC0415

    t = table_clause(table, column(ID_COLUMN, String()), column(STATE_COLUMN, String()))
    statement = (
        update(t)
        .where(t.c[ID_COLUMN] == transactional_id, t.c[STATE_COLUMN] == stored)
        .values({STATE_COLUMN: completed})
    )
    # The engine's dialect, but with a paramstyle that makes no placeholder of '%': with
    # the drivers' own ("pyformat"), a literal's '%' would be written '%%', which a
    # person pasting the statement into psql or mysql would not want.
    dialect_class: Any = type(engine.dialect)
    dialect = dialect_class(paramstyle="named")
    compiled = statement.compile(dialect=dialect, compile_kwargs={"literal_binds": True})
    return str(compiled).replace("\n", " ")


def read_state_row(engine: Engine, url: URL, table: str, transactional_id: str) -> StoredRow | None:
    """The state row of ``transactional_id`` in ``table``, None if there is none. Raises
    DatabaseUnusableError for a database that cannot be reached or has no such table;
    writes nothing and creates nothing."""
    from sqlalchemy import inspect  # noqa: PLC0415 - an extra (require_drivers)
    from sqlalchemy.exc import SQLAlchemyError  # noqa: PLC0415

    where = describe_database(url)
    try:
        inspector = inspect(engine)
        if not inspector.has_table(table):
            raise DatabaseUnusableError(
                f"the state table {table!r} does not exist in {where} (recover never "
                "creates it): check --jdbc-url and --state-table against the writers' "
                "settings; a DualWriter creates it when it first starts"
            )
        columns = {column["name"] for column in inspector.get_columns(table)}
        missing = [c for c in (ID_COLUMN, STATE_COLUMN) if c not in columns]
        if missing:
            raise DatabaseUnusableError(
                f"the table {table!r} in {where} has no column {', '.join(missing)}: it is "
                "not a kafka-txn state table with the default column names, which recover "
                "reads; check --state-table"
            )
        if OWNER_COLUMN not in columns:
            raise DatabaseUnusableError(_owner_column_missing(engine, table, where))
        return _select_row(engine, table, columns, transactional_id)
    except SQLAlchemyError as exc:
        raise DatabaseUnusableError(explain(exc, url)) from exc


def _owner_column_missing(engine: Engine, table: str, where: str) -> str:
    """The state table predates kafka-txn's owner column: what to run. recover needs the
    column (DualWriter's start() writes its owner token there, and every transaction
    checks it under the row lock: that is what fences a writer replaced by a newer one),
    and never changes a schema itself."""
    from sqlalchemy import Column, MetaData, String, Table  # noqa: PLC0415

    from kafka_txn.dualwrite.ddl import add_column_statement  # noqa: PLC0415 - needs SQLAlchemy

    column: Column[str] = Column(OWNER_COLUMN, String(255))
    ddl = add_column_statement(engine, Table(table, MetaData(), column), column)
    return (
        f"the state table {table!r} in {where} has no {OWNER_COLUMN!r} column (the table "
        "was created before kafka-txn wrote owner tokens), which recover needs: run "
        f"`{ddl}` on that database, or start one of its writers with this kafka-txn "
        "version (its start() adds the column), then recover again; nothing was done"
    )


def _select_row(
    engine: Engine, table: str, columns: set[str], transactional_id: str
) -> StoredRow | None:
    """One plain SELECT of the row, with the database's own clock beside it: the row's
    age is measured against the clock that wrote ``updated_at`` (DualWriter writes
    ``now()``, which is local time in a ``timestamp``/``DATETIME`` column on PostgreSQL
    and MySQL/MariaDB, UTC text on SQLite), so the two machines' clocks never mix."""
    from sqlalchemy import Column, DateTime, MetaData, String, Table, func, select  # noqa: PLC0415

    optional = [name for name in _OPTIONAL_COLUMNS if name in columns]
    shape = Table(
        table,
        MetaData(),
        Column(ID_COLUMN, String(255), primary_key=True),
        Column(STATE_COLUMN, String(4096)),
        *(Column(name, DateTime if name == "updated_at" else String(255)) for name in optional),
    )
    c = shape.c
    clock = {
        "postgresql": func.localtimestamp(type_=DateTime),
        "sqlite": func.current_timestamp(type_=DateTime),
    }.get(engine.dialect.name, func.now(type_=DateTime))
    query = select(c[STATE_COLUMN], *(c[name] for name in optional), clock.label("db_now"))
    with engine.connect() as conn:
        row = conn.execute(query.where(c[ID_COLUMN] == transactional_id)).first()
    if row is None:
        return None
    found = row._mapping
    updated = found.get("updated_at")
    age = None
    if isinstance(updated, datetime) and isinstance(found["db_now"], datetime):
        age = (found["db_now"].replace(tzinfo=None) - updated.replace(tzinfo=None)).total_seconds()
    return StoredRow(str(found[STATE_COLUMN]), found.get("owner"), updated, age)


def explain(exc: BaseException, url: URL) -> str:
    """One line naming what the database refused and the fix, in the command's options:
    the translation ``DualWriter`` and the Spark sink use too
    (``kafka_txn.dualwrite.unavailable``)."""
    from kafka_txn.dualwrite.unavailable import CLI_TERMS  # noqa: PLC0415 - needs SQLAlchemy
    from kafka_txn.dualwrite.unavailable import explain as translate  # noqa: PLC0415

    return translate(exc, url, CLI_TERMS)
