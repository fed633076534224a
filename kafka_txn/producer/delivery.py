"""Delivery bookkeeping of one producer: the reports librdkafka hands back, the first
failed record of the open transaction, and exceptions raised by user callbacks.

Reports of records sent without a callback land in ``reports`` through the dict's C-level
``setdefault`` (no Python frame per record). Successes share the key None (one Message
kept); each failing error code keeps its first record, in order. ``collect()`` turns the
failures into ``ProduceFailedException`` after every librdkafka call that serves
callbacks. A user's own ``on_delivery`` needs a Python call per report anyway, so then
``on_delivery`` is librdkafka's callback directly. Nothing is kept per delivered record.

User callbacks never raise inside librdkafka's stack (that is what makes confluent-kafka
raise SystemError): their first exception is stashed and re-raised by the producer once
the librdkafka call has returned; commit, abort, init and close re-raise it only after
their own work is done, with a note saying what that was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, Message

from kafka_txn.classification import exception_for, produce_failure
from kafka_txn.errors import ErrorCategory, FatalError, ProduceFailedException
from kafka_txn.metrics import MetricsHook

if TYPE_CHECKING:
    from kafka_txn.producer.futures import DeliveryFuture

__all__ = ["Deliveries", "DeliveryCallback"]

DeliveryCallback = Callable[[ProduceFailedException | None, Message], None]
"""``callback(error, message)``: error is None when the record was delivered."""

_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
_INNOCENT = KafkaError._INVALID_DIFFERENT_RECORD


class Deliveries:
    """Delivery reports, failed records and callback errors of one producer; the owner
    of every ``DeliveryFuture`` it hands out."""

    __slots__ = (
        "_metrics",
        "_on_fatal",
        "callback_error",
        "failed_records",
        "first_failure",
        "generation",
        "librdkafka_failed",
        "poll",
        "reports",
        "user_on_delivery",
        "waiting",
    )

    def __init__(
        self,
        *,
        user_on_delivery: DeliveryCallback | None,
        metrics: MetricsHook | None,
        on_fatal: Callable[[FatalError], None],
        poll: Callable[[float], int],
    ) -> None:
        self.reports: dict[KafkaError | None, Message] = {}
        self.user_on_delivery = user_on_delivery
        self.first_failure: ProduceFailedException | None = None
        """The first failed record of the open transaction (purged ones never count)."""
        self.failed_records = 0
        self.generation = 0
        """How many times ``reset()`` ran (each begin, each successful abort): a send that
        waits (``kafka_txn.aio``) tells by it whether its transaction is still open."""
        self.librdkafka_failed = False
        """Whether librdkafka's own transaction failed (a failed delivery report, or a
        transactional call it failed): it then sends no more records. A record refused
        before it was queued fails only this library's transaction (KIP-691), not
        librdkafka's, which still delivers the others."""
        self.callback_error: BaseException | None = None
        self.poll = poll
        """The producer's ``poll()``: what a waiting ``DeliveryFuture`` drives."""
        self.waiting: dict[DeliveryFuture, list[Callable[[DeliveryFuture], None]]] = {}
        """``add_done_callback`` callbacks of pending futures, run by their report."""
        self._metrics = metrics
        self._on_fatal = on_fatal

    def sink(self, errors_only: bool) -> Callable[[KafkaError | None, Message], Any]:
        """The callable librdkafka gets as ``on_delivery``. An error-only producer's gets
        failures only, so ``on_delivery`` takes them at no cost to delivered records;
        otherwise, without a user callback, a dict's C-level ``setdefault`` keeps each
        delivered record's report out of Python. (That dict hashes the ``KafkaError``,
        and confluent-kafka hashes one to its code: for UNKNOWN_SERVER_ERROR, -1, which
        CPython takes for a failed hash, so the report is lost in a SystemError.)"""
        if errors_only or self.user_on_delivery is not None:
            return self.on_delivery
        return self.reports.setdefault

    def reset(self) -> None:
        """Forget the failures of the previous transaction."""
        self.generation += 1
        self.first_failure = None
        self.failed_records = 0
        self.librdkafka_failed = False

    def collect(self) -> None:
        """Turn the failed reports that landed in ``reports`` into failures."""
        reports = self.reports
        if not reports:
            return
        # pop() one key at a time: another thread's poll() may be adding reports.
        for err in list(reports):
            msg = reports.pop(err, None)
            if err is not None and msg is not None:
                self.on_delivery(err, msg)

    def on_delivery(self, err: KafkaError | None, msg: Message) -> ProduceFailedException | None:
        """One report: record a failure, tell the user's callback."""
        if err is not None:
            return self.failed_report(err, msg)
        if self.user_on_delivery is not None:
            self.call_user(self.user_on_delivery, None, msg)
        return None

    def failed_report(self, err: KafkaError, msg: Message) -> ProduceFailedException:
        """A delivery report with an error: record it and tell the user's callback."""
        failure = produce_failure(err, msg.topic(), msg.partition(), msg.key())
        self.librdkafka_failed = True
        self.record_failure(failure)
        if self.user_on_delivery is not None:
            self.call_user(self.user_on_delivery, failure, msg)
        return failure

    def chain(self, user_cb: DeliveryCallback) -> Callable[[KafkaError | None, Message], None]:
        """A per-record callback: bookkeeping first, then ``user_cb(failure, msg)``.
        A ``user_cb`` that cannot be called is refused here, before the record is queued
        (it would fail only when its report is served: after the commit)."""
        if not callable(user_cb):
            raise TypeError(
                "produce(on_delivery=...) must be a callable(error, message) or None, got "
                f"{user_cb!r:.60} ({type(user_cb).__name__})"
            )
        on_delivery = self.on_delivery

        def deliver(err: KafkaError | None, msg: Message) -> None:
            failure = on_delivery(err, msg)
            try:
                user_cb(failure, msg)
            except BaseException as exc:
                self.stash_callback_error(exc)

        return deliver

    def call_user(self, cb: Callable[..., None], *args: Any) -> None:
        try:
            cb(*args)
        except BaseException as exc:
            self.stash_callback_error(exc)

    def stash_callback_error(self, exc: BaseException) -> None:
        """Keep a user callback's exception for the producer to raise once librdkafka's
        call has returned; the first one wins."""
        if self.callback_error is None:
            self.callback_error = exc

    def raise_callback_error(self, note: str | None = None) -> None:
        """Raise the stashed callback exception, if any, itself (never wrapped); ``note``
        (PEP 678) says what the call that served it did."""
        if self.callback_error is not None:
            exc, self.callback_error = self.callback_error, None
            if note is not None:
                _add_note(exc, note)
            raise exc

    def record_failure(self, failure: ProduceFailedException) -> None:
        """Count a failed record; the first one not purged by an abort is the cause the
        commit will name (KIP-691). A record failing fatally makes the producer fatal."""
        self.failed_records += 1
        if self._metrics is not None:
            self._metrics.record_failed(failure.failure_type)
        # A purged record is a consequence of the transaction failing, never its cause;
        # nor is an innocent record of a batch the broker refused for another (KIP-467:
        # librdkafka reports the batch in order, so an innocent may come before the
        # culprit), which yields to the culprit.
        code = failure.kafka_error.code()
        first = self.first_failure
        if code not in _PURGED and (
            first is None or (first.kafka_error.code() == _INNOCENT and code != _INNOCENT)
        ):
            self.first_failure = failure
        if failure.category is ErrorCategory.FATAL:
            fatal = exception_for(failure.kafka_error, "produce")
            if isinstance(fatal, FatalError):
                fatal.__cause__ = failure
                self._on_fatal(fatal)


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; on Python 3.10, where it is missing, the same attribute."""
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]
