"""Adversarial tests of the producer, two-phase commit and the
exactly-once loop, written from the promises only (README, docs/guarantees.md,
docs/reference/errors.md, docs/guide/two-phase-commit.md, docs/guide/eos.md).

Each test builds its schedule on the local broker (``broker`` fixture; two fresh local
brokers where a second cluster is needed), through tests/proxies/kafka_proxy.py where the
coordinator must answer something the broker would not (an EndTxn applied and then
answered with an error, a late answer, slow metadata), and checks Kafka with
kafka-python's read_committed consumer (tests/support/rig.py). A signal's exception
(KeyboardInterrupt) that arrives while a C call of confluent-kafka runs is raised by
CPython right after that call returns; ``raise_after_c_call`` (tests/support/adversaries.py)
stands for it, and a signal handler that calls ``close()`` is a profile function that does so.

Tests marked strict xfail show a promise still broken; their reason names it. The
others guard a promise against the adversary their docstring names, or show an
adversary under which the promise holds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kafka_txn import CommitFailedException, PreparedTxnState, TransactionalProducer
from kafka_txn.errors import (
    FatalError,
    IllegalStateError,
    InvalidPreparedStateError,
    KafkaTxnError,
    TransactionAbortableError,
    TransactionDivergedError,
    TransactionInDoubtError,
    TransactionOutcomeUnknowableError,
    TransactionOutcomeUnknownError,
)
from kafka_txn.twophase.recovery import TransactionOutcome
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support import adversaries as support
from tests.support.adversaries import (
    interrupt_after,
    prefixing_processor,
    prepared_then_crashed,
    record_commit_timeouts,
    recover,
    three_inputs,
    txn_config,
)
from tests.support.rig import Broker, start_noida

two_phase_config = support.two_phase_config
proxy = support.proxy


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


# --------------------------------------------------------------------------- 2.1
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


# --------------------------------------------------------------------------- 3.8
def test_complete_again_after_a_signal_right_after_recoverys_init_returns_the_outcome(
    broker: Broker, topic: str, two_phase_config: dict[str, Any]
) -> None:
    """Guarantees 3.8 and 1.6: after a signal right after recovery's init, calling
    complete_transaction() again returns the outcome."""
    # leaves the prepared transaction open, as a crash would
    stored = str(prepared_then_crashed(two_phase_config, topic, b"decided"))
    fresh = TransactionalProducer(two_phase_config, operation_timeout=20)
    try:
        fresh.init_transactions(keep_prepared_txn=True)
        state = PreparedTxnState(stored)
        interrupt_after("init_transactions", lambda: fresh.complete_transaction(state))
        assert broker.read_committed(topic, expected=1) == [(None, b"decided")]
        # 3.8: called again with the same state, it runs only what is left.
        assert fresh.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert fresh.state == "ready"
        fresh.begin_transaction()
        fresh.produce(topic, b"next")
        fresh.complete_transaction(fresh.prepare_transaction())
        assert sorted(broker.read_committed(topic, expected=2)) == [
            (None, b"decided"),
            (None, b"next"),
        ]
    finally:
        fresh.close(timeout=5)


@pytest.mark.guarantee("1.6")
def test_init_again_after_a_signal_right_after_librdkafkas_init_leaves_a_usable_producer(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """Guarantee 1.6: after a signal right after librdkafka's init, calling
    init_transactions() again leaves a usable producer."""
    producer = TransactionalProducer(producer_config, operation_timeout=20)
    try:
        interrupt_after("init_transactions", producer.init_transactions)
        assert producer.state == "new"
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"after-the-signal")
        producer.commit_transaction()
        assert broker.read_committed(topic, expected=1) == [(None, b"after-the-signal")]
    finally:
        producer.close(timeout=5)


# --------------------------------------------------------------------------- 3.3
_SINGLE_BUMP = pytest.mark.xfail(
    strict=True,
    reason="3.3 (docs/guarantees.md: ALREADY_COMMITTED 'only when the coordinator proves "
    "the stored transaction ended without an abort'; DIVERGED when 'fenced by another "
    "producer's init'): on the local broker (noida-db 0.2.3), whose InitProducerId over "
    "an open transaction bumps the epoch once (Apache Kafka bumps twice: "
    "prepareFenceProducerEpoch, then prepareIncrementProducerEpoch on the retry), a "
    "second instance's plain init_transactions() aborts the stored transaction, its "
    "next transaction then runs under epoch e+1 with a later start, and recovery "
    "matches row 11 and returns ALREADY_COMMITTED with no error while a read_committed "
    "consumer shows the records absent (recovery.decide, row 11)",
)


def test_recovery_never_reports_committed_a_transaction_another_init_aborted(
    broker: Broker, topic: str, two_phase_config: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    if "noida-db" in broker.description:  # Apache Kafka bumps twice: row 12, unknowable
        request.applymarker(_SINGLE_BUMP)
    # the database committed ``stored``; then the process died
    stored = prepared_then_crashed(two_phase_config, topic, b"decided")
    # An instance started without recovery (a misconfigured restart): its init fences
    # the prepared transaction and aborts it; it commits one transaction and stops.
    other = TransactionalProducer(two_phase_config, operation_timeout=20)
    try:
        other.init_transactions()
        other.begin_transaction()
        other.produce(topic, b"other")
        other.complete_transaction(other.prepare_transaction())
    finally:
        other.close(timeout=5)
    assert broker.read_committed(topic, expected=1) == [(None, b"other")]
    # No other instance runs now: the recovery the docs prescribe.
    fresh = TransactionalProducer(two_phase_config, operation_timeout=20)
    try:
        fresh.init_transactions(keep_prepared_txn=True)
        try:
            outcome = fresh.complete_transaction(stored)
        except (TransactionDivergedError, TransactionOutcomeUnknowableError):
            return  # reported: the caller re-sends or reconciles
        # Recovery says the stored transaction is committed: it must be there.
        assert outcome in (TransactionOutcome.COMMITTED, TransactionOutcome.ALREADY_COMMITTED)
        assert sorted(broker.read_committed(topic, expected=2)) == [
            (None, b"decided"),
            (None, b"other"),
        ]
    finally:
        fresh.close(timeout=5)


# --------------------------------------------------------------------------- 1.3 / README
_LOST_ANSWERS = pytest.mark.parametrize(
    "code",
    [KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION],
    ids=["request-timed-out", "network-exception"],
)


@_LOST_ANSWERS
def test_a_commit_the_coordinator_applied_is_never_reported_as_failed(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str, code: int
) -> None:
    """README/errors.md, CommitFailedException: a commit the coordinator applied is never
    reported as failed when a timeout or network error replaces its answer."""
    producer = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id), operation_timeout=20
    )
    try:
        producer.init_transactions()
        proxy.fail(ApiKey.END_TXN, code, forward=True, times=1)
        try:  # the README's recipe
            with producer.transaction():
                producer.produce(topic, b"order-1")
        except CommitFailedException:  # "nothing is visible: rewind inputs and retry"
            with producer.transaction():
                producer.produce(topic, b"order-1")
        except FatalError as exc:  # the outcome is unknown: never retried blindly
            assert "unknown" in str(exc)
        assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]
    finally:
        producer.close(timeout=5)


def test_processor_outputs_once_when_the_commits_answer_is_lost_after_it_applied(
    broker: Broker, proxy: KafkaProxy, txn_id: str
) -> None:
    """Guarantee 6.1: the processor outputs each input once when the commit's answer is
    lost after the coordinator applied it."""
    source, sink = three_inputs(broker, txn_id)
    processor = prefixing_processor(broker, proxy.bootstrap_servers, txn_id, source, sink)
    proxy.fail(ApiKey.END_TXN, KafkaError.REQUEST_TIMED_OUT, forward=True, times=1)
    try:
        processor.run(idle_timeout=5)
    except FatalError:  # the outcome is unknown: a successor with the same id resumes
        successor = prefixing_processor(broker, broker.bootstrap_servers, txn_id, source, sink)
        successor.run(idle_timeout=5)
    assert sorted(broker.read_committed(sink, expected=3)) == [
        (None, b"out-in-0"),
        (None, b"out-in-1"),
        (None, b"out-in-2"),
    ]


# --------------------------------------------------------------------------- 1.9
def test_a_resumed_prepared_commit_with_a_short_timeout_gets_the_retry_floor(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str
) -> None:
    """Guarantee 1.9: a resumed prepared commit with a short timeout gets the retry
    floor."""
    producer = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id, two_phase=True), operation_timeout=30
    )
    recording = record_commit_timeouts(producer)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"decided")
        state = producer.prepare_transaction()
        proxy.delay(ApiKey.END_TXN, 3000, times=1)  # the coordinator's answer is slow
        with pytest.raises(TransactionInDoubtError) as first:
            producer.complete_transaction(state, timeout=0.5)
        assert first.value.retriable
        with pytest.raises(TransactionInDoubtError):
            producer.commit_transaction(timeout=0.2)  # resumed, the answer still held
        assert all(t >= 1.0 for t in recording.commit_timeouts[1:]), recording.commit_timeouts
    finally:
        time.sleep(3)  # the held answer arrives
        producer.commit_transaction(timeout=10)
        producer.close(timeout=5)
    assert broker.read_committed(topic, expected=1) == [(None, b"decided")]


# --------------------------------------------------------------------------- 3.6
@pytest.mark.guarantee("3.6")
def test_a_state_of_another_cluster_is_refused_when_the_cluster_id_cannot_be_read(
    broker: Broker, topic: str, proxy: KafkaProxy, two_phase_config: dict[str, Any]
) -> None:
    """Guarantee 3.6: a state of another cluster is refused when the cluster id cannot be
    read."""
    crashed = TransactionalProducer(two_phase_config, operation_timeout=20)
    crashed.init_transactions()
    crashed.begin_transaction()
    crashed.produce(topic, b"earlier")
    earlier = crashed.prepare_transaction()
    crashed.complete_transaction(earlier)
    crashed.begin_transaction()
    crashed.produce(topic, b"decided")
    stored = crashed.prepare_transaction()  # this cluster's database committed it
    crashed.close(timeout=5)  # the process died before completing it
    # The state row of the same transactional id on another cluster, whose ids match.
    foreign = PreparedTxnState(
        transactional_id=stored.transactional_id,
        producer_id=stored.producer_id,
        producer_epoch=stored.producer_epoch,
        txn_start_ms=earlier.txn_start_ms,
        cluster_id="another-cluster",
    )
    slow_metadata = proxy.delay(ApiKey.METADATA, 8000)
    settled: list[TransactionOutcome] = []

    def before_init(outcome: TransactionOutcome) -> None:
        settled.append(outcome)  # recovery settled the foreign state
        proxy.remove(slow_metadata)

    mixed_up = TransactionalProducer(
        {**two_phase_config, "bootstrap.servers": proxy.bootstrap_servers}, operation_timeout=3
    )
    try:
        mixed_up.init_transactions(keep_prepared_txn=True)
        with pytest.raises(KafkaTxnError):
            mixed_up.complete_transaction(foreign, before_init=before_init, timeout=30)
        assert settled == []
    finally:
        proxy.remove(slow_metadata)
        mixed_up.close(timeout=5)
    assert recover(two_phase_config, stored) is TransactionOutcome.COMMITTED
    assert sorted(broker.read_committed(topic, expected=2)) == [
        (None, b"decided"),
        (None, b"earlier"),
    ]


# --------------------------------------------------------------------------- 2PC doc
def test_recovery_that_raises_committed_nothing(
    broker: Broker, topic: str, proxy: KafkaProxy, two_phase_config: dict[str, Any]
) -> None:
    """two-phase-commit.md: 'If recovery raises, it committed nothing'."""
    stored = prepared_then_crashed(two_phase_config, topic, b"decided")
    fresh = TransactionalProducer(
        {**two_phase_config, "bootstrap.servers": proxy.bootstrap_servers}, operation_timeout=10
    )
    try:
        fresh.init_transactions(keep_prepared_txn=True)
        proxy.fail(ApiKey.END_TXN, KafkaError.UNKNOWN, forward=True, times=1)
        try:
            fresh.complete_transaction(stored)
        except KafkaTxnError as exc:
            if not isinstance(exc, TransactionOutcomeUnknownError):  # "call again"
                visible = broker.read_committed(topic, expected=0, timeout=5)
                assert visible == [], f"recovery raised {exc!r} yet committed {visible}"
    finally:
        fresh.close(timeout=5)


# --------------------------------------------------------------------------- 1.1 (holds)
@pytest.mark.parametrize(
    "code",
    [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND],
    ids=["not-leader", "not-enough-replicas-after-append"],
)
def test_a_produce_the_broker_applied_but_answered_with_an_error_commits_once(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str, code: int
) -> None:
    """1.1 under 'the call failing after the decision was made', for Produce: the broker
    appends the batch and the answer is a retriable error; librdkafka sends the batch
    again with the same sequence numbers and the broker drops the duplicate."""
    producer = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id), operation_timeout=20
    )
    try:
        producer.init_transactions()
        rule = proxy.fail(ApiKey.PRODUCE, code, forward=True, times=1)
        with producer.transaction():
            assert producer.send(topic, b"once", partition=0).exception(timeout=10) is None
        assert rule.hits == 1
        assert broker.read_committed(topic, expected=1) == [(None, b"once")]
    finally:
        producer.close(timeout=5)


# --------------------------------------------------------------------------- errors.md
def test_an_init_that_timed_out_says_it_may_have_fenced(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str
) -> None:
    """errors.md: the coordinator applied the InitProducerId and only its answer came
    late. The error says the init may already have fenced older instances (it did): the
    running instance's commit is refused as fenced and nothing of it is visible."""
    running = TransactionalProducer(
        txn_config(broker.bootstrap_servers, txn_id), operation_timeout=20
    )
    starting = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id), operation_timeout=2
    )
    try:
        running.init_transactions()
        running.begin_transaction()
        running.send(topic, b"in-flight", partition=0).result(timeout=10)
        proxy.delay(ApiKey.INIT_PRODUCER_ID, 6000, times=1)  # its answer comes late
        with pytest.raises(TransactionOutcomeUnknownError, match="may already have fenced"):
            starting.init_transactions()
        with pytest.raises(FatalError):  # fenced, as the error warned
            running.commit_transaction()
        assert broker.read_committed(topic, expected=0) == []
    finally:
        starting.close(timeout=5)
        running.close(timeout=5)


