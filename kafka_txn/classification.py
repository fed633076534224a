"""The one table that maps every librdkafka/Kafka error code to what a transactional
producer must do about it, and the function that applies it.

``classify(err)`` reads librdkafka's own flags first, as librdkafka knows the context an
error arose in: ``fatal()`` -> FATAL, ``txn_requires_abort()`` -> ABORTABLE,
``retriable()`` -> RETRIABLE. The table decides the rest, and it escalates the codes that
KIP-691 rules fatal even where librdkafka only asks for an abort: TopicAuthorization,
GroupAuthorization, FencedInstanceId and the codes Java turns into CommitFailedException
(UnknownMemberId, IllegalGeneration, and KIP-848's StaleMemberEpoch and FencedMemberEpoch).
A librdkafka ``fatal()`` is never downgraded.

The FailureType column says what a record that failed with the code is told.
docs/reference/errors.md is generated from this table (``python -m kafka_txn._docs``); a
test fails when the two drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from confluent_kafka import KafkaError

from kafka_txn.errors import (
    CommitFailedException,
    ErrorCategory,
    FailureType,
    FatalError,
    KafkaTxnError,
    ProduceFailedException,
    ProducerFencedError,
    TransactionAbortableError,
)

__all__ = [
    "AUTHENTICATION_CODES",
    "ERROR_TABLE",
    "ErrorRule",
    "classify",
    "exception_for",
    "produce_failure",
    "render_markdown",
    "rule_for",
]

F: Final = ErrorCategory.FATAL
A: Final = ErrorCategory.ABORTABLE
R: Final = ErrorCategory.RETRIABLE
REJ: Final = FailureType.MESSAGE_REJECTED
DEL: Final = FailureType.DELIVERY_FAILED
TXN: Final = FailureType.TRANSACTION_FAILED


@dataclass(frozen=True, slots=True)
class ErrorRule:
    """One row: a code, the category the table gives it, and the record FailureType."""

    code: int
    name: str
    category: ErrorCategory
    failure_type: FailureType
    kip691_fatal: bool = False
    """True where KIP-691 rules the code fatal over librdkafka's abortable flag."""
    note: str = ""


