"""The error table: complete, consistent with librdkafka's flags, and the source of
docs/reference/errors.md."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from kafka_txn import ERROR_TABLE, ErrorCategory, FailureType, classification, classify
from kafka_txn._docs import update_docs
from kafka_txn.classification import (
    _FENCED_ADVICE,
    ErrorRule,
    exception_for,
    produce_failure,
    render_markdown,
    rule_for,
)
from kafka_txn.errors import (
    CommitFailedException,
    FatalError,
    ProducerFencedError,
    TransactionAbortableError,
)
from kafka_txn.testing import librdkafka_path

DOCS = Path(__file__).resolve().parent.parent.parent / "docs" / "reference" / "errors.md"


def _librdkafka_codes() -> dict[int, str]:
    """Every error code the installed librdkafka defines, from rd_kafka_get_err_descs."""

    class Desc(ctypes.Structure):
        _fields_ = (("code", ctypes.c_int), ("name", ctypes.c_char_p), ("desc", ctypes.c_char_p))

    lib = ctypes.CDLL(str(librdkafka_path()))
    descs = ctypes.POINTER(Desc)()
    count = ctypes.c_size_t()
    lib.rd_kafka_get_err_descs(ctypes.byref(descs), ctypes.byref(count))
    return {
        descs[i].code: descs[i].name.decode()
        for i in range(count.value)
        if descs[i].name and descs[i].code != 0 and descs[i].name not in (b"_BEGIN", b"_END")
    }


@pytest.mark.guarantee("1.3")
def test_table_covers_every_librdkafka_code():
    codes = _librdkafka_codes()
    missing = {name for code, name in codes.items() if code not in ERROR_TABLE}
    assert not missing, f"add these codes to kafka_txn/classification.py: {sorted(missing)}"
    for code, name in codes.items():
        assert ERROR_TABLE[code].name == name


F, A, R = ErrorCategory.FATAL, ErrorCategory.ABORTABLE, ErrorCategory.RETRIABLE
REJ, DEL, TXN = (
    FailureType.MESSAGE_REJECTED,
    FailureType.DELIVERY_FAILED,
    FailureType.TRANSACTION_FAILED,
)

# What the codes that matter must be, written out here from KIP-691 and from what librdkafka
# does with them (src/rdkafka_txnmgr.c, src/rdkafka_request.c), not read from
# kafka_txn/classification.py: a changed row fails below until this is changed too, on
# purpose, by whoever changes the table. Each entry: (category of the bare error, i.e.
# with no librdkafka flag set; FailureType of a record that failed with it).
EXPECTED: dict[str, tuple[ErrorCategory, FailureType]] = {
    # Fencing. KIP-691: ProducerFencedException is fatal. librdkafka: EndTxn,
    # AddPartitionsToTxn and AddOffsetsToTxn answered PRODUCER_FENCED or
    # INVALID_PRODUCER_EPOCH raise a fatal error (RD_KAFKA_ERR_ACTION_FATAL), normalised to
    # _FENCED (rd_kafka_txn_normalize_err); a Produce answered INVALID_PRODUCER_EPOCH is a
    # fatal _FENCED too (rd_kafka_handle_Produce_error: "transactional producer fenced by
    # newer producer instance"). (KIP-691 calls InvalidProducerEpochException non-fatal for
    # the Java client, which bumps its epoch; a librdkafka handle with a fatal error is
    # dead, so here it is fatal.) The transaction failed around the record.
    "PRODUCER_FENCED": (F, TXN),
    "INVALID_PRODUCER_EPOCH": (F, TXN),
    "_FENCED": (F, TXN),
    # Authorization. KIP-691: TransactionalIdAuthorization and ClusterAuthorization
    # (idempotent write) are fatal, librdkafka says so too; TopicAuthorization and
    # GroupAuthorization are fatal although librdkafka only asks for an abort
    # (AddPartitionsToTxn/AddOffsetsToTxn/TxnOffsetCommit: RD_KAFKA_ERR_ACTION_PERMANENT).
    # A record refused for its topic (Produce: PERMANENT, not persisted) is refused as it
    # is: sending it again cannot help.
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": (F, TXN),
    "CLUSTER_AUTHORIZATION_FAILED": (F, TXN),
    "TOPIC_AUTHORIZATION_FAILED": (F, REJ),
    "GROUP_AUTHORIZATION_FAILED": (F, TXN),
    # The previous transaction is still completing: librdkafka retries EndTxn,
    # AddPartitionsToTxn and AddOffsetsToTxn (RD_KAFKA_ERR_ACTION_RETRY).
    "CONCURRENT_TRANSACTIONS": (R, TXN),
    # The coordinator moved, is unavailable or loading: looked up again and retried.
    "NOT_COORDINATOR": (R, TXN),
    "COORDINATOR_NOT_AVAILABLE": (R, TXN),
    "COORDINATOR_LOAD_IN_PROGRESS": (R, TXN),
    # Timeouts. A call that ran out of time: librdkafka flags it retriable ("retry call to
    # resume", rd_kafka_txn_curr_api_return); a Produce request the broker timed out is
    # retried (rd_kafka_err_action: RETRY). A record past message.timeout.ms failed for
    # good, so its transaction must abort (KIP-691: TimeoutException of an expired batch is
    # abortable); the record itself is fine. KIP-890's TRANSACTION_ABORTABLE is the
    # broker's own "abort and go on". (Kafka has no TRANSACTION_TIMED_OUT code: a timed-out
    # transaction shows up as a fenced epoch or TRANSACTION_ABORTABLE.)
    "_TIMED_OUT": (R, DEL),
    "REQUEST_TIMED_OUT": (R, DEL),
    "_MSG_TIMED_OUT": (A, DEL),
    "TRANSACTION_ABORTABLE": (A, TXN),
    # KIP-360: the broker lost the producer's state, or the id mapping: abortable, and
    # librdkafka bumps the epoch (rd_kafka_idemp_drain_epoch_bump). A sequence gap comes
    # from an earlier record's failure: this record can be sent again (KIP-691 non-fatal).
    "UNKNOWN_PRODUCER_ID": (A, TXN),
    "INVALID_PRODUCER_ID_MAPPING": (A, TXN),
    "OUT_OF_ORDER_SEQUENCE_NUMBER": (A, DEL),
    # KIP-467: INVALID_RECORD names the record the broker refused (KIP-691: abortable);
    # the other records of its batch fail with _INVALID_DIFFERENT_RECORD and can be sent
    # again.
    "INVALID_RECORD": (A, REJ),
    "_INVALID_DIFFERENT_RECORD": (A, DEL),
    # Records refused for what they are (KIP-691: RecordTooLarge and the like abort the
    # transaction, not the producer): too large, a timestamp out of range, a serializer
    # that failed, a partition or topic the cluster does not have.
    "MSG_SIZE_TOO_LARGE": (A, REJ),
    "INVALID_TIMESTAMP": (A, REJ),
    "_KEY_SERIALIZATION": (A, REJ),
    "_VALUE_SERIALIZATION": (A, REJ),
    "_UNKNOWN_PARTITION": (A, REJ),
    "_UNKNOWN_TOPIC": (A, REJ),
    # The leader does not host the partition (yet): retriable in Kafka's protocol, and
    # librdkafka refreshes metadata and retries (REFRESH, not persisted); not a refusal.
    "UNKNOWN_TOPIC_OR_PART": (R, DEL),
    # Purged by an abort (KIP-654: TransactionAbortedException is not fatal).
    "_PURGE_QUEUE": (A, TXN),
    "_PURGE_INFLIGHT": (A, TXN),
    # KIP-691 makes Java's CommitFailedException cases fatal: the group moved on
    # (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, KIP-848's FENCED_MEMBER_EPOCH, and
    # STALE_MEMBER_EPOCH, which the group answers TxnOffsetCommit v6+ where older versions
    # get ILLEGAL_GENERATION: OffsetMetadataManager, Apache Kafka 4.4) or a static member
    # with this instance id took over (FENCED_INSTANCE_ID).
    "UNKNOWN_MEMBER_ID": (F, TXN),
    "ILLEGAL_GENERATION": (F, TXN),
    "FENCED_MEMBER_EPOCH": (F, TXN),
    "STALE_MEMBER_EPOCH": (F, TXN),
    "FENCED_INSTANCE_ID": (F, TXN),
    # Kafka's CORRUPT_MESSAGE: since KIP-467 the broker answers it only for a CRC
    # mismatch (the record was damaged in transit, not refused for what it is); Kafka's
    # protocol marks it retriable (CorruptRecordException extends RetriableException) and
    # librdkafka retries it like NOT_ENOUGH_REPLICAS (rd_kafka_err_action: RETRY).
    "INVALID_MSG": (R, DEL),
}

KIP691_FATAL_OVER_ABORT = frozenset(
    {
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "UNKNOWN_MEMBER_ID",
        "ILLEGAL_GENERATION",
        "FENCED_MEMBER_EPOCH",
        "STALE_MEMBER_EPOCH",
        "FENCED_INSTANCE_ID",
    }
)
"""The codes KIP-691 rules fatal where librdkafka (like the Java producer) only asks for an
abort: fatal whatever librdkafka's flags say."""

