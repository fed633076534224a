"""What a producer needs for two-phase commit besides librdkafka: its own producer
id/epoch, a coordinator client, and the translation of coordinator failures.

librdkafka does not expose the producer id and epoch, but its statistics do: the
top-level ``eos`` object has ``producer_id``, ``producer_epoch``, ``idemp_state`` and
``txn_state``. They change only at ``init_transactions()`` and at the epoch bump
``abort_transaction()`` may do (KIP-360), so a snapshot taken after the last of those stays
valid: only the first prepare after an init or abort waits for one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaError

from .coordinator import ConnectionSettings, CoordinatorClient, CoordinatorError
from .coordinator.connection import AuthenticationError, ProtocolError
from .errors import (
    ConfigurationError,
    FatalError,
    KafkaTxnError,
    TransactionAbortableError,
    TransactionOutcomeUnknownError,
)
from .state import PreparedTxnState

__all__ = ["DEFAULT_STATISTICS_INTERVAL_MS", "IdentityTracker", "TwoPhase"]

T = TypeVar("T")

DEFAULT_STATISTICS_INTERVAL_MS = 100
"""statistics.interval.ms set for two-phase commit when the user set none."""

# A snapshot whose transaction manager is in one of these states was taken when the
# producer id and epoch were settled (not mid-init, not mid-abort).
_SETTLED_TXN_STATES = frozenset({"Ready", "InTransaction", "BeginCommit", "CommittingTransaction"})


class IdentityTracker:
    """The producer id/epoch from librdkafka statistics; ``invalidate()`` after every
    call that may change them, then the next settled snapshot sets them again."""

    def __init__(self, chained: Callable[[str], None] | None) -> None:
        self._chained = chained
        self.identity: tuple[int, int] | None = None
        self._wanted = True

    def invalidate(self) -> None:
        self.identity = None
        self._wanted = True

    def on_stats(self, payload: str) -> None:
        """librdkafka's stats_cb: parses only the ``eos`` object, and only when needed."""
        if self._wanted:
            eos = _eos(payload)
            if (
                eos is not None
                and eos.get("idemp_state") == "Assigned"
                and eos.get("txn_state") in _SETTLED_TXN_STATES
                and int(eos.get("producer_id", -1)) >= 0
            ):
                self.identity = (int(eos["producer_id"]), int(eos["producer_epoch"]))
                self._wanted = False
        if self._chained is not None:
            self._chained(payload)


_DECODER = json.JSONDecoder()


def _eos(payload: str) -> dict[str, Any] | None:
    """The ``eos`` object of a statistics snapshot, parsed alone: a full snapshot can be
    megabytes with many partitions."""
    at = payload.find('"eos":')
    if at < 0:
        return None
    start = at + len('"eos":')
    while start < len(payload) and payload[start] in " \t\r\n":
        start += 1
    try:
        value, _ = _DECODER.raw_decode(payload, start)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class TwoPhase:
    """Two-phase-commit helpers owned by one TransactionalProducer."""

    def __init__(
        self,
        conf: Mapping[str, Any],
        transactional_id: str,
        *,
        deadline_s: float,
        sleep: Callable[[float], None],
        chained_stats: Callable[[str], None] | None,
    ) -> None:
        self.settings = ConnectionSettings.from_librdkafka(conf)  # bad settings raise now
        self.transactional_id = transactional_id
        self.identity = IdentityTracker(chained_stats)
        self.prepared: PreparedTxnState | None = None
        self.cluster_id: str | None = None
        self.last_start_ms: int | None = None
        self.last_describe_at = 0.0
        self.spacing_wait_s = 0.0
        """Total time space_transactions() slept (for benchmarks and diagnostics)."""
        self._deadline_s = deadline_s
        self._sleep = sleep
        self._client: CoordinatorClient | None = None

    @property
    def client(self) -> CoordinatorClient:
        if self._client is None:
            self._client = CoordinatorClient(
                self.settings, self.transactional_id, deadline_s=self._deadline_s,
                sleep=self._sleep,
            )  # fmt: skip
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def space_transactions(self) -> None:
        """Make sure the next transaction cannot get the previous one's start time.

        The coordinator stamps start times in milliseconds, and recovery tells transaction
        N from N+1 (same pid/epoch) by them. N started before the coordinator answered
        N's DescribeTransactions at prepare, so N+1 starts in a later millisecond if its
        first partition is added a millisecond or more after that answer (1.1 ms, for
        clock jitter). A real cluster's EndTxn usually takes longer than that; against a
        very fast local broker this wait is most of what two-phase commit adds."""
        wait = self.last_describe_at + 0.0011 - time.monotonic()
        if wait > 0:
            self.spacing_wait_s += wait
            time.sleep(wait)

    def call(self, operation: str, fn: Callable[[], T], *, recovering: bool) -> T:
        """Run a coordinator call, translating what survived its retries: when preparing,
        every failure leaves the transaction unprepared (abortable); when recovering, a
        coordinator that stayed unreachable leaves the outcome unknown."""
        try:
            return fn()
        except KafkaTxnError:
            raise
        except AuthenticationError as exc:
            raise ConfigurationError(
                f"{operation}: the coordinator client could not authenticate: {exc}"
            ) from exc
        except CoordinatorError as exc:
            if exc.code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                raise ConfigurationError(
                    f"{operation}: not authorized on transactional id "
                    f"{self.transactional_id!r}: grant WRITE and DESCRIBE on it",
                    kafka_error=exc.kafka_error,
                ) from exc
            if not recovering:
                raise TransactionAbortableError(
                    f"{operation}: the coordinator refused: {exc}; abort the transaction",
                    kafka_error=exc.kafka_error,
                ) from exc
            if exc.retriable:
                raise self._unknown(operation, exc) from exc
            raise FatalError(f"{operation}: {exc}", kafka_error=exc.kafka_error) from exc
        except ProtocolError as exc:
            if not recovering:
                raise TransactionAbortableError(
                    f"{operation}: could not reach the transaction coordinator: {exc}; "
                    "abort the transaction",
                    kafka_error=KafkaError(KafkaError._TRANSPORT),
                ) from exc
            raise self._unknown(operation, exc) from exc

    def _unknown(self, operation: str, exc: Exception) -> TransactionOutcomeUnknownError:
        return TransactionOutcomeUnknownError(
            f"{operation}: the transaction coordinator stayed unreachable for "
            f"{self._deadline_s:g}s ({exc}); nothing was decided: call it again",
            kafka_error=KafkaError(KafkaError._TIMED_OUT),
            operation=operation,
        )
