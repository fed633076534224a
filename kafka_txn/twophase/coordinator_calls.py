"""The coordinator client as two-phase commit calls it.

librdkafka exposes none of the coordinator requests KIP-939's two-phase commit needs
(DescribeTransactions to see a transaction and its producer id/epoch, EndTxn to commit a
kept one), so prepare and recovery send them with ``kafka_txn.coordinator``'s client.
``CoordinatorCalls`` connects it on first use and closes it with the producer, and runs
every call through ``twophase.failures.coordinator_failure``, the one translation of what
survived the client's retries into kafka-txn errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient, CoordinatorError
from kafka_txn.coordinator.errors import AuthenticationError, ProtocolError
from kafka_txn.twophase.failures import coordinator_failure

__all__ = ["CoordinatorCalls"]

T = TypeVar("T")


class CoordinatorCalls:
    """The coordinator client of one producer's two-phase commit: connected on first use
    (``client``), closed with the producer, every call translated (``call``)."""

    def __init__(
        self,
        settings: ConnectionSettings,
        transactional_id: str,
        *,
        deadline_s: float,
        sleep: Callable[[float], None],
    ) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self._deadline_s = deadline_s
        self._sleep = sleep
        self._client: CoordinatorClient | None = None

    @property
    def connected(self) -> bool:
        """Whether the client was made (its first call connects it)."""
        return self._client is not None

    @property
    def client(self) -> CoordinatorClient:
        """The coordinator client, made on first use."""
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

    def call(self, operation: str, fn: Callable[[], T], *, recovering: bool) -> T:
        """Run a coordinator call, translating what survived its retries
        (``coordinator_failure``)."""
        try:
            return fn()
        except (CoordinatorError, ProtocolError, AuthenticationError) as exc:
            raise coordinator_failure(
                exc, operation, recovering=recovering, deadline_s=self._deadline_s
            ) from exc
