"""Transactions against the test rig's broker (see the session header for which ran)."""

from __future__ import annotations

import gc
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from kafka_txn import (
    CommitFailedException,
    FailureType,
    FatalError,
    IllegalStateError,
    ProduceFailedException,
    ProducerFencedError,
    TransactionalProducer,
    TransactionOutcome,
)

pytestmark = pytest.mark.broker


@pytest.mark.guarantee("1.1")
def test_committed_visible_and_aborted_invisible(broker, topic, producer_config):
    with TransactionalProducer(producer_config) as p:
        p.init_transactions()
        with p.transaction():
            for i in range(5):
                p.produce(topic, b"c%d" % i, key=b"k%d" % i)
        p.begin_transaction()
        p.produce(topic, b"aborted")
        p.flush()
        p.abort_transaction()
        with p.transaction():
            p.send(topic, b"after-abort")
    seen = sorted(v for _, v in broker.read_committed(topic, expected=6))
    assert seen == [b"after-abort", b"c0", b"c1", b"c2", b"c3", b"c4"]


@pytest.mark.guarantee("1.1")
def test_exception_in_transaction_block_aborts(broker, topic, producer_config):
    with TransactionalProducer(producer_config) as p:
        p.init_transactions()
        with pytest.raises(ZeroDivisionError), p.transaction():
            p.produce(topic, b"never")
            p.flush()
            1 / 0  # noqa: B018
        assert p.state == "ready"
        with p.transaction():
            p.produce(topic, b"kept")
    assert broker.read_committed(topic, expected=1) == [(None, b"kept")]


@pytest.mark.adversary
@pytest.mark.guarantee("1.4")
def test_second_producer_fences_the_first(broker, topic, producer_config):
    first = TransactionalProducer(producer_config)
    first.init_transactions()
    first.begin_transaction()
    first.produce(topic, b"zombie")
    first.flush()

    with TransactionalProducer(producer_config) as second:
        second.init_transactions()  # bumps the epoch: `first` is now a zombie
        with pytest.raises(FatalError) as info:
            first.commit_transaction()
        assert isinstance(info.value, ProducerFencedError)
        with pytest.raises(FatalError) as again:
            first.begin_transaction()
        assert again.value is info.value
        first.close()

        with second.transaction():
            second.produce(topic, b"winner")
    assert broker.read_committed(topic, expected=1) == [(None, b"winner")]


def _committed_offset(broker, group: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        [tp] = c.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        c.close()


@pytest.mark.guarantee("1.5")
def test_offsets_commit_only_with_the_transaction(broker, producer_config):
    source = broker.create_topic(partitions=1, prefix="src")
    sink = broker.create_topic(partitions=1, prefix="sink")
    group = f"g-{uuid.uuid4().hex[:8]}"
    with TransactionalProducer(producer_config) as p:
        p.init_transactions()
        with p.transaction():
            for i in range(4):
                p.produce(source, b"in%d" % i)

        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "group.id": group,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        try:
            consumer.assign([TopicPartition(source, 0)])
            got = []
            deadline = time.monotonic() + 30
            while len(got) < 2 and time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is not None and msg.error() is None:
                    got.append(msg)
            assert len(got) == 2, f"only {len(got)} of the 4 committed records read in 30 s"
            offsets = [TopicPartition(source, 0, got[-1].offset() + 1)]

            p.begin_transaction()
            p.produce(sink, b"out")
            p.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())
            p.abort_transaction()
            assert _committed_offset(broker, group, source) < 0  # nothing committed

            p.begin_transaction()
            p.produce(sink, b"out")
            p.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())
            p.commit_transaction()
            assert _committed_offset(broker, group, source) == got[-1].offset() + 1
        finally:
            consumer.close()
    assert broker.read_committed(sink, expected=1) == [(None, b"out")]


