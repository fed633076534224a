"""The bodies of ``TransactionalProducer``'s calls that finish a transaction or start the
producer over: ``commit``, ``abort`` and librdkafka's ``init_transactions()`` (which recovery
and the settlement of a kept transaction end with), and the count of ``produce()``/
``send()`` calls under way that commit, abort and prepare wait for.

The public calls take the producer's lock, run a body here, and only then raise a user
callback's exception stashed meanwhile (``TransactionalProducer._raise_callback_error``);
``complete_transaction()`` and ``close()`` run the same bodies.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from types import FrameType

from confluent_kafka import KafkaError, KafkaException

from kafka_txn.errors import (
    CommitFailedException,
    FatalError,
    TransactionAbortableError,
    TransactionOutcomeUnknownError,
    root_exception,
)
from kafka_txn.metrics import MetricsHook, timed
from kafka_txn.producer.delivery import Deliveries
from kafka_txn.producer.librdkafka import _RETRY_FLOOR_S, Driver
from kafka_txn.producer.lifecycle import Lifecycle, State
from kafka_txn.twophase.prepare import TwoPhase, prepare_failed

__all__ = ["ABORT_AFTER_FATAL", "Completion", "may_abort_after_fatal"]

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


def _done_unless_ready(call: Callable[[float], object]) -> Callable[[float], object]:
    """``call`` (librdkafka's init, commit or abort, resumed), where librdkafka refusing
    it in state Ready means it already completed it: a signal's exception came after
    librdkafka's call returned and before the lifecycle moved on (or an init that timed
    out went on inside librdkafka). librdkafka reaches Ready from an init, commit or
    abort in progress only by completing it (a failure leaves it AbortableError or
    fatal), so calling again would be refused (_STATE) and read as a failure: a healthy
    producer made fatal, or advice to abort and retry that would duplicate a committed
    transaction."""

    def resumed(timeout: float) -> object:
        try:
            return call(timeout)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError._STATE and err.str().endswith("in state Ready"):
                return None  # completed before: nothing more to do
            raise

    return resumed


_END_TXN_FAILED = "EndTxn commit failed: "
"""How librdkafka's error for an EndTxn(commit) answered with an error starts
(rdkafka_txnmgr.c, rd_kafka_txn_handle_EndTxn: "EndTxn %s failed: %s")."""

_END_TXN_NOT_APPLIED = frozenset(
    {
        # Answers with which Apache Kafka's coordinator refuses an EndTxn it did not
        # apply, and that librdkafka calls abortable (TransactionCoordinator.endTransaction;
        # KIP-360, KIP-890). Fencing and INVALID_TXN_STATE are fatal there and here.
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
        KafkaError.TRANSACTION_ABORTABLE,
    }
)


def _end_txn_may_have_committed(exc: CommitFailedException) -> bool:
    """The commit failed on EndTxn's answer, and that answer is not a refusal: librdkafka
    calls every unlisted EndTxn error abortable, but the coordinator may have applied the
    commit before answering with it (REQUEST_TIMED_OUT, UNKNOWN_SERVER_ERROR from a broker
    or gateway in between). Java's producer takes an unlisted EndTxn error as fatal
    (TransactionManager.EndTxnHandler: "Unhandled error in EndTxnResponse")."""
    err = exc.kafka_error
    return err.str().startswith(_END_TXN_FAILED) and err.code() not in _END_TXN_NOT_APPLIED


_SEND_NAMES = frozenset({"produce", "send"})
"""TransactionalProducer's send methods, whose frames hold ``under_way`` as a local."""

_PADDING = 8
"""Entries ``Completion.under_way`` holds when no send is under way. CPython shrinks a
list's storage when it falls below half its capacity, so an empty list would free and
reallocate its storage on every append/pop pair (~40 ns); eight entries keep one
capacity for up to eight sends under way at once."""


def _sends_under_way(budget: float) -> TransactionAbortableError:
    return TransactionAbortableError(
        f"a produce()/send() in another thread did not return within {budget:g}s, so "
        "whether its record belongs to the transaction is not known"
    )


