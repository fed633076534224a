"""A dual write's own statements on PostgreSQL with psycopg 3, run on the driver
connection: BEGIN goes with the statement that locks the state row (one simple query),
and the state-row UPDATE with the COMMIT (libpq's pipeline mode, libpq 14+,
``psycopg.Pipeline``); one round trip each instead of two. Elsewhere (MySQL/MariaDB,
SQLite, another driver, psycopg's async mode) the statements run through SQLAlchemy one
by one.

How:

- The three statements go to psycopg's connection under the SQLAlchemy ``Connection``
  directly: SQLAlchemy's execution of a statement (its context, cursor wrapper, result
  and events) costs more CPU than the statement's own work here, and they are the same
  three statements every transaction. Their SQL is compiled once by SQLAlchemy for the
  engine's dialect (``DriverStatements``); the caller's own statements still run through
  SQLAlchemy. So ``before_cursor_execute``/``after_cursor_execute`` listeners do not see
  these three; ``handle_error`` listeners do.
- Every error of theirs takes SQLAlchemy's own error path,
  ``Connection._handle_dbapi_exception``, which SQLAlchemy's execution calls too: a
  ``DBAPIError`` of the right class (``OperationalError``, ``IntegrityError`` for a
  deferred constraint refused at COMMIT, the lock timeout's 55P03), ``handle_error``
  listeners called, and a lost connection (or an interruption, such as
  ``KeyboardInterrupt``) invalidated (``connection_invalidated``). Callers never see a
  driver exception. An SQLAlchemy without that method gets the one-by-one path
  (``pipelining``).
- psycopg sends its own BEGIN before a statement on an idle connection and waits for
  it, in a pipeline too (it syncs after it), unless its autocommit flag is on. So the
  flag is on for the lock's query only, which sends BEGIN (with the isolation level,
  read-only and deferrable settings psycopg would have used) and the lock as one simple
  query, the lock's parameters rendered as literals by psycopg's own
  ``ClientCursor.mogrify`` (``_inline_lock``). A pipeline did the same in one round trip
  too, at more CPU (entering it, a Sync, leaving it: ~0.1 ms a transaction). The flag
  goes back off as soon as the query returns or fails, the transaction open: psycopg's
  ``autocommit`` setter refuses that (it checks the flag only before a statement), so
  the flag (``_autocommit``) is set directly; with a psycopg without it, the lock goes
  through SQLAlchemy after psycopg's own BEGIN (two round trips). From then on psycopg
  reads the transaction's state from the server (``transaction_status``) as for any
  transaction: a body that ends the transaction (ROLLBACK or COMMIT sent as SQL) gets a
  new one, begun by psycopg, at its next statement, which the writer rolls back; never
  a statement committed on its own.
- Leaving a pipeline sends a Sync and waits for its answer, and psycopg's ``commit()``
  inside a pipeline syncs too: committing inside a pipeline and then leaving it would be
  two round trips. So COMMIT is queued as a statement, and leaving the pipeline right
  after it is the one round trip. An error in a statement makes PostgreSQL skip the rest
  of the pipeline up to the Sync (an error in the UPDATE skips the COMMIT). What an
  error while leaving means is read from the COMMIT's own answer (``_commit_failure``):
  a COMMIT PostgreSQL answered is a commit, whatever came after it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, NoReturn

from sqlalchemy.engine import Connection, Engine

__all__ = ["Decision", "DriverStatements", "pipelining"]


def pipelining(engine: Engine) -> bool:
    """Whether ``engine`` is PostgreSQL through psycopg 3 with pipeline mode, and an
    SQLAlchemy whose error path the driver statements can take. Not through psycopg's
    async mode (``AsyncDualWriter``), whose cursors SQLAlchemy adapts: each statement
    there is one round trip awaited. Not for an engine with a ``schema_translate_map``,
    which SQLAlchemy applies when it executes a statement: SQL compiled once would
    name the state table without it."""
    dialect = engine.dialect
    if dialect.name != "postgresql" or dialect.driver != "psycopg" or dialect.is_async:
        return False
    if not callable(getattr(Connection, "_handle_dbapi_exception", None)):
        return False
    if engine.get_execution_options().get("schema_translate_map"):
        return False
    psycopg = dialect.dbapi  # the driver module SQLAlchemy loaded
    pipeline = getattr(psycopg, "Pipeline", None)
    return pipeline is not None and bool(pipeline.is_supported())


class DriverStatements:
    """A writer's lock and state write as psycopg runs them: their SQL compiled once by
    SQLAlchemy for ``engine``'s dialect, and the lock's parameters (the same for every
    transaction of a writer) bound once."""

    def __init__(self, engine: Engine, lock: Any, lock_params: dict[str, Any], write: Any) -> None:
        compiled = lock.compile(dialect=engine.dialect)
        self.lock = str(compiled)
        self.lock_params: dict[str, Any] = compiled.construct_params(lock_params)
        self.lock_key = (self.lock, tuple(sorted(self.lock_params.items())))
        """What the rendered lock depends on besides the BEGIN (``_inline_lock``)."""
        compiled = write.compile(dialect=engine.dialect)
        self.write = str(compiled)
        self.write_params = frozenset(compiled.params)
        """The state write's parameter names: the caller passes exactly these."""


