"""Fewer database round trips for a dual write on PostgreSQL with psycopg 3, through
libpq's pipeline mode (libpq 14+, ``psycopg.Pipeline``): BEGIN goes with the statement
that locks the state row, and the state-row UPDATE with the COMMIT; one round trip
each instead of two. Elsewhere (MySQL/MariaDB, SQLite, another driver) the statements
run one by one, as before.

Why it is done this way:

- psycopg sends its own BEGIN before a transaction's first statement and waits for it,
  in a pipeline too (``_start_query`` syncs after it). So for the lock the connection is
  put in autocommit mode (psycopg then sends no BEGIN), and BEGIN (with the isolation
  level, read-only and deferrable settings psycopg would have used) is queued as a
  statement before the lock: PostgreSQL runs the transaction as before, psycopg and
  SQLAlchemy read its state from the server (``transaction_status``). Autocommit is
  switched back off when the transaction ends (``Decision.finish``), and a connection
  where that fails is invalidated rather than returned to the pool in autocommit mode.
- Leaving a pipeline sends a Sync and waits for its answer, and psycopg's ``commit()``
  inside a pipeline syncs too: committing inside a pipeline and then leaving it would be
  two round trips. So the COMMIT (and the lock) is queued as a statement and the
  pipeline is left right after it, inside SQLAlchemy's execution of that statement (the
  ``do_execute``/``do_execute_no_params`` hooks below): the Sync of leaving is the one
  round trip, and its results reach SQLAlchemy as those of an ordinary execution. Its
  errors take SQLAlchemy's usual path: ``DBAPIError`` (``IntegrityError`` for a deferred
  constraint refused at COMMIT, the lock timeout's 55P03), and a dropped connection
  invalidated (``connection_invalidated``), which the writer reads as "the COMMIT's
  outcome is unknown". An error in a statement makes PostgreSQL skip the rest of the
  pipeline up to the Sync (so an error in the UPDATE skips the COMMIT): any error that
  is not a lost connection still means nothing was committed. SQLAlchemy's own
  ``commit()`` afterwards finds the connection idle and sends nothing.
"""

from __future__ import annotations

import contextlib
import sys
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

__all__ = ["Decision", "pipelining"]

_OPTION = "kafka_txn_pipeline"
"""The execution option that hands an open pipeline to ``_leave_after``."""


def pipelining(engine: Engine) -> bool:
    """Whether ``engine`` is PostgreSQL through psycopg 3 with pipeline mode; installs
    the hooks on it (once) if so."""
    if engine.dialect.name != "postgresql" or engine.dialect.driver != "psycopg":
        return False
    psycopg = engine.dialect.dbapi  # the driver module SQLAlchemy loaded
    pipeline = getattr(psycopg, "Pipeline", None)
    if pipeline is None or not pipeline.is_supported():
        return False
    for name, hook in (("do_execute", _leave_after), ("do_execute_no_params", _leave_after)):
        if not event.contains(engine, name, hook):
            event.listen(engine, name, hook)
    return True


class _Open:
    """A pipeline entered on one psycopg connection, left exactly once."""

    def __init__(self, manager: AbstractContextManager[Any], committing: bool = False) -> None:
        self._manager: AbstractContextManager[Any] | None = manager
        self.committing = committing
        """The pipeline holds the state write and the COMMIT."""
        self.committed_then_lost = False
        """PostgreSQL answered the COMMIT with success, and the connection failed after."""

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


def _leave_after(cursor: Any, statement: str, *rest: Any) -> bool | None:
    """SQLAlchemy's ``do_execute`` and ``do_execute_no_params`` hook: for a statement
    executed with an open pipeline in its execution options, queue it and leave the
    pipeline (the one round trip); any other statement is left to SQLAlchemy. For a
    COMMIT, what failed is read precisely (``_commit_failure``)."""
    context = rest[-1]
    pipeline: _Open | None = context.execution_options.get(_OPTION)
    if pipeline is None:
        return None
    try:
        cursor.execute(statement, *rest[:-1])
        pipeline.leave()
    except Exception as exc:
        if pipeline.open:
            with contextlib.suppress(Exception):  # the first error is the one to report
                pipeline.leave(failing=True)
        if pipeline.committing and _commit_failure(cursor, exc) == _COMMITTED:
            pipeline.committed_then_lost = True  # PostgreSQL answered COMMIT: it happened
            return True
        raise
    except BaseException:
        if pipeline.open:
            with contextlib.suppress(Exception):
                pipeline.leave(failing=True)
        raise
    return True


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
    rollback; ``finish()`` when the transaction is over, whichever way."""

    def __init__(self, conn: Connection, pipelined: bool) -> None:
        self._conn = conn
        self._pipelined = pipelined
        self._pipeline: _Open | None = None
        self._autocommit_on = False

    def lock(self, statement: Any, params: dict[str, Any]) -> Any:
        """BEGIN and ``statement`` (the state-row lock), in one round trip when
        pipelined and the connection is idle and not in autocommit mode."""
        driver = self._driver() if self._pipelined else None
        idle = driver is not None and driver.info.transaction_status.name == "IDLE"
        if driver is None or driver.autocommit or not idle:
            return self._conn.execute(statement, params).first()
        begin = _begin_statement(driver)
        driver.autocommit = True  # no BEGIN of psycopg's own: ours goes with the lock
        self._autocommit_on = True
        pipeline = self._enter(driver)
        try:
            # Queued straight on the driver, as SQLAlchemy's own transaction control is:
            # a BEGIN is not a statement its cursor events report.
            driver.execute(begin)
            result = self._conn.execute(statement, params, execution_options={_OPTION: pipeline})
        except BaseException:
            if pipeline.open:
                with contextlib.suppress(Exception):
                    pipeline.leave(failing=True)
            raise
        return result.first()

    def execute(self, statement: Any, params: dict[str, Any]) -> None:
        """The state write: queued in a pipeline when pipelined, else executed."""
        if self._pipelined:
            self._pipeline = self._enter(self._driver(), committing=True)
        self._conn.execute(statement, params)

    def commit(self) -> None:
        """COMMIT: with the write, in one round trip when pipelined."""
        pipeline = self._pipeline
        if pipeline is not None and pipeline.open:
            options = {_OPTION: pipeline, "no_parameters": True}  # do_execute_no_params
            self._conn.exec_driver_sql("COMMIT", execution_options=options)
            if pipeline.committed_then_lost:
                # Committed; the connection is gone: SQLAlchemy drops it (a COMMIT sent
                # now would fail and read as "outcome unknown").
                self._conn.invalidate()
                return
        self._conn.commit()

    def discard(self) -> None:
        """Leave a pipeline still open (the write runs, uncommitted) before a rollback;
        its errors are the rollback's business."""
        pipeline = self._pipeline
        if pipeline is not None and pipeline.open:
            with contextlib.suppress(Exception):  # the rollback (or the drop) comes next
                pipeline.leave(failing=sys.exc_info()[0] is not None)

    def finish(self) -> None:
        """The transaction is over: autocommit back off. A connection where that fails
        (still in a transaction, or broken) is invalidated, so that the pool never hands
        it out in autocommit mode."""
        if not self._autocommit_on:
            return
        self._autocommit_on = False
        try:
            self._driver().autocommit = False
        except Exception:
            self._conn.invalidate()

    def _driver(self) -> Any:
        return self._conn.connection.driver_connection

    def _enter(self, driver: Any, committing: bool = False) -> _Open:
        manager = driver.pipeline()
        manager.__enter__()
        return _Open(manager, committing)


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
