"""Exceptions raised by kafka-txn.

Every exception is a ``confluent_kafka.KafkaException``, so handlers written for
confluent-kafka still catch them, and ``exc.args[0]`` is the root ``KafkaError`` as it is
for confluent-kafka's own exceptions::

    KafkaException                      (confluent_kafka)
     └── KafkaTxnError                  base of everything raised here
          ├── FatalError                the producer is unusable: close it
          │    └── ProducerFencedError  epoch bumped: a newer producer owns the
          │                             transactional.id, or a timeout abort
          ├── TransactionAbortableError abort the transaction; the producer stays usable
          │    └── CommitFailedException commit_transaction() failed without a fatal cause
          ├── ProduceFailedException    one record failed; .failure_type says how (also
          │                             a TypeError for a key or value of the wrong type)
          ├── TransactionOutcomeUnknownError
          │                             commit/abort ran out of time; the outcome is unknown
          ├── BrokerUnreachableError    no bootstrap server could be reached: nothing was
          │                             sent; the same call may be made again
          ├── TransactionInDoubtError   the commit of a PREPARED transaction did not
          │                             complete: never aborted, recovery settles it
          ├── TransactionDivergedError  recovery: Kafka provably lost what the database
          │                             committed (timed out, fenced, aborted)
          ├── TransactionOutcomeUnknowableError
          │                             recovery: Kafka forgot the transaction (expired
          │                             id, history gone); whether it committed is unknown
          ├── UnsupportedBrokerError    the broker lacks an API two-phase commit needs
          ├── DatabaseCommitUnknownError
          │                             dual write: the database COMMIT's outcome is unknown
          ├── DatabaseUnavailableError  dual write, Spark sink: the database cannot be
          │                             reached or refuses the login; names the fix
          ├── SinkOwnershipError        Spark sink: another query owns the transactional-id
          │                             prefix (or a fresh checkpoint reuses it)
          ├── ReplayMismatchError       Spark sink: a replayed batch's partitioning differs
          │                             from what its committed partitions wrote
          ├── IllegalStateError         API misuse: wrong call for the producer's state
          ├── ConfigurationError        bad settings (also a ValueError)
          └── InvalidPreparedStateError a stored PreparedTxnState that is malformed or
                                        belongs elsewhere (also a ValueError)

Wrapping rule (KIP-691 "wrap at most once"): every exception carries the root
``KafkaError`` as ``.kafka_error`` and ``args[0]``. Its ``__cause__`` is the single
exception that brought that root into this library: the ``KafkaException`` confluent-kafka
raised, or, when a transaction fails because a record failed, that record's
``ProduceFailedException``, which itself has no cause. A chain is never longer than one.

All exceptions pickle (Spark ships them from executors to the driver); ``__cause__`` is
not part of a pickle, the root ``KafkaError`` and every attribute are.

Every exception also answers ``KafkaError``'s methods, so that a delivery callback
written for confluent-kafka works unchanged on the ``ProduceFailedException`` it is
given: ``code()`` and ``name()`` are the root's, ``str()`` is the message, and
``fatal()``, ``txn_requires_abort()`` and ``retriable()`` say whether the category is
fatal, abortable or retriable. ``code`` uncalled is the same int (``ErrorCode``), and so
is ``error_code``.
``TransactionInDoubtError.retriable`` stays a bool attribute.
"""

from __future__ import annotations

import builtins
import enum
from typing import Any

from confluent_kafka import KafkaError, KafkaException

__all__ = [
    "BrokerUnreachableError",
    "CommitFailedException",
    "ConfigurationError",
    "DatabaseCommitUnknownError",
    "DatabaseUnavailableError",
    "ErrorCategory",
    "FailureType",
    "FatalError",
    "IllegalStateError",
    "InvalidPreparedStateError",
    "KafkaTxnError",
    "ProduceFailedException",
    "ProducerFencedError",
    "ReplayMismatchError",
    "SinkOwnershipError",
    "TransactionAbortableError",
    "TransactionDivergedError",
    "TransactionInDoubtError",
    "TransactionOutcomeUnknowableError",
    "TransactionOutcomeUnknownError",
    "UnsupportedBrokerError",
]


