"""The producer's declared lifecycle (``kafka_txn.producer.lifecycle``), checked against a
specification written out here, independently of the code: every (state, state) move and
every (state, call) pair is a test of its own, first on the pure ``Lifecycle``, then on a
real ``TransactionalProducer`` driven into each state.

Why a second copy of the table: a test that derives its expectations from ``TRANSITIONS``
and ``ALLOWED`` passes whatever they say. Here a changed entry fails until the
specification below is changed too, on purpose, by whoever changes the lifecycle.

Every state is reached with a real producer. Most on the rig's broker; three on
librdkafka's mock cluster, because they need a request to fail on demand, which a real
broker does not do: COMMITTING and ABORTING (a commit or an abort whose EndTxn keeps
failing with a retriable error until the deadline: ``TransactionOutcomeUnknownError``)
and IN_DOUBT (the same for a prepared transaction's commit; the mock lacks
DescribeTransactions, so prepare's coordinator step is answered as Apache Kafka would,
as in tests/twophase/test_prepare_adversaries.py). PREPARING lasts only while
``prepare_transaction()`` runs, under the producer's lock: it is reached from a delivery
callback that prepare's own flush serves, on the preparing thread, and the calls it allows
(``poll``, ``flush``, ``close``) are made from another thread meanwhile, since
confluent-kafka cannot take a nested poll or flush, or a close, from inside a callback.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from kafka_txn import (
    CommitFailedException,
    FatalError,
    IllegalStateError,
    PreparedTxnState,
    ProduceFailedException,
    TransactionAbortableError,
    TransactionalProducer,
    TransactionInDoubtError,
    TransactionOutcome,
    TransactionOutcomeUnknownError,
)
from kafka_txn._docs import INDEX_GENERATED, render_lifecycle_table, update_docs
from kafka_txn.producer.lifecycle import (
    ALLOWED,
    TRANSITIONS,
    Lifecycle,
    State,
    is_valid,
    render_mermaid,
)
from kafka_txn.testing import ApiKey, MockCluster
from tests.support.adversaries import stand_in_describe
from tests.support.rig import Broker

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"
S = State
INIT = "init_transactions"
KEEP = "init_transactions(keep_prepared_txn=True)"
BEGIN = "begin_transaction"
PRODUCE = "produce"
SEND = "send"
BATCH = "produce_batch"
OFFSETS = "send_offsets_to_transaction"
PREPARE = "prepare_transaction"
COMMIT = "commit_transaction"
ABORT = "abort_transaction"
COMPLETE = "complete_transaction"
POLL = "poll"
FLUSH = "flush"
CLOSE = "close"
OPERATIONS = (INIT, KEEP, BEGIN, PRODUCE, SEND, BATCH, OFFSETS, PREPARE, COMMIT, ABORT,
              COMPLETE, POLL, FLUSH, CLOSE)  # fmt: skip

# ------------------------------------------------------------------ the specification
SPEC_MOVES: dict[tuple[State, State], str] = {
    (S.NEW, S.READY): "init_transactions()",
    (S.NEW, S.RECOVERING): "init_transactions(keep_prepared_txn=True)",
    (S.RECOVERING, S.RECOVERING): "init_transactions(keep_prepared_txn=True) again",
    (S.RECOVERING, S.READY): "the kept transaction settled, then the init",
    (S.READY, S.IN_TRANSACTION): "begin_transaction()",
    (S.IN_TRANSACTION, S.PREPARING): "prepare_transaction() starts",
    (S.IN_TRANSACTION, S.COMMITTING): "commit_transaction() starts",
    (S.IN_TRANSACTION, S.ABORTING): "abort_transaction() starts",
    (S.IN_TRANSACTION, S.ABORTABLE): "a failed record, offsets or commit",
    (S.PREPARING, S.PREPARED): "prepare_transaction() succeeds",
    (S.PREPARING, S.ABORTABLE): "prepare_transaction() fails",
    (S.PREPARED, S.IN_DOUBT): "commit_transaction() / complete_transaction(its state)",
    (S.PREPARED, S.ABORTING): "abort_transaction() / complete_transaction(another state)",
    (S.IN_DOUBT, S.IN_DOUBT): "commit_transaction() again",
    (S.IN_DOUBT, S.READY): "the commit succeeds",
    (S.COMMITTING, S.COMMITTING): "commit_transaction() again after an unknown outcome",
    (S.COMMITTING, S.READY): "the commit succeeds",
    (S.COMMITTING, S.ABORTABLE): "the commit fails",
    (S.ABORTABLE, S.ABORTING): "abort_transaction()",
    (S.ABORTING, S.ABORTING): "abort_transaction() again after an unknown outcome",
    (S.ABORTING, S.READY): "the abort succeeds",
    **{(s, S.FATAL): "a fatal error" for s in State if s is not S.CLOSED},
    **{(s, S.CLOSED): "close()" for s in State if s is not S.CLOSED},
}
"""Every legal move, and what makes it; any other (state, state) pair is illegal."""


def _also(states: tuple[State, ...], ops: tuple[str, ...]) -> dict[tuple[State, str], State]:
    return {(s, op): s for s in states for op in ops}


_LIVE = (S.NEW, S.READY, S.IN_TRANSACTION, S.PREPARING, S.PREPARED, S.COMMITTING,
         S.IN_DOUBT, S.ABORTING, S.ABORTABLE, S.RECOVERING)  # fmt: skip

SPEC_CALLS: dict[tuple[State, str], State] = {
    (S.NEW, INIT): S.READY,
    (S.NEW, KEEP): S.RECOVERING,
    (S.READY, BEGIN): S.IN_TRANSACTION,
    **_also((S.IN_TRANSACTION,), (PRODUCE, SEND, BATCH, OFFSETS)),
    (S.IN_TRANSACTION, PREPARE): S.PREPARED,
    (S.IN_TRANSACTION, COMMIT): S.READY,
    (S.IN_TRANSACTION, ABORT): S.READY,
    (S.PREPARED, COMMIT): S.READY,
    (S.PREPARED, ABORT): S.READY,
    (S.PREPARED, COMPLETE): S.READY,
    (S.COMMITTING, COMMIT): S.READY,
    (S.IN_DOUBT, COMMIT): S.READY,
    (S.IN_DOUBT, COMPLETE): S.READY,
    (S.ABORTING, ABORT): S.READY,
    (S.ABORTING, BEGIN): S.IN_TRANSACTION,  # finishes the abort that ran out of time first
    (S.ABORTABLE, ABORT): S.READY,
    (S.RECOVERING, KEEP): S.RECOVERING,
    (S.RECOVERING, COMMIT): S.READY,
    (S.RECOVERING, ABORT): S.READY,
    (S.RECOVERING, COMPLETE): S.READY,
    **_also(_LIVE, (POLL, FLUSH)),
    **{(s, CLOSE): S.CLOSED for s in State},
}
"""Every (state, call) pair that is allowed, and the state a successful call leaves;
any other pair is refused."""

WAY_ON: dict[State, str] = {
    S.NEW: "init_transactions()",
    S.READY: "begin_transaction()",
    S.IN_TRANSACTION: "commit or abort",
    S.PREPARING: "prepare_transaction() is running",
    S.PREPARED: "complete_transaction()",
    S.COMMITTING: "commit_transaction() again",
    S.IN_DOUBT: "commit_transaction() again",
    S.ABORTING: "abort_transaction() again",
    S.ABORTABLE: "abort_transaction()",
    S.RECOVERING: "complete_transaction(stored_state)",
    S.FATAL: "close it",
    S.CLOSED: "closed",
}
"""What a refusal in each state must tell the caller to do (or why it must wait)."""


def _id(part: State | str) -> str:
    """A test id part: the state's name, or the call (``init_transactions_keep`` for the
    keep_prepared_txn form)."""
    if isinstance(part, State):
        return part.name
    return "init_transactions_keep" if part == KEEP else part


STATE_PAIRS = [pytest.param(a, b, id=f"{a.name}-{b.name}") for a in State for b in State]
CALL_PAIRS = [pytest.param(s, op, id=f"{s.name}-{_id(op)}") for s in State for op in OPERATIONS]


# ------------------------------------------------------------------ the pure lifecycle
def test_the_table_names_every_state_and_every_public_call():
    assert set(TRANSITIONS) == set(State)
    assert set(ALLOWED) == set(OPERATIONS)
    public = {n for n in vars(TransactionalProducer) if not n.startswith("_")}
    # Properties and the context manager (begin_transaction's own guard) aside, every
    # public method of the producer has its row.
    assert public - {"state", "in_transaction", "error_reports_only", "transaction"} == {
        op.split("(", maxsplit=1)[0] for op in OPERATIONS
    }


@pytest.mark.parametrize(("source", "target"), STATE_PAIRS)
def test_transition(source: State, target: State) -> None:
    life = Lifecycle("spec")
    life.state = source
    legal = (source, target) in SPEC_MOVES
    assert is_valid(source, target) is legal
    if legal:
        life.transition_to(target)
        assert life.state is target
    else:
        with pytest.raises(IllegalStateError) as refused:
            life.transition_to(target)
        assert life.state is source
        assert f"'{source.value}' -> '{target.value}'" in str(refused.value)


@pytest.mark.parametrize(("state", "operation"), CALL_PAIRS)
def test_require(state: State, operation: str) -> None:
    life = Lifecycle("spec")
    fatal = FatalError("fenced", kafka_error=KafkaError(KafkaError.PRODUCER_FENCED))
    if state is S.FATAL:
        life.enter_fatal(fatal)
    else:
        life.state = state
    abortable = TransactionAbortableError("a record failed")
    if state is S.ABORTABLE:
        life.abortable = abortable
    if (state, operation) in SPEC_CALLS:
        life.require(operation)
        assert life.state is state
        return
    expected = FatalError if state is S.FATAL else IllegalStateError
    with pytest.raises(expected) as refused:
        life.require(operation)
    assert life.state is state
    name = operation.split("(", maxsplit=1)[0]
    way_on = "already called" if name == INIT and state is not S.NEW else WAY_ON[state]
    if state is S.FATAL:
        assert refused.value is fatal  # every call raises the error that killed it
    elif state is S.CLOSED:
        assert re.fullmatch(rf"{name}\(.*\) called after close\(\)", str(refused.value))
    # In FATAL and CLOSED, the refusal message the lifecycle would give all the same.
    dead = state in (S.FATAL, S.CLOSED)
    message = str(life.refusal(operation) if dead else refused.value)
    assert message.startswith(f"{name}(") and "()()" not in message, message
    assert f"not allowed in state '{state.value}': " in message, message
    assert way_on in message, message
    if state is S.ABORTABLE:
        assert refused.value.__cause__ is abortable  # KIP-691: the failure that explains it


def _reachable(start: State, graph: Callable[[State, State], bool]) -> set[State]:
    seen, todo = {start}, deque([start])
    while todo:
        s = todo.popleft()
        for t in State:
            if t not in seen and graph(s, t):
                seen.add(t)
                todo.append(t)
    return seen


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name)
def test_every_state_is_reachable_from_new(state: State) -> None:
    assert state in _reachable(S.NEW, is_valid)


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name)
def test_every_state_can_be_closed_and_every_live_one_gets_back_to_ready(state: State) -> None:
    reachable = _reachable(state, is_valid)
    assert S.CLOSED in reachable
    if state not in (S.FATAL, S.CLOSED):
        assert S.READY in reachable  # no dead end but a fatal error and close()


def test_lifecycle_docs_are_generated_from_the_table():
    index = (DOCS / "guide" / "producer.md").read_text()
    assert update_docs(index, INDEX_GENERATED) == index, (
        "docs/guide/producer.md's lifecycle drifted from kafka_txn/producer/lifecycle.py: run "
        "`python -m kafka_txn._docs`"
    )
    assert render_mermaid() in index and render_lifecycle_table() in index
    for source, target in SPEC_MOVES:  # every move between two different states is drawn
        if source is not target and target not in (S.FATAL, S.CLOSED):
            assert f"    {_node(source)} --> {_node(target)}\n" in index
    for state, operation in SPEC_CALLS:  # and every allowed call is ticked
        row = next(line for line in index.splitlines() if line.startswith(f"| `{operation}` |"))
        assert row.split(" | ")[1 + list(State).index(state)].strip(" |") == "✓"


def _node(state: State) -> str:
    return state.value.replace(" ", "_")


# What the table tests above do not pin down (mutation testing, make mutants, shows it).
def test_a_fatal_error_is_logged_once_with_the_id_and_the_code(caplog):
    life = Lifecycle("orders-0")
    first = FatalError("fenced", kafka_error=KafkaError(KafkaError.PRODUCER_FENCED))
    with caplog.at_level(logging.ERROR, logger="kafka_txn.lifecycle"):
        life.enter_fatal(first)
        life.enter_fatal(FatalError("again", kafka_error=KafkaError(KafkaError._FENCED)))
    (record,) = caplog.records  # the first fatal error only, as every call raises it
    assert record.getMessage() == f"producer 'orders-0' is now unusable: {first}"
    # docs/guide/operations.md: structured fields for a JSON formatter.
    assert (record.transactional_id, record.error_code) == ("orders-0", "PRODUCER_FENCED")
    assert life.fatal is first and life.state is S.FATAL


def test_moves_are_logged_and_an_illegal_one_names_the_producer(caplog):
    life = Lifecycle("orders-0")
    life.state = S.IN_TRANSACTION
    with caplog.at_level(logging.DEBUG, logger="kafka_txn.lifecycle"):
        life.transition_to(S.ABORTING)
        life.transition_to(S.ABORTING)  # a retried abort: no move, nothing logged
    assert [r.getMessage() for r in caplog.records] == [
        "producer 'orders-0': in transaction -> aborting"
    ]
    life.state = S.CLOSED
    with pytest.raises(IllegalStateError, match="'closed' -> 'ready' for 'orders-0'"):
        life.transition_to(S.READY)


def test_a_call_with_its_arguments_is_named_as_written():
    life = Lifecycle("spec")
    life.state = S.READY
    assert str(life.refusal(KEEP)) == (
        "init_transactions(keep_prepared_txn=True) not allowed in state 'ready': "
        "init_transactions() was already called"
    )
    assert str(life.refusal(INIT)).startswith("init_transactions() not allowed")


def test_after_an_abort_the_next_failure_is_the_one_reported():
    life = Lifecycle("spec")
    life.state = S.IN_TRANSACTION
    failures = []
    for text in ("first failure", "second failure"):
        failure = TransactionAbortableError(text, kafka_error=KafkaError(KafkaError._MSG_TIMED_OUT))
        failures.append(failure)
        life.enter_abortable(failure)
        assert life.state is S.ABORTABLE and life.abortable is failure
        with pytest.raises(TransactionAbortableError) as refused:
            life.refuse_send("produce")
        assert str(refused.value) == (
            f"produce() refused: the transaction already failed ({text}); call abort_transaction()"
        )
        assert refused.value.kafka_error is failure.kafka_error
        assert refused.value.__cause__ is failure
        life.transition_to(S.ABORTING)
        life.aborted()
        assert life.state is S.READY and life.abortable is None
        life.transition_to(S.IN_TRANSACTION)


@pytest.mark.parametrize("state", [S.PREPARED, S.IN_DOUBT], ids=lambda s: s.name)
def test_a_prepared_transaction_that_failed_is_not_told_to_abort(state: State):
    # enter_abortable keeps a prepared or in-doubt transaction's state: the send is
    # refused as illegal there, without the advice (and the cause) of ABORTABLE.
    life = Lifecycle("spec")
    life.state = state
    life.enter_abortable(TransactionAbortableError("a record failed"))
    assert life.state is state
    for call in (lambda: life.refuse_send("produce"), lambda: life.require(BEGIN)):
        with pytest.raises(IllegalStateError) as refused:
            call()
        assert not isinstance(refused.value, TransactionAbortableError)
        assert refused.value.__cause__ is None


# ------------------------------------------------------------------ real producers
TWO_PC = {"transaction.two.phase.commit.enable": True}
MOCK_TOPIC = "lifecycle"
ON_MOCK = frozenset({S.COMMITTING, S.IN_DOUBT, S.ABORTING})
"""States reached on librdkafka's mock cluster (see the module docstring)."""