# (librdkafka name, category, failure type, note). Names are resolved against
# confluent_kafka.KafkaError at import time, so a typo cannot hide.
_ROWS: Final[tuple[tuple[str, ErrorCategory, FailureType, str], ...]] = (
    # --- librdkafka local errors -------------------------------------------------------
    ("_BAD_MSG", A, REJ, "record could not be encoded"),
    ("_BAD_COMPRESSION", A, REJ, "record could not be compressed"),
    ("_DESTROY", F, DEL, "producer handle is being destroyed"),
    ("_FAIL", R, DEL, "broker connection failed; librdkafka reconnects"),
    ("_TRANSPORT", R, DEL, "broker transport failure; librdkafka reconnects"),
    ("_CRIT_SYS_RESOURCE", F, DEL, "thread or memory could not be created"),
    ("_RESOLVE", R, DEL, "broker host name did not resolve"),
    ("_MSG_TIMED_OUT", A, DEL, "message.timeout.ms ran out before delivery"),
    ("_PARTITION_EOF", R, DEL, "consumer only"),
    ("_UNKNOWN_PARTITION", A, REJ, "the record names a partition the topic lacks"),
    ("_FS", F, DEL, "file system error"),
    ("_UNKNOWN_TOPIC", A, REJ, "the record names a topic the cluster lacks"),
    ("_ALL_BROKERS_DOWN", R, DEL, "no broker reachable; librdkafka keeps trying"),
    ("_INVALID_ARG", A, REJ, "an argument of the call is invalid"),
    ("_TIMED_OUT", R, DEL, "the call's timeout ran out; the operation may go on"),
    ("_QUEUE_FULL", R, DEL, "queue.buffering.max.messages reached; poll and retry"),
    ("_ISR_INSUFF", R, DEL, "too few in-sync replicas"),
    ("_NODE_UPDATE", R, DEL, "broker address changed"),
    ("_SSL", R, DEL, "TLS failure; librdkafka reconnects"),
    ("_WAIT_COORD", R, TXN, "waiting for the transaction coordinator"),
    ("_UNKNOWN_GROUP", A, TXN, "send_offsets_to_transaction named an unknown group"),
    ("_IN_PROGRESS", R, TXN, "operation still in progress"),
    ("_PREV_IN_PROGRESS", R, TXN, "a previous operation is still in progress"),
    ("_EXISTING_SUBSCRIPTION", F, TXN, "consumer only"),
    ("_ASSIGN_PARTITIONS", R, DEL, "consumer rebalance event, not an error"),
    ("_REVOKE_PARTITIONS", R, DEL, "consumer rebalance event, not an error"),
    ("_CONFLICT", F, TXN, "conflicting transactional API call in progress"),
    ("_STATE", A, TXN, "librdkafka refused the call in its transaction state (e.g. failed)"),
    ("_UNKNOWN_PROTOCOL", F, DEL, "unknown protocol"),
    ("_NOT_IMPLEMENTED", F, DEL, "not implemented by librdkafka"),
    ("_AUTHENTICATION", F, DEL, "authentication failed"),
    ("_NO_OFFSET", R, DEL, "consumer only"),
    ("_OUTDATED", R, DEL, "outdated"),
    ("_TIMED_OUT_QUEUE", A, DEL, "timed out in the local queue"),
    ("_UNSUPPORTED_FEATURE", F, TXN, "broker lacks transactions or idempotence"),
    ("_WAIT_CACHE", R, DEL, "waiting for metadata"),
    ("_INTR", R, DEL, "operation interrupted"),
    ("_KEY_SERIALIZATION", A, REJ, "key serializer failed"),
    ("_VALUE_SERIALIZATION", A, REJ, "value serializer failed"),
    ("_KEY_DESERIALIZATION", A, REJ, "consumer only"),
    ("_VALUE_DESERIALIZATION", A, REJ, "consumer only"),
    ("_PARTIAL", R, DEL, "partial response"),
    ("_READ_ONLY", F, DEL, "read-only object"),
    ("_NOENT", A, DEL, "no such entry"),
    ("_UNDERFLOW", A, REJ, "read underflow"),
    ("_INVALID_TYPE", A, REJ, "invalid type"),
    ("_RETRY", R, DEL, "retry operation"),
    ("_PURGE_QUEUE", A, TXN, "record purged from the queue: its transaction aborted"),
    ("_PURGE_INFLIGHT", A, TXN, "record purged in flight: its transaction aborted"),
    ("_FATAL", F, TXN, "librdkafka raised a fatal error; the cause is reported with it"),
    ("_INCONSISTENT", A, TXN, "records of the transaction failed delivery"),
    ("_GAPLESS_GUARANTEE", F, DEL, "ordering could not be kept"),
    ("_MAX_POLL_EXCEEDED", A, TXN, "consumer left its group (max.poll.interval.ms)"),
    ("_UNKNOWN_BROKER", R, DEL, "unknown broker"),
    ("_NOT_CONFIGURED", F, TXN, "transactional.id is not configured"),
    ("_FENCED", F, TXN, "epoch bumped: a newer instance, or the coordinator's timeout abort"),
    ("_APPLICATION", A, DEL, "application-generated error"),
    ("_ASSIGNMENT_LOST", A, TXN, "consumer lost its partitions"),
    ("_NOOP", R, DEL, "no operation performed"),
    ("_AUTO_OFFSET_RESET", A, DEL, "consumer only"),
    ("_LOG_TRUNCATION", A, DEL, "consumer only"),
    (
        "_INVALID_DIFFERENT_RECORD",
        A,
        DEL,
        "innocent record of a batch rejected for another (KIP-467)",
    ),
    ("_DESTROY_BROKER", R, DEL, "broker handle destroyed"),
    # --- broker errors -----------------------------------------------------------------
    ("UNKNOWN", F, DEL, "unexpected server error (KIP-691: unexpected is fatal)"),
    ("OFFSET_OUT_OF_RANGE", A, DEL, "consumer only"),
    ("INVALID_MSG", R, DEL, "CORRUPT_MESSAGE: a CRC mismatch in transit; retriable"),
    ("UNKNOWN_TOPIC_OR_PART", R, DEL, "topic or partition not (yet) known to the leader"),
    ("INVALID_MSG_SIZE", A, REJ, "invalid record size"),
    ("LEADER_NOT_AVAILABLE", R, DEL, "leader election in progress"),
    ("NOT_LEADER_FOR_PARTITION", R, DEL, "leader moved"),
    ("REQUEST_TIMED_OUT", R, DEL, "broker timed out the request"),
    ("BROKER_NOT_AVAILABLE", R, DEL, "broker not available"),
    ("REPLICA_NOT_AVAILABLE", R, DEL, "replica not available"),
    ("MSG_SIZE_TOO_LARGE", A, REJ, "record larger than message.max.bytes / max.message.bytes"),
    ("STALE_CTRL_EPOCH", R, DEL, "stale controller epoch"),
    ("OFFSET_METADATA_TOO_LARGE", A, TXN, "offset metadata too large in send_offsets"),
    ("NETWORK_EXCEPTION", R, DEL, "broker disconnected before answering"),
    ("COORDINATOR_LOAD_IN_PROGRESS", R, TXN, "coordinator loading its state"),
    ("COORDINATOR_NOT_AVAILABLE", R, TXN, "coordinator not available"),
    ("NOT_COORDINATOR", R, TXN, "coordinator moved"),
    ("TOPIC_EXCEPTION", A, REJ, "invalid topic name"),
    ("RECORD_LIST_TOO_LARGE", A, REJ, "batch larger than the segment size"),
    ("NOT_ENOUGH_REPLICAS", R, DEL, "fewer in-sync replicas than min.insync.replicas"),
    ("NOT_ENOUGH_REPLICAS_AFTER_APPEND", R, DEL, "written to fewer replicas than required"),
    ("INVALID_REQUIRED_ACKS", A, DEL, "invalid acks"),
    ("ILLEGAL_GENERATION", F, TXN, "KIP-691: CommitFailed (group generation moved) is fatal"),
    ("INCONSISTENT_GROUP_PROTOCOL", F, TXN, "consumer group protocol mismatch"),
    ("INVALID_GROUP_ID", F, TXN, "invalid group.id"),
    ("UNKNOWN_MEMBER_ID", F, TXN, "KIP-691: CommitFailed (member left the group) is fatal"),
    ("INVALID_SESSION_TIMEOUT", F, TXN, "consumer only"),
    ("REBALANCE_IN_PROGRESS", R, TXN, "group rebalancing"),
    ("INVALID_COMMIT_OFFSET_SIZE", A, TXN, "invalid offset commit size"),
    ("TOPIC_AUTHORIZATION_FAILED", F, REJ, "KIP-691: topic authorization is fatal"),
    ("GROUP_AUTHORIZATION_FAILED", F, TXN, "KIP-691: group authorization is fatal"),
    ("CLUSTER_AUTHORIZATION_FAILED", F, TXN, "idempotent write not authorized"),
    ("INVALID_TIMESTAMP", A, REJ, "record timestamp outside the allowed range"),
    ("UNSUPPORTED_SASL_MECHANISM", F, DEL, "SASL mechanism not enabled on the broker"),
    ("ILLEGAL_SASL_STATE", F, DEL, "SASL state error"),
    ("UNSUPPORTED_VERSION", F, TXN, "broker too old for this request"),
    ("TOPIC_ALREADY_EXISTS", F, DEL, "admin only"),
    ("INVALID_PARTITIONS", F, DEL, "admin only"),
    ("INVALID_REPLICATION_FACTOR", F, DEL, "admin only"),
    ("INVALID_REPLICA_ASSIGNMENT", F, DEL, "admin only"),
    ("INVALID_CONFIG", F, DEL, "admin only"),
    ("NOT_CONTROLLER", R, DEL, "admin only"),
    ("INVALID_REQUEST", F, DEL, "malformed request"),
    ("UNSUPPORTED_FOR_MESSAGE_FORMAT", F, TXN, "broker message format too old"),
    ("POLICY_VIOLATION", A, REJ, "broker policy rejected the record"),
    ("OUT_OF_ORDER_SEQUENCE_NUMBER", A, DEL, "sequence gap; librdkafka bumps the epoch"),
    ("DUPLICATE_SEQUENCE_NUMBER", R, DEL, "duplicate; librdkafka treats it as delivered"),
    ("INVALID_PRODUCER_EPOCH", F, TXN, "an operation used an old epoch: fenced"),
    ("INVALID_TXN_STATE", F, TXN, "transactional request in an invalid state"),
    ("INVALID_PRODUCER_ID_MAPPING", A, TXN, "KIP-360: abortable, the epoch is bumped"),
    (
        "INVALID_TRANSACTION_TIMEOUT",
        F,
        TXN,
        "transaction.timeout.ms over transaction.max.timeout.ms",
    ),
    ("CONCURRENT_TRANSACTIONS", R, TXN, "previous transaction still completing"),
    ("TRANSACTION_COORDINATOR_FENCED", R, TXN, "coordinator epoch moved"),
    ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", F, TXN, "no WRITE on the transactional.id"),
    ("SECURITY_DISABLED", F, DEL, "security features disabled"),
    ("OPERATION_NOT_ATTEMPTED", A, TXN, "not attempted because another part failed"),
    ("KAFKA_STORAGE_ERROR", R, DEL, "broker disk error; another replica may lead"),
    ("LOG_DIR_NOT_FOUND", F, DEL, "admin only"),
    ("SASL_AUTHENTICATION_FAILED", F, DEL, "SASL authentication failed"),
    ("UNKNOWN_PRODUCER_ID", A, TXN, "KIP-360: abortable, the epoch is bumped"),
    ("REASSIGNMENT_IN_PROGRESS", R, DEL, "partition reassignment in progress"),
    ("DELEGATION_TOKEN_AUTH_DISABLED", F, DEL, "delegation tokens disabled"),
    ("DELEGATION_TOKEN_NOT_FOUND", F, DEL, "delegation token not found"),
    ("DELEGATION_TOKEN_OWNER_MISMATCH", F, DEL, "delegation token owner mismatch"),
    ("DELEGATION_TOKEN_REQUEST_NOT_ALLOWED", F, DEL, "delegation token request not allowed"),
    ("DELEGATION_TOKEN_AUTHORIZATION_FAILED", F, DEL, "delegation token not authorized"),
    ("DELEGATION_TOKEN_EXPIRED", F, DEL, "delegation token expired"),
    ("INVALID_PRINCIPAL_TYPE", F, DEL, "admin only"),
    ("NON_EMPTY_GROUP", F, DEL, "admin only"),
    ("GROUP_ID_NOT_FOUND", F, DEL, "admin only"),
    ("FETCH_SESSION_ID_NOT_FOUND", R, DEL, "consumer only"),
    ("INVALID_FETCH_SESSION_EPOCH", R, DEL, "consumer only"),
    ("LISTENER_NOT_FOUND", R, DEL, "listener missing on the leader"),
    ("TOPIC_DELETION_DISABLED", F, DEL, "admin only"),
    ("FENCED_LEADER_EPOCH", R, DEL, "leader epoch moved"),
    ("UNKNOWN_LEADER_EPOCH", R, DEL, "leader epoch not yet known"),
    ("UNSUPPORTED_COMPRESSION_TYPE", F, REJ, "compression.type not supported by the broker"),
    ("STALE_BROKER_EPOCH", R, DEL, "broker epoch moved"),
    ("OFFSET_NOT_AVAILABLE", R, DEL, "high watermark not caught up"),
    ("MEMBER_ID_REQUIRED", R, TXN, "consumer only"),
    ("PREFERRED_LEADER_NOT_AVAILABLE", R, DEL, "preferred leader not available"),
    ("GROUP_MAX_SIZE_REACHED", F, TXN, "consumer group full"),
    ("FENCED_INSTANCE_ID", F, TXN, "KIP-691: a static member with this id fenced us"),
    ("ELIGIBLE_LEADERS_NOT_AVAILABLE", R, DEL, "no eligible leader"),
    ("ELECTION_NOT_NEEDED", F, DEL, "admin only"),
    ("NO_REASSIGNMENT_IN_PROGRESS", F, DEL, "admin only"),
    ("GROUP_SUBSCRIBED_TO_TOPIC", F, DEL, "admin only"),
    ("INVALID_RECORD", A, REJ, "broker failed to validate the record (KIP-467)"),
    ("UNSTABLE_OFFSET_COMMIT", R, TXN, "offsets of an open transaction pending"),
    ("THROTTLING_QUOTA_EXCEEDED", R, DEL, "quota exceeded"),
    ("PRODUCER_FENCED", F, TXN, "epoch bumped: a newer producer, or a timeout abort"),
    ("RESOURCE_NOT_FOUND", F, DEL, "admin only"),
    ("DUPLICATE_RESOURCE", F, DEL, "admin only"),
    ("UNACCEPTABLE_CREDENTIAL", F, DEL, "admin only"),
    ("INCONSISTENT_VOTER_SET", F, DEL, "KRaft only"),
    ("INVALID_UPDATE_VERSION", F, DEL, "admin only"),
    ("FEATURE_UPDATE_FAILED", F, DEL, "admin only"),
    ("PRINCIPAL_DESERIALIZATION_FAILURE", F, DEL, "request principal unreadable"),
    ("UNKNOWN_TOPIC_ID", R, DEL, "topic id not yet known"),
    ("INCONSISTENT_TOPIC_ID", R, DEL, "topic id changed"),
    (
        "FENCED_MEMBER_EPOCH",
        F,
        TXN,
        "KIP-848 heartbeat: member fenced (its offsets then get UNKNOWN_MEMBER_ID); fatal",
    ),
    ("UNRELEASED_INSTANCE_ID", F, TXN, "static member id still in use"),
    ("UNSUPPORTED_ASSIGNOR", F, TXN, "consumer only"),
    (
        "STALE_MEMBER_EPOCH",
        F,
        TXN,
        "KIP-848 CommitFailed: TxnOffsetCommit v6+ (older: ILLEGAL_GENERATION); KIP-691 fatal",
    ),
    ("MISMATCHED_ENDPOINT_TYPE", F, DEL, "wrong endpoint type"),
    ("UNSUPPORTED_ENDPOINT_TYPE", F, DEL, "unsupported endpoint type"),
    ("UNKNOWN_CONTROLLER_ID", F, DEL, "admin only"),
    ("UNKNOWN_SUBSCRIPTION_ID", R, DEL, "telemetry only"),
    ("TELEMETRY_TOO_LARGE", R, DEL, "telemetry only"),
    ("INVALID_REGISTRATION", F, DEL, "KRaft only"),
    ("TRANSACTION_ABORTABLE", A, TXN, "KIP-890: the broker asks for an abort"),
    ("INVALID_RECORD_STATE", F, DEL, "share groups only"),
    ("SHARE_SESSION_NOT_FOUND", F, DEL, "share groups only"),
    ("INVALID_SHARE_SESSION_EPOCH", F, DEL, "share groups only"),
    ("FENCED_STATE_EPOCH", F, DEL, "share groups only"),
    ("INVALID_VOTER_KEY", F, DEL, "KRaft only"),
    ("DUPLICATE_VOTER", F, DEL, "KRaft only"),
    ("VOTER_NOT_FOUND", F, DEL, "KRaft only"),
    ("INVALID_REGULAR_EXPRESSION", F, DEL, "consumer only"),
    ("REBOOTSTRAP_REQUIRED", R, DEL, "metadata stale; librdkafka re-bootstraps"),
    ("STREAMS_INVALID_TOPOLOGY", F, DEL, "Kafka Streams only"),
    ("STREAMS_INVALID_TOPOLOGY_EPOCH", F, DEL, "Kafka Streams only"),
    ("STREAMS_TOPOLOGY_FENCED", F, DEL, "Kafka Streams only"),
    ("SHARE_SESSION_LIMIT_REACHED", F, DEL, "share groups only"),
)

