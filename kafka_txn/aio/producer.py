"""``AsyncTransactionalProducer``: ``TransactionalProducer`` for asyncio applications.

It is a ``TransactionalProducer`` (the same lifecycle table, error classes and
guarantees: the sync producer is its core, not a copy) whose blocking calls run on a
thread of its own (``bridge.SerialWorker``), one at a time, in the order they were
awaited, and whose callbacks (delivery reports, ``error_cb``, ``stats_cb``, ``logger``)
run on the event loop (``bridge.LoopCalls``), never on librdkafka's threads. A thread
polls librdkafka for delivery reports while the producer is open. An exception a
callback raises is raised, as by the sync producer, by the call that served the
callback once that call succeeded (init, commit, abort, complete, close; a note says
so), or else by the next transactional call or ``flush()``.

A send never blocks the loop: librdkafka's ``produce()`` only queues the record; when its
queue is full, the send waits for room with ``await`` (up to ``queue_full_timeout``), not
in librdkafka.

Cancellation (``asyncio.CancelledError``: a task cancelled, ``asyncio.timeout()``
expiring) of a call: a call that ends or settles a transaction (commit, complete,
prepare, abort, close, the end of ``transaction()``) runs to its end even if its caller
is cancelled, and so does any call already running in librdkafka (it cannot be
interrupted); another call (init, begin, send_offsets) that the worker has not taken up
yet never runs. The next call waits for the one that runs on. What each call then does:

- ``init_transactions``: calling it again adopts the outcome of the cancelled one (if that
  succeeded, it returns at once), or runs it again.
- ``begin_transaction``: undone: a transaction it began is aborted (nothing was sent in it).
- ``prepare_transaction``: undone: once it ended, the transaction is aborted, since its
  state never reached the caller, so nobody can have stored the decision to commit it.
- ``commit_transaction``, ``complete_transaction``: run, never aborted (the commit may
  reach the coordinator); ``state`` then says how it ended, and a log line of
  ``kafka_txn.aio`` too.
- ``abort_transaction``, ``close``: run; a producer whose close was called ends closed.
- ``send_offsets_to_transaction``: whether it ran or not, the transaction cannot commit
  any more (the caller cannot know whether the offsets are in it): abort it.
- ``send``/``produce`` waiting for room in a full queue: the record was not queued, and
  its transaction cannot commit without it (as a record that found no room in time). A
  send whose transaction ended while it waited raises ``IllegalStateError``: a record is
  never queued into a later transaction than the one it was sent in.
- waiting on a ``send()``'s future: only the wait ends; the record stays in the
  transaction.
- ``async with producer.transaction()``: a body cancelled is aborted, as any exception,
  and the CancelledError propagates (a callback's exception pending then is left to the
  next call); its begin cancelled is undone as ``begin_transaction``'s; its commit
  cancelled runs on (also while waiting for its turn), with the same end as the sync
  ``transaction()`` (a commit that fails with ``CommitFailedException`` is aborted).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import KafkaError, Message, TopicPartition

from kafka_txn.aio.bridge import LoopCalls, SerialWorker, log_outcome, running_loop
from kafka_txn.classification import produce_failure
from kafka_txn.config import ProducerSettings
from kafka_txn.errors import IllegalStateError, ProduceFailedException
from kafka_txn.metrics import MetricsHook
from kafka_txn.producer import arguments
from kafka_txn.producer.delivery import _add_note
from kafka_txn.producer.lifecycle import State
from kafka_txn.producer.sending import Serializer
from kafka_txn.producer.transactional import TransactionalProducer
from kafka_txn.state import PreparedTxnState
from kafka_txn.tracing import Tracing
from kafka_txn.twophase.recovery import TransactionOutcome

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["AsyncTransactionalProducer"]

log = logging.getLogger("kafka_txn.aio")

T = TypeVar("T")

AsyncDeliveryCallback = Callable[[ProduceFailedException | None, Message], Any]
"""``produce(on_delivery=...)``: called on the event loop with the record's failure (or
None) and its ``Message``."""

_LOOP_CALLBACKS = ("on_delivery", "error_cb", "stats_cb", "throttle_cb")
"""Config callbacks run on the event loop. ``oauth_cb`` is not one of them: librdkafka
waits for its return value, on its own thread."""

_IDLE_WAIT = 0.1
"""How long the polling thread waits, with nothing queued, before it polls again (a send
wakes it at once): for statistics and error callbacks."""

_IN_FLIGHT_PAUSE = 0.001
"""The polling thread's pause between two polls while records are queued or in flight:
how late, at most, a delivery report is served outside a commit. It never waits inside
librdkafka (see ``SerialWorker.serving``)."""

_ROOM_WAITS = (0.001, 0.005, 0.02, 0.05)
"""The pauses of a send waiting for room in a full queue, growing to the last."""

_UNDO_STATES = frozenset({State.IN_TRANSACTION, State.ABORTABLE, State.PREPARED})

_SURFACING = frozenset(
    {
        "init_transactions",
        "commit_transaction",
        "abort_transaction",
        "complete_transaction",
        "close",
    }
)
"""The calls that raise a callback's exception once they succeeded, as the sync ones do
(``Completion.raise_callback_error``: guarantee 1.7). The others raise one pending
before they run, and nothing is done (the sync begin_transaction() does so)."""


class _LoopLogger:
    """A ``logger`` for librdkafka's log lines whose ``log()`` runs on the event loop."""

    def __init__(self, logger: Any, calls: LoopCalls) -> None:
        self._logger = logger
        self._calls = calls

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        self._calls.call(self._logger.log, level, msg, *args)


