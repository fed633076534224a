"""``TransactionalProducer``: confluent-kafka's transactional producer behind a guarded
state machine and the KIP-691 error model.

States and the calls each allows::

    NEW --init_transactions--> READY --begin_transaction--> IN_TRANSACTION
    IN_TRANSACTION --commit_transaction--> READY      (COMMITTING while retrying)
    IN_TRANSACTION --abort_transaction--> READY       (ABORTING while retrying)
    IN_TRANSACTION --abortable error--> ABORTABLE --abort_transaction--> READY
    IN_TRANSACTION --prepare_transaction--> PREPARED --complete/commit/abort--> READY
    NEW --init_transactions(keep_prepared_txn=True)--> RECOVERING --complete--> READY
    any --fatal error--> FATAL --close--> CLOSED;  any --close--> CLOSED

Delivery reports of records sent without a callback go to a dict's C-level
``setdefault`` (no Python frame per record); failures are turned into
``ProduceFailedException`` after each call that serves callbacks. Nothing is kept per
delivered record, so a transaction of any size holds no Python objects once delivered.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import tenacity
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.serialization import MessageField, SerializationContext

from .classification import classify, exception_for, produce_failure
from .config import ProducerSettings, user_key_for, validate_config
from .errors import (
    CommitFailedException,
    ConfigurationError,
    ErrorCategory,
    FatalError,
    IllegalStateError,
    KafkaTxnError,
    ProduceFailedException,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionOutcomeUnknownError,
)
from .futures import _PENDING, DeliveryFuture
from .metrics import MetricsHook, timed
from .recovery import TransactionOutcome, recover
from .state import PreparedTxnState
from .twophase import DEFAULT_STATISTICS_INTERVAL_MS, TwoPhase

__all__ = ["DeliveryCallback", "Serializer", "TransactionalProducer"]

log = logging.getLogger("kafka_txn.producer")
_LIBRDKAFKA_LOG = logging.getLogger("kafka_txn.librdkafka")

DeliveryCallback = Callable[[ProduceFailedException | None, Message], None]
"""``callback(error, message)``: error is None when the record was delivered."""
Serializer = Callable[[Any, SerializationContext], bytes | None]
"""A confluent-kafka ``Serializer`` or any callable of the same shape."""


class _State(enum.Enum):
    NEW = "new"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE = "abortable error"
    PREPARED = "prepared"
    RECOVERING = "recovering"
    FATAL = "fatal error"
    CLOSED = "closed"


_IN_TXN = _State.IN_TRANSACTION
_OPEN_STATES = frozenset(
    {_IN_TXN, _State.ABORTABLE, _State.COMMITTING, _State.ABORTING, _State.PREPARED}
)
_new = object.__new__
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})

# Pause between tries of a call that failed with a retriable error: exponential from 50 ms
# to 1 s, plus jitter so that many producers do not retry in step.
_WAIT = tenacity.wait_exponential(multiplier=0.05, max=1.0) + tenacity.wait_random(0, 0.05)


def _is_retriable(exc: BaseException) -> bool:
    return (
        isinstance(exc, KafkaException)
        and not isinstance(exc, KafkaTxnError)
        and classify(exc.args[0])[0] is ErrorCategory.RETRIABLE
    )


def _build_producer(conf: dict[str, Any]) -> Producer:
    """confluent-kafka's Producer; librdkafka's refusals become ConfigurationError naming
    the key as the user wrote it."""
    try:
        return Producer(conf)
    except KafkaException as exc:
        err = exc.args[0]
        reason = err.str()
        named = re.search(r'property "([^"]+)"', reason)
        if named is not None:
            key = user_key_for(named.group(1), conf)
            if key != named.group(1):
                reason += f" (set as {key!r})"
        raise ConfigurationError(
            f"librdkafka rejected the producer configuration: {reason}. Check the "
            "property name and value against librdkafka's CONFIGURATION.md",
            kafka_error=err,
        ) from exc
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"librdkafka rejected the producer configuration: {exc}") from exc


class TransactionalProducer:
    """A transactional Kafka producer whose every failure says what to do next.

    ``config`` is a librdkafka dict or a ``ProducerSettings``; ``transactional.id`` is
    required and idempotence cannot be turned off. ``operation_timeout`` bounds how long
    ``commit_transaction``/``abort_transaction``/``init_transactions`` retry retriable
    errors (default: ``transaction.timeout.ms``). ``queue_full_timeout`` is how long
    ``produce()`` waits for room when librdkafka's local queue is full.

    With ``transaction.two.phase.commit.enable=true`` (KIP-939's setting) the producer
    also offers ``prepare_transaction()``, ``complete_transaction()`` and
    ``init_transactions(keep_prepared_txn=True)``; ``prepare_min_time_left`` (default: a
    fifth of ``transaction.timeout.ms``, at least 1 s) is how much of the transaction
    timeout must remain for prepare to succeed. ``metrics`` receives every transactional
    operation's duration and outcome and every failed record (``kafka_txn.metrics``).
    """

    def __init__(
        self,
        config: dict[str, Any] | ProducerSettings,
        *,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
        operation_timeout: float | None = None,
        queue_full_timeout: float = 60.0,
        prepare_min_time_left: float | None = None,
        metrics: MetricsHook | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        validated = validate_config(config)
        self.transactional_id = validated.transactional_id
        self._transaction_timeout_s = validated.transaction_timeout_ms / 1000.0
        self._operation_timeout = (
            operation_timeout if operation_timeout is not None else self._transaction_timeout_s
        )
        if self._operation_timeout <= 0:
            raise ConfigurationError(
                f"operation_timeout={operation_timeout!r} must be a positive number of seconds"
            )
        self._queue_full_timeout = queue_full_timeout
        self._metrics = metrics
        self._prepare_min_time_left = (
            prepare_min_time_left
            if prepare_min_time_left is not None
            else max(1.0, self._transaction_timeout_s / 5)
        )
        self._sleep = sleep
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._serializing = key_serializer is not None or value_serializer is not None
        self._user_on_delivery = validated.callbacks.get("on_delivery")
        self._user_error_cb = validated.callbacks.get("error_cb")

        self._lock = threading.RLock()
        self._state = _State.NEW
        self._fatal: FatalError | None = None
        self._abortable: KafkaTxnError | None = None
        self._first_failure: ProduceFailedException | None = None
        self._failed_records = 0
        self._callback_error: BaseException | None = None
        self._begun_at = 0.0

        # Delivery reports of records produced without a callback land in this dict
        # through its C-level setdefault: no Python frame per record. Successes share
        # the key None (one Message kept); each failing error code keeps its first
        # record, in order. _collect_reports() turns failures into ProduceFailedException
        # after every librdkafka call that serves callbacks. A user's own on_delivery
        # needs a Python call per report anyway, so then the method is used directly.
        self._reports: dict[KafkaError | None, Message] = {}
        conf = dict(validated.librdkafka)
        conf["on_delivery"] = (
            self._reports.setdefault if self._user_on_delivery is None else self._on_delivery
        )
        conf["error_cb"] = self._on_error
        # librdkafka's own log lines go to Python logging (served from poll()), not stderr.
        conf.setdefault("logger", _LIBRDKAFKA_LOG)
        user_stats = validated.callbacks.get("stats_cb")
        self._twophase: TwoPhase | None = None
        if validated.two_phase_commit:
            conf.setdefault("statistics.interval.ms", DEFAULT_STATISTICS_INTERVAL_MS)
            if int(conf["statistics.interval.ms"]) <= 0:
                raise ConfigurationError(
                    "statistics.interval.ms must be > 0 with two-phase commit: the producer "
                    "id and epoch are read from librdkafka's statistics"
                )
            self._twophase = TwoPhase(
                conf,
                self.transactional_id,
                deadline_s=self._operation_timeout,
                sleep=sleep,
                chained_stats=(
                    None if user_stats is None else partial(self._call_user, user_stats)
                ),
            )
            conf["stats_cb"] = self._twophase.identity.on_stats
        elif user_stats is not None:
            conf["stats_cb"] = user_stats
        self._producer = _build_producer(conf)
        self._produce = self._producer.produce

    # ------------------------------------------------------------------ properties
    @property
    def state(self) -> str:
        """The state machine's current state, for logs and diagnostics."""
        return self._state.value

    @property
    def in_transaction(self) -> bool:
        """True between ``begin_transaction()`` and a successful commit or abort
        (prepared included)."""
        return self._state in _OPEN_STATES

    # ------------------------------------------------------------------ transactions
    def init_transactions(
        self, timeout: float | None = None, *, keep_prepared_txn: bool = False
    ) -> None:
        """Register the transactional.id with its coordinator, fencing older producers
        with the same id and aborting a transaction they left open.

        ``keep_prepared_txn=True`` (KIP-939, needs two-phase commit enabled) does not
        touch the coordinator yet: a transaction a crashed process prepared stays open
        until ``complete_transaction(stored_state)`` settles it; only then are
        transactions initialised (and zombies fenced)."""
        with self._lock, timed(self._metrics, "init_transactions"):
            self._require((_State.NEW,), "init_transactions")
            if keep_prepared_txn:
                self._two_phase("init_transactions(keep_prepared_txn=True)")
                self._state = _State.RECOVERING
                return
            self._init_librdkafka(timeout)

    def _init_librdkafka(self, timeout: float | None) -> None:
        self._retrying("init_transactions", self._producer.init_transactions, timeout)
        self._state = _State.READY
        if self._twophase is not None:
            self._drain()  # statistics queued before init are stale
            self._twophase.identity.invalidate()

    def begin_transaction(self) -> None:
        """Start a transaction; records sent until commit or abort belong to it."""
        with self._lock, timed(self._metrics, "begin_transaction"):
            self._require((_State.READY,), "begin_transaction")
            self._drain()
            self._first_failure = None
            self._failed_records = 0
            if self._twophase is not None:
                self._twophase.space_transactions()
            self._begun_at = time.monotonic()
            try:
                self._producer.begin_transaction()
            except KafkaException as exc:
                raise self._on_call_error(exc, "begin_transaction") from exc
            self._state = _IN_TXN

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """Send one record in the open transaction; ``on_delivery(error, message)`` is
        called from ``poll()``/``flush()``/commit with a ``ProduceFailedException`` or None.
        Raises ``ProduceFailedException`` at once if the record cannot be queued."""
        if self._state is not _IN_TXN:
            self._refuse_send("produce")
        if self._serializing:
            key, value = self._serialize(topic, key, value, headers)
        cb = None if on_delivery is None else self._chain(on_delivery)
        try:
            # Positional on purpose, and no more arguments than needed: confluent-kafka's
            # argument parsing costs ~0.3 µs with keywords, ~0.1 µs for the last four.
            # Order: topic, value, key, partition, callback, on_delivery, timestamp, headers;
            # a None callback means the default one (self._reports.setdefault).
            if cb is None and timestamp == 0 and headers is None:
                self._produce(topic, value, key, partition)
            else:
                self._produce(topic, value, key, partition, cb, None, timestamp, headers)
        except Exception as exc:
            self._produce_failed(exc, topic, value, key, partition, cb, timestamp, headers)

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        timestamp: int = 0,
        headers: Any = None,
    ) -> DeliveryFuture:
        """Like ``produce()``, returning a ``DeliveryFuture`` of the delivered ``Message``."""
        if self._state is not _IN_TXN:
            self._refuse_send("send")
        if self._serializing:
            key, value = self._serialize(topic, key, value, headers)
        # DeliveryFuture.__init__ inlined (a frame per record is measurable here).
        future = _new(DeliveryFuture)
        future._owner = self
        future._outcome = _PENDING
        future._callbacks = None
        try:
            if timestamp == 0 and headers is None:
                self._produce(topic, value, key, partition, future)
            else:
                self._produce(topic, value, key, partition, future, None, timestamp, headers)
        except Exception as exc:
            self._produce_failed(exc, topic, value, key, partition, future, timestamp, headers)
        return future

    def send_offsets_to_transaction(
        self,
        offsets: Sequence[TopicPartition],
        group_metadata: Any,
        timeout: float | None = None,
    ) -> None:
        """Commit the consumer's next offsets as part of this transaction: they become
        the group's committed offsets only if the transaction commits."""
        with self._lock:
            self._require((_IN_TXN,), "send_offsets_to_transaction")
            try:
                self._retrying(
                    "send_offsets_to_transaction",
                    lambda t: self._producer.send_offsets_to_transaction(
                        list(offsets), group_metadata, t
                    ),
                    timeout,
                )
            except TransactionOutcomeUnknownError as exc:
                # The offsets may or may not have joined the transaction: it cannot commit.
                abortable = TransactionAbortableError(
                    f"{exc.message}; the transaction must be aborted",
                    kafka_error=exc.kafka_error,
                )
                self._enter_abortable(abortable)
                raise abortable from exc.__cause__

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Commit the open transaction. Raises ``CommitFailedException`` for every
        non-fatal failure (abort and retry), ``FatalError`` when the producer is dead, and
        ``TransactionOutcomeUnknownError`` when retriable errors outlast the deadline (call
        ``commit_transaction()`` again; never abort then)."""
        with self._lock, timed(self._metrics, "commit_transaction"):
            if self._state is _State.ABORTABLE:
                raise self._commit_failed(self._abortable)
            if self._state is _State.RECOVERING:
                self._settle_kept_transaction(commit=True, timeout=timeout)
                return
            self._require((_IN_TXN, _State.COMMITTING, _State.PREPARED), "commit_transaction")
            if self._first_failure is not None:  # a record already failed: cannot commit
                raise self._commit_failed(self._first_failure)
            self._state = _State.COMMITTING
            try:
                self._retrying("commit_transaction", self._producer.commit_transaction, timeout)
            except CommitFailedException:
                # A record that failed during commit's flush is the real cause (KIP-691).
                if self._first_failure is not None:
                    raise self._commit_failed(self._first_failure)  # noqa: B904 - cause set
                raise
            self._state = _State.READY
            if self._twophase is not None:
                self._twophase.prepared = None

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the open transaction: nothing of it becomes visible to read_committed
        consumers, and records still queued fail with TRANSACTION_FAILED."""
        with self._lock, timed(self._metrics, "abort_transaction"):
            if self._state is _State.COMMITTING:
                raise IllegalStateError(
                    "abort_transaction() refused: a commit_transaction() call ran out of time "
                    "and the broker may already have committed. Call commit_transaction() "
                    "again, or close() the producer and let the next init_transactions() "
                    "settle the transaction"
                )
            if self._state is _State.RECOVERING:
                self._settle_kept_transaction(commit=False, timeout=timeout)
                return
            self._require(
                (_IN_TXN, _State.ABORTABLE, _State.ABORTING, _State.PREPARED), "abort_transaction"
            )
            self._state = _State.ABORTING
            self._retrying("abort_transaction", self._producer.abort_transaction, timeout)
            # librdkafka purged the queue; serve those reports now so that none of them is
            # counted against the next transaction.
            self._drain()
            self._abortable = None
            self._first_failure = None
            self._state = _State.READY
            if self._twophase is not None:
                self._twophase.prepared = None
                self._twophase.identity.invalidate()  # abort may have bumped the epoch

    # ------------------------------------------------------------------ two-phase commit
    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """First phase of KIP-939: make the open transaction ready to commit and return
        its ``PreparedTxnState`` for the external decider (e.g. a database) to store.

        Every record must have been delivered; the coordinator must confirm the
        transaction is open under this producer's id and epoch; enough of
        ``transaction.timeout.ms`` must be left. Otherwise ``TransactionAbortableError``.
        Afterwards only ``complete_transaction``/``commit_transaction``/
        ``abort_transaction`` are allowed. A transaction that sent nothing prepares to
        the empty state."""
        with self._lock, timed(self._metrics, "prepare_transaction"):
            twophase = self._two_phase("prepare_transaction")
            if self._state is _State.ABORTABLE and self._abortable is not None:
                self._refuse_send("prepare_transaction")
            self._require((_IN_TXN,), "prepare_transaction")
            budget = self._operation_timeout if timeout is None else timeout
            deadline = time.monotonic() + budget
            left = self.flush(max(0.0, deadline - time.monotonic()))
            if self._first_failure is not None:
                raise self._prepare_failed(
                    f"a record failed: {self._first_failure}", self._first_failure
                )
            if left:
                raise self._prepare_failed(f"{left} records still undelivered after {budget:g}s")
            pid, epoch = self._await_identity(deadline)
            time_left = self._transaction_timeout_s - (time.monotonic() - self._begun_at)
            if time_left < self._prepare_min_time_left:
                raise self._prepare_failed(
                    f"only {time_left:.1f}s of transaction.timeout.ms "
                    f"({self._transaction_timeout_s:g}s) left, less than "
                    f"prepare_min_time_left={self._prepare_min_time_left:g}s: the broker could "
                    "abort it before the decision lands. Raise transaction.timeout.ms or "
                    "send less per transaction"
                )
            seen = twophase.call("prepare_transaction", twophase.client.describe, recovering=False)
            twophase.last_describe_at = time.monotonic()
            if seen.producer_id != pid or seen.producer_epoch != epoch:
                fenced = ProducerFencedError(
                    f"prepare_transaction(): the coordinator holds producer id "
                    f"{seen.producer_id} epoch {seen.producer_epoch} for "
                    f"{self.transactional_id!r}, this producer is {pid}/{epoch}: a newer "
                    "producer took over; close this one",
                    kafka_error=KafkaError(KafkaError.PRODUCER_FENCED),
                )
                self._enter_fatal(fenced)
                raise fenced
            if seen.state == "Ongoing":
                if seen.start_time_ms == twophase.last_start_ms:
                    raise self._prepare_failed(
                        "the coordinator gives this transaction the start time of the "
                        "previous one, so recovery could not tell them apart; abort and retry"
                    )
                state = PreparedTxnState(
                    transactional_id=self.transactional_id,
                    producer_id=pid,
                    producer_epoch=epoch,
                    txn_start_ms=seen.start_time_ms,
                    cluster_id=self._cluster_id(deadline),
                    timeout_ms=int(self._transaction_timeout_s * 1000),
                )
                twophase.last_start_ms = seen.start_time_ms
            elif seen.state in ("Empty", "CompleteCommit", "CompleteAbort"):
                state = PreparedTxnState.EMPTY  # nothing was sent: nothing to commit
            else:
                raise self._prepare_failed(f"the coordinator reports state {seen.state}")
            twophase.prepared = state
            self._state = _State.PREPARED
            return state

    def complete_transaction(
        self,
        state: PreparedTxnState | str,
        *,
        before_init: Callable[[TransactionOutcome], None] | None = None,
        timeout: float | None = None,
    ) -> TransactionOutcome:
        """Second phase of KIP-939: commit if ``state`` is the prepared transaction's,
        abort otherwise.

        After ``init_transactions(keep_prepared_txn=True)``, ``state`` is what the
        database stored; this runs recovery (commit the in-doubt transaction if it is the
        stored one, raise ``TransactionDivergedError`` if Kafka lost it), calls
        ``before_init(outcome)`` (the place to store ``state.mark_completed()``, so that a
        crash now cannot make the next recovery guess), and only then initialises
        transactions, which aborts anything else still open and fences zombies."""
        if isinstance(state, str):
            state = PreparedTxnState.parse(state)
        with self._lock:
            twophase = self._two_phase("complete_transaction")
            if self._state is _State.RECOVERING:
                with timed(self._metrics, "recovery"):
                    cluster = self._cluster_id(time.monotonic() + self._operation_timeout)
                    outcome = twophase.call(
                        "complete_transaction",
                        partial(recover, twophase.client, state, cluster),
                        recovering=True,
                    )
                if before_init is not None:
                    before_init(outcome)
                self._init_librdkafka(timeout)
                return outcome
            if self._state is not _State.PREPARED:
                self._raise_if_dead("complete_transaction")
                raise IllegalStateError(
                    f"complete_transaction() with no prepared transaction (state "
                    f"'{self._state.value}'): call prepare_transaction() first, or "
                    "init_transactions(keep_prepared_txn=True) to recover",
                    kafka_error=KafkaError(KafkaError.INVALID_TXN_STATE),
                )
            if state == twophase.prepared:
                self.commit_transaction(timeout)
                outcome = TransactionOutcome.COMMITTED
            else:
                self.abort_transaction(timeout)
                outcome = TransactionOutcome.ABORTED
            if before_init is not None:
                before_init(outcome)
            return outcome

    def _two_phase(self, operation: str) -> TwoPhase:
        if self._twophase is None:
            self._raise_if_dead(operation)
            raise IllegalStateError(
                f"{operation}() needs two-phase commit: set "
                "'transaction.two.phase.commit.enable': True in the producer config"
            )
        return self._twophase

    def _prepare_failed(self, reason: str, cause: KafkaTxnError | None = None) -> KafkaTxnError:
        exc = TransactionAbortableError(
            f"prepare_transaction() failed: {reason}; abort the transaction",
            kafka_error=None if cause is None else cause.kafka_error,
        )
        if cause is not None:
            exc.__cause__ = self._root_exception(cause)
        self._enter_abortable(exc)
        return exc

    def _await_identity(self, deadline: float) -> tuple[int, int]:
        """This producer's id and epoch; waits for a statistics snapshot only after an
        init or abort (see twophase.py)."""
        assert self._twophase is not None
        tracker = self._twophase.identity
        while tracker.identity is None:
            if time.monotonic() >= deadline:
                raise self._prepare_failed(
                    "librdkafka sent no statistics with the producer id in time "
                    "(statistics.interval.ms)"
                )
            self.poll(0.02)
        return tracker.identity

    def _cluster_id(self, deadline: float) -> str | None:
        assert self._twophase is not None
        if self._twophase.cluster_id is None:
            try:
                metadata = self._producer.list_topics(timeout=max(1.0, deadline - time.monotonic()))
                self._twophase.cluster_id = metadata.cluster_id
            except KafkaException as exc:
                log.warning("could not read the cluster id: %s", exc)
        return self._twophase.cluster_id

    def _settle_kept_transaction(self, commit: bool, timeout: float | None) -> None:
        """commit_transaction()/abort_transaction() right after
        init_transactions(keep_prepared_txn=True): commit whatever transaction is open for
        this transactional id (KIP-939 leaves that choice to the caller), or abort it."""
        assert self._twophase is not None
        twophase = self._twophase
        if commit:
            seen = twophase.call("commit_transaction", twophase.client.describe, recovering=True)
            if seen.state == "Ongoing":
                twophase.call(
                    "commit_transaction",
                    partial(twophase.client.end_txn, seen.producer_id, seen.producer_epoch, True),
                    recovering=True,
                )
        self._init_librdkafka(timeout)  # aborts whatever is still open

    @contextmanager
    def transaction(self) -> Iterator[TransactionalProducer]:
        """``with producer.transaction():`` begins, commits on success, and aborts on an
        exception (re-raised). A ``CommitFailedException`` is raised after the abort."""
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            if self._state in (_IN_TXN, _State.ABORTABLE):
                self.abort_transaction()
            raise
        try:
            self.commit_transaction()
        except CommitFailedException:
            self.abort_transaction()
            raise

    # ------------------------------------------------------------------ plumbing calls
    def poll(self, timeout: float = 0) -> int:
        """Serve delivery reports and callbacks; returns how many events were served."""
        self._raise_if_dead("poll")
        return int(self._call("poll", self._producer.poll, timeout))

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every queued record is delivered or failed; returns how many are
        still queued when ``timeout`` seconds pass."""
        self._raise_if_dead("flush")
        return int(self._call("flush", self._producer.flush, -1 if timeout is None else timeout))

    def close(self, timeout: float = 10.0) -> None:
        """Release the producer. An open transaction is aborted (best effort: if that
        fails, the broker aborts it at ``transaction.timeout.ms`` or when the
        transactional.id is next initialised). Safe to call more than once."""
        with self._lock:
            if self._state is _State.CLOSED:
                return
            # A PREPARED transaction is left alone: its fate is the external decider's,
            # and recovery (or the broker's timeout) settles it.
            if self._state in (_IN_TXN, _State.ABORTABLE, _State.ABORTING):
                try:
                    self.abort_transaction(timeout)
                except KafkaTxnError as exc:
                    log.warning("close(): abort of the open transaction failed: %s", exc)
            prepared = self._state is _State.PREPARED
            self._state = _State.CLOSED
            if self._twophase is not None:
                self._twophase.close()
            if prepared:
                # confluent-kafka's Producer.close() aborts an open transaction; a prepared
                # one must outlive this producer, so the handle is left to the garbage
                # collector, whose rd_kafka_destroy() leaves the transaction open.
                return
            try:
                self._producer.flush(0)
                close = getattr(self._producer, "close", None)
                if close is not None:
                    close()
            except (KafkaException, RuntimeError) as exc:  # closing a dead handle
                log.debug("close(): %s", exc)

    def __enter__(self) -> TransactionalProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        """Records queued or in flight."""
        return len(self._producer)

    def __repr__(self) -> str:
        return f"<TransactionalProducer {self.transactional_id!r} {self._state.value}>"

    # ------------------------------------------------------------------ internals
    def _require(self, allowed: tuple[_State, ...], operation: str) -> None:
        state = self._state
        if state in allowed:
            return
        self._raise_if_dead(operation)
        if state is _State.NEW:
            hint = "call init_transactions() first"
        elif state is _State.READY:
            hint = (
                "init_transactions() was already called"
                if operation == "init_transactions"
                else "no transaction is open: call begin_transaction() first"
            )
        elif state is _State.ABORTABLE:
            hint = "the transaction failed: call abort_transaction()"
        elif state is _State.COMMITTING:
            hint = "a commit is in progress: call commit_transaction() again"
        elif state is _State.ABORTING:
            hint = "an abort is in progress: call abort_transaction() again"
        elif state is _State.PREPARED:
            hint = (
                "the transaction is prepared: only complete_transaction(), "
                "commit_transaction() or abort_transaction() may follow"
            )
        elif state is _State.RECOVERING:
            hint = (
                "init_transactions(keep_prepared_txn=True) was called: settle the kept "
                "transaction with complete_transaction(stored_state) first"
            )
        else:
            hint = "a transaction is already open: commit or abort it first"
        err = IllegalStateError(f"{operation}() not allowed in state '{state.value}': {hint}")
        if state is _State.ABORTABLE and self._abortable is not None:
            raise err from self._root_exception(self._abortable)
        raise err

    def _raise_if_dead(self, operation: str) -> None:
        if self._fatal is not None:
            raise self._fatal.with_traceback(None)
        if self._state is _State.CLOSED:
            raise IllegalStateError(f"{operation}() called after close()")

    def _refuse_send(self, operation: str) -> None:
        if self._state is _State.ABORTABLE and self._abortable is not None:
            raise TransactionAbortableError(
                f"{operation}() refused: the transaction already failed "
                f"({self._abortable.message}); call abort_transaction()",
                kafka_error=self._abortable.kafka_error,
            ) from self._root_exception(self._abortable)
        self._require((_IN_TXN,), operation)

    def _retrying(
        self, operation: str, call: Callable[[float], object], timeout: float | None
    ) -> None:
        """Run a blocking librdkafka call, retrying retriable errors until the deadline
        (tenacity), translating everything else through the error table."""
        budget = self._operation_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget

        def attempt() -> None:
            self._call(operation, call, max(0.001, deadline - time.monotonic()))

        try:
            try:
                attempt()  # the common case, without the retry machinery's cost
            except KafkaException as first:
                if not _is_retriable(first):
                    raise
                log.info(
                    "%s: %s; retrying until %gs pass", operation, first.args[0], budget,
                    extra={"transactional_id": self.transactional_id, "operation": operation},
                )  # fmt: skip
                retrying = tenacity.Retrying(
                    retry=tenacity.retry_if_exception(_is_retriable),
                    stop=tenacity.stop_after_delay(max(0.0, deadline - time.monotonic())),
                    wait=_WAIT,
                    sleep=self._sleep,
                    reraise=True,
                )
                for try_ in retrying:
                    with try_:
                        attempt()
        except KafkaException as exc:
            if isinstance(exc, KafkaTxnError):
                raise
            err = exc.args[0]
            if _is_retriable(exc):
                raise TransactionOutcomeUnknownError(
                    self._outcome_unknown_message(operation, budget, err),
                    kafka_error=err,
                    operation=operation,
                ) from exc
            raise self._on_call_error(exc, operation) from exc

    @staticmethod
    def _outcome_unknown_message(operation: str, budget: float, err: KafkaError) -> str:
        base = f"{operation}() did not complete within {budget:g}s ({err.str()})"
        if operation == "commit_transaction":
            return (
                f"{base}: the broker may already have committed. Call commit_transaction() "
                "again; do not abort. If you close instead, the next init_transactions() for "
                "this transactional.id finishes the commit or aborts it"
            )
        if operation == "abort_transaction":
            return f"{base}: call abort_transaction() again, or close() the producer"
        return f"{base}: call {operation}() again"

    def _call(self, operation: str, call: Callable[..., Any], *args: Any) -> Any:
        """One confluent-kafka call that may run callbacks: surfaces a fatal error
        recorded meanwhile, and re-raises a user callback's exception here, outside
        librdkafka's stack (raising inside it is what makes confluent-kafka raise
        SystemError)."""
        try:
            result = call(*args)
        except SystemError as exc:
            # confluent-kafka raises SystemError when an exception was pending while a
            # callback ran during a fatal error; the fatal error is the real cause.
            self._serve_error_callbacks()
            self._collect_reports()
            if self._fatal is not None:
                raise self._fatal.with_traceback(None) from exc
            raise
        except KafkaException as exc:
            self._collect_reports()
            if not isinstance(exc, KafkaTxnError) and classify(exc.args[0])[0] is (
                ErrorCategory.FATAL
            ):
                raise self._on_call_error(exc, operation) from exc
            self._raise_callback_error()
            raise
        self._collect_reports()
        self._raise_callback_error()
        if self._fatal is not None and operation in ("poll", "flush"):
            raise self._fatal.with_traceback(None)
        return result

    def _collect_reports(self) -> None:
        reports = self._reports
        if not reports:
            return
        # pop() one key at a time: another thread's poll() may be adding reports.
        for err in list(reports):
            msg = reports.pop(err, None)
            if err is not None and msg is not None:
                self._on_delivery(err, msg)

    def _serve_error_callbacks(self) -> None:
        try:
            self._producer.poll(0)
        except Exception as exc:
            log.debug("poll(0) after SystemError raised %r", exc)

    def _raise_callback_error(self) -> None:
        if self._callback_error is not None:
            exc, self._callback_error = self._callback_error, None
            raise exc

    def _on_call_error(self, exc: KafkaException, operation: str) -> KafkaTxnError:
        """Translate a confluent-kafka exception from ``operation`` and move the state
        machine; the caller raises the result ``from exc``."""
        err = exc.args[0]
        if err.code() == KafkaError._FATAL:
            # The call reports only "_FATAL"; error_cb carries the underlying cause.
            self._serve_error_callbacks()
            if self._fatal is not None:
                return self._fatal.with_traceback(None)
        mapped = exception_for(err, operation)
        if isinstance(mapped, FatalError):
            self._enter_fatal(mapped)
        elif operation in ("init_transactions", "abort_transaction"):
            # Nothing to abort to: librdkafka's non-retriable failures here leave no way on.
            fatal = FatalError(mapped.message, kafka_error=err)
            self._enter_fatal(fatal)
            return fatal
        elif operation == "begin_transaction":
            return IllegalStateError(mapped.message, kafka_error=err)
        else:
            self._enter_abortable(mapped)
        return mapped

    def _enter_fatal(self, exc: FatalError) -> None:
        if self._fatal is None:
            self._fatal = exc
            log.error(
                "producer %r is now unusable: %s", self.transactional_id, exc,
                extra={"transactional_id": self.transactional_id,
                       "error_code": exc.kafka_error.name()},
            )  # fmt: skip
        if self._state is not _State.CLOSED:
            self._state = _State.FATAL

    def _enter_abortable(self, exc: KafkaTxnError) -> None:
        if self._abortable is None:
            self._abortable = exc
        if self._state in (_IN_TXN, _State.COMMITTING):
            self._state = _State.ABORTABLE

    @staticmethod
    def _root_exception(exc: KafkaTxnError) -> BaseException:
        """The exception holding ``exc``'s root cause, to chain from: never a chain of two."""
        if isinstance(exc, ProduceFailedException) or exc.__cause__ is None:
            return exc
        return exc.__cause__

    def _commit_failed(self, cause: KafkaTxnError | None) -> KafkaTxnError:
        if self._fatal is not None:
            return self._fatal.with_traceback(None)
        if cause is None:  # pragma: no cover - state machine invariant
            cause = TransactionAbortableError("the transaction failed")
        err, root, reason = cause.kafka_error, self._root_exception(cause), cause.message
        if self._failed_records > 1:
            reason += f"; at least {self._failed_records} records failed"
        exc = CommitFailedException(
            f"commit_transaction() failed: {reason}. Abort the transaction, rewind the "
            "inputs, and retry",
            kafka_error=err,
        )
        exc.__cause__ = root
        self._enter_abortable(exc)
        return exc

    def _drain(self) -> None:
        """Serve whatever callbacks are queued (_call surfaces a fatal error they bring)."""
        self._call("poll", self._producer.poll, 0)

    # ------------------------------------------------------------------ record path
    def _chain(self, user_cb: DeliveryCallback) -> Callable[[KafkaError | None, Message], None]:
        on_delivery = self._on_delivery

        def deliver(err: KafkaError | None, msg: Message) -> None:
            failure = on_delivery(err, msg)
            try:
                user_cb(failure, msg)
            except BaseException as exc:
                self._stash_callback_error(exc)

        return deliver

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> ProduceFailedException | None:
        if err is not None:
            return self._failed_report(err, msg)
        if self._user_on_delivery is not None:
            self._call_user(self._user_on_delivery, None, msg)
        return None

    def _failed_report(self, err: KafkaError, msg: Message) -> ProduceFailedException:
        """A delivery report with an error: record it and tell the user's callback."""
        failure = produce_failure(err, msg.topic(), msg.partition(), msg.key())
        self._record_failure(failure)
        if self._user_on_delivery is not None:
            self._call_user(self._user_on_delivery, failure, msg)
        return failure

    def _call_user(self, cb: Callable[..., None], *args: Any) -> None:
        try:
            cb(*args)
        except BaseException as exc:
            self._stash_callback_error(exc)

    def _stash_callback_error(self, exc: BaseException) -> None:
        """Keep a user callback's exception for ``_call`` to raise once librdkafka's
        call has returned; the first one wins."""
        if self._callback_error is None:
            self._callback_error = exc

    def _record_failure(self, failure: ProduceFailedException) -> None:
        self._failed_records += 1
        if self._metrics is not None:
            self._metrics.record_failed(failure.failure_type)
        # A purged record is a consequence of the transaction failing, never its cause.
        if self._first_failure is None and failure.kafka_error.code() not in _PURGED:
            self._first_failure = failure
        if failure.category is ErrorCategory.FATAL:
            fatal = exception_for(failure.kafka_error, "produce")
            if isinstance(fatal, FatalError):
                fatal.__cause__ = failure
                self._enter_fatal(fatal)

    def _on_error(self, err: KafkaError) -> None:
        # confluent-kafka hands error_cb the underlying error of a _FATAL, flagged fatal().
        if err.fatal() and self._fatal is None:
            fatal = exception_for(err, "producer")
            if isinstance(fatal, FatalError):
                fatal.__cause__ = KafkaException(err)
                self._enter_fatal(fatal)
        if self._user_error_cb is not None:
            self._call_user(self._user_error_cb, err)
        elif not err.fatal():
            log.info("librdkafka: %s (%s)", err.str(), err.name())

    def _sync_failure(
        self, exc: KafkaException, topic: str, partition: int, key: Any
    ) -> KafkaTxnError:
        err = exc.args[0]
        if classify(err)[0] is ErrorCategory.FATAL or err.code() == KafkaError._FATAL:
            return self._on_call_error(exc, "produce")
        if err.code() == KafkaError._STATE:
            # librdkafka's transaction already failed, most likely through a delivery
            # report not served yet: serve it, so that the real cause is recorded first.
            self._drain()
        failure = produce_failure(err, topic, partition, key)
        if err.code() == KafkaError._STATE and self._first_failure is not None:
            failure.message += f"; the transaction already failed: {self._first_failure}"
        # The record never entered librdkafka, so librdkafka would commit without it:
        # remember it so that commit_transaction() refuses (KIP-691).
        self._record_failure(failure)
        return failure

    def _produce_failed(
        self,
        exc: Exception,
        topic: str,
        value: Any,
        key: Any,
        partition: int,
        cb: Callable[..., None] | None,
        timestamp: int,
        headers: Any,
    ) -> None:
        """The slow path of produce()/send(): a record librdkafka refused, arguments of
        the wrong type, or a full queue, where it serves delivery reports until there is
        room, like Java's send() blocking up to max.block.ms."""
        deadline = time.monotonic() + self._queue_full_timeout
        while isinstance(exc, BufferError):
            if time.monotonic() >= deadline:
                err = KafkaError(
                    KafkaError._QUEUE_FULL,
                    f"local queue still full after {self._queue_full_timeout:g}s",
                )
                failure = produce_failure(err, topic, partition, key)
                self._record_failure(failure)
                raise failure from None
            self.poll(0.05)
            try:
                self._produce(topic, value, key, partition, cb, None, timestamp, headers)
                return
            except Exception as again:  # dispatched below, like the first failure
                exc = again
        if isinstance(exc, KafkaException):
            raise self._sync_failure(exc, topic, partition, key) from exc
        if isinstance(exc, TypeError):
            raise self._type_error(exc, key, value) from None
        raise exc

    def _serialize(self, topic: str, key: Any, value: Any, headers: Any) -> tuple[Any, Any]:
        field = MessageField.KEY
        try:
            if self._key_serializer is not None:
                key = self._key_serializer(key, SerializationContext(topic, field, headers))
            field = MessageField.VALUE
            if self._value_serializer is not None:
                value = self._value_serializer(value, SerializationContext(topic, field, headers))
        except Exception as exc:
            code = (
                KafkaError._KEY_SERIALIZATION
                if field == MessageField.KEY
                else KafkaError._VALUE_SERIALIZATION
            )
            failure = produce_failure(
                KafkaError(code, f"{field} serializer failed: {exc!r}"), topic, None, None
            )
            self._record_failure(failure)
            raise failure from exc
        return key, value

    def _type_error(self, exc: TypeError, key: Any, value: Any) -> TypeError:
        pairs = (("value", value, "value_serializer"), ("key", key, "key_serializer"))
        for name, obj, option in pairs:
            if obj is not None and not isinstance(obj, (bytes, str)):
                return TypeError(
                    f"{name} must be bytes, str or None, got {type(obj).__name__}: encode it "
                    f"first or pass {option}=... to TransactionalProducer"
                )
        return TypeError(f"produce() arguments rejected by confluent-kafka: {exc}")
