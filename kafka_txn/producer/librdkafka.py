"""The I/O half of ``TransactionalProducer``: its calls into confluent-kafka's Producer
(through its ``Handle``, ``producer.handle``), the retrying of retriable errors
(tenacity), the translation of what fails through the error table, and librdkafka's
error callback.

The producer's public calls decide what to do; the ``Driver`` does it and moves the
lifecycle (``kafka_txn.producer.lifecycle``) when librdkafka reports a fatal or abortable
error. The slow path of a record librdkafka refuses is ``producer.sending``'s.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import tenacity
from confluent_kafka import KafkaError, KafkaException, Producer

from kafka_txn.classification import AUTHENTICATION_CODES, classify, exception_for
from kafka_txn.errors import (
    CommitFailedException,
    ErrorCategory,
    FatalError,
    IllegalStateError,
    KafkaTxnError,
    TransactionAbortableError,
    TransactionOutcomeUnknownError,
    root_exception,
)
from kafka_txn.producer.delivery import Deliveries
from kafka_txn.producer.handle import Handle
from kafka_txn.producer.lifecycle import Lifecycle, State
from kafka_txn.producer.reachability import SLICE_S, Reachability

__all__ = ["Driver", "resumed"]

log = logging.getLogger("kafka_txn.producer")

_RETRY_FLOOR_S = 1.0
"""Every retry of a transactional call gets at least this long, and none starts with less
left. librdkafka asserts ("BUG: Invalid transaction state transition", rd_kafka_txn_set_state,
CommittingTransaction -> AbortedNotAcked) and aborts the process when a resumed
commit_transaction() times out while its EndTxn is in flight and the reply then arrives:
the timed-out call clears the API name the reply is matched against."""

# Pause between tries of a call that failed with a retriable error: exponential from 50 ms
# to 1 s, plus jitter so that many producers do not retry in step.
_WAIT = tenacity.wait_exponential(multiplier=0.05, max=1.0) + tenacity.wait_random(0, 0.05)


def _wait_until(deadline: float) -> Callable[[tenacity.RetryCallState], float]:
    """``_WAIT``, cut short at ``deadline``: a pause never outlasts the call's budget
    (tenacity's stop_after_delay is checked before the pause, not after it)."""

    def wait(state: tenacity.RetryCallState) -> float:
        return min(_WAIT(state), max(0.0, deadline - time.monotonic()))

    return wait


def _is_retriable(exc: BaseException) -> bool:
    return (
        isinstance(exc, KafkaException)
        and not isinstance(exc, KafkaTxnError)
        and classify(exc.args[0])[0] is ErrorCategory.RETRIABLE
    )


def _failure(call: Callable[..., object], *args: Any) -> KafkaException | None:
    """``call(*args)``'s KafkaException, returned rather than raised, so that the caller
    makes its next librdkafka call (a retry) outside any ``except`` block.
    confluent-kafka's KafkaError type claims Py_TPFLAGS_BASE_EXC_SUBCLASS, so on CPython
    3.11 a KafkaException raised while another exception is being handled stores the
    handled one, with its traceback and every frame above it (the caller's, and what they
    hold: a producer, a database connection), in a KafkaError that never lets go of it."""
    try:
        call(*args)
    except KafkaException as exc:
        return exc
    return None


def resumed(call: Callable[[float], object]) -> Callable[[float], object]:
    """``call`` (librdkafka's init, commit or abort, resumed), where librdkafka refusing
    it in state Ready means it already completed it: a signal's exception came after
    librdkafka's call returned and before the lifecycle moved on (or an init that timed
    out went on inside librdkafka). librdkafka reaches Ready from an init, commit or
    abort in progress only by completing it (a failure leaves it AbortableError or
    fatal), so calling again would be refused (_STATE) and read as a failure: a healthy
    producer made fatal, or advice to abort and retry that would duplicate a committed
    transaction."""

    def again(timeout: float) -> object:
        try:
            return call(timeout)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError._STATE and err.str().endswith("in state Ready"):
                return None  # completed before: nothing more to do
            raise

    return again


class Driver:
    """Calls into one confluent-kafka ``Producer`` on behalf of a TransactionalProducer."""

    producer: Handle
    """The Producer behind a ``Handle`` (see there)."""
    produce: Callable[..., None]
    """The Producer's own produce(), for the slow path of a send (no call in between);
    the handle's, which refuses, once close() let go of the Producer."""

    def __init__(
        self,
        *,
        transactional_id: str,
        life: Lifecycle,
        deliveries: Deliveries,
        operation_timeout: float,
        sleep: Callable[[float], None],
        user_error_cb: Callable[..., None] | None,
        bootstrap_servers: str = "",
    ) -> None:
        self.transactional_id = transactional_id
        self.reachability = Reachability(bootstrap_servers)
        """librdkafka's connection reports (error_cb), for ``sliced``."""
        self.life = life
        self.deliveries = deliveries
        self._operation_timeout = operation_timeout
        self._sleep = sleep
        self._user_error_cb = user_error_cb
        self.refused_login: KafkaError | None = None
        """librdkafka's latest report of a refused SASL login (``AUTHENTICATION_CODES``,
        through error_cb, served by ``poll``): no call returns it, librdkafka logs in
        again and again meanwhile. Recovery reads it while it waits for a broker, and
        consumes it (``twophase.cluster.ClusterId``)."""

    @property
    def operation_timeout(self) -> float:
        """Seconds a blocking librdkafka call gets when the caller gives no timeout."""
        return self._operation_timeout

    def attach(self, producer: Producer) -> None:
        self._handle = self.producer = Handle(producer)
        self.produce = producer.produce

    def poll(self, timeout: float = 0) -> int:
        """Serve delivery reports and callbacks; returns how many events were served."""
        self.life.raise_if_dead("poll")
        return int(self.call("poll", self.producer.poll, timeout))

    def send_offsets(self, offsets: list[Any], group_metadata: Any, timeout: float | None) -> None:
        """send_offsets_to_transaction(); offsets that may or may not have joined the
        transaction (retries ran out) make it abortable: it cannot commit."""
        try:
            self.retrying(
                "send_offsets_to_transaction",
                lambda t: self.producer.send_offsets_to_transaction(offsets, group_metadata, t),
                timeout,
            )
        except TransactionOutcomeUnknownError as exc:
            abortable = TransactionAbortableError(exc.message, kafka_error=exc.kafka_error)
            self.deliveries.librdkafka_failed = True
            self.life.enter_abortable(abortable)
            raise abortable from exc.__cause__

    def release(self, *, close_handle: bool) -> None:
        """Let go of the librdkafka handle at close(). With ``close_handle``,
        confluent-kafka's Producer.close() flushes and destroys it now (it also aborts an
        open transaction, without a time bound, and warns if librdkafka refuses: the
        producer asks for it only when librdkafka holds no transaction and runs no
        transactional call). Otherwise the handle is left to its destruction, whose
        rd_kafka_destroy() (confluent-kafka's dealloc) neither aborts nor waits: a
        prepared transaction outlives this producer, any other is left to its
        coordinator.

        Either way the handle is destroyed by the time close() returns, in every
        state: this lets go of the Producer (``Handle.detach``, ``produce``) and the
        caller of its last reference (``TransactionalProducer._produce``), so that
        reference counting destroys it, rather than a garbage collection, which the
        cycles around it (librdkafka's callbacks are bound methods of objects that hold
        it) would otherwise wait for. A produce() still running in another thread holds
        it until that call returns."""
        handle = self._handle
        try:
            if not close_handle:
                # Serve what librdkafka queued (its log lines: "Connection refused" after
                # an init_transactions() that timed out), as its close() would have.
                handle.poll(0)
                return
            handle.flush(0)
            handle.close()
        except (KafkaException, RuntimeError) as exc:  # closing a dead handle
            log.debug("close(): %s", exc)
        finally:
            handle.detach()
            self.produce = handle.produce

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every queued record is delivered or failed; returns how many are
        still queued when ``timeout`` seconds pass."""
        self.life.raise_if_dead("flush")
        return int(self.call("flush", self.producer.flush, -1 if timeout is None else timeout))

    def retrying(
        self,
        operation: str,
        call: Callable[[float], object],
        timeout: float | None,
        *,
        defer_callback_errors: bool = False,
        first_floor: float = 0.001,
    ) -> None:
        """Run a blocking librdkafka call, retrying retriable errors until the deadline
        (tenacity), translating everything else through the error table.
        ``defer_callback_errors``: see ``call``. ``first_floor``: the least time the first
        try is given (a resumed commit gets ``_RETRY_FLOOR_S``, as every retry does)."""
        budget = self._operation_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget

        def attempt(floor: float) -> None:
            self.call(
                operation, call, max(floor, deadline - time.monotonic()),
                defer_callback_errors=defer_callback_errors,
            )  # fmt: skip

        # No librdkafka call is made while a failure is being handled (inside an
        # ``except`` block): see ``_failure``.
        failure = _failure(attempt, first_floor)  # the common case, without tenacity's cost
        if (
            failure is not None
            and _is_retriable(failure)
            # too little time left for a retry: the outcome stays unknown
            and deadline - time.monotonic() >= _RETRY_FLOOR_S
        ):
            log.info(
                "%s: %s; retrying until %gs pass", operation, failure.args[0], budget,
                extra={"transactional_id": self.transactional_id, "operation": operation},
            )  # fmt: skip
            retrying = tenacity.Retrying(
                retry=tenacity.retry_if_exception(_is_retriable),
                stop=tenacity.stop_after_delay(
                    max(0.0, deadline - _RETRY_FLOOR_S - time.monotonic())
                ),
                wait=_wait_until(deadline - _RETRY_FLOOR_S),
                sleep=self._sleep,
                reraise=True,
            )
            failure = _failure(retrying, attempt, _RETRY_FLOOR_S)
        if failure is None:
            return
        if isinstance(failure, KafkaTxnError):
            raise failure
        err = failure.args[0]
        if _is_retriable(failure):
            raise TransactionOutcomeUnknownError(
                _outcome_unknown_message(operation, budget, err),
                kafka_error=err,
                operation=operation,
            ) from failure
        raise self.on_call_error(failure, operation) from failure

    def call(
        self,
        operation: str,
        call: Callable[..., Any],
        *args: Any,
        defer_callback_errors: bool = False,
    ) -> Any:
        """One confluent-kafka call that may run callbacks: surfaces a fatal error
        recorded meanwhile, and re-raises a user callback's exception here, outside
        librdkafka's stack (raising inside it is what makes confluent-kafka raise
        SystemError). With ``defer_callback_errors`` the exception stays stashed, for a
        caller that must first finish what the call's success means (commit, abort:
        the lifecycle moves on) and then raise it (``Deliveries.raise_callback_error``);
        a failure of the call itself is then raised, not hidden behind the callback's."""
        deliveries = self.deliveries
        odd: object = None
        try:
            result = call(*args)
        except KafkaException as exc:
            deliveries.collect()
            if not isinstance(exc, KafkaTxnError) and classify(exc.args[0])[0] is (
                ErrorCategory.FATAL
            ):
                raise self.on_call_error(exc, operation) from exc
            if not defer_callback_errors:
                deliveries.raise_callback_error()
            raise
        except Exception as exc:
            odd = exc
        except BaseException:
            raise
        except:  # noqa: E722 - a KafkaError raised as itself: see _derailed
            odd = sys.exc_info()[1]
        if odd is not None:  # outside the except block: see _failure
            translated = self._derailed(odd, operation)
            if translated is None:
                raise odd  # type: ignore[misc]  # an exception, or a raised KafkaError
            raise translated.with_traceback(None) from translated.__cause__
        deliveries.collect()
        if not defer_callback_errors:
            deliveries.raise_callback_error()
        if self.life.fatal is not None and operation in ("poll", "flush"):
            raise self.life.fatal.with_traceback(None)
        return result

    def _derailed(self, odd: object, operation: str) -> KafkaTxnError | None:
        """The error to raise for a confluent-kafka call that raised something other than
        a KafkaException (None: nothing says librdkafka failed; ``odd`` is raised as is).

        confluent-kafka raises a fatal error (a fenced producer's _FATAL) from its own
        error_cb, without calling ours, by setting it as the pending exception and
        serving the rest of the call's events meanwhile. A delivery report or log line
        served then runs Python code with that exception pending, which fails in ways
        of its own: SystemError ("<method 'topic' of ... Message objects> returned a
        result with an exception set", chaining the KafkaException; or "returned NULL
        without setting an exception" when that code swallowed it), even an
        AttributeError. Or the call raises the KafkaError itself (the type claims
        Py_TPFLAGS_BASE_EXC_SUBCLASS), which no ``except BaseException`` matches.
        The fatal error is found in error_cb's report, else in the exception's chain,
        else by asking librdkafka (``_fatal_error``); it makes the producer fatal."""
        self.serve_error_callbacks()
        self.deliveries.collect()
        fatal = self.life.fatal
        if fatal is not None:
            fatal = fatal.with_traceback(None)
            if fatal.__cause__ is None and isinstance(odd, BaseException):
                fatal.__cause__ = odd
            return fatal
        pending = _kafka_exception_in(odd)
        if pending is None:
            pending = self._fatal_error()
        if pending is None:
            return None
        translated = self.on_call_error(pending, operation)
        if translated.__cause__ is None:
            translated.__cause__ = pending
        return translated

    def _fatal_error(self) -> KafkaException | None:
        """librdkafka's fatal error, if it holds one: init_transactions() on an
        initialised producer changes nothing (librdkafka refuses it in every state after
        its init: _STATE, or _CONFLICT while another call runs) and reports the fatal
        error first (rd_kafka_txn_require_state). Not asked before an init succeeded
        (the call would initialise) or after close()."""
        if self.life.state in (State.NEW, State.RECOVERING, State.CLOSED):
            return None
        probe: object = None
        try:
            self.producer.init_transactions(1.0)
        except KafkaException as exc:
            probe = exc
        except BaseException:
            raise
        except:  # noqa: E722 - a KafkaError raised as itself: see _derailed
            probe = sys.exc_info()[1]
        failure = _kafka_exception_in(probe)
        if failure is None or not failure.args[0].fatal():
            return None
        return failure

    def sliced(
        self, call: Callable[[float], object], operation: str, again: str
    ) -> Callable[[float], object]:
        """``call`` (a resumable blocking librdkafka call: init_transactions) run in
        slices of at most ``SLICE_S``, the queued callbacks served between them, so that
        librdkafka's log lines and error_cb's reports arrive while it waits rather than
        when it returns, and a broker that cannot be reached at all ends it early with
        ``BrokerUnreachableError`` (``producer.reachability``; ``again`` says how to
        retry). librdkafka answers a call that ran out of time ``_TIMED_OUT``, "retry
        call to resume", and the next call resumes it; one it completed meanwhile is
        refused in state Ready, which ``resumed`` takes as done."""

        def run(timeout: float) -> object:
            started = time.monotonic()
            deadline = started + timeout
            step = call
            while True:
                left = deadline - time.monotonic()
                failure = _failure(step, max(0.001, min(SLICE_S, left)))
                if failure is None:
                    return None
                err = failure.args[0]
                if err.code() != KafkaError._TIMED_OUT:
                    raise failure
                self.serve_error_callbacks()
                final = time.monotonic() >= deadline
                unreachable = self.reachability.unreachable(
                    f"{operation}()", started, final=final, again=again
                )
                if unreachable is not None:
                    raise unreachable from KafkaException(unreachable.kafka_error)
                if final:
                    raise failure
                step = resumed(call)

        return run

    def serve_error_callbacks(self, timeout: float = 0) -> None:
        """Serve the callbacks librdkafka queued (error_cb's reports among them), waiting
        up to ``timeout`` seconds for the first; nothing they raise escapes."""
        try:
            self.producer.poll(timeout)
        except Exception as exc:
            log.debug("poll(%g) after a failed call raised %r", timeout, exc)
        except BaseException:
            raise
        except:  # noqa: E722 - a KafkaError raised as itself: see _derailed
            log.debug("poll(%g) after a failed call raised %r", timeout, sys.exc_info()[1])

    def on_call_error(self, exc: KafkaException, operation: str) -> KafkaTxnError:
        """Translate a confluent-kafka exception from ``operation`` and move the
        lifecycle; the caller raises the result ``from exc``."""
        err = exc.args[0]
        if err.code() == KafkaError._FATAL:
            # The call reports only "_FATAL"; error_cb carries the underlying cause.
            self.serve_error_callbacks()
            if self.life.fatal is not None:
                return self.life.fatal.with_traceback(None)
        mapped = exception_for(err, operation)
        if isinstance(mapped, FatalError):
            self.life.enter_fatal(mapped)
        elif operation == "abort_transaction" and err.txn_requires_abort() and not err.fatal():
            # librdkafka's transaction is still abortable (EndTxn(abort) answered
            # TRANSACTION_ABORTABLE, REQUEST_TIMED_OUT, NETWORK_EXCEPTION...): a second
            # abort sends EndTxn(abort) again. The lifecycle stays ABORTING, from which
            # abort_transaction() resumes, as after an abort that ran out of time.
            return TransactionOutcomeUnknownError(
                f"abort_transaction() did not complete: {err.str()} ({err.name()}); the "
                "transaction is not known to be aborted, and the producer can still abort "
                "it: call abort_transaction() again, or close() the producer",
                kafka_error=err,
                operation=operation,
            )
        elif operation in ("init_transactions", "abort_transaction"):
            # Nothing to abort to: librdkafka's non-retriable failures here leave no way on.
            fatal = FatalError(mapped.message, kafka_error=err)
            self.life.enter_fatal(fatal)
            return fatal
        elif operation == "begin_transaction":
            return IllegalStateError(mapped.message, kafka_error=err)
        else:
            self.deliveries.librdkafka_failed = True
            self.life.enter_abortable(mapped)
        return mapped

    def commit_failed(self, cause: KafkaTxnError | None) -> KafkaTxnError:
        """The error commit_transaction() raises when the transaction already failed:
        CommitFailedException with the failure as its cause (KIP-691), or the fatal error."""
        if self.life.fatal is not None:
            return self.life.fatal.with_traceback(None)
        if cause is None:  # pragma: no cover - lifecycle invariant
            cause = TransactionAbortableError("the transaction failed")
        reason = cause.message
        if self.deliveries.failed_records > 1:
            reason += f"; at least {self.deliveries.failed_records} records failed"
        exc = CommitFailedException(
            f"commit_transaction() failed: {reason}. Abort the transaction, rewind the "
            "inputs, and retry",
            kafka_error=cause.kafka_error,
        )
        exc.__cause__ = root_exception(cause)
        self.life.enter_abortable(exc)
        return exc

    def drain(self, *, defer_callback_errors: bool = False) -> None:
        """Serve whatever callbacks are queued (_call surfaces a fatal error they bring)."""
        self.call("poll", self.producer.poll, 0, defer_callback_errors=defer_callback_errors)

    def on_error(self, err: KafkaError) -> None:
        # confluent-kafka hands error_cb the underlying error of a _FATAL, flagged fatal().
        self.reachability.observe(err)
        if err.code() in AUTHENTICATION_CODES:
            self.refused_login = err
        if err.fatal() and self.life.fatal is None:
            fatal = exception_for(err, "producer")
            if isinstance(fatal, FatalError):
                fatal.__cause__ = KafkaException(err)
                self.life.enter_fatal(fatal)
        if self._user_error_cb is not None:
            self.deliveries.call_user(self._user_error_cb, err)
        elif not err.fatal():
            log.info("librdkafka: %s (%s)", err.str(), err.name())


