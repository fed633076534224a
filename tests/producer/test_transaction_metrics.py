"""Per-transaction metrics (``transaction_ended``): each transaction's outcome with the
records librdkafka delivered in it and their value bytes, under a ``transactional_id``
label whose number of values is bounded. In memory and through prometheus_client's
registry, on a real broker."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from kafka_txn import TransactionalProducer
from kafka_txn.metrics import InMemoryMetrics, PrometheusMetrics, TransactionalIdLabels
from tests.fixtures.broker import Broker

pytestmark = pytest.mark.broker


def _committed_then_aborted(config: dict[str, Any], topic: str, metrics: Any) -> None:
    """A transaction of 3 records (2 + 3 + 4 value bytes) committed, then one whose
    record is delivered (flushed) before it is aborted."""
    with TransactionalProducer(config, metrics=metrics) as p:
        p.init_transactions()
        with p.transaction():
            for value in (b"ab", b"cde", b"fghi"):
                p.produce(topic, value)
        p.begin_transaction()
        p.produce(topic, b"12345")
        assert p.flush(10) == 0
        p.abort_transaction()


def test_in_memory_metrics_count_records_and_bytes_per_outcome(
    producer_config: dict[str, Any], topic: str
) -> None:
    """InMemoryMetrics gets one committed and one aborted transaction, each with the
    records delivered in it and their value bytes, under the producer's transactional id;
    the existing operation counts are unchanged."""
    metrics = InMemoryMetrics()
    _committed_then_aborted(producer_config, topic, metrics)
    tid = producer_config["transactional.id"]
    assert metrics.transactions == {(tid, "committed"): 1, (tid, "aborted"): 1}
    assert metrics.records == {(tid, "committed"): 3, (tid, "aborted"): 1}
    assert metrics.value_bytes == {(tid, "committed"): 9, (tid, "aborted"): 5}
    assert metrics.calls[("commit_transaction", True)] == 1


def test_prometheus_adapter_counts_records_and_bytes(
    producer_config: dict[str, Any], topic: str
) -> None:
    """PrometheusMetrics exports ``kafka_txn_transactions_total``,
    ``kafka_txn_transaction_records_total`` and ``kafka_txn_transaction_bytes_total``
    labelled ``{transactional_id, outcome}``."""
    registry = CollectorRegistry()
    _committed_then_aborted(producer_config, topic, PrometheusMetrics(registry))
    tid = producer_config["transactional.id"]
    value = registry.get_sample_value
    committed = {"transactional_id": tid, "outcome": "committed"}
    aborted = {"transactional_id": tid, "outcome": "aborted"}
    assert value("kafka_txn_transactions_total", committed) == 1
    assert value("kafka_txn_transactions_total", aborted) == 1
    assert value("kafka_txn_transaction_records_total", committed) == 3
    assert value("kafka_txn_transaction_records_total", aborted) == 1
    assert value("kafka_txn_transaction_bytes_total", committed) == 9
    assert value("kafka_txn_transaction_bytes_total", aborted) == 5


def test_a_producer_that_failed_fatally_counts_its_transaction_failed(
    producer_config: dict[str, Any], topic: str
) -> None:
    """A producer fenced by a successor: its transaction is counted with outcome
    ``failed`` when the commit raises the fatal error, and close() counts nothing more."""
    metrics = InMemoryMetrics()
    zombie = TransactionalProducer(producer_config, metrics=metrics)
    successor = TransactionalProducer(producer_config)
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.produce(topic, b"zombie")
        zombie.flush(10)
        successor.init_transactions()
        with pytest.raises(Exception, match="fenced"):
            zombie.commit_transaction()
    finally:
        zombie.close()
        successor.close()
    tid = producer_config["transactional.id"]
    assert metrics.transactions == {(tid, "failed"): 1}


@pytest.mark.guarantee("8.2")
def test_transactional_id_labels_past_the_bound_are_folded_into_other(
    broker: Broker, topic: str
) -> None:
    """With ``max_transactional_ids=2``, the first two transactional ids seen keep their
    own label and a third producer's transactions are labelled ``other``."""
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry, max_transactional_ids=2)
    ids = [f"bounded-{n}-{topic}" for n in range(3)]
    for tid in ids:
        conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid}
        with TransactionalProducer(conf, metrics=metrics) as p:
            p.init_transactions()
            with p.transaction():
                p.produce(topic, b"x")
    value = registry.get_sample_value
    for label in (*ids[:2], "other"):
        labels = {"transactional_id": label, "outcome": "committed"}
        assert value("kafka_txn_transactions_total", labels) == 1, label
    assert value("kafka_txn_transactions_total", {"transactional_id": ids[2],
                                                  "outcome": "committed"}) is None  # fmt: skip


