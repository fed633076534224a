"""Requests the coordinator or the broker applied whose answer is lost, late, or replaced
with an error (the call failing after the decision was made): a commit is never reported
as failed (CommitFailedException means "nothing is visible: rewind inputs and retry",
README and docs/reference/errors.md), close() never aborts a transaction whose commit was
sent (guarantee 1.13), and a Produce applied and answered with a retriable error is
written once (1.1). On the real broker, through tests/proxies/kafka_proxy.py, which
forwards the request and then hands the client a made-up error or holds the answer;
Kafka is read with an independent read_committed consumer (kafka-python,
tests/support/rig.py). Each test runs in both delivery modes (tests/fixtures/
delivery_reports.py): with every delivery report and error-only."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError

from kafka_txn import CommitFailedException, TransactionalProducer
from kafka_txn.errors import FatalError, TransactionOutcomeUnknownError
from tests.fixtures.delivery_reports import DeliveryReports, delivery_settings
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support import adversaries as support
from tests.support.adversaries import txn_config
from tests.support.rig import Broker

pytestmark = [pytest.mark.adversary, pytest.mark.delivery_reports("all", "errors")]

proxy = support.proxy

_LOST_ANSWERS = pytest.mark.parametrize(
    "code",
    [KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION],
    ids=["request-timed-out", "network-exception"],
)


@_LOST_ANSWERS
def test_a_commit_the_coordinator_applied_is_never_reported_as_failed(
    broker: Broker,
    topic: str,
    proxy: KafkaProxy,
    txn_id: str,
    code: int,
    delivery_reports: DeliveryReports,
) -> None:
    """README/errors.md, CommitFailedException: a commit the coordinator applied is never
    reported as failed when a timeout or network error replaces its answer."""
    producer = TransactionalProducer(
        {**txn_config(proxy.bootstrap_servers, txn_id), **delivery_settings(delivery_reports)},
        operation_timeout=20,
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


@pytest.mark.parametrize(
    "code",
    [KafkaError.UNKNOWN, KafkaError.REQUEST_TIMED_OUT],
    ids=["unknown_server_error", "request_timed_out"],
)
def test_a_resumed_commit_whose_late_answer_follows_an_applied_commit_is_never_failed(
    broker: Broker,
    topic: str,
    proxy: KafkaProxy,
    txn_id: str,
    code: int,
    delivery_reports: DeliveryReports,
) -> None:
    """The EndTxn(commit) answer arrives after commit_transaction() gave up (its outcome
    unknown), and says an error though the coordinator applied the commit; the caller
    calls commit_transaction() again (errors.md) and, on CommitFailedException, follows
    the README's abort-and-retry: the order is visible once."""
    producer = TransactionalProducer(
        {**txn_config(proxy.bootstrap_servers, txn_id), **delivery_settings(delivery_reports)},
        operation_timeout=20,
    )
    try:
        producer.init_transactions()
        proxy.delay(ApiKey.END_TXN, 4000, times=1)
        proxy.fail(ApiKey.END_TXN, code, forward=True, times=1)
        producer.begin_transaction()
        producer.produce(topic, b"order-1", partition=0)
        try:
            producer.commit_transaction(timeout=1)
        except TransactionOutcomeUnknownError:
            time.sleep(5)  # the late answer arrives meanwhile (not a timing assertion)
            try:
                producer.commit_transaction()
            except CommitFailedException:
                producer.abort_transaction()
                with producer.transaction():
                    producer.produce(topic, b"order-1", partition=0)
            except FatalError as exc:
                assert "unknown" in str(exc)
        except FatalError as exc:
            assert "unknown" in str(exc)
        assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]
    finally:
        producer.close(timeout=5)


@pytest.mark.guarantee("1.13")
def test_close_never_aborts_a_transaction_whose_commit_was_sent(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str, delivery_reports: DeliveryReports
) -> None:
    """A commit applied whose answer is a timeout (outcome unknown, FatalError): close()
    sends no EndTxn(abort), and the records are visible."""
    producer = TransactionalProducer(
        {**txn_config(proxy.bootstrap_servers, txn_id), **delivery_settings(delivery_reports)},
        operation_timeout=20,
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


@pytest.mark.parametrize(
    "code",
    [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND],
    ids=["not-leader", "not-enough-replicas-after-append"],
)
def test_a_produce_the_broker_applied_but_answered_with_an_error_commits_once(
    broker: Broker,
    topic: str,
    proxy: KafkaProxy,
    txn_id: str,
    code: int,
    delivery_reports: DeliveryReports,
) -> None:
    """1.1 under 'the call failing after the decision was made', for Produce: the broker
    appends the batch and the answer is a retriable error; librdkafka sends the batch
    again with the same sequence numbers and the broker drops the duplicate."""
    producer = TransactionalProducer(
        {**txn_config(proxy.bootstrap_servers, txn_id), **delivery_settings(delivery_reports)},
        operation_timeout=20,
    )
    try:
        producer.init_transactions()
        rule = proxy.fail(ApiKey.PRODUCE, code, forward=True, times=1)
        failed: list[object] = []
        with producer.transaction():
            if producer.error_reports_only:  # send() is refused: a callback hears failures
                producer.produce(
                    topic, b"once", partition=0, on_delivery=lambda e, m: failed.append(e)
                )
                assert producer.flush(10) == 0
            else:
                failed.append(producer.send(topic, b"once", partition=0).exception(timeout=10))
                failed.remove(None)
        assert failed == []
        assert rule.hits == 1
        assert broker.read_committed(topic, expected=1) == [(None, b"once")]
    finally:
        producer.close(timeout=5)
