"""This producer's id and epoch, which two-phase commit needs and librdkafka does not
expose: prepare stores them in the ``PreparedTxnState`` and has the coordinator confirm
them (KIP-939's prepared state names the producer id and epoch).

librdkafka's statistics do hold them: the top-level ``eos`` object has ``producer_id``,
``producer_epoch``, ``idemp_state`` and ``txn_state``. They change only at
``init_transactions()`` and at the epoch bump ``abort_transaction()`` may do (KIP-360), so
a snapshot taken after the last of those stays valid: only the first prepare after an init
waits for one. After an abort, the identity from before it is a candidate that prepare's
own DescribeTransactions confirms or refuses (``IdentityTracker``, ``confirms``), so that a
transaction after a failed one does not wait for the next snapshot
(``statistics.interval.ms``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kafka_txn.coordinator.client import TransactionDescription
from kafka_txn.twophase.failures import prepare_failed

__all__ = ["DEFAULT_STATISTICS_INTERVAL_MS", "IdentityTracker", "confirms"]

log = logging.getLogger("kafka_txn.twophase")

DEFAULT_STATISTICS_INTERVAL_MS = 100
"""statistics.interval.ms set for two-phase commit when the user set none."""

# A snapshot whose transaction manager is in one of these states was taken when the
# producer id and epoch were settled (not mid-init, not mid-abort).
_SETTLED_TXN_STATES = frozenset({"Ready", "InTransaction", "BeginCommit", "CommittingTransaction"})


class IdentityTracker:
    """This producer's id and epoch, read from librdkafka's statistics, and the candidate
    that stands in for them after an abort until a snapshot comes.

    ``identity``: the id/epoch to prepare with, or None when prepare must find them. A
    settled snapshot (``on_stats``) is the authority: after ``invalidate()`` (an init, or
    anything else after which nothing is assumed) only a snapshot sets it again. After an
    abort (``after_abort``) the identity from before it is kept as ``candidate``: it is
    still the producer's unless librdkafka's abort bumped the epoch (KIP-360: it then
    fetches a new epoch, or on epoch exhaustion a new producer id, with InitProducerId
    before abort_transaction() returns; rd_kafka_txn_endtxn_complete calls
    rd_kafka_idemp_drain_epoch_bump0 when ``txn_requires_epoch_bump``). Prepare's
    DescribeTransactions decides (``resolve``): the candidate becomes the identity only if
    the coordinator shows this transaction open (Ongoing) under exactly the candidate's id
    and epoch, with a start time newer than any this producer saw before.

    Why such an answer proves the candidate is librdkafka's current identity: every
    identity a transactional id ever has comes from its coordinator (InitProducerId, the
    coordinator's own bump when it times a transaction out or fences it for another
    instance's init) and is never handed out twice (the epoch only grows under one
    producer id, and a new producer id is new to the cluster). The candidate was
    librdkafka's identity before the abort; librdkafka's identity is the coordinator's
    or an older one (fenced); so the coordinator still showing the candidate means that
    nothing replaced it, librdkafka's included. Epochs do not move with each transaction:
    librdkafka sends EndTxn v0-1 only (rd_kafka_EndTxnRequest), and Apache Kafka bumps the
    epoch at EndTxn only for clients that send v5 or later (KafkaApis.handleEndTxnRequest:
    TV_2 only for version > 4; TransactionCoordinator.handleEndTransaction ->
    TransactionMetadata.prepareAbortOrCommit bumps only when
    ``clientTransactionVersion.supportsEpochBump()``), also on clusters at transaction
    version 2 (KIP-890). Were that to change, every candidate would be refused, which is
    slow but not wrong. An Ongoing transaction under the candidate after the abort
    returned is not the aborted one (its EndTxn was answered, so the coordinator holds it
    PrepareAbort or later), and only this producer adds partitions under its identity.

    The next settled snapshot checks a confirmed candidate: agreeing, it becomes the
    identity as any snapshot does; disagreeing (which the argument above excludes), the
    snapshot's identity replaces it, it is counted in ``disagreements`` and logged, and
    candidates are no longer used by this producer. A transaction prepared under the
    refuted candidate named the id/epoch the coordinator showed it under, which is what
    recovery checks; a commit through librdkafka under another identity is refused by the
    coordinator (PRODUCER_FENCED or INVALID_PRODUCER_ID_MAPPING) and leaves that
    transaction in doubt, never aborted.

    ``on_stats`` runs in whatever thread serves librdkafka's callbacks (any caller of
    poll() or flush()), so changes are made under a lock."""

    def __init__(self, chained: Callable[[str], None] | None) -> None:
        self._chained = chained
        self._lock = threading.Lock()
        self.identity: tuple[int, int] | None = None
        self.candidate: tuple[int, int] | None = None
        """The identity from before the last abort, while no snapshot came since."""
        self.provisional = False
        """``identity`` is a confirmed candidate that no snapshot has checked yet."""
        self.use_candidates = True
        """False once a snapshot disagreed with a confirmed candidate."""
        self._wanted = True
        self.waits = 0
        """Prepares that waited for a statistics snapshot (for tests and diagnostics)."""
        self.confirmed = 0
        self.refused = 0
        """Candidates prepare's DescribeTransactions confirmed, and refused."""
        self.disagreements = 0
        """Snapshots that disagreed with a confirmed candidate."""
        self.snapshots = 0
        """Snapshots that set the identity."""

    def invalidate(self) -> None:
        """Forget the identity and any candidate: only a snapshot sets it again."""
        with self._lock:
            self.identity = None
            self.candidate = None
            self.provisional = False
            self._wanted = True

    def after_abort(self) -> None:
        """librdkafka's abort_transaction() returned (and the callbacks it queued were
        served): the identity may have changed (an epoch bump), so it is a candidate now.
        Without an identity (no snapshot since an earlier abort) the earlier candidate
        stays: it was the producer's identity at some point, which is all ``resolve``
        assumes."""
        with self._lock:
            if self.identity is not None and self.use_candidates:
                self.candidate = self.identity
            self.identity = None
            self.provisional = False
            self._wanted = True

    def resolve(
        self, seen: TransactionDescription, last_start_ms: int | None
    ) -> tuple[int, int] | None:
        """The identity to prepare with, given the coordinator's answer ``seen`` for the
        transaction being prepared: the known identity; else the candidate if ``seen``
        confirms it (then provisional until the next snapshot); else None (wait for a
        snapshot). ``last_start_ms``: the newest start time this producer saw."""
        with self._lock:
            if self.identity is not None:
                return self.identity
            candidate = self.candidate
            if candidate is None:
                return None
            if confirms(candidate, seen, last_start_ms):
                self.identity, self.provisional = candidate, True
                self.candidate = None
                self.confirmed += 1
                return candidate
            self.candidate = None  # refuted, or not this transaction: ask the statistics
            self.refused += 1
            return None

    def await_identity(self, poll: Callable[[float], int], deadline: float) -> tuple[int, int]:
        """This producer's id and epoch, for prepare; waits for a statistics snapshot
        (``poll`` serves librdkafka's callbacks) only after an init, or after an abort
        whose candidate was not confirmed (``resolve``)."""
        if self.identity is None:
            self.waits += 1
        while self.identity is None:
            if time.monotonic() >= deadline:
                raise prepare_failed(
                    "librdkafka sent no statistics with the producer id in time "
                    "(statistics.interval.ms)"
                )
            poll(0.02)
        return self.identity

    def on_stats(self, payload: str) -> None:
        """librdkafka's stats_cb: parses only the ``eos`` object, and only when needed."""
        if self._wanted:
            eos = _eos(payload)
            if (
                eos is not None
                and eos.get("idemp_state") == "Assigned"
                and eos.get("txn_state") in _SETTLED_TXN_STATES
                and int(eos.get("producer_id", -1)) >= 0
            ):
                self._settle((int(eos["producer_id"]), int(eos["producer_epoch"])))
        if self._chained is not None:
            self._chained(payload)

    def _settle(self, snapshot: tuple[int, int]) -> None:
        with self._lock:
            if not self._wanted:
                return
            if self.provisional and snapshot != self.identity:
                self.disagreements += 1
                self.use_candidates = False
                log.warning(
                    "librdkafka's statistics give producer id/epoch %s/%s, not %s/%s as "
                    "the coordinator confirmed after the last abort: using %s/%s, and no "
                    "longer confirming identities from the coordinator after an abort",
                    *snapshot, *(self.identity or (-1, -1)), *snapshot,
                )  # fmt: skip
            self.identity = snapshot
            self.candidate = None
            self.provisional = False
            self._wanted = False
            self.snapshots += 1


