"""Metrics: a small hook the producer calls, and adapters.

The producer reports every transactional operation (``init_transactions``,
``begin_transaction``, ``prepare_transaction``, ``commit_transaction``,
``abort_transaction``, ``recovery``) with its duration and whether it succeeded, and every
failed record by FailureType. A hook that also has ``transaction_ended``
(``TransactionMetricsHook``) gets each transaction's outcome with the records librdkafka
delivered in it and their value bytes, counted from delivery reports (never in
``produce()``/``send()``; see ``kafka_txn.producer.watch``). Pass ``metrics=`` to
``TransactionalProducer``:

- ``InMemoryMetrics``: counts and total durations in dicts (tests, ad-hoc reporting);
- ``PrometheusMetrics``: prometheus_client counters and a histogram
  (``pip install 'kafka-txn[prometheus]'``);
- or any object with the two methods of ``MetricsHook`` (OpenTelemetry: record into a
  counter and a histogram from them).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from kafka_txn.errors import FailureType

__all__ = [
    "OTHER_TRANSACTIONAL_IDS",
    "InMemoryMetrics",
    "MetricsHook",
    "PrometheusMetrics",
    "TransactionMetricsHook",
    "TransactionalIdLabels",
    "timed",
]

OTHER_TRANSACTIONAL_IDS = "other"
"""The ``transactional_id`` label of every id past ``max_transactional_ids``."""

DEFAULT_MAX_TRANSACTIONAL_IDS = 100
"""How many distinct ``transactional_id`` label values a metrics object keeps by default."""


class MetricsHook(Protocol):
    """What the producer reports."""

    def operation(self, name: str, seconds: float, ok: bool) -> None:
        """A transactional operation finished (``ok``: without raising)."""

    def record_failed(self, failure_type: FailureType) -> None:
        """One record failed."""


class TransactionMetricsHook(MetricsHook, Protocol):
    """A ``MetricsHook`` that also takes each transaction's outcome and counts."""

    def transaction_ended(
        self, transactional_id: str, outcome: str, records: int, value_bytes: int
    ) -> None:
        """A transaction ended with ``outcome`` (``committed``, ``aborted``, ``failed``,
        ``unknown`` or ``in_doubt``: docs/guide/operations.md); ``records`` of its records
        were delivered, with ``value_bytes`` bytes of values."""