# --------------------------------------------------------------------------- 2.5
@pytest.mark.guarantee("2.5")
def test_a_state_of_another_cluster_never_aborts_a_prepared_transaction(
    broker: Broker, topic: str, proxy: KafkaProxy, two_phase_config: dict[str, Any]
) -> None:
    """Guarantee 2.5: a state of another cluster never aborts a prepared transaction."""
    producer = TransactionalProducer(
        {**two_phase_config, "bootstrap.servers": proxy.bootstrap_servers}, operation_timeout=20
    )
    slow_metadata = None
    try:
        producer.init_transactions()
        with producer.transaction():  # librdkafka learns the topic's metadata
            producer.produce(topic, b"warm-up")
        slow_metadata = proxy.delay(ApiKey.METADATA, 8000)
        producer.begin_transaction()
        producer.produce(topic, b"decided")
        state = producer.prepare_transaction(timeout=3)
        assert state.producer_id is not None and state.txn_start_ms is not None
        foreign = PreparedTxnState(  # another cluster's state row for the same id
            transactional_id=state.transactional_id,
            producer_id=state.producer_id,
            producer_epoch=state.producer_epoch,
            txn_start_ms=state.txn_start_ms - 1,
            cluster_id="another-cluster",
        )
        with pytest.raises(InvalidPreparedStateError):
            producer.complete_transaction(foreign)
        assert producer.state == "prepared"
        proxy.remove(slow_metadata)
        assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert sorted(broker.read_committed(topic, expected=2)) == [
            (None, b"decided"),
            (None, b"warm-up"),
        ]
    finally:
        if slow_metadata is not None:
            proxy.remove(slow_metadata)
        producer.close(timeout=5)


