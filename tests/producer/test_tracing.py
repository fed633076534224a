"""OpenTelemetry tracing (``tracing=``): one span per transaction from begin to the call
that ended it, with the outcome the producer reported; prepare and complete as its
children; recovery as a span of its own; fatal errors recorded with their category.
Spans go to the SDK's in-memory exporter on a real broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from kafka_txn import ProducerFencedError, TransactionalProducer
from kafka_txn.dualwrite import DualWriter
from kafka_txn.metrics import InMemoryMetrics
from kafka_txn.tracing import Tracing

TWO_PHASE = {"transaction.two.phase.commit.enable": True}


class Spans:
    """The in-memory exporter behind a TracerProvider."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, [s.name for s in self.exporter.get_finished_spans()]
        return found[0]


@pytest.fixture
def spans() -> Iterator[Spans]:
    recorded = Spans()
    yield recorded
    recorded.provider.shutdown()


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.mark.guarantee("8.1")
def test_a_committed_transaction_is_one_span_with_its_records(
    producer_config: dict[str, Any], topic: str, spans: Spans
) -> None:
    """A transaction committed through ``transaction()`` is one PRODUCER span named
    ``kafka-txn transaction``, status unset, outcome committed, with the messaging
    attributes, the transactional id, and its delivered records and value bytes; the
    span starts under the caller's current span."""
    tracer = spans.provider.get_tracer("test")
    with TransactionalProducer(producer_config, tracing=spans.provider) as p:
        p.init_transactions()
        with tracer.start_as_current_span("caller"), p.transaction():
            p.produce(topic, b"abc")
            p.produce(topic, b"defgh", key=b"k")
    span = spans.one("kafka-txn transaction")
    caller = spans.one("caller")
    attrs = _attrs(span)
    assert span.kind is SpanKind.PRODUCER
    assert span.status.status_code is StatusCode.UNSET
    assert span.parent is not None and span.parent.span_id == caller.context.span_id
    assert attrs["messaging.system"] == "kafka"
    assert attrs["messaging.operation.type"] == "send"
    assert attrs["messaging.operation.name"] == "transaction"
    assert attrs["kafka_txn.transactional_id"] == p.transactional_id
    assert attrs["messaging.client.id"] == p.transactional_id
    assert attrs["kafka_txn.transaction.outcome"] == "committed"
    assert attrs["messaging.batch.message_count"] == 2
    assert attrs["kafka_txn.transaction.value_bytes"] == 8
    assert "error.type" not in attrs


@pytest.mark.guarantee("8.1")
def test_an_exception_in_the_body_aborts_and_the_span_says_so(
    producer_config: dict[str, Any], topic: str, spans: Spans
) -> None:
    """An exception raised in ``with producer.transaction():`` aborts the transaction:
    its span's outcome is aborted, status ERROR, the exception recorded as an event,
    ``error.type`` its class and the error category ``application``."""
    with TransactionalProducer(producer_config, tracing=Tracing(spans.provider)) as p:
        p.init_transactions()
        with pytest.raises(RuntimeError, match="boom"), p.transaction():
            p.produce(topic, b"never")
            raise RuntimeError("boom")
        with p.transaction():  # the next transaction is a span of its own
            p.produce(topic, b"next")
    aborted, committed = spans.named("kafka-txn transaction")
    attrs = _attrs(aborted)
    assert attrs["kafka_txn.transaction.outcome"] == "aborted"
    assert aborted.status.status_code is StatusCode.ERROR
    assert attrs["error.type"] == "RuntimeError"
    assert attrs["kafka_txn.error.category"] == "application"
    assert [e.name for e in aborted.events] == ["exception"]
    assert _attrs(committed)["kafka_txn.transaction.outcome"] == "committed"
    assert _attrs(committed)["messaging.batch.message_count"] == 1
    assert committed.context.trace_id != aborted.context.trace_id


@pytest.mark.guarantee("8.1")
def test_a_fenced_producer_ends_its_span_failed_with_the_fatal_category(
    producer_config: dict[str, Any], topic: str, spans: Spans
) -> None:
    """A producer fenced by a successor's init: the commit raises ProducerFencedError,
    and the transaction's span ends at once with outcome failed, status ERROR, error
    category fatal and the exception recorded."""
    zombie = TransactionalProducer(producer_config, tracing=spans.provider)
    successor = TransactionalProducer(producer_config)
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.produce(topic, b"zombie")
        zombie.flush(10)
        successor.init_transactions()  # fences the zombie
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction()
        span = spans.one("kafka-txn transaction")  # ended by the fatal error, before close()
    finally:
        zombie.close()
        successor.close()
    attrs = _attrs(span)
    assert attrs["kafka_txn.transaction.outcome"] == "failed"
    assert attrs["kafka_txn.error.category"] == "fatal"
    assert attrs["error.type"] == "ProducerFencedError"
    assert span.status.status_code is StatusCode.ERROR
    assert any(
        e.name == "exception"
        and (e.attributes or {}).get("exception.type", "").endswith("ProducerFencedError")
        for e in span.events
    )
    assert len(spans.named("kafka-txn transaction")) == 1  # close() ended nothing more


