"""The metrics hook sees every transactional operation and every failed record."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from kafka_txn import FailureType, ProduceFailedException, TransactionalProducer
from kafka_txn.metrics import InMemoryMetrics, PrometheusMetrics

pytestmark = pytest.mark.broker


def _workload(producer_config: dict, topic: str, metrics) -> None:
    conf = {**producer_config, "message.max.bytes": 10_000,
            "transaction.two.phase.commit.enable": True}  # fmt: skip
    with TransactionalProducer(conf, metrics=metrics) as p:
        p.init_transactions()
        with p.transaction():
            p.produce(topic, b"ok")
        p.begin_transaction()
        with pytest.raises(ProduceFailedException):
            p.produce(topic, b"x" * 20_000)
        p.abort_transaction()
        p.begin_transaction()
        p.produce(topic, b"2pc")
        p.complete_transaction(p.prepare_transaction())


def test_in_memory_metrics_count_operations_and_failures(producer_config, topic):
    metrics = InMemoryMetrics()
    _workload(producer_config, topic, metrics)
    assert metrics.calls[("init_transactions", True)] == 1
    assert metrics.calls[("begin_transaction", True)] == 3
    assert metrics.calls[("commit_transaction", True)] == 2
    assert metrics.calls[("abort_transaction", True)] == 1
    assert metrics.calls[("prepare_transaction", True)] == 1
    assert metrics.failures == {FailureType.MESSAGE_REJECTED: 1}
    assert all(seconds >= 0 for seconds in metrics.seconds.values())


def test_failed_operations_are_counted_as_errors(producer_config):
    metrics = InMemoryMetrics()
    p = TransactionalProducer(producer_config, metrics=metrics)
    with pytest.raises(Exception, match="init_transactions"):
        p.begin_transaction()
    p.close()
    assert metrics.calls[("begin_transaction", False)] == 1


def test_prometheus_adapter(producer_config, topic):
    registry = CollectorRegistry()
    _workload(producer_config, topic, PrometheusMetrics(registry))
    value = registry.get_sample_value
    ops = "kafka_txn_operations_total"
    assert value(ops, {"operation": "commit_transaction", "outcome": "ok"}) == 2
    assert value(ops, {"operation": "abort_transaction", "outcome": "ok"}) == 1
    assert value("kafka_txn_operation_seconds_count", {"operation": "prepare_transaction"}) == 1
    assert value("kafka_txn_record_failures_total", {"failure_type": "MESSAGE_REJECTED"}) == 1
