"""Exceptions: caught by confluent-kafka handlers, wrapped once, and picklable; they
answer confluent-kafka's KafkaError methods, so that delivery callbacks written for
confluent-kafka work unchanged (on the real broker and on the mock cluster)."""

from __future__ import annotations

import pickle
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from kafka_txn import (
    CommitFailedException,
    ErrorCategory,
    FatalError,
    TransactionalProducer,
    errors,
)
from kafka_txn.classification import exception_for, produce_failure
from kafka_txn.testing import ApiKey


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
        errors.TransactionInDoubtError(
            "d", kafka_error=KafkaError(KafkaError._TIMED_OUT), prepared_state="s", retriable=True
        ),
        errors.TransactionDivergedError(
            "dv", transactional_id="t", stored_state="s", observed={"state": "CompleteAbort"}
        ),
        errors.UnsupportedBrokerError("old broker"),
        errors.DatabaseCommitUnknownError("db"),
        errors.BrokerUnreachableError(
            "unreachable",
            kafka_error=KafkaError(KafkaError._TRANSPORT),
            servers="127.0.0.1:9",
            causes=("connection refused to 127.0.0.1:9",),
        ),
        errors.DatabaseUnavailableError("no database", url="jdbc:postgresql://h/db?password=***"),
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


@pytest.mark.guarantee("1.3")
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
    assert errors.ConfigurationError("x").code() == KafkaError._INVALID_ARG
    assert errors.IllegalStateError("x").error_code == KafkaError._STATE


@pytest.mark.parametrize("exc", _all_kinds(), ids=lambda e: type(e).__name__)
def test_answers_kafka_errors_methods(exc):
    root = exc.kafka_error
    assert exc.code() == exc.error_code == root.code()
    assert isinstance(exc.code(), int)
    # The attribute form, as before: the same int, equal to KafkaError's constants.
    assert exc.code == root.code() and isinstance(exc.code, int)
    assert hash(exc.code) == hash(root.code()) and f"{exc.code}" == str(root.code())
    assert exc.name() == root.name()
    assert exc.str() == str(exc) == exc.message
    assert exc.fatal() is (exc.category is ErrorCategory.FATAL)
    assert exc.txn_requires_abort() is (exc.category is ErrorCategory.ABORTABLE)
    if not isinstance(exc, errors.TransactionInDoubtError):
        assert exc.retriable() is (exc.category is ErrorCategory.RETRIABLE)
    assert [exc.fatal(), exc.txn_requires_abort(), exc.category is ErrorCategory.RETRIABLE].count(
        True
    ) <= 1
    back = pickle.loads(pickle.dumps(exc))
    assert (back.code(), back.name(), back.str(), back.fatal()) == (
        exc.code(),
        exc.name(),
        exc.str(),
        exc.fatal(),
    )


def test_every_public_kafka_error_method_is_answered():
    methods = {m for m in dir(KafkaError) if not m.startswith("_") and not m.isupper()}
    assert methods == {"code", "name", "str", "fatal", "retriable", "txn_requires_abort"}
    exc = produce_failure(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), "t", 0, None)
    for method in methods:
        assert callable(getattr(exc, method)), method


def test_in_doubt_retriable_stays_the_documented_bool():
    for flag in (True, False):
        exc = errors.TransactionInDoubtError("d", prepared_state="s", retriable=flag)
        assert exc.retriable is flag
        assert pickle.loads(pickle.dumps(exc)).retriable is flag
        assert exc.fatal() and not exc.txn_requires_abort()


def test_a_fatal_record_failure_says_fatal():
    exc = produce_failure(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "t", 0, None)
    assert exc.fatal() and not exc.txn_requires_abort() and not exc.retriable()
    assert exc.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert exc.name() == "TOPIC_AUTHORIZATION_FAILED"


class _ConfluentStyleCallback:
    """A delivery callback written for confluent-kafka, as its documentation shows it:
    nothing in it knows about kafka-txn."""

    def __init__(self) -> None:
        self.failed: list[tuple[int, str, str]] = []
        self.retried: list[object] = []
        self.fatal: list[object] = []
        self.to_abort: list[object] = []
        self.delivered = 0

    def __call__(self, err, msg):
        if err is not None:
            self.failed.append((err.code(), err.name(), err.str()))
            if err.retriable():
                self.retried.append(msg)
            if err.fatal():
                self.fatal.append(msg)
            if err.txn_requires_abort():
                self.to_abort.append(msg)
        else:
            self.delivered += 1


