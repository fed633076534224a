"""The database side's plumbing: an Engine for a JDBC URL, a SQLAlchemy URL or an Engine;
the checks on the table/column names and the timeouts a writer is given; and what a DBAPI
error or a driver's session state says (a lock wait that ran out, a cancelled statement,
whether a transaction is open), read without a round trip. Shared by ``DualWriter`` and
the Spark sink.
"""

from __future__ import annotations

import math
import re
from typing import Any

from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, NoSuchModuleError, SQLAlchemyError

from kafka_txn.dualwrite.jdbc.urls import bounded_engine, jdbc_to_sqlalchemy, redact_jdbc_url
from kafka_txn.errors import ConfigurationError

__all__ = ["database_url", "engine_for", "validate_identifier", "validate_seconds"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def validate_identifier(name: str, what: str) -> str:
    """A table or column name: letters, digits and ``_``, not starting with a digit, at
    most 63 characters. Names are also quoted by SQLAlchemy, never pasted into SQL."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ConfigurationError(
            f"{what} {name!r} is not a plain SQL identifier: use letters, digits and "
            "underscores, not starting with a digit, at most 63 characters"
        )
    return name


def database_url(
    database: str | URL,
    user: str | None,
    password: str | None,
    *,
    refuse_sqlite_login: bool = False,
) -> URL:
    """The SQLAlchemy URL for a JDBC URL (parameters mapped and checked, see
    ``kafka_txn.dualwrite.jdbc.urls``) or a SQLAlchemy URL. Errors show the URL redacted.
    A SQLite database is a file with no login: a user or password given with it is
    ignored, as Spark's SQLite JDBC driver ignores its ``user``/``password`` options, or
    with ``refuse_sqlite_login`` (DualWriter's arguments) refused; never left to
    SQLAlchemy's "Invalid SQLite URL"."""
    if isinstance(database, URL):
        return database
    if isinstance(database, str) and database.startswith("jdbc:"):
        if database.startswith("jdbc:sqlite:") and refuse_sqlite_login:
            _refuse_sqlite_login(user, password)
        return jdbc_to_sqlalchemy(database, user=user, password=password)
    if isinstance(database, str):
        try:
            url = make_url(database)
        except Exception as exc:
            # Neither the URL nor the parser's message (it may quote a part of the URL).
            raise ConfigurationError(
                f"database {redact_jdbc_url(database)!r} is neither a JDBC URL nor a "
                f"SQLAlchemy URL ({type(exc).__name__})"
            ) from None
        if url.get_backend_name() == "sqlite":
            if refuse_sqlite_login:
                _refuse_sqlite_login(user, password)
            return url
        if user is not None or password is not None:
            url = url.set(username=user or url.username, password=password or url.password)
        return url
    raise ConfigurationError(
        f"database must be a JDBC URL, a SQLAlchemy URL or Engine, got {type(database)}"
    )


def _refuse_sqlite_login(user: str | None, password: str | None) -> None:
    if user is not None or password is not None:
        given = " and ".join(
            n for n, v in (("user", user), ("password", password)) if v is not None
        )
        raise ConfigurationError(
            f"SQLite takes no user or password (a {given} was given with a SQLite URL): "
            "drop them, or use a PostgreSQL or MySQL/MariaDB URL"
        )


def engine_for(
    database: str | URL | Engine,
    user: str | None,
    password: str | None,
    *,
    refuse_sqlite_login: bool = False,
) -> Engine:
    """A SQLAlchemy Engine for a JDBC URL, a SQLAlchemy URL or an Engine (returned as is;
    ``database_url`` for ``refuse_sqlite_login``). Built by ``jdbc.bounded_engine``: a
    MySQL/MariaDB handshake cannot hang."""
    if isinstance(database, Engine):
        return database
    url = database_url(database, user, password, refuse_sqlite_login=refuse_sqlite_login)
    kwargs: dict[str, Any] = {}
    if url.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": 30}  # wait for the other writer's lock
    try:
        return bounded_engine(url, **kwargs)
    except NoSuchModuleError as exc:
        raise ConfigurationError(
            f"SQLAlchemy has no dialect/driver {url.drivername!r}: use a JDBC URL, or "
            "postgresql+psycopg://, mysql+pymysql://, sqlite:///"
        ) from exc
    except ImportError as exc:
        extra = {"postgresql": "postgres", "mysql": "mysql"}.get(url.get_backend_name(), "sql")
        raise ConfigurationError(
            f"the driver for {url.drivername} is not installed: "
            f"pip install 'kafka-txn[{extra}]' ({exc})"
        ) from exc


def validate_seconds(value: float | None, name: str) -> float | None:
    """A positive, finite number of seconds, or None; anything else is refused."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(f"{name}={value!r} must be a positive number of seconds or None")
    return float(value)


def _is_lock_timeout(exc: DBAPIError) -> bool:
    """The database gave up waiting for a lock: PostgreSQL's lock_not_available (55P03,
    from lock_timeout), MySQL/MariaDB's ER_LOCK_WAIT_TIMEOUT (1205, row and metadata
    locks), SQLite's SQLITE_BUSY once the busy timeout ran out."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == "55P03":
        return True
    if getattr(orig, "sqlite_errorcode", None) == 5 or "database is locked" in str(orig):
        return True
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return bool(args) and args[0] == 1205


def _is_cancelled(exc: DBAPIError) -> bool:
    """The database cancelled the statement: PostgreSQL's query_canceled (57014: the
    session's ``statement_timeout``, or ``pg_cancel_backend``), MariaDB's
    ER_STATEMENT_TIMEOUT (1969, ``max_statement_time``), MySQL's ER_QUERY_TIMEOUT (3024,
    ``max_execution_time``). On a lock statement that means the wait ended before the
    lock was taken: nothing was written."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == "57014":
        return True
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return bool(args) and args[0] in (1969, 3024)


def _in_transaction(conn: Connection) -> bool | None:
    """Whether ``conn``'s statements run in a transaction, as the driver last heard (no
    round trip), asked after a statement that takes a lock: psycopg's transaction
    status (a statement run in autocommit mode leaves it IDLE); PyMySQL's status flags:
    SERVER_STATUS_IN_TRANS (an explicit BEGIN; not reported after a locking read in an
    implicit transaction) or SERVER_STATUS_AUTOCOMMIT off; sqlite3's
    ``in_transaction``; None for a driver that does not say."""
    if conn.invalidated or conn.closed:
        return None  # a lost connection: no transaction to tell about
    try:
        driver = conn.connection.driver_connection
    except SQLAlchemyError:
        return None
    status = getattr(getattr(driver, "info", None), "transaction_status", None)
    if status is not None:  # psycopg 3 (an enum), psycopg2 (an int: 0 is IDLE)
        return int(status) != 0
    server_status = getattr(driver, "server_status", None)
    if isinstance(server_status, int):  # PyMySQL: the last OK/EOF packet's status flags
        return bool(server_status & 1) or not server_status & 2  # IN_TRANS, AUTOCOMMIT
    in_transaction = getattr(driver, "in_transaction", None)
    return in_transaction if isinstance(in_transaction, bool) else None
