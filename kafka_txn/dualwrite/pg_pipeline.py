"""Fewer database round trips for a dual write on PostgreSQL with psycopg 3: BEGIN goes
with the statement that locks the state row (one simple query), and the state-row UPDATE
with the COMMIT (libpq's pipeline mode, libpq 14+, ``psycopg.Pipeline``); one round trip
each instead of two. Elsewhere (MySQL/MariaDB, SQLite, another driver) the statements
run one by one, as before.

How:

- Every step on the driver (switching autocommit, entering the pipeline, queueing a
  statement, leaving the pipeline) happens inside SQLAlchemy's execution of one of the
  transaction's statements, in the ``do_execute``/``do_execute_no_params`` hooks below,
  told what to do by an execution option. So every error takes SQLAlchemy's usual path:
  a ``DBAPIError`` of the right class (``OperationalError``, ``IntegrityError`` for a
  deferred constraint refused at COMMIT, the lock timeout's 55P03), and a lost
  connection invalidated (``connection_invalidated``). Callers never see a driver
  exception.
- psycopg sends its own BEGIN before a transaction's first statement and waits for it,
  in a pipeline too (it syncs after it). So the lock statement's hook puts the connection in
  autocommit mode (psycopg then sends no BEGIN) and sends BEGIN (with the isolation
  level, read-only and deferrable settings psycopg would have used) and the lock as one
  simple query, the lock's parameters rendered as literals by psycopg's own
  ``ClientCursor.mogrify`` (``_inline``): all of it inside SQLAlchemy's execution of
  the lock statement (one statement execution, not two). A pipeline did the same in
  one round trip too, at more CPU (entering it, a Sync, leaving it: ~0.1 ms a
  transaction). PostgreSQL runs the
  transaction as before, and psycopg and SQLAlchemy read its state from the server
  (``transaction_status``). Autocommit is switched back off when the transaction ends
  (``Decision.finish``), and a connection where that fails is invalidated rather than
  returned to the pool in autocommit mode.
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
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

__all__ = ["Decision", "pipelining"]

_STEP = "kafka_txn_pipeline"
"""The execution option that tells the hooks what to do with a statement: a ``_Step``."""


def pipelining(engine: Engine) -> bool:
    """Whether ``engine`` is PostgreSQL through psycopg 3 with pipeline mode; installs
    the hooks on it (once) if so. Not through psycopg's async mode (``AsyncDualWriter``),
    whose cursors SQLAlchemy adapts: each statement there is one round trip awaited."""
    dialect = engine.dialect
    if dialect.name != "postgresql" or dialect.driver != "psycopg" or dialect.is_async:
        return False
    psycopg = engine.dialect.dbapi  # the driver module SQLAlchemy loaded
    pipeline = getattr(psycopg, "Pipeline", None)
    if pipeline is None or not pipeline.is_supported():
        return False
    for name in ("do_execute", "do_execute_no_params"):
        if not event.contains(engine, name, _hook):
            event.listen(engine, name, _hook)
    return True


class _Step:
    """What the hook does with one statement: ``enter`` the pipeline before queueing
    it (and switch autocommit on first, with ``autocommit``, and queue ``begin``, a
    BEGIN statement, ahead of it), and/or ``leave`` the pipeline after (the round trip),
    reading a COMMIT's outcome (``committing``). With ``inline``, no pipeline: ``begin``
    and the statement go as one simple query (``_inline``)."""

    def __init__(
        self,
        pipeline: _Pipeline,
        *,
        enter: bool = False,
        leave: bool = False,
        autocommit: bool = False,
        committing: bool = False,
        begin: str | None = None,
        inline: bool = False,
    ) -> None:
        self.pipeline = pipeline
        self.enter = enter
        self.leave = leave
        self.autocommit = autocommit
        self.committing = committing
        self.begin = begin
        self.inline = inline


class _Pipeline:
    """One pipeline on one psycopg connection: entered and left once each."""

    def __init__(self) -> None:
        self._manager: AbstractContextManager[Any] | None = None
        self.autocommit_on = False
        """Autocommit was switched on for it (to be switched off when the transaction
        ends)."""
        self.committed_then_lost = False
        """PostgreSQL answered the COMMIT with success, and the connection failed after."""

    @property
    def open(self) -> bool:
        return self._manager is not None

    def enter(self, driver: Any) -> None:
        manager = driver.pipeline()
        manager.__enter__()
        self._manager = manager

    def leave(self, failing: bool = False) -> None:
        """Leave the pipeline: one Sync, then every queued result is read, and an
        error among them is raised; with ``failing`` (called while handling an
        exception, which goes on) psycopg logs it instead."""
        manager, self._manager = self._manager, None
        if manager is not None:
            manager.__exit__(*(sys.exc_info() if failing else (None, None, None)))


def _hook(cursor: Any, statement: str, *rest: Any) -> bool | None:
    """SQLAlchemy's ``do_execute`` and ``do_execute_no_params`` hook (``rest`` is
    ``(parameters, context)`` or ``(context,)``): carries out the ``_Step`` given in the
    statement's execution options; statements without one are left to SQLAlchemy."""
    context = rest[-1]
    step: _Step | None = context.execution_options.get(_STEP)
    if step is None:
        return None
    pipeline = step.pipeline
    try:
        if step.autocommit:
            cursor.connection.autocommit = True  # no BEGIN of psycopg's own
            pipeline.autocommit_on = True
        if step.inline:
            _inline(cursor, step, statement, rest)
            return True
        if step.enter:
            pipeline.enter(cursor.connection)
        if step.begin is not None:
            cursor.execute(step.begin)
        cursor.execute(statement, *rest[:-1])
        if step.leave:
            pipeline.leave()
    except Exception as exc:
        if pipeline.open:
            with contextlib.suppress(Exception):  # the first error is the one to report
                pipeline.leave(failing=True)
        if step.committing and _commit_failure(cursor, exc) == _COMMITTED:
            pipeline.committed_then_lost = True  # PostgreSQL answered COMMIT: it happened
            return True
        raise
    except BaseException:
        if pipeline.open:
            with contextlib.suppress(Exception):
                pipeline.leave(failing=True)
        raise
    return True


