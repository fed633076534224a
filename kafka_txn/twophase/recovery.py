"""Recovery of a prepared transaction by a fresh process (KIP-939, emulated on the client):
the steps that carry out the decision ``twophase.decisions`` makes, and their outcome.

Runs BEFORE the new producer's ``init_transactions()`` (which would abort whatever is
still open). ``recover`` describes the transaction (DescribeTransactions), decides
(``decisions.decide``), and acts: EndTxn(commit) for COMMIT, ``TransactionOutcome`` or
the error of the verdict otherwise. ``Recovery`` runs it for one producer's
``complete_transaction()`` in RECOVERING, and commits a kept transaction right after
``init_transactions(keep_prepared_txn=True)`` (``settle_kept``).

COMMIT sends EndTxn(commit) with the stored identity. If the coordinator refuses it as
no longer holding that transaction (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH,
INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING), recovery describes again and decides
again; a second COMMIT is UNKNOWABLE (it never loops). Retriable coordinator errors are
retried by the coordinator client; anything else is translated by
``twophase.failures.coordinator_failure``, the one place for that.

DescribeTransactions -> EndTxn is check-then-act: another producer with the same
transactional id (a zombie) that commits the stored transaction and begins its next one
in between would have EndTxn commit that next one. This cannot be prevented from here
(EndTxn carries no start time), so after a successful EndTxn recovery describes once
more, and raises UNKNOWABLE unless the coordinator shows the stored transaction
committed. The caller must stop or fence every other instance of the transactional id
before recovery; ``DualWriter`` does it with its state-row lock.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from confluent_kafka import KafkaError

from kafka_txn.coordinator import CoordinatorClient, CoordinatorError, TransactionDescription
from kafka_txn.errors import (
    InvalidPreparedStateError,
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
    TransactionOutcomeUnknownError,
    root_exception,
)
from kafka_txn.metrics import MetricsHook, timed
from kafka_txn.state import PreparedTxnState
from kafka_txn.twophase.cluster import ClusterId
from kafka_txn.twophase.coordinator_calls import CoordinatorCalls
from kafka_txn.twophase.decisions import (
    Decision,
    Verdict,
    check_belongs,
    commit_confirmed,
    decide,
    stored_identity,
)

__all__ = ["Recovered", "Recovery", "TransactionOutcome", "recover"]

log = logging.getLogger("kafka_txn.recovery")

# EndTxn refusals meaning the coordinator no longer holds the transaction under the
# stored identity (TransactionCoordinator.endTransaction): describe again, decide again.
_REFUSALS = frozenset(
    {
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.INVALID_TXN_STATE,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
    }
)


class TransactionOutcome(str, enum.Enum):
    """How ``complete_transaction()`` settled a transaction."""

    COMMITTED = "committed"
    """Committed now."""
    ABORTED = "aborted"
    """Aborted now (the stored state did not match the prepared one)."""
    ALREADY_COMMITTED = "already_committed"
    """Recovery found it committed earlier; nothing was sent."""
    NOTHING_TO_COMMIT = "nothing_to_commit"
    """The stored state was empty or completed; anything still open is aborted."""


def _seen(seen: TransactionDescription) -> str:
    if not seen.found:
        return "coordinator: transactional id not found"
    return (
        f"coordinator: state {seen.state}, producer id {seen.producer_id}, epoch "
        f"{seen.producer_epoch}, started at {seen.start_time_ms} ms"
    )


def _diverged(
    tid: str, stored: PreparedTxnState, seen: TransactionDescription, reason: str,
    code: int | None = None,
) -> TransactionDivergedError:  # fmt: skip
    """Kafka aborted what the database committed: nothing of it is visible."""
    return TransactionDivergedError(
        f"Kafka aborted the transaction of {tid!r} that the database committed: {reason}. "
        f"Stored: {stored}; {_seen(seen)}. Nothing of it was committed and none of its "
        "records are visible to read_committed consumers: re-send them from the database "
        "in a new transaction whose prepared state replaces the stored one in the "
        "database commit that decides it (DualWriter: resolve(), start(), then the "
        "re-send in the first transaction); storing state.mark_completed() after a plain "
        "re-send sends them twice if a crash comes in between. Then fix the cause (a "
        "transaction.timeout.ms shorter than crash, restart and recovery take, or two "
        "instances sharing the transactional id)",
        kafka_error=None if code is None else KafkaError(code),
        transactional_id=tid,
        stored_state=str(stored),
        observed=seen.as_dict(),
    )


def _unknowable(
    tid: str, stored: PreparedTxnState, seen: TransactionDescription, reason: str,
    code: int | None = None, *, committed_nothing: bool = True,
) -> TransactionOutcomeUnknowableError:  # fmt: skip
    """Kafka cannot tell whether what the database committed was committed in Kafka."""
    sent = " Recovery committed nothing." if committed_nothing else ""
    return TransactionOutcomeUnknowableError(
        f"the outcome in Kafka of the transaction of {tid!r} that the database committed "
        f"cannot be known: {reason}. Stored: {stored}; {_seen(seen)}.{sent} Do not re-send "
        "its records blindly (that may duplicate them) nor drop "
        "them (that may lose them): check with a read_committed consumer which of them "
        "are in the topic, re-send only those that are missing, then store "
        "state.mark_completed() in place of the stored state (DualWriter.resolve()) so "
        "that recovery can go on",
        kafka_error=None if code is None else KafkaError(code),
        transactional_id=tid,
        stored_state=str(stored),
        observed=seen.as_dict(),
    )


def _settle(
    tid: str, stored: PreparedTxnState, seen: TransactionDescription, decision: Decision,
    code: int | None = None,
) -> TransactionOutcome:  # fmt: skip
    """The outcome of a verdict other than COMMIT (which ``recover`` acts on)."""
    if decision.verdict is Verdict.ALREADY_COMMITTED:
        log.info(
            "recovery of %r: %s was committed (%s)", tid, stored, decision.reason,
            extra={"transactional_id": tid, "outcome": "already_committed"},
        )  # fmt: skip
        return TransactionOutcome.ALREADY_COMMITTED
    make = _diverged if decision.verdict is Verdict.DIVERGED else _unknowable
    exc = make(tid, stored, seen, decision.reason, code)
    log.warning(
        "recovery of %r: %s", tid, exc,
        extra={"transactional_id": tid, "outcome": decision.verdict.value},
    )  # fmt: skip
    raise exc


def recover(
    client: CoordinatorClient, stored: PreparedTxnState, cluster_id: str | None
) -> TransactionOutcome:
    """Settle ``stored`` from a fresh process; see the module docstring. A
    ``CoordinatorError`` that survived the client's retries propagates, for
    ``twophase.failures.coordinator_failure`` to translate."""
    tid = client.transactional_id
    check_belongs(stored, tid, cluster_id)  # a foreign state row is refused, even completed
    if stored.is_empty or stored.completed:
        log.info(
            "recovery of %r: stored state %r needs no commit", tid, str(stored),
            extra={"transactional_id": tid, "outcome": "nothing_to_commit"},
        )  # fmt: skip
        return TransactionOutcome.NOTHING_TO_COMMIT
    if stored.txn_start_ms is None:
        raise InvalidPreparedStateError(
            f"the stored state {str(stored)!r} has no transaction start time, so it cannot "
            "be told apart from a later transaction under the same producer id and epoch "
            "(librdkafka reuses them): recover from the state prepare_transaction() returned"
        )
    p, e, s = stored_identity(stored)
    seen = client.describe()
    decision = decide(stored, seen)
    if decision.verdict is not Verdict.COMMIT:
        return _settle(tid, stored, seen, decision)
    try:
        client.end_txn(p, e, commit=True)
    except CoordinatorError as exc:
        if exc.code not in _REFUSALS:
            if exc.retriable or not commit_confirmed(stored, client.describe()):
                raise
            # An answer that is neither a refusal nor retriable (UNKNOWN_SERVER_ERROR from
            # a Kafka-compatible broker or a gateway) after the coordinator applied the
            # commit: it shows the stored transaction committed, so recovery committed it.
            log.warning(
                "recovery of %r: EndTxn(commit) was answered with %s, yet the coordinator "
                "shows the stored transaction committed", tid, exc.kafka_error.name(),
            )  # fmt: skip
            return TransactionOutcome.COMMITTED
        seen = client.describe()
        decision = decide(stored, seen)
        if decision.verdict is Verdict.COMMIT:
            decision = Decision(
                Verdict.UNKNOWABLE,
                f"EndTxn(commit) was refused with {exc.kafka_error.name()}, yet the "
                "coordinator still shows the transaction open under the stored identity",
                0,
            )
        else:
            decision = Decision(
                decision.verdict,
                f"EndTxn(commit) was refused with {exc.kafka_error.name()}; {decision.reason}",
                decision.row,
            )
        return _settle(tid, stored, seen, decision, exc.code)
    after = client.describe()
    if not commit_confirmed(stored, after):
        raise _unknowable(
            tid, stored, after,
            f"EndTxn(commit) succeeded, but then the coordinator showed a transaction "
            f"started at {after.start_time_ms} ms in state {after.state}, not the stored "
            f"one (started at {s} ms) committed. Another producer with this transactional "
            "id (a zombie) was running during recovery, so EndTxn may have committed that "
            "producer's next transaction, which its database may never have decided. Stop "
            "or fence every other instance of the transactional id before recovering "
            "(DualWriter does it with its state-row lock)",
            committed_nothing=False,
        )  # fmt: skip
    log.info(
        "recovery of %r committed %s", tid, stored,
        extra={"transactional_id": tid, "outcome": "committed"},
    )  # fmt: skip
    return TransactionOutcome.COMMITTED


@dataclass
class Recovered:
    """What recovery settled in this process, kept until the init after it succeeds:
    ``complete_transaction()`` called again with the same stored state resumes after
    recovery instead of running it again (a partial init bumps the epoch, after which
    the committed transaction could no longer be told from an aborted one)."""

    stored: PreparedTxnState
    outcome: TransactionOutcome
    before_init_ran: bool = False


class Recovery:
    """Recovery's steps for one TransactionalProducer, and what the last recovery settled
    (``recovered``)."""

    def __init__(
        self,
        coordinator: CoordinatorCalls,
        cluster: ClusterId,
        *,
        deadline_s: float,
        metrics: MetricsHook | None,
    ) -> None:
        self._coordinator = coordinator
        self._cluster = cluster
        self._deadline_s = deadline_s
        self._metrics = metrics
        self.recovered: Recovered | None = None
        """Recovery's result while the init after it has not succeeded."""

    def complete(
        self,
        state: PreparedTxnState,
        before_init: Callable[[TransactionOutcome], None] | None,
        timeout: float | None,
        init: Callable[[float | None], None],
    ) -> TransactionOutcome:
        """complete_transaction() in RECOVERING: recovery, the hook, the init (``init``,
        librdkafka's init_transactions()); what a call that failed after recovery had
        settled the state already did is not done again (``recovered``)."""
        done = self.recovered
        if done is None or done.stored != state:
            with timed(self._metrics, "recovery"):
                outcome = self.recover(state)
            done = self.recovered = Recovered(state, outcome)
        if before_init is not None and not done.before_init_ran:
            before_init(done.outcome)
            done.before_init_ran = True
        try:
            init(timeout)
        except TransactionOutcomeUnknownError as exc:
            budget = self._deadline_s if timeout is None else timeout
            raise TransactionOutcomeUnknownError(
                f"complete_transaction(): recovery settled the stored transaction "
                f"(outcome: {done.outcome.value}), then init_transactions() did not "
                f"complete within {budget:g}s ({exc.kafka_error.str()}): call "
                "complete_transaction() again with the same state, which does not recover "
                "again but only initialises",
                kafka_error=exc.kafka_error,
                operation="complete_transaction",
            ) from root_exception(exc)
        return done.outcome

    def recover(self, stored: PreparedTxnState) -> TransactionOutcome:
        """Settle a stored state from a fresh producer, before its init (``recover``)."""
        cluster_id = self._cluster.require(stored, "complete_transaction")
        return self._coordinator.call(
            "complete_transaction",
            partial(recover, self._coordinator.client, stored, cluster_id),
            recovering=True,
        )

    def settle_kept(self, commit: bool) -> None:
        """commit_transaction()/abort_transaction() right after
        init_transactions(keep_prepared_txn=True): commit whatever transaction is open
        for this transactional id (KIP-939 leaves that choice to the caller); an abort
        needs nothing here, the init that follows aborts what is open."""
        if not commit:
            return
        coordinator = self._coordinator
        seen = coordinator.call("commit_transaction", coordinator.client.describe, recovering=True)
        if seen.state == "Ongoing":
            coordinator.call(
                "commit_transaction",
                partial(coordinator.client.end_txn, seen.producer_id, seen.producer_epoch, True),
                recovering=True,
            )