@pytest.mark.guarantee("8.2")
def test_a_label_function_folds_per_partition_ids_before_the_bound(
    broker: Broker, topic: str
) -> None:
    """``transactional_id_label`` maps ids such as the Spark sink's
    ``<prefix>-<partition>`` to one label before the bound applies."""
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(
        registry,
        max_transactional_ids=1,
        transactional_id_label=lambda tid: tid.rsplit("-", 1)[0],
    )
    for partition in range(2):
        conf = {"bootstrap.servers": broker.bootstrap_servers,
                "transactional.id": f"sink{topic}-{partition}"}  # fmt: skip
        with TransactionalProducer(conf, metrics=metrics) as p:
            p.init_transactions()
            with p.transaction():
                p.produce(topic, b"x")
    labels = {"transactional_id": f"sink{topic}", "outcome": "committed"}
    assert registry.get_sample_value("kafka_txn_transactions_total", labels) == 2


@pytest.mark.guarantee("8.2")
@given(ids=st.lists(st.text(min_size=1, max_size=8), max_size=40),
       bound=st.integers(min_value=0, max_value=10))  # fmt: skip
def test_labels_never_exceed_the_bound_plus_other(ids: list[str], bound: int) -> None:
    """Whatever the ids, the first ``max_transactional_ids`` distinct ids seen keep their
    own label (for good) and every other id is labelled ``other``."""
    labels = TransactionalIdLabels(bound)
    kept = list(dict.fromkeys(ids))[:bound]
    for tid in ids:
        assert labels(tid) == (tid if tid in kept else "other")
    assert len({labels(tid) for tid in ids} - {"other"}) <= bound


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"max_transactional_ids": -1}, ValueError), ({"max_transactional_ids": "5"}, TypeError),
     ({"max_transactional_ids": True}, TypeError), ({"label": "prefix"}, TypeError)],
)  # fmt: skip
def test_bad_label_settings_are_refused(kwargs: dict[str, Any], error: type) -> None:
    """A negative or non-int bound, or a label that is not a function, is refused."""
    with pytest.raises(error, match=r"max_transactional_ids|label"):
        TransactionalIdLabels(**kwargs)


@pytest.mark.guarantee("8.2")
@pytest.mark.parametrize("result", [None, 7, b"orders"])
def test_a_label_function_that_returns_no_str_is_named(result: object) -> None:
    """A label function returning None (or any non-str) raises TypeError naming its
    result and the id, rather than a label "None"; nothing is kept for it."""
    labels = TransactionalIdLabels(1, lambda tid: result)  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError, match=re.escape(f"returned {result!r}")) as info:
        labels("orders-0")
    assert "'orders-0'" in str(info.value) and "must return a str" in str(info.value)
    assert TransactionalIdLabels(1, lambda tid: "ok")("orders-0") == "ok"


@pytest.mark.guarantee("8.2")
def test_a_bad_label_is_raised_once_the_transaction_has_ended(
    producer_config: dict[str, Any], topic: str
) -> None:
    """With a label function returning None, commit_transaction() raises the TypeError
    after the commit: the transaction stays committed and the producer ready."""
    metrics = PrometheusMetrics(CollectorRegistry(), transactional_id_label=lambda tid: None)  # type: ignore[arg-type, return-value]
    with TransactionalProducer(producer_config, metrics=metrics) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, b"x")
        with pytest.raises(TypeError, match="returned None"):
            p.commit_transaction()
        assert p.state == "ready"