# --------------------------------------------------------------------------- 2.3 (holds)
@_LOST_ANSWERS
def test_a_prepared_commit_applied_but_answered_with_an_error_is_recovered_once(
    broker: Broker, topic: str, proxy: KafkaProxy, two_phase_config: dict[str, Any], code: int
) -> None:
    """2.3 under 'the call failing after the decision was made': the coordinator applies
    the prepared transaction's EndTxn(commit) and the answer is an error librdkafka calls
    abortable. The producer is in doubt, never aborts, and a fresh process's recovery
    from the stored state finds it committed: the records are visible once."""
    producer = TransactionalProducer(
        {**two_phase_config, "bootstrap.servers": proxy.bootstrap_servers}, operation_timeout=20
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"decided")
        stored = producer.prepare_transaction()
        proxy.fail(ApiKey.END_TXN, code, forward=True, times=1)
        with pytest.raises(TransactionInDoubtError):
            producer.complete_transaction(stored)
        with pytest.raises(KafkaTxnError):
            producer.abort_transaction()
    finally:
        producer.close(timeout=5)
    assert recover(two_phase_config, stored) is TransactionOutcome.ALREADY_COMMITTED
    assert broker.read_committed(topic, expected=1) == [(None, b"decided")]


# --------------------------------------------------------------------------- close()
@pytest.mark.guarantee("1.6")
def test_close_from_a_signal_handler_during_produce_aborts_the_transaction(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """close() ('An open transaction is aborted within timeout') and guarantee 1.6: close()
    from a signal handler during produce aborts the transaction."""
    producer = TransactionalProducer(producer_config, operation_timeout=20)
    closed: list[str] = []

    def sigterm_handler(frame: Any, event: str, arg: Any) -> None:
        if event == "c_return" and getattr(arg, "__name__", "") == "produce":
            sys.setprofile(None)
            producer.close(timeout=2)  # the handler closes and returns
            closed.append(producer.state)

    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"first", partition=0).result(timeout=10)  # registered
        sys.setprofile(sigterm_handler)
        try:
            producer.produce(topic, b"second", partition=0)
        except IllegalStateError:
            pass  # reporting that close() ran is fine too
        finally:
            sys.setprofile(None)
        assert closed == ["closed"]
        assert broker.open_partitions(topic) == {}, "close() left the transaction open"
        assert broker.read_committed(topic, expected=0) == []
    finally:
        producer.close(timeout=5)


