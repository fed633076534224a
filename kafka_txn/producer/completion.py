"""The bodies of ``TransactionalProducer``'s transactional calls: ``begin`` (undone when a
signal interrupts it), ``commit``, ``abort``, ``complete`` (KIP-939's second phase of a
prepared transaction: commit or abort), and librdkafka's ``init_transactions()`` (which
recovery and the settlement of a kept transaction end with).

The public calls take the producer's lock, run a body here, and only then raise a user
callback's exception stashed meanwhile (``Completion.raise_callback_error``);
``complete_transaction()`` and ``close()`` run the same bodies. Commit, abort and prepare
first wait for the sends under way (``producer.sending``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from kafka_txn.errors import (
    CommitFailedException,
    FatalError,
    IllegalStateError,
    TransactionAbortableError,
    TransactionOutcomeUnknownError,
    root_exception,
)
from kafka_txn.metrics import MetricsHook, timed
from kafka_txn.producer.delivery import Deliveries
from kafka_txn.producer.librdkafka import _RETRY_FLOOR_S, Driver, resumed
from kafka_txn.producer.lifecycle import ALLOWED, Lifecycle, State
from kafka_txn.producer.sending import Sends
from kafka_txn.state import PreparedTxnState
from kafka_txn.twophase.failures import prepare_failed
from kafka_txn.twophase.prepare import TwoPhase
from kafka_txn.twophase.recovery import TransactionOutcome

__all__ = ["Completion"]

log = logging.getLogger("kafka_txn.producer")

_UNDO_ATTEMPTS = 5
"""Times an interrupted begin_transaction() tries to abort librdkafka's empty transaction
while further interruptions keep arriving."""


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


def _sends_under_way(budget: float) -> TransactionAbortableError:
    return TransactionAbortableError(
        f"a produce()/send() in another thread did not return within {budget:g}s, so "
        "whether its record belongs to the transaction is not known"
    )


class Completion:
    """Begin, init, commit, abort and completion of one TransactionalProducer."""

    def __init__(
        self,
        *,
        life: Lifecycle,
        deliveries: Deliveries,
        io: Driver,
        sends: Sends,
        twophase: TwoPhase | None,
        operation_timeout: float,
        metrics: MetricsHook | None,
    ) -> None:
        self._life = life
        self._deliveries = deliveries
        self._io = io
        self._sends = sends
        self._twophase = twophase
        self._operation_timeout = operation_timeout
        self._metrics = metrics
        self.init_started = False
        """librdkafka's init_transactions() was called: until it succeeds (the lifecycle
        leaves NEW/RECOVERING), it may still be under way inside librdkafka."""

    def raise_callback_error(self, done: str) -> None:
        """Raise a user callback's exception served by a transactional call that
        succeeded, now that the lifecycle shows that success; the note says what the call
        did, so that nobody takes the exception for a failed commit or abort."""
        self._deliveries.raise_callback_error(
            f"kafka-txn: this exception was raised by your callback; {done} (the "
            f"producer is now '{self._life.state.value}'): do not retry or undo it"
        )

    def begin(self) -> None:
        """The body of begin_transaction(), once the lifecycle allowed it."""
        if self._life.state is State.ABORTING:
            self._finish_abort()
        self._io.drain()
        self._deliveries.reset()
        try:
            self._io.producer.begin_transaction()
            if self._twophase is not None:
                # The start-time spacing wait comes after librdkafka's begin, which
                # sends nothing (it hands a state change to librdkafka's main thread
                # and waits for it), so that the wait covers that handoff; no record
                # can go before the wait ends: produce(), send() and
                # send_offsets_to_transaction() are refused until the state changes.
                self._twophase.begin()
        except KafkaException as exc:
            raise self._io.on_call_error(exc, "begin_transaction") from exc
        except BaseException as exc:
            interrupted = exc
        else:
            if not self._life.finish(State.IN_TRANSACTION):
                # close() let go of the handle (or its confluent-kafka close()
                # aborted librdkafka's empty transaction): nothing can be sent.
                raise self._life.closed_while("begin_transaction", "no transaction is open")
            return
        # A signal's exception (KeyboardInterrupt...) right after librdkafka's begin
        # returned, or during the wait: librdkafka may be in a transaction that ours
        # never entered. Undone after the except block: its abort is a librdkafka call
        # (see TransactionalProducer.transaction()).
        self._undo_begin()
        raise interrupted

    def _finish_abort(self) -> None:
        """begin_transaction() after an abort that ran out of time: resume it first."""
        log.info(
            "begin_transaction(): resuming the unfinished abort of %r's previous transaction",
            self._io.transactional_id,
        )
        try:
            self.abort(None)
        except TransactionOutcomeUnknownError as exc:
            raise TransactionOutcomeUnknownError(
                f"begin_transaction(): the abort of the previous transaction of "
                f"{self._io.transactional_id!r} has not completed ({exc.message}), so nothing "
                "was begun. Nothing of that transaction is visible to read_committed "
                "consumers. Call begin_transaction() again once the broker answers: it "
                "resumes the abort first",
                kafka_error=exc.kafka_error,
                operation="abort_transaction",
            ) from root_exception(exc)
        self.raise_callback_error("begin_transaction() finished the previous abort")

    def _undo_begin(self) -> None:
        """begin_transaction() was interrupted: end the transaction librdkafka may have
        begun. It holds nothing (no record could be sent, so no partition was
        registered), so librdkafka's abort sends nothing either; one it had not begun
        is refused as such (_STATE) and left alone. Another interruption meanwhile does
        not stop the undo (the first one is what begin_transaction() raises)."""
        failure: str | None = "interrupted again and again"
        err = KafkaError(KafkaError._STATE)
        for _ in range(_UNDO_ATTEMPTS):
            try:
                if self._twophase is not None:
                    self._twophase.identity.invalidate()  # read the id/epoch again, to be safe
                self._io.producer.abort_transaction(self._io.operation_timeout)
            except KafkaException as exc:
                err = exc.args[0]
                failure = None if err.code() == KafkaError._STATE else err.str()
            except BaseException:  # another interruption: finish the undo first
                continue
            else:
                failure = None
            break
        if failure is not None and self._life.fatal is None:
            # librdkafka may hold a transaction we cannot end.
            self._life.enter_fatal(
                FatalError(
                    "begin_transaction() was interrupted, and the empty transaction "
                    f"librdkafka had begun could not be aborted ({failure}): close this "
                    "producer",
                    kafka_error=err,
                )
            )

    def init(self, timeout: float | None, call: str | None = None) -> None:
        """librdkafka's init_transactions(); a callback's exception stays stashed for the
        public call to raise once done (``raise_callback_error``). ``call``: the public
        call that runs it, named in a ``BrokerUnreachableError`` (by default
        init_transactions, or complete_transaction in recovery). Run in slices
        (``Driver.sliced``): librdkafka's log lines and error_cb's reports are served
        while it waits, and a broker that cannot be reached at all ends it early."""
        if call is None:
            recovering = self._life.state is State.RECOVERING
            call = "complete_transaction" if recovering else "init_transactions"
        again = (
            "then call complete_transaction() again with the same state"
            if call == "complete_transaction"
            else f"then call {call}() again"
        )
        init: Callable[[float], object] = self._io.producer.init_transactions
        if self.init_started:  # resumed
            init = resumed(init)
        self.init_started = True
        self._io.retrying(
            "init_transactions", self._io.sliced(init, call, again), timeout,
            defer_callback_errors=True,
        )  # fmt: skip
        if not self._life.finish(State.READY):
            return  # initialised, and closed meanwhile: nothing more to set up
        if self._twophase is not None:
            self._io.drain(defer_callback_errors=True)  # statistics queued before init are stale
            self._twophase.identity.invalidate()
            self._twophase.prepared = None
            self._twophase.recovery.recovered = None

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
                commit = resumed(commit)
                # librdkafka takes a resumed commit up again; given too short a time, its
                # EndTxn reply may arrive after it gave the call up, and it aborts the
                # process (see producer.librdkafka._RETRY_FLOOR_S): never less than a
                # retry gets.
                first_floor = _RETRY_FLOOR_S
            # Sends are refused from here on; those under way are waited for, so that a
            # record failing in one of them (a serializer) is seen before committing.
            self._life.transition_to(State.COMMITTING)
            budget = self._operation_timeout if timeout is None else timeout
            if not self._sends.await_sends(time.monotonic() + budget):
                raise self._io.commit_failed(_sends_under_way(budget))
            first_failure = self._deliveries.first_failure
            if first_failure is not None and state is not State.COMMITTING:
                # A record already failed: cannot commit. A resumed commit runs all the
                # same: librdkafka holds the commit that ran out of time, and refuses
                # every abort ("Conflicting commit_transaction API call is already in
                # progress") until that commit has returned, here with the failure.
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
                abort = resumed(abort)
            self._life.transition_to(State.ABORTING)
            # A send under way would otherwise reach librdkafka after the abort, outside
            # any transaction or inside the next one.
            budget = self._operation_timeout if timeout is None else timeout
            if not self._sends.await_sends(time.monotonic() + budget):
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

    def complete(
        self, twophase: TwoPhase, state: PreparedTxnState, current: State, timeout: float | None
    ) -> TransactionOutcome:
        """The body of complete_transaction() outside recovery, in the state ``current``:
        commit if ``state`` is the prepared transaction's, else abort; a callback's
        exception stays stashed."""
        if current is State.ABORTING:  # an abort that ran out of time: resume it
            self._life.require("complete_transaction")  # names abort_transaction()
        if current not in ALLOWED["complete_transaction"]:
            self._life.raise_if_dead("complete_transaction")
            raise IllegalStateError(
                f"complete_transaction() with no prepared transaction (state "
                f"'{current.value}'): call prepare_transaction() first, or "
                "init_transactions(keep_prepared_txn=True) to recover",
                kafka_error=KafkaError(KafkaError.INVALID_TXN_STATE),
            )
        if twophase.decides_commit(state):  # a foreign state raises here
            self.commit(timeout)
            return TransactionOutcome.COMMITTED
        self.abort(timeout)  # refused when in doubt
        return TransactionOutcome.ABORTED

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

    def _settle_kept_transaction(self, commit: bool, timeout: float | None) -> None:
        """commit_transaction()/abort_transaction() right after
        init_transactions(keep_prepared_txn=True): commit whatever is open (KIP-939
        leaves that choice to the caller), or abort it; then initialise."""
        assert self._twophase is not None
        self._twophase.recovery.settle_kept(commit)
        # aborts whatever is still open
        self.init(timeout, "commit_transaction" if commit else "abort_transaction")

    def await_sends_to_prepare(self, deadline: float) -> None:
        if not self._sends.await_sends(deadline):
            raise prepare_failed("a produce()/send() in another thread did not return")