FENCING = frozenset({"PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED"})


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.guarantee("1.3")
def test_codes_that_matter(name):
    """The hand-written expectation above, against classify(), the record failure and
    the exception a commit raises."""
    code = getattr(KafkaError, name)
    category, failure_type = EXPECTED[name]
    assert classify(KafkaError(code)) == (category, failure_type)
    record = produce_failure(KafkaError(code), "t", 0, b"k")
    assert (record.category, record.failure_type) == (category, failure_type)
    raised = exception_for(KafkaError(code), "commit_transaction")
    if category is F:
        assert isinstance(raised, ProducerFencedError if name in FENCING else FatalError)
    elif category is A:
        assert isinstance(raised, CommitFailedException)


# How librdkafka flags these codes when a transactional call fails with them
# (rdkafka_txnmgr.c: rd_kafka_txn_curr_api_set_result turns RD_KAFKA_ERR_ACTION_FATAL into
# fatal(), PERMANENT into txn_requires_abort(), RETRY into retriable()), and what
# kafka-txn must then say: the flag, except where KIP-691 rules the code fatal.
LIBRDKAFKA_FLAGGED = [
    ("PRODUCER_FENCED", "fatal", F),  # EndTxn: FATAL
    ("_FENCED", "fatal", F),
    ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "fatal", F),  # EndTxn: FATAL
    ("CLUSTER_AUTHORIZATION_FAILED", "fatal", F),
    ("TOPIC_AUTHORIZATION_FAILED", "txn_requires_abort", F),  # AddOffsetsToTxn: PERMANENT
    ("GROUP_AUTHORIZATION_FAILED", "txn_requires_abort", F),  # TxnOffsetCommit: PERMANENT
    ("UNKNOWN_MEMBER_ID", "txn_requires_abort", F),  # TxnOffsetCommit: PERMANENT
    ("STALE_MEMBER_EPOCH", "txn_requires_abort", F),  # TxnOffsetCommit: default, PERMANENT
    ("CONCURRENT_TRANSACTIONS", "retriable", R),  # EndTxn: RETRY, the call timed out
    ("COORDINATOR_NOT_AVAILABLE", "retriable", R),
    ("_TIMED_OUT", "retriable", R),  # "retry call to resume"
    ("_UNSUPPORTED_FEATURE", "retriable", R),  # EndTxnRequest not announced: retriable
    ("UNKNOWN_PRODUCER_ID", "txn_requires_abort", A),  # EndTxn: PERMANENT, epoch bump
    ("INVALID_PRODUCER_ID_MAPPING", "txn_requires_abort", A),
    ("_INCONSISTENT", "txn_requires_abort", A),  # commit: records failed delivery
]


