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
    InvalidPreparedStateError,
    KafkaTxnError,
    ProduceFailedException,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionDivergedError,
    TransactionOutcomeUnknownError,
    UnsupportedBrokerError,
)
from .futures import DeliveryFuture
from .producer import DeliveryCallback, Serializer, TransactionalProducer
from .recovery import TransactionOutcome
from .state import PreparedTxnState

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
    "InvalidPreparedStateError",
    "KafkaTxnError",
    "PreparedTxnState",
    "ProduceFailedException",
    "ProducerFencedError",
    "ProducerSettings",
    "Serializer",
    "TransactionAbortableError",
    "TransactionDivergedError",
    "TransactionOutcome",
    "TransactionOutcomeUnknownError",
    "TransactionalProducer",
    "UnsupportedBrokerError",
    "__version__",
    "classify",
]
