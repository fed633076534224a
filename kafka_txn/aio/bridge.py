"""The two ways between an event loop and librdkafka's blocking calls.

- ``SerialWorker``: one thread per producer that runs its blocking calls (init, begin,
  commit, abort, prepare, complete, send_offsets, close) one at a time, in the order they
  were submitted, so that the event loop never waits on librdkafka. One thread, not a
  pool: a producer has one transaction, and its calls must not overtake each other.
- ``LoopCalls``: calls made on librdkafka's threads or the worker (delivery reports,
  ``error_cb``, ``stats_cb``, log lines) handed to the event loop, a batch per wake-up:
  one ``call_soon_threadsafe`` (a write to the loop's self-pipe) for all the calls that
  arrive before the loop gets to them, not one per record.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__ = ["LoopCalls", "SerialWorker", "log_outcome", "running_loop"]

log = logging.getLogger("kafka_txn.aio")

T = TypeVar("T")


class SerialWorker:
    """A thread that runs submitted calls one after the other (FIFO).

    A call cancelled before its turn never runs (``concurrent.futures.Future.cancel``
    succeeds only while it waits); once running, it runs to its end: librdkafka's calls
    cannot be interrupted.
    """

    def __init__(self, name: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._thread_ids: set[int] = set()
        self._closed = False
        self.serving = threading.Lock()
        """Held by each call while it runs, and by the polling thread around each
        non-blocking poll: librdkafka's flush (in commit, abort, prepare) serves the
        delivery reports in 10 ms waits (``rd_kafka_flush``), and a report another thread
        takes from under it leaves it waiting out that slice."""

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """``fn(*args)`` after the calls submitted before. After ``shutdown()`` (the
        producer is closed, where every call refuses at once or returns), it runs here."""
        if not self._closed:
            try:
                return self._pool.submit(self._run, fn, *args)
            except RuntimeError:  # shut down since the check, by the job that closed
                pass
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:
            done.set_exception(exc)
        return done

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        self._thread_ids.add(threading.get_ident())
        with self.serving:
            return fn(*args)

    def on_worker(self) -> bool:
        """Whether the calling thread is the worker (a job submitting another would wait
        for itself)."""
        return threading.get_ident() in self._thread_ids

    def shutdown(self) -> None:
        """No more calls; the one running finishes (not waited for here), and so do the
        calls already waiting for their turn: they find the producer closed and refuse
        (IllegalStateError), as a call made after close() does. Cancelling them instead
        would raise CancelledError in tasks nobody cancelled."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=False)


class LoopCalls:
    """Calls from any thread, run on ``loop`` in order of arrival."""

    __slots__ = ("_loop", "_pending", "_scheduled", "on_error")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_error: Callable[[BaseException], None]
    ) -> None:
        self._loop = loop
        self._pending: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._scheduled = False
        self.on_error = on_error
        """What an exception raised by a call is handed to (on the loop)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop, soon. From any thread. Dropped, with a debug
        log line, once the loop is closed (the application is shutting down)."""
        # Append first, then look at the flag: a drain that reset the flag before this
        # append is followed by another (see _drain), and one that resets it after the
        # check drains this call too. deque.append and the attribute reads are atomic
        # under the GIL.
        self._pending.append((fn, args))
        if self._scheduled:
            return
        self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed
            self._scheduled = False
            self._pending.clear()
            log.debug("event loop closed: %r not delivered", fn)

    def _drain(self) -> None:
        self._scheduled = False
        pending = self._pending
        while pending:
            fn, args = pending.popleft()
            try:
                fn(*args)
            except BaseException as exc:  # a user callback's: raised by the next call
                self.on_error(exc)


class _Outcome(Protocol):
    """A finished call: an ``asyncio.Task`` or a ``concurrent.futures.Future``."""

    def cancelled(self) -> bool: ...

    def exception(self) -> BaseException | None: ...


def log_outcome(call: str, transactional_id: str) -> Callable[[Any], None]:
    """A done callback that logs how ``call``, whose caller was cancelled while it ran
    on, ended: the caller got ``CancelledError``, so this line is where it is told."""

    def logged(done: _Outcome) -> None:
        if done.cancelled():
            return
        exc = done.exception()
        if exc is None:
            log.info("%s of %r, whose caller was cancelled, succeeded", call, transactional_id)
        else:
            log.warning(
                "%s of %r, whose caller was cancelled, raised %s: %s",
                call, transactional_id, type(exc).__name__, exc,
            )  # fmt: skip

    return logged


def running_loop(owner: str) -> asyncio.AbstractEventLoop:
    """The running event loop, which ``owner``'s callbacks will run on; outside one, a
    RuntimeError that says where to create ``owner``."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            f"{owner} must be created inside a running event loop: create it in a "
            "coroutine (asyncio.run(main()), a FastAPI lifespan)"
        ) from None
