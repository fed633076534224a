"""Errors after which the database rolled back the whole transaction, not only the
statement, seen while a ``DualWriter`` body runs.

A body may catch a statement's error and go on (skip a bad row). That is safe when the
database undid only the statement. Some errors undo the whole transaction:

- MySQL/MariaDB: a deadlock (ER_LOCK_DEADLOCK, 1213), and a lock wait timeout (1205)
  when ``innodb_rollback_on_timeout`` is on (MySQL manual, "InnoDB Error Handling");
- SQLite: ``RAISE(ROLLBACK)`` in a trigger, ``ON CONFLICT ROLLBACK``, SQLITE_FULL... (the
  connection is out of its transaction after the error);
- PostgreSQL: none, but any error leaves the transaction failed (it can only roll back;
  a savepoint rolled back to, as ``Connection.begin_nested()`` does, recovers it).

On MySQL and SQLite the driver then begins a new transaction at the body's next
statement, so the driver's state after the body shows a transaction again: what was
written before the error is gone, the state-row lock with it, and committing would make
Kafka hold records the database lost. The writer watches the body's connection through
SQLAlchemy's ``handle_error`` event (statements the body runs on the raw driver
connection are not seen) and fails the transaction instead.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Connection, Engine, ExceptionContext

_MYSQL_DEADLOCK = 1213
_MYSQL_LOCK_WAIT_TIMEOUT = 1205
_PG_INERROR = 3  # psycopg 3's TransactionStatus.INERROR, psycopg2's TRANSACTION_STATUS_INERROR


class RollbackWatch:
    """Notes, for the one connection a writer's body runs on, the errors after which the
    database may have rolled the whole transaction back. One per writer (its
    transactions run one at a time); listens on the writer's engine until ``close()``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._dialect = engine.dialect.name
        self._conn: Connection | None = None
        self._first: BaseException | None = None  # PostgreSQL: the first error
        self._lost: BaseException | None = None  # the transaction is certainly gone
        self._timeout: BaseException | None = None  # MySQL: gone if rollback_on_timeout
        event.listen(engine, "handle_error", self._on_error)

    def watch(self, conn: Connection) -> None:
        """The body starts on ``conn`` (in its transaction, the state row locked)."""
        self._first = self._lost = self._timeout = None
        self._conn = conn

    def stop(self) -> None:
        self._conn = None

    def close(self) -> None:
        self._conn = None
        if event.contains(self._engine, "handle_error", self._on_error):
            event.remove(self._engine, "handle_error", self._on_error)

    def _on_error(self, context: ExceptionContext) -> None:
        # Runs inside SQLAlchemy's error handling: reads only, never raises.
        conn = context.connection
        if conn is None or conn is not self._conn:
            return
        orig = context.original_exception
        if self._first is None:
            self._first = orig
        if self._dialect in ("mysql", "mariadb"):
            code = orig.args[0] if orig.args else None
            if code == _MYSQL_DEADLOCK and self._lost is None:
                self._lost = orig
            elif code == _MYSQL_LOCK_WAIT_TIMEOUT and self._timeout is None:
                self._timeout = orig
        elif self._dialect == "sqlite" and self._lost is None:
            try:
                driver: Any = conn.connection.driver_connection
            except Exception:  # a lost connection: its own error says enough
                return
            if getattr(driver, "in_transaction", None) is False:
                self._lost = orig

    def rolled_back(self) -> BaseException | None:
        """After the body returned: the error the body caught after which the database
        rolled the transaction back (or, PostgreSQL, left it failed), or None. A round
        trip only if a MySQL/MariaDB lock wait timed out in the body (is
        ``innodb_rollback_on_timeout`` on?)."""
        conn, self._conn = self._conn, None
        if conn is None or conn.closed or conn.invalidated:
            return None
        if self._dialect == "postgresql":
            pg: Any = conn.connection.driver_connection
            status = getattr(getattr(pg, "info", None), "transaction_status", None)
            if status is not None and int(status) == _PG_INERROR:
                return self._first or RuntimeError("a statement of the body failed")
            return None
        if (
            self._lost is None
            and self._timeout is not None
            and conn.execute(text("SELECT @@innodb_rollback_on_timeout")).scalar()
        ):
            return self._timeout
        return self._lost
