"""The error table: complete, consistent with librdkafka's flags, and the source of
docs/errors.md."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from kafka_txn import ERROR_TABLE, ErrorCategory, FailureType, classify
from kafka_txn._docs import update_docs
from kafka_txn.classification import exception_for, render_markdown, rule_for
from kafka_txn.errors import CommitFailedException, FatalError, TransactionAbortableError
from kafka_txn.testing import librdkafka_path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "errors.md"


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


def test_table_covers_every_librdkafka_code():
    codes = _librdkafka_codes()
    missing = {name for code, name in codes.items() if code not in ERROR_TABLE}
    assert not missing, f"add these codes to kafka_txn/classification.py: {sorted(missing)}"
    for code, name in codes.items():
        assert ERROR_TABLE[code].name == name


@pytest.mark.parametrize("rule", sorted(ERROR_TABLE.values(), key=lambda r: r.code), ids=str)
def test_every_row(rule):
    bare = KafkaError(rule.code)
    category, failure_type = classify(bare)
    assert failure_type is rule.failure_type
    # With no librdkafka flag set, the table decides.
    assert category is (ErrorCategory.FATAL if rule.kip691_fatal else rule.category)
    # librdkafka's flags come first ...
    assert classify(KafkaError(rule.code, fatal=True))[0] is ErrorCategory.FATAL
    abortable = classify(KafkaError(rule.code, txn_requires_abort=True))[0]
    retriable = classify(KafkaError(rule.code, retriable=True))[0]
    # ... except where KIP-691 rules the code fatal.
    if rule.kip691_fatal:
        assert abortable is retriable is ErrorCategory.FATAL
    else:
        assert abortable is ErrorCategory.ABORTABLE
        assert retriable is ErrorCategory.RETRIABLE
    mapped = exception_for(KafkaError(rule.code, txn_requires_abort=True), "commit_transaction")
    assert isinstance(mapped, FatalError if rule.kip691_fatal else CommitFailedException)


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


def test_kip691_fatal_codes():
    for name in (
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "FENCED_INSTANCE_ID",
        "UNKNOWN_MEMBER_ID",
        "ILLEGAL_GENERATION",
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
        "docs/api.md drifted from the docstrings: run `python -m kafka_txn._docs`"
    )


def test_docs_are_generated_from_the_code():
    text = DOCS.read_text()
    assert update_docs(text) == text, (
        "docs/errors.md drifted from the code: run `python -m kafka_txn._docs`"
    )
    assert render_markdown() in text