# KIP-691 "Proposed changes": fatal although the Java producer (and librdkafka) abort.
_KIP691_FATAL: Final = frozenset(
    {
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "FENCED_INSTANCE_ID",
        "UNKNOWN_MEMBER_ID",
        "ILLEGAL_GENERATION",
        "FENCED_MEMBER_EPOCH",
        "STALE_MEMBER_EPOCH",
    }
)


def _build() -> dict[int, ErrorRule]:
    table: dict[int, ErrorRule] = {}
    for name, category, failure_type, note in _ROWS:
        code = getattr(KafkaError, name, None)
        if code is None:  # a name a newer librdkafka added; older wheels lack it
            continue
        if code in table:
            raise RuntimeError(f"error table lists code {code} twice ({name})")
        table[code] = ErrorRule(
            int(code), name, category, failure_type, name in _KIP691_FATAL, note
        )
    return table


ERROR_TABLE: Final[dict[int, ErrorRule]] = _build()
"""Every error code librdkafka defines (bar NO_ERROR) -> its rule."""


def rule_for(code: int) -> ErrorRule:
    """The table's row for ``code``; a code the table lacks (a newer librdkafka) is fatal
    with DELIVERY_FAILED, as KIP-691 treats unexpected errors, but keeps its real code."""
    rule = ERROR_TABLE.get(code)
    if rule is None:
        return ErrorRule(code, f"CODE_{code}", F, DEL, False, "not in the table")
    return rule


