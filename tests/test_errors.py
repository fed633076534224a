"""Exceptions: caught by confluent-kafka handlers, wrapped once, and picklable."""

from __future__ import annotations

import pickle

import pytest
from confluent_kafka import KafkaError, KafkaException

from kafka_txn import errors
from kafka_txn.classification import exception_for, produce_failure


def _all_kinds() -> list[errors.KafkaTxnError]:
    root = KafkaError(KafkaError.PRODUCER_FENCED, "fenced", fatal=True)
    return [
        errors.FatalError("f", kafka_error=root),
        errors.ProducerFencedError("pf", kafka_error=root),
        errors.TransactionAbortableError("a", kafka_error=KafkaError(KafkaError._INCONSISTENT)),
        errors.CommitFailedException("c", kafka_error=KafkaError(KafkaError._INCONSISTENT)),
        produce_failure(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), "t", 2, b"key"),
        errors.TransactionOutcomeUnknownError(
            "u", kafka_error=KafkaError(KafkaError._TIMED_OUT), operation="commit_transaction"
        ),
        errors.IllegalStateError("i"),
        errors.ConfigurationError("cfg"),
    ]


@pytest.mark.parametrize("exc", _all_kinds(), ids=lambda e: type(e).__name__)
def test_is_a_confluent_kafka_exception_with_root_in_args(exc):
    assert isinstance(exc, KafkaException)
    assert exc.args[0] is exc.kafka_error
    assert isinstance(exc.kafka_error, KafkaError)


@pytest.mark.parametrize("exc", _all_kinds(), ids=lambda e: type(e).__name__)
def test_pickle_round_trip_keeps_everything(exc):
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert back.kafka_error.code() == exc.kafka_error.code()
    assert back.kafka_error.fatal() == exc.kafka_error.fatal()
    assert back.category == exc.category
    assert vars(back).keys() == vars(exc).keys()
    for key, value in vars(exc).items():
        if key != "kafka_error":
            assert getattr(back, key) == value


def test_produce_failure_context():
    exc = produce_failure(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), "t", 2, b"key")
    assert exc.failure_type is errors.FailureType.MESSAGE_REJECTED
    assert (exc.topic, exc.partition, exc.key) == ("t", 2, b"key")
    assert "t[2]" in str(exc) and "MESSAGE_REJECTED" in str(exc)


def test_wrapping_depth_is_one():
    raw = KafkaException(KafkaError(KafkaError.PRODUCER_FENCED, fatal=True))
    try:
        try:
            raise raw
        except KafkaException as exc:
            raise exception_for(exc.args[0], "commit_transaction") from exc
    except errors.FatalError as mapped:
        assert mapped.__cause__ is raw
        assert mapped.__cause__.__cause__ is None
        assert mapped.kafka_error is raw.args[0]


def test_configuration_error_is_a_value_error():
    assert isinstance(errors.ConfigurationError("x"), ValueError)
    assert errors.ConfigurationError("x").code == KafkaError._INVALID_ARG
    assert errors.IllegalStateError("x").code == KafkaError._STATE


def test_module_docstring_draws_every_exception_class():
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert name in errors.__doc__, f"{name} missing from the tree in errors.py"
            assert obj.__doc__, f"{name} needs a docstring saying when it is raised"
