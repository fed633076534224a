"""The completion marks: a transaction committed to Kafka has its state stored marked
completed (``PreparedTxnState.mark_completed()``) soon after, by a background thread,
before anything can bump the producer epoch or the transactional id can expire, so that
a later recovery never has to ask Kafka about a transaction it may have forgotten.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from kafka_txn.errors import KafkaTxnError
from kafka_txn.state import PreparedTxnState

log = logging.getLogger("kafka_txn.dualwrite")


class _CompletionMarks:
    """Stores ``state.mark_completed()`` for the last transaction committed to Kafka.

    Until then the state row holds that transaction's plain state, which recovery can
    settle only while Kafka still remembers it: an epoch bump (librdkafka's KIP-360 abort,
    a later transaction timing out) or the transactional id expiring
    (``transactional.id.expiration.ms``) would leave it unprovable. The next transaction's
    state write replaces the row anyway (``superseded``, no extra round trip); otherwise
    ``write`` runs ``delay`` seconds after the commit in a background thread, and
    ``flush()`` runs it at once (before an abort, at close). ``write`` is a compare-and-set,
    so it never overwrites a newer state, and running it twice is harmless."""

    def __init__(
        self,
        write: Callable[[PreparedTxnState, Connection | None], object],
        delay: float | None,
        name: str,
    ) -> None:
        self._write = write
        self._delay = delay
        self._name = name
        self._cond = threading.Condition()
        self._pending: PreparedTxnState | None = None
        self._due = 0.0
        self._held = False
        self._idle = False
        self._closed = False
        self._failures = 0
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> PreparedTxnState | None:
        """The committed state not yet stored marked completed, if any."""
        return self._pending

    def committed(self, state: PreparedTxnState) -> None:
        """``state``'s transaction is committed in Kafka: mark it completed soon."""
        with self._cond:
            self._pending = state
            self._failures = 0
            if self._delay is None or self._closed:
                return
            self._due = time.monotonic() + self._delay
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"kafka-txn-mark-completed-{self._name}", daemon=True
                )
                self._thread.start()
            elif self._idle:
                self._cond.notify()

    def hold(self) -> None:
        """A transaction of this writer is under way: it carries the duty (its state
        write supersedes the mark; its rollback flushes it before aborting Kafka)."""
        with self._cond:
            self._held = True

    def release(self, superseded: bool) -> None:
        """The transaction ended; ``superseded`` if its database commit replaced the
        state row (then the pending mark is moot)."""
        with self._cond:
            self._held = False
            if superseded:
                self._pending = None
            elif self._pending is not None and self._idle:
                self._cond.notify()

    def flush(self, conn: Connection | None = None) -> bool:
        """Store the pending mark now (through ``conn``, idle, if given: a rollback
        must not wait for a second connection from a pool of one); False if that failed
        (logged)."""
        with self._cond:
            state = self._pending
        return state is None or self._store(state, conn)

    def close(self) -> bool:
        """Stop the background thread, then flush; False if the mark could not be
        stored."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        return self.flush()

    def _store(self, state: PreparedTxnState, conn: Connection | None = None) -> bool:
        try:
            self._write(state, conn)
        except (SQLAlchemyError, KafkaTxnError) as exc:
            with self._cond:
                self._failures += 1
            log.warning(
                "could not store the completed state of %r's last transaction (%s); it is "
                "tried again later, at the next abort, and at close()", self._name, exc,
                extra={"transactional_id": self._name, "operation": "mark_completed"},
            )  # fmt: skip
            return False
        with self._cond:
            if self._pending is state:
                self._pending = None
        return True

    def _run(self) -> None:
        cond = self._cond
        with cond:
            while not self._closed:
                if self._pending is None or self._held:
                    self._idle = True
                    cond.wait()
                    self._idle = False
                    continue
                wait = self._due - time.monotonic()
                if wait > 0:
                    cond.wait(wait)
                    continue
                state = self._pending
                cond.release()
                try:
                    stored = self._store(state)
                finally:
                    cond.acquire()
                if not stored and self._pending is state and self._delay is not None:
                    # Back off while the database is unreachable: delay * 2^n, up to 60 s.
                    backoff = min(60.0, self._delay * 2 ** min(self._failures, 16))
                    self._due = time.monotonic() + backoff
