"""Two-phase commit's prepare and complete for one ``TransactionalProducer`` (KIP-939's
``prepareTransaction()`` and ``completeTransaction()``, emulated on the client): ``TwoPhase``.

Prepare flushes, requires every record delivered, and has the transaction coordinator
confirm, with DescribeTransactions, that the transaction is open under this producer's id
and epoch (``identity.IdentityTracker``) with a start time recovery can tell from the
previous transaction's; the ``PreparedTxnState`` it returns names them and the cluster
(``cluster.ClusterId``). Complete commits the prepared transaction through librdkafka
(``commit_prepared``; from then on it is in doubt, never aborted) or aborts it, as the
stored state decides (``decides_commit``). A fresh producer's complete, before its init,
is recovery's (``recovery.Recovery``); coordinator calls go through
``coordinator_calls.CoordinatorCalls``, their failures through ``failures``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, NamedTuple

from kafka_txn.config import ValidatedConfig
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.coordinator.client import DescribeAhead, TransactionDescription
from kafka_txn.errors import (
    ConfigurationError,
    FatalError,
    InvalidPreparedStateError,
    KafkaTxnError,
    TransactionAbortableError,
    TransactionInDoubtError,
    TransactionOutcomeUnknownError,
    root_exception,
)
from kafka_txn.metrics import MetricsHook
from kafka_txn.producer.delivery import Deliveries
from kafka_txn.producer.librdkafka import _RETRY_FLOOR_S, Driver
from kafka_txn.producer.lifecycle import Lifecycle, State
from kafka_txn.state import PreparedTxnState
from kafka_txn.twophase.cluster import ClusterId
from kafka_txn.twophase.coordinator_calls import CoordinatorCalls
from kafka_txn.twophase.decisions import check_belongs
from kafka_txn.twophase.failures import not_this_producer, prepare_failed
from kafka_txn.twophase.identity import DEFAULT_STATISTICS_INTERVAL_MS, IdentityTracker
from kafka_txn.twophase.recovery import Recovery

__all__ = ["TwoPhase"]

_REGISTRATION_DELAY_S = 0.0015
"""librdkafka registers a transaction's partitions with the coordinator
(AddPartitionsToTxn) on a timer that the first produce() of the transaction starts, 1 ms
long (rd_kafka_txn_add_partition: rd_kafka_txn_schedule_register_partitions(rk, 1), in
ms), and its main and broker threads then send it: a DescribeTransactions sent sooner
after begin_transaction() would still show the previous transaction. Used only to time
prepare's describe during the flush; nothing relies on it for correctness."""

_AHEAD_MIN_RTT_S = 0.001
"""prepare's DescribeTransactions goes during the flush only when the coordinator's
round trip takes this long or longer: on a faster link most answers sent during the
flush still show the previous transaction (librdkafka's registration timer, above), and
asking again costs more CPU than the round trip it could save."""

_FLUSH_SLICE_S = 0.001
"""While a DescribeTransactions is in flight, prepare's flush returns this often to see
whether the answer came (the flush itself ends as soon as every record is delivered).
librdkafka's flush() counts whole milliseconds (confluent-kafka truncates the timeout):
a shorter slice would be a flush(0) that polls without waiting."""

# What the coordinator shows, under this producer's id and epoch, at prepare of a
# transaction none of whose records or offsets reached it: no transaction (Empty), the
# previous one completed, or the previous one still completing. A commit or abort
# returns once the coordinator logged PrepareCommit/PrepareAbort, and the markers are
# written after (TransactionCoordinator.endTransaction, then
# TransactionMarkerChannelManager); the coordinator moves to Ongoing only when this
# transaction's first partition or offsets are added (handleAddPartitionsToTransaction,
# which answers CONCURRENT_TRANSACTIONS until the markers are written). Every record was
# delivered before the describe, so none of them went to an unregistered partition.
_NOTHING_SENT = frozenset(
    {"Empty", "CompleteCommit", "CompleteAbort", "PrepareCommit", "PrepareAbort"}
)


