"""prepare_transaction() / complete_transaction() on one live producer (KIP-939's normal
path), and the state machine around them."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from kafka_txn import (
    IllegalStateError,
    PreparedTxnState,
    TransactionAbortableError,
    TransactionalProducer,
    TransactionOutcome,
)

pytestmark = pytest.mark.broker


@pytest.fixture
def producer(producer_config):
    p = TransactionalProducer({**producer_config, "transaction.two.phase.commit.enable": True})
    p.init_transactions()
    yield p
    p.close()


@pytest.mark.guarantee("2.4")
def test_prepare_then_complete_commits(broker, topic, producer, producer_config):
    producer.begin_transaction()
    producer.produce(topic, b"one")
    state = producer.prepare_transaction()
    assert state.transactional_id == producer_config["transactional.id"]
    assert state.producer_id is not None and state.producer_epoch is not None
    assert state.txn_start_ms is not None and state.txn_start_ms > 0
    assert state.cluster_id  # refuses recovery against another cluster
    assert broker.read_committed(topic, expected=0, linger=0.5) == []  # not visible yet
    # The decider stores the text and hands it back, possibly from another process.
    assert producer.complete_transaction(str(state)) is TransactionOutcome.COMMITTED
    assert broker.read_committed(topic, expected=1) == [(None, b"one")]


@pytest.mark.guarantee("2.4")
def test_complete_with_another_state_aborts(broker, topic, producer):
    producer.begin_transaction()
    producer.produce(topic, b"dropped")
    producer.prepare_transaction()
    assert producer.complete_transaction(PreparedTxnState.EMPTY) is TransactionOutcome.ABORTED
    producer.begin_transaction()
    producer.produce(topic, b"kept")
    state = producer.prepare_transaction()
    producer.complete_transaction(state)
    assert broker.read_committed(topic, expected=1) == [(None, b"kept")]


@pytest.mark.guarantee("2.4", "2.7")
def test_consecutive_transactions_get_distinct_states(topic, producer):
    """librdkafka keeps pid/epoch across transactions; the start time tells them apart."""
    states = []
    for i in range(5):
        producer.begin_transaction()
        producer.produce(topic, b"%d" % i)
        states.append(producer.prepare_transaction())
        producer.complete_transaction(states[-1])
    assert len({(s.producer_id, s.producer_epoch) for s in states}) == 1
    assert len({s.txn_start_ms for s in states}) == 5


def test_empty_transaction_prepares_to_the_empty_state(producer):
    producer.begin_transaction()
    assert producer.prepare_transaction() == PreparedTxnState.EMPTY
    assert producer.complete_transaction(PreparedTxnState.EMPTY) is TransactionOutcome.COMMITTED


@pytest.mark.guarantee("1.6")
def test_prepared_state_allows_only_completion(topic, producer):
    producer.begin_transaction()
    producer.produce(topic, b"x")
    state = producer.prepare_transaction()
    for call in (
        lambda: producer.produce(topic, b"y"),
        lambda: producer.send(topic, b"y"),
        producer.begin_transaction,
        producer.prepare_transaction,
    ):
        with pytest.raises(IllegalStateError, match="prepared"):
            call()
    producer.complete_transaction(state)


@pytest.mark.guarantee("2.2")
def test_prepare_refuses_when_too_little_timeout_is_left(broker, topic, producer_config):
    conf = {**producer_config, "transaction.two.phase.commit.enable": True,
            "transaction.timeout.ms": 10_000}  # fmt: skip
    with TransactionalProducer(conf, prepare_min_time_left=30) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, b"late")
        with pytest.raises(TransactionAbortableError, match=r"transaction\.timeout\.ms"):
            p.prepare_transaction()
        p.abort_transaction()
    assert broker.read_committed(topic, expected=0, linger=0.5) == []


def test_prepare_after_abort_learns_the_new_identity(broker, topic, producer):
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.abort_transaction()
    producer.begin_transaction()
    producer.produce(topic, b"after")
    state = producer.prepare_transaction()
    assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
    assert broker.read_committed(topic, expected=1) == [(None, b"after")]


def test_complete_without_prepare_is_invalid_txn_state(producer):
    with pytest.raises(IllegalStateError, match="no prepared transaction") as info:
        producer.complete_transaction(PreparedTxnState.EMPTY)
    assert info.value.code() == KafkaError.INVALID_TXN_STATE


def test_two_phase_calls_need_the_setting(producer_config, topic):
    with TransactionalProducer(producer_config) as p:
        with pytest.raises(IllegalStateError, match=r"transaction\.two\.phase\.commit\.enable"):
            p.init_transactions(keep_prepared_txn=True)
        p.init_transactions()
        p.begin_transaction()
        with pytest.raises(IllegalStateError, match=r"transaction\.two\.phase\.commit\.enable"):
            p.prepare_transaction()


@pytest.mark.guarantee("1.6")
def test_recovering_state_allows_only_settling(broker, topic, producer_config):
    conf = {**producer_config, "transaction.two.phase.commit.enable": True}
    with TransactionalProducer(conf) as first:
        first.init_transactions()
        first.begin_transaction()
        first.produce(topic, b"kept open")
        first.prepare_transaction()
        # A second instance keeps the transaction, and KIP-939 lets it commit it.
        with TransactionalProducer(conf) as second:
            second.init_transactions(keep_prepared_txn=True)
            for call in (second.begin_transaction, lambda: second.produce(topic, b"z")):
                with pytest.raises(IllegalStateError, match="keep_prepared_txn"):
                    call()
            second.commit_transaction()
            assert second.state == "ready"
            with second.transaction():
                second.produce(topic, b"next")
    assert sorted(broker.read_committed(topic, expected=2)) == [
        (None, b"kept open"),
        (None, b"next"),
    ]


@pytest.mark.guarantee("2.7")
def test_no_record_goes_before_the_start_time_spacing_wait_ends(broker, topic, producer):
    """begin_transaction() waits out the start-time spacing after librdkafka's own begin
    (the wait covers that handoff). Until the wait ends, produce() and send()
    from another thread are refused: a record sent then could register the partition,
    and so stamp the transaction's start time, within the previous one's millisecond."""
    first = _committed_transaction(producer, topic, b"first")
    twophase = producer._twophase
    assert twophase is not None
    # As if the previous transaction had started 0.3 s from now: begin waits ~0.3 s.
    twophase.last_started_by = time.monotonic() + 0.3
    wait_ends = twophase.last_started_by + 0.0011
    refused: list[BaseException] = []
    began = threading.Event()

    def send_meanwhile() -> None:
        began.wait(5)
        time.sleep(0.1)  # begin_transaction() is in its wait now
        for send in (producer.produce, producer.send):
            try:
                send(topic, b"too early")
            except IllegalStateError as exc:
                refused.append(exc)

    other = threading.Thread(target=send_meanwhile)
    other.start()
    began.set()
    producer.begin_transaction()
    assert time.monotonic() >= wait_ends
    other.join()
    assert len(refused) == 2, refused
    second = _committed_transaction(producer, topic, b"second", begin=False)
    assert second.txn_start_ms > first.txn_start_ms
    assert sorted(broker.read_committed(topic, expected=2)) == [(None, b"first"), (None, b"second")]


@pytest.mark.adversary
@pytest.mark.guarantee("2.7")
def test_an_interrupted_spacing_wait_leaves_the_producer_ready(
    broker, topic, producer, monkeypatch
):
    """A signal's exception (KeyboardInterrupt, a timeout handler) raised during
    begin_transaction()'s spacing wait, after librdkafka began its transaction: the
    begin is undone (librdkafka's empty transaction aborted, nothing sent), the producer
    is ready, and the next transaction commits."""
    first = _committed_transaction(producer, topic, b"first")
    twophase = producer._twophase
    assert twophase is not None
    twophase.last_started_by = time.monotonic() + 0.3

    class Interrupted(BaseException):
        pass

    real_sleep = time.sleep

    def interrupted_sleep(seconds: float) -> None:
        monkeypatch.setattr(time, "sleep", real_sleep)
        raise Interrupted

    monkeypatch.setattr(time, "sleep", interrupted_sleep)
    with pytest.raises(Interrupted):
        producer.begin_transaction()
    assert producer.state == "ready"
    with pytest.raises(IllegalStateError):
        producer.produce(topic, b"not in a transaction")
    second = _committed_transaction(producer, topic, b"second")
    assert second.txn_start_ms > first.txn_start_ms
    assert sorted(broker.read_committed(topic, expected=2)) == [(None, b"first"), (None, b"second")]


def _committed_transaction(
    producer: TransactionalProducer, topic: str, value: bytes, *, begin: bool = True
) -> PreparedTxnState:
    if begin:
        producer.begin_transaction()
    producer.produce(topic, value)
    state = producer.prepare_transaction()
    assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
    return state


@pytest.mark.guarantee("2.1")
def test_prepare_refuses_a_transaction_whose_records_librdkafka_dropped(broker, producer):
    """After a transaction whose batch the broker refused (larger than the topic's
    max.message.bytes), librdkafka fails the next transaction once: it drops that
    transaction's records (_PURGE_QUEUE; OUT_OF_ORDER_SEQUENCE_NUMBER, "requires epoch
    bump") while flush() returns 0 and the coordinator may show the transaction open.
    prepare_transaction() refuses it (TransactionAbortableError) rather than hand out a
    state a decider could commit without its records; aborted and retried, the record
    is committed once, as kafka-python read_committed shows."""
    topic = broker.create_topic(partitions=1)
    admin = broker.admin()  # must outlive its futures
    entry = ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    producer.begin_transaction()
    producer.produce(topic, b"x" * 20_000)  # under the client's message.max.bytes
    with pytest.raises(TransactionAbortableError, match=r"MESSAGE_REJECTED|too large"):
        producer.prepare_transaction()
    producer.abort_transaction()
    outcomes = []
    for _ in range(3):
        producer.begin_transaction()
        producer.produce(topic, b"small")
        try:
            state = producer.prepare_transaction()
        except TransactionAbortableError:
            producer.abort_transaction()
            outcomes.append("refused")
            continue
        assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
        outcomes.append("committed")
        break
    assert outcomes in (["committed"], ["refused", "committed"]), outcomes
    assert broker.read_committed(topic, expected=1, linger=0.5) == [(None, b"small")]
