"""A database that cannot be opened, named with its fix: one translation of the drivers'
connection and login failures (a refused port, a host that does not resolve, a wrong
password or unknown user, a database that does not exist, a SQLite file that cannot be
opened), shared by ``DualWriter.start()``, the Spark sink and ``kafka-txn recover``.

Each caller names its own settings (``Terms``): the fix reads "check the JDBC URL given
as DualWriter's database", "check the sink's url option" or "check --jdbc-url".

Drivers are told apart by their error numbers where they have them (MySQL/MariaDB:
1045, 1049, 2003...) and by libpq's message text otherwise (psycopg's connection errors
carry no SQLSTATE). Only opening a connection is translated (``raise_if_unavailable``):
an error during a transaction keeps its own class (``DatabaseCommitUnknownError``...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import DBAPIError

from kafka_txn.dualwrite.jdbc.redact import redact_jdbc_url
from kafka_txn.errors import DatabaseUnavailableError

__all__ = [
    "CLI_TERMS",
    "DUAL_WRITER_TERMS",
    "SINK_TERMS",
    "Terms",
    "describe_database",
    "explain",
    "raise_if_unavailable",
    "writer_terms",
]


@dataclass(frozen=True)
class Terms:
    """Where the caller's user sets what a fix changes."""

    url: str
    """The setting holding the database URL."""
    user: str
    """The setting holding the user name."""
    password: str
    """The settings a password is given with."""


def writer_terms(writer: str) -> Terms:
    """The terms of a writer class named ``writer`` (``DualWriter``, ``AsyncDualWriter``):
    its arguments."""
    return Terms(
        url=f"{writer}'s database (the JDBC URL)",
        user=f"{writer}'s user= (or user= in the JDBC URL)",
        password=f"{writer}'s password= (or password= in the JDBC URL)",
    )


DUAL_WRITER_TERMS = writer_terms("DualWriter")
SINK_TERMS = Terms(
    url="the sink's url option",
    user="the sink's user option (or user= in its url)",
    password="the sink's password option (or password= in its url)",
)
CLI_TERMS = Terms(
    url="--jdbc-url",
    user="--user (or user= in --jdbc-url)",
    password="--password-env NAME, --password-prompt or KAFKA_TXN_DB_PASSWORD",
)


def describe_database(url: URL) -> str:
    """Where the database is, for messages; never the password."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        return f"SQLite file {_sqlite_path(url) or ':memory:'}"
    name = "PostgreSQL" if backend == "postgresql" else "MySQL/MariaDB"
    return f"{name} at {url.host}:{url.port}, database {url.database!r}"


def _sqlite_path(url: URL) -> str | None:
    path = url.database
    return None if path in (None, "", ":memory:") else path


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def explain(exc: BaseException, url: URL, terms: Terms = DUAL_WRITER_TERMS) -> str:
    """One line naming what the database refused and the fix, in ``terms``."""
    orig = getattr(exc, "orig", None) or exc
    text = _one_line(str(orig))
    where = describe_database(url)
    user = url.username or "(none)"
    at = f"{url.host}:{url.port}"
    backend = url.get_backend_name()
    if backend == "postgresql":
        reason = text.rsplit("FATAL:", 1)[-1].strip() if "FATAL:" in text else text
        checks = (
            (r"Connection refused", f"nothing accepts connections at {at} (connection "
             f"refused): is PostgreSQL running? Check the host and port in {terms.url}"),
            (r"timeout expired|timed out", f"no answer from {at} in time: check the host "
             f"and port in {terms.url}, and firewalls"),
            (r'database "[^"]*" does not exist', f"there is no database {url.database!r} at "
             f"{at}: create it, or check the database name in {terms.url}"),
            (r'role "[^"]*" does not exist', f"there is no role {user!r} at {at}: check "
             f"{terms.user}"),
            (r"password authentication failed", f"the password of {user!r} is wrong (wrong "
             f"password for user {user!r} at {at}): check the password given by "
             f"{terms.password}"),
            (r"no password supplied", f"{user!r} needs a password: give it with "
             f"{terms.password}"),
            (r"no pg_hba\.conf entry", f"the server does not let {user!r} connect from "
             "here (pg_hba.conf): ask its administrator"),
            # libpq's words, and psycopg's when it resolves the name itself (its async
            # connections, and sync ones in psycopg 3.3).
            (r"could not translate host name|failed to resolve host", f"the host "
             f"{url.host!r} does not resolve: check {terms.url}"),
        )  # fmt: skip
        for pattern, fix in checks:
            if re.search(pattern, reason):
                return f"cannot use {where}: {fix} ({reason})"
        return f"{where}: {reason}"
    if backend == "mysql":
        args: tuple[Any, ...] = getattr(orig, "args", ())
        code = args[0] if args and isinstance(args[0], int) else None
        reason = str(args[1]) if len(args) > 1 else text
        refused = " (connection refused)" if "refused" in reason.lower() else ""
        fixes = {
            2003: f"cannot connect to {at}{refused}: is the server running? Check the host "
            f"and port in {terms.url}",
            2005: f"the host {url.host!r} does not resolve: check {terms.url}",
            2013: f"no answer from {at} in time: check the host and port in {terms.url}, "
            "that it is a MySQL/MariaDB server, and firewalls",
            1045: f"access denied for user {user!r}: wrong password or no such user; check "
            f"{terms.user} and the password ({terms.password})",
            1698: f"access denied for user {user!r}: no such user, or it may not log in "
            f"with a password from here; check {terms.user}",
            1049: f"there is no database {url.database!r} at {at}: create it, or check the "
            f"database name in {terms.url}",
            1044: f"user {user!r} may not use database {url.database!r}: check "
            f"{terms.user}, or grant it SELECT and UPDATE on the state table",
        }
        if code in fixes:
            return f"cannot use {where}: {fixes[code]} ({_one_line(reason)})"
        return f"{where}: {text}"
    if "unable to open database file" in text:
        return (
            f"cannot open the {where}: check that its directory exists and is writable, "
            f"and the path in {terms.url} ({text})"
        )
    if "file is not a database" in text:
        return f"the {where} is not a SQLite database: check the path in {terms.url} ({text})"
    return f"{where}: {text}"


def raise_if_unavailable(engine: Engine, call: str, terms: Terms) -> None:
    """Open (and give back) one connection of ``engine``: a database that cannot be
    reached or refuses the login raises ``DatabaseUnavailableError`` for ``call``, with
    the fix in ``terms`` and the driver's error as its cause. Nothing is written.

    SQLite opens its file lazily: connecting to a file that is not a database succeeds,
    and only the first read of its header fails ("file is not a database", a
    ``DatabaseError``). ``PRAGMA schema_version`` reads that header (and writes nothing),
    so such a file is named here rather than by the first query of the state table."""
    try:
        with engine.connect() as conn:
            if engine.url.get_backend_name() == "sqlite":
                conn.exec_driver_sql("PRAGMA schema_version")
    except DBAPIError as exc:
        shown = redact_jdbc_url(engine.url.render_as_string(hide_password=True))
        raise DatabaseUnavailableError(
            f"{call}: {explain(exc, engine.url, terms)}; nothing was written",
            url=shown,
        ) from exc
