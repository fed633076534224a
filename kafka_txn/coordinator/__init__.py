"""A minimal Kafka protocol client for the transaction coordinator (two-phase commit and
recovery need requests librdkafka does not expose)."""

from kafka_txn.coordinator.client import CoordinatorClient, CoordinatorError, TransactionDescription
from kafka_txn.coordinator.settings import ConnectionSettings

__all__ = ["ConnectionSettings", "CoordinatorClient", "CoordinatorError", "TransactionDescription"]
