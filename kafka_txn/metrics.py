"""Metrics: a small hook the producer calls, and adapters.

The producer reports every transactional operation (``init_transactions``,
``begin_transaction``, ``prepare_transaction``, ``commit_transaction``,
``abort_transaction``, ``recovery``) with its duration and whether it succeeded, and every
failed record by FailureType. Pass ``metrics=`` to ``TransactionalProducer``:

- ``InMemoryMetrics``: counts and total durations in dicts (tests, ad-hoc reporting);
- ``PrometheusMetrics``: prometheus_client counters and a histogram
  (``pip install 'kafka-txn[prometheus]'``);
- or any object with the two methods of ``MetricsHook`` (OpenTelemetry: record into a
  counter and a histogram from them).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from kafka_txn.errors import FailureType

__all__ = ["InMemoryMetrics", "MetricsHook", "PrometheusMetrics", "timed"]


class MetricsHook(Protocol):
    """What the producer reports."""

    def operation(self, name: str, seconds: float, ok: bool) -> None:
        """A transactional operation finished (``ok``: without raising)."""

    def record_failed(self, failure_type: FailureType) -> None:
        """One record failed."""


_UNTIMED: AbstractContextManager[None] = nullcontext()


def timed(hook: MetricsHook | None, name: str) -> AbstractContextManager[None]:
    """Report the enclosed operation to ``hook``; without one, a shared no-op context
    (no generator per transaction on the producer's path)."""
    return _UNTIMED if hook is None else _timed(hook, name)


@contextmanager
def _timed(hook: MetricsHook, name: str) -> Iterator[None]:
    start = time.perf_counter()
    ok = False
    try:
        yield
        ok = True
    finally:
        hook.operation(name, time.perf_counter() - start, ok)


@dataclass
class InMemoryMetrics:
    """Counts (``calls[(name, ok)]``), total seconds (``seconds[name]``) and failed
    records (``failures[FailureType]``), in memory."""

    calls: Counter[tuple[str, bool]] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)
    failures: Counter[FailureType] = field(default_factory=Counter)

    def operation(self, name: str, seconds: float, ok: bool) -> None:
        self.calls[(name, ok)] += 1
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def record_failed(self, failure_type: FailureType) -> None:
        self.failures[failure_type] += 1


class PrometheusMetrics:
    """prometheus_client metrics: ``kafka_txn_operations_total{operation,outcome}``,
    ``kafka_txn_operation_seconds{operation}`` (histogram) and
    ``kafka_txn_record_failures_total{failure_type}``."""

    def __init__(self, registry: Any = None, namespace: str = "kafka_txn") -> None:
        try:
            import prometheus_client as prom  # noqa: PLC0415 - an optional extra
        except ImportError as exc:
            raise ImportError(
                "PrometheusMetrics needs prometheus_client: pip install 'kafka-txn[prometheus]'"
            ) from exc
        kwargs = {} if registry is None else {"registry": registry}
        self._ops = prom.Counter(
            f"{namespace}_operations_total", "Transactional operations by outcome.",
            ["operation", "outcome"], **kwargs,
        )  # fmt: skip
        self._seconds = prom.Histogram(
            f"{namespace}_operation_seconds", "Duration of transactional operations.",
            ["operation"], **kwargs,
        )  # fmt: skip
        self._failures = prom.Counter(
            f"{namespace}_record_failures_total", "Failed records by FailureType.",
            ["failure_type"], **kwargs,
        )  # fmt: skip

    def operation(self, name: str, seconds: float, ok: bool) -> None:
        self._ops.labels(name, "ok" if ok else "error").inc()
        self._seconds.labels(name).observe(seconds)

    def record_failed(self, failure_type: FailureType) -> None:
        self._failures.labels(failure_type.name).inc()