@pytest.mark.guarantee("8.1")
def test_prepare_and_complete_are_children_of_the_transaction_span(
    producer_config: dict[str, Any], topic: str, spans: Spans
) -> None:
    """With two-phase commit, prepare_transaction() and complete_transaction() are
    spans ``kafka-txn prepare`` and ``kafka-txn complete`` under the transaction's span,
    which ends after them; all carry the producer id and epoch of the prepared state."""
    with TransactionalProducer({**producer_config, **TWO_PHASE}, tracing=spans.provider) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, b"two-phase")
        state = p.prepare_transaction()
        p.complete_transaction(state)
    txn = spans.one("kafka-txn transaction")
    prepare = spans.one("kafka-txn prepare")
    complete = spans.one("kafka-txn complete")
    for child in (prepare, complete):
        assert child.parent is not None and child.parent.span_id == txn.context.span_id
        assert child.kind is SpanKind.INTERNAL
        assert child.end_time is not None and txn.end_time is not None
        assert child.end_time <= txn.end_time
    assert _attrs(prepare)["messaging.operation.name"] == "prepare_transaction"
    assert _attrs(complete)["messaging.operation.name"] == "complete_transaction"
    assert _attrs(complete)["kafka_txn.transaction.outcome"] == "committed"
    assert _attrs(txn)["kafka_txn.transaction.outcome"] == "committed"
    for span in (txn, prepare):
        assert _attrs(span)["kafka_txn.producer_id"] == state.producer_id
        assert _attrs(span)["kafka_txn.producer_epoch"] == state.producer_epoch
    assert _attrs(txn)["messaging.batch.message_count"] == 1


@pytest.mark.guarantee("8.1")
def test_recovery_is_a_span_of_its_own(
    producer_config: dict[str, Any], topic: str, spans: Spans
) -> None:
    """complete_transaction() after init_transactions(keep_prepared_txn=True) is one
    ``kafka-txn recovery`` span, not under any transaction span, with the stored
    state's producer id and epoch and recovery's outcome; the crashed producer's
    transaction span, closed while prepared, ends in doubt."""
    config = {**producer_config, **TWO_PHASE}
    crashed = TransactionalProducer(config, tracing=spans.provider)
    crashed.init_transactions()
    crashed.begin_transaction()
    crashed.produce(topic, b"in-doubt")
    state = crashed.prepare_transaction()
    crashed.close()  # left prepared for recovery
    with TransactionalProducer(config, tracing=spans.provider) as fresh:
        fresh.init_transactions(keep_prepared_txn=True)
        assert fresh.complete_transaction(state).value == "committed"
    recovery = spans.one("kafka-txn recovery")
    attrs = _attrs(recovery)
    assert recovery.parent is None
    assert attrs["messaging.operation.name"] == "recovery"
    assert attrs["kafka_txn.transaction.outcome"] == "committed"
    assert attrs["kafka_txn.producer_id"] == state.producer_id
    assert attrs["kafka_txn.producer_epoch"] == state.producer_epoch
    assert recovery.status.status_code is StatusCode.UNSET
    assert _attrs(spans.one("kafka-txn transaction"))["kafka_txn.transaction.outcome"] == (
        "in_doubt"
    )


@pytest.mark.guarantee("8.1")
def test_dual_writer_traces_its_transactions_and_start_time_recovery(
    producer_config: dict[str, Any], topic: str, spans: Spans
) -> None:
    """DualWriter passes ``tracing=`` to its producer: start()'s recovery is a recovery
    span, each transaction a transaction span with prepare and complete children."""
    from sqlalchemy import text

    writer = DualWriter(producer_config, "sqlite://", tracing=spans.provider)
    with writer, writer.transaction() as tx:
        tx.connection.execute(text("select 1"))
        tx.produce(topic, b"dual")
    assert spans.one("kafka-txn recovery").parent is None
    txn = spans.one("kafka-txn transaction")
    assert _attrs(txn)["kafka_txn.transaction.outcome"] == "committed"
    for name in ("kafka-txn prepare", "kafka-txn complete"):
        child = spans.one(name)
        assert child.parent is not None and child.parent.span_id == txn.context.span_id


def test_without_tracing_or_counting_metrics_no_transaction_is_watched(
    producer_config: dict[str, Any],
) -> None:
    """Tracing is opt-in: without ``tracing=`` (and without a metrics hook that takes
    per-transaction counts) the producer keeps no watch and librdkafka's delivery
    callback is the bookkeeping's own (no counting call per record)."""
    with TransactionalProducer(producer_config) as p:
        assert p._watch is None
        assert p._deliveries.user_on_delivery is None
    with TransactionalProducer(producer_config, metrics=InMemoryMetrics()) as p:
        assert p._watch is not None


@given(
    value=st.one_of(
        st.text(), st.integers(), st.booleans(), st.lists(st.integers()), st.just(object())
    )
)
def test_anything_but_a_tracing_or_a_tracer_provider_is_refused(value: object) -> None:
    """``tracing=`` takes a ``Tracing``, a ``TracerProvider`` or None; anything else is a
    TypeError that names what to pass, raised before a librdkafka handle exists."""
    config = {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "refused"}
    refused = r"^TransactionalProducer\(tracing=\.\.\.\) must be (?s:.)*Tracing\(tracer_provider\)"
    with pytest.raises(TypeError, match=refused):
        TransactionalProducer(config, tracing=value)  # type: ignore[arg-type]


def test_dual_writer_and_processor_refuse_a_bad_tracing_naming_themselves() -> None:
    """DualWriter and ExactlyOnceProcessor check ``tracing=`` before they connect
    anywhere, and their TypeError names the call."""
    from kafka_txn.eos import ExactlyOnceProcessor

    config = {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "refused"}
    with pytest.raises(TypeError, match=r"^DualWriter\(tracing=\.\.\.\) must be"):
        DualWriter(config, "sqlite://", tracing="otel")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^ExactlyOnceProcessor\(tracing=\.\.\.\) must be"):
        ExactlyOnceProcessor(
            {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"},
            config,
            ["in"],
            lambda record: [],
            tracing=42,  # type: ignore[arg-type]
        )
