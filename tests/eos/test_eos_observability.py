"""ExactlyOnceProcessor's ``metrics=`` and ``tracing=``, and its stats: committed
outputs are told apart from the outputs of attempts that were aborted."""

from __future__ import annotations

import uuid

import pytest
import tenacity
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord
from kafka_txn.metrics import InMemoryMetrics
from tests.support.eos_topics import seed_topic

pytestmark = pytest.mark.broker


@pytest.mark.guarantee("8.1")
def test_stats_metrics_and_spans_of_a_run_with_aborted_attempts(broker) -> None:
    """A poison record fails twice, then is dead-lettered. ``stats.outputs`` counts only
    the outputs of committed transactions (the 19 good records' upper-cased copies), and
    ``stats.attempted_outputs`` also those produced in the aborted attempts; the metrics
    hook gets one ``process_transaction`` per transaction of the loop (ok when it
    committed), the producer's per-transaction counts (committed records: the outputs
    and the dead letter), and the tracer one span per transaction."""
    source, sink, dlq = (broker.create_topic(1) for _ in range(3))
    values = [b"ok-%02d" % i for i in range(20)]
    values[7] = b"poison"
    seed_topic(broker, source, values)

    def process(record):
        if record.value() == b"poison":
            raise ValueError("cannot parse")
        return [OutputRecord(sink, record.value().upper(), record.key())]

    metrics = InMemoryMetrics()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tid = f"eos-{uuid.uuid4().hex[:8]}"
    processor = ExactlyOnceProcessor(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": f"g-{tid}",
         "session.timeout.ms": 6000},
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid},
        [source], process, backoff=tenacity.wait_fixed(0.01), batch_size=25,
        max_attempts=2, dead_letter_topic=dlq, metrics=metrics, tracing=provider,
    )  # fmt: skip
    stats = processor.run(idle_timeout=3)
    provider.shutdown()

    assert stats.recovered == 1 and stats.aborts == 2
    assert stats.outputs == 19  # committed: every good record once
    assert len(broker.read_committed(sink, expected=19)) == 19
    # Each aborted attempt produced the outputs of its batch's records before the poison
    # one (at most 7: where the consumer's batches begin is up to the fetch).
    assert stats.outputs < stats.attempted_outputs <= stats.outputs + 2 * 7
    assert metrics.calls[("process_transaction", True)] == stats.transactions
    assert metrics.calls[("process_transaction", False)] == stats.aborts
    assert metrics.transactions[(tid, "committed")] == stats.transactions
    assert metrics.transactions[(tid, "aborted")] == stats.aborts
    assert metrics.records[(tid, "committed")] == stats.outputs + stats.recovered
    spans = [s for s in exporter.get_finished_spans() if s.name == "kafka-txn transaction"]
    outcomes = [dict(s.attributes or {})["kafka_txn.transaction.outcome"] for s in spans]
    assert sorted(outcomes) == sorted(
        ["committed"] * stats.transactions + ["aborted"] * stats.aborts
    )
