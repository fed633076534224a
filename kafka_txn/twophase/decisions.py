"""Recovery's decision table (KIP-939, emulated on the client): what a fresh process does
with a stored ``PreparedTxnState``, from what DescribeTransactions reports, before its
``init_transactions()`` (which would abort whatever is still open).

The decision is a pure function, ``decide(stored, seen)``, of the stored state and the
coordinator's answer: no I/O, no clock. ``check_belongs`` refuses a state written for
another transactional id or cluster before anything is decided, and ``commit_confirmed``
reads the coordinator's answer after a successful EndTxn(commit).
``twophase.recovery`` carries a decision out (DescribeTransactions, EndTxn, the errors).

The facts the table rests on:

- Once prepared, this library never aborts a transaction the database may have
  committed: a failed commit raises ``TransactionInDoubtError`` and leaves it for
  recovery. So if the stored transaction was aborted, the coordinator did it: its
  timeout (``transaction.timeout.ms``) or another producer's ``init_transactions()``
  (apache/kafka ``TransactionCoordinator.abortTimedOutTransactions`` and
  ``handleInitProducerId``, both through ``TransactionMetadata.prepareFenceProducerEpoch``
  and then ``endTransaction(ABORT)`` with the cluster's transaction version). The abort
  keeps the aborted transaction's start time and leaves the epoch at e + 1 (a
  transaction.version 0/1 cluster, and Apache Kafka 4.1 and later at version 2) or at
  e + 2 (Apache Kafka 4.0 at version 2, whose abort bumps again after the fence). While
  the abort is being written, DescribeTransactions may show the transaction still
  ``Ongoing`` under the fenced epoch e + 1 (``endTransactionWithTV1``, and 4.0's
  version-2 path, set the bumped epoch before appending PrepareAbort); EndTxn with the
  stored epoch is refused from then on. A later ``InitProducerId`` bumps the epoch again
  and resets the start time to -1 (``prepareIncrementProducerEpoch``).
- librdkafka keeps one producer id and epoch for every transaction of a session, so
  transactions are told apart by the coordinator's start time (``stored.txn_start_ms``),
  which is set when a transaction's first partition is added
  (``TransactionMetadata.prepareAddPartitions``) and kept through its completion.
- An id idle for ``transactional.id.expiration.ms`` (7 days by default) is forgotten:
  the coordinator client then reports it not ``found``.

The table (stored producer id p, epoch e, start s; the first matching row decides):

====  ============  ============  ==========  ==================  ===================
row   producer id   epoch         start       state               verdict
====  ============  ============  ==========  ==================  ===================
1     id not found                                                UNKNOWABLE
2     not p                                                       UNKNOWABLE
3     p             < e                                           UNKNOWABLE
4     p             e             < s                             UNKNOWABLE
5     p             e             s           Ongoing             COMMIT
6     p             e             s           Prepare/Complete-   ALREADY_COMMITTED
                                              Commit
7     p             e             s           Prepare/Complete-   DIVERGED
                                              Abort
8     p             e             > s         any                 ALREADY_COMMITTED
9     p             > e           s           Prepare/Complete-   ALREADY_COMMITTED
                                              Commit
10    p             > e           s           Ongoing, Prepare/   DIVERGED
                                              Complete-Abort
11    p             e + 1         > s         any                 ALREADY_COMMITTED
12    anything else (epoch >= e + 2, Empty with start -1, ...)    UNKNOWABLE
====  ============  ============  ==========  ==================  ===================
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kafka_txn.coordinator import TransactionDescription
from kafka_txn.errors import InvalidPreparedStateError
from kafka_txn.state import PreparedTxnState

__all__ = [
    "ABORT_STATES",
    "COMMIT_STATES",
    "RULES",
    "Decision",
    "EpochIs",
    "ProducerIs",
    "Rule",
    "StartIs",
    "Verdict",
    "check_belongs",
    "commit_confirmed",
    "decide",
    "stored_identity",
]

COMMIT_STATES = frozenset({"PrepareCommit", "CompleteCommit"})
ABORT_STATES = frozenset({"PrepareAbort", "CompleteAbort"})


class Verdict(str, enum.Enum):
    """What recovery concludes from one DescribeTransactions answer."""

    COMMIT = "commit"
    """Still open under the stored identity: send EndTxn(commit)."""
    ALREADY_COMMITTED = "already_committed"
    """It was committed before: nothing to send."""
    DIVERGED = "diverged"
    """Kafka aborted it: ``TransactionDivergedError``."""
    UNKNOWABLE = "unknowable"
    """Kafka no longer knows: ``TransactionOutcomeUnknowableError``."""


class EpochIs(enum.Enum):
    """The coordinator's epoch relative to the stored one."""

    OLDER = "< e"
    SAME = "e"
    NEXT = "e + 1"
    LATER = ">= e + 2"