class ErrorCategory(str, enum.Enum):
    """What the application must do about an error (KIP-691)."""

    FATAL = "fatal"
    """The producer cannot continue: close it (and its consumer) and start a new one."""
    ABORTABLE = "abortable"
    """The current transaction cannot commit: abort it; the producer stays usable."""
    RETRIABLE = "retriable"
    """Transient: retried by librdkafka or this library until a deadline runs out."""


class FailureType(str, enum.Enum):
    """Why one record failed (KIP-691 ``ProduceFailedException.FailureType``)."""

    MESSAGE_REJECTED = "message_rejected"
    """This record is bad (too large, invalid, bad timestamp, not serializable)."""
    DELIVERY_FAILED = "delivery_failed"
    """The record could not be delivered now (timeouts, replicas, leader moves, or an
    innocent record of a batch rejected for another record, KIP-467)."""
    TRANSACTION_FAILED = "transaction_failed"
    """The transaction failed around the record (fenced, invalid state, purged by abort)."""


class ErrorCode(int):
    """An error code that is also callable: ``exc.code`` and ``exc.code()`` are the same
    int, so code written against confluent-kafka's ``KafkaError.code()`` and code that
    reads the attribute both work."""

    __slots__ = ()

    def __call__(self) -> int:
        return int(self)

    def __repr__(self) -> builtins.str:
        return int.__repr__(self)


class KafkaTxnError(KafkaException):
    """Base class of every exception raised by kafka-txn. It answers confluent-kafka's
    ``KafkaError`` methods (``code()``, ``name()``, ``str()``, ``fatal()``,
    ``retriable()``, ``txn_requires_abort()``), so that a delivery callback written for
    confluent-kafka works unchanged on the ``ProduceFailedException`` it is given.
    ``code`` is the root cause's error code, an int that may also be called
    (``exc.code == exc.code() == exc.error_code``; see docs/reference/errors.md)."""

    category: ErrorCategory | None = None

    def __init__(self, message: str, *, kafka_error: KafkaError | None = None) -> None:
        root = kafka_error if kafka_error is not None else self._default_root(message)
        super().__init__(root)
        self.message = message
        self.kafka_error: KafkaError = root

    @staticmethod
    def _default_root(message: str) -> KafkaError:
        return KafkaError(KafkaError._FAIL, message)

    # confluent-kafka's KafkaError methods, so that code written for confluent-kafka's
    # delivery reports (``err.code()``, ``err.retriable()``...) works unchanged on the
    # ProduceFailedException a callback receives, and on every other error here.
    @property
    def code(self) -> ErrorCode:
        """The librdkafka/Kafka error code of the root cause: an int that may also be
        called, ``code()``, as on ``KafkaError`` (``exc.code == KafkaError.X`` and
        ``exc.code() == KafkaError.X`` both hold)."""
        return ErrorCode(self.kafka_error.code())

    @property
    def error_code(self) -> int:
        """The same error code as ``code()``, as an attribute."""
        return int(self.kafka_error.code())

    def name(self) -> str:
        """The root cause's error name, as ``KafkaError.name()`` (``MSG_SIZE_TOO_LARGE``)."""
        return str(self.kafka_error.name())

    def fatal(self) -> bool:
        """True when the producer cannot continue (KIP-691 fatal: close it), as
        ``KafkaError.fatal()``; the category this library acts on, which may be stricter
        than librdkafka's own flag (``kafka_error.fatal()``)."""
        return self.category is ErrorCategory.FATAL

    def retriable(self) -> bool:
        """True when the same call may simply be made again (KIP-691 retriable), as
        ``KafkaError.retriable()``. A failed record is never retriable in its
        transaction: the transaction has to be aborted (``txn_requires_abort()``)."""
        return self.category is ErrorCategory.RETRIABLE

    def txn_requires_abort(self) -> bool:
        """True when the transaction cannot commit and must be aborted, the producer
        staying usable (KIP-691 abortable), as ``KafkaError.txn_requires_abort()``."""
        return self.category is ErrorCategory.ABORTABLE

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.kafka_error.name()})"

    def _kwargs(self) -> dict[str, Any]:
        return {"kafka_error": self.kafka_error}

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only context does not survive BaseException's default pickling.
        return (_rebuild, (type(self), self.message, self._kwargs()))

    # Last in the class body: below it, a plain ``str`` annotation would name this method.
    def str(self) -> builtins.str:
        """The message, as ``KafkaError.str()``: the same text as ``str(exc)``, which
        includes the root cause's own description."""
        return self.message


