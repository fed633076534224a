"""A minimal Kafka protocol client for the transaction coordinator (two-phase commit and
recovery need requests librdkafka does not expose)."""

from .client import CoordinatorClient, CoordinatorError, TransactionDescription
from .connection import ConnectionSettings

__all__ = ["ConnectionSettings", "CoordinatorClient", "CoordinatorError", "TransactionDescription"]