class StartIs(enum.Enum):
    """The coordinator's transaction start time relative to the stored one."""

    EARLIER = "< s"
    SAME = "s"
    LATER = "> s"


class ProducerIs(enum.Enum):
    """Who holds the transactional id, per the coordinator."""

    NOT_FOUND = "id not found"
    OTHER = "not p"
    STORED = "p"


@dataclass(frozen=True)
class Rule:
    """One row of the table: it matches when the producer is ``producer``, the epoch and
    start time relations are among ``epochs`` and ``starts``, and the state is among
    ``states`` (None: any)."""

    row: int
    verdict: Verdict
    reason: str
    producer: ProducerIs = ProducerIs.STORED
    epochs: frozenset[EpochIs] | None = None
    starts: frozenset[StartIs] | None = None
    states: frozenset[str] | None = None

    def matches(self, producer: ProducerIs, epoch: EpochIs, start: StartIs, state: str) -> bool:
        return (
            producer is self.producer
            and (self.epochs is None or epoch in self.epochs)
            and (self.starts is None or start in self.starts)
            and (self.states is None or state in self.states)
        )


RULES: tuple[Rule, ...] = (
    Rule(1, Verdict.UNKNOWABLE, producer=ProducerIs.NOT_FOUND, reason=(
        "Kafka has forgotten the transactional id (it was idle longer than "
        "transactional.id.expiration.ms, 7 days by default, or the cluster lost its "
        "transaction log)"
    )),
    Rule(2, Verdict.UNKNOWABLE, producer=ProducerIs.OTHER, reason=(
        "another producer id now holds the transactional id (it expired and was "
        "initialised again, or this is not the cluster the state was prepared on), so the "
        "stored transaction's history is gone"
    )),
    Rule(3, Verdict.UNKNOWABLE, epochs=frozenset({EpochIs.OLDER}), reason=(
        "the coordinator holds an older epoch than the stored state: another cluster, or "
        "a transaction log that lost data"
    )),
    Rule(4, Verdict.UNKNOWABLE, epochs=frozenset({EpochIs.SAME}),
         starts=frozenset({StartIs.EARLIER}), reason=(
        "the coordinator shows a transaction that started before the stored one: another "
        "cluster, a transaction log that lost data, or a later transaction stamped by a "
        "coordinator whose wall clock went back (a clock step, or a move to a broker "
        "whose clock is behind)"
    )),
    Rule(5, Verdict.COMMIT, epochs=frozenset({EpochIs.SAME}), starts=frozenset({StartIs.SAME}),
         states=frozenset({"Ongoing"}), reason="it is still open under the stored identity"),
    Rule(6, Verdict.ALREADY_COMMITTED, epochs=frozenset({EpochIs.SAME}),
         starts=frozenset({StartIs.SAME}), states=COMMIT_STATES,
         reason="the coordinator shows it committed"),
    Rule(7, Verdict.DIVERGED, epochs=frozenset({EpochIs.SAME}), starts=frozenset({StartIs.SAME}),
         states=ABORT_STATES, reason=(
        "the coordinator shows it aborted under the stored epoch: a producer with this "
        "transactional id aborted it"
    )),
    Rule(8, Verdict.ALREADY_COMMITTED, epochs=frozenset({EpochIs.SAME}),
         starts=frozenset({StartIs.LATER}), reason=(
        "a later transaction ran under the same producer id and epoch, so the stored one "
        "ended before it; it was committed, since a prepared transaction is never aborted "
        "by this library and Kafka's own aborts (timeout, fencing) bump the epoch"
    )),
    Rule(9, Verdict.ALREADY_COMMITTED, epochs=frozenset({EpochIs.NEXT, EpochIs.LATER}),
         starts=frozenset({StartIs.SAME}), states=COMMIT_STATES,
         reason="the coordinator shows it committed, under a later epoch"),
    Rule(10, Verdict.DIVERGED, epochs=frozenset({EpochIs.NEXT, EpochIs.LATER}),
         starts=frozenset({StartIs.SAME}), states=ABORT_STATES | {"Ongoing"}, reason=(
        "the coordinator bumped the epoch and aborted it (or is writing that abort, "
        "showing it Ongoing under the fenced epoch): it outlived transaction.timeout.ms, "
        "or another producer's init_transactions() fenced it"
    )),
    Rule(11, Verdict.ALREADY_COMMITTED, epochs=frozenset({EpochIs.NEXT}),
         starts=frozenset({StartIs.LATER}), reason=(
        "a later transaction ran, and then the epoch was bumped once (Kafka timed that "
        "later transaction out, or librdkafka bumped the epoch when aborting it, KIP-360), "
        "so the stored one had ended, committed"
    )),
    Rule(12, Verdict.UNKNOWABLE, reason=(
        "the coordinator's history no longer reaches the stored transaction (the epoch "
        "moved on, e.g. another producer initialised the id, and no transaction since "
        "tells what became of it): a commit followed by an epoch bump looks the same as "
        "an abort"
    )),
)  # fmt: skip