def _inline(cursor: Any, step: _Step, statement: str, rest: tuple[Any, ...]) -> None:
    """``step.begin`` and ``statement`` as one simple query, its parameters rendered as
    literals by psycopg itself (``ClientCursor.mogrify``): one round trip without
    pipeline mode, whose entering, Sync and leaving cost more CPU than the two
    statements. PostgreSQL runs them in order and stops at the first error (the BEGIN
    has then opened a transaction, rolled back as after any failed statement). The
    cursor is left on the statement's result. The rendered text is kept on the pooled
    connection (``context.root_connection.info``; a writer's lock never changes)."""
    context = rest[-1]
    params = rest[0] if len(rest) == 2 else None
    key = (step.begin, statement, None if params is None else tuple(sorted(params.items())))
    info = context.root_connection.info
    cached = info.get(_INLINE)
    if cached is not None and cached[0] == key:
        query = cached[1]
    else:
        client_cursor = context.dialect.dbapi.ClientCursor(cursor.connection)  # psycopg's
        query = f"{step.begin}; {client_cursor.mogrify(statement, params)}"
        info[_INLINE] = (key, query)
    # prepare=False: a simple query (several statements); an engine whose connections
    # prepare every statement (prepare_threshold=0) would send it as one prepared
    # statement, which PostgreSQL refuses for two commands.
    cursor.execute(query, prepare=False)
    cursor.nextset()


_INLINE = "kafka_txn.inline_lock"
"""The key of the rendered BEGIN and lock in a pooled connection's ``info``."""

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
        self._lock_pipeline: _Pipeline | None = None
        self._pipeline: _Pipeline | None = None

    def lock(self, statement: Any, params: dict[str, Any]) -> Any:
        """BEGIN and ``statement`` (the state-row lock; its first row is returned), in
        one round trip (one simple query, ``_inline``) when pipelined and the
        connection is idle and not in autocommit mode."""
        if not self._pipelined:
            return self._conn.execute(statement, params).first()
        driver = self._conn.connection.driver_connection
        if driver is None or driver.autocommit or driver.info.transaction_status.name != "IDLE":
            return self._conn.execute(statement, params).first()
        pipeline = self._lock_pipeline = _Pipeline()
        lock = _Step(pipeline, autocommit=True, begin=_begin_statement(driver), inline=True)
        return self._conn.execute(statement, params, execution_options={_STEP: lock}).first()

    def execute(self, statement: Any, params: dict[str, Any]) -> None:
        """The state write: queued in a pipeline when pipelined, else executed."""
        if not self._pipelined:
            self._conn.execute(statement, params)
            return
        pipeline = self._pipeline = _Pipeline()
        self._conn.execute(
            statement, params, execution_options={_STEP: _Step(pipeline, enter=True)}
        )

    def commit(self) -> None:
        """COMMIT: with the write, in one round trip when pipelined."""
        pipeline = self._pipeline
        if pipeline is not None and pipeline.open:
            commit = _Step(pipeline, leave=True, committing=True)
            self._conn.exec_driver_sql("COMMIT", execution_options=_options(commit))
            if pipeline.committed_then_lost:
                # Committed; the connection is gone: SQLAlchemy drops it (a COMMIT sent
                # now would fail and read as "outcome unknown").
                self._conn.invalidate()
                return
        self._conn.commit()

    def discard(self) -> None:
        """Leave a pipeline still open (the write runs, uncommitted) before a rollback;
        its errors are the rollback's business."""
        for pipeline in (self._lock_pipeline, self._pipeline):
            if pipeline is not None and pipeline.open:
                with contextlib.suppress(Exception):  # the rollback (or the drop) is next
                    pipeline.leave(failing=sys.exc_info()[0] is not None)

    def finish(self) -> None:
        """The transaction is over: autocommit back off. A connection where that fails
        (still in a transaction, or broken) is invalidated, so that the pool never hands
        it out in autocommit mode."""
        pipeline = self._lock_pipeline
        if pipeline is None or not pipeline.autocommit_on:
            return
        try:
            self._conn.connection.driver_connection.autocommit = False  # type: ignore[union-attr]
        except Exception:
            self._conn.invalidate()
        except BaseException:  # interrupted (a signal's exception): never pool it as is
            self._conn.invalidate()
            raise
        finally:
            pipeline.autocommit_on = False


def _options(step: _Step) -> dict[str, Any]:
    """Execution options of a statement without parameters (SQLAlchemy's
    ``do_execute_no_params``), carrying ``step``."""
    return {_STEP: step, "no_parameters": True}


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
