"""Two-phase commit on one producer against its adversaries: threads sending while another
thread prepares, a commit that fails after the decision, a prepare that fails inside
the coordinator call (scenarios 2, 3 and 5 below), and a send interrupted by a signal
before prepare. Each schedule is a test."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kafka_txn import (
    CommitFailedException,
    FatalError,
    IllegalStateError,
    InvalidPreparedStateError,
    PreparedTxnState,
    TransactionAbortableError,
    TransactionalProducer,
    TransactionInDoubtError,
    TransactionOutcome,
    UnsupportedBrokerError,
)
from kafka_txn.cli.local_broker import LocalBroker
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.coordinator.client import TransactionDescription
from kafka_txn.testing import ApiKey
from tests.support import adversaries as support
from tests.support.adversaries import interrupt_after, stand_in_describe
from tests.support.rig import Broker, freeze

pytestmark = pytest.mark.adversary

TWO_PC = {"transaction.two.phase.commit.enable": True}

two_phase_config = support.two_phase_config


# ---------------------------------------------------------------- scenario 2: sends vs prepare
@pytest.mark.broker
@pytest.mark.guarantee("2.1")
def test_sends_from_other_threads_during_prepare_are_refused_or_covered(broker, producer_config):
    """Four threads send as fast as they can while the main thread prepares. Every send
    either returned normally (then its record is in the prepared transaction) or raised
    IllegalStateError (then it is not): after a commit, a read_committed consumer sees
    exactly the records whose send returned, nothing more, nothing less."""
    topic = broker.create_topic(partitions=3)
    producer = TransactionalProducer({**producer_config, **TWO_PC})
    producer.init_transactions()
    accepted: list[list[bytes]] = [[] for _ in range(4)]
    refused = [0] * 4
    started = threading.Barrier(5)

    def sender(n: int) -> None:
        started.wait()
        for i in range(100_000):
            value = b"t%d-%d" % (n, i)
            try:
                if i % 2:
                    producer.produce(topic, value)
                else:
                    producer.send(topic, value)
            except IllegalStateError:
                refused[n] += 1
                return
            accepted[n].append(value)

    try:
        producer.begin_transaction()
        threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.05)  # let them get going
        state = producer.prepare_transaction()
        for t in threads:
            t.join(timeout=30)
        assert all(refused), "every sender must have been refused once prepare began"
        assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
        sent = sorted(v for values in accepted for v in values)
        assert sent, "the senders sent nothing before prepare"
        seen = sorted(v for _, v in broker.read_committed(topic, expected=len(sent)))
        assert seen == sent
    finally:
        producer.close()


@pytest.mark.broker
@pytest.mark.guarantee("2.1")
def test_send_during_prepare_raises_illegal_state(broker, producer_config):
    """A send that comes in while prepare is under way (here: from a delivery callback
    served by prepare's own flush) is refused with IllegalStateError."""
    topic = broker.create_topic()
    errors: list[BaseException] = []
    producer = TransactionalProducer({**producer_config, **TWO_PC})

    def on_delivery(err, msg):
        try:
            producer.produce(topic, b"late")
        except IllegalStateError as exc:
            errors.append(exc)

    producer.init_transactions()
    try:
        producer.begin_transaction()
        producer.produce(topic, b"first", on_delivery=on_delivery)
        state = producer.prepare_transaction()
        assert len(errors) == 1 and "preparing" in str(errors[0])
        producer.complete_transaction(state)
        assert broker.read_committed(topic, expected=1) == [(None, b"first")]
    finally:
        producer.close()


# ---------------------------------------------------------------- the decision handed back
def _foreign(state: PreparedTxnState, kind: str) -> PreparedTxnState:
    if kind == "another transactional id":
        return state.model_copy(update={"transactional_id": "some-other-writer"})
    if kind == "another cluster":
        return state.model_copy(update={"cluster_id": "another-cluster"})
    return PreparedTxnState(f"{state.producer_id}:{state.producer_epoch}")  # Java form


@pytest.mark.broker
@pytest.mark.parametrize(
    "kind", ["another transactional id", "another cluster", "java pid:epoch form"]
)
@pytest.mark.guarantee("2.5")
def test_a_state_that_is_no_decision_about_this_transaction_is_refused_not_taken_as_abort(
    broker, producer_config, kind
):
    """The decider committed the prepared transaction; complete_transaction() is then
    handed a state that is not about this transactional id's transactions (another id,
    another cluster, or no start time as in the Java "pid:epoch" form). It raises
    InvalidPreparedStateError and the transaction stays prepared: it is not aborted,
    and the right state still commits it."""
    topic = broker.create_topic(partitions=1)
    producer = TransactionalProducer({**producer_config, **TWO_PC})
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"order-1")
        state = producer.prepare_transaction()
        with pytest.raises(InvalidPreparedStateError):
            producer.complete_transaction(_foreign(state, kind))
        assert producer.state == "prepared"
        assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]
    finally:
        producer.close()


