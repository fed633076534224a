"""The kafka-txn errors two-phase commit makes of what fails outside librdkafka: one place
for each, so prepare, recovery and the kept-transaction commit say the same thing.

- ``coordinator_failure``: the one translation of a coordinator-client failure that
  survived its retries (``twophase.coordinator_calls``). It is built on
  ``kafka_txn.classification``'s table, so a code the table calls fatal is fatal whichever
  client met it; what it adds is not librdkafka's (whether the caller was preparing or
  recovering, and the coordinator client's own failures: a peer that is not Kafka, a
  refused login), which is why it is not a row of that table.
- ``prepare_failed``: a prepare that cannot go on; the transaction is then abortable and
  the producer must abort it (a failed prepare hands out no state).
- ``not_this_producer``: the coordinator's DescribeTransactions does not show the
  transaction under this producer's id and epoch.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

from kafka_txn.classification import exception_for
from kafka_txn.coordinator import CoordinatorError
from kafka_txn.coordinator.client import TransactionDescription
from kafka_txn.coordinator.errors import (
    AuthenticationError,
    NotKafkaError,
    ProtocolError,
    SaslAuthenticationError,
)
from kafka_txn.errors import (
    ConfigurationError,
    FatalError,
    KafkaTxnError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionOutcomeUnknownError,
    root_exception,
)

__all__ = ["coordinator_failure", "not_this_producer", "prepare_failed"]


def coordinator_failure(
    exc: Exception, operation: str, *, recovering: bool, deadline_s: float
) -> KafkaTxnError:
    """The kafka-txn error for a coordinator-client failure that survived its retries.

    Built on the classification table, like every librdkafka error: a code the table
    calls fatal (fencing, TRANSACTIONAL_ID_AUTHORIZATION_FAILED...) is a ``FatalError``
    whichever client met it. Otherwise, while preparing, the transaction cannot be
    prepared (abortable); while recovering, a coordinator that stayed unreachable leaves
    the outcome unknown (call again), a peer that is not Kafka is a ConfigurationError,
    and anything else stops recovery (fatal). A refused SASL login is librdkafka's
    ``_AUTHENTICATION``, with the table's advice naming the ``sasl.*`` settings, as when
    librdkafka's error_cb reports it (``twophase.cluster.ClusterId``)."""
    if isinstance(exc, KafkaTxnError):
        return exc
    if isinstance(exc, SaslAuthenticationError):
        reason = f"the coordinator client could not authenticate: {exc}"
        return exception_for(KafkaError(KafkaError._AUTHENTICATION, reason), operation)
    if isinstance(exc, AuthenticationError):
        err = KafkaError(KafkaError._AUTHENTICATION, str(exc))
        return FatalError(
            f"{operation}: the coordinator client could not authenticate: {exc}; check the "
            "sasl.*/ssl.* settings",
            kafka_error=err,
        )
    if isinstance(exc, CoordinatorError):
        err = exc.kafka_error
        if exc.code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            # Name the refused request: EndTxn checks WRITE on the id, FindCoordinator
            # and DescribeTransactions DESCRIBE (which Apache Kafka's WRITE implies).
            return FatalError(
                f"{operation}: not authorized on the transactional id ({exc.operation} "
                "refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED): grant WRITE and "
                "DESCRIBE on it to this principal",
                kafka_error=err,
            )
        mapped = exception_for(err, operation)
        if isinstance(mapped, FatalError):
            return mapped
        if not recovering:
            return TransactionAbortableError(
                f"{operation}: the coordinator refused: {exc}; abort the transaction",
                kafka_error=err,
            )
        if exc.retriable:
            return _unknown(operation, exc, deadline_s)
        return FatalError(f"{operation}: {exc}", kafka_error=err)
    if isinstance(exc, NotKafkaError) and recovering:
        # Not a coordinator that may come back: the address or security.protocol is wrong.
        return ConfigurationError(f"{operation}: {exc}")
    if isinstance(exc, ProtocolError):
        if not recovering:
            return TransactionAbortableError(
                f"{operation}: could not reach the transaction coordinator: {exc}; "
                "abort the transaction",
                kafka_error=KafkaError(KafkaError._TRANSPORT),
            )
        return _unknown(operation, exc, deadline_s)
    raise TypeError(f"not a coordinator failure: {exc!r}")  # pragma: no cover


def _unknown(operation: str, exc: Exception, deadline_s: float) -> TransactionOutcomeUnknownError:
    return TransactionOutcomeUnknownError(
        f"{operation}: the transaction coordinator stayed unreachable for {deadline_s:g}s "
        f"({exc}), so its outcome is not known yet: call it again, which is safe (a "
        "repeated recovery finds whatever an earlier attempt did)",
        kafka_error=KafkaError(KafkaError._TIMED_OUT),
        operation=operation,
    )


def prepare_failed(reason: str, cause: KafkaTxnError | None = None) -> TransactionAbortableError:
    """The error of a prepare that cannot go on; the producer must then abort."""
    exc = TransactionAbortableError(
        f"prepare_transaction() failed: {reason}; abort the transaction",
        kafka_error=None if cause is None else cause.kafka_error,
    )
    if cause is not None:
        exc.__cause__ = root_exception(cause)
    return exc


def not_this_producer(tid: str, seen: TransactionDescription, pid: int, epoch: int) -> FatalError:
    """Prepare's error when the coordinator does not show the transaction under this
    producer's id and epoch, worded for what the answer tells apart: an id the
    coordinator does not know (never seen, expired, or lost by a broker that does not
    keep its transaction log across a restart), an epoch bumped under this producer id
    (a newer instance's init, or the coordinator's abort of a transaction past
    ``transaction.timeout.ms``), another producer id (another instance initialised the
    id), or an epoch older than this producer's (the coordinator's state went back)."""
    holds = f"producer id {seen.producer_id} epoch {seen.producer_epoch}"
    this = f"this producer is {pid}/{epoch}"
    advice = (
        "Nothing of this transaction can commit. Close this producer and create a new one "
        "(its init_transactions() registers the id again)"
    )
    if not seen.found:
        return FatalError(
            f"prepare_transaction(): the coordinator does not know transactional id {tid!r} "
            f"({this}): it never registered it, or forgot it (the id expired after "
            "transactional.id.expiration.ms, or the broker does not keep its transaction "
            f"state across a restart, as noida-db does not). {advice}",
            kafka_error=KafkaError(KafkaError.INVALID_PRODUCER_ID_MAPPING),
        )
    if seen.producer_id == pid and seen.producer_epoch < epoch:
        return FatalError(
            f"prepare_transaction(): the coordinator holds {holds} for {tid!r}, an older "
            f"epoch than this producer's ({this}): its transaction state went back (a "
            f"broker that lost acknowledged transaction-log writes). {advice}",
            kafka_error=KafkaError(KafkaError.INVALID_PRODUCER_EPOCH),
        )
    if seen.producer_id == pid:
        why = (
            "its epoch was bumped: another producer initialised the same transactional "
            "id, or the coordinator aborted this transaction because it outlived "
            "transaction.timeout.ms"
        )
    else:
        why = "another producer initialised the same transactional id since"
    return ProducerFencedError(
        f"prepare_transaction(): the coordinator holds {holds} for {tid!r}, {this}: {why}. "
        f"{advice}, and make sure no other instance uses this transactional id",
        kafka_error=KafkaError(KafkaError.PRODUCER_FENCED),
    )
