"""What each transaction of one producer did, for tracing and metrics: its delivered
records and their value bytes, and its outcome as the producer reported it.

Built only when tracing is on or the metrics hook takes per-transaction counts
(``transaction_ended``): without either, the producer holds no ``TransactionWatch`` and
does none of this. ``produce()``/``send()`` are never touched: records are counted from
librdkafka's delivery reports (served by ``poll()``/``flush()``/commit), one Python call
per report, which is what a successful delivery of a record of the open transaction
means (a refused or purged record is not counted). Commit flushes every record first, so
a committed transaction's count is all of its records.

The outcome is decided from the lifecycle's state after each transactional call:
``ready`` after commit is ``committed`` and after abort ``aborted``; ``fatal error``
is ``failed`` (the coordinator aborts it), or ``unknown`` where the commit may have been
applied, or ``in_doubt`` for a prepared transaction; ``close()`` ends an open transaction
by the state it found. A call that raised and left the transaction open (a failed commit
awaiting its abort, a commit whose outcome is unknown awaiting its retry) records the
error and keeps the transaction span open.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kafka_txn.errors import (
    ProduceFailedException,
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
)
from kafka_txn.producer.lifecycle import Lifecycle, State
from kafka_txn.state import PreparedTxnState
from kafka_txn.tracing import RECOVERY_SPAN, TRANSACTION_SPAN, Tracing

if TYPE_CHECKING:
    from confluent_kafka import Message
    from opentelemetry.trace import Span

    from kafka_txn.twophase.prepare import TwoPhase

__all__ = ["TransactionEnded", "TransactionWatch", "counts_deliveries"]

TransactionEnded = Callable[[str, str, int, int], None]
"""``(transactional_id, outcome, records, value_bytes)``: the metrics hook's
``transaction_ended``."""


def counts_deliveries(metrics: object, tracing: object) -> bool:
    """Whether a producer with this ``metrics`` hook and ``tracing`` watches each
    transaction, counting its delivered records from the success reports."""
    return tracing is not None or callable(getattr(metrics, "transaction_ended", None))


COMMITTED, ABORTED, FAILED, UNKNOWN, IN_DOUBT = (
    "committed", "aborted", "failed", "unknown", "in_doubt",
)  # fmt: skip


def _after_fatal(life: Lifecycle) -> str:
    """The outcome of a transaction whose producer became unusable."""
    if life.fatal_from is State.IN_DOUBT:
        return UNKNOWN  # the commit was sent and may be applied (Completion, TwoPhase)
    if life.fatal_from is State.PREPARED:
        return IN_DOUBT  # left to its decider or recovery
    return FAILED


_AT_CLOSE = {
    State.PREPARED: IN_DOUBT,
    State.IN_DOUBT: IN_DOUBT,
    State.COMMITTING: UNKNOWN,
}
"""The outcome of a transaction ``close()`` found open, by the state it found; any other
open state is aborted by close() or, failing that, by the coordinator."""


class TransactionWatch:
    """Counts and outcome of the open transaction of one producer, reported to its
    tracing and its metrics hook."""

    __slots__ = (
        "_ended",
        "_life",
        "_open",
        "_span",
        "_tracing",
        "_twophase",
        "records",
        "transactional_id",
        "value_bytes",
    )

    def __init__(
        self,
        transactional_id: str,
        *,
        tracing: Tracing | None,
        ended: TransactionEnded | None,
    ) -> None:
        self.transactional_id = transactional_id
        self.records = 0
        self.value_bytes = 0
        self._life = Lifecycle(transactional_id)
        self._tracing = tracing
        self._ended = ended
        self._twophase: TwoPhase | None = None
        self._span: Span | None = None
        self._open = False
        """A transaction was begun and has not ended (its outcome not reported yet)."""
        """The open transaction's span (tracing on, a transaction begun and not ended)."""

    def attach(self, life: Lifecycle, twophase: TwoPhase | None) -> None:
        """The producer's lifecycle, and its two-phase commit (which knows its producer
        id/epoch): built after the watch, whose delivery callback goes into librdkafka's
        config."""
        self._life = life
        self._twophase = twophase

    # ------------------------------------------------------------ deliveries
    def counting(
        self, user: Callable[[ProduceFailedException | None, Message], None] | None
    ) -> Callable[[ProduceFailedException | None, Message], None]:
        """The delivery callback the producer's bookkeeping calls for every report: counts a
        delivered record, then calls ``user`` (the config's ``on_delivery``) if any."""

        def on_delivery(err: ProduceFailedException | None, msg: Message) -> None:
            if err is None:
                self.records += 1
                self.value_bytes += len(msg)
            if user is not None:
                user(err, msg)

        return on_delivery

    # ------------------------------------------------------------ the transaction span
    def began(self) -> None:
        """begin_transaction() succeeded; if the previous transaction's abort had run out
        of time, begin finished it first (``Completion.begin``): it ended aborted."""
        if self._open:
            self.end(ABORTED)
        self.records = 0
        self.value_bytes = 0
        self._open = True
        if self._tracing is not None:
            self._span = self._tracing.start(
                TRANSACTION_SPAN,
                self._attributes("transaction", operation_type="send"),
                root=True,
            )

    @contextmanager
    def call(self, operation: str, done: str | None) -> Iterator[None]:
        """A transactional call on the open transaction (``done``: its outcome when it
        leaves the producer ready; None when the caller reports it with ``end``)."""
        self._note_identity()
        try:
            yield
        except BaseException as exc:
            self.failed(exc)
            self._settle(done)
            raise
        self._settle(done)

    @contextmanager
    def child(self, operation: str, name: str) -> Iterator[dict[str, Any]]:
        """A call with a span of its own under the transaction's (prepare, complete).
        Yields a dict of attributes for that span; the ``kafka_txn.transaction.outcome``
        the call puts there is the transaction's when the call leaves the producer ready.
        The child span ends before the transaction's."""
        extra: dict[str, Any] = {}
        self._note_identity()
        tracing = self._tracing
        span = None
        if tracing is not None:
            span = tracing.start(name, self._attributes(operation), self._span, root=False)
        try:
            yield extra
        except BaseException as exc:
            if span is not None and tracing is not None:
                tracing.failed(span, exc)
                span.set_attributes(extra)
                span.end()
            self.failed(exc)
            self._settle(None)
            raise
        if span is not None:
            span.set_attributes(extra)
            span.end()
        self._settle(extra.get("kafka_txn.transaction.outcome"))

    def failed(self, exc: BaseException) -> None:
        """A call of the transaction, or the body of ``transaction()``, raised ``exc``."""
        if self._span is not None and self._tracing is not None:
            self._tracing.failed(self._span, exc)

    def identified(self, state: PreparedTxnState, extra: dict[str, Any]) -> None:
        """prepare_transaction() returned ``state``: the transaction's producer id/epoch,
        on the transaction span and in ``extra`` (the prepare span's attributes)."""
        if state.producer_id is None:
            return  # the empty state: nothing was sent
        ids = {
            "kafka_txn.producer_id": state.producer_id,
            "kafka_txn.producer_epoch": state.producer_epoch or 0,
        }
        extra.update(ids)
        if self._span is not None:
            self._span.set_attributes(ids)

    def end(self, outcome: str) -> None:
        """The open transaction ended with ``outcome``: report it once."""
        if not self._open:
            return
        self._open = False
        span, self._span = self._span, None
        if span is not None:
            span.set_attribute("messaging.batch.message_count", self.records)
            span.set_attribute("kafka_txn.transaction.value_bytes", self.value_bytes)
            span.set_attribute("kafka_txn.transaction.outcome", outcome)
            span.end()
        if self._ended is not None:
            self._ended(self.transactional_id, outcome, self.records, self.value_bytes)
        self.records = 0
        self.value_bytes = 0

    def closed(self, found: State) -> None:
        """close() ran in state ``found``: end a transaction it found open."""
        if found in (State.NEW, State.READY, State.RECOVERING, State.CLOSED):
            return
        if found is State.FATAL:
            self.end(_after_fatal(self._life))
        else:
            self.end(_AT_CLOSE.get(found, ABORTED))

    def _settle(self, done: str | None) -> None:
        state = self._life.state
        if state is State.READY and done is not None:
            self.end(done)
        elif state is State.FATAL:
            self.end(_after_fatal(self._life))

    # ------------------------------------------------------------ recovery
    @contextmanager
    def recovery(
        self, stored: PreparedTxnState | None, done: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Recovery of a kept transaction: a span of its own; yields a dict the call sets
        ``kafka_txn.transaction.outcome`` in when it returns (default: ``done``)."""
        extra: dict[str, Any] = {}
        if self._tracing is None:
            yield extra
            return
        attributes = self._attributes("recovery")
        if stored is not None and stored.producer_id is not None:
            attributes["kafka_txn.producer_id"] = stored.producer_id
            attributes["kafka_txn.producer_epoch"] = stored.producer_epoch or 0
        span = self._tracing.start(RECOVERY_SPAN, attributes, root=False)
        try:
            yield extra
        except BaseException as exc:
            extra.setdefault("kafka_txn.transaction.outcome", _recovery_failure(exc))
            self._tracing.failed(span, exc)
            raise
        else:
            if done is not None:
                extra.setdefault("kafka_txn.transaction.outcome", done)
        finally:
            span.set_attributes(extra)
            span.end()

    # ------------------------------------------------------------ helpers
    def _attributes(self, operation: str, operation_type: str | None = None) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.name": operation,
            "messaging.client.id": self.transactional_id,
            "kafka_txn.transactional_id": self.transactional_id,
        }
        if operation_type is not None:
            attributes["messaging.operation.type"] = operation_type
        return attributes

    def _note_identity(self) -> None:
        """The producer id/epoch the producer knows now (two-phase commit: read from
        librdkafka's statistics), on the transaction span."""
        if self._span is None or self._twophase is None:
            return
        identity = self._twophase.identity.identity
        if identity is not None:
            self._span.set_attribute("kafka_txn.producer_id", identity[0])
            self._span.set_attribute("kafka_txn.producer_epoch", identity[1])


def _recovery_failure(exc: BaseException) -> str:
    if isinstance(exc, TransactionDivergedError):
        return "diverged"
    if isinstance(exc, TransactionOutcomeUnknowableError):
        return "unknowable"
    return FAILED
