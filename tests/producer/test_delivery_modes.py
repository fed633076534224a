"""The error-only delivery mode (``delivery.report.only.error`` true): confluent-kafka
drops each success delivery report in C (its ``dr_msg_cb`` returns before building a
``Message`` and frees the record's callback state), so the producer hears of failed
records only. What kafka-txn promises of it (docs/reference/api.md, docs/guide/
producer.md): committed records are visible to read_committed readers; every failed
record is still classified (``ProduceFailedException`` with its ``FailureType``) and
makes the commit raise ``CommitFailedException`` with that record as cause;
``on_delivery`` callbacks hear of failures only; ``send()`` is refused with an
``IllegalStateError`` saying why and what to do; the mode cannot be combined with
tracing or a metrics hook with ``transaction_ended``; ``DualWriter`` and
``ExactlyOnceProcessor`` default to it unless the user set the key or tracing/metrics
count deliveries; ``AsyncTransactionalProducer`` follows its config. On the rig's broker
(read with kafka-python, tests/support/rig.py) and on librdkafka's mock cluster."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError
from opentelemetry.sdk.trace import TracerProvider

from kafka_txn import (
    CommitFailedException,
    ConfigurationError,
    DualWriter,
    FailureType,
    IllegalStateError,
    ProduceFailedException,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)
from kafka_txn.aio import AsyncDualWriter, AsyncTransactionalProducer
from kafka_txn.config import ERROR_REPORTS_ONLY_KEY
from kafka_txn.eos import ExactlyOnceProcessor
from kafka_txn.metrics import InMemoryMetrics
from kafka_txn.testing import ApiKey, MockCluster
from tests.support.rig import Broker

# Every test here picks its mode: error-only unless it says otherwise.
pytestmark = pytest.mark.delivery_reports("errors")

Heard = list[tuple[Any, Any]]


def _listener(heard: Heard) -> Callable[[Any, Any], None]:
    return lambda err, msg: heard.append((err, msg))


def _assert_refused_send(exc: IllegalStateError) -> None:
    message = str(exc)
    assert ERROR_REPORTS_ONLY_KEY in message and "produce()" in message, message
    assert f"'{ERROR_REPORTS_ONLY_KEY}': False" in message, message  # the way to send()


# ------------------------------------------------------------------- the broker
@pytest.mark.guarantee("1.1", "1.20")
def test_an_error_only_producer_commits_what_read_committed_sees(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """Records produced by an error-only producer commit, and an independent
    read_committed consumer sees each once; no callback hears of a delivered record."""
    heard: Heard = []
    with TransactionalProducer({**producer_config, "on_delivery": _listener(heard)}) as p:
        assert p.error_reports_only
        p.init_transactions()
        with p.transaction():
            for i in range(20):
                p.produce(topic, b"v%d" % i, key=b"k%d" % i, on_delivery=_listener(heard))
        assert p.state == "ready"
    seen = broker.read_committed(topic, expected=20)
    assert sorted(seen) == sorted((b"k%d" % i, b"v%d" % i) for i in range(20))
    assert heard == []


@pytest.mark.guarantee("1.2", "1.20")
def test_a_record_the_broker_refuses_fails_the_commit_and_only_the_failure_is_heard(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """A value over its topic's max.message.bytes, refused by the broker: the commit
    raises CommitFailedException whose cause is the record's ProduceFailedException
    (MESSAGE_REJECTED); the config's on_delivery and the record's own on_delivery hear
    that failure, and neither hears of the delivered sibling. Nothing is visible; after
    the abort the producer commits again."""
    limited = broker.create_topic(config={"max.message.bytes": "2000"})
    config_heard: Heard = []
    record_heard: Heard = []
    sibling_heard: Heard = []
    conf = {**producer_config, "on_delivery": _listener(config_heard)}
    with TransactionalProducer(conf) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, b"sibling", on_delivery=_listener(sibling_heard))
        p.produce(limited, b"x" * 20_000, key=b"large", on_delivery=_listener(record_heard))
        with pytest.raises(CommitFailedException) as failed:
            p.commit_transaction()
        cause = failed.value.__cause__
        assert isinstance(cause, ProduceFailedException), repr(cause)
        assert cause.failure_type is FailureType.MESSAGE_REJECTED
        assert cause.code() == KafkaError.MSG_SIZE_TOO_LARGE, cause
        assert (cause.topic, cause.key) == (limited, b"large")
        assert [type(err) for err, _ in record_heard] == [ProduceFailedException]
        assert record_heard[0][0].code() == KafkaError.MSG_SIZE_TOO_LARGE
        assert [err.code() for err, _ in config_heard] == [KafkaError.MSG_SIZE_TOO_LARGE]
        assert sibling_heard == []
        assert p.state == "abortable error"
        p.abort_transaction()
        # The refused record was numbered but never stored: librdkafka mends the gap
        # with an epoch bump (KIP-360), so the next transaction may fail once, abortably.
        for attempt in range(2):
            try:
                with p.transaction():
                    p.produce(topic, b"next")
                break
            except CommitFailedException:
                assert attempt == 0
    assert broker.read_committed(topic, expected=1) == [(None, b"next")]
    assert all(err is not None for err, _ in config_heard), config_heard


@pytest.mark.guarantee("1.2", "1.9", "1.20")
@pytest.mark.parametrize("errors_only", [False, True], ids=["reports", "errors-only"])
def test_a_commit_resumed_after_a_refused_record_fails_and_the_abort_works(
    broker: Broker, producer_config: dict[str, Any], errors_only: bool
) -> None:
    """The broker refuses record 3 of 60 sent one per batch: librdkafka cannot deliver
    the records after it (their sequence numbers follow a refused one), so the commit's
    flush outlasts operation_timeout: TransactionOutcomeUnknownError, "call
    commit_transaction() again". Called again, the commit is resumed inside librdkafka
    and fails with the refused record as its cause; then abort_transaction() works,
    nothing is visible, and the next transaction commits. (Refusing the resumed commit
    at once would leave librdkafka's own commit pending, and every abort refused.)"""
    topic = broker.create_topic(config={"max.message.bytes": "3000"})
    conf = {**producer_config, "linger.ms": 0, "batch.num.messages": 1}
    if errors_only:
        conf[ERROR_REPORTS_ONLY_KEY] = True
    producer = TransactionalProducer(conf, operation_timeout=5)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        values = [b"v%02d" % i for i in range(60)]
        values[3] = b"z" * 5000
        producer.produce_batch(topic, values)
        try:
            producer.commit_transaction()
        except TransactionOutcomeUnknownError:
            assert producer.state == "committing"
            with pytest.raises(CommitFailedException) as info:
                producer.commit_transaction()
        else:
            pytest.fail("committed a transaction with a record the broker refused")
        cause = info.value.__cause__
        assert isinstance(cause, ProduceFailedException), repr(cause)
        assert cause.failure_type is FailureType.MESSAGE_REJECTED
        producer.abort_transaction()
        assert broker.read_committed(topic, expected=0) == []
        for attempt in range(2):  # the first may fail once as out of order (guide)
            producer.begin_transaction()
            producer.produce(topic, b"next")
            try:
                producer.commit_transaction()
                break
            except CommitFailedException:
                producer.abort_transaction()
                assert attempt == 0
        assert broker.read_committed(topic, expected=1) == [(None, b"next")]
    finally:
        producer.close(timeout=5)


@pytest.mark.guarantee("1.20")
def test_an_error_only_dual_writer_commits_and_refuses_send(
    broker: Broker, topic: str, producer_config: dict[str, Any], tmp_path: Path
) -> None:
    """DualWriter's producer is error-only by default (its body hands out no futures):
    tx.produce() commits, tx.send() raises IllegalStateError naming the setting and
    produce(); with ``"delivery.report.only.error": False`` in its producer config
    tx.send() works."""
    base = {k: v for k, v in producer_config.items() if k != ERROR_REPORTS_ONLY_KEY}
    with DualWriter(base, f"jdbc:sqlite:{tmp_path / 'default.sqlite'}") as writer:
        assert writer.producer.error_reports_only
        with writer.transaction() as tx:
            tx.produce(topic, b"produced")
        with pytest.raises(IllegalStateError) as refused, writer.transaction() as tx:
            tx.send(topic, b"never")
        _assert_refused_send(refused.value)
    full = {**base, "transactional.id": base["transactional.id"] + "-full"}
    full[ERROR_REPORTS_ONLY_KEY] = False
    with DualWriter(full, f"jdbc:sqlite:{tmp_path / 'full.sqlite'}") as writer:
        assert not writer.producer.error_reports_only
        with writer.transaction() as tx:
            future = tx.send(topic, b"sent")
        assert future.result(timeout=10).value() == b"sent"
    seen = broker.read_committed(topic, expected=2)
    assert sorted(v for _, v in seen) == [b"produced", b"sent"]


@pytest.mark.guarantee("1.20")
def test_async_error_only_producer_refuses_send_and_commits_produce(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """AsyncTransactionalProducer follows its config: error-only, ``await send()`` and
    ``await send_and_wait()`` raise IllegalStateError, ``await produce()`` commits."""

    async def scenario() -> None:
        producer = AsyncTransactionalProducer(producer_config)
        try:
            assert producer.error_reports_only
            await producer.init_transactions()
            async with producer.transaction():
                with pytest.raises(IllegalStateError) as refused:
                    await producer.send(topic, b"never")
                _assert_refused_send(refused.value)
                with pytest.raises(IllegalStateError):
                    await producer.send_and_wait(topic, b"never")
                await producer.produce(topic, b"produced")
        finally:
            await producer.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert broker.read_committed(topic, expected=1) == [(None, b"produced")]


@pytest.mark.guarantee("1.20")
def test_an_async_dual_writer_is_error_only_by_default(
    broker: Broker, topic: str, producer_config: dict[str, Any], tmp_path: Path
) -> None:
    """AsyncDualWriter inherits DualWriter's default: its producer is error-only,
    ``await tx.produce()`` in its body commits and ``await tx.send()`` raises
    IllegalStateError naming the setting and produce()."""
    base = {k: v for k, v in producer_config.items() if k != ERROR_REPORTS_ONLY_KEY}

    async def scenario() -> None:
        async with AsyncDualWriter(base, f"jdbc:sqlite:{tmp_path / 'db.sqlite'}") as writer:
            assert writer.producer.error_reports_only
            async with writer.transaction() as tx:
                await tx.produce(topic, b"produced")
            with pytest.raises(IllegalStateError) as refused:
                async with writer.transaction() as tx:
                    await tx.send(topic, b"never")
            _assert_refused_send(refused.value)

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert broker.read_committed(topic, expected=1) == [(None, b"produced")]


# ------------------------------------------------------------- the mock cluster
@pytest.mark.guarantee("1.2", "1.20")
def test_send_is_refused_and_produce_commits_on_the_mock_cluster(
    mock_cluster: MockCluster, mock_config: Callable[..., dict[str, Any]]
) -> None:
    """send() on an error-only producer raises IllegalStateError saying why, naming
    delivery.report.only.error and produce(), whatever the state; nothing is recorded
    against the transaction, which commits what produce() sent."""
    mock_cluster.create_topic("t", partitions=1)
    with TransactionalProducer(mock_config(), operation_timeout=30) as p:
        with pytest.raises(IllegalStateError) as before:
            p.send("t", b"before init")
        _assert_refused_send(before.value)
        p.init_transactions()
        p.begin_transaction()
        with pytest.raises(IllegalStateError) as inside:
            p.send("t", b"v", partition=0)
        _assert_refused_send(inside.value)
        p.produce("t", b"v", partition=0)
        p.commit_transaction()
        assert p.state == "ready"


@pytest.mark.guarantee("1.2", "1.20")
def test_a_failed_delivery_on_the_mock_cluster_is_classified_and_heard_alone(
    mock_cluster: MockCluster, mock_config: Callable[..., dict[str, Any]]
) -> None:
    """Produce answered NOT_ENOUGH_REPLICAS until the retries run out: the commit raises
    CommitFailedException whose cause is the record's ProduceFailedException
    (DELIVERY_FAILED, its topic, partition and key); the config's and the record's
    on_delivery hear that failure, and never the delivered records before it."""
    mock_cluster.create_topic("t", partitions=1, replication_factor=3)
    config_heard: Heard = []
    record_heard: Heard = []
    conf = {**mock_config(message_send_max_retries=2), "on_delivery": _listener(config_heard)}
    with TransactionalProducer(conf, operation_timeout=30) as p:
        p.init_transactions()
        p.begin_transaction()
        for i in range(5):
            p.produce("t", b"ok-%d" % i, partition=0, on_delivery=_listener(record_heard))
        assert p.flush(10) == 0
        mock_cluster.push_request_errors(ApiKey.PRODUCE, *[KafkaError.NOT_ENOUGH_REPLICAS] * 3)
        p.produce("t", b"fails", key=b"k1", partition=0, on_delivery=_listener(record_heard))
        with pytest.raises(CommitFailedException) as failed:
            p.commit_transaction()
        cause = failed.value.__cause__
        assert isinstance(cause, ProduceFailedException), repr(cause)
        assert cause.failure_type is FailureType.DELIVERY_FAILED
        assert cause.code() == KafkaError.NOT_ENOUGH_REPLICAS
        assert (cause.topic, cause.partition, cause.key) == ("t", 0, b"k1")
        assert len(record_heard) == 1 and len(config_heard) == 1, (record_heard, config_heard)
        for err, _ in record_heard + config_heard:
            assert isinstance(err, ProduceFailedException)
            assert err.code() == KafkaError.NOT_ENOUGH_REPLICAS
        p.abort_transaction()


@pytest.mark.parametrize(
    ("value", "errors_only"),
    [(True, True), ("true", True), ("1", True), (False, False), ("false", False)],
    ids=["True", "true", "1", "False", "false"],
)
def test_every_boolean_spelling_selects_the_mode(
    mock_config: Callable[..., dict[str, Any]], value: object, errors_only: bool
) -> None:
    """The key is read as confluent-kafka reads it: any boolean spelling."""
    conf = {**mock_config(), ERROR_REPORTS_ONLY_KEY: value}
    with TransactionalProducer(conf) as p:
        assert p.error_reports_only is errors_only


class _Ended(InMemoryMetrics):
    """A metrics hook with ``transaction_ended`` (InMemoryMetrics has it)."""


@pytest.mark.guarantee("1.20")
@pytest.mark.parametrize("watch", ["tracing", "metrics"])
def test_error_only_cannot_be_traced_or_counted(
    mock_config: Callable[..., dict[str, Any]], watch: str
) -> None:
    """Tracing and a metrics hook's transaction_ended count each transaction's
    delivered records, which needs every report: combined with error-only, the
    producer refuses to be built (ConfigurationError naming the key)."""
    assert callable(getattr(InMemoryMetrics(), "transaction_ended", None))
    kwargs: dict[str, Any] = (
        {"tracing": TracerProvider()} if watch == "tracing" else {"metrics": _Ended()}
    )
    with pytest.raises(ConfigurationError, match=ERROR_REPORTS_ONLY_KEY):
        TransactionalProducer(mock_config(), **kwargs)


@pytest.mark.guarantee("1.20")
@pytest.mark.delivery_reports("all")
@pytest.mark.parametrize("watch", ["tracing", "metrics"])
def test_a_traced_or_counted_dual_writer_keeps_every_report(
    mock_config: Callable[..., dict[str, Any]], tmp_path: Path, watch: str
) -> None:
    """DualWriter's error-only default gives way to tracing or a metrics hook with
    transaction_ended (which count delivered records): its producer hears of every
    delivery; the key set explicitly either way is the user's. The same for the
    async writer, which inherits DualWriter's default."""
    kwargs: dict[str, Any] = (
        {"tracing": TracerProvider()} if watch == "tracing" else {"metrics": _Ended()}
    )
    url = f"jdbc:sqlite:{tmp_path / 'db.sqlite'}"
    with DualWriter(mock_config(), url, **kwargs) as writer:
        assert not writer.producer.error_reports_only
    with DualWriter(mock_config(), url) as writer:
        assert writer.producer.error_reports_only
    with DualWriter({**mock_config(), ERROR_REPORTS_ONLY_KEY: False}, url) as writer:
        assert not writer.producer.error_reports_only
    heard: list[Any] = []
    with DualWriter({**mock_config(), "on_delivery": heard.append}, url) as writer:
        assert not writer.producer.error_reports_only  # the user's callback hears all
    with pytest.raises(ConfigurationError, match=ERROR_REPORTS_ONLY_KEY):
        DualWriter({**mock_config(), ERROR_REPORTS_ONLY_KEY: True}, url, **kwargs)

    async def in_loop() -> tuple[bool, bool]:
        defaulted = AsyncDualWriter(mock_config(), url)
        watched = AsyncDualWriter(mock_config(), url, **kwargs)
        try:
            return defaulted.producer.error_reports_only, watched.producer.error_reports_only
        finally:
            await defaulted.close()
            await watched.close()

    assert asyncio.run(asyncio.wait_for(in_loop(), 60)) == (True, False)


@pytest.mark.guarantee("1.20")
@pytest.mark.delivery_reports("all")
def test_the_exactly_once_processor_is_error_only_by_default(
    mock_cluster: MockCluster, mock_config: Callable[..., dict[str, Any]]
) -> None:
    """ExactlyOnceProcessor hands out no futures: its producer is error-only unless the
    user set the key or a metrics hook counts deliveries."""
    consumer = {"bootstrap.servers": mock_cluster.bootstrap_servers, "group.id": "g"}

    def processor(conf: dict[str, Any], **kwargs: Any) -> bool:
        made = ExactlyOnceProcessor(consumer, conf, ["t"], lambda m: [], **kwargs)
        try:
            return made.producer.error_reports_only
        finally:
            made.close()

    assert processor(mock_config())
    assert not processor({**mock_config(), ERROR_REPORTS_ONLY_KEY: False})
    assert not processor(mock_config(), metrics=_Ended())


@pytest.mark.guarantee("1.20")
def test_a_delivered_error_only_transaction_leaves_nothing_behind(
    mock_cluster: MockCluster, mock_config: Callable[..., dict[str, Any]]
) -> None:
    """100,000 records, each with its own on_delivery, committed by an error-only
    producer: once delivered, no per-record state is left (confluent-kafka frees each
    record's callback state in dr_msg_cb even though it drops the report): every
    callback is freed, and the Python object count and the memory Python allocated are
    back near the baseline taken after a warm-up transaction."""
    mock_cluster.create_topic("t", partitions=3)
    records = 100_000
    with TransactionalProducer(mock_config(), operation_timeout=60) as p:
        assert p.error_reports_only
        p.init_transactions()
        with p.transaction():  # warm-up: caches, interned names, librdkafka's buffers
            for _ in range(1000):
                p.produce("t", b"warm", on_delivery=lambda err, msg: None)
        gc.collect()
        objects = len(gc.get_objects())
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            sampled: list[weakref.ref[Callable[[Any, Any], None]]] = []
            heard: Heard = []
            with p.transaction():
                for i in range(records):

                    def on_delivery(err: Any, msg: Any) -> None:
                        heard.append((err, msg))

                    if i % 1000 == 0:
                        sampled.append(weakref.ref(on_delivery))
                    p.produce("t", b"%d" % i, on_delivery=on_delivery)
                del on_delivery
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert heard == []
        alive = [ref for ref in sampled if ref() is not None]
        assert alive == [], f"{len(alive)} of {len(sampled)} sampled callbacks still held"
        # Leaking one closure per record would be ~100,000 objects and >10 MB; the
        # bounds leave room for allocator and interpreter noise only.
        assert len(gc.get_objects()) - objects < 1000, len(gc.get_objects()) - objects
        assert grown < 1_000_000, grown