def root_exception(exc: KafkaTxnError) -> BaseException:
    """The exception holding ``exc``'s root cause, for a new error to chain from: the
    wrapping rule's "never a chain of two". A failed record is its own root."""
    if isinstance(exc, ProduceFailedException) or exc.__cause__ is None:
        return exc
    return exc.__cause__


def _rebuild(cls: type[KafkaTxnError], message: str, kwargs: dict[str, Any]) -> KafkaTxnError:
    return cls(message, **kwargs)


class FatalError(KafkaTxnError):
    """Raised when the producer can no longer be used: fenced, not authorized, unsupported
    broker, invalid transaction state. Every later call raises the same error until
    ``close()``; close the producer and its consumer, then start over."""

    category = ErrorCategory.FATAL


class ProducerFencedError(FatalError):
    """Raised when the coordinator bumped this producer's epoch: another producer
    initialised the same ``transactional.id`` (this instance is a zombie and must stop),
    or the coordinator aborted the open transaction because it outlived
    ``transaction.timeout.ms`` (a broker outage: Apache Kafka answers the producer's next
    EndTxn PRODUCER_FENCED). Either way the producer is unusable: close it and create a
    new one, making sure no other instance uses the id."""


class TransactionAbortableError(KafkaTxnError):
    """Raised when the current transaction cannot commit. Call ``abort_transaction()``,
    rewind inputs to the last committed position, and begin a new transaction."""

    category = ErrorCategory.ABORTABLE


class CommitFailedException(TransactionAbortableError):
    """Raised by ``commit_transaction()`` for every non-fatal failure (KIP-691). Nothing
    of the transaction is visible to read_committed consumers; abort and retry."""


class ProduceFailedException(KafkaTxnError):
    """Raised, or handed to a delivery callback or future, when one record fails.

    ``failure_type`` tells whether the record itself was bad, could not be delivered, or
    fell with its transaction. The transaction it belongs to cannot commit.
    """

    def __init__(
        self,
        message: str,
        *,
        kafka_error: KafkaError | None = None,
        failure_type: FailureType,
        category: ErrorCategory = ErrorCategory.ABORTABLE,
        topic: str | None = None,
        partition: int | None = None,
        key: bytes | str | None = None,
    ) -> None:
        super().__init__(message, kafka_error=kafka_error)
        self.failure_type = failure_type
        self.category = category
        self.topic = topic
        self.partition = partition
        self.key = key

    def _kwargs(self) -> dict[str, Any]:
        return {
            **super()._kwargs(),
            "failure_type": self.failure_type,
            "category": self.category,
            "topic": self.topic,
            "partition": self.partition,
            "key": self.key,
        }


class _RecordTypeError(ProduceFailedException, TypeError):
    """The ``ProduceFailedException`` that ``produce()``/``send()`` raise for a key or value
    of a type that cannot be sent (not ``bytes``/``str``/``None`` without a serializer):
    ``MESSAGE_REJECTED`` like every record refused before it was queued, so that a handler
    of ``ProduceFailedException`` meets it, and a ``TypeError``, as Python's convention for
    an argument of the wrong type asks."""


class TransactionOutcomeUnknownError(KafkaTxnError):
    """Raised when ``commit_transaction()`` or ``abort_transaction()`` kept failing with
    retriable errors until its deadline. The broker may already have written the decision,
    so do NOT abort after a commit that raised this: call the same method again to learn
    the outcome, or close the producer (the next ``init_transactions()`` for the
    transactional.id completes or aborts it) and treat the inputs as possibly processed."""

    category = ErrorCategory.RETRIABLE

    def __init__(
        self, message: str, *, kafka_error: KafkaError | None = None, operation: str
    ) -> None:
        super().__init__(message, kafka_error=kafka_error)
        self.operation = operation

    def _kwargs(self) -> dict[str, Any]:
        return {**super()._kwargs(), "operation": self.operation}