@pytest.mark.broker
@pytest.mark.guarantee("2.4")
def test_the_state_of_an_earlier_transaction_aborts_and_the_prepared_one_commits(
    broker, producer_config
):
    """What the decider hands back decides: the stored state of an earlier transaction
    of this id (the database rolled back, keeping the previous state) aborts; the
    prepared transaction's own state commits it, also when marked completed."""
    topic = broker.create_topic(partitions=1)
    producer = TransactionalProducer({**producer_config, **TWO_PC})
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"first")
        earlier = producer.prepare_transaction()
        assert producer.complete_transaction(earlier) is TransactionOutcome.COMMITTED
        producer.begin_transaction()
        producer.produce(topic, b"rolled-back")
        producer.prepare_transaction()
        assert producer.complete_transaction(earlier) is TransactionOutcome.ABORTED
        producer.begin_transaction()
        producer.produce(topic, b"second")
        state = producer.prepare_transaction()
        assert producer.complete_transaction(state.mark_completed()) is (
            TransactionOutcome.COMMITTED
        )
        assert broker.read_committed(topic, expected=2) == [(None, b"first"), (None, b"second")]
    finally:
        producer.close()


# ---------------------------------------------------------------- scenario 3: failed commit
# Every EndTxn error librdkafka 2.x distinguishes in rd_kafka_txn_handle_EndTxn
# (src/rdkafka_txnmgr.c): retried, permanent (abortable, some with an epoch bump), fatal.
_RETRIED = [
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.CONCURRENT_TRANSACTIONS,
]
_PERMANENT = [
    KafkaError.UNKNOWN_PRODUCER_ID,
    KafkaError.INVALID_PRODUCER_ID_MAPPING,
    KafkaError.UNKNOWN,
    KafkaError.INVALID_REQUEST,
    KafkaError.NOT_ENOUGH_REPLICAS,
]
_FATAL = [
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.PRODUCER_FENCED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.INVALID_TXN_STATE,
]


@pytest.mark.mock
@pytest.mark.parametrize("code", _RETRIED + _PERMANENT + _FATAL, ids=lambda c: KafkaError(c).name())
@pytest.mark.guarantee("2.3")
def test_end_txn_error_after_prepare_is_in_doubt_and_never_aborted(mock_cluster, mock_config, code):
    """Once prepared, a commit failure is TransactionInDoubtError, never a
    CommitFailedException; abort is refused; the producer is never 'abortable'."""
    mock_cluster.create_topic("t", partitions=1)
    producer = TransactionalProducer(mock_config(**TWO_PC), operation_timeout=2.0)
    producer.init_transactions()
    stand_in_describe(producer)
    producer.begin_transaction()
    producer.produce("t", b"x")
    state = producer.prepare_transaction()
    # Retried codes keep failing until the deadline; the others fail at once.
    mock_cluster.push_request_errors(ApiKey.END_TXN, *([code] * (500 if code in _RETRIED else 1)))
    with pytest.raises(TransactionInDoubtError) as caught:
        producer.complete_transaction(state)
    in_doubt = caught.value
    assert not isinstance(in_doubt, CommitFailedException)
    assert in_doubt.prepared_state == str(state)
    assert in_doubt.retriable is (code in _RETRIED)
    assert "not aborted" in str(in_doubt) and "recover" in str(in_doubt)
    assert in_doubt.__cause__ is not None and in_doubt.__cause__.__cause__ is None  # wrap once
    expected_state = "fatal error" if code in _FATAL else "in doubt"
    assert producer.state == expected_state
    refused = FatalError if code in _FATAL else IllegalStateError
    with pytest.raises(refused):
        producer.abort_transaction()
    with pytest.raises((TransactionInDoubtError, FatalError)):
        producer.complete_transaction(state)
    assert producer.state == expected_state
    producer.close()  # leaves it open: see the real-broker test below
    assert producer.state == "closed"