def _small_record_topic(broker) -> str:
    """A topic whose broker-side max.message.bytes refuses a 5000-byte record (the
    producer's own message.max.bytes lets it through, so the delivery report fails)."""
    name = f"small-{uuid.uuid4().hex[:12]}"
    admin = broker.admin()
    small = NewTopic(name, num_partitions=1, replication_factor=1)
    small.config = {"max.message.bytes": "1000"}
    futures = admin.create_topics([small])
    futures[name].result(timeout=60)
    return name


def _commit_after_the_gap(p, topic, value, cb) -> None:
    """Commit one record in a new transaction. The failed record left a sequence gap, so
    the first may fail with OUT_OF_ORDER_SEQUENCE_NUMBER while librdkafka bumps the epoch
    (docs/reference/errors.md, "librdkafka behaviour worth knowing"): abort and retry, as the
    consume-process-produce loop does."""
    for _ in range(3):
        try:
            with p.transaction():
                p.produce(topic, value, partition=0, on_delivery=cb)
            return
        except CommitFailedException:
            continue
    pytest.fail("the transaction after the abort never committed")


@pytest.mark.parametrize("where", ["produce", "config"])
def test_confluent_kafka_delivery_callback_on_the_broker(broker, producer_config, where):
    topic = _small_record_topic(broker)
    cb = _ConfluentStyleCallback()
    conf = {**producer_config, "on_delivery": cb} if where == "config" else producer_config
    with TransactionalProducer(conf) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, b"ok", on_delivery=cb if where == "produce" else None)
        p.flush(30)  # delivered alone: a batch refused as a whole fails every record in it
        assert cb.delivered == 1
        p.produce(topic, b"x" * 5000, on_delivery=cb if where == "produce" else None)
        p.flush(30)
        assert cb.failed == [(KafkaError.MSG_SIZE_TOO_LARGE, "MSG_SIZE_TOO_LARGE", cb.failed[0][2])]
        assert "Message size too large" in cb.failed[0][2]
        assert len(cb.to_abort) == 1 and not cb.retried and not cb.fatal
        with pytest.raises(CommitFailedException) as commit:
            p.commit_transaction()
        assert commit.value.__cause__.code() == KafkaError.MSG_SIZE_TOO_LARGE
        p.abort_transaction()  # no TypeError from the callback surfaces here
        _commit_after_the_gap(p, topic, b"next", cb if where == "produce" else None)
    assert cb.delivered >= 2
    assert broker.read_committed(topic, expected=1) == [(None, b"next")]


@pytest.mark.mock
@pytest.mark.parametrize(
    ("code", "fatal"),
    [(KafkaError.MSG_SIZE_TOO_LARGE, False), (KafkaError.TOPIC_AUTHORIZATION_FAILED, True)],
)
def test_confluent_kafka_delivery_callback_on_the_mock_cluster(
    mock_cluster, mock_config, code, fatal
):
    mock_cluster.create_topic("t", partitions=1)
    cb = _ConfluentStyleCallback()
    p = TransactionalProducer({**mock_config(), "on_delivery": cb})
    try:
        p.init_transactions()
        p.begin_transaction()
        mock_cluster.push_request_errors(ApiKey.PRODUCE, code)
        p.produce("t", b"v", partition=0)
        if fatal:  # the callback ran, then flush() reports the producer dead
            with pytest.raises(FatalError) as dead:
                p.flush(30)
            assert dead.value.fatal() and dead.value.code() == code
        else:
            p.flush(30)
        assert [(c, n) for c, n, _ in cb.failed] == [(code, KafkaError(code).name())]
        assert bool(cb.fatal) is fatal and bool(cb.to_abort) is not fatal and not cb.retried
        if fatal:
            with pytest.raises(FatalError):
                p.abort_transaction()
        else:
            p.abort_transaction()
            _commit_after_the_gap(p, "t", b"again", None)
            assert cb.delivered == 1
    finally:
        p.close()


def test_module_docstring_draws_every_exception_class():
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert name in errors.__doc__, f"{name} missing from the tree in errors.py"
            assert obj.__doc__, f"{name} needs a docstring saying when it is raised"
