"""Recovery of a prepared transaction by a fresh process (KIP-939, emulated on the client).

The algorithm of shared/design/two-phase-commit.md, run BEFORE the new producer's
``init_transactions()`` (which would abort whatever is still open):

1. An empty or completed stored state: nothing to commit.
2. The state must belong to this transactional id and cluster, and carry the
   coordinator's start time: librdkafka reuses one producer id/epoch for every
   transaction of a session, so pid/epoch alone cannot tell transaction N from N+1.
3. DescribeTransactions, then:
   - same pid/epoch/start, Ongoing            -> EndTxn(commit) with the stored identity;
   - same pid/epoch/start, PrepareCommit or
     CompleteCommit; or a later start under the
     same pid/epoch (a newer transaction ran)  -> it was committed before: nothing to do;
   - aborted, expired, fenced, another producer id or a higher epoch
                                               -> TransactionDivergedError.
EndTxn refusals that mean Kafka no longer holds the transaction (PRODUCER_FENCED,
INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING) are divergence
too, never hidden. Running recovery twice is harmless: the second run finds the
transaction committed, or, after a later epoch bump, raises rather than guess; storing
``state.mark_completed()`` once it is settled makes the second run a no-op.
"""

from __future__ import annotations

import enum
import logging

from confluent_kafka import KafkaError

from .coordinator import CoordinatorClient, CoordinatorError
from .errors import (
    ConfigurationError,
    FatalError,
    InvalidPreparedStateError,
    TransactionDivergedError,
)
from .state import PreparedTxnState

__all__ = ["TransactionOutcome", "recover"]

log = logging.getLogger("kafka_txn.recovery")

_COMMITTED_STATES = ("PrepareCommit", "CompleteCommit")
_GONE_CODES = frozenset(
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


def check_belongs(stored: PreparedTxnState, transactional_id: str, cluster_id: str | None) -> None:
    """Refuse a state written for another transactional id or cluster."""
    if stored.transactional_id is not None and stored.transactional_id != transactional_id:
        raise InvalidPreparedStateError(
            f"the stored state belongs to transactional id {stored.transactional_id!r}, "
            f"not {transactional_id!r}: read the state row of this producer's id"
        )
    if stored.cluster_id and cluster_id and stored.cluster_id != cluster_id:
        raise InvalidPreparedStateError(
            f"the stored state was prepared on Kafka cluster {stored.cluster_id!r}, but this "
            f"producer is connected to cluster {cluster_id!r}: point it at the original cluster"
        )


def recover(
    client: CoordinatorClient, stored: PreparedTxnState, cluster_id: str | None
) -> TransactionOutcome:
    """Settle ``stored`` from a fresh process; see the module docstring."""
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
    seen = client.describe()

    def diverged(reason: str, code: int | None = None) -> TransactionDivergedError:
        return TransactionDivergedError(
            f"transaction of {tid!r} that the database committed is not held by Kafka: "
            f"{reason}. Stored: {stored}; coordinator: state {seen.state}, producer id "
            f"{seen.producer_id}, epoch {seen.producer_epoch}, started at "
            f"{seen.start_time_ms} ms. Nothing was committed; re-send the records from the "
            "database",
            kafka_error=None if code is None else KafkaError(code),
            transactional_id=tid,
            stored_state=str(stored),
            observed=seen.as_dict(),
        )

    same_identity = (seen.producer_id, seen.producer_epoch) == (
        stored.producer_id,
        stored.producer_epoch,
    )
    if not same_identity:
        if seen.producer_id == stored.producer_id and seen.producer_epoch > (
            stored.producer_epoch or 0
        ):
            raise diverged(
                "a newer producer epoch replaced it (it expired, was fenced, or was "
                "committed and a later init_transactions() bumped the epoch: a settled "
                "state should be stored as state.mark_completed())"
            )
        raise diverged("another producer id or epoch now owns the transactional id")
    if seen.start_time_ms != stored.txn_start_ms:
        if seen.start_time_ms > stored.txn_start_ms:
            # A newer transaction ran under the same pid/epoch, which needs the stored one
            # to have ended; the database committed it, so it was committed (the design's
            # rule). That newer one, if still open, is aborted by init_transactions().
            log.info(
                "recovery of %r: a newer transaction ran; %s was committed", tid, stored,
                extra={"transactional_id": tid, "outcome": "already_committed"},
            )  # fmt: skip
            return TransactionOutcome.ALREADY_COMMITTED
        raise diverged("the coordinator reports an older transaction than the stored one")
    if seen.state in _COMMITTED_STATES:
        return TransactionOutcome.ALREADY_COMMITTED
    if seen.state != "Ongoing":
        raise diverged(f"it is in state {seen.state}")
    assert stored.producer_id is not None and stored.producer_epoch is not None
    try:
        client.end_txn(stored.producer_id, stored.producer_epoch, commit=True)
    except CoordinatorError as exc:
        if exc.code in _GONE_CODES:
            raise diverged(
                f"EndTxn(commit) was refused with {exc.kafka_error.name()}", exc.code
            ) from exc
        if exc.code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise ConfigurationError(
                f"not authorized to end transactions of {tid!r}: grant WRITE and DESCRIBE "
                "on the transactional id to this principal",
                kafka_error=exc.kafka_error,
            ) from exc
        raise FatalError(
            f"EndTxn(commit) for {tid!r} failed: {exc}", kafka_error=exc.kafka_error
        ) from exc
    log.info(
        "recovery of %r committed %s", tid, stored,
        extra={"transactional_id": tid, "outcome": "committed"},
    )  # fmt: skip
    return TransactionOutcome.COMMITTED