class BrokerUnreachableError(KafkaTxnError):
    """Raised by ``init_transactions()`` (and the calls that run it: ``DualWriter.start()``,
    the Spark sink, ``ExactlyOnceProcessor``) when no bootstrap server could be reached at
    all: every connection refused, a host that does not resolve, every broker down, and
    librdkafka never connected. Nothing was sent, so no coordinator acted on this call:
    unlike ``TransactionOutcomeUnknownError`` there is no outcome to learn. The message
    names each address and its cause; ``servers`` is ``bootstrap.servers`` and ``causes``
    one ``"address: cause"`` line per server. Start the broker or fix
    ``bootstrap.servers``, then make the same call again."""

    category = ErrorCategory.RETRIABLE

    def __init__(
        self,
        message: str,
        *,
        kafka_error: KafkaError | None = None,
        servers: str = "",
        causes: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, kafka_error=kafka_error)
        self.servers = servers
        self.causes = tuple(causes)

    @staticmethod
    def _default_root(message: str) -> KafkaError:
        return KafkaError(KafkaError._ALL_BROKERS_DOWN, message)

    def _kwargs(self) -> dict[str, Any]:
        return {**super()._kwargs(), "servers": self.servers, "causes": self.causes}


class TransactionInDoubtError(KafkaTxnError):
    """Raised when committing a PREPARED transaction failed after the external decider
    (the database) may already have decided "commit". The producer never aborts such a
    transaction: ``abort_transaction()`` is refused and ``close()`` leaves it open.
    ``retriable`` says whether ``commit_transaction()`` may simply be called again;
    otherwise close the producer and recover from the stored state with a fresh one
    (``init_transactions(keep_prepared_txn=True)`` + ``complete_transaction(stored)``,
    or ``DualWriter.start()``), which commits it, or reports that Kafka lost it."""

    category = ErrorCategory.FATAL

    # An attribute here, not KafkaError's method: it was documented as one before the
    # methods came, and an in-doubt error is raised by commit, never given to a callback.
    retriable: bool  # type: ignore[assignment]
    """Whether ``commit_transaction()`` may simply be called again."""

    def __init__(
        self,
        message: str,
        *,
        kafka_error: KafkaError | None = None,
        prepared_state: str = "",
        retriable: bool = False,
    ) -> None:
        super().__init__(message, kafka_error=kafka_error)
        self.prepared_state = prepared_state
        self.retriable = retriable

    def _kwargs(self) -> dict[str, Any]:
        return {
            **super()._kwargs(),
            "prepared_state": self.prepared_state,
            "retriable": self.retriable,
        }


class IllegalStateError(KafkaTxnError):
    """Raised for API misuse: a call that the producer's current state does not allow
    (send outside a transaction, begin twice, any call after ``close()``)."""

    @staticmethod
    def _default_root(message: str) -> KafkaError:
        return KafkaError(KafkaError._STATE, message)


class ConfigurationError(KafkaTxnError, ValueError):
    """Raised at construction for settings that cannot work; the message names the key
    and the fix. Nothing has been sent when this is raised."""

    @staticmethod
    def _default_root(message: str) -> KafkaError:
        return KafkaError(KafkaError._INVALID_ARG, message)


class _RecoveryReport(KafkaTxnError):
    """Base of the errors recovery raises about a stored state it cannot commit: they
    carry what an operator needs (the transactional id, the stored state, and what the
    coordinator reported) as attributes, and pickle with them."""

    category = ErrorCategory.FATAL

    def __init__(
        self,
        message: str,
        *,
        kafka_error: KafkaError | None = None,
        transactional_id: str,
        stored_state: str,
        observed: dict[str, Any],
    ) -> None:
        super().__init__(message, kafka_error=kafka_error)
        self.transactional_id = transactional_id
        self.stored_state = stored_state
        self.observed = observed

    def _kwargs(self) -> dict[str, Any]:
        return {
            **super()._kwargs(),
            "transactional_id": self.transactional_id,
            "stored_state": self.stored_state,
            "observed": self.observed,
        }