def confirms(
    candidate: tuple[int, int], seen: TransactionDescription, last_start_ms: int | None
) -> bool:
    """Whether the coordinator's answer ``seen`` confirms ``candidate`` as the identity of
    the transaction being prepared (see ``IdentityTracker``): open (Ongoing) under exactly
    that producer id and epoch, with a start time newer than ``last_start_ms`` (the
    newest this producer saw), so not a transaction seen before. Anything else (another
    epoch or producer id: an epoch bump by the abort, the coordinator's timeout, another
    instance's init; another state; an old, equal or unset start time) is left to the
    statistics, whose identity prepare then checks against the coordinator as usual."""
    return (
        seen.state == "Ongoing"
        and (seen.producer_id, seen.producer_epoch) == candidate
        and seen.start_time_ms >= 0
        and (last_start_ms is None or seen.start_time_ms > last_start_ms)
    )


_DECODER = json.JSONDecoder()


def _eos(payload: str) -> dict[str, Any] | None:
    """The ``eos`` object of a statistics snapshot, parsed alone: a full snapshot can be
    megabytes with many partitions."""
    at = payload.find('"eos":')
    if at < 0:
        return None
    start = at + len('"eos":')
    while start < len(payload) and payload[start] in " \t\r\n":
        start += 1
    try:
        value, _ = _DECODER.raw_decode(payload, start)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