class TransactionalIdLabels:
    """The ``transactional_id`` label of an id: ``label(transactional_id)`` (default: the
    id itself), kept for the first ``max_transactional_ids`` distinct labels seen; every
    later one is ``"other"``. This bounds the label's cardinality where ids are many
    (the Spark sink's ``<prefix>-<partition>``: pass ``label=`` to strip the partition).
    ``max_transactional_ids=0`` labels every id ``"other"``; a kept label ``"other"``
    (an id so named) shares its series with the overflow. A ``label`` function that
    returns anything but a ``str`` raises ``TypeError``."""

    def __init__(
        self,
        max_transactional_ids: int = DEFAULT_MAX_TRANSACTIONAL_IDS,
        label: Callable[[str], str] | None = None,
    ) -> None:
        if isinstance(max_transactional_ids, bool) or not isinstance(max_transactional_ids, int):
            raise TypeError(f"max_transactional_ids must be an int, got {max_transactional_ids!r}")
        if max_transactional_ids < 0:
            raise ValueError(
                f"max_transactional_ids={max_transactional_ids} must be >= 0 (0: every id "
                "is labelled 'other')"
            )
        if label is not None and not callable(label):
            raise TypeError(f"label must be a function of the transactional id, got {label!r}")
        self.max_transactional_ids = max_transactional_ids
        self._label = label
        self._kept: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, transactional_id: str) -> str:
        label = transactional_id if self._label is None else self._label(transactional_id)
        if not isinstance(label, str):
            # prometheus_client would write None as the label "None": a wrong label,
            # not a missing one.
            raise TypeError(
                f"the transactional id label function returned {label!r} "
                f"({type(label).__name__}) for {transactional_id!r}: it must return a str"
            )
        if label in self._kept:
            return label
        with self._lock:
            if len(self._kept) < self.max_transactional_ids:
                self._kept.add(label)
                return label
        return OTHER_TRANSACTIONAL_IDS


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
    """Counts (``calls[(name, ok)]``), total seconds (``seconds[name]``), failed
    records (``failures[FailureType]``), and per ``(transactional_id label, outcome)``
    the transactions (``transactions``), their delivered records (``records``) and
    value bytes (``value_bytes``), in memory. ``labels`` bounds the transactional ids
    kept (``TransactionalIdLabels``: 100 by default, then ``"other"``)."""

    calls: Counter[tuple[str, bool]] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)
    failures: Counter[FailureType] = field(default_factory=Counter)
    transactions: Counter[tuple[str, str]] = field(default_factory=Counter)
    records: Counter[tuple[str, str]] = field(default_factory=Counter)
    value_bytes: Counter[tuple[str, str]] = field(default_factory=Counter)
    labels: TransactionalIdLabels = field(default_factory=TransactionalIdLabels)

    def operation(self, name: str, seconds: float, ok: bool) -> None:
        self.calls[(name, ok)] += 1
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def record_failed(self, failure_type: FailureType) -> None:
        self.failures[failure_type] += 1

    def transaction_ended(
        self, transactional_id: str, outcome: str, records: int, value_bytes: int
    ) -> None:
        key = (self.labels(transactional_id), outcome)
        self.transactions[key] += 1
        self.records[key] += records
        self.value_bytes[key] += value_bytes


class PrometheusMetrics:
    """prometheus_client metrics: ``kafka_txn_operations_total{operation,outcome}``,
    ``kafka_txn_operation_seconds{operation}`` (histogram),
    ``kafka_txn_record_failures_total{failure_type}``, and per
    ``{transactional_id,outcome}`` ``kafka_txn_transactions_total``,
    ``kafka_txn_transaction_records_total`` and ``kafka_txn_transaction_bytes_total``
    (delivered records and their value bytes). The ``transactional_id`` label is the
    id itself for the first ``max_transactional_ids`` (default 100) distinct labels,
    then ``"other"``; ``transactional_id_label`` maps an id to its label first."""

    def __init__(
        self,
        registry: Any = None,
        namespace: str = "kafka_txn",
        *,
        max_transactional_ids: int = DEFAULT_MAX_TRANSACTIONAL_IDS,
        transactional_id_label: Callable[[str], str] | None = None,
    ) -> None:
        self.labels = TransactionalIdLabels(max_transactional_ids, transactional_id_label)
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
        by_txn = ["transactional_id", "outcome"]
        self._txns = prom.Counter(
            f"{namespace}_transactions_total", "Transactions by outcome.", by_txn, **kwargs,
        )  # fmt: skip
        self._records = prom.Counter(
            f"{namespace}_transaction_records_total",
            "Records delivered in transactions, by the transaction's outcome.", by_txn, **kwargs,
        )  # fmt: skip
        self._bytes = prom.Counter(
            f"{namespace}_transaction_bytes_total",
            "Value bytes of records delivered in transactions, by the transaction's outcome.",
            by_txn, **kwargs,
        )  # fmt: skip

    def operation(self, name: str, seconds: float, ok: bool) -> None:
        self._ops.labels(name, "ok" if ok else "error").inc()
        self._seconds.labels(name).observe(seconds)

    def record_failed(self, failure_type: FailureType) -> None:
        self._failures.labels(failure_type.name).inc()

    def transaction_ended(
        self, transactional_id: str, outcome: str, records: int, value_bytes: int
    ) -> None:
        label = self.labels(transactional_id)
        self._txns.labels(label, outcome).inc()
        self._records.labels(label, outcome).inc(records)
        self._bytes.labels(label, outcome).inc(value_bytes)
