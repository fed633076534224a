"""DualWriter's start-up and takeover of its transactional id. Under the state-row lock,
``start()`` reads the stored state and lets ``complete_transaction`` commit the prepared
transaction a predecessor left if the database committed it (or abort it if not); stores
the state marked completed together with this writer's owner token; then, holding the
lock again, runs ``init_transactions()``, which fences the predecessor in Kafka (a new
producer epoch). Every transaction repeats the owner check under the same lock, so a
writer taken over fails before it writes anything.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable

from confluent_kafka import KafkaError
from sqlalchemy.engine import Engine

from kafka_txn.dualwrite.state_row import _OWNER_LENGTH, _Row, _StateRow
from kafka_txn.dualwrite.unavailable import raise_if_unavailable, writer_terms
from kafka_txn.errors import (
    BrokerUnreachableError,
    InvalidPreparedStateError,
    KafkaTxnError,
    ProducerFencedError,
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
    root_exception,
)
from kafka_txn.producer.reachability import restated
from kafka_txn.producer.transactional import TransactionalProducer
from kafka_txn.state import PreparedTxnState
from kafka_txn.twophase.recovery import TransactionOutcome

log = logging.getLogger("kafka_txn.dualwrite")


def _owner_token() -> str:
    """A token naming one DualWriter instance, ``host:pid:uuid8``: where to find the
    process, and which of its writers (a process may start several, one after another)."""
    suffix = f":{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return socket.gethostname()[: _OWNER_LENGTH - len(suffix)] + suffix


class _Startup:
    """DualWriter's ``start()`` (recovery, settle, takeover, fence) and the owner check
    that every transaction repeats. Holds no state: the attributes are DualWriter's."""

    _api_name = "DualWriter"
    """The class the caller made, as errors name it and its arguments
    (``AsyncDualWriter`` runs this one underneath)."""
    engine: Engine
    producer: TransactionalProducer
    transactional_id: str
    owner: str
    _row: _StateRow
    _create: bool
    _started: bool
    _fenced: TransactionOutcome | None
    _start_outcome: TransactionOutcome | None
    _broken: KafkaTxnError | None
    _unresolved: str | None
    _resolved: str | None
    _after_settle: Callable[[], None] | None

    def _start(self) -> TransactionOutcome:
        self._raise_if_broken()
        if self._started:
            # Started already: by an earlier start(), ``with DualWriter(...)`` or the first
            # transaction(). Recovery and the fence ran once; they are not run again.
            assert self._start_outcome is not None
            return self._start_outcome
        if self._fenced is not None:
            return self._finish_start(self._fenced)
        # A database that cannot be opened is named with its fix before anything else.
        raise_if_unavailable(self.engine, f"{self._api_name}.start()", writer_terms(self._api_name))
        self._row.ensure(self._create)
        self.producer.init_transactions(keep_prepared_txn=True)  # repeatable until settled
        with self.engine.connect() as conn:
            conn.begin()
            stored = PreparedTxnState(self._row.lock(conn).state)
            # A state resolve() accepted is not recovered again, nor stored completed: it
            # stays in the row until the first transaction that commits (the re-send of
            # its records) replaces it in the same database transaction, so a crash
            # before that leaves it unresolved, never resolved without its records.
            resolved = self._resolved == str(stored)
            if self._resolved is not None and not resolved:
                # Another writer moved the row on since resolve() (its own resolution and
                # re-send may have committed): re-sending here could duplicate records.
                accepted, self._resolved = self._resolved, None
                raise InvalidPreparedStateError(
                    f"start(): the state resolve() accepted ({accepted!r}) is no longer in "
                    f"the state row of {self.transactional_id!r}, which holds {str(stored)!r}: "
                    "another writer moved on since (it may have re-sent the records). Do not "
                    "re-send them: call start() again and handle what it reports"
                )
            kept = stored if resolved else stored.mark_completed()

            def settle(outcome: TransactionOutcome) -> None:
                # Recovery settled `stored`. Store it completed, and this writer as the
                # owner, before init_transactions() bumps the epoch: a crash from here on
                # cannot make recovery guess, and from this commit on the previous owner's
                # transactions fail their owner check.
                self._row.settle(conn, kept)
                conn.commit()
                if self._after_settle is not None:
                    self._after_settle()
                # Hold the lock again until the fence is in place, so that init runs only
                # if no other start() took the id over since (the last owner is the one
                # whose init ran last).
                conn.begin()
                self._check_owner(
                    self._row.lock(conn),
                    "start(): recovery is done, but this writer did not initialise transactions",
                )

            try:
                outcome = self.producer.complete_transaction(
                    PreparedTxnState("") if resolved else stored, before_init=settle
                )
            except (TransactionDivergedError, TransactionOutcomeUnknowableError):
                self._unresolved = str(stored)  # what resolve() may then be given
                raise
            except BrokerUnreachableError as exc:
                # The producer's advice names complete_transaction(); the caller's call
                # is start().
                raise restated(
                    exc, f"{self._api_name}.start() for {self.transactional_id!r}",
                    "then call start() again (transaction() also starts the writer)",
                ) from root_exception(exc)  # fmt: skip
            # Recovered, settled and fenced: what is left (this COMMIT) only releases the
            # lock. If it fails (the session ended while init ran), start() again only
            # checks the ownership (_finish_start).
            self._fenced = outcome
            conn.commit()
        return self._started_as(outcome)

    def _finish_start(self, outcome: TransactionOutcome) -> TransactionOutcome:
        """start() again after one that initialised transactions (recovered, settled,
        fenced) and then failed at its last COMMIT, which only releases the lock: the
        row's owner must still be this writer. Its lock may have gone with its session
        before init returned, so another writer's start() may have taken the id over
        since: then this one is fenced (ProducerFencedError), and the other's own init,
        which ran after its owner commit, fences this producer in Kafka too."""
        with self.engine.connect() as conn:
            conn.begin()
            self._check_owner(
                self._row.lock(conn),
                "start(): this writer initialised transactions, but another took the id "
                "over before its start() completed",
            )
            conn.commit()
        return self._started_as(outcome)

    def _started_as(self, outcome: TransactionOutcome) -> TransactionOutcome:
        log.info(
            "dual writer %r started as %s: %s", self.transactional_id, self.owner,
            outcome.value,
            extra={"transactional_id": self.transactional_id, "outcome": outcome.value},
        )  # fmt: skip
        self._started = True
        self._start_outcome = outcome
        self._fenced = None
        return outcome

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise self._broken.with_traceback(None)

    def _check_owner(self, row: _Row, consequence: str) -> None:
        """Under the row lock: the row's owner must be this writer. Otherwise a newer
        writer's start() took the id over, and this one is fenced for good."""
        if row.owner == self.owner:
            return
        tid = self.transactional_id
        self._broken = ProducerFencedError(
            f"another DualWriter for transactional id {tid!r} (owner {row.owner!r}) took "
            f"it over (state row last written at {row.updated}); this writer "
            f"({self.owner!r}) is fenced and must be closed; {consequence}",
            kafka_error=KafkaError(KafkaError.PRODUCER_FENCED),
        )
        raise self._broken