def _pause(broker: LocalBroker) -> None:
    freeze(broker._proc.pid)


def _resume(broker: LocalBroker) -> None:
    os.kill(broker._proc.pid, signal.SIGCONT)


@pytest.mark.broker
@pytest.mark.guarantee("2.3")
def test_commit_that_fails_after_the_decision_is_recovered_not_aborted():
    """The schedule of scenario 3 on a real broker: prepare, the database commits, the
    broker stops answering while Kafka commits (the call fails after the decision), the
    application closes. Kafka still holds the transaction (not aborted), and a fresh
    producer's recovery from the stored state commits it: the records become visible to
    an independent read_committed consumer, exactly once. A private broker, since the test
    freezes it (SIGSTOP)."""
    with LocalBroker() as local:
        rig = Broker(local.bootstrap_servers, local.description)
        topic = rig.create_topic(partitions=2)
        conf = {
            "bootstrap.servers": local.bootstrap_servers,
            "transactional.id": "in-doubt-1",
            "socket.timeout.ms": 10_000,
            **TWO_PC,
        }
        producer = TransactionalProducer(conf, operation_timeout=1.5)
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, b"r%d" % i)
        stored = producer.prepare_transaction()  # ... the database commits `stored` here
        _pause(local)
        try:
            with pytest.raises(TransactionInDoubtError) as caught:
                producer.complete_transaction(stored)
            assert caught.value.retriable
            with pytest.raises(IllegalStateError):
                producer.abort_transaction()
            producer.close()
        finally:
            _resume(local)
        settings = ConnectionSettings.from_librdkafka(conf)
        with CoordinatorClient(settings, "in-doubt-1") as client:
            seen = client.describe()
        assert seen.state in ("Ongoing", "PrepareCommit", "CompleteCommit"), seen
        assert seen.start_time_ms == stored.txn_start_ms
        fresh = TransactionalProducer(conf)
        fresh.init_transactions(keep_prepared_txn=True)
        outcome = fresh.complete_transaction(str(stored))
        assert outcome in (TransactionOutcome.COMMITTED, TransactionOutcome.ALREADY_COMMITTED)
        fresh.close()
        got = sorted(v for _, v in rig.read_committed(topic, expected=5))
        assert got == [b"r%d" % i for i in range(5)]


# ---------------------------------------------------------------- scenario 5: prepare fails
@pytest.mark.mock
@pytest.mark.guarantee("2.2")
def test_prepare_failing_in_the_coordinator_call_leaves_the_transaction_abortable(
    mock_cluster, mock_config
):
    """The mock cluster lacks DescribeTransactions: prepare raises UnsupportedBrokerError,
    and the producer must need an abort; a commit may not bypass the protocol."""
    mock_cluster.create_topic("t", partitions=1)
    producer = TransactionalProducer(mock_config(**TWO_PC), operation_timeout=2.0)
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce("t", b"x")
    with pytest.raises(UnsupportedBrokerError):
        producer.prepare_transaction()
    assert producer.state == "abortable error"
    with pytest.raises(CommitFailedException) as caught:
        producer.commit_transaction()
    assert isinstance(caught.value.__cause__, UnsupportedBrokerError)
    with pytest.raises(TransactionAbortableError):
        producer.produce("t", b"y")
    producer.abort_transaction()
    assert producer.state == "ready"
    producer.close()