def _kafka_exception_in(odd: object) -> KafkaException | None:
    """The confluent-kafka KafkaException ``odd`` is or chains (``__cause__``,
    ``__context__``), a raised KafkaError wrapped as one; None if there is none. A
    kafka-txn error is no such root: it was translated already."""
    seen = 0
    while odd is not None and seen < 8:
        if isinstance(odd, KafkaError):
            return KafkaException(odd)
        if isinstance(odd, KafkaException):
            return None if isinstance(odd, KafkaTxnError) else odd
        if not isinstance(odd, BaseException):
            return None
        odd = odd.__cause__ or odd.__context__
        seen += 1
    return None


def _outcome_unknown_message(operation: str, budget: float, err: KafkaError) -> str:
    base = f"{operation}() did not complete within {budget:g}s ({err.str()})"
    if operation == "commit_transaction":
        return (
            f"{base}: the broker may already have committed. Call commit_transaction() "
            "again; do not abort. If you close instead, the next init_transactions() for "
            "this transactional.id finishes the commit or aborts it"
        )
    if operation == "abort_transaction":
        return f"{base}: call abort_transaction() again, or close() the producer"
    if operation == "init_transactions":
        return (
            f"{base}: call init_transactions() again. The coordinator may already have "
            "fenced older instances of this transactional.id and aborted their open "
            "transaction"
        )
    if operation == "send_offsets_to_transaction":
        # librdkafka may have sent AddOffsetsToTxn or TxnOffsetCommit: whether the
        # offsets joined the transaction is unknown, so it must not commit.
        return (
            f"{base}: the offsets may or may not have joined the transaction, so it "
            "cannot commit; abort the transaction, rewind the inputs, and retry in a new "
            "transaction"
        )
    return f"{base}: call {operation}() again"