@pytest.mark.guarantee("1.2")
def test_oversize_record_is_rejected_and_transaction_recovers(broker, topic, producer_config):
    with TransactionalProducer({**producer_config, "message.max.bytes": 10_000}) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, b"small")
        with pytest.raises(ProduceFailedException) as info:
            p.produce(topic, b"x" * 20_000, key=b"big")
        failure = info.value
        assert failure.failure_type is FailureType.MESSAGE_REJECTED
        assert failure.kafka_error.code() == KafkaError.MSG_SIZE_TOO_LARGE
        assert (failure.topic, failure.key) == (topic, b"big")

        with pytest.raises(CommitFailedException) as commit:
            p.commit_transaction()
        assert commit.value.__cause__ is failure
        p.abort_transaction()

        with p.transaction():
            p.produce(topic, b"next")
    assert broker.read_committed(topic, expected=1) == [(None, b"next")]


@pytest.mark.guarantee("1.6")
def test_illegal_calls_name_the_fix(producer_config, topic):
    p = TransactionalProducer(producer_config)
    with pytest.raises(IllegalStateError, match="init_transactions"):
        p.begin_transaction()
    p.init_transactions()
    with pytest.raises(IllegalStateError, match="begin_transaction"):
        p.produce(topic, b"v")
    with pytest.raises(IllegalStateError, match="already called"):
        p.init_transactions()
    p.begin_transaction()
    with pytest.raises(IllegalStateError, match="already open"):
        p.begin_transaction()
    p.abort_transaction()
    with pytest.raises(IllegalStateError, match="no transaction"):
        p.commit_transaction()
    p.close()
    p.close()  # idempotent
    with pytest.raises(IllegalStateError, match="after close"):
        p.produce(topic, b"v")


def test_callback_exception_surfaces_from_flush_not_systemerror(producer_config, topic):
    class BoomError(Exception):
        pass

    def cb(err, msg):
        raise BoomError("user callback failed")

    with TransactionalProducer(producer_config) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, b"v", on_delivery=cb)
        with pytest.raises(BoomError):
            p.flush()
        p.commit_transaction()  # the record itself was delivered


def test_delivered_records_leave_no_python_objects(producer_config, topic):
    with TransactionalProducer(producer_config) as p:
        p.init_transactions()
        p.begin_transaction()
        gc.collect()
        before = len(gc.get_objects())
        for _ in range(50_000):
            p.produce(topic, b"x" * 100)
        p.flush()
        gc.collect()
        grown = len(gc.get_objects()) - before
        p.commit_transaction()
    assert grown < 1_000, f"{grown} objects kept for 50,000 delivered records"


def test_record_fields_reach_the_broker_and_futures_resolve(broker, topic, producer_config):
    headers = [("h", b"1")]
    with TransactionalProducer(producer_config) as p:
        p.init_transactions()
        with p.transaction():
            f = p.send(
                topic,
                b"value",
                key=b"key",
                partition=1,
                timestamp=1_700_000_000_000,
                headers=headers,
            )
            called = []
            f.add_done_callback(called.append)
            p.produce(
                topic,
                "text",
                key="k2",
                partition=2,
                on_delivery=lambda err, msg: called.append((err, msg.partition())),
            )
        msg = f.result(timeout=5)
        assert f.done() and f.exception() is None
        assert (msg.partition(), msg.key(), msg.value()) == (1, b"key", b"value")
        assert msg.timestamp()[1] == 1_700_000_000_000
        # Both reports, in either order: the records went to different partitions, whose
        # reports librdkafka serves as each partition's produce answer comes.
        assert len(called) == 2 and f in called and (None, 2) in called
    assert sorted(broker.read_committed(topic, expected=2)) == [
        (b"k2", b"text"),
        (b"key", b"value"),
    ]