class TransactionDivergedError(_RecoveryReport):
    """Raised by recovery when the coordinator shows that a prepared transaction the
    database committed was aborted: it timed out (``transaction.timeout.ms``) or a newer
    producer fenced it. Nothing was committed and nothing of it is visible in Kafka, so
    its records can be re-sent from the database without creating duplicates."""

    @staticmethod
    def _default_root(message: str) -> KafkaError:
        return KafkaError(KafkaError.INVALID_TXN_STATE, message)


class TransactionOutcomeUnknowableError(_RecoveryReport):
    """Raised by recovery when Kafka no longer knows the stored transaction: the
    transactional id expired (``transactional.id.expiration.ms``, DescribeTransactions
    answers TRANSACTIONAL_ID_NOT_FOUND), another producer id took it over, or its
    epoch moved on in a way that erased the history. Whether the transaction committed
    cannot be learnt from Kafka. Nothing was sent. Do not re-send blindly (that may
    duplicate) and do not drop it (that may lose): compare the database rows of that
    transaction with the topic (a read_committed consumer), then store the state
    ``mark_completed()`` to resume."""

    @staticmethod
    def _default_root(message: str) -> KafkaError:
        return KafkaError(KafkaError.INVALID_TXN_STATE, message)


class UnsupportedBrokerError(KafkaTxnError):
    """Raised when two-phase commit needs an API the broker does not offer (for example
    DescribeTransactions, Kafka >= 3.0). Ordinary transactions still work."""

    @staticmethod
    def _default_root(message: str) -> KafkaError:
        return KafkaError(KafkaError.UNSUPPORTED_VERSION, message)


class InvalidPreparedStateError(KafkaTxnError, ValueError):
    """Raised for a serialized ``PreparedTxnState`` that cannot be read (the message says
    what is wrong) or that belongs to another transactional id or cluster."""

    @staticmethod
    def _default_root(message: str) -> KafkaError:
        return KafkaError(KafkaError._INVALID_ARG, message)


class DatabaseCommitUnknownError(KafkaTxnError):
    """Raised by a dual write when the database COMMIT failed in a way that leaves its
    outcome unknown (the connection dropped during it). Kafka is not aborted: the
    transaction stays prepared and the writer stops. Restart it: its ``start()`` reads the
    database and commits or aborts Kafka to match."""


class DatabaseUnavailableError(KafkaTxnError):
    """Raised by ``DualWriter`` (``start()``, ``transaction()``) and the Spark sink when
    the database cannot be opened: the server refuses the connection or does not
    resolve, the password or user is wrong, the database does not exist, a SQLite file
    cannot be opened, or the driver is not installed. Nothing was written. The message
    names the fix; ``url`` is the database's URL with its password redacted, and the
    driver's exception is the ``__cause__``. Errors during a transaction are not this:
    they keep their own classes (``DatabaseCommitUnknownError``...)."""

    def __init__(
        self, message: str, *, kafka_error: KafkaError | None = None, url: str = ""
    ) -> None:
        super().__init__(message, kafka_error=kafka_error)
        self.url = url

    def _kwargs(self) -> dict[str, Any]:
        return {**super()._kwargs(), "url": self.url}


class SinkOwnershipError(KafkaTxnError):
    """Raised by the Spark sink on the driver, before a batch writes anything, when its
    transactional-id prefix belongs to another streaming query: a second query on the
    prefix, one sink object used by two streams, or a restart from a fresh checkpoint
    (batch ids start again at 0 and would find the old query's commit markers). The
    message names both queries; ``start_over=True`` takes the prefix over on purpose."""


class ReplayMismatchError(KafkaTxnError):
    """Raised by the Spark sink on the driver, before a batch writes anything, when a
    replayed batch has another partition count than when it was first written and some
    of its partitions already committed: the replay cannot match their commit markers,
    so rows would be lost or written twice. The message names the batch and both counts."""
