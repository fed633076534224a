"""Two-phase commit against coordinator answers that are well framed but wrong (a broker
or gateway bug): a DescribeTransactions answer listing no transaction, the asked id
twice, or a transaction with a null topics array, and a FindCoordinator answer listing no
coordinator. Recovery raises a KafkaTxnError that says its outcome is unknown (never a
bare ValueError or IndexError) and the same call settles the transaction once the
coordinator answers (guarantee 3.9); prepare raises TransactionAbortableError (2.2).
tests/proxies/kafka_proxy.py rewrites the real broker's answers; Kafka is read with
kafka-python's read_committed consumer (tests/support/rig.py)."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_txn import TransactionalProducer
from kafka_txn.errors import (
    KafkaTxnError,
    TransactionAbortableError,
    TransactionOutcomeUnknownError,
)
from kafka_txn.twophase.recovery import TransactionOutcome
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support import adversaries as support
from tests.support.adversaries import txn_config
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary

proxy = support.proxy


def _no_states(request: Any, response: Any) -> None:
    """A DescribeTransactions answer listing no transaction (a broker or gateway bug):
    well framed, every field readable."""
    response.transaction_states = []


def _two_states(request: Any, response: Any) -> None:
    """An answer listing the asked id twice."""
    response.transaction_states = list(response.transaction_states) * 2


def _null_topics(request: Any, response: Any) -> None:
    """An answer whose transaction has a null topics array (KIP-482 compact null)."""
    for state in response.transaction_states:
        state.topics = None


def _prepared_on_proxy(
    broker: Broker, proxy: KafkaProxy, topic: str, txn_id: str
) -> tuple[TransactionalProducer, Any]:
    crashed = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id, two_phase=True), operation_timeout=20
    )
    crashed.init_transactions()
    crashed.begin_transaction()
    crashed.produce(topic, b"order-1", partition=0)
    return crashed, crashed.prepare_transaction()


_NULL_TOPICS = pytest.param(_null_topics, id="null_topics")


@pytest.mark.parametrize(
    "edit",
    [pytest.param(_no_states, id="none"), pytest.param(_two_states, id="two"), _NULL_TOPICS],
)
@pytest.mark.guarantee("3.9")
def test_recovery_with_a_describe_answer_of_the_wrong_length_is_unknown(
    broker: Broker, proxy: KafkaProxy, topic: str, txn_id: str, edit: Any
) -> None:
    """Guarantee 3.9 and errors.md: a DescribeTransactions answer listing no transaction,
    two, or one with null topics makes recovery raise TransactionOutcomeUnknownError (not
    a bare ValueError), and the same call settles the transaction once the coordinator
    answers."""
    crashed, state = _prepared_on_proxy(broker, proxy, topic, txn_id)
    crashed.close(timeout=5)  # leaves the prepared transaction open, as a crash would
    fresh = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id, two_phase=True), operation_timeout=3
    )
    try:
        fresh.init_transactions(keep_prepared_txn=True)
        rule = proxy.rewrite(ApiKey.DESCRIBE_TRANSACTIONS, edit)
        try:
            with pytest.raises(TransactionOutcomeUnknownError):
                fresh.complete_transaction(state)
        finally:
            proxy.remove(rule)
        # Nothing was decided: the same call settles it once the coordinator answers.
        assert fresh.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]
    finally:
        fresh.close(timeout=5)


@pytest.mark.guarantee("2.2")
def test_prepare_with_a_describe_answer_listing_nothing_is_abortable(
    broker: Broker, proxy: KafkaProxy, topic: str, txn_id: str
) -> None:
    """errors.md / two-phase-commit.md: a DescribeTransactions answer listing nothing makes
    prepare raise TransactionAbortableError (not a bare ValueError)."""
    producer = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id, two_phase=True), operation_timeout=3
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"order-1", partition=0)
        rule = proxy.rewrite(ApiKey.DESCRIBE_TRANSACTIONS, _no_states)
        try:
            with pytest.raises(TransactionAbortableError):
                producer.prepare_transaction()
        finally:
            proxy.remove(rule)
        producer.abort_transaction()
        assert broker.read_committed(topic, expected=0) == []
    finally:
        producer.close(timeout=5)


def _no_coordinators(request: Any, response: Any) -> None:
    if hasattr(response, "coordinators"):
        response.coordinators = []
    else:  # pragma: no cover - older FindCoordinator: nothing to empty
        pass


@pytest.mark.guarantee("3.9")
def test_recovery_with_a_find_coordinator_answer_listing_nothing_is_unknown(
    broker: Broker, proxy: KafkaProxy, topic: str, txn_id: str
) -> None:
    """Guarantee 3.9: a FindCoordinator answer listing no coordinator makes recovery raise
    a KafkaTxnError (not a bare IndexError), and the same call settles it later."""
    crashed, state = _prepared_on_proxy(broker, proxy, topic, txn_id)
    crashed.close(timeout=5)
    fresh = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id, two_phase=True), operation_timeout=3
    )
    try:
        fresh.init_transactions(keep_prepared_txn=True)
        rule = proxy.rewrite(ApiKey.FIND_COORDINATOR, _no_coordinators, versions=range(4, 99))
        try:
            with pytest.raises(KafkaTxnError):
                fresh.complete_transaction(state)
        finally:
            proxy.remove(rule)
        assert rule.hits, "the coordinator client sent no FindCoordinator v4+"
        assert fresh.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]
    finally:
        fresh.close(timeout=5)
