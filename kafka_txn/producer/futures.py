"""``DeliveryFuture``: the result of ``TransactionalProducer.send()``.

confluent-kafka serves delivery reports only inside ``poll()``/``flush()``, on the calling
thread, so a future that merely waited would wait forever in a single-threaded program.
``result()`` therefore drives the producer's ``poll()`` until the report arrives.

The class is built for the hot path: ``concurrent.futures.Future`` builds a lock and a
condition per instance (about 1.5 µs); this one has two slots (48 bytes), is itself the
delivery callback, and ``send()`` builds it with a C-level ``DeliveryFuture()`` call (no
``__init__`` frame) and two stores. The rare done-callbacks live with the producer's
delivery bookkeeping (``Deliveries.waiting``), not in every future. Each pending future
is still one object the garbage collector tracks, which is part of what ``send()`` costs
over ``produce()`` (docs/performance.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from kafka_txn.errors import ProduceFailedException

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

__all__ = ["DeliveryFuture"]


class _Pending:
    """Marker for an outcome not known yet."""


_PENDING = _Pending()


class _Owner(Protocol):
    """What a future needs of its producer's delivery bookkeeping
    (``kafka_txn.producer.delivery.Deliveries``)."""

    user_on_delivery: Callable[..., None] | None
    poll: Callable[[float], int]
    waiting: dict[DeliveryFuture, list[Callable[[DeliveryFuture], None]]]

    def stash_callback_error(self, exc: BaseException) -> None: ...

    def on_delivery(
        self, err: KafkaError | None, msg: Message
    ) -> ProduceFailedException | None: ...

    def failed_report(self, err: KafkaError, msg: Message) -> ProduceFailedException: ...


class DeliveryFuture:
    """The delivery outcome of one record: its ``Message`` or a
    ``ProduceFailedException``. ``TransactionalProducer.send()`` makes them."""

    __slots__ = ("_outcome", "_owner")

    # send() sets both, the report sets _outcome and then clears _owner: a future whose
    # owner is gone is resolved.
    _owner: _Owner | None
    _outcome: Message | ProduceFailedException | _Pending

    def done(self) -> bool:
        """True once the record was delivered or failed."""
        return self._outcome is not _PENDING

    def result(self, timeout: float | None = None) -> Message:
        """The delivered ``Message``; raises the record's ``ProduceFailedException``, or
        ``TimeoutError`` if no report arrived within ``timeout`` seconds."""
        outcome = self._wait(timeout)
        if isinstance(outcome, ProduceFailedException):
            raise outcome
        return outcome

    def exception(self, timeout: float | None = None) -> ProduceFailedException | None:
        """The record's failure, or None if it was delivered."""
        outcome = self._wait(timeout)
        return outcome if isinstance(outcome, ProduceFailedException) else None

    def add_done_callback(self, fn: Callable[[DeliveryFuture], None]) -> None:
        """Call ``fn(self)`` when the outcome is known (at once if it already is)."""
        owner = self._owner
        if owner is not None and self._outcome is _PENDING:
            waiting = owner.waiting
            waiting.setdefault(self, []).append(fn)
            if self._outcome is _PENDING:
                return  # the report, which looks after setting the outcome, runs it
            # The report came meanwhile and may have looked before fn was added: whoever
            # pops the entry (dict.pop is atomic under the GIL) runs its callbacks.
            callbacks = waiting.pop(self, None)
            for callback in callbacks or ():
                callback(self)
            return
        fn(self)

    def _wait(self, timeout: float | None) -> Message | ProduceFailedException:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            owner = self._owner  # first: the report clears it after setting the outcome
            outcome = self._outcome
            if not isinstance(outcome, _Pending):
                return outcome
            step = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if step <= 0 or owner is None:
                raise TimeoutError("no delivery report yet; call flush() or wait longer")
            owner.poll(step)

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        """librdkafka's delivery report for this record. The future is itself the
        per-message callback: a bound method would be one more object per record."""
        owner = self._owner
        if owner is None:  # pragma: no cover - librdkafka reports each record once
            return
        if err is None:
            self._outcome = msg
            if owner.user_on_delivery is not None:
                owner.on_delivery(None, msg)
        else:
            self._outcome = owner.failed_report(err, msg)
        self._owner = None  # keep nothing of the producer once resolved
        if owner.waiting:
            callbacks = owner.waiting.pop(self, None)
            for fn in callbacks or ():
                try:
                    fn(self)
                except BaseException as exc:  # raised later, outside librdkafka's stack
                    owner.stash_callback_error(exc)

    def __repr__(self) -> str:
        outcome = self._outcome
        if isinstance(outcome, ProduceFailedException):
            state = f"failed: {outcome.failure_type.name}"
        else:
            state = "pending" if isinstance(outcome, _Pending) else "delivered"
        return f"<DeliveryFuture {state}>"