@pytest.mark.parametrize(("name", "flag", "category"), LIBRDKAFKA_FLAGGED)
@pytest.mark.guarantee("1.3")
def test_librdkafka_flags_decide_except_kip691_fatal_codes(name, flag, category):
    assert classify(KafkaError(getattr(KafkaError, name), **{flag: True}))[0] is category


@pytest.mark.parametrize("rule", sorted(ERROR_TABLE.values(), key=lambda r: r.code), ids=str)
@pytest.mark.guarantee("1.3")
def test_every_row(rule):
    """What holds for every row whatever its category: librdkafka's flags come first
    (a ``fatal()`` is never downgraded; ``txn_requires_abort()`` and ``retriable()``
    decide), except for the codes KIP-691 rules fatal, listed by hand above; a flag never
    changes the record FailureType; and a code the hand-written table states has that
    row."""
    over = rule.name in KIP691_FATAL_OVER_ABORT
    assert rule.kip691_fatal is over
    failure_type = classify(KafkaError(rule.code))[1]
    for flags, category in (
        ({"fatal": True}, F),
        ({"txn_requires_abort": True}, F if over else A),
        ({"retriable": True}, F if over else R),
    ):
        assert classify(KafkaError(rule.code, **flags)) == (category, failure_type), flags
    mapped = exception_for(KafkaError(rule.code, txn_requires_abort=True), "commit_transaction")
    assert isinstance(mapped, FatalError if over else CommitFailedException)
    if rule.name in EXPECTED:
        assert (rule.category, rule.failure_type) == EXPECTED[rule.name]


@pytest.mark.parametrize(
    ("name", "failure_type"),
    [
        ("MSG_SIZE_TOO_LARGE", FailureType.MESSAGE_REJECTED),
        ("INVALID_RECORD", FailureType.MESSAGE_REJECTED),
        ("INVALID_TIMESTAMP", FailureType.MESSAGE_REJECTED),
        ("_VALUE_SERIALIZATION", FailureType.MESSAGE_REJECTED),
        ("_MSG_TIMED_OUT", FailureType.DELIVERY_FAILED),
        ("NOT_ENOUGH_REPLICAS", FailureType.DELIVERY_FAILED),
        ("NOT_LEADER_FOR_PARTITION", FailureType.DELIVERY_FAILED),
        ("_INVALID_DIFFERENT_RECORD", FailureType.DELIVERY_FAILED),
        ("PRODUCER_FENCED", FailureType.TRANSACTION_FAILED),
        ("INVALID_TXN_STATE", FailureType.TRANSACTION_FAILED),
        ("_PURGE_QUEUE", FailureType.TRANSACTION_FAILED),
        ("_PURGE_INFLIGHT", FailureType.TRANSACTION_FAILED),
    ],
)
def test_issue_failure_types(name, failure_type):
    assert rule_for(getattr(KafkaError, name)).failure_type is failure_type