# --------------------------------------------------------------------------- 3.6 (noida)
@pytest.fixture
def two_local_clusters() -> Iterator[tuple[Broker, Broker]]:
    """Two fresh local noida-db brokers (two clusters), stopped afterwards."""
    first = start_noida()
    try:
        second = start_noida()
        try:
            yield first, second
        finally:
            second.stop()
    finally:
        first.stop()


@pytest.mark.xfail(
    strict=True,
    reason="3.6 (docs/guarantees.md: 'A foreign state is refused (another transactional id "
    "or cluster)'): every local noida-db 0.2.3 reports the same cluster id "
    "(MkU3OEVBNTctOEUyRi00) and hands the first transactional id producer id 1000, so "
    "the state row of the same id on another local cluster passes "
    "recovery.check_belongs, is decided by the table (row 8: ALREADY_COMMITTED, its "
    "start being earlier), and the init after it aborts the transaction this cluster's "
    "decider prepared. Nothing in the state tells the clusters apart on the broker the "
    "tests, the demo and local development use",
)
def test_a_state_of_another_local_cluster_is_refused(
    two_local_clusters: tuple[Broker, Broker], txn_id: str
) -> None:
    elsewhere, here = two_local_clusters
    config = {"transactional.id": txn_id, "transaction.two.phase.commit.enable": True}
    their_topic = elsewhere.create_topic(partitions=1)
    theirs = TransactionalProducer(
        {**config, "bootstrap.servers": elsewhere.bootstrap_servers}, operation_timeout=20
    )
    try:
        theirs.init_transactions()
        theirs.begin_transaction()
        theirs.produce(their_topic, b"theirs")
        foreign = theirs.prepare_transaction()  # stored in the other cluster's database
        theirs.complete_transaction(foreign)
    finally:
        theirs.close(timeout=5)
    our_topic = here.create_topic(partitions=1)
    here_config = {**config, "bootstrap.servers": here.bootstrap_servers}
    # this cluster's database committed it
    stored = prepared_then_crashed(here_config, our_topic, b"decided")
    fresh = TransactionalProducer(
        {**config, "bootstrap.servers": here.bootstrap_servers}, operation_timeout=20
    )
    try:
        fresh.init_transactions(keep_prepared_txn=True)
        with pytest.raises(InvalidPreparedStateError):  # the mixed-up state row
            fresh.complete_transaction(foreign)
        assert fresh.complete_transaction(stored) is TransactionOutcome.COMMITTED
    finally:
        fresh.close(timeout=5)
    assert here.read_committed(our_topic, expected=1) == [(None, b"decided")]


