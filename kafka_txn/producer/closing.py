"""The body of ``TransactionalProducer.close()``: which open transaction it aborts, which
it leaves open (prepared or in doubt: its decider's; a commit whose outcome is unknown:
the coordinator's), whether confluent-kafka's own close() may run, and the release of
librdkafka's handle, which is destroyed by the time close() returns in every state.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException

from kafka_txn.errors import KafkaTxnError
from kafka_txn.producer.completion import Completion
from kafka_txn.producer.delivery import Deliveries
from kafka_txn.producer.librdkafka import Driver
from kafka_txn.producer.lifecycle import Lifecycle, State
from kafka_txn.twophase.prepare import TwoPhase

__all__ = ["ABORT_AFTER_FATAL", "Closing", "may_abort_after_fatal"]

log = logging.getLogger("kafka_txn.producer")

ABORT_AFTER_FATAL = frozenset(
    {State.IN_TRANSACTION, State.ABORTABLE, State.ABORTING, State.PREPARING}
)
"""States in which a fatal error leaves a transaction that close() may abort: open, and
never sent to commit (COMMITTING: the coordinator may have committed it, unless
librdkafka itself calls the error abortable: ``may_abort_after_fatal``) nor prepared
(PREPARED, IN_DOUBT: a decider may commit it; a prepare that failed, PREPARING, handed
no state to any decider)."""


def may_abort_after_fatal(state: State | None, fatal: KafkaError | None) -> bool:
    """Whether close() may abort the transaction a fatal error left in ``state``:
    ``ABORT_AFTER_FATAL``, or COMMITTING when librdkafka reported the error as abortable
    (``txn_requires_abort``: its commit failed before the coordinator committed, e.g. a
    topic not authorized found by the commit's flush; KIP-691 calls that fatal)."""
    if state in ABORT_AFTER_FATAL:
        return True
    return state is State.COMMITTING and fatal is not None and fatal.txn_requires_abort()


class Closing:
    """close() of one TransactionalProducer."""

    def __init__(
        self,
        *,
        life: Lifecycle,
        deliveries: Deliveries,
        io: Driver,
        twophase: TwoPhase | None,
        completion: Completion,
    ) -> None:
        self._life = life
        self._deliveries = deliveries
        self._io = io
        self._twophase = twophase
        self._completion = completion

    def close(self, timeout: float, *, abort_open: bool) -> str:
        """The body of close() on a producer not closed yet (``abort_open``: see
        ``TransactionalProducer._close``); returns what it did, the note for a user
        callback's exception raised after it."""
        state = self._life.state
        done = "close() closed the producer"
        open_txn = state in (State.IN_TRANSACTION, State.ABORTABLE, State.ABORTING)
        if open_txn and not abort_open:
            log.warning(
                "close(): the open transaction of %r is left to the coordinator, not "
                "aborted", self._io.transactional_id,
            )  # fmt: skip
        elif open_txn:
            try:
                self._completion.abort(timeout)
                done = "close() aborted the open transaction and closed the producer"
            except KafkaTxnError as exc:
                log.warning("close(): abort of the open transaction failed: %s", exc)
        fatal = self._life.fatal
        abort_directly = abort_open and (
            # close() from a signal handler while prepare flushed (same thread): no
            # state was handed to any decider; librdkafka aborts it directly.
            state is State.PREPARING
            or (
                state is State.FATAL
                and fatal is not None
                and may_abort_after_fatal(self._life.fatal_from, fatal.kafka_error)
            )
        )
        aborted_after_fatal = abort_directly and self.abort_after_fatal(timeout)
        if aborted_after_fatal:
            done = "close() aborted the open transaction and closed the producer"
        # A commit whose outcome is unknown (COMMITTING) may already be decided by the
        # coordinator: confluent-kafka's close() would try to abort it (librdkafka
        # refuses: "Conflicting commit_transaction API call is already in progress").
        keep_open = (
            state is State.COMMITTING
            or (open_txn and not abort_open)
            or (self._twophase is not None and self._twophase.prepared is not None)
        )
        # confluent-kafka's close() aborts whatever librdkafka still has open, without
        # a time bound, and turns a refusal into a RuntimeWarning: an
        # init_transactions() that timed out is still under way ("Conflicting
        # init_transactions API call is already in progress"), a fatal error refuses
        # every abort, an abort that timed out would be waited for without end. So it
        # is called only when librdkafka holds no transaction and runs no call.
        now = self._life.state
        idle = (
            now is State.READY
            or aborted_after_fatal
            or (now in (State.NEW, State.RECOVERING) and not self._completion.init_started)
        )
        self._life.transition_to(State.CLOSED)
        if self._twophase is not None:
            self._twophase.close()
        try:
            self._io.release(close_handle=idle and not keep_open)
        finally:
            # A pending DeliveryFuture's result() polls the driver from now on, which
            # refuses as the producer would (no cycle back to the producer).
            self._deliveries.poll = self._io.poll
        return done

    def abort_after_fatal(self, timeout: float | None) -> bool:
        """close() of a producer that a fatal error hit while its transaction was open
        and may be aborted (``may_abort_after_fatal``), or that a signal handler closes
        while prepare flushes: librdkafka's abort_transaction(), bounded by ``timeout``.
        The library calls some errors fatal that librdkafka only calls abortable
        (KIP-691: the group refusing the offsets, ILLEGAL_GENERATION or
        UNKNOWN_MEMBER_ID; authorization), and then librdkafka can still abort: at once,
        rather than the coordinator after transaction.timeout.ms, which until then holds
        read_committed readers back at that transaction. Where librdkafka is fatal too
        (fenced), it refuses at once. True if it aborted."""
        try:
            self._io.retrying(
                "abort_transaction", self._io.producer.abort_transaction, timeout,
                defer_callback_errors=True,
            )  # fmt: skip
        except KafkaException as exc:
            log.info(
                "close(): the open transaction of %r was not aborted (%s): the coordinator "
                "aborts it after transaction.timeout.ms, or the id's next "
                "init_transactions() at once", self._io.transactional_id, exc,
            )  # fmt: skip
            return False
        self._deliveries.reset()
        return True