@pytest.mark.mock
@pytest.mark.parametrize(
    ("code", "fatal"),
    [
        (KafkaError.COORDINATOR_NOT_AVAILABLE, False),
        (KafkaError.UNKNOWN_PRODUCER_ID, False),
        (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, True),
        (KafkaError.UNKNOWN, True),
    ],
    ids=lambda c: KafkaError(c).name() if isinstance(c, int) and not isinstance(c, bool) else "",
)
@pytest.mark.guarantee("2.2")
def test_prepare_refused_by_the_coordinator_never_leaves_it_committable(
    mock_cluster, mock_config, code, fatal
):
    """A coordinator that refuses DescribeTransactions (or stays unreachable past the
    deadline) fails the prepare: the transaction needs an abort, never a commit; a code
    the error table calls fatal (authorization, unexpected) makes the producer fatal,
    whichever client met it (one translation for librdkafka and the coordinator client)."""
    from kafka_txn.coordinator import CoordinatorError

    mock_cluster.create_topic("t", partitions=1)
    producer = TransactionalProducer(mock_config(**TWO_PC), operation_timeout=1.0)
    producer.init_transactions()
    twophase = producer._twophase
    assert twophase is not None

    def refuse() -> TransactionDescription:
        raise CoordinatorError("DescribeTransactions", code)

    twophase.client.describe = refuse  # type: ignore[method-assign]
    producer.begin_transaction()
    producer.produce("t", b"x")
    with pytest.raises(FatalError if fatal else TransactionAbortableError):
        producer.prepare_transaction()
    if fatal:
        assert producer.state == "fatal error"
        with pytest.raises(FatalError):
            producer.commit_transaction()
    else:
        assert producer.state == "abortable error"
        with pytest.raises(CommitFailedException):
            producer.commit_transaction()
        producer.abort_transaction()
    producer.close()


# ---------------------------------------------------------------- a send interrupted by a signal
def _order_commits_once_or_is_refused(
    broker: Broker, producer: TransactionalProducer, topic: str
) -> None:
    """The transaction holding the order sent again: prepared and committed with the
    order once, or refused at prepare and aborted with nothing visible."""
    try:
        state = producer.prepare_transaction()
    except TransactionAbortableError:  # refusing to prepare keeps the promise too
        producer.abort_transaction()
        assert broker.read_committed(topic, expected=0) == []
        return
    assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
    assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]


@pytest.mark.guarantee("2.1")
def test_a_send_that_raised_on_a_signal_is_not_in_the_prepared_transaction(
    broker: Broker, topic: str, two_phase_config: dict[str, Any]
) -> None:
    """Guarantee 2.1: a send that raised on a signal is not in the prepared transaction."""
    producer = TransactionalProducer(two_phase_config, operation_timeout=20)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        interrupt_after("produce", lambda: producer.produce(topic, b"order-1", partition=0))
        # The send raised: by the promise it is not in the transaction, so the caller
        # sends the order again.
        producer.produce(topic, b"order-1", partition=0)
        _order_commits_once_or_is_refused(broker, producer, topic)
    finally:
        producer.close(timeout=5)


@pytest.mark.parametrize("call", ["produce", "send"])
@pytest.mark.guarantee("2.1")
def test_a_send_interrupted_as_it_returns_is_not_in_the_prepared_transaction(
    broker: Broker, topic: str, two_phase_config: dict[str, Any], call: str
) -> None:
    """A signal's exception as the send returns, after librdkafka queued the record
    (raised right after the send's last C call, the ``pop`` that ends its bookkeeping of
    sends under way): the caller sends the order again, and it is in the prepared
    transaction once, or prepare refuses and nothing is visible."""
    producer = TransactionalProducer(two_phase_config, operation_timeout=20)
    send = getattr(producer, call)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        interrupt_after("pop", lambda: send(topic, b"order-1", partition=0))
        send(topic, b"order-1", partition=0)  # it raised: the caller sends it again
        _order_commits_once_or_is_refused(broker, producer, topic)
    finally:
        producer.close(timeout=5)
