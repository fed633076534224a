"""``TransactionalProducer``: confluent-kafka's transactional producer behind the declared
lifecycle of ``kafka_txn.producer.lifecycle`` and the KIP-691 error model.

The class holds the public calls: it checks the state, takes the lock and delegates to
the components ``producer.assembly`` builds: ``producer.sending`` (serializers, a full
queue, refused records, the sends under way), ``producer.librdkafka`` (the calls into
librdkafka and the translation of their errors), ``producer.completion`` (the bodies of
begin, init, commit, abort and complete), ``producer.closing`` (close),
``kafka_txn.twophase`` (prepare and recovery), ``producer.lifecycle`` (the states and
their legal moves). Only the fast path of ``produce()``/``send()`` stays here: one Python
frame over confluent-kafka's produce().
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from confluent_kafka import TopicPartition

from kafka_txn.config import ERROR_REPORTS_ONLY_KEY, ProducerSettings, validate_config
from kafka_txn.errors import CommitFailedException, ConfigurationError, IllegalStateError
from kafka_txn.metrics import MetricsHook, timed
from kafka_txn.producer import arguments
from kafka_txn.producer.assembly import assemble, resolve_operation_timeout
from kafka_txn.producer.delivery import DeliveryCallback
from kafka_txn.producer.futures import _PENDING, DeliveryFuture
from kafka_txn.producer.lifecycle import State
from kafka_txn.producer.sending import Serializer
from kafka_txn.producer.watch import TransactionWatch, counts_deliveries
from kafka_txn.state import PreparedTxnState
from kafka_txn.tracing import COMPLETE_SPAN, PREPARE_SPAN, Tracing, as_tracing
from kafka_txn.twophase.prepare import TwoPhase
from kafka_txn.twophase.recovery import TransactionOutcome

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["DeliveryCallback", "Serializer", "TransactionalProducer"]

_IN_TXN = State.IN_TRANSACTION
_UNWATCHED: AbstractContextManager[Any] = nullcontext({})
_NO_LIMIT = float("inf")
_OPEN_STATES = frozenset(
    {
        _IN_TXN,
        State.PREPARING,
        State.PREPARED,
        State.IN_DOUBT,
        State.COMMITTING,
        State.ABORTING,
        State.ABORTABLE,
    }
)


class TransactionalProducer:
    """A transactional Kafka producer whose every failure says what to do next.

    ``config`` is a dict (any ``Mapping``) of librdkafka properties or a
    ``ProducerSettings``; ``transactional.id`` is required and idempotence cannot be
    turned off. ``operation_timeout`` bounds how long
    ``commit_transaction``/``abort_transaction``/``init_transactions`` retry retriable
    errors (default: ``transaction.timeout.ms``). ``queue_full_timeout`` is how long
    ``produce()`` waits for room when librdkafka's local queue is full.

    With ``transaction.two.phase.commit.enable=true`` (KIP-939's setting) the producer
    also offers ``prepare_transaction()``, ``complete_transaction()`` and
    ``init_transactions(keep_prepared_txn=True)``; ``prepare_min_time_left`` (default: a
    fifth of ``transaction.timeout.ms``, at least 1 s) is how much of the transaction
    timeout must remain for prepare to succeed. ``metrics`` receives every transactional
    operation's duration and outcome and every failed record (``kafka_txn.metrics``),
    and, if it has ``transaction_ended``, each transaction's outcome and delivered
    records. ``tracing`` (a ``kafka_txn.tracing.Tracing`` or an OpenTelemetry
    ``TracerProvider``; default None: no tracing) records a span per transaction
    (``kafka_txn.tracing``).

    With ``delivery.report.only.error=true`` in ``config`` the producer is *error-only*:
    confluent-kafka drops the report of each delivered record in C, so ``produce()``
    costs close to confluent-kafka's own; failed records are reported, classified and
    refuse the commit as always, ``on_delivery`` callbacks hear of failures only, and
    ``send()`` (whose futures need the success reports) raises ``IllegalStateError``.
    It cannot be combined with tracing or per-transaction metrics, which count the
    delivered records.

    ``produce``, ``send`` and ``poll`` may be called from several threads; the
    transactional calls are serialized by a lock.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | ProducerSettings,
        *,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
        operation_timeout: float | None = None,
        queue_full_timeout: float = 60.0,
        prepare_min_time_left: float | None = None,
        metrics: MetricsHook | None = None,
        tracing: Tracing | TracerProvider | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        call = "TransactionalProducer"
        arguments.callback(key_serializer, call, "key_serializer")
        arguments.callback(value_serializer, call, "value_serializer")
        arguments.wait(queue_full_timeout, call, "queue_full_timeout")
        arguments.timeout(prepare_min_time_left, call, "prepare_min_time_left")
        arguments.hook(metrics, call, "metrics", ("operation", "record_failed"))
        arguments.callback(sleep, call, "sleep", none=False)
        validated = validate_config(config)
        self.transactional_id = validated.transactional_id
        self._operation_timeout = resolve_operation_timeout(operation_timeout, validated)
        self._metrics = metrics
        # Tracing, and a metrics hook that takes per-transaction counts, watch each
        # transaction (producer.watch); without either, nothing does.
        ended = getattr(metrics, "transaction_ended", None)
        traced = as_tracing(tracing, call)
        self._watch: TransactionWatch | None = None
        self._errors_only = validated.error_reports_only
        counted = counts_deliveries(metrics, traced)
        if self._errors_only and counted:
            raise ConfigurationError(
                f"{ERROR_REPORTS_ONLY_KEY}=true cannot be used with "
                + ("tracing" if traced is not None else "metrics.transaction_ended")
                + ": it counts each transaction's delivered records, which needs every "
                f"delivery report; remove {ERROR_REPORTS_ONLY_KEY} (or set it to false)"
            )
        if counted:
            self._watch = TransactionWatch(
                self.transactional_id, tracing=traced, ended=ended if callable(ended) else None
            )
            counting = self._watch.counting(validated.callbacks.get("on_delivery"))
            validated = dataclasses.replace(
                validated, callbacks={**validated.callbacks, "on_delivery": counting}
            )
        self._serializing = key_serializer is not None or value_serializer is not None
        self._lock = threading.RLock()
        parts = assemble(
            validated,
            poll=self.poll,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
            operation_timeout=self._operation_timeout,
            queue_full_timeout=queue_full_timeout,
            prepare_min_time_left=prepare_min_time_left,
            metrics=metrics,
            sleep=sleep,
        )
        self._life, self._deliveries, self._io = parts.life, parts.deliveries, parts.io
        self._sends, self._twophase = parts.sends, parts.twophase
        self._completion, self._closing = parts.completion, parts.closing
        if self._watch is not None:
            self._watch.attach(parts.life, parts.twophase)
        # The Producer behind its Handle, and its own produce() (the hot path): close()
        # lets go of both (Driver.release, _close), and nothing else holds it.
        self._producer = parts.io.producer
        self._produce = parts.io.produce
        # produce()/send() append themselves to this list, and pop, for prepare/commit/abort
        # to wait until none is under way (Sends.await_sends).
        self._under_way = parts.sends.under_way
        # Topic names found valid: one set lookup per send (Sends.check_topic).
        self._topics = parts.sends.topics

    # ------------------------------------------------------------------ properties
    @property
    def state(self) -> str:
        """The lifecycle's current state (``kafka_txn.producer.lifecycle.State`` value)."""
        return self._life.state.value

    @property
    def error_reports_only(self) -> bool:
        """True when the producer is error-only (``delivery.report.only.error=true``):
        only failed records are reported, and ``send()`` is refused."""
        return self._errors_only

    @property
    def in_transaction(self) -> bool:
        """True between ``begin_transaction()`` and a successful commit or abort
        (prepared and in doubt included)."""
        return self._life.state in _OPEN_STATES

    # ------------------------------------------------------------------ transactions
    def init_transactions(
        self, timeout: float | None = None, *, keep_prepared_txn: bool = False
    ) -> None:
        """Register the transactional.id with its coordinator, fencing older producers
        with the same id and aborting a transaction they left open.

        ``keep_prepared_txn=True`` (KIP-939, needs two-phase commit enabled) does not
        touch the coordinator yet: a transaction a crashed process prepared stays open
        until ``complete_transaction(stored_state)`` settles it; only then are
        transactions initialised (and zombies fenced). It may be called again while that
        settlement has not succeeded."""
        timeout = arguments.timeout(timeout, "init_transactions")
        arguments.flag(keep_prepared_txn, "init_transactions", "keep_prepared_txn")
        with self._lock:
            with timed(self._metrics, "init_transactions"):
                if keep_prepared_txn:
                    self._two_phase("init_transactions(keep_prepared_txn=True)")
                    self._life.require("init_transactions(keep_prepared_txn=True)")
                    self._life.transition_to(State.RECOVERING)
                    return
                self._life.require("init_transactions")
                self._completion.init(timeout)
            self._completion.raise_callback_error("init_transactions() succeeded")

    def begin_transaction(self) -> None:
        """Start a transaction; records sent until commit or abort belong to it.

        After an ``abort_transaction()`` that ran out of time (the producer is still
        ``aborting``: a broker that stopped answering), this first finishes that abort,
        within ``operation_timeout``: the decision to abort was made, and resuming it is
        what the caller would have to do anyway. If it still does not complete,
        ``TransactionOutcomeUnknownError`` says so and nothing is begun (call again once
        the broker answers); if the coordinator meanwhile aborted that transaction itself
        and fenced the producer (``transaction.timeout.ms`` passed during the outage),
        the fatal error says to close the producer."""
        with self._lock, timed(self._metrics, "begin_transaction"):
            self._life.require("begin_transaction")
            self._completion.begin()
            if self._watch is not None:
                self._watch.began()

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
        Raises ``ProduceFailedException`` at once if the record cannot be queued (an
        invalid topic name, a record over ``message.max.bytes``...), and
        ``IllegalStateError`` outside a transaction or once ``prepare_transaction()``
        has started."""
        under_way = self._under_way
        under_way.append(None)  # before the state check: see Sends.await_sends
        try:  # the outer try also covers the pop: a signal may strike there too
            try:
                if self._life.state is not _IN_TXN:
                    self._life.refuse_send("produce")
                if self._serializing:
                    key, value = self._sends.serialize(topic, key, value, headers)
                cb = None if on_delivery is None else self._deliveries.chain(on_delivery)
                try:
                    if topic not in self._topics:  # refuses an invalid name, recorded
                        self._sends.check_topic(topic, partition, key)
                    # Positional on purpose, and no more arguments than needed: confluent-kafka's
                    # argument parsing costs ~0.3 µs with keywords, and ~20 ns for a None key,
                    # ~40 ns for partition -1, each. Order: topic, value, key, partition,
                    # callback, on_delivery, timestamp, headers; a None callback means the
                    # default one (Deliveries.sink).
                    if cb is None and partition == -1 and timestamp == 0 and headers is None:
                        if key is None:
                            self._produce(topic, value)
                        else:
                            self._produce(topic, value, key)
                    elif cb is None and timestamp == 0 and headers is None:
                        self._produce(topic, value, key, partition)
                    else:
                        self._produce(topic, value, key, partition, cb, None, timestamp, headers)
                    return
                except Exception as exc:
                    failed = exc
                # Outside the except block: the slow path calls librdkafka again, and a
                # KafkaException raised while another is handled pins the handled one's frames
                # for good (confluent-kafka's KafkaError, see Driver.retrying).
                self._sends.produce_failed(
                    failed, topic, value, key, partition, cb, timestamp, headers
                )
            finally:
                under_way.pop()
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self._sends.interrupted(exc, topic, partition, key)
            raise

    def produce_batch(
        self,
        topic: str,
        values: Iterable[Any],
        keys: Iterable[Any] | None = None,
        *,
        partition: int = -1,
    ) -> int:
        """Send many records to ``topic`` in the open transaction: one per item of
        ``values`` (any iterable), with the key at the same position of ``keys`` if
        given; returns how many were queued (all of them). The state check, the mark of
        a send under way and the topic name's check run once for the batch, not per
        record, so that a record costs little more than confluent-kafka's own
        ``produce()``. Serializers apply to each record; headers, timestamps and
        per-record callbacks are ``produce()``'s (the producer's ``on_delivery``
        hears of every record as for ``produce()``).

        Failures are reported per record, as by ``produce()``: a record refused at once
        raises its ``ProduceFailedException`` (its note says its position in the
        batch; the records before it are queued, none after it), and any failed record
        makes the commit fail with ``CommitFailedException``. A full queue is waited
        for, as in ``produce()``. Arguments of the wrong shape (a topic that is no str,
        bytes or a str for ``values``, a mapping, a different number of keys and values)
        are refused before anything is queued.

        Commit, abort, prepare and complete called on the batch's own thread while it
        runs (from a signal handler, a serializer or the iterable) raise
        ``IllegalStateError``: they would not cover the rest of the batch."""
        call = "produce_batch"
        if not isinstance(topic, str):  # produce() leaves it to confluent-kafka
            raise TypeError(
                f"produce_batch(topic=...) must be a topic name (str), got {topic!r:.60} "
                f"({type(topic).__name__})"
            )
        records = arguments.batch(values, keys, call)
        partition = arguments.partition(partition, call)
        under_way = self._under_way
        under_way.append(None)  # before the state check: see Sends.await_sends
        try:  # the outer try also covers the pop, as in produce()
            try:
                if self._life.state is not _IN_TXN:
                    self._life.refuse_send(call)
                if topic not in self._topics:  # refuses an invalid name, recorded
                    self._sends.check_topic(topic, partition, None)
                return self._sends.batch(topic, records, keys is not None, partition)
            finally:
                under_way.pop()
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Some records of the batch may be queued: the transaction cannot commit.
                self._sends.interrupted(exc, topic, partition, None)
            raise

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        timestamp: int = 0,
        headers: Any = None,
    ) -> DeliveryFuture:
        """Like ``produce()``, returning a ``DeliveryFuture`` of the delivered ``Message``.
        Refused (``IllegalStateError``) on an error-only producer, whose delivered records
        are never reported."""
        if self._errors_only:
            self._refuse_futures("send")
        under_way = self._under_way
        under_way.append(None)  # before the state check: see Sends.await_sends
        try:  # the outer try also covers the pop, as in produce()
            try:
                if self._life.state is not _IN_TXN:
                    self._life.refuse_send("send")
                if self._serializing:
                    key, value = self._sends.serialize(topic, key, value, headers)
                future = DeliveryFuture()  # C-level: the class has no __init__ (futures.py)
                future._owner = self._deliveries
                future._outcome = _PENDING
                try:
                    if topic not in self._topics:  # as in produce()
                        self._sends.check_topic(topic, partition, key)
                    if timestamp == 0 and headers is None:
                        self._produce(topic, value, key, partition, future)
                    else:
                        self._produce(
                            topic, value, key, partition, future, None, timestamp, headers
                        )
                    return future
                except Exception as exc:
                    failed = exc
                self._sends.produce_failed(  # outside the except block, as in produce()
                    failed, topic, value, key, partition, future, timestamp, headers
                )
                return future
            finally:
                under_way.pop()
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self._sends.interrupted(exc, topic, partition, key)
            raise

    def send_offsets_to_transaction(
        self,
        offsets: Sequence[TopicPartition],
        group_metadata: Any,
        timeout: float | None = None,
    ) -> None:
        """Commit the consumer's next offsets as part of this transaction: they become
        the group's committed offsets only if the transaction commits."""
        call = "send_offsets_to_transaction"
        checked = arguments.offsets(offsets, call)
        arguments.group_metadata(group_metadata, call)
        timeout = arguments.timeout(timeout, call)
        with self._lock:
            self._life.require(call)
            self._io.send_offsets(checked, group_metadata, timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Commit the open transaction. Raises ``CommitFailedException`` for every
        non-fatal failure (abort and retry), ``FatalError`` when the producer is dead or
        when EndTxn was answered with an error that is not a refusal (the coordinator may
        have committed: the outcome is unknown, never retry it blindly), and
        ``TransactionOutcomeUnknownError`` when retriable errors outlast the deadline (call
        ``commit_transaction()`` again; never abort then). A prepared transaction's
        failed commit raises ``TransactionInDoubtError`` instead: it is never aborted."""
        timeout = arguments.timeout(timeout, "commit_transaction")
        self._sends.refuse_inside_own_send("commit_transaction")
        with self._lock, self._watching("commit_transaction", "committed"):
            self._completion.commit(timeout)
            self._completion.raise_callback_error("commit_transaction() succeeded")

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the open transaction: nothing of it becomes visible to read_committed
        consumers, and records still queued fail with TRANSACTION_FAILED. Refused once a
        commit may have reached the broker (a timed-out commit, a prepared transaction
        whose commit was attempted)."""
        timeout = arguments.timeout(timeout, "abort_transaction")
        self._sends.refuse_inside_own_send("abort_transaction")
        with self._lock, self._watching("abort_transaction", "aborted"):
            self._completion.abort(timeout)
            self._completion.raise_callback_error("abort_transaction() succeeded")

    # ------------------------------------------------------------------ two-phase commit
    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """First phase of KIP-939: make the open transaction ready to commit and return
        its ``PreparedTxnState`` for the external decider (e.g. a database) to store.

        Sends are refused from the start (``IllegalStateError``); sends already under way
        in other threads are waited for; then every record must be delivered, the
        coordinator must confirm the transaction is open under this producer's id and
        epoch, and enough of ``transaction.timeout.ms`` must be left. Any failure leaves
        the transaction needing ``abort_transaction()``. Afterwards only
        ``complete_transaction``/``commit_transaction``/``abort_transaction`` are
        allowed. A transaction that sent nothing prepares to the empty state."""
        timeout = arguments.timeout(timeout, "prepare_transaction")
        self._sends.refuse_inside_own_send("prepare_transaction")
        with (
            self._lock,
            timed(self._metrics, "prepare_transaction"),
            self._watching_child("prepare_transaction", PREPARE_SPAN) as traced,
        ):
            twophase = self._two_phase("prepare_transaction")
            if self._life.state is State.ABORTABLE and self._life.abortable is not None:
                self._life.refuse_send("prepare_transaction")
            self._life.require("prepare_transaction")
            self._life.transition_to(State.PREPARING)
            budget = self._operation_timeout if timeout is None else timeout
            prepared = twophase.prepare(
                time.monotonic() + budget, self._completion.await_sends_to_prepare
            )
            if self._watch is not None:
                self._watch.identified(prepared, traced)
            return prepared

    def complete_transaction(
        self,
        state: PreparedTxnState | str,
        *,
        before_init: Callable[[TransactionOutcome], None] | None = None,
        timeout: float | None = None,
    ) -> TransactionOutcome:
        """Second phase of KIP-939: commit if ``state`` is the prepared transaction's
        (same producer id, epoch and start time); abort if it is the empty state or the
        state of another transaction of this transactional id (an abort is refused once
        a commit was attempted: ``TransactionInDoubtError`` came before). A state of
        another transactional id or cluster, or without a start time (the Java
        "pid:epoch" form), is refused with ``InvalidPreparedStateError`` and the
        transaction stays prepared.

        After ``init_transactions(keep_prepared_txn=True)``, ``state`` is what the
        database stored; this runs recovery (commit the in-doubt transaction if it is the
        stored one, raise ``TransactionDivergedError`` if Kafka provably lost it or
        ``TransactionOutcomeUnknowableError`` if Kafka forgot it), calls
        ``before_init(outcome)`` (the place to store ``state.mark_completed()``, so that
        a crash now cannot make the next recovery guess), and only then initialises
        transactions, which aborts anything else still open and fences zombies. If
        recovery raises, the producer stays recovering and this may be called again. If
        the init after it fails (``TransactionOutcomeUnknownError``), recovery's outcome
        is kept: calling this again with the same state only runs what is left (the
        ``before_init`` hook if it raised, then the init)."""
        call = "complete_transaction"
        arguments.prepared_state(state, call)
        arguments.callback(before_init, call, "before_init")
        timeout = arguments.timeout(timeout, call)
        if isinstance(state, str):
            state = PreparedTxnState.parse(state)
        self._sends.refuse_inside_own_send(call)
        with self._lock:
            twophase = self._two_phase("complete_transaction")
            current = self._life.state
            if current is State.RECOVERING:
                with self._recovering(state) as traced:
                    outcome = twophase.recovery.complete(
                        state, before_init, timeout, init=self._completion.init
                    )
                    traced["kafka_txn.transaction.outcome"] = outcome.value
                    self._completion.raise_callback_error(
                        f"complete_transaction() succeeded: recovery's outcome is {outcome.value}"
                    )
                return outcome
            with self._watching_child("complete_transaction", COMPLETE_SPAN) as traced:
                outcome = self._completion.complete(twophase, state, current, timeout)
                traced["kafka_txn.transaction.outcome"] = outcome.value
            if before_init is not None:
                before_init(outcome)
            self._completion.raise_callback_error(
                f"complete_transaction() succeeded: the transaction is {outcome.value}"
            )
            return outcome

    def _watching(self, operation: str, done: str) -> AbstractContextManager[Any]:
        """The watch (tracing, per-transaction metrics) of a commit or abort that ends
        the open transaction with ``done`` when it succeeds, or settles a transaction kept
        by init_transactions(keep_prepared_txn=True) (a recovery span)."""
        watch = self._watch
        if watch is None:
            return _UNWATCHED
        if self._life.state is State.RECOVERING:
            return watch.recovery(None, done)
        return watch.call(operation, done)

    def _watching_child(self, operation: str, name: str) -> AbstractContextManager[Any]:
        """The watch of prepare or complete: a span under the transaction's."""
        return _UNWATCHED if self._watch is None else self._watch.child(operation, name)

    def _recovering(self, stored: PreparedTxnState) -> AbstractContextManager[Any]:
        """The watch of recovery: a span of its own."""
        return _UNWATCHED if self._watch is None else self._watch.recovery(stored)

    def _refuse_futures(self, call: str) -> None:
        """``call`` needs the report of every delivered record, which an error-only
        producer never receives."""
        raise IllegalStateError(
            f"{call}() is not available on producer {self.transactional_id!r}: it is "
            f"error-only ({ERROR_REPORTS_ONLY_KEY}=true, the default of DualWriter, "
            "ExactlyOnceProcessor and the Spark sink), so a delivered record is never "
            "reported and its future could not resolve. Use produce() (failed records "
            f"still fail the commit), or set '{ERROR_REPORTS_ONLY_KEY}': False in the "
            "producer config to get send()"
        )

    def _two_phase(self, operation: str) -> TwoPhase:
        if self._twophase is None:
            self._life.raise_if_dead(operation)
            raise IllegalStateError(
                f"{operation}() needs two-phase commit: set "
                "'transaction.two.phase.commit.enable': True in the producer config"
            )
        return self._twophase

    @contextmanager
    def transaction(self) -> Iterator[TransactionalProducer]:
        """``with producer.transaction():`` begins, commits on success, and aborts on an
        exception (re-raised). A ``CommitFailedException`` is raised after the abort."""
        self.begin_transaction()
        failed: BaseException | None = None
        try:
            yield self
        except BaseException as exc:
            failed = exc
        if failed is not None and self._watch is not None:
            self._watch.failed(failed)  # the body's exception, on the transaction's span
        if failed is None:
            try:
                self.commit_transaction()
                return
            except CommitFailedException as exc:
                failed = exc
        # The abort runs after the except block, not in it: a confluent-kafka exception
        # raised while another is handled keeps the handled one (its traceback, the
        # caller's frames) for good (see Driver.retrying).
        if self._life.state in (_IN_TXN, State.ABORTABLE):  # a failed commit: ABORTABLE
            try:
                self.abort_transaction()
            except BaseException as abort_failed:
                abort_failed.__context__ = failed
                raise
        raise failed

    # ------------------------------------------------------------------ plumbing calls
    def poll(self, timeout: float = 0) -> int:
        """Serve delivery reports and callbacks, waiting up to ``timeout`` seconds (a
        number >= 0) for the first; returns how many events were served."""
        # The common 0 and 0.05 pass on two type tests and a comparison; the rest is
        # checked in full (bool, nan, inf, other types).
        if (timeout.__class__ is not int and timeout.__class__ is not float) or not (
            0 <= timeout < _NO_LIMIT
        ):
            timeout = arguments.wait(timeout, "poll")  # type: ignore[assignment]
        return self._io.poll(timeout)

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every queued record is delivered or failed; returns how many are
        still queued when ``timeout`` seconds (a number >= 0, or None: no limit) pass."""
        timeout = arguments.wait(timeout, "flush", none="no limit")
        return self._io.flush(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Release the producer. An open transaction is aborted within ``timeout``, also
        after a fatal error that came before its commit (such as the group refusing its
        offsets: ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID), where librdkafka can still abort
        it (best effort: if that fails, the broker aborts it at
        ``transaction.timeout.ms`` or when the transactional.id is next initialised),
        except a prepared or in-doubt one, which is left open for its decider or
        recovery, and one whose commit's outcome is unknown, which is never aborted
        blindly. In every state, librdkafka's threads, sockets and memory are released
        before it returns (what is left open stays open at the broker). Safe to call more
        than once. ``timeout`` is a number of seconds >= 0."""
        checked = arguments.wait(timeout, "close")
        assert checked is not None
        self._close(checked)

    def _close(self, timeout: float = 10.0, *, abort_open: bool = True) -> None:
        """close(); ``abort_open=False`` leaves an open transaction to the coordinator
        (``transaction.timeout.ms``) or the next ``init_transactions()`` instead of
        aborting it: for DualWriter, when an abort could bump the epoch (KIP-360) before
        the last commit is recorded as settled."""
        with self._lock:
            if self._life.state is State.CLOSED:
                return
            found = self._life.state
            try:
                done = self._closing.close(timeout, abort_open=abort_open)
            finally:
                # The last reference to librdkafka's handle: it is destroyed here.
                self._produce = self._io.produce
                if self._watch is not None:
                    self._watch.closed(found)  # ends a transaction left open
            self._completion.raise_callback_error(done)

    def __enter__(self) -> TransactionalProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        """Records queued or in flight."""
        return len(self._producer)

    def __repr__(self) -> str:
        return f"<TransactionalProducer {self.transactional_id!r} {self.state}>"
