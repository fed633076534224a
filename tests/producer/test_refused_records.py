"""Adversarial schedules: TransactionalProducer, two-phase commit and the exactly-once loop
(docs/guarantees.md sections 1, 2 and 6, docs/reference/errors.md, docs/guide/eos.md,
docs/guide/two-phase-commit.md, README.md). Each test is one schedule, on the real broker
(checked with an independent read_committed consumer, kafka-python, tests/support/rig.py) where
the broker can play it, else on librdkafka's mock cluster (kafka_txn.testing), against
a documented promise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.serialization import StringSerializer

from kafka_txn import (
    CommitFailedException,
    FailureType,
    FatalError,
    KafkaTxnError,
    ProduceFailedException,
    ProducerFencedError,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)
from kafka_txn.testing import ApiKey, MockCluster
from tests.support.rig import Broker

LONE_SURROGATE = "order-\ud800"
"""A str value that is no valid UTF-8: confluent-kafka cannot encode it."""


# ---------------------------------------------------------------- finding 1
@pytest.mark.guarantee("1.2")
def test_a_value_librdkafka_cannot_encode_fails_the_commit(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    # The control: the same value refused by a str serializer is a failed record
    # (MESSAGE_REJECTED) and the commit refuses (1.2).
    with TransactionalProducer(
        {**producer_config, "transactional.id": producer_config["transactional.id"] + "-s"},
        value_serializer=StringSerializer("utf_8"),
    ) as serialized:
        serialized.init_transactions()
        serialized.begin_transaction()
        with pytest.raises(KafkaTxnError):
            serialized.produce(topic, LONE_SURROGATE)
        serialized.produce(topic, "serialized-sibling")
        with pytest.raises(CommitFailedException):
            serialized.commit_transaction()
        serialized.abort_transaction()

    # Without a serializer confluent-kafka encodes str values itself (UTF-8), and the
    # caller is told the send failed, as with the serializer: a rejected record, whose
    # cause is confluent-kafka's UnicodeEncodeError (wrapped once).
    with TransactionalProducer(producer_config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(ProduceFailedException) as refused:
            producer.produce(topic, LONE_SURROGATE)
        assert refused.value.failure_type is FailureType.MESSAGE_REJECTED
        assert refused.value.code() == KafkaError._VALUE_SERIALIZATION
        assert isinstance(refused.value.__cause__, UnicodeEncodeError)
        assert refused.value.__cause__.__cause__ is None
        producer.produce(topic, b"sibling")
        committed: Exception | None = None
        try:
            producer.commit_transaction()
        except Exception as exc:  # checked below
            committed = exc
            if producer.state == "abortable error":
                producer.abort_transaction()
    seen = broker.read_committed(topic, expected=0, linger=0.5)
    # Promised: "A record that fails, including one refused before it was queued, makes
    # commit_transaction() raise CommitFailedException"; nothing of it is visible.
    assert isinstance(committed, CommitFailedException), (committed, seen)
    assert committed.__cause__ is refused.value
    assert seen == []


def _overflowing_partition(p: TransactionalProducer, topic: str) -> None:
    p.produce(topic, b"v", partition=2**40)


def _unencodable_key(p: TransactionalProducer, topic: str) -> None:
    p.produce(topic, b"v", key=LONE_SURROGATE)


def _unencodable_send(p: TransactionalProducer, topic: str) -> None:
    p.send(topic, LONE_SURROGATE)


def _unencodable_header(p: TransactionalProducer, topic: str) -> None:
    p.produce(topic, b"v", headers=[("h", LONE_SURROGATE)])


def _value_of_wrong_type(p: TransactionalProducer, topic: str) -> None:
    p.produce(topic, {"a": 1})


@pytest.mark.parametrize(
    ("call", "raised", "code", "cause"),
    [
        (_overflowing_partition, ProduceFailedException, KafkaError._INVALID_ARG, OverflowError),
        (_unencodable_key, ProduceFailedException, KafkaError._KEY_SERIALIZATION,
         UnicodeEncodeError),
        (_unencodable_send, ProduceFailedException, KafkaError._VALUE_SERIALIZATION,
         UnicodeEncodeError),
        (_unencodable_header, ProduceFailedException, KafkaError._INVALID_ARG,
         UnicodeEncodeError),
        # A wrong type is a programming error: raised as a TypeError saying what to pass
        # (docs/guide/producer.md), and still a record the transaction lost.
        (_value_of_wrong_type, TypeError, KafkaError._INVALID_ARG, TypeError),
    ],
    ids=["overflow", "key", "send", "header", "type"],
)  # fmt: skip
@pytest.mark.guarantee("1.2")
def test_every_record_confluent_kafka_refuses_fails_the_commit(
    broker: Broker,
    topic: str,
    producer_config: dict[str, Any],
    call: Callable[[TransactionalProducer, str], None],
    raised: type[Exception],
    code: int,
    cause: type[Exception],
) -> None:
    """The other Python exceptions out of confluent-kafka's produce() (1.2/1.3): each
    refused record is a failed record (MESSAGE_REJECTED), and the commit refuses."""
    with TransactionalProducer(producer_config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(raised) as refused:
            call(producer, topic)
        if raised is ProduceFailedException:
            assert isinstance(refused.value, ProduceFailedException)
            assert refused.value.failure_type is FailureType.MESSAGE_REJECTED
            assert refused.value.code() == code
            assert isinstance(refused.value.__cause__, cause)
        producer.produce(topic, b"sibling")
        with pytest.raises(CommitFailedException) as failed:
            producer.commit_transaction()
        record = failed.value.__cause__
        assert isinstance(record, ProduceFailedException), repr(record)
        assert record.failure_type is FailureType.MESSAGE_REJECTED and record.code() == code
        assert isinstance(record.__cause__, cause)
        assert producer.state == "abortable error"
        producer.abort_transaction()
        producer.begin_transaction()
        producer.produce(topic, b"next")
        producer.commit_transaction()
    assert broker.read_committed(topic, expected=1) == [(None, b"next")]


# ---------------------------------------------------------------- finding 2
@pytest.mark.parametrize("call", ["flush", "prepare_transaction"])
@pytest.mark.guarantee("1.4")
def test_a_zombie_whose_send_fails_on_fencing_gets_producer_fenced_error(
    broker: Broker, topic: str, producer_config: dict[str, Any], call: str
) -> None:
    config = {**producer_config, "transaction.two.phase.commit.enable": True}
    zombie = TransactionalProducer(config)
    successor: TransactionalProducer | None = None
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.produce(topic, b"before-fencing")
        zombie.flush(10)
        successor = TransactionalProducer(producer_config)
        successor.init_transactions()  # fences the zombie, aborts its transaction
        zombie.send(topic, b"after-fencing")  # a future: a delivery callback
        raised: Exception | None = None
        try:
            if call == "flush":
                zombie.flush(10)
            else:
                zombie.prepare_transaction(timeout=10)
        except Exception as exc:  # checked below
            raised = exc
        state = zombie.state

        # Nothing of the zombie's transaction is visible; the successor commits.
        successor.begin_transaction()
        successor.produce(topic, b"successor")
        successor.commit_transaction()
        assert sorted(v for _, v in broker.read_committed(topic, expected=1)) == [b"successor"]

        # Promised: the zombie gets ProducerFencedError (fatal), a kafka-txn error
        # subclassing KafkaException; never a bare Python error.
        assert isinstance(raised, KafkaException), repr(raised)
        assert isinstance(raised, ProducerFencedError), repr(raised)
        assert state == "fatal error"
        # Wrapping rule: the cause is what brought the root error in, wrapped once:
        # confluent-kafka's KafkaException (_FENCED), or the fenced record's failure
        # (INVALID_PRODUCER_EPOCH) when its delivery report came first.
        cause = raised.__cause__
        assert isinstance(cause, KafkaException), repr(cause)
        if isinstance(cause, ProduceFailedException):
            assert cause.code() == KafkaError.INVALID_PRODUCER_EPOCH, repr(cause)
        else:
            assert type(cause) is KafkaException, repr(cause)
            assert cause.args[0].code() == KafkaError._FENCED, repr(cause)
        assert cause.__cause__ is None, repr(cause.__cause__)
        with pytest.raises(ProducerFencedError):
            zombie.begin_transaction() if call == "flush" else zombie.abort_transaction()
    finally:
        zombie.close()
        if successor is not None:
            successor.close()


# ---------------------------------------------------------------- finding 3
@pytest.mark.parametrize(
    "answer",
    [
        KafkaError.TRANSACTION_ABORTABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.UNKNOWN,
    ],
    ids=["TRANSACTION_ABORTABLE", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "UNKNOWN"],
)
@pytest.mark.guarantee("1.3")
def test_an_abort_refused_with_an_abortable_error_leaves_a_usable_producer(
    mock_cluster: MockCluster, mock_config: Callable[..., dict[str, Any]], answer: int
) -> None:
    """EndTxn(abort) answered with an error librdkafka calls abortable (not fatal): the
    abort did not complete and librdkafka can abort again, so abort_transaction() raises
    TransactionOutcomeUnknownError saying to call it again (docs/reference/errors.md: "from
    abort_transaction(): call the same method again"), the producer stays 'aborting',
    the second abort succeeds and the next transaction commits. (The mock cluster does
    not hide aborted records from read_committed readers, and the broker cannot be made
    to answer EndTxn so: librdkafka reaches the coordinator over its broker connection,
    not through the fault proxy.)"""
    mock_cluster.create_topic("orders", partitions=1)
    with TransactionalProducer(mock_config(), operation_timeout=10) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce("orders", b"to-abort")
        assert producer.flush(10) == 0
        mock_cluster.push_request_errors(ApiKey.END_TXN, answer)
        with pytest.raises(KafkaTxnError) as refused:
            producer.abort_transaction()
        # Promised (1.3, errors.md): the category follows the table, which says
        # abortable; FatalError means "the producer is unusable".
        exc = refused.value
        assert isinstance(exc, TransactionOutcomeUnknownError), repr(exc)
        assert not isinstance(exc, FatalError) and not exc.fatal(), repr(exc)
        assert exc.code() == answer and exc.operation == "abort_transaction"
        assert "call abort_transaction() again" in str(exc), str(exc)
        assert type(exc.__cause__) is KafkaException and exc.__cause__.__cause__ is None
        assert producer.state == "aborting"
        producer.abort_transaction()  # again, as the error says
        assert producer.state == "ready"
        producer.begin_transaction()
        producer.produce("orders", b"next")
        producer.commit_transaction()
        assert producer.state == "ready"
