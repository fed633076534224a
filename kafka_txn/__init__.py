"""kafka-txn: Kafka transactions that are safe to use from Python.

A facade over confluent-kafka's transactional producer with the KIP-691 error model:
fatal errors close the producer, abortable errors abort the transaction,
``commit_transaction()`` raises ``CommitFailedException`` for every non-fatal failure,
and every record failure carries a ``FailureType``. Names that need an optional extra
(``DualWriter``, ``DualWriteTransaction`` and ``jdbc_to_sqlalchemy``: ``[sql]``;
``AsyncDualWriter`` and ``AsyncDualWriteTransaction``: ``[asyncio]``; ``KafkaJdbcSink``:
``[spark]``) are imported on first use; without their extra, using
one raises an ImportError naming the ``pip install`` command, and ``from kafka_txn
import *`` leaves them out.
"""

import importlib
from typing import TYPE_CHECKING

from kafka_txn._extras import installed, missing_extra
from kafka_txn.aio.producer import AsyncTransactionalProducer
from kafka_txn.classification import ERROR_TABLE, ErrorRule, classify
from kafka_txn.config import ProducerSettings
from kafka_txn.errors import (
    BrokerUnreachableError,
    CommitFailedException,
    ConfigurationError,
    DatabaseCommitUnknownError,
    DatabaseUnavailableError,
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
from kafka_txn.producer.futures import DeliveryFuture
from kafka_txn.producer.transactional import DeliveryCallback, Serializer, TransactionalProducer
from kafka_txn.state import PreparedTxnState
from kafka_txn.twophase.recovery import TransactionOutcome

from . import _logging  # noqa: F401 - a NullHandler: silent unless logging is configured

__version__ = "0.1.0"

if TYPE_CHECKING:  # the real types for type checkers; at run time, __getattr__ below
    from kafka_txn.aio.dualwrite import AsyncDualWriter, AsyncDualWriteTransaction
    from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
    from kafka_txn.dualwrite.writer import DualWriter, DualWriteTransaction
    from kafka_txn.spark.sink import KafkaJdbcSink

_OPTIONAL = {
    "AsyncDualWriter": ("kafka_txn.aio.dualwrite", "asyncio"),
    "AsyncDualWriteTransaction": ("kafka_txn.aio.dualwrite", "asyncio"),
    "DualWriter": ("kafka_txn.dualwrite", "sql"),
    "DualWriteTransaction": ("kafka_txn.dualwrite", "sql"),
    "jdbc_to_sqlalchemy": ("kafka_txn.dualwrite.jdbc", "sql"),
    "KafkaJdbcSink": ("kafka_txn.spark", "spark"),
}
"""Public names whose module needs an optional extra: (module, extra)."""


if not TYPE_CHECKING:  # hidden from type checkers: they would type any name as object

    def __getattr__(name: str) -> object:
        """Names whose modules need an optional extra, imported on first use."""
        if name not in _OPTIONAL:
            raise AttributeError(f"module 'kafka_txn' has no attribute {name!r}")
        module, extra = _OPTIONAL[name]
        try:
            imported = importlib.import_module(module)
        except ImportError as exc:
            if f"pip install 'kafka-txn[{extra}]'" in str(exc):
                raise  # the module named the extra already
            raise missing_extra(f"kafka_txn.{name}", extra, exc) from exc
        return getattr(imported, name)


__all__ = [
    "ERROR_TABLE",
    "AsyncDualWriteTransaction",
    "AsyncDualWriter",
    "AsyncTransactionalProducer",
    "BrokerUnreachableError",
    "CommitFailedException",
    "ConfigurationError",
    "DatabaseCommitUnknownError",
    "DatabaseUnavailableError",
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

if not TYPE_CHECKING:
    # A star import takes every name of __all__: leave out the names whose extra is not
    # installed, so that `from kafka_txn import *` works without extras (each of those
    # names still raises an ImportError naming its extra when used explicitly).
    __all__ = [n for n in __all__ if n not in _OPTIONAL or installed(_OPTIONAL[n][1])]
