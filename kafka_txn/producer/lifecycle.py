"""The transactional producer's states, the legal moves between them, and which public
call each state allows: the whole lifecycle as data, with no I/O.

Shaped like Apache Kafka's ``TransactionManager`` (``State.isTransitionValid`` and one
``transitionTo``): every change of state goes through ``Lifecycle.transition_to``, which
refuses a move the table does not list, so a wrong move fails where it happens. The
diagram in docs/guide/producer.md is generated from ``TRANSITIONS`` (``python -m kafka_txn._docs``)
and tested for drift; tests walk every (state, operation) pair of ``ALLOWED``.

Two-phase commit adds three states. ``PREPARING`` refuses sends while prepare flushes, so
no record can join a transaction after the prepared state was taken. ``PREPARED`` allows
the decision either way. ``IN_DOUBT`` is a prepared transaction whose commit was
attempted: the external decider may already have committed, so it is never aborted from
here; it is committed again, or left open for recovery.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from typing import Final

from kafka_txn.errors import (
    FatalError,
    IllegalStateError,
    KafkaTxnError,
    TransactionAbortableError,
    root_exception,
)

__all__ = ["ALLOWED", "TRANSITIONS", "Lifecycle", "State", "render_mermaid"]

log = logging.getLogger("kafka_txn.lifecycle")


class State(enum.Enum):
    """States of a ``TransactionalProducer`` (``producer.state`` is the value)."""

    NEW = "new"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    PREPARING = "preparing"
    PREPARED = "prepared"
    COMMITTING = "committing"
    IN_DOUBT = "in doubt"
    ABORTING = "aborting"
    ABORTABLE = "abortable error"
    RECOVERING = "recovering"
    FATAL = "fatal error"
    CLOSED = "closed"

    # Members are singletons compared by identity (Enum defines no __eq__), so the
    # identity hash agrees with equality; Enum's own __hash__ is Python code (hashing the
    # name), which every lookup in the tables below would run, twice per transition.
    __hash__ = object.__hash__


S = State
_ANY_LIVE = frozenset(State) - {S.CLOSED}

TRANSITIONS: Final[Mapping[State, frozenset[State]]] = {
    # Each state, and the states it may move to. FATAL and CLOSED are reachable from
    # every live state and listed once, below.
    S.NEW: frozenset({S.READY, S.RECOVERING}),
    S.RECOVERING: frozenset({S.RECOVERING, S.READY}),
    S.READY: frozenset({S.IN_TRANSACTION}),
    S.IN_TRANSACTION: frozenset({S.PREPARING, S.COMMITTING, S.ABORTING, S.ABORTABLE}),
    S.PREPARING: frozenset({S.PREPARED, S.ABORTABLE}),
    S.PREPARED: frozenset({S.IN_DOUBT, S.ABORTING}),
    S.IN_DOUBT: frozenset({S.IN_DOUBT, S.READY}),
    S.COMMITTING: frozenset({S.COMMITTING, S.READY, S.ABORTABLE}),
    S.ABORTABLE: frozenset({S.ABORTING}),
    S.ABORTING: frozenset({S.ABORTING, S.READY}),
    S.FATAL: frozenset(),
    S.CLOSED: frozenset(),
}
"""Legal moves besides ``* -> FATAL`` and ``* -> CLOSED`` (from any state but CLOSED)."""

ALLOWED: Final[Mapping[str, frozenset[State]]] = {
    "init_transactions": frozenset({S.NEW}),
    "init_transactions(keep_prepared_txn=True)": frozenset({S.NEW, S.RECOVERING}),
    "begin_transaction": frozenset({S.READY, S.ABORTING}),  # ABORTING: finished first
    "produce": frozenset({S.IN_TRANSACTION}),
    "send": frozenset({S.IN_TRANSACTION}),
    "produce_batch": frozenset({S.IN_TRANSACTION}),
    "send_offsets_to_transaction": frozenset({S.IN_TRANSACTION}),
    "prepare_transaction": frozenset({S.IN_TRANSACTION}),
    "commit_transaction": frozenset(
        {S.IN_TRANSACTION, S.COMMITTING, S.PREPARED, S.IN_DOUBT, S.RECOVERING}
    ),
    "abort_transaction": frozenset(
        {S.IN_TRANSACTION, S.ABORTABLE, S.ABORTING, S.PREPARED, S.RECOVERING}
    ),
    "complete_transaction": frozenset({S.PREPARED, S.IN_DOUBT, S.RECOVERING}),
    "poll": _ANY_LIVE - {S.FATAL},
    "flush": _ANY_LIVE - {S.FATAL},
    "close": frozenset(State),
}
"""Public call -> the states it is allowed in. ``commit_transaction`` in ABORTABLE raises
``CommitFailedException`` rather than an illegal-state error (KIP-691); ``close`` is
always allowed (a second one does nothing)."""

_HINTS: Final[Mapping[State, str]] = {
    S.NEW: "call init_transactions() first",
    S.READY: "no transaction is open: call begin_transaction() first",
    S.IN_TRANSACTION: "a transaction is already open: commit or abort it first",
    S.PREPARING: "prepare_transaction() is running: sends are refused from its start",
    S.PREPARED: (
        "the transaction is prepared: only complete_transaction(), commit_transaction() "
        "or abort_transaction() may follow"
    ),
    S.IN_DOUBT: (
        "the prepared transaction's commit did not complete and the decision may already "
        "be 'commit': call commit_transaction() again, or close() and recover it from the "
        "stored state; it is never aborted"
    ),
    S.COMMITTING: (
        "commit_transaction() is running, or ran out of time and the broker may already "
        "have committed: call commit_transaction() again, or close() the producer and let "
        "the next init_transactions() settle the transaction; never abort it"
    ),
    S.ABORTING: (
        "abort_transaction() is running, or ran out of time: call abort_transaction() "
        "again (begin_transaction() also finishes it first)"
    ),
    S.ABORTABLE: "the transaction failed: call abort_transaction()",
    S.RECOVERING: (
        "init_transactions(keep_prepared_txn=True) was called: settle the kept transaction "
        "with complete_transaction(stored_state) first"
    ),
    S.FATAL: "the producer hit a fatal error: close it",
    S.CLOSED: "the producer is closed",
}


def is_valid(source: State, target: State) -> bool:
    """True if the lifecycle may move from ``source`` to ``target``."""
    if source is S.CLOSED:
        return False
    return target in (S.FATAL, S.CLOSED) or target in TRANSITIONS[source]


class Lifecycle:
    """The current state of one producer, and the errors that put it there; moves only
    along ``TRANSITIONS``. Pure: no I/O, and no lock of its own (the producer's
    transactional calls hold the producer's lock)."""

    __slots__ = ("_name", "abortable", "fatal", "fatal_from", "state")

    def __init__(self, name: str) -> None:
        self._name = name
        self.state = S.NEW
        self.fatal: FatalError | None = None
        """The error that made the producer unusable; every later call raises it."""
        self.fatal_from: State | None = None
        """The state the producer was in when that error came (close() decides by it
        whether the open transaction may be aborted)."""
        self.abortable: KafkaTxnError | None = None
        """Why the open transaction cannot commit (reset by a successful abort)."""

    def transition_to(self, target: State) -> None:
        """Move to ``target``; an illegal move is a bug in this library and raises."""
        source = self.state
        if not is_valid(source, target):
            raise IllegalStateError(
                f"internal error: illegal producer state change {source.value!r} -> "
                f"{target.value!r} for {self._name!r}; please report it"
            )
        if source is not target and log.isEnabledFor(logging.DEBUG):
            log.debug("producer %r: %s -> %s", self._name, source.value, target.value)
        self.state = target

    def finish(self, target: State) -> bool:
        """A blocking call has returned: move to ``target``, unless close() ran while it
        did (a signal handler on the calling thread: the producer's lock is reentrant).
        Then the producer stays CLOSED and this returns False; the caller reports what
        its call did at the broker, or ``closed_while`` where that cannot be used."""
        if self.state is S.CLOSED:
            return False
        self.transition_to(target)
        return True

    def closed_while(self, operation: str, outcome: str) -> IllegalStateError:
        """The error for a call whose producer close() closed while it ran."""
        return IllegalStateError(
            f"{_call(operation)}: close() closed the producer while the call ran (from a "
            f"signal handler?): {outcome}"
        )

    def enter_fatal(self, exc: FatalError) -> None:
        """The producer is unusable; the first fatal error is the one every call raises."""
        if self.fatal is None:
            self.fatal = exc
            self.fatal_from = self.state
            log.error(
                "producer %r is now unusable: %s", self._name, exc,
                extra={"transactional_id": self._name, "error_code": exc.kafka_error.name()},
            )  # fmt: skip
        if self.state not in (S.CLOSED, S.FATAL):
            self.transition_to(S.FATAL)

    def enter_abortable(self, exc: KafkaTxnError) -> None:
        """The open transaction cannot commit. A prepared or in-doubt one keeps its
        state: it is never turned into an abort here."""
        if self.abortable is None:
            self.abortable = exc
        if self.state in (S.IN_TRANSACTION, S.COMMITTING, S.PREPARING):
            self.transition_to(S.ABORTABLE)

    def aborted(self) -> None:
        """A successful abort: ready for the next transaction."""
        self.abortable = None
        self.transition_to(S.READY)

    def require(self, operation: str) -> None:
        """Raise unless ``ALLOWED`` lists the current state for ``operation``."""
        if self.state in ALLOWED[operation]:
            return
        self.raise_if_dead(operation)
        err = self.refusal(operation)
        if self.state is S.ABORTABLE and self.abortable is not None:
            raise err from root_exception(self.abortable)
        raise err

    def raise_if_dead(self, operation: str) -> None:
        if self.fatal is not None:
            raise self.fatal.with_traceback(None)
        if self.state is S.CLOSED:
            raise IllegalStateError(f"{_call(operation)} called after close()")

    def refuse_send(self, operation: str) -> None:
        """Raise for a send outside IN_TRANSACTION: after a failure, the abortable error
        that explains it (KIP-691); otherwise the illegal-state error."""
        if self.state is S.ABORTABLE and self.abortable is not None:
            raise TransactionAbortableError(
                f"{operation}() refused: the transaction already failed "
                f"({self.abortable.message}); call abort_transaction()",
                kafka_error=self.abortable.kafka_error,
            ) from root_exception(self.abortable)
        self.require(operation)

    def refusal(self, operation: str) -> IllegalStateError:
        """The error for ``operation`` called in the current state, with the way on."""
        state = self.state
        if operation.startswith("init_transactions") and state is not S.NEW:
            hint = "init_transactions() was already called"
        else:
            hint = _HINTS[state]
        return IllegalStateError(f"{_call(operation)} not allowed in state '{state.value}': {hint}")


def _call(operation: str) -> str:
    """``operation`` as written in a message: ``begin_transaction()``, and
    ``init_transactions(keep_prepared_txn=True)`` as it is."""
    return operation if operation.endswith(")") else f"{operation}()"


def render_mermaid() -> str:
    """The lifecycle as a Mermaid state diagram, for docs/guide/producer.md."""
    lines = ["```mermaid", "stateDiagram-v2", "    [*] --> new"]
    for source, targets in TRANSITIONS.items():
        for target in sorted(targets, key=lambda s: list(State).index(s)):
            if target is not source:
                lines.append(f"    {_node(source)} --> {_node(target)}")
    # The implicit moves (is_valid), drawn once: fatal error -> closed -> end.
    lines.append(f"    {_node(S.FATAL)} --> {_node(S.CLOSED)}")
    lines.append(f"    {_node(S.CLOSED)} --> [*]")
    lines.append("    note right of fatal_error: every live state can move to fatal error")
    lines.append("    note right of closed: close() is allowed in every state")
    lines.append("```")
    return "\n".join(lines) + "\n"


def _node(state: State) -> str:
    return state.value.replace(" ", "_")