_INLINE = "kafka_txn.inline_lock"
"""The key of the rendered BEGIN and lock in a pooled connection's ``info``."""


def _inline_lock(conn: Connection, driver: Any, sql: DriverStatements, begin: str) -> str:
    """``begin`` and the lock as one simple query, the lock's parameters rendered as
    literals by psycopg itself (``ClientCursor.mogrify``, with the connection's quoting
    and encoding as they are now). Rendered once per pooled connection
    (``Connection.info``) and kept: a writer's lock never changes, and the text stays
    valid if a body later changes the session's quoting or encoding."""
    info = conn.info
    key = (begin, sql.lock_key)
    cached = info.get(_INLINE)
    if cached is not None and cached[0] == key:
        return str(cached[1])
    client_cursor = conn.dialect.dbapi.ClientCursor(driver)  # type: ignore[union-attr]
    query = f"{begin}; {client_cursor.mogrify(sql.lock, sql.lock_params)}"
    info[_INLINE] = (key, query)
    return query


class _Pipeline:
    """One pipeline on one psycopg connection: entered and left once each."""

    def __init__(self, driver: Any) -> None:
        manager = driver.pipeline()
        manager.__enter__()
        self._manager: Any = manager

    @property
    def open(self) -> bool:
        return self._manager is not None

    def leave(self, failing: bool = False) -> None:
        """Leave the pipeline: one Sync, then every queued result is read, and an
        error among them is raised; with ``failing`` (called while handling an
        exception, which goes on) psycopg logs it instead."""
        manager, self._manager = self._manager, None
        if manager is not None:
            manager.__exit__(*(sys.exc_info() if failing else (None, None, None)))


_COMMITTED = "committed"

_COMMAND_OK = 1
"""libpq's PGRES_COMMAND_OK (``psycopg.pq.ExecStatus.COMMAND_OK``)."""


def _commit_failure(cursor: Any, exc: Exception) -> str:
    """What an error while leaving the pipeline that holds the COMMIT means:

    - PostgreSQL answered the COMMIT itself with success, and the error came after it
      (the connection dropped, or a FATAL error, before the Sync was answered):
      committed. In pipeline mode psycopg may raise that FATAL error before it has read
      the end of the stream, so SQLAlchemy would not see a lost connection, and the
      writer would abort Kafka for a transaction the database committed.
    - an ERROR reported by PostgreSQL on a live connection: it did not commit (an error
      in the UPDATE makes it skip the COMMIT queued after it, an error in the COMMIT
      rolls back): the error goes on.
    - anything else (no answer to the COMMIT, a FATAL or PANIC error: the session ended
      around it, a connection gone): unknown. The driver connection is closed, so that
      SQLAlchemy reads the error as a lost connection (``connection_invalidated``) and
      the writer raises DatabaseCommitUnknownError."""
    result = getattr(cursor, "pgresult", None)
    if result is not None and result.status == _COMMAND_OK and cursor.statusmessage == "COMMIT":
        return _COMMITTED
    driver = cursor.connection
    severity = getattr(getattr(exc, "diag", None), "severity_nonlocalized", None)
    if severity == "ERROR" and not driver.broken:
        return "not committed"
    with contextlib.suppress(Exception):
        driver.close()
    return "unknown"