@dataclass
class Driven:
    """A producer driven into a state, and what it holds there."""

    producer: TransactionalProducer
    topic: str
    kept: list[bytes] = field(default_factory=list)
    """Records the transaction holds: committed by the way on, unless it aborts."""
    stored: PreparedTxnState | None = None
    """The prepared state, as a database would have stored it."""
    fatal: FatalError | None = None


class Bench:
    """Builds producers into each state; closes everything it built."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.txn_id = f"life-{uuid.uuid4().hex[:12]}"
        self._producers: list[TransactionalProducer] = []
        self._consumers: list[Consumer] = []
        self._mock: MockCluster | None = None

    @property
    def mock(self) -> MockCluster:
        if self._mock is None:
            self._mock = MockCluster(brokers=1)
            self._mock.create_topic(MOCK_TOPIC, partitions=1)
        return self._mock

    def producer(self, *, mock: bool = False, **kwargs: Any) -> TransactionalProducer:
        conf: dict[str, Any] = {"transactional.id": self.txn_id, **TWO_PC}
        if mock:
            conf |= {"bootstrap.servers": self.mock.bootstrap_servers, "retry.backoff.ms": 10}
            kwargs.setdefault("operation_timeout", 1.0)
        else:
            conf["bootstrap.servers"] = self.broker.bootstrap_servers
        p = TransactionalProducer(conf, **kwargs)
        self._producers.append(p)
        return p

    def group_metadata(self, driven: Driven) -> Any:
        consumer = Consumer(
            {
                "bootstrap.servers": self.broker.bootstrap_servers,
                "group.id": f"g-{self.txn_id}",
                "enable.auto.commit": False,
            }
        )
        self._consumers.append(consumer)
        return consumer.consumer_group_metadata()

    def visible(self, topic: str, expected: int) -> list[bytes]:
        got = self.broker.read_committed(topic, expected=expected, linger=0.3)
        return sorted(value or b"" for _, value in got)

    def close(self) -> None:
        for p in self._producers:
            p.close(timeout=2)
        for c in self._consumers:
            c.close()
        if self._mock is not None:
            self._mock.close()


@pytest.fixture
def bench(broker: Broker) -> Iterator[Bench]:
    b = Bench(broker)
    yield b
    b.close()


def _in_transaction(bench: Bench, **produce: Any) -> Driven:
    p = bench.producer()
    p.init_transactions()
    p.begin_transaction()
    d = Driven(p, bench.broker.create_topic(partitions=3), kept=[b"kept"])
    p.produce(d.topic, b"kept", **produce)
    return d


def _on_mock(bench: Bench, *, prepared: bool) -> Driven:
    p = bench.producer(mock=True)
    p.init_transactions()
    if prepared:
        stand_in_describe(p)
    p.begin_transaction()
    p.produce(MOCK_TOPIC, b"kept")
    p.flush()  # the partition joins the transaction: EndTxn has something to end
    d = Driven(p, MOCK_TOPIC, kept=[b"kept"])
    if prepared:
        d.stored = p.prepare_transaction()
    # A retriable EndTxn error on every try until the deadline: the outcome is unknown.
    bench.mock.push_request_errors(
        ApiKey.END_TXN, *[KafkaError.COORDINATOR_LOAD_IN_PROGRESS] * 1000
    )
    return d


def _drive(bench: Bench, state: State, during: Callable[[Driven], None]) -> Driven:
    """A producer in ``state``, with ``during(driven)`` called while it is there. For
    PREPARING that is inside a delivery callback served by prepare's flush; the producer
    then goes on to PREPARED."""
    if state is S.PREPARING:
        return _preparing(bench, during)
    if state is S.NEW:
        d = Driven(bench.producer(), bench.broker.create_topic(partitions=3))
    elif state is S.READY:
        d = Driven(bench.producer(), bench.broker.create_topic(partitions=3))
        d.producer.init_transactions()
    elif state is S.IN_TRANSACTION:
        d = _in_transaction(bench)
    elif state is S.PREPARED:
        d = _in_transaction(bench)
        d.stored = d.producer.prepare_transaction()
    elif state is S.COMMITTING:
        d = _on_mock(bench, prepared=False)
        with pytest.raises(TransactionOutcomeUnknownError):
            d.producer.commit_transaction()
    elif state is S.IN_DOUBT:
        d = _on_mock(bench, prepared=True)
        with pytest.raises(TransactionInDoubtError):
            d.producer.commit_transaction()
    elif state is S.ABORTING:
        d = _on_mock(bench, prepared=False)
        with pytest.raises(TransactionOutcomeUnknownError):
            d.producer.abort_transaction()
    elif state is S.ABORTABLE:
        d = _in_transaction(bench)
        # A partition the topic does not have: refused now or at delivery.
        with contextlib.suppress(ProduceFailedException):
            d.producer.produce(d.topic, b"lost", partition=99)
        with pytest.raises(CommitFailedException):
            d.producer.commit_transaction()
    elif state is S.RECOVERING:
        d = _in_transaction(bench)
        d.stored = d.producer.prepare_transaction()
        d.producer.close()  # a crash after the decider stored the state: left open
        d.producer = bench.producer()
        d.producer.init_transactions(keep_prepared_txn=True)
    elif state is S.FATAL:
        d = _in_transaction(bench)
        d.producer.flush()
        bench.producer().init_transactions()  # a newer instance fences this one
        with pytest.raises(FatalError) as fenced:
            d.producer.commit_transaction()
        d.fatal, d.kept = fenced.value, []
    else:
        assert state is S.CLOSED
        d = Driven(bench.producer(), bench.broker.create_topic(partitions=3))
        d.producer.init_transactions()
        d.producer.close()
    if state in ON_MOCK:
        bench.mock.clear_request_errors(ApiKey.END_TXN)  # so that the way on works
    assert d.producer.state == state.value
    during(d)
    return d


def _preparing(bench: Bench, during: Callable[[Driven], None]) -> Driven:
    seen: list[str] = []
    failures: list[BaseException] = []
    holder: list[Driven] = []

    def on_delivery(err: object, msg: object) -> None:
        seen.append(holder[0].producer.state)
        try:
            during(holder[0])
        except BaseException as exc:  # raised below, not inside librdkafka
            failures.append(exc)

    holder.append(_in_transaction(bench, on_delivery=on_delivery))
    d = holder[0]
    d.stored = d.producer.prepare_transaction()
    if failures:
        raise failures[0]
    assert seen == [S.PREPARING.value], "the callback must run during prepare"
    return d


def _call(bench: Bench, d: Driven, operation: str, value: bytes) -> None:
    """``operation`` on the driven producer, with arguments that would work."""
    p = d.producer
    if operation == INIT:
        p.init_transactions()
    elif operation == KEEP:
        p.init_transactions(keep_prepared_txn=True)
    elif operation == BEGIN:
        p.begin_transaction()
    elif operation == PRODUCE:
        p.produce(d.topic, value)
    elif operation == SEND:
        p.send(d.topic, value)
    elif operation == BATCH:
        p.produce_batch(d.topic, [value])
    elif operation == OFFSETS:
        offsets = [TopicPartition(d.topic, 0, 1)]
        p.send_offsets_to_transaction(offsets, bench.group_metadata(d))
    elif operation == PREPARE:
        p.prepare_transaction()
    elif operation == COMMIT:
        p.commit_transaction()
    elif operation == ABORT:
        p.abort_transaction()
    elif operation == COMPLETE:
        p.complete_transaction(d.stored or PreparedTxnState.EMPTY)
    elif operation == POLL:
        p.poll(0)
    elif operation == FLUSH:
        # While PREPARING, prepare's own record waits for the callback this runs under.
        p.flush(0 if p.state == S.PREPARING.value else 10)
    else:
        assert operation == CLOSE
        p.close()


def _refusal(state: State, operation: str) -> type[Exception]:
    """The error a refused call raises: the fatal error in FATAL; in ABORTABLE, the
    transaction's failure for the calls that would add to it or commit it (KIP-691);
    otherwise IllegalStateError."""
    if state is S.FATAL:
        return FatalError
    if state is S.ABORTABLE and operation == COMMIT:
        return CommitFailedException
    if state is S.ABORTABLE and operation in (PRODUCE, SEND, BATCH, PREPARE):
        return TransactionAbortableError
    return IllegalStateError


def _in_thread(fn: Callable[[], object]) -> None:
    """Run ``fn`` in another thread and wait for it; re-raise what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the call did not return"
    if raised:
        raise raised[0]