@dataclass(frozen=True)
class Decision:
    """The verdict, why, and the table row that gave it."""

    verdict: Verdict
    reason: str
    row: int


def _start_is(seen: int, stored: int) -> StartIs:
    if seen < stored:
        return StartIs.EARLIER
    return StartIs.SAME if seen == stored else StartIs.LATER


def _epoch_is(seen: int, stored: int) -> EpochIs:
    if seen < stored:
        return EpochIs.OLDER
    if seen == stored:
        return EpochIs.SAME
    return EpochIs.NEXT if seen == stored + 1 else EpochIs.LATER


def stored_identity(stored: PreparedTxnState) -> tuple[int, int, int]:
    """The stored producer id, epoch and start time (p, e, s of the table)."""
    p, e, s = stored.producer_id, stored.producer_epoch, stored.txn_start_ms
    if p is None or e is None or s is None:
        raise ValueError("a stored state with a producer id, epoch and start time is needed")
    return p, e, s


def decide(stored: PreparedTxnState, seen: TransactionDescription) -> Decision:
    """The verdict of the table above for ``stored`` given what the coordinator
    reports. Pure: no I/O, no clock."""
    p, e, s = stored_identity(stored)
    if not seen.found:
        producer = ProducerIs.NOT_FOUND
    else:
        producer = ProducerIs.STORED if seen.producer_id == p else ProducerIs.OTHER
    facts = (
        producer,
        _epoch_is(seen.producer_epoch, e),
        _start_is(seen.start_time_ms, s),
        seen.state,
    )
    rule = next(r for r in RULES if r.matches(*facts))
    return Decision(rule.verdict, rule.reason, rule.row)


def commit_confirmed(stored: PreparedTxnState, after: TransactionDescription) -> bool:
    """After a successful EndTxn(commit): whether the coordinator shows the stored
    transaction itself committed (same producer id and start time, a commit state).
    Anything else means another producer with the id ran in between, and EndTxn may
    have committed its transaction instead."""
    p, e, s = stored_identity(stored)
    return (
        after.found
        and after.producer_id == p
        and after.producer_epoch >= e
        and after.start_time_ms == s
        and after.state in COMMIT_STATES
    )


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