class TwoPhase:
    """Two-phase-commit state and coordinator steps of one TransactionalProducer."""

    def __init__(
        self,
        conf: Mapping[str, Any],
        transactional_id: str,
        *,
        life: Lifecycle,
        deliveries: Deliveries,
        io: Driver,
        deadline_s: float,
        transaction_timeout_s: float,
        min_time_left_s: float,
        sleep: Callable[[float], None],
        chained_stats: Callable[[str], None] | None,
        metrics: MetricsHook | None,
    ) -> None:
        settings = ConnectionSettings.from_librdkafka(conf)  # bad settings raise now
        self.transactional_id = transactional_id
        self._life = life
        self._deliveries = deliveries
        self._io = io
        self.identity = IdentityTracker(chained_stats)
        self.coordinator = CoordinatorCalls(
            settings, transactional_id, deadline_s=deadline_s, sleep=sleep
        )
        self.cluster = ClusterId(life, io, deadline_s)
        self.recovery = Recovery(
            self.coordinator, self.cluster, deadline_s=deadline_s, metrics=metrics
        )
        self.prepared: PreparedTxnState | None = None
        """The prepared transaction not yet settled (committed, or left for recovery)."""
        self.last_start_ms: int | None = None
        self.last_started_by = 0.0
        """A ``time.monotonic()`` by which the last prepared transaction had certainly
        started at the coordinator (its start time stamped): see space_transactions."""
        self.begun_at = 0.0
        self.spacing_wait_s = 0.0
        """Total time space_transactions() slept (for benchmarks and diagnostics)."""
        self.describe_rtt_s: float | None = None
        """Moving average of prepare's DescribeTransactions round trips."""
        self.describes_ahead = 0
        self.describes_ahead_used = 0
        """DescribeTransactions sent during prepare's flush, and how many of them
        prepare used (for benchmarks and diagnostics)."""
        self._ahead_early = 0
        """Prepares since the last one whose first DescribeTransactions, sent as the
        flush began, came back showing the previous transaction; 0: none (or never
        asked). See ``_flush_describing``."""
        self.transaction_timeout_s = transaction_timeout_s
        self.min_time_left_s = min_time_left_s

    @classmethod
    def configure(
        cls,
        conf: dict[str, Any],
        validated: ValidatedConfig,
        *,
        life: Lifecycle,
        deliveries: Deliveries,
        io: Driver,
        deadline_s: float,
        min_time_left_s: float | None,
        sleep: Callable[[float], None],
        metrics: MetricsHook | None,
    ) -> TwoPhase | None:
        """The producer's TwoPhase when two-phase commit is enabled, else None; sets the
        statistics settings and callback in ``conf`` that it needs (the producer id and
        epoch are read from librdkafka's statistics)."""
        user_stats = validated.callbacks.get("stats_cb")
        if not validated.two_phase_commit:
            if user_stats is not None:
                conf["stats_cb"] = user_stats
            return None
        conf.setdefault("statistics.interval.ms", DEFAULT_STATISTICS_INTERVAL_MS)
        if int(conf["statistics.interval.ms"]) <= 0:
            raise ConfigurationError(
                "statistics.interval.ms must be > 0 with two-phase commit: the producer "
                "id and epoch are read from librdkafka's statistics"
            )
        timeout_s = validated.transaction_timeout_ms / 1000.0
        twophase = cls(
            conf,
            validated.transactional_id,
            life=life,
            deliveries=deliveries,
            io=io,
            deadline_s=deadline_s,
            transaction_timeout_s=timeout_s,
            min_time_left_s=(
                min_time_left_s if min_time_left_s is not None else max(1.0, timeout_s / 5)
            ),
            sleep=sleep,
            chained_stats=None if user_stats is None else partial(deliveries.call_user, user_stats),
            metrics=metrics,
        )
        conf["stats_cb"] = twophase.identity.on_stats
        return twophase

    @property
    def client(self) -> CoordinatorClient:
        """The coordinator client (``coordinator``), made on first use."""
        return self.coordinator.client

    def close(self) -> None:
        self.coordinator.close()

    def begin(self) -> None:
        """A transaction begins: space it from the previous one, note when it began.
        Called by ``begin_transaction()`` after librdkafka's begin (which sends nothing)
        and before any record may be sent, so that the wait covers librdkafka's part."""
        self.space_transactions()
        self.begun_at = time.monotonic()

    def space_transactions(self) -> None:
        """Make sure the next transaction cannot get the previous one's start time.

        The coordinator stamps start times in milliseconds, and recovery tells transaction
        N from N+1 (same pid/epoch) by them. N's start time was stamped when the
        coordinator registered its first partition (or offsets), before
        ``last_started_by``: before its records were delivered (a record is sent only
        once its partition is registered), and before a DescribeTransactions showed it.
        So N+1 starts in a later millisecond if it begins (and so registers its first
        partition) a millisecond or more after that (1.1 ms, for clock jitter). Over a
        network, EndTxn and the caller's own work usually take longer than that; against
        a very fast local broker this wait is a large part of what two-phase commit
        adds."""
        wait = self.last_started_by + 0.0011 - time.monotonic()
        if wait > 0:
            self.spacing_wait_s += wait
            time.sleep(wait)

    # ------------------------------------------------------------------ prepare
    def prepare(self, deadline: float, await_sends: Callable[[float], None]) -> PreparedTxnState:
        """The body of ``prepare_transaction()``, in state PREPARING (sends refused):
        wait for sends under way, flush, require every record delivered, read this
        producer's id/epoch, and have the coordinator confirm them (``confirm``). Any
        failure leaves the transaction abortable (or the producer fatal), never "in
        transaction", where a commit would bypass the protocol.

        The coordinator's DescribeTransactions is sent while the flush runs and read
        when it answers (``_flush_describing``), so that its round trip overlaps the
        flush's; its answer is used only if it shows this transaction
        (``_shows_this``), otherwise the coordinator is asked again after the flush."""
        try:
            await_sends(deadline)
            left, early = self._flush_describing(deadline)
            flushed_at = time.monotonic()
            deliveries = self._deliveries
            first_failure = deliveries.first_failure
            if first_failure is not None:
                raise prepare_failed(f"a record failed: {first_failure}", first_failure)
            if deliveries.failed_records or deliveries.librdkafka_failed:
                # Only purged records failed: librdkafka's own transaction failed and it
                # dropped them, not an abort of ours. After a batch the broker refused,
                # librdkafka fails the next transaction so (its sequence numbers are out
                # of step: OUT_OF_ORDER_SEQUENCE_NUMBER, "requires epoch bump",
                # rd_kafka_handle_Produce_error) and flush() still returns 0; the
                # coordinator may show the transaction open all the same. Handing out a
                # state would let a decider commit a transaction without its records.
                raise prepare_failed(
                    f"librdkafka's own transaction failed ({deliveries.failed_records} "
                    "records dropped; after a batch the broker refused, it fails the "
                    "next transaction so, once)"
                )
            if left:
                raise prepare_failed(f"{left} records still undelivered")
            pid, epoch, early = self._identify(early, deadline)
            cluster = partial(self.cluster.read, self._io.producer, deadline)
            state = self.confirm(pid, epoch, cluster, early, flushed_at)
        except BaseException as exc:
            self._prepare_failed(exc)
            raise
        if not self._life.finish(State.PREPARED):
            # close() aborted it directly, or left it to the coordinator: never hand out
            # a state for a transaction that cannot commit.
            raise self._life.closed_while(
                "prepare_transaction", "the transaction is not prepared and will not commit"
            )
        self.prepared = state
        return state

    def _flush_describing(self, deadline: float) -> tuple[int, _Seen | None]:
        """Flush (returns how many records are left, as ``flush``), and meanwhile read
        the coordinator's view of the transaction: a DescribeTransactions is sent once
        librdkafka can have registered the transaction's partitions
        (``_REGISTRATION_DELAY_S`` after begin), its answer read when it arrives
        (between flush slices of ``_FLUSH_SLICE_S``), and sent again while it still
        shows the previous transaction. Returns the first answer that shows an open
        transaction with a new start time, if any (``confirm`` checks the rest). Only
        over a coordinator connection already open (the first prepare just flushes),
        when the coordinator's round trip is long enough to be worth it
        (``_AHEAD_MIN_RTT_S``), and never retried: any failure leaves it to
        ``confirm``'s ordinary describe."""
        rtt = self.describe_rtt_s
        if not self.coordinator.connected or rtt is None or rtt < _AHEAD_MIN_RTT_S:
            return self._io.flush(max(0.0, deadline - time.monotonic())), None
        client = self.coordinator.client
        ahead: DescribeAhead | None = None
        seen: _Seen | None = None
        send_at = self.begun_at + _REGISTRATION_DELAY_S
        # Whether this prepare's first describe goes as the flush begins (and shows
        # whether that is too early): yes unless the last such one came back too early
        # (records sent just before prepare: librdkafka's 1 ms registration timer had
        # not run yet), then it waits _REGISTRATION_DELAY_S from here, and every 16th
        # prepare asks at once again, in case the caller's pattern changed.
        probing = self._ahead_early == 0 or self._ahead_early >= 16
        if not probing:
            self._ahead_early += 1
            send_at = max(send_at, time.monotonic() + _REGISTRATION_DELAY_S)
        try:
            while True:
                now = time.monotonic()
                if ahead is None and seen is None and now >= send_at:
                    ahead = client.describe_ahead(deadline)
                    self.describes_ahead += 1
                    if ahead is None:
                        send_at = math.inf  # no connection: describe after the flush
                wait = deadline - now
                if seen is None and ahead is not None:
                    wait = min(wait, _FLUSH_SLICE_S)
                elif seen is None and send_at != math.inf:
                    # Whole milliseconds, at least one (see _FLUSH_SLICE_S).
                    wait = min(wait, math.ceil(max(send_at - now, 0.0) * 1000 + 1e-6) / 1000)
                left = self._io.flush(max(0.0, wait))
                if ahead is not None and (left == 0 or ahead.ready()):
                    answer, ahead = ahead.result(), None
                    if answer is None:
                        send_at = math.inf  # it failed: describe after the flush
                    elif answer.state == "Ongoing" and answer.start_time_ms != self.last_start_ms:
                        seen = _Seen(answer, time.monotonic())
                        if probing:
                            self._ahead_early, probing = 0, False
                    else:  # not this transaction yet (its partitions not registered)
                        send_at = time.monotonic()
                        if probing:
                            self._ahead_early, probing = 1, False
                if left == 0 or time.monotonic() >= deadline:
                    return left, seen
        finally:
            if ahead is not None:
                ahead.abandon()

    def _prepare_failed(self, exc: BaseException) -> None:
        if self._life.state is not State.PREPARING:
            return  # already fatal
        if isinstance(exc, FatalError):
            self._life.enter_fatal(exc)
        elif isinstance(exc, TransactionAbortableError):
            self._life.enter_abortable(exc)
        else:
            cause = exc if isinstance(exc, KafkaTxnError) else None
            self._life.enter_abortable(prepare_failed(str(exc), cause))

    def commit_prepared(self, timeout: float | None) -> None:
        """Commit a prepared transaction. From the first attempt on it is in doubt: the
        external decider may already have decided "commit", so whatever fails now, it is
        never aborted (KIP-939's completeTransaction contract)."""
        prepared = self.prepared
        # A resumed commit (its outcome unknown before) gets at least the retry floor:
        # given less, librdkafka may abort the process (see librdkafka._RETRY_FLOOR_S).
        resumed = self._life.state is State.IN_DOUBT
        self._life.transition_to(State.IN_DOUBT)
        try:
            self._io.retrying(
                "commit_transaction", self._io.producer.commit_transaction, timeout,
                defer_callback_errors=True, first_floor=_RETRY_FLOOR_S if resumed else 0.001,
            )  # fmt: skip
        except KafkaTxnError as exc:
            retriable = isinstance(exc, TransactionOutcomeUnknownError)
            again = "Call commit_transaction() again, or close" if retriable else "Close"
            raise TransactionInDoubtError(
                f"commit of the prepared transaction of {self.transactional_id!r} did not "
                f"complete: {exc.message}. Kafka still holds it prepared, or has committed "
                f"it; it is not aborted. {again} this producer and recover from the stored "
                "state with a new one (init_transactions(keep_prepared_txn=True), then "
                "complete_transaction(stored_state)): that commits it, or raises "
                "TransactionDivergedError if Kafka aborted it first (transaction.timeout.ms)",
                kafka_error=exc.kafka_error,
                prepared_state=str(prepared),
                retriable=retriable,
            ) from root_exception(exc)
        self._life.finish(State.READY)  # committed, also if close() ran meanwhile
        self.prepared = None

    def decides_commit(self, state: PreparedTxnState) -> bool:
        """``complete_transaction(state)``'s reading of ``state`` for the prepared
        transaction: True (commit) for the prepared transaction's state (same producer
        id, epoch and start time, marked completed or not); False (abort) for the empty
        state or the state of another transaction of this transactional id. A state that
        is no decision about this id's transactions (another transactional id or
        cluster, or no start time, as the Java "pid:epoch" form) raises
        ``InvalidPreparedStateError`` and leaves the transaction prepared."""
        prepared = self.prepared
        assert prepared is not None  # PREPARED and IN_DOUBT hold it
        if state.is_empty:
            return prepared.is_empty
        cluster_id = self.cluster.require(state, "complete_transaction")
        check_belongs(state, self.transactional_id, cluster_id)
        if state.txn_start_ms is None:
            raise InvalidPreparedStateError(
                f"complete_transaction(): the state {str(state)!r} has no transaction start "
                "time (the Java 'pid:epoch' form), so it names neither this transaction nor "
                "another: pass the state prepare_transaction() returned to commit, or the "
                "stored state of an earlier transaction (or '') to abort. The transaction "
                "is still prepared"
            )
        return not prepared.is_empty and _identity(state) == _identity(prepared)

    def _identify(self, early: _Seen | None, deadline: float) -> tuple[int, int, _Seen | None]:
        """This producer's id and epoch for prepare, with the coordinator's answer read
        so far (``early``, for ``confirm``): the known identity; after an abort, the
        candidate if the coordinator's answer for this transaction confirms it
        (``IdentityTracker``); else the next statistics snapshot's. The answer that
        decides on the candidate (the one read during the flush, or asked now) goes on
        to ``confirm``, which uses it if it shows this transaction under the identity
        found: a confirmed candidate costs no round trip of its own, and after a bump
        the answer is reused once the snapshot gives the new epoch."""
        tracker = self.identity
        if tracker.identity is None and tracker.candidate is not None:
            seen = early if early is not None else self._describe()
            identity = tracker.resolve(seen.description, self.last_start_ms)
            if identity is not None:
                return identity[0], identity[1], seen
            early = seen
        pid, epoch = tracker.await_identity(self._io.poll, deadline)
        return pid, epoch, early

    def confirm(
        self,
        pid: int,
        epoch: int,
        cluster: Callable[[], str | None],
        early: _Seen | None = None,
        flushed_at: float | None = None,
    ) -> PreparedTxnState:
        """Prepare's coordinator step: the transaction must be open under this
        producer's id and epoch, with a start time recovery can tell from the previous
        transaction's, and with enough of ``transaction.timeout.ms`` left. ``early``:
        an answer read ahead (during the flush), used if it shows this transaction.
        ``flushed_at``: when every record of the transaction was delivered (its start
        time was stamped before, see space_transactions)."""
        time_left = self.transaction_timeout_s - (time.monotonic() - self.begun_at)
        if time_left < self.min_time_left_s:
            raise prepare_failed(
                f"only {time_left:.1f}s of transaction.timeout.ms "
                f"({self.transaction_timeout_s:g}s) left, less than "
                f"prepare_min_time_left={self.min_time_left_s:g}s: the broker could "
                "abort it before the decision lands. Raise transaction.timeout.ms or "
                "send less per transaction"
            )
        if early is not None and self._shows_this(early.description, pid, epoch):
            seen, answered_at = early.description, early.at
            if early.ahead:
                self.describes_ahead_used += 1
        else:
            asked = self._describe()
            seen, answered_at = asked.description, asked.at
        # The start time this answer shows was stamped before the answer came, and
        # before the flush returned (space_transactions): the next transaction is
        # spaced from the earlier of the two.
        self.last_started_by = answered_at if flushed_at is None else min(answered_at, flushed_at)
        if seen.producer_id != pid or seen.producer_epoch != epoch:
            raise not_this_producer(self.transactional_id, seen, pid, epoch)
        if seen.state in _NOTHING_SENT:
            return PreparedTxnState.EMPTY  # nothing was sent: nothing to commit
        if seen.state != "Ongoing":
            raise prepare_failed(f"the coordinator reports state {seen.state}")
        if seen.start_time_ms == self.last_start_ms:
            raise prepare_failed(
                "the coordinator gives this transaction the start time of the "
                "previous one, so recovery could not tell them apart"
            )
        self.last_start_ms = seen.start_time_ms
        return PreparedTxnState(
            transactional_id=self.transactional_id,
            producer_id=pid,
            producer_epoch=epoch,
            txn_start_ms=seen.start_time_ms,
            cluster_id=cluster(),
            timeout_ms=int(self.transaction_timeout_s * 1000),
        )

    def _describe(self) -> _Seen:
        """Prepare's DescribeTransactions, asked now; its round trip is averaged into
        ``describe_rtt_s``."""
        connected, asked_at = self.coordinator.connected, time.monotonic()
        seen = self.coordinator.call("prepare_transaction", self.client.describe, recovering=False)
        answered_at = time.monotonic()
        if connected:  # the first one also connects: not a round trip
            rtt, last = self.describe_rtt_s, answered_at - asked_at
            self.describe_rtt_s = last if rtt is None else 0.8 * rtt + 0.2 * last
        return _Seen(seen, answered_at, ahead=False)

    def _shows_this(self, seen: TransactionDescription, pid: int, epoch: int) -> bool:
        """Whether an answer read ahead shows this transaction: open (Ongoing) under
        this producer's id and epoch with a start time other than the previous
        transaction's. Only this producer adds partitions under its id and epoch, and
        the previous transaction had ended (EndTxn answered) before this one began, so
        such an answer is this transaction, open since its first partition was added;
        every record was delivered since (the flush), and an abort by the coordinator
        (timeout, fencing) bumps the epoch and fails the records still to come, as
        after an answer read once the flush is done. Anything else (the previous
        transaction still shown, because the DescribeTransactions overtook this
        transaction's first AddPartitionsToTxn; another id or epoch) is asked again."""
        return (
            seen.state == "Ongoing"
            and seen.producer_id == pid
            and seen.producer_epoch == epoch
            and seen.start_time_ms != self.last_start_ms
        )


class _Seen(NamedTuple):
    """A DescribeTransactions answer, when it was read (``time.monotonic()``), and
    whether it was read ahead, during the flush."""

    description: TransactionDescription
    at: float
    ahead: bool = True


def _identity(state: PreparedTxnState) -> tuple[int | None, int | None, int | None]:
    return state.producer_id, state.producer_epoch, state.txn_start_ms