# --------------------------------------------------------------------------- 1.13
@pytest.mark.guarantee("1.13")
def test_close_never_aborts_a_transaction_whose_commit_was_sent(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str
) -> None:
    producer = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id), operation_timeout=20
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"order-1")
        proxy.fail(ApiKey.END_TXN, KafkaError.REQUEST_TIMED_OUT, forward=True, times=1)
        with pytest.raises(FatalError):  # the outcome is unknown
            producer.commit_transaction()
        sent = proxy.count(ApiKey.END_TXN)
    finally:
        producer.close(timeout=5)
    assert proxy.count(ApiKey.END_TXN) == sent, "close() sent an EndTxn (abort)"
    assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]


# --------------------------------------------------------------------------- 1.6 / errors.md
@pytest.mark.guarantee("1.6")
def test_complete_again_after_its_abort_ran_out_of_time_finishes_or_names_the_fix(
    broker: Broker, topic: str, proxy: KafkaProxy, two_phase_config: dict[str, Any]
) -> None:
    producer = TransactionalProducer(
        {**two_phase_config, "bootstrap.servers": proxy.bootstrap_servers}, operation_timeout=20
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"rolled-back")
        producer.prepare_transaction()
        proxy.delay(ApiKey.END_TXN, 3000, times=1)  # the coordinator answers late
        with pytest.raises(TransactionOutcomeUnknownError):
            producer.complete_transaction("", timeout=0.5)  # the database rolled back
        assert producer.state == "aborting"
        try:  # "call the same method again"
            outcome = producer.complete_transaction("", timeout=10)
        except IllegalStateError as exc:
            assert "abort_transaction()" in str(exc), str(exc)
        else:
            assert outcome is TransactionOutcome.ABORTED
    finally:
        time.sleep(3)  # the late answer arrives
        if producer.state == "aborting":
            producer.abort_transaction(timeout=10)
        producer.close(timeout=5)
    assert broker.read_committed(topic, expected=0) == []
