"""What a producer needs for two-phase commit besides librdkafka: its own producer
id/epoch, a coordinator client, the prepare and recovery steps that talk to the
coordinator, and the translation of coordinator failures (``coordinator_failure``: the one
place where they become kafka-txn errors, for prepare, recovery and the CLI).

librdkafka does not expose the producer id and epoch, but its statistics do: the
top-level ``eos`` object has ``producer_id``, ``producer_epoch``, ``idemp_state`` and
``txn_state``. They change only at ``init_transactions()`` and at the epoch bump
``abort_transaction()`` may do (KIP-360), so a snapshot taken after the last of those stays
valid: only the first prepare after an init waits for one. After an abort, the identity
from before it is a candidate that prepare's own DescribeTransactions confirms or refuses
(``IdentityTracker``), so that a transaction after a failed one does not wait for the next
snapshot (``statistics.interval.ms``).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, TypeVar

from confluent_kafka import KafkaError, KafkaException

from kafka_txn.classification import exception_for
from kafka_txn.config import ValidatedConfig
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient, CoordinatorError
from kafka_txn.coordinator.client import DescribeAhead, TransactionDescription
from kafka_txn.coordinator.connection import (
    AuthenticationError,
    NotKafkaError,
    ProtocolError,
    SaslAuthenticationError,
)
from kafka_txn.errors import (
    ConfigurationError,
    FatalError,
    InvalidPreparedStateError,
    KafkaTxnError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionInDoubtError,
    TransactionOutcomeUnknownError,
    root_exception,
)
from kafka_txn.metrics import MetricsHook, timed
from kafka_txn.producer.delivery import Deliveries
from kafka_txn.producer.librdkafka import _RETRY_FLOOR_S, Driver, Handle
from kafka_txn.producer.lifecycle import Lifecycle, State
from kafka_txn.state import PreparedTxnState
from kafka_txn.twophase.recovery import TransactionOutcome, check_belongs, recover

__all__ = [
    "DEFAULT_STATISTICS_INTERVAL_MS",
    "IdentityTracker",
    "Recovered",
    "TwoPhase",
    "confirms",
    "coordinator_failure",
    "prepare_failed",
]

log = logging.getLogger("kafka_txn.twophase")

T = TypeVar("T")

DEFAULT_STATISTICS_INTERVAL_MS = 100
"""statistics.interval.ms set for two-phase commit when the user set none."""

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

_METADATA_SLICE_S = 0.25
"""While no broker is usable, the cluster id is read with librdkafka Metadata calls this
long, librdkafka's callbacks served between them: a SASL login the broker refuses is
reported only through error_cb (``classification.AUTHENTICATION_CODES``) while a Metadata
call waits for a usable broker, so one call as long as the deadline would hear of the
refusal only at the end (``TwoPhase._cluster_while_recovering``)."""

# A snapshot whose transaction manager is in one of these states was taken when the
# producer id and epoch were settled (not mid-init, not mid-abort).
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


def coordinator_failure(
    exc: Exception, operation: str, *, recovering: bool, deadline_s: float
) -> KafkaTxnError:
    """The kafka-txn error for a coordinator-client failure that survived its retries.

    Built on the classification table, like every librdkafka error: a code the table
    calls fatal (fencing, TRANSACTIONAL_ID_AUTHORIZATION_FAILED...) is a ``FatalError``
    whichever client met it. Otherwise, while preparing, the transaction cannot be
    prepared (abortable); while recovering, a coordinator that stayed unreachable leaves
    the outcome unknown (call again), a peer that is not Kafka is a ConfigurationError,
    and anything else stops recovery (fatal). A refused SASL login is librdkafka's
    ``_AUTHENTICATION``, with the table's advice naming the ``sasl.*`` settings, as when
    librdkafka's error_cb reports it (``TwoPhase._cluster_while_recovering``)."""
    if isinstance(exc, KafkaTxnError):
        return exc
    if isinstance(exc, SaslAuthenticationError):
        reason = f"the coordinator client could not authenticate: {exc}"
        return exception_for(KafkaError(KafkaError._AUTHENTICATION, reason), operation)
    if isinstance(exc, AuthenticationError):
        err = KafkaError(KafkaError._AUTHENTICATION, str(exc))
        return FatalError(
            f"{operation}: the coordinator client could not authenticate: {exc}; check the "
            "sasl.*/ssl.* settings",
            kafka_error=err,
        )
    if isinstance(exc, CoordinatorError):
        err = exc.kafka_error
        if exc.code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            # Name the refused request: EndTxn checks WRITE on the id, FindCoordinator
            # and DescribeTransactions DESCRIBE (which Apache Kafka's WRITE implies).
            return FatalError(
                f"{operation}: not authorized on the transactional id ({exc.operation} "
                "refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED): grant WRITE and "
                "DESCRIBE on it to this principal",
                kafka_error=err,
            )
        mapped = exception_for(err, operation)
        if isinstance(mapped, FatalError):
            return mapped
        if not recovering:
            return TransactionAbortableError(
                f"{operation}: the coordinator refused: {exc}; abort the transaction",
                kafka_error=err,
            )
        if exc.retriable:
            return _unknown(operation, exc, deadline_s)
        return FatalError(f"{operation}: {exc}", kafka_error=err)
    if isinstance(exc, NotKafkaError) and recovering:
        # Not a coordinator that may come back: the address or security.protocol is wrong.
        return ConfigurationError(f"{operation}: {exc}")
    if isinstance(exc, ProtocolError):
        if not recovering:
            return TransactionAbortableError(
                f"{operation}: could not reach the transaction coordinator: {exc}; "
                "abort the transaction",
                kafka_error=KafkaError(KafkaError._TRANSPORT),
            )
        return _unknown(operation, exc, deadline_s)
    raise TypeError(f"not a coordinator failure: {exc!r}")  # pragma: no cover


