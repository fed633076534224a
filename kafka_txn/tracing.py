"""OpenTelemetry tracing of a producer's transactions (``pip install 'kafka-txn[otel]'``).

Opt-in: pass ``tracing=Tracing(provider)`` (or a ``TracerProvider`` itself) to
``TransactionalProducer``, ``DualWriter`` or ``ExactlyOnceProcessor``. Without it the
producer never imports OpenTelemetry and does no tracing work at all.

The span tree, and every attribute, are documented in docs/guide/operations.md
("Tracing with OpenTelemetry"):

- ``kafka-txn transaction`` (kind PRODUCER): from ``begin_transaction()`` to the call
  that ends the transaction (commit, abort, complete, a fatal error, or ``close()``);
- ``kafka-txn prepare`` and ``kafka-txn complete``: children of the transaction span;
- ``kafka-txn recovery``: ``complete_transaction()`` (or commit/abort) after
  ``init_transactions(keep_prepared_txn=True)``, a span of its own.
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING, Any

from kafka_txn._extras import missing_extra
from kafka_txn.errors import KafkaTxnError

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = ["Tracing", "as_tracing"]

INSTRUMENTATION_NAME = "kafka_txn"

TRANSACTION_SPAN = "kafka-txn transaction"
PREPARE_SPAN = "kafka-txn prepare"
COMPLETE_SPAN = "kafka-txn complete"
RECOVERY_SPAN = "kafka-txn recovery"


class Tracing:
    """Where a producer's spans go: a tracer of ``tracer_provider`` (default: the global
    one, ``opentelemetry.trace.get_tracer_provider()``), named ``kafka_txn``."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        try:
            from opentelemetry import trace  # noqa: PLC0415 - the [otel] extra
        except ImportError as exc:
            raise missing_extra("Tracing", "otel", exc) from exc
        provider = trace.get_tracer_provider() if tracer_provider is None else tracer_provider
        self.tracer: Tracer = provider.get_tracer(INSTRUMENTATION_NAME, _version())
        self._trace = trace

    def start(
        self, name: str, attributes: dict[str, Any], parent: Span | None = None, *, root: bool
    ) -> Span:
        """A started span: a child of ``parent``, else of the caller's current span."""
        trace = self._trace
        kind = trace.SpanKind.PRODUCER if root else trace.SpanKind.INTERNAL
        context = None if parent is None else trace.set_span_in_context(parent)
        return self.tracer.start_span(name, context=context, kind=kind, attributes=attributes)

    def failed(self, span: Span, exc: BaseException) -> None:
        """Record ``exc`` on ``span``: its event, ``error.type``, the KIP-691 category of a
        kafka-txn error, and status ERROR."""
        span.record_exception(exc)
        span.set_attribute("error.type", type(exc).__qualname__)
        category = error_category(exc)
        if category is not None:
            span.set_attribute("kafka_txn.error.category", category)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(exc)[:200]))


def _version() -> str | None:
    """kafka-txn's installed version, the tracer's instrumentation version."""
    try:
        return importlib.metadata.version("kafka-txn")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return None


def error_category(exc: BaseException) -> str | None:
    """The KIP-691 category (``kafka_txn.classification``) of a kafka-txn error, or
    ``"application"`` for an exception that is not one (the caller's own)."""
    if isinstance(exc, KafkaTxnError):
        return None if exc.category is None else exc.category.value
    return "application"


def as_tracing(
    tracing: Tracing | TracerProvider | None, call: str = "TransactionalProducer"
) -> Tracing | None:
    """``tracing`` as a ``Tracing``: a ``TracerProvider`` is wrapped, None stays None
    (tracing off); anything else is a ``TypeError`` naming ``call``."""
    if tracing is None or isinstance(tracing, Tracing):
        return tracing
    if not callable(getattr(tracing, "get_tracer", None)):
        shown = repr(tracing)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise TypeError(
            f"{call}(tracing=...) must be a kafka_txn.tracing.Tracing, an OpenTelemetry "
            f"TracerProvider or None, got {shown} ({type(tracing).__name__}): pass "
            "Tracing(tracer_provider)"
        )
    return Tracing(tracing)
