"""DualWriter's failure paths. A transaction that failed before its database commit is
rolled back on both sides: the database, then the Kafka transaction it began, once the
last commit's state is stored marked completed (an abort may bump the epoch, librdkafka's
KIP-360 abort); if that mark cannot be stored, the Kafka transaction is left open and the
writer stops. A COMMIT whose outcome is unknown, and a Kafka commit that fails after the
database committed, leave the Kafka transaction prepared for the next ``start()`` and
stop the writer: it is never aborted.
"""

from __future__ import annotations

import logging

from sqlalchemy.engine import Connection, Transaction
from sqlalchemy.exc import DBAPIError

from kafka_txn.dualwrite.body_guard import _BodyGuard
from kafka_txn.dualwrite.marks import _CompletionMarks
from kafka_txn.dualwrite.pg_pipeline import Decision
from kafka_txn.dualwrite.rollback_watch import RollbackWatch
from kafka_txn.dualwrite.state_row import _StateRow
from kafka_txn.errors import (
    ConfigurationError,
    DatabaseCommitUnknownError,
    FatalError,
    KafkaTxnError,
    ProducerFencedError,
    TransactionInDoubtError,
    root_exception,
)
from kafka_txn.producer.transactional import TransactionalProducer
from kafka_txn.state import PreparedTxnState

log = logging.getLogger("kafka_txn.dualwrite")


