"""Red-team round 4: TransactionalProducer, two-phase commit and the exactly-once loop
(docs/guarantees.md sections 1, 2 and 6, docs/errors.md, docs/eos.md,
docs/two-phase-commit.md, README.md). Each test is one schedule, on the real broker
(checked with an independent read_committed consumer, kafka-python, tests/rig.py) where
the broker can play it, else on librdkafka's mock cluster (kafka_txn.testing); a strict
xfail marks a documented promise that the schedule breaks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.serialization import StringSerializer

from kafka_txn import (
    CommitFailedException,
    FatalError,
    KafkaTxnError,
    ProducerFencedError,
    TransactionalProducer,
)
from kafka_txn.testing import ApiKey, MockCluster
from tests.rig import Broker

LONE_SURROGATE = "order-\ud800"
"""A str value that is no valid UTF-8: confluent-kafka cannot encode it."""


# ---------------------------------------------------------------- finding 1
@pytest.mark.xfail(
    strict=True,
    reason=(
        "1.2/1.3: a record refused before it was queued because confluent-kafka cannot "
        "encode its str value (UnicodeEncodeError) is not recorded as a failed record: "
        "commit_transaction() commits the transaction without it, where the same value "
        "refused by a value_serializer fails the commit"
    ),
)
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
    # caller is told the send failed.
    with TransactionalProducer(producer_config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(UnicodeEncodeError):
            producer.produce(topic, LONE_SURROGATE)
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
    assert seen == []


# ---------------------------------------------------------------- finding 2
@pytest.mark.xfail(
    strict=True,
    reason=(
        "1.3/1.4/2.2: a zombie (fenced by a second producer with its transactional id) "
        "whose in-flight record has a delivery callback (send(), on_delivery) gets a bare "
        "SystemError from flush() and from prepare_transaction(), not ProducerFencedError; "
        "prepare leaves it 'abortable error' instead of fatal"
    ),
)
@pytest.mark.parametrize("call", ["flush", "prepare_transaction"])
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
    finally:
        zombie.close()
        if successor is not None:
            successor.close()


# ---------------------------------------------------------------- finding 3
@pytest.mark.xfail(
    strict=True,
    reason=(
        "1.3: abort_transaction() whose EndTxn(abort) is answered TRANSACTION_ABORTABLE "
        "(the table: abortable; librdkafka: txn_requires_abort, and its second abort "
        "succeeds) raises FatalError advising to 'abort the transaction', and the "
        "healthy producer is dead for good"
    ),
)
def test_an_abort_refused_with_an_abortable_error_leaves_a_usable_producer(
    mock_cluster: MockCluster, mock_config: Callable[..., dict[str, Any]]
) -> None:
    mock_cluster.create_topic("orders", partitions=1)
    with TransactionalProducer(mock_config(), operation_timeout=10) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce("orders", b"to-abort")
        assert producer.flush(10) == 0
        mock_cluster.push_request_errors(ApiKey.END_TXN, KafkaError.TRANSACTION_ABORTABLE)
        try:
            producer.abort_transaction()
        except KafkaTxnError as exc:
            # Promised (1.3, errors.md): the category follows the table, which says
            # abortable; FatalError means "the producer is unusable".
            assert not isinstance(exc, FatalError), exc
            assert not exc.fatal(), exc
            producer.abort_transaction()  # again, as the error says
        assert producer.state == "ready"
        producer.begin_transaction()
        producer.produce("orders", b"next")
        producer.commit_transaction()
        assert producer.state == "ready"