def _param(state: State, *rest: Any) -> Any:
    mark = pytest.mark.mock if state in ON_MOCK else pytest.mark.broker
    return pytest.param(state, *rest, marks=mark, id="-".join(_id(p) for p in (state, *rest)))


@pytest.mark.parametrize("state", [_param(s) for s in State])
def test_every_call_in_each_state(bench: Bench, state: State) -> None:
    """A real producer in ``state``: every refused call raises its documented error and
    changes nothing (same state; every record the transaction held is still committed
    by the way on, and no refused record ever is); every allowed call that keeps the
    state works."""
    refused = [op for op in OPERATIONS if (state, op) not in SPEC_CALLS]
    staying = [op for op in OPERATIONS if SPEC_CALLS.get((state, op)) is state]

    def during(d: Driven) -> None:
        p = d.producer
        in_transaction = p.in_transaction
        for op in refused:
            expected = _refusal(state, op)
            with pytest.raises(expected) as caught:
                _call(bench, d, op, b"refused-" + op.encode())
            err = caught.value
            assert p.state == state.value and p.in_transaction is in_transaction, op
            if expected is TransactionAbortableError:
                assert not isinstance(err, CommitFailedException)
            if expected is FatalError:
                assert err is d.fatal, "every call raises the error that killed it"
            if expected is IllegalStateError:
                message, name = str(err), op.split("(", maxsplit=1)[0]
                assert name in message and "()()" not in message, message
                assert (state.value if state is not S.CLOSED else "close()") in message
            if op == BEGIN:  # the context manager begins the same way
                with pytest.raises(expected), p.transaction():
                    pass
                assert p.state == state.value
        for op in staying:
            value = b"allowed-" + op.encode()
            if state is S.PREPARING:  # from another thread: this one holds the lock
                _in_thread(lambda op=op, value=value: _call(bench, d, op, value))
            else:
                _call(bench, d, op, value)
            assert p.state == state.value, op
            if op in (PRODUCE, SEND, BATCH):
                d.kept.append(value)

    d = _drive(bench, state, during)
    p = d.producer
    # The way on, and nothing lost: exactly the records the transaction held commit.
    if state in (S.NEW, S.READY):
        if state is S.NEW:
            p.init_transactions()
        with p.transaction():
            p.produce(d.topic, b"after")
        d.kept = [b"after"]
    elif state in (S.IN_TRANSACTION, S.COMMITTING, S.IN_DOUBT):
        p.commit_transaction()
    elif state in (S.PREPARING, S.PREPARED, S.RECOVERING):
        assert d.stored is not None
        assert p.complete_transaction(d.stored) is TransactionOutcome.COMMITTED
    elif state in (S.ABORTING, S.ABORTABLE):
        p.abort_transaction()
        d.kept = []
    elif state is S.FATAL:
        p.close()
    if state not in (S.FATAL, S.CLOSED):
        assert p.state == S.READY.value
    if state not in ON_MOCK:  # the mock cluster does not hide aborted records
        assert bench.visible(d.topic, len(d.kept)) == sorted(d.kept)


