"""kafka-txn: Kafka transactions that are safe to use from Python.

A facade over confluent-kafka's transactional producer with the KIP-691 error model:
fatal errors close the producer, abortable errors abort the transaction,
``commit_transaction()`` raises ``CommitFailedException`` for every non-fatal failure,
and every record failure carries a ``FailureType``.
"""

from .classification import ERROR_TABLE, ErrorRule, classify
from .config import ProducerSettings
from .errors import (
    CommitFailedException,
    ConfigurationError,
    ErrorCategory,
    FailureType,
    FatalError,
    IllegalStateError,
    KafkaTxnError,
    ProduceFailedException,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionOutcomeUnknownError,
)
from .futures import DeliveryFuture
from .producer import DeliveryCallback, Serializer, TransactionalProducer

__version__ = "0.1.0"

__all__ = [
    "ERROR_TABLE",
    "CommitFailedException",
    "ConfigurationError",
    "DeliveryCallback",
    "DeliveryFuture",
    "ErrorCategory",
    "ErrorRule",
    "FailureType",
    "FatalError",
    "IllegalStateError",
    "KafkaTxnError",
    "ProduceFailedException",
    "ProducerFencedError",
    "ProducerSettings",
    "Serializer",
    "TransactionAbortableError",
    "TransactionOutcomeUnknownError",
    "TransactionalProducer",
    "__version__",
    "classify",
]
