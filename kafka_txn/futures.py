"""``DeliveryFuture``: the result of ``TransactionalProducer.send()``.

confluent-kafka serves delivery reports only inside ``poll()``/``flush()``, on the calling
thread, so a future that merely waited would wait forever in a single-threaded program.
``result()`` therefore drives the producer's ``poll()`` until the report arrives. The class
is deliberately lighter than ``concurrent.futures.Future`` (which builds a lock and a
condition per instance, about 1.5 µs): send() must stay close to produce() in cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .errors import ProduceFailedException

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

__all__ = ["DeliveryFuture"]

_PENDING = object()


class _Owner(Protocol):
    """What a future needs of its producer."""

    _user_on_delivery: Callable[..., None] | None

    def poll(self, timeout: float = 0) -> int: ...

    def _stash_callback_error(self, exc: BaseException) -> None: ...

    def _on_delivery(
        self, err: KafkaError | None, msg: Message
    ) -> ProduceFailedException | None: ...


class DeliveryFuture:
    """The delivery outcome of one record: its ``Message`` or a
    ``ProduceFailedException``."""

    __slots__ = ("_callbacks", "_error", "_message", "_owner")

    def __init__(self, owner: _Owner) -> None:
        self._owner: _Owner | None = owner
        self._message: object = _PENDING
        self._error: ProduceFailedException | None = None
        self._callbacks: list[Callable[[DeliveryFuture], None]] | None = None

    def done(self) -> bool:
        """True once the record was delivered or failed."""
        return self._message is not _PENDING or self._error is not None

    def result(self, timeout: float | None = None) -> Message:
        """The delivered ``Message``; raises the record's ``ProduceFailedException``, or
        ``TimeoutError`` if no report arrived within ``timeout`` seconds."""
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._message  # type: ignore[return-value]

    def exception(self, timeout: float | None = None) -> ProduceFailedException | None:
        """The record's failure, or None if it was delivered."""
        self._wait(timeout)
        return self._error

    def add_done_callback(self, fn: Callable[[DeliveryFuture], None]) -> None:
        """Call ``fn(self)`` when the outcome is known (at once if it already is)."""
        if self.done():
            fn(self)
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(fn)

    def _wait(self, timeout: float | None) -> None:
        if self.done():
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            step = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if step <= 0:
                raise TimeoutError("no delivery report yet; call flush() or wait longer")
            owner = self._owner
            if owner is None:  # pragma: no cover - resolved meanwhile by another thread
                return
            owner.poll(step)

    def _deliver(self, err: KafkaError | None, msg: Message) -> None:
        """librdkafka's delivery report for this record (the per-message callback)."""
        owner, self._owner = self._owner, None  # keep nothing of the producer once resolved
        if err is None:
            self._message = msg
            if owner is not None and owner._user_on_delivery is not None:
                owner._on_delivery(None, msg)
        elif owner is not None:
            self._error = owner._on_delivery(err, msg)
        if self._callbacks is not None:
            callbacks, self._callbacks = self._callbacks, None
            for fn in callbacks:
                try:
                    fn(self)
                except BaseException as exc:  # raised later, outside librdkafka's stack
                    if owner is not None:
                        owner._stash_callback_error(exc)

    def __repr__(self) -> str:
        if not self.done():
            state = "pending"
        elif self._error is not None:
            state = f"failed: {self._error.failure_type.name}"
        else:
            state = "delivered"
        return f"<DeliveryFuture {state}>"