@pytest.mark.guarantee("1.3")
def test_kip691_fatal_codes():
    for name in (
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "FENCED_INSTANCE_ID",
        "UNKNOWN_MEMBER_ID",
        "ILLEGAL_GENERATION",
        "STALE_MEMBER_EPOCH",
    ):
        err = KafkaError(getattr(KafkaError, name), txn_requires_abort=True)
        assert classify(err)[0] is ErrorCategory.FATAL, name


def test_unknown_code_is_fatal_but_keeps_its_code():
    rule = rule_for(31337)
    assert rule.category is ErrorCategory.FATAL and rule.code == 31337
    exc = exception_for(KafkaError(KafkaError._FAIL), "begin_transaction")
    assert isinstance(exc, TransactionAbortableError)


def test_api_reference_is_generated_from_the_docstrings():
    from kafka_txn._docs import render_api

    assert (DOCS.parent / "api.md").read_text() == render_api(), (
        "docs/reference/api.md drifted from the docstrings: run `python -m kafka_txn._docs`"
    )


def test_docs_are_generated_from_the_code():
    text = DOCS.read_text()
    assert update_docs(text) == text, (
        "docs/reference/errors.md drifted from the code: run `python -m kafka_txn._docs`"
    )
    assert render_markdown() in text


# What the table tests above leave open (mutation testing, make mutants, shows it).
def test_the_table_builds_the_same_from_its_rows():
    # ERROR_TABLE is built once, at import; building it again puts the building code
    # itself under test (mutmut switches a mutant on only after the import).
    table = classification._build()
    assert table == ERROR_TABLE
    for code, rule in table.items():
        assert code == rule.code == int(getattr(KafkaError, rule.name))


def test_unknown_code_row_in_full():
    assert rule_for(31337) == ErrorRule(
        31337, "CODE_31337", ErrorCategory.FATAL, FailureType.DELIVERY_FAILED, False,
        "not in the table",
    )  # fmt: skip
    assert classify(KafkaError(31337)) == (ErrorCategory.FATAL, FailureType.DELIVERY_FAILED)


@pytest.mark.parametrize(
    ("code", "operation", "cls", "advice"),
    [
        (KafkaError.PRODUCER_FENCED, "commit_transaction", ProducerFencedError, "fenced"),
        (KafkaError._FENCED, "send_offsets_to_transaction", ProducerFencedError, "fenced"),
        (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "init_transactions", FatalError,
         "unusable"),
        (KafkaError._MSG_TIMED_OUT, "commit_transaction", CommitFailedException, "abort"),
        (KafkaError._MSG_TIMED_OUT, "send_offsets_to_transaction", TransactionAbortableError,
         "abort"),
        (KafkaError.NOT_COORDINATOR, "begin_transaction", TransactionAbortableError,
         "transient"),
    ],
)  # fmt: skip
def test_exception_for_builds_the_error_its_category_says(code, operation, cls, advice):
    err = KafkaError(code)
    exc = exception_for(err, operation)
    assert type(exc) is cls  # a fatal error that is no fencing is no ProducerFencedError
    advices = {
        "unusable": "the producer is unusable: close it (and its consumer) and create a new one",
        "abort": "abort the transaction, rewind the inputs, and retry in a new transaction",
        "transient": "transient; retry the call",
        # Fencing names both ways an epoch is bumped: another producer's init, and the
        # coordinator's abort of a transaction past transaction.timeout.ms.
        "fenced": _FENCED_ADVICE,
    }
    assert str(exc) == f"{operation} failed: {err.str()} ({err.name()}); {advices[advice]}"
    assert exc.kafka_error is err
    if advice == "fenced":
        assert "transaction.timeout.ms" in str(exc) and "close it" in str(exc)


@pytest.mark.parametrize(
    ("partition", "where"), [(0, "orders[0]"), (3, "orders[3]"), (-1, "orders"), (None, "orders")]
)
def test_a_record_failure_names_the_partition_when_it_is_known(partition, where):
    err = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    exc = produce_failure(err, "orders", partition, b"k")
    assert str(exc) == f"record to {where} failed (MESSAGE_REJECTED): {err.str()} ({err.name()})"
    assert (exc.topic, exc.partition, exc.key, exc.kafka_error) == ("orders", partition, b"k", err)
    assert (exc.category, exc.failure_type) == classify(err)