class Completion:
    """Init, commit and abort of one TransactionalProducer, and its sends under way."""

    def __init__(
        self,
        *,
        life: Lifecycle,
        deliveries: Deliveries,
        io: Driver,
        twophase: TwoPhase | None,
        operation_timeout: float,
        metrics: MetricsHook | None,
    ) -> None:
        self._life = life
        self._deliveries = deliveries
        self._io = io
        self._twophase = twophase
        self._operation_timeout = operation_timeout
        self._metrics = metrics
        # produce()/send() calls under way, for prepare, commit and abort to wait for (see
        # await_sends): each send appends an entry before its state check and pops one
        # when it returns. list.append, list.pop and len() are single C calls, atomic
        # under the GIL; one list costs less per record than a lock or two counters.
        # The producer appends and pops itself.
        self.under_way: list[None] = [None] * _PADDING
        self.init_started = False
        """librdkafka's init_transactions() was called: until it succeeds (the lifecycle
        leaves NEW/RECOVERING), it may still be under way inside librdkafka."""

    def init(self, timeout: float | None) -> None:
        """librdkafka's init_transactions(); a callback's exception stays stashed for the
        public call to raise once done (``_raise_callback_error``)."""
        init: Callable[[float], object] = self._io.producer.init_transactions
        if self.init_started:  # resumed
            init = _done_unless_ready(init)
        self.init_started = True
        self._io.retrying(
            "init_transactions", init, timeout, defer_callback_errors=True,
        )  # fmt: skip
        if not self._life.finish(State.READY):
            return  # initialised, and closed meanwhile: nothing more to set up
        if self._twophase is not None:
            self._io.drain(defer_callback_errors=True)  # statistics queued before init are stale
            self._twophase.identity.invalidate()
            self._twophase.prepared = None
            self._twophase.recovered = None

    def commit(self, timeout: float | None) -> None:
        """The body of commit_transaction(); a callback's exception stays stashed."""
        with timed(self._metrics, "commit_transaction"):
            state = self._life.state
            if state is State.ABORTABLE:
                raise self._io.commit_failed(self._life.abortable)
            if state is State.RECOVERING:
                self._settle_kept_transaction(commit=True, timeout=timeout)
                return
            self._life.require("commit_transaction")
            if state in (State.PREPARED, State.IN_DOUBT):
                assert self._twophase is not None
                self._twophase.commit_prepared(timeout)
                return
            commit: Callable[[float], object] = self._io.producer.commit_transaction
            first_floor = 0.001
            if state is State.COMMITTING:  # resumed after its outcome was unknown
                commit = _done_unless_ready(commit)
                # librdkafka takes a resumed commit up again; given too short a time, its
                # EndTxn reply may arrive after it gave the call up, and it aborts the
                # process (see _librdkafka._RETRY_FLOOR_S): never less than a retry gets.
                first_floor = _RETRY_FLOOR_S
            # Sends are refused from here on; those under way are waited for, so that a
            # record failing in one of them (a serializer) is seen before committing.
            self._life.transition_to(State.COMMITTING)
            budget = self._operation_timeout if timeout is None else timeout
            if not self.await_sends(time.monotonic() + budget):
                raise self._io.commit_failed(_sends_under_way(budget))
            first_failure = self._deliveries.first_failure
            if first_failure is not None:  # a record already failed: cannot commit
                raise self._io.commit_failed(first_failure)
            try:
                self._io.retrying(
                    "commit_transaction", commit, timeout, defer_callback_errors=True,
                    first_floor=first_floor,
                )  # fmt: skip
            except CommitFailedException as exc:
                # A record that failed during commit's flush is the real cause (KIP-691).
                if self._deliveries.first_failure is not None:
                    raise self._io.commit_failed(self._deliveries.first_failure)  # noqa: B904
                if not _end_txn_may_have_committed(exc):
                    raise
                unknown = exc
            else:
                self._life.finish(State.READY)  # committed, also if close() ran meanwhile
                return
            raise self._commit_may_have_applied(unknown)

    def _commit_may_have_applied(self, exc: CommitFailedException) -> FatalError:
        """The producer is unusable after an EndTxn answer that may follow an applied
        commit: librdkafka wants an abort, yet the transaction may be committed, so
        advice to abort and retry could write it twice."""
        err = exc.kafka_error
        fatal = FatalError(
            f"commit_transaction(): the coordinator answered EndTxn(commit) with "
            f"{err.name()} ({err.str()}), which does not say the commit was refused: it may "
            "have committed the transaction before answering, so whether it committed is "
            "unknown. Do not abort and retry it (that could write it twice). Close this "
            "producer: the next init_transactions() of this transactional id completes or "
            "aborts it; a consume-process-produce loop restarts from the offsets committed "
            "with the last transaction that committed; otherwise read the output to learn "
            "whether it is there before sending it again",
            kafka_error=err,
        )
        fatal.__cause__ = root_exception(exc)
        self._life.enter_fatal(fatal)
        # The commit was sent and may be applied: like a prepared commit in doubt, never
        # aborted by close() (may_abort_after_fatal), whatever librdkafka calls the error.
        self._life.fatal_from = State.IN_DOUBT
        return fatal

    def abort(self, timeout: float | None) -> None:
        """The body of abort_transaction(); a callback's exception stays stashed."""
        with timed(self._metrics, "abort_transaction"):
            state = self._life.state
            if state is State.RECOVERING:
                self._settle_kept_transaction(commit=False, timeout=timeout)
                return
            self._life.require("abort_transaction")
            abort: Callable[[float], object] = self._io.producer.abort_transaction
            if state is State.ABORTING:  # resumed
                abort = _done_unless_ready(abort)
            self._life.transition_to(State.ABORTING)
            # A send under way would otherwise reach librdkafka after the abort, outside
            # any transaction or inside the next one.
            budget = self._operation_timeout if timeout is None else timeout
            if not self.await_sends(time.monotonic() + budget):
                raise TransactionOutcomeUnknownError(
                    f"abort_transaction(): a produce()/send() in another thread did not "
                    f"return within {budget:g}s, so nothing was aborted yet: call "
                    "abort_transaction() again",
                    kafka_error=KafkaError(KafkaError._TIMED_OUT),
                    operation="abort_transaction",
                )
            if state is not State.ABORTING:
                self._await_registration(time.monotonic() + budget / 2)
            self._io.retrying("abort_transaction", abort, timeout, defer_callback_errors=True)
            if self._life.state is State.CLOSED:
                return  # aborted; close() ran meanwhile and let go of the handle
            # librdkafka purged the queue; serve those reports now so that none of them is
            # counted against the next transaction.
            self._io.drain(defer_callback_errors=True)
            self._deliveries.reset()
            self._life.aborted()
            if self._twophase is not None:
                self._twophase.prepared = None
                # The abort may have bumped the epoch: the identity from before it is a
                # candidate that the next prepare's DescribeTransactions must confirm.
                self._twophase.identity.after_abort()

    def _await_registration(self, deadline: float) -> None:
        """Before librdkafka's abort of a transaction that has not failed: let the records
        still queued be delivered (bounded by ``deadline``), so that the partitions they
        go to are registered with the coordinator first.

        librdkafka sends EndTxn(abort) as soon as it has sent one AddPartitionsToTxn
        (``rk_eos.txn_req_cnt``), without waiting for that request to succeed. Right
        after a commit, Apache Kafka answers it CONCURRENT_TRANSACTIONS while the commit
        markers are still being written (``TransactionCoordinator.handleAddPartitions``:
        the previous transaction is PrepareCommit), and librdkafka retries it later; an
        abort sent meanwhile finds the previous transaction PrepareCommit or
        CompleteCommit, which ``TransactionCoordinator.endTransaction`` refuses an abort
        with INVALID_TXN_STATE, and librdkafka makes that fatal (librdkafka issue 4849).
        Java's producer never does this: its EndTxn waits behind the pending
        AddPartitionsToTxn. A delivered record proves its partition was added. The wait
        stops early once librdkafka's own transaction failed (it then sends nothing
        more, so waiting would only run out the clock) or nothing is queued; a
        transaction that failed only here (a record refused before it was queued, a
        commit refused for it) still has librdkafka delivering the others."""
        producer = self._io.producer
        while (
            len(producer) > 0
            and not self._deliveries.librdkafka_failed
            and self._life.fatal is None
            and time.monotonic() < deadline
        ):
            wait = min(0.05, max(0.0, deadline - time.monotonic()))
            self._io.call("flush", producer.flush, wait, defer_callback_errors=True)

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

    def _settle_kept_transaction(self, commit: bool, timeout: float | None) -> None:
        """commit_transaction()/abort_transaction() right after
        init_transactions(keep_prepared_txn=True): commit whatever is open (KIP-939
        leaves that choice to the caller), or abort it; then initialise."""
        assert self._twophase is not None
        self._twophase.settle_kept(commit)
        self.init(timeout)  # aborts whatever is still open

    def await_sends_to_prepare(self, deadline: float) -> None:
        if not self.await_sends(deadline):
            raise prepare_failed("a produce()/send() in another thread did not return")

    def _own_sends(self) -> int:
        """produce()/send() calls of this producer under way on the calling thread
        itself: a signal handler (SIGTERM calling close()) runs on the main thread
        between two bytecodes, also inside a send whose librdkafka produce() returned.
        Those sends cannot return while this thread waits, so they are not waited for:
        their record is queued already, and the abort (or commit) covers it. Found by
        walking this thread's frames (no cost per record)."""
        own = 0
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if (
                frame.f_code.co_name in _SEND_NAMES
                and frame.f_locals.get("under_way") is self.under_way
            ):
                own += 1
            frame = frame.f_back
        return own

    def await_sends(self, deadline: float) -> bool:
        """Wait until no produce()/send() is under way; False if one still is at
        ``deadline``. The state is no longer IN_TRANSACTION (preparing, committing,
        aborting), so a send that starts later is refused. Under the GIL the list's
        appends, pops and length are sequentially consistent, and a send appends before
        it reads the state and pops after librdkafka's produce() returned: the length
        back at its padding proves that at that instant no send had passed its state
        check unfinished, and every later one reads the new state. (The gap this closes
        is real even without a serializer: between the state check and librdkafka's
        enqueue, an allocation may run the garbage collector, whose finalizers are
        Python code, where the GIL may pass to the thread that prepares.)"""
        under_way = self.under_way
        idle = _PADDING + self._own_sends()
        while True:
            if len(under_way) <= idle:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0002)