class _FailurePaths:
    """What DualWriter does when a transaction fails: roll back, leave open, or stop in
    doubt. Holds no state: the attributes are DualWriter's."""

    _api_name: str
    producer: TransactionalProducer
    transactional_id: str
    _row: _StateRow
    _guard: _BodyGuard
    _watch: RollbackWatch
    _marks: _CompletionMarks
    _broken: KafkaTxnError | None

    def _in_doubt(self, state: PreparedTxnState, exc: BaseException) -> TransactionInDoubtError:
        tid = self.transactional_id
        reason = exc.message if isinstance(exc, KafkaTxnError) else repr(exc)
        return TransactionInDoubtError(
            f"the dual write of {tid!r} is committed in the database, but its Kafka "
            f"commit did not complete ({reason}). The Kafka transaction is left prepared, "
            f"never aborted: close this writer; the next start() for {tid!r} commits it "
            "(a start() by another writer since then already did), or raises "
            "TransactionDivergedError if Kafka aborted it first (transaction.timeout.ms)",
            kafka_error=exc.kafka_error if isinstance(exc, KafkaTxnError) else None,
            prepared_state=str(state),
        )

    def _failed(
        self,
        conn: Connection,
        began: bool,
        decision: Decision,
        exc: BaseException,
        root: Transaction,
    ) -> None:
        """The transaction failed before its database commit: roll both back. If the
        body had ended the database transaction itself, say so (chaining its error):
        the database keeps part of what it wrote; so if the rollback left rows of
        non-transactional tables (MySQL/MariaDB)."""
        self._watch.stop()
        ended: ConfigurationError | None = None
        if began and isinstance(exc, Exception) and type(exc) is not ConfigurationError:
            if self._row.lock_lost(exc):  # the state write's guard (PostgreSQL)
                ended = self._guard.body_began_another("a ROLLBACK or COMMIT sent as SQL")
            else:
                ended = self._guard.began_another(conn, root)
            # SQLite rolls a transaction back by itself after some errors (SQLITE_FULL,
            # SQLITE_IOERR), which SQLAlchemy's transaction does not show: there the
            # body's own error says more than the session's state.
            if ended is None and self._row.dialect != "sqlite":
                ended = self._guard.body_ended_transaction(conn)
        decision.discard()
        kept = self._roll_back(conn, began, decision)
        if ended is not None:
            raise ended from exc
        if kept is not None and isinstance(exc, Exception):  # an interruption goes on
            raise kept from exc
        fatal = self.producer._life.fatal
        if self._broken is None and fatal is not None and isinstance(exc, Exception):
            # The writer cannot go on (its producer died with this transaction, or
            # before it): what to do now is the broken writer's error, not the advice
            # of the error that failed the transaction (kept as the context).
            self._broken = self._unusable(fatal)
            raise self._broken from root_exception(fatal)

    def _unusable(self, fatal: FatalError) -> FatalError:
        """The writer's error once its producer is unusable (fenced, not authorized, an
        abort the coordinator refused): a new writer is needed."""
        tid = self.transactional_id
        cls = ProducerFencedError if isinstance(fatal, ProducerFencedError) else FatalError
        return cls(
            f"the Kafka producer of the {self._api_name} for {tid!r} is unusable: "
            f"{fatal.message}. The database rolled this transaction back, and nothing of "
            f"its Kafka transaction is visible. Close this writer; unless another writer "
            f"now runs for {tid!r}, start a new one: its start() settles the last commit, "
            "then initialises the transactional id again",
            kafka_error=fatal.kafka_error,
        )

    def _roll_back(
        self, conn: Connection, began: bool, decision: Decision
    ) -> ConfigurationError | None:
        """The database did not commit: roll it back and abort the Kafka transaction
        this attempt began (never one it did not begin). Returns the error to raise if
        the rollback left the body's rows in non-transactional tables (MySQL/MariaDB)."""
        kept: ConfigurationError | None = None
        try:
            conn.rollback()
        except DBAPIError as exc:
            log.warning("database rollback failed: %s", exc)
        else:
            if began and self._guard.kept_non_transactional(conn):
                kept = ConfigurationError(
                    f"the dual write of {self.transactional_id!r} failed and was rolled "
                    "back, but the database warned that changes to non-transactional "
                    "tables (MyISAM, Aria, MEMORY: warning 1196) could not be rolled back: "
                    "what the body wrote to them stays in the database, while nothing of "
                    "the Kafka transaction becomes visible. Write only to transactional "
                    "tables (ENGINE=InnoDB) in the body"
                )
        if began and self.producer.in_transaction:
            # The abort may bump the epoch (librdkafka's KIP-360 abort), after which the
            # coordinator no longer shows how the last commit ended: its state must be
            # stored completed first, or a later recovery could not tell it was settled.
            # Through this transaction's own connection, now idle: on a pool of one a
            # second connection would never come.
            if not self._marks.flush(conn):
                self._leave_open()
                return kept
            try:
                self.producer.abort_transaction()
            except FatalError as exc:  # _failed() raises the writer's error for it
                log.warning("Kafka abort after a failed dual write failed: %s", exc)
            except KafkaTxnError as exc:
                # Ran out of time (a broker away): the producer stays 'aborting', and the
                # next transaction's begin_transaction() finishes the abort first.
                log.warning(
                    "Kafka abort after a failed dual write did not complete (%s): the "
                    "next transaction finishes it first", exc,
                )  # fmt: skip
        return kept

    def _leave_open(self) -> None:
        """The last commit could not be stored completed: rather than abort (which may
        bump the epoch and make that commit unprovable), leave this transaction open and
        stop the writer. The next ``start()`` stores the mark, then fences, which aborts
        it; until then, or ``transaction.timeout.ms``, it holds back read_committed
        readers of its partitions."""
        tid = self.transactional_id
        self._broken = FatalError(
            f"the dual write of {tid!r} failed before its database commit, and the state "
            "of the last committed transaction could not be stored marked completed (the "
            "database refused or was unreachable; see the warning logged), so the open "
            "Kafka transaction was NOT aborted: an abort may bump the producer epoch, "
            "after which recovery could no longer prove that commit. Nothing of this "
            "transaction is visible, but until it ends read_committed consumers of the "
            "partitions it wrote to stop at its first record: it ends when the next "
            "start() aborts it, or when the coordinator does after transaction.timeout.ms. "
            f"Once the database answers, close this writer and start a new one for {tid!r}: "
            "its start() settles the last commit, then aborts this transaction"
        )

    def _commit_database(self, conn: Connection, decision: Decision) -> None:
        try:
            decision.commit()
        except DBAPIError as exc:
            if exc.connection_invalidated:
                # The COMMIT may or may not have happened: only the database knows.
                self._broken = DatabaseCommitUnknownError(
                    f"the database connection dropped during COMMIT ({exc.orig}); the "
                    "Kafka transaction stays prepared: restart the writer, whose start() "
                    "commits or aborts it to match the database"
                )
                raise self._broken from exc
            # The database refused: nothing committed (but rows of non-transactional
            # tables; on PostgreSQL the state write's guard may be what refused).
            kept = self._roll_back(conn, True, decision)
            if self._row.lock_lost(exc):
                raise self._guard.body_began_another("a ROLLBACK or COMMIT sent as SQL") from exc
            if kept is not None:
                raise kept from exc
            raise
        except BaseException as exc:
            # Interrupted (KeyboardInterrupt, a timeout signal) while the COMMIT was under
            # way: whether it happened is unknown, so Kafka stays prepared and the writer
            # stops; the interruption itself goes on up.
            self._broken = DatabaseCommitUnknownError(
                f"interrupted during the database COMMIT ({exc!r}); the Kafka transaction "
                "stays prepared: restart the writer, whose start() commits or aborts it "
                "to match the database"
            )
            raise