def _unknown(operation: str, exc: Exception, deadline_s: float) -> TransactionOutcomeUnknownError:
    return TransactionOutcomeUnknownError(
        f"{operation}: the transaction coordinator stayed unreachable for {deadline_s:g}s "
        f"({exc}), so its outcome is not known yet: call it again, which is safe (a "
        "repeated recovery finds whatever an earlier attempt did)",
        kafka_error=KafkaError(KafkaError._TIMED_OUT),
        operation=operation,
    )


def prepare_failed(reason: str, cause: KafkaTxnError | None = None) -> TransactionAbortableError:
    """The error of a prepare that cannot go on; the producer must then abort."""
    exc = TransactionAbortableError(
        f"prepare_transaction() failed: {reason}; abort the transaction",
        kafka_error=None if cause is None else cause.kafka_error,
    )
    if cause is not None:
        exc.__cause__ = root_exception(cause)
    return exc


@dataclass
class Recovered:
    """What recovery settled in this process, kept until the init after it succeeds:
    ``complete_transaction()`` called again with the same stored state resumes after
    recovery instead of running it again (a partial init bumps the epoch, after which
    the committed transaction could no longer be told from an aborted one)."""

    stored: PreparedTxnState
    outcome: TransactionOutcome
    before_init_ran: bool = False


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
        self.settings = ConnectionSettings.from_librdkafka(conf)  # bad settings raise now
        self.transactional_id = transactional_id
        self._life = life
        self._deliveries = deliveries
        self._io = io
        self.identity = IdentityTracker(chained_stats)
        self.prepared: PreparedTxnState | None = None
        """The prepared transaction not yet settled (committed, or left for recovery)."""
        self.recovered: Recovered | None = None
        """Recovery's result while the init after it has not succeeded."""
        self.cluster_id: str | None = None
        self.cluster_failure: KafkaError | None = None
        """Why librdkafka's last Metadata for the cluster id failed (for the message)."""
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
        self._deadline_s = deadline_s
        self._sleep = sleep
        self._metrics = metrics
        self._client: CoordinatorClient | None = None

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
        if self._client is None:
            self._client = CoordinatorClient(
                self.settings, self.transactional_id, deadline_s=self._deadline_s,
                sleep=self._sleep,
            )  # fmt: skip
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

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

    def call(self, operation: str, fn: Callable[[], T], *, recovering: bool) -> T:
        """Run a coordinator call, translating what survived its retries
        (``coordinator_failure``)."""
        try:
            return fn()
        except (CoordinatorError, ProtocolError, AuthenticationError) as exc:
            raise coordinator_failure(
                exc, operation, recovering=recovering, deadline_s=self._deadline_s
            ) from exc

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
            first_failure = self._deliveries.first_failure
            if first_failure is not None:
                raise prepare_failed(f"a record failed: {first_failure}", first_failure)
            if left:
                raise prepare_failed(f"{left} records still undelivered")
            pid, epoch, early = self._identify(early, deadline)
            cluster = partial(self.cluster, self._io.producer, deadline)
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
        client = self._client
        rtt = self.describe_rtt_s
        if client is None or rtt is None or rtt < _AHEAD_MIN_RTT_S:
            return self._io.flush(max(0.0, deadline - time.monotonic())), None
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
        # given less, librdkafka may abort the process (see _librdkafka._RETRY_FLOOR_S).
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
        cluster_id = self.require_cluster(state, "complete_transaction")
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
        pid, epoch = self.await_identity(self._io.poll, deadline)
        return pid, epoch, early

    def await_identity(self, poll: Callable[[float], int], deadline: float) -> tuple[int, int]:
        """This producer's id and epoch; waits for a statistics snapshot only after an
        init, or after an abort whose candidate was not confirmed (see the module
        docstring)."""
        if self.identity.identity is None:
            self.identity.waits += 1
        while self.identity.identity is None:
            if time.monotonic() >= deadline:
                raise prepare_failed(
                    "librdkafka sent no statistics with the producer id in time "
                    "(statistics.interval.ms)"
                )
            poll(0.02)
        return self.identity.identity

    def cluster(
        self, producer: Handle, deadline: float, operation: str = "prepare_transaction"
    ) -> str | None:
        """The cluster id (read once), to refuse a state from another cluster; None when
        librdkafka's Metadata got no answer by ``deadline`` (at least 1 s from now).
        Before the first init (recovery, ``_cluster_while_recovering``) a refused SASL
        login is a ``FatalError`` at once."""
        if self.cluster_id is None:
            end = max(deadline, time.monotonic() + 1.0)
            if self._life.state is State.RECOVERING:
                self.cluster_id = self._cluster_while_recovering(producer, end, operation)
            else:
                try:
                    metadata = producer.list_topics(timeout=end - time.monotonic())
                    self.cluster_id = metadata.cluster_id
                except KafkaException as exc:
                    self.cluster_failure = exc.args[0]
            if self.cluster_id is None:
                log.warning("could not read the cluster id: %s", self.cluster_failure)
        return self.cluster_id

    def _cluster_while_recovering(self, producer: Handle, end: float, operation: str) -> str | None:
        """The cluster id read by a producer that has not reached a broker yet, which is
        where a SASL login the broker refuses (wrong password, unknown user, a mechanism
        it does not enable) shows: librdkafka reports it only through error_cb and logs
        in again with the same settings until ``end``. So while no broker is usable
        (Metadata fails with ``_TRANSPORT``: ``rd_kafka_metadata`` found no broker up and
        asked none), Metadata is called for ``_METADATA_SLICE_S`` at a time with error_cb
        served between the calls, and a report of a refused login (any since the producer
        was built: nothing reached a broker since) is a ``FatalError`` with the broker's
        reason (``classification.exception_for``), consuming the report. Once a broker was
        asked and has not answered (``_TIMED_OUT``: it is up, so logged in), the next call
        waits for all the time left: a broker answers a connection's requests in turn, so
        every answer given up on delays the next one."""
        io = self._io
        sliced = True
        while True:
            began = time.monotonic()
            wait = min(_METADATA_SLICE_S, end - began) if sliced else end - began
            try:
                metadata = producer.list_topics(timeout=max(0.001, wait))
            except KafkaException as exc:
                self.cluster_failure = exc.args[0]
            else:
                return metadata.cluster_id  # type: ignore[no-any-return]
            sliced = self.cluster_failure.code() == KafkaError._TRANSPORT
            # Served until the slice ends, also when Metadata failed at once (a SASL
            # listener closes the connection of a client that does not log in).
            until = min(began + _METADATA_SLICE_S, end) if sliced else 0.0
            while True:
                io.serve_error_callbacks(max(0.0, until - time.monotonic()))
                refused, io.refused_login = io.refused_login, None
                if refused is not None:
                    raise exception_for(refused, operation) from KafkaException(refused)
                if time.monotonic() >= until:
                    break
            if time.monotonic() >= end:
                return None

    def require_cluster(self, state: PreparedTxnState, operation: str) -> str | None:
        """This cluster's id, to check ``state`` against: a state that names a cluster
        is never decided while this one's id cannot be read (librdkafka's metadata did
        not answer in time), since a state of another cluster could otherwise commit or
        abort a transaction of this one. Nothing is decided then: call again. In
        recovery a SASL login the broker refuses is a ``FatalError`` at once
        (``_cluster_while_recovering``): reading the id is the first thing recovery asks
        of a broker."""
        cluster_id = self.cluster(self._io.producer, time.monotonic() + self._deadline_s, operation)
        if state.cluster_id and cluster_id is None:
            failure = self.cluster_failure
            why = "" if failure is None else f" (librdkafka: {failure.str()})"
            raise TransactionOutcomeUnknownError(
                f"{operation}(): the id of the Kafka cluster could not be read within "
                f"{self._deadline_s:g}s{why}, so whether the state (prepared on cluster "
                f"{state.cluster_id!r}) belongs to this cluster is unknown. Nothing was "
                "committed or aborted: call it again once the brokers answer (if they "
                "run, check bootstrap.servers, and that security.protocol matches their "
                "listener)",
                kafka_error=KafkaError(KafkaError._TIMED_OUT),
                operation=operation,
            )
        return cluster_id

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
        connected, asked_at = self._client is not None, time.monotonic()
        seen = self.call("prepare_transaction", self.client.describe, recovering=False)
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

    # ------------------------------------------------------------------ recovery
    def complete_recovery(
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
        """Settle a stored state from a fresh producer, before its init (recovery.py)."""
        cluster_id = self.require_cluster(stored, "complete_transaction")
        return self.call(
            "complete_transaction",
            partial(recover, self.client, stored, cluster_id),
            recovering=True,
        )

    def settle_kept(self, commit: bool) -> None:
        """commit_transaction()/abort_transaction() right after
        init_transactions(keep_prepared_txn=True): commit whatever transaction is open
        for this transactional id (KIP-939 leaves that choice to the caller); an abort
        needs nothing here, the init that follows aborts what is open."""
        if not commit:
            return
        seen = self.call("commit_transaction", self.client.describe, recovering=True)
        if seen.state == "Ongoing":
            self.call(
                "commit_transaction",
                partial(self.client.end_txn, seen.producer_id, seen.producer_epoch, True),
                recovering=True,
            )


class _Seen(NamedTuple):
    """A DescribeTransactions answer, when it was read (``time.monotonic()``), and
    whether it was read ahead, during the flush."""

    description: TransactionDescription
    at: float
    ahead: bool = True


def not_this_producer(tid: str, seen: TransactionDescription, pid: int, epoch: int) -> FatalError:
    """Prepare's error when the coordinator does not show the transaction under this
    producer's id and epoch, worded for what the answer tells apart: an id the
    coordinator does not know (never seen, expired, or lost by a broker that does not
    keep its transaction log across a restart), an epoch bumped under this producer id
    (a newer instance's init, or the coordinator's abort of a transaction past
    ``transaction.timeout.ms``), another producer id (another instance initialised the
    id), or an epoch older than this producer's (the coordinator's state went back)."""
    holds = f"producer id {seen.producer_id} epoch {seen.producer_epoch}"
    this = f"this producer is {pid}/{epoch}"
    advice = (
        "Nothing of this transaction can commit. Close this producer and create a new one "
        "(its init_transactions() registers the id again)"
    )
    if not seen.found:
        return FatalError(
            f"prepare_transaction(): the coordinator does not know transactional id {tid!r} "
            f"({this}): it never registered it, or forgot it (the id expired after "
            "transactional.id.expiration.ms, or the broker does not keep its transaction "
            f"state across a restart, as noida-db does not). {advice}",
            kafka_error=KafkaError(KafkaError.INVALID_PRODUCER_ID_MAPPING),
        )
    if seen.producer_id == pid and seen.producer_epoch < epoch:
        return FatalError(
            f"prepare_transaction(): the coordinator holds {holds} for {tid!r}, an older "
            f"epoch than this producer's ({this}): its transaction state went back (a "
            f"broker that lost acknowledged transaction-log writes). {advice}",
            kafka_error=KafkaError(KafkaError.INVALID_PRODUCER_EPOCH),
        )
    if seen.producer_id == pid:
        why = (
            "its epoch was bumped: another producer initialised the same transactional "
            "id, or the coordinator aborted this transaction because it outlived "
            "transaction.timeout.ms"
        )
    else:
        why = "another producer initialised the same transactional id since"
    return ProducerFencedError(
        f"prepare_transaction(): the coordinator holds {holds} for {tid!r}, {this}: {why}. "
        f"{advice}, and make sure no other instance uses this transactional id",
        kafka_error=KafkaError(KafkaError.PRODUCER_FENCED),
    )


def _identity(state: PreparedTxnState) -> tuple[int | None, int | None, int | None]:
    return state.producer_id, state.producer_epoch, state.txn_start_ms
