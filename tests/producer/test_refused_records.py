"""Records confluent-kafka refuses before queueing them (a str that is no valid UTF-8, with
or without a serializer, in the value, the key or a header; a partition number that
overflows; a value of the wrong type): each is a failed record of the transaction
(MESSAGE_REJECTED, confluent-kafka's error wrapped once), so commit_transaction() raises
CommitFailedException and nothing of the transaction is visible (guarantee 1.2), and the
producer goes on after the abort. On the real broker, checked with an independent
read_committed consumer (kafka-python, tests/support/rig.py). Each test runs in both
delivery modes (tests/fixtures/delivery_reports.py): a refused record is a failed record
for an error-only producer too; ``send()``, refused outright by such a producer, is
checked with every delivery report only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.serialization import StringSerializer

from kafka_txn import (
    CommitFailedException,
    FailureType,
    KafkaTxnError,
    ProduceFailedException,
    TransactionalProducer,
)
from tests.support.rig import Broker

pytestmark = [pytest.mark.adversary, pytest.mark.delivery_reports("all", "errors")]

LONE_SURROGATE = "order-\ud800"
"""A str value that is no valid UTF-8: confluent-kafka cannot encode it."""


@pytest.mark.guarantee("1.2")
def test_a_value_librdkafka_cannot_encode_fails_the_commit(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """A str value that is no valid UTF-8, refused by a str serializer or by
    confluent-kafka's own encoding: a failed record, and the commit refuses."""
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


_REFUSED = [
    ("overflow", _overflowing_partition, ProduceFailedException, KafkaError._INVALID_ARG,
     OverflowError),
    ("key", _unencodable_key, ProduceFailedException, KafkaError._KEY_SERIALIZATION,
     UnicodeEncodeError),
    ("send", _unencodable_send, ProduceFailedException, KafkaError._VALUE_SERIALIZATION,
     UnicodeEncodeError),
    ("header", _unencodable_header, ProduceFailedException, KafkaError._INVALID_ARG,
     UnicodeEncodeError),
    # A wrong type is a programming error: raised as a TypeError saying what to pass
    # (docs/guide/producer.md), and still a record the transaction lost.
    ("type", _value_of_wrong_type, TypeError, KafkaError._INVALID_ARG, TypeError),
]  # fmt: skip


@pytest.mark.parametrize(
    ("delivery_reports", "call", "raised", "code", "cause"),
    [
        pytest.param(mode, *case, id=f"{mode}-{name}")
        for mode in ("all", "errors")
        for name, *case in _REFUSED
        # send() needs every delivery report: an error-only producer refuses it outright
        # (tests/producer/test_delivery_modes.py), so that case runs with "all" only.
        if not (name == "send" and mode == "errors")
    ],
    indirect=["delivery_reports"],
)
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