@pytest.mark.adversary
def test_an_abort_right_after_a_commit_whose_markers_are_still_written_aborts(
    broker, producer_config
):
    """An abort while the previous commit's markers are still being written aborts and
    leaves the producer usable. Apache Kafka answers the new transaction's
    AddPartitionsToTxn CONCURRENT_TRANSACTIONS until the markers are written
    (``TransactionCoordinator.handleAddPartitions``, previous transaction
    PrepareCommit) and refuses an EndTxn(abort) meanwhile with INVALID_TXN_STATE
    (``TransactionCoordinator.endTransaction``: PrepareCommit or CompleteCommit asked
    to abort), which librdkafka makes fatal if it sends the abort before the retried
    registration succeeded. A commit spanning many partitions keeps its markers in
    flight long enough for the race to be hit on every try without the library's wait
    for the registration."""
    wide = broker.create_topic(partitions=200, prefix="wide")
    with TransactionalProducer({**producer_config, "linger.ms": 0}) as producer:
        producer.init_transactions()
        for i in range(5):
            with producer.transaction():
                for partition in range(200):
                    producer.produce(wide, b"committed-%d" % i, partition=partition)
            producer.begin_transaction()
            producer.produce(wide, b"aborted-%d" % i, partition=0)
            time.sleep(0.01)  # the registration is answered, its retry not yet sent
            producer.abort_transaction()
        with producer.transaction():
            producer.produce(wide, b"last", partition=0)
    values = [v for _, v in broker.read_committed(wide, expected=5 * 200 + 1)]
    assert sorted(set(values)) == sorted({b"committed-%d" % i for i in range(5)} | {b"last"})
    assert len(values) == 5 * 200 + 1


def _wide_commit(producer, wide, i):
    """A committed transaction over 200 partitions: its markers take long enough to
    write that the next transaction begins while the coordinator still completes it."""
    with producer.transaction():
        for partition in range(200):
            producer.produce(wide, b"committed-%d" % i, partition=partition)


def test_an_abort_after_a_refused_record_right_after_a_commit_aborts(broker, producer_config):
    """A record refused before it was queued (too large) fails the transaction here but
    not in librdkafka, which still registers and delivers the others: right after a
    commit whose markers are in flight, commit_transaction() raises
    CommitFailedException and the abort that follows aborts (librdkafka's EndTxn(abort)
    would otherwise overtake its retried AddPartitionsToTxn and be refused with
    INVALID_TXN_STATE, fatal). The producer goes on; nothing of the aborted ones shows."""
    wide = broker.create_topic(partitions=200, prefix="wide")
    with TransactionalProducer({**producer_config, "linger.ms": 0}) as producer:
        producer.init_transactions()
        for i in range(5):
            _wide_commit(producer, wide, i)
            producer.begin_transaction()
            producer.produce(wide, b"aborted-%d" % i, partition=0)
            with pytest.raises(ProduceFailedException):
                producer.produce(wide, b"x" * 2_000_000, partition=1)
            time.sleep(0.01)  # the registration is answered, its retry not yet sent
            with pytest.raises(CommitFailedException):
                producer.commit_transaction()
            producer.abort_transaction()
    values = [v for _, v in broker.read_committed(wide, expected=5 * 200)]
    assert sorted(set(values)) == sorted({b"committed-%d" % i for i in range(5)})
    assert len(values) == 5 * 200


def test_a_transaction_that_sent_nothing_prepares_empty_right_after_a_commit(
    broker, producer_config
):
    """prepare_transaction() of a transaction that sent nothing gives the empty state
    also while the coordinator still writes the previous commit's markers: under this
    producer's id and epoch it shows the previous transaction PrepareCommit
    (``TransactionCoordinator.endTransaction`` answers before the markers are written),
    which is not this transaction."""
    wide = broker.create_topic(partitions=200, prefix="wide")
    two_phase = {**producer_config, "linger.ms": 0, "transaction.two.phase.commit.enable": True}
    with TransactionalProducer(two_phase) as producer:
        producer.init_transactions()
        for i in range(5):
            producer.begin_transaction()
            for partition in range(200):
                producer.produce(wide, b"committed-%d" % i, partition=partition)
            producer.complete_transaction(producer.prepare_transaction())
            producer.begin_transaction()
            state = producer.prepare_transaction()
            assert state.is_empty
            assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
    assert len(broker.read_committed(wide, expected=5 * 200)) == 5 * 200