class _Settle:
    """A send's delivery report, handed to the event loop to settle its future."""

    __slots__ = ("_calls", "_future")

    def __init__(self, future: asyncio.Future[Message], calls: LoopCalls) -> None:
        self._future = future
        self._calls = calls

    def __call__(self, failure: ProduceFailedException | None, msg: Message) -> None:
        self._calls.call(_settle, self._future, failure, msg)


def _settle(
    future: asyncio.Future[Message], failure: ProduceFailedException | None, msg: Message
) -> None:
    if future.done():  # the waiter was cancelled: the record is in the transaction all the same
        return
    if failure is None:
        future.set_result(msg)
    else:
        future.set_exception(failure)
        # The failure is the transaction's too (the commit raises it): a future nobody
        # awaits must not also log "exception was never retrieved".
        future.exception()


class AsyncTransactionalProducer:
    """A transactional producer for asyncio: ``TransactionalProducer``'s calls, awaitable.

    Arguments as for ``TransactionalProducer``. Create it inside a running event loop
    (in a coroutine: a FastAPI lifespan, ``asyncio.run(main())``); callbacks given in
    ``config`` (``on_delivery``, ``error_cb``, ``stats_cb``, ``throttle_cb``, ``logger``)
    run on that loop. ``async with AsyncTransactionalProducer(...) as producer:`` closes
    it at the end.

    Several tasks may send at once; the transactional calls run one at a time, in the
    order they were awaited. What cancelling each call does is in the module docstring
    and in docs/guarantees.md.
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
    ) -> None:
        loop = running_loop("AsyncTransactionalProducer")
        conf = config.to_librdkafka() if isinstance(config, ProducerSettings) else config
        if not isinstance(conf, Mapping):
            raise TypeError(
                "AsyncTransactionalProducer(config) must be a dict of librdkafka settings "
                f"or a ProducerSettings, got {type(config).__name__}"
            )
        self._callback_error: BaseException | None = None
        """The first exception a callback raised on the loop, for the next call."""
        # Through a weak reference: the sync producer's callbacks hold these calls, and
        # must not keep this object alive (see the polling thread below).
        self._calls = LoopCalls(loop, _weakly(self._callback_failed))
        self._sync = TransactionalProducer(
            self._on_loop(conf),
            key_serializer=key_serializer,
            value_serializer=value_serializer,
            operation_timeout=operation_timeout,
            queue_full_timeout=queue_full_timeout,
            prepare_min_time_left=prepare_min_time_left,
            metrics=metrics,
            tracing=tracing,
        )
        self._queue_full_timeout = queue_full_timeout  # checked by TransactionalProducer
        self._sync._sends.defer_full_queue = True  # the wait for room is awaited (send)
        self.transactional_id = self._sync.transactional_id
        self._worker = SerialWorker(f"kafka-txn-{self.transactional_id}")
        self._cancelled_init: tuple[concurrent.futures.Future[None], bool] | None = None
        """An init_transactions() whose caller was cancelled while it ran, and its
        keep_prepared_txn: the next init_transactions() adopts its success."""
        self._turn = asyncio.Lock()
        """transaction()'s: one at a time, tasks in the order they came."""
        self._polling = threading.Event()
        self._polling.set()
        # The thread holds the sync producer, never this object: a producer dropped
        # without close() is collected, and its finalizer stops the thread (which then
        # lets librdkafka's handle go), as a dropped TransactionalProducer is.
        self._wake = threading.Event()
        """Set by a send: the polling thread, idle, polls again at once."""
        self._poller = threading.Thread(
            target=_poll_reports,
            args=(self._sync, self._polling, self._worker.serving, self._wake),
            name=f"kafka-txn-poll-{self.transactional_id}",
            daemon=True,
        )
        self._poller.start()
        weakref.finalize(self, self._polling.clear)

    # ------------------------------------------------------------------ plumbing
    def _on_loop(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        """``conf`` with its callbacks and logger made to run on the event loop."""
        calls = self._calls
        moved = dict(conf)
        for key in _LOOP_CALLBACKS:
            cb = moved.get(key)
            if callable(cb):
                moved[key] = _hop(cb, calls)
        logger = moved.get("logger")
        if logger is not None and callable(getattr(logger, "log", None)):
            moved["logger"] = _LoopLogger(logger, calls)
        return moved

    def _callback_failed(self, exc: BaseException) -> None:
        """A callback raised on the loop: the producer's next call raises it
        (``_raise_callback_error``, ``_raise_pending``, ``flush``). Kept here, on the
        loop, not in the sync producer's stash: a sync call running on the worker would
        raise it or not depending on whether the loop ran the callback before the call
        looked (a prepare would fail, or not, by a race); the first one wins."""
        if self._callback_error is None:
            self._callback_error = exc

    async def _run(
        self,
        call: str,
        fn: Callable[..., T],
        *args: Any,
        on_cancel: Callable[[concurrent.futures.Future[T]], None] | None = None,
        shielded: bool = False,
    ) -> T:
        """Run ``fn(*args)`` on the worker and await it. Cancelled before the worker took
        it up, it never runs, unless ``shielded``; cancelled while it runs (or shielded),
        it runs on, and ``on_cancel(job)`` is called at once (it may submit a job, which
        runs right after this one)."""
        if call != "init_transactions":
            self._cancelled_init = None  # another call came first: init is done with
        if call not in _SURFACING:
            self._raise_pending(call)
        job = self._worker.submit(fn, *args)
        waiter = asyncio.wrap_future(job)  # cancelling it would cancel a job not taken up
        try:
            result = await (asyncio.shield(waiter) if shielded else waiter)
        except asyncio.CancelledError:
            if shielded:
                waiter.add_done_callback(_retrieved)  # its outcome is logged instead
            if shielded or not job.cancel():  # it is running, ran, or must run
                job.add_done_callback(log_outcome(f"{call}()", self.transactional_id))
                if on_cancel is not None:
                    on_cancel(job)
            raise
        self._raise_callback_error(call)
        return result

    async def _finish(self, call: str, fn: Callable[..., T], *args: Any, surface: bool = True) -> T:
        """Run ``fn(*args)`` on the worker, to its end even if the caller is cancelled
        (the end of a transaction: a commit, an abort). ``surface=False``: a callback's
        exception stays pending (for the abort of a cancelled body, whose
        CancelledError must propagate)."""
        job = self._worker.submit(fn, *args)
        waiter = asyncio.wrap_future(job)
        try:
            result = await asyncio.shield(waiter)
        except asyncio.CancelledError:
            waiter.add_done_callback(_retrieved)  # its outcome is logged instead
            job.add_done_callback(log_outcome(f"{call}()", self.transactional_id))
            raise
        if surface:
            self._raise_callback_error(call)
        return result

    def _raise_callback_error(self, call: str) -> None:
        """Once ``call`` succeeded, raise what a callback raised on the loop before or
        while it ran, with a note that ``call`` succeeded, if ``call`` is one of
        ``_SURFACING`` (as the sync call that served the callback raises it: guarantee
        1.7). The loop has run every callback the call served before it resumes the
        caller: ``LoopCalls`` handed them to the loop (``call_soon_threadsafe``) before
        the worker handed over the call's result. Any other call (prepare, whose state
        must reach the caller) leaves it to the next call."""
        if call in _SURFACING and self._callback_error is not None:
            self._raise_pending(call, done=True)

    def _raise_pending(self, call: str, *, done: bool = False) -> None:
        """Raise the pending callback exception, if any, itself (never wrapped), with a
        note: ``call`` succeeded (``done``), or ``call`` did nothing."""
        exc, self._callback_error = self._callback_error, None
        if exc is None:
            return
        state = self._sync._life.state.value
        did = f"{call}() succeeded" if done else f"{call}() did nothing"
        _add_note(
            exc,
            f"kafka-txn: this exception was raised by your callback; {did} (the producer "
            f"is now '{state}')" + (": do not retry or undo it" if call in _SURFACING else ""),
        )
        raise exc

    def _undo(self, undone: str) -> Callable[[concurrent.futures.Future[Any]], None]:
        """``on_cancel`` of a call whose effect is undone: once it has ended, the
        transaction it began or prepared is aborted (on the worker, next)."""

        def undo(job: concurrent.futures.Future[Any]) -> None:
            def abort() -> None:
                if job.cancelled() or self._sync._life.state not in _UNDO_STATES:
                    return
                if undone == "begin_transaction" and job.exception() is not None:
                    return  # it began nothing (another transaction may be open)
                try:
                    self._sync.abort_transaction()
                except Exception:
                    log.warning(
                        "%s() of %r was cancelled; aborting what it left failed",
                        undone, self.transactional_id, exc_info=True,
                    )  # fmt: skip

            self._worker.submit(abort)

        return undo

    # ------------------------------------------------------------------ properties
    @property
    def state(self) -> str:
        """The lifecycle's current state (``kafka_txn.producer.lifecycle.State`` value)."""
        return self._sync.state

    @property
    def error_reports_only(self) -> bool:
        """As ``TransactionalProducer.error_reports_only``: ``send()`` is refused."""
        return self._sync.error_reports_only

    @property
    def in_transaction(self) -> bool:
        """True between ``begin_transaction()`` and a successful commit or abort."""
        return self._sync.in_transaction

    def __len__(self) -> int:
        """Records queued or in flight."""
        return len(self._sync)

    def __repr__(self) -> str:
        return f"<AsyncTransactionalProducer {self.transactional_id!r} {self.state}>"

    # ------------------------------------------------------------------ transactions
    async def init_transactions(
        self, timeout: float | None = None, *, keep_prepared_txn: bool = False
    ) -> None:
        """``TransactionalProducer.init_transactions``. Cancelled, it can be called again:
        that call returns at once if the cancelled one succeeded, or runs it again."""
        timeout = arguments.timeout(timeout, "init_transactions")
        arguments.flag(keep_prepared_txn, "init_transactions", "keep_prepared_txn")

        def init() -> None:
            # Taken here, on the worker, once the cancelled call has ended (the worker
            # runs calls in order), not when this call is made: a call cancelled before
            # its turn never gets here and leaves the cancelled one to the next call.
            cancelled, self._cancelled_init = self._cancelled_init, None
            if (
                cancelled is not None
                and cancelled[1] == keep_prepared_txn
                and not cancelled[0].cancelled()
                and cancelled[0].exception() is None
            ):
                return  # the cancelled call initialised the producer
            self._sync.init_transactions(timeout, keep_prepared_txn=keep_prepared_txn)

        def remember(job: concurrent.futures.Future[None]) -> None:
            self._cancelled_init = (job, keep_prepared_txn)

        await self._run("init_transactions", init, on_cancel=remember)

    async def begin_transaction(self) -> None:
        """``TransactionalProducer.begin_transaction``. Cancelled, a transaction it began
        is aborted."""
        await self._run(
            "begin_transaction",
            self._sync.begin_transaction,
            on_cancel=self._undo("begin_transaction"),
        )

    async def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        on_delivery: AsyncDeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """Send one record in the open transaction; ``on_delivery(failure, message)``
        runs on the event loop. Returns once the record is queued (at once, unless the
        queue is full); raises as ``TransactionalProducer.produce``."""
        # One that is not callable goes as it is: the sync produce() refuses it
        # (TypeError) before queuing the record; wrapped, it would fail only on the loop.
        cb = _hop(on_delivery, self._calls) if callable(on_delivery) else on_delivery
        try:
            self._sync.produce(topic, value, key, partition, cb, timestamp, headers)
        except BufferError:
            await self._wait_for_room(topic, value, key, partition, cb, timestamp, headers)
        if not self._wake.is_set():
            self._wake.set()

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        timestamp: int = 0,
        headers: Any = None,
    ) -> asyncio.Future[Message]:
        """Send one record in the open transaction; returns, once it is queued, a future
        of its delivered ``Message`` (or its ``ProduceFailedException``), settled on the
        event loop. ``await (await producer.send(...))`` waits for the delivery. Refused
        (``IllegalStateError``) on an error-only producer, as the sync ``send()``."""
        if self._sync._errors_only:
            self._sync._refuse_futures("send")
        if self._sync._life.state is not State.IN_TRANSACTION:
            self._sync._life.refuse_send("send")  # the sync produce() would say produce()
        future: asyncio.Future[Message] = self._calls.loop.create_future()
        cb = _Settle(future, self._calls)
        try:
            self._sync.produce(topic, value, key, partition, cb, timestamp, headers)
        except BufferError:
            await self._wait_for_room(topic, value, key, partition, cb, timestamp, headers)
        if not self._wake.is_set():
            self._wake.set()
        return future

    async def send_and_wait(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        timestamp: int = 0,
        headers: Any = None,
    ) -> Message:
        """``send()``, then wait for the delivery: the delivered ``Message``."""
        return await (await self.send(topic, value, key, partition, timestamp, headers))

    async def _wait_for_room(self, topic: str, *args: Any) -> None:
        """The queue was full: try again after growing pauses, the polling thread serving
        reports meanwhile, until ``queue_full_timeout``; then the record fails as in the
        sync producer. Cancelled, the record was not queued and the transaction cannot
        commit without it."""
        sync = self._sync
        deliveries = sync._deliveries
        generation = deliveries.generation  # the transaction this send belongs to
        deadline = time.monotonic() + self._queue_full_timeout
        attempt = 0
        try:
            while True:
                await asyncio.sleep(_ROOM_WAITS[min(attempt, len(_ROOM_WAITS) - 1)])
                attempt += 1
                if deliveries.generation != generation:
                    # Its transaction ended while it waited (the body raised, another
                    # task aborted it): the record must not go into the next one.
                    raise IllegalStateError(
                        f"send to {topic!r}: the transaction it was made in ended while it "
                        "waited for room in the full queue; the record was not sent"
                    )
                try:
                    sync.produce(topic, *args)
                    return
                except BufferError:
                    if time.monotonic() >= deadline:
                        partition, key = args[2], args[1]
                        raise sync._sends.queue_full(topic, partition, key) from None
        except asyncio.CancelledError:
            self._poison(
                generation,
                "a send waiting for room in the full queue was cancelled: the record was "
                "not sent, so this transaction cannot commit; abort it",
                topic,
                args[2],
                args[1] if isinstance(args[1], (bytes, str)) else None,
            )
            raise

    def _poison(
        self,
        generation: int,
        reason: str,
        topic: str | None = None,
        partition: int | None = None,
        key: bytes | str | None = None,
    ) -> None:
        """Make the transaction of ``generation`` uncommittable (a failed record with
        ``reason``), if it is still the open one: never a later transaction."""
        sync = self._sync
        if sync._deliveries.generation != generation or sync._life.state not in _UNDO_STATES:
            return
        err = KafkaError(KafkaError._INTR, reason)
        sync._deliveries.record_failure(produce_failure(err, topic, partition, key))

    async def send_offsets_to_transaction(
        self,
        offsets: Sequence[TopicPartition],
        group_metadata: Any,
        timeout: float | None = None,
    ) -> None:
        """``TransactionalProducer.send_offsets_to_transaction``. Cancelled, whether it
        ran or not, the transaction cannot commit (the caller cannot know whether the
        offsets are in it): abort it."""
        arguments.offsets(offsets, "send_offsets_to_transaction")
        generation = self._sync._deliveries.generation
        try:
            await self._run(
                "send_offsets_to_transaction",
                self._sync.send_offsets_to_transaction,
                offsets,
                group_metadata,
                timeout,
            )
        except asyncio.CancelledError:
            self._poison(
                generation,
                "send_offsets_to_transaction() was cancelled: whether the offsets are in "
                "this transaction is unknown, so it cannot commit; abort it",
            )
            raise

    async def commit_transaction(self, timeout: float | None = None) -> None:
        """``TransactionalProducer.commit_transaction``. Cancelled, it runs all the same
        (also when it had not started), and is never aborted."""
        await self._run("commit_transaction", self._sync.commit_transaction, timeout, shielded=True)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """``TransactionalProducer.abort_transaction``. Cancelled, it runs all the same."""
        await self._run("abort_transaction", self._sync.abort_transaction, timeout, shielded=True)

    async def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """``TransactionalProducer.prepare_transaction``. Cancelled, the transaction is
        aborted (after the prepare, which runs all the same): its state never reached
        the caller."""
        return await self._run(
            "prepare_transaction",
            self._sync.prepare_transaction,
            timeout,
            on_cancel=self._undo("prepare_transaction"),
            shielded=True,
        )

    async def complete_transaction(
        self,
        state: PreparedTxnState | str,
        *,
        before_init: Callable[[TransactionOutcome], Awaitable[None] | None] | None = None,
        timeout: float | None = None,
    ) -> TransactionOutcome:
        """``TransactionalProducer.complete_transaction``; ``before_init`` may be a
        coroutine function (it then runs on the event loop while the call waits for it).
        Cancelled while it runs, it runs on (a commit is never aborted)."""
        arguments.prepared_state(state, "complete_transaction")
        arguments.callback(before_init, "complete_transaction", "before_init")
        hook = None if before_init is None else self._blocking(before_init)
        return await self._run(
            "complete_transaction",
            lambda: self._sync.complete_transaction(state, before_init=hook, timeout=timeout),
            shielded=True,
        )

    def _blocking(
        self, fn: Callable[[TransactionOutcome], Awaitable[None] | None]
    ) -> Callable[[TransactionOutcome], None]:
        """``fn`` callable from the worker: a coroutine it returns runs on the loop, and
        the worker waits for it."""
        loop = self._calls.loop

        def call(outcome: TransactionOutcome) -> None:
            result = fn(outcome)
            if inspect.isawaitable(result):
                asyncio.run_coroutine_threadsafe(_awaited(result), loop).result()

        return call

    async def flush(self, timeout: float | None = None) -> int:
        """Wait until every queued record is delivered or failed; returns how many are
        still queued after ``timeout`` seconds (None: no limit). The polling thread
        serves the reports; cancelling the wait cancels nothing else."""
        timeout = arguments.wait(timeout, "flush", none="no limit")
        deadline = None if timeout is None else time.monotonic() + timeout
        sync = self._sync
        sync._life.raise_if_dead("flush")
        while len(sync) > 0:
            if deadline is not None and time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.002)
        # As the sync flush(): a callback's exception, then a fatal error, is raised.
        self._raise_pending("flush", done=True)
        sync._life.raise_if_dead("flush")
        return len(sync)

    async def close(self, timeout: float = 10.0) -> None:
        """``TransactionalProducer.close``, then the polling thread and the worker end.
        Cancelled, it runs on."""
        checked = arguments.wait(timeout, "close")
        assert checked is not None
        await self._finish("close", self._close, checked)

    def _close(self, timeout: float, *, abort_open: bool = True) -> None:
        self._polling.clear()
        self._wake.set()
        if self._poller.is_alive() and self._poller is not threading.current_thread():
            self._poller.join()
        try:
            self._sync._close(timeout, abort_open=abort_open)
        finally:
            self._worker.shutdown()

    async def __aenter__(self) -> AsyncTransactionalProducer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncTransactionalProducer]:
        """``async with producer.transaction():`` begins, commits on success, and aborts
        on an exception, cancellation included (re-raised); a ``CommitFailedException``
        is raised after the abort. Tasks entering it at once take turns (one
        transaction at a time), in the order they came. The sync producer's
        ``transaction()`` runs on the worker, its body here."""
        async with self._turn, self._scope() as producer:
            yield producer

    @asynccontextmanager
    async def _scope(self) -> AsyncIterator[AsyncTransactionalProducer]:
        scope = self._sync.transaction()
        await self._run("begin_transaction", scope.__enter__, on_cancel=self._leave(scope))
        try:
            yield self
        except BaseException as exc:
            # The sync scope aborts and re-raises ``exc`` (its __exit__ then returns
            # False), or raises what the abort raised.
            await self._finish(
                "abort_transaction", scope.__exit__, type(exc), exc, None,
                surface=not isinstance(exc, asyncio.CancelledError),
            )  # fmt: skip
            raise
        await self._finish("commit_transaction", scope.__exit__, None, None, None)

    def _leave(
        self, scope: AbstractContextManager[Any]
    ) -> Callable[[concurrent.futures.Future[Any]], None]:
        """``on_cancel`` of the begin of ``transaction()``: once the sync ``scope`` has
        begun, it is left on the worker, next, as by a body cancelled at once (its
        abort). Left open, the suspended generator would abort in its finalizer,
        whenever and on whichever thread it is collected: the event loop's, say, while
        a later transaction is open (an exception kept by the caller keeps it alive)."""

        def undo(job: concurrent.futures.Future[Any]) -> None:
            def leave() -> None:
                if job.cancelled() or job.exception() is not None:
                    return  # the scope began nothing, and its generator has ended
                cancelled = asyncio.CancelledError()
                try:
                    scope.__exit__(asyncio.CancelledError, cancelled, None)
                except asyncio.CancelledError:
                    pass  # the sync scope aborted and re-raised it
                except Exception:
                    log.warning(
                        "transaction() of %r was cancelled in its begin; aborting the "
                        "transaction it began failed", self.transactional_id, exc_info=True,
                    )  # fmt: skip

            self._worker.submit(leave)

        return undo

    # ------------------------------------------------------------------ for AsyncDualWriter
    def _call_blocking(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Submit ``fn(*args)`` to this producer's worker (``kafka_txn.aio.dualwrite``)."""
        return self._worker.submit(fn, *args)


def _poll_reports(
    sync: TransactionalProducer,
    polling: threading.Event,
    serving: threading.Lock,
    wake: threading.Event,
) -> None:
    """The polling thread: serves delivery reports and callbacks until close() (or the
    producer is collected) clears ``polling``.

    Each poll is non-blocking and made holding ``serving``, which every worker call
    holds while it runs: a commit's flush then serves its reports alone, and never waits
    out a 10 ms slice for a report this thread took. Between polls it pauses
    ``_IN_FLIGHT_PAUSE`` while records are queued or in flight, else waits for ``wake``
    (a send sets it) up to ``_IDLE_WAIT``.

    The callbacks it serves only hand themselves to the loop, which keeps what they
    raise (``AsyncTransactionalProducer._callback_failed``); ``defer_callback_errors``
    all the same, so that nothing stashed is ever raised here, where nobody would see
    it. A fatal error stays recorded in the lifecycle, for every call."""
    io, producer = sync._io, sync._producer
    while polling.is_set():
        # With a timeout: close() holds ``serving`` on the worker while it waits for
        # this thread to end.
        if not serving.acquire(timeout=_IDLE_WAIT):
            continue
        served = 0
        try:
            served = io.call("poll", producer.poll, 0, defer_callback_errors=True)
        except Exception:  # a fatal error, or a closed handle's: the next call sees it
            if not polling.is_set():
                return
            log.debug("poll of %r failed", sync.transactional_id, exc_info=True)
        finally:
            serving.release()
        if served:
            continue
        wake.clear()
        if len(producer) > 0:
            time.sleep(_IN_FLIGHT_PAUSE)
        else:
            wake.wait(_IDLE_WAIT)


def _weakly(method: Callable[[BaseException], None]) -> Callable[[BaseException], None]:
    """``method``, holding its object weakly (a no-op once the object is gone)."""
    ref = weakref.WeakMethod(method)

    def call(exc: BaseException) -> None:
        bound = ref()
        if bound is not None:
            bound(exc)

    return call


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Marks a future's exception as retrieved (asyncio logs one nobody retrieved)."""
    if not future.cancelled():
        future.exception()


def _hop(cb: Callable[..., Any], calls: LoopCalls) -> Callable[..., None]:
    """``cb`` run on the event loop instead of the calling thread."""

    def on_loop(*args: Any) -> None:
        calls.call(cb, *args)

    return on_loop


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
