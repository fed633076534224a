"""kafka-txn: Kafka transactions that are safe to use from Python.

A facade over confluent-kafka's transactional producer with the KIP-691 error model:
fatal errors close the producer, abortable errors abort the transaction,
``commit_transaction()`` raises ``CommitFailedException`` for every non-fatal failure,
and every record failure carries a ``FailureType``.
"""

import importlib

from . import _logging  # noqa: F401 - a NullHandler: silent unless logging is configured
from .classification import ERROR_TABLE, ErrorRule, classify
from .config import ProducerSettings
from .errors import (
    CommitFailedException,
    ConfigurationError,
    DatabaseCommitUnknownError,
    ErrorCategory,
    FailureType,
    FatalError,
    IllegalStateError,
    InvalidPreparedStateError,
    KafkaTxnError,
    ProduceFailedException,
    ProducerFencedError,
    ReplayMismatchError,
    SinkOwnershipError,
    TransactionAbortableError,
    TransactionDivergedError,
    TransactionInDoubtError,
    TransactionOutcomeUnknowableError,
    TransactionOutcomeUnknownError,
    UnsupportedBrokerError,
)
from .futures import DeliveryFuture
from .producer import DeliveryCallback, Serializer, TransactionalProducer
from .recovery import TransactionOutcome
from .state import PreparedTxnState

__version__ = "0.1.0"

_OPTIONAL = {
    "DualWriter": ("kafka_txn.dualwrite", "sql"),
    "DualWriteTransaction": ("kafka_txn.dualwrite", "sql"),
    "jdbc_to_sqlalchemy": ("kafka_txn.jdbc", "sql"),
    "KafkaJdbcSink": ("kafka_txn.spark", "spark"),
}


def __getattr__(name: str) -> object:
    """Names whose modules need an optional extra, imported on first use."""
    if name not in _OPTIONAL:
        raise AttributeError(f"module 'kafka_txn' has no attribute {name!r}")
    module, extra = _OPTIONAL[name]
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"kafka_txn.{name} needs an optional dependency ({exc.name}): "
            f"pip install 'kafka-txn[{extra}]'"
        ) from exc
    return getattr(imported, name)


__all__ = [
    "ERROR_TABLE",
    "CommitFailedException",
    "ConfigurationError",
    "DatabaseCommitUnknownError",
    "DeliveryCallback",
    "DeliveryFuture",
    "DualWriteTransaction",
    "DualWriter",
    "ErrorCategory",
    "ErrorRule",
    "FailureType",
    "FatalError",
    "IllegalStateError",
    "InvalidPreparedStateError",
    "KafkaJdbcSink",
    "KafkaTxnError",
    "PreparedTxnState",
    "ProduceFailedException",
    "ProducerFencedError",
    "ProducerSettings",
    "ReplayMismatchError",
    "Serializer",
    "SinkOwnershipError",
    "TransactionAbortableError",
    "TransactionDivergedError",
    "TransactionInDoubtError",
    "TransactionOutcome",
    "TransactionOutcomeUnknowableError",
    "TransactionOutcomeUnknownError",
    "TransactionalProducer",
    "UnsupportedBrokerError",
    "__version__",
    "classify",
    "jdbc_to_sqlalchemy",
]