def classify(err: KafkaError) -> tuple[ErrorCategory, FailureType]:
    """Category and record FailureType of one ``KafkaError`` (see the module docstring)."""
    rule = rule_for(err.code())
    if err.fatal() or rule.kip691_fatal:
        return F, rule.failure_type
    if err.txn_requires_abort():
        return A, rule.failure_type
    if err.retriable():
        return R, rule.failure_type
    return rule.category, rule.failure_type


_FENCED_CODES: Final = frozenset(
    {KafkaError.PRODUCER_FENCED, KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
AUTHENTICATION_CODES: Final = frozenset(
    {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
)
"""A refused SASL login. librdkafka reports one only through ``error_cb``
(``rd_kafka_broker_fail(..., RD_KAFKA_RESP_ERR__AUTHENTICATION, ...)``: the broker's
SaslAuthenticate error message, a mechanism the broker's SaslHandshake does not list, a
token ``oauth_cb`` could not give) and never as a call's result: it reconnects and logs
in again with the same settings, so a call that needs a broker meanwhile just times out
(``_TIMED_OUT``, ``_TRANSPORT``). Retrying cannot help; the report is the error."""
_ADVICE: Final = {
    F: "the producer is unusable: close it (and its consumer) and create a new one",
    A: "abort the transaction, rewind the inputs, and retry in a new transaction",
    R: "transient; retry the call",
}
_SASL_ADVICE: Final = (
    "the broker refused this client's SASL login, and logging in again with the same "
    "settings is refused again: check sasl.username and sasl.password (Apache Kafka "
    "answers an unknown SCRAM user exactly as a wrong password), or the token oauth_cb "
    "returns for OAUTHBEARER, and sasl.mechanism (it must be one of the broker's "
    "sasl.enabled.mechanisms), then create the producer with the corrected settings"
)
_FENCED_ADVICE: Final = (
    "the coordinator bumped this producer's epoch: either another producer initialised "
    "the same transactional.id, or the coordinator aborted the open transaction because "
    "it outlived transaction.timeout.ms (a broker outage, a slow transaction; Apache "
    "Kafka's TransactionCoordinator aborts a timed-out transaction with an epoch bump, "
    "and librdkafka then hears PRODUCER_FENCED). Nothing of that transaction is visible. "
    "The producer is unusable: close it (and its consumer) and create a new one, and "
    "make sure no other instance uses this transactional.id"
)
# Codes whose fix is a setting, not a new producer: what to change, said in place of the
# category's advice. librdkafka's text for INVALID_TRANSACTION_TIMEOUT names the broker
# setting max.transaction.timeout.ms, which does not exist (Apache Kafka's
# TransactionCoordinator.handleInitProducerId checks transaction.max.timeout.ms).
_CODE_ADVICE: Final = {
    KafkaError.INVALID_TRANSACTION_TIMEOUT: (
        "this producer's transaction.timeout.ms is larger than the broker's "
        "transaction.max.timeout.ms (15 minutes by default): set transaction.timeout.ms to "
        "at most the broker's transaction.max.timeout.ms, or raise transaction.max.timeout.ms "
        "on every broker; the producer is unusable: close it and create one with the "
        "corrected setting"
    ),
    **dict.fromkeys(AUTHENTICATION_CODES, _SASL_ADVICE),
    **dict.fromkeys(_FENCED_CODES, _FENCED_ADVICE),
}


def exception_for(err: KafkaError, operation: str) -> KafkaTxnError:
    """The exception a failed ``operation`` raises for ``err``: the one place where
    confluent-kafka errors become kafka-txn errors. The caller raises it ``from`` the
    confluent exception, so the chain is exactly one deep."""
    category, _ = classify(err)
    advice = _CODE_ADVICE.get(err.code(), _ADVICE[category])
    message = f"{operation} failed: {err.str()} ({err.name()}); {advice}"
    if category is F:
        cls: type[KafkaTxnError] = (
            ProducerFencedError if err.code() in _FENCED_CODES else FatalError
        )
        return cls(message, kafka_error=err)
    if operation == "commit_transaction":
        return CommitFailedException(message, kafka_error=err)
    return TransactionAbortableError(message, kafka_error=err)


def produce_failure(
    err: KafkaError, topic: str | None, partition: int | None, key: bytes | str | None
) -> ProduceFailedException:
    """A record's failure, from the error its delivery report or produce() call gave."""
    category, failure_type = classify(err)
    where = f"{topic}[{partition}]" if partition is not None and partition >= 0 else topic
    return ProduceFailedException(
        f"record to {where} failed ({failure_type.name}): {err.str()} ({err.name()})",
        kafka_error=err,
        failure_type=failure_type,
        category=category,
        topic=topic,
        partition=partition,
        key=key,
    )


def render_markdown() -> str:
    """docs/reference/errors.md's table, generated from ERROR_TABLE."""
    lines = [
        "| Code | Name | Category | Record FailureType | KIP-691 override | Note |",
        "|---:|---|---|---|---|---|",
    ]
    for rule in sorted(ERROR_TABLE.values(), key=lambda r: r.code):
        override = "fatal" if rule.kip691_fatal else ""
        lines.append(
            f"| {rule.code} | `{rule.name}` | {rule.category.value} | "
            f"{rule.failure_type.name} | {override} | {rule.note} |"
        )
    return "\n".join(lines) + "\n"
