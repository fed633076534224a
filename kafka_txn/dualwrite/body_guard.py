"""The checks on the session that the body of ``writer.transaction()`` runs in: the body
must leave the database transaction to the writer. A COMMIT, ROLLBACK or autocommit switch
in it, or a rollback the database did after an error the body caught, would let the
database keep or lose rows whose Kafka records go the other way; on MySQL/MariaDB a
rollback may also leave rows of non-transactional tables. The checks after the body need
no round trip; the warnings of a rollback are read on the failure path only.
"""

from __future__ import annotations

import logging

from sqlalchemy.engine import Connection, Transaction

from kafka_txn.dualwrite.engine import _in_transaction
from kafka_txn.dualwrite.rollback_watch import RollbackWatch
from kafka_txn.errors import ConfigurationError, TransactionAbortableError

log = logging.getLogger("kafka_txn.dualwrite")

_NOT_COMPLETE_ROLLBACK = 1196
"""MySQL/MariaDB's warning on a ROLLBACK that could not undo changes to non-transactional
tables: "Some non-transactional changed tables couldn't be rolled back"."""


_BODY_RULE = (
    "The Kafka transaction is aborted, so nothing of it is visible. The body must "
    "leave the transaction to the writer: no COMMIT, ROLLBACK or autocommit switch in it"
)


class _BodyGuard:
    """The errors for a body that did not leave the database transaction to the writer,
    for the writer of ``transactional_id`` on a ``dialect`` database, whose body's
    connection ``watch`` notes the errors that rolled a whole transaction back."""

    def __init__(self, transactional_id: str, dialect: str, watch: RollbackWatch) -> None:
        self.transactional_id = transactional_id
        self.dialect = dialect
        self._watch = watch

    def body_ended_transaction(self, conn: Connection) -> ConfigurationError | None:
        """The error for a body that ended the database transaction itself (a COMMIT,
        ``SET autocommit = 1``, which commits on MySQL/MariaDB), seen after it ran: its
        statements so far are committed, and the rest would not be atomic with Kafka."""
        if _in_transaction(conn) is not False:
            return None
        return ConfigurationError(
            f"the database transaction of the DualWriter for {self.transactional_id!r} "
            "was no longer open after its body ran: the body ended it (a COMMIT, SET "
            "autocommit = 1, or the driver's autocommit switched on), so what it wrote "
            "until then may be committed and stay in the database, and the rest ran "
            "statement by statement; or the database rolled it back after an error. "
            f"{_BODY_RULE}"
        )

    def body_began_another(self, how: str) -> ConfigurationError:
        """The error for a body that ended the database transaction holding the
        state-row lock and went on in a new one (``how``): what it wrote before may be
        committed, what it wrote after is rolled back, the lock was released between."""
        return ConfigurationError(
            f"the body of a transaction of the DualWriter for {self.transactional_id!r} "
            f"ended the database transaction that held the state-row lock ({how}): what "
            "it wrote before may be committed and stay in the database (a COMMIT), or is "
            "undone (a ROLLBACK), and the lock was released; what it wrote after ran in a "
            "new transaction, which the writer rolled back. " + _BODY_RULE
        )

    def kept_non_transactional(self, conn: Connection) -> bool:
        """MySQL/MariaDB, right after the writer's ROLLBACK: whether it warned that
        rows of non-transactional tables (MyISAM, Aria, MEMORY) could not be rolled back
        (ER_WARNING_NOT_COMPLETE_ROLLBACK, 1196). A round trip on the failure path only,
        on the DBAPI connection (SQLAlchemy would begin a transaction for it)."""
        if self.dialect not in ("mysql", "mariadb") or conn.invalidated or conn.closed:
            return False
        try:
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cursor.execute("SHOW WARNINGS")
                codes = {row[1] for row in cursor.fetchall()}
            finally:
                cursor.close()
        except Exception as exc:
            log.warning("could not read the warnings of the database rollback: %s", exc)
            return False
        return _NOT_COMPLETE_ROLLBACK in codes

    def began_another(self, conn: Connection, root: Transaction) -> ConfigurationError | None:
        """The error for a body that committed or rolled back through SQLAlchemy
        (``tx.connection.commit()``, ``.rollback()``): the connection's transaction is
        no longer ``root``, the one the writer began (none, or one begun since)."""
        if conn.get_transaction() is root:
            return None
        return self.body_began_another("tx.connection.commit() or .rollback()")

    def check_kept_transaction(self, conn: Connection, root: Transaction) -> None:
        """After the body: its database transaction must still be the one that holds
        the state-row lock, neither rolled back by the database after an error the body
        caught, nor ended by the body itself (through SQLAlchemy: the connection's
        transaction is no longer ``root``; on PostgreSQL as SQL: the state write's guard
        fails). No round trip."""
        lost = self._watch.rolled_back()
        if lost is not None:
            raise TransactionAbortableError(
                f"the database rolled back the whole transaction of the DualWriter for "
                f"{self.transactional_id!r} after an error that the body caught ({lost}): "
                "what the body wrote before it is undone, and the state-row lock with it. "
                "Nothing of this transaction commits (the Kafka transaction is aborted, "
                "the database rolled back), so it may be retried as a whole. To skip a "
                "failing statement, run it in a savepoint "
                "(with tx.connection.begin_nested(): ...)"
            )
        ended = self.began_another(conn, root) or self.body_ended_transaction(conn)
        if ended is not None:
            raise ended