class Decision:
    """One dual-write transaction's own statements on ``conn``: ``lock()`` (with BEGIN),
    the state write (``execute()``), then ``commit()``, or ``discard()`` before a
    rollback; ``release()`` when the transaction is over, whichever way. With
    ``statements`` (``pipelining``), on the driver connection; else through SQLAlchemy,
    one by one."""

    def __init__(self, conn: Connection, statements: DriverStatements | None) -> None:
        self._conn = conn
        self._sql = statements
        self._pipeline: _Pipeline | None = None
        self._flagged = False
        """psycopg's autocommit flag was switched on for the lock and not yet back off
        (an interruption struck in between): ``release()`` drops the connection."""

    def _raise(self, exc: BaseException, statement: str, params: Any, cursor: Any) -> NoReturn:
        """``exc``, raised by the driver running ``statement``, through SQLAlchemy's
        own error path (see the module docstring); always raises."""
        self._conn._handle_dbapi_exception(exc, statement, params, cursor, None)

    def lock(self, statement: Any, params: dict[str, Any]) -> Any:
        """BEGIN and ``statement`` (the state-row lock; its first row is returned), in
        one round trip (one simple query, ``_inline_lock``) on the driver connection
        when it is idle and not in autocommit mode."""
        sql = self._sql
        driver = None if sql is None else self._conn.connection.driver_connection
        if (
            sql is None
            or driver is None
            or getattr(driver, "_autocommit", None) is not False
            or driver.info.transaction_status.name != "IDLE"
        ):
            return self._conn.execute(statement, params).first()
        query = _inline_lock(self._conn, driver, sql, _begin_statement(driver))
        cursor = driver.cursor()
        self._flagged = True
        try:
            driver._autocommit = True  # this query only: no BEGIN of psycopg's own
            # prepare=False: a simple query (several statements); an engine whose
            # connections prepare every statement (prepare_threshold=0) would send it as
            # one prepared statement, which PostgreSQL refuses for two commands.
            cursor.execute(query, prepare=False)
            cursor.nextset()  # past the BEGIN's result, to the lock's
            row = cursor.fetchone()
        except BaseException as exc:
            self._raise(exc, query, None, cursor)
        finally:
            driver._autocommit = False  # the body's statements run as in any transaction
            self._flagged = False
        cursor.close()
        return row

    def execute(self, statement: Any, params: dict[str, Any]) -> None:
        """The state write: queued in a pipeline on the driver connection, else
        executed."""
        sql = self._sql
        if sql is None:
            self._conn.execute(statement, params)
            return
        driver = self._conn.connection.driver_connection
        cursor = driver.cursor()  # type: ignore[union-attr]
        try:
            self._pipeline = _Pipeline(driver)
            cursor.execute(sql.write, params)
        except BaseException as exc:
            self.discard()
            self._raise(exc, sql.write, params, cursor)

    def commit(self) -> None:
        """COMMIT: with the write, in one round trip when pipelined."""
        pipeline = self._pipeline
        if pipeline is not None and pipeline.open:
            cursor = self._conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            try:
                cursor.execute("COMMIT")  # queued
                pipeline.leave()  # the Sync: the round trip
            except BaseException as exc:
                self.discard()
                if isinstance(exc, Exception) and _commit_failure(cursor, exc) == _COMMITTED:
                    # PostgreSQL answered the COMMIT: it happened. The connection is
                    # gone: SQLAlchemy drops it (a COMMIT sent now would fail and read as
                    # "outcome unknown").
                    self._conn.invalidate()
                    return
                self._raise(exc, "COMMIT", None, cursor)
        # On the driver path the COMMIT ran: psycopg's commit() of an idle connection
        # sends nothing, and SQLAlchemy's transaction ends (its commit event fires).
        self._conn.commit()

    def discard(self) -> None:
        """Leave a pipeline still open (the write runs, uncommitted) before a rollback;
        its errors are the rollback's business."""
        pipeline = self._pipeline
        if pipeline is not None and pipeline.open:
            with contextlib.suppress(Exception):  # the rollback (or the drop) is next
                pipeline.leave(failing=sys.exc_info()[0] is not None)

    def release(self) -> None:
        """The transaction is over, whichever way: a connection whose autocommit flag
        may still be on (an interruption struck ``lock()`` as it switched the flag back
        off) is invalidated, never handed out by the pool in autocommit mode."""
        if self._flagged:
            self._flagged = False
            self._conn.invalidate()


def _begin_statement(driver: Any) -> str:
    """The BEGIN psycopg would send, from the connection's public settings."""
    parts = ["BEGIN"]
    if driver.isolation_level is not None:
        parts += ["ISOLATION LEVEL", driver.isolation_level.name.replace("_", " ")]
    if driver.read_only is not None:
        parts.append("READ ONLY" if driver.read_only else "READ WRITE")
    if driver.deferrable is not None:
        parts.append("DEFERRABLE" if driver.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)