MOVING = [_param(s, op) for (s, op), after in SPEC_CALLS.items() if after is not s]


@pytest.mark.parametrize(("state", "operation"), MOVING)
def test_allowed_call_moves_to_its_state(bench: Bench, state: State, operation: str) -> None:
    """Each allowed call that changes the state, on a fresh producer in ``state``: it
    works, leaves the state the specification names, and does what it says to the
    records the transaction held."""
    expected = SPEC_CALLS[(state, operation)]
    closer: list[threading.Thread] = []

    def during(d: Driven) -> None:
        if state is S.PREPARING:  # close() from another thread waits for prepare to end
            started = threading.Event()

            def close() -> None:
                started.set()
                d.producer.close()

            closer.append(threading.Thread(target=close))
            closer[0].start()
            assert started.wait(10)
            assert d.producer.state == S.PREPARING.value

    d = _drive(bench, state, during)
    if closer:
        closer[0].join(30)
        assert not closer[0].is_alive()
    else:
        _call(bench, d, operation, b"allowed")
    assert d.producer.state == expected.value
    if state in ON_MOCK or state in (S.NEW, S.READY, S.FATAL, S.CLOSED):
        return
    # What became of the transaction's records.
    commits = operation in (COMMIT, COMPLETE)
    if operation == PREPARE:
        assert (
            d.producer.complete_transaction(
                d.producer._twophase.prepared  # type: ignore[union-attr]
            )
            is TransactionOutcome.COMMITTED
        )
        commits = True
    if operation == CLOSE and d.stored is not None:  # left open, for recovery to commit
        assert bench.visible(d.topic, 0) == []
        fresh = bench.producer()
        fresh.init_transactions(keep_prepared_txn=True)
        assert fresh.complete_transaction(d.stored) is TransactionOutcome.COMMITTED
        commits = True
    expected_records = sorted(d.kept) if commits else []
    assert bench.visible(d.topic, len(expected_records)) == expected_records
