"""Error paths on librdkafka's mock cluster: which errors kill the producer, which abort
the transaction, and which are retried until commit succeeds. Each test that builds its
producer from ``mock_config`` runs in both delivery modes (tests/fixtures/
delivery_reports.py): with every delivery report, and error-only
(``delivery.report.only.error``), where a failed record is classified the same way and
``send()`` is refused, so records are produced and flushed instead."""

from __future__ import annotations

import gc
import random
import re
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kafka_txn import (
    CommitFailedException,
    ErrorCategory,
    FailureType,
    FatalError,
    IllegalStateError,
    KafkaTxnError,
    ProduceFailedException,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)
from kafka_txn.testing import ApiKey, MockCluster

pytestmark = [pytest.mark.mock, pytest.mark.delivery_reports("all", "errors")]


def _ready(conf: dict) -> TransactionalProducer:
    p = TransactionalProducer(conf, operation_timeout=30)
    p.init_transactions()
    return p


def _deliver(p: TransactionalProducer, topic: str, value: bytes, partition: int) -> None:
    """One record of the open transaction, delivered before this returns: through a
    ``send()`` future when the producer hears of every delivery, else (error-only, where
    ``send()`` is refused) ``produce()`` with a per-record callback, which hears of a
    failure only, and ``flush()``."""
    if not p.error_reports_only:
        p.send(topic, value, partition=partition).result(timeout=10)
        return
    failed: list[Any] = []
    p.produce(topic, value, partition=partition, on_delivery=lambda err, msg: failed.append(err))
    assert p.flush(10) == 0
    assert failed == []


def _delivery_failure(
    p: TransactionalProducer, topic: str, value: bytes, key: bytes, partition: int
) -> ProduceFailedException:
    """The failure of one record expected to fail: from its ``send()`` future, or
    (error-only) from its per-record ``on_delivery``, which an error-only producer
    still calls for a failed record."""
    if not p.error_reports_only:
        failure = p.send(topic, value, key=key, partition=partition).exception(timeout=30)
        assert isinstance(failure, ProduceFailedException), repr(failure)
        return failure
    heard: list[Any] = []
    p.produce(topic, value, key=key, partition=partition, on_delivery=lambda e, m: heard.append(e))
    p.flush(30)
    assert len(heard) == 1 and isinstance(heard[0], ProduceFailedException), heard
    return heard[0]


@pytest.mark.parametrize(
    ("code", "fenced"),
    [
        (KafkaError.PRODUCER_FENCED, True),
        (KafkaError.INVALID_PRODUCER_EPOCH, True),
        (KafkaError.INVALID_TXN_STATE, False),
        (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, False),
    ],
)
@pytest.mark.guarantee("1.3")
def test_fatal_end_txn_errors_kill_the_producer(mock_cluster, mock_config, code, fenced):
    p = _ready(mock_config())
    p.begin_transaction()
    p.produce("t", b"v", partition=0)
    mock_cluster.push_request_errors(ApiKey.END_TXN, code)

    with pytest.raises(FatalError) as info:
        p.commit_transaction()
    exc = info.value
    assert exc.category is ErrorCategory.FATAL
    assert isinstance(exc, ProducerFencedError) is fenced
    assert exc.kafka_error.code() in (code, KafkaError._FENCED)
    assert exc.__cause__ is not None and exc.__cause__.__cause__ is None

    # Every later call raises the same fatal error until close().
    for call in (p.begin_transaction, p.abort_transaction, p.flush, lambda: p.produce("t", b"x")):
        with pytest.raises(FatalError) as again:
            call()
        assert again.value is exc
    p.close()
    with pytest.raises(FatalError):
        p.begin_transaction()


def test_not_enough_replicas_until_retries_run_out(mock_cluster, mock_config):
    mock_cluster.create_topic("t", partitions=1, replication_factor=3)
    p = _ready(mock_config(message_send_max_retries=2))
    p.begin_transaction()
    mock_cluster.push_request_errors(ApiKey.PRODUCE, *[KafkaError.NOT_ENOUGH_REPLICAS] * 3)
    failure = _delivery_failure(p, "t", b"v", key=b"k1", partition=0)
    assert failure.failure_type is FailureType.DELIVERY_FAILED
    assert failure.kafka_error.code() == KafkaError.NOT_ENOUGH_REPLICAS
    assert (failure.topic, failure.partition, failure.key) == ("t", 0, b"k1")

    with pytest.raises(CommitFailedException) as info:
        p.commit_transaction()
    assert info.value.__cause__ is failure
    assert info.value.kafka_error.code() == KafkaError.NOT_ENOUGH_REPLICAS

    # Only abort is allowed now; after it the producer is usable again.
    with pytest.raises(IllegalStateError):
        p.begin_transaction()
    p.abort_transaction()
    # The failed record left a sequence gap that librdkafka discovers on the next
    # Produce and mends with an epoch bump (KIP-360): the next transaction may fail once
    # more, abortably, and the one after commits.
    for attempt in range(2):
        try:
            with p.transaction():
                p.produce("t", b"next", partition=0)
            break
        except CommitFailedException as exc:
            assert attempt == 0
            assert exc.kafka_error.code() == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert p.state == "ready"
    p.close()


@pytest.mark.parametrize(
    "codes",
    [
        [KafkaError.COORDINATOR_NOT_AVAILABLE] * 3,
        [KafkaError.CONCURRENT_TRANSACTIONS] * 3,
        [KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.CONCURRENT_TRANSACTIONS],
    ],
)
@pytest.mark.guarantee("1.3")
def test_retriable_end_txn_errors_commit_after_retries(mock_cluster, mock_config, codes):
    p = _ready(mock_config())
    p.begin_transaction()
    delivered: list[Any] = []
    if p.error_reports_only:  # no success report: a failure would fail the commit
        p.produce("t", b"v", partition=0, on_delivery=lambda e, m: delivered.append(e))
    else:
        future = p.send("t", b"v", partition=0)
    mock_cluster.push_request_errors(ApiKey.END_TXN, *codes)
    p.commit_transaction()
    if p.error_reports_only:
        assert delivered == []
    else:
        assert future.result(timeout=1).value() == b"v"
    assert p.state == "ready"
    p.close()


@pytest.mark.guarantee("1.1")
def test_abort_purges_queued_records_as_transaction_failed(mock_cluster, mock_config):
    mock_cluster.set_broker_down(1)
    mock_cluster.set_broker_down(2)
    mock_cluster.set_broker_down(3)
    p = TransactionalProducer(mock_config(), operation_timeout=5)
    mock_cluster.set_broker_down(1, down=False)
    mock_cluster.set_broker_down(2, down=False)
    mock_cluster.set_broker_down(3, down=False)
    p.init_transactions()
    p.begin_transaction()
    seen: list = []
    p.produce("t", b"v", partition=0, on_delivery=lambda err, msg: seen.append(err))
    p.abort_transaction()
    p.poll(0)
    # The record was either delivered before the abort or purged by it; an error-only
    # producer hears of the purge only.
    if p.error_reports_only:
        assert len(seen) <= 1 and None not in seen, seen
    else:
        assert len(seen) == 1
    if seen and seen[0] is not None:
        assert seen[0].failure_type is FailureType.TRANSACTION_FAILED
    # Nothing of the aborted transaction counts against the next one.
    with p.transaction():
        p.produce("t", b"w", partition=0)
    p.close()


@pytest.mark.guarantee("1.2")
def test_produce_after_an_unseen_record_failure_is_abortable_not_fatal(mock_cluster, mock_config):
    """librdkafka refuses produce() with _STATE once a record failed in the background;
    that is the transaction failing, not the producer dying: produce() raises the
    transaction's TransactionAbortableError, its cause the record that failed it (never
    a failure of the innocent record at hand), and the commit is refused."""
    mock_cluster.create_topic("t", partitions=1, replication_factor=3)
    p = _ready(mock_config(message_send_max_retries=1))
    p.begin_transaction()
    mock_cluster.push_request_errors(ApiKey.PRODUCE, *[KafkaError.NOT_ENOUGH_REPLICAS] * 2)
    p.produce("t", b"fails", partition=0)
    # Wait for librdkafka to fail the record, without serving the report.
    deadline = time.monotonic() + 10
    raised = None
    while raised is None and time.monotonic() < deadline:
        try:
            p.produce("t", b"next", partition=0)
            time.sleep(0.05)
        except TransactionAbortableError as exc:
            raised = exc
    assert raised is not None and raised.category is ErrorCategory.ABORTABLE
    assert not isinstance(raised, ProduceFailedException)
    culprit = raised.__cause__
    assert isinstance(culprit, ProduceFailedException)
    assert culprit.kafka_error.code() == KafkaError.NOT_ENOUGH_REPLICAS
    with pytest.raises(CommitFailedException) as info:
        p.commit_transaction()
    assert info.value.kafka_error.code() == KafkaError.NOT_ENOUGH_REPLICAS
    p.abort_transaction()
    p.close()


@pytest.mark.guarantee("1.2")
def test_full_queue_waits_for_room_then_fails_the_record(mock_cluster, mock_config):
    p = TransactionalProducer(
        mock_config(queue_buffering_max_messages=2), operation_timeout=30, queue_full_timeout=0.5
    )
    p.init_transactions()
    p.begin_transaction()
    for i in range(50):  # room is made by serving delivery reports: all get through
        p.produce("t", b"%d" % i, partition=0)
    for broker_id in (1, 2, 3):  # now nothing can be delivered, so no room is made
        mock_cluster.set_broker_down(broker_id)
    failure = None
    for i in range(3):  # at most two records fit in the queue
        try:
            p.produce("t", b"no room", key=b"k%d" % i, partition=0)
        except ProduceFailedException as exc:
            failure = exc
            break
    assert failure is not None, "a full queue must fail the record after queue_full_timeout"
    assert failure.kafka_error.code() == KafkaError._QUEUE_FULL
    assert failure.failure_type is FailureType.DELIVERY_FAILED
    assert failure.key == b"k%d" % i
    with pytest.raises(CommitFailedException) as commit:
        p.commit_transaction(timeout=5)
    assert commit.value.__cause__ is failure
    for broker_id in (1, 2, 3):
        mock_cluster.set_broker_down(broker_id, down=False)
    p.abort_transaction()
    p.close()


# ---------------------------------------------------------------- deadlines and retries
def _in_flight_commit(mock_config, sleep=time.sleep) -> TransactionalProducer:
    """A producer whose transaction holds a delivered record, so that its commit needs
    EndTxn from the coordinator."""
    p = TransactionalProducer(mock_config(), operation_timeout=30, sleep=sleep)
    p.init_transactions()
    p.begin_transaction()
    _deliver(p, "t", b"v", partition=0)
    return p


@pytest.mark.adversary
@pytest.mark.parametrize("fault", ["brokers_down", "coordinator_loading"])
@pytest.mark.guarantee("1.9")
def test_commit_outlasting_its_deadline_is_unknown_and_never_aborted(
    mock_cluster, mock_config, fault
):
    """The coordinator cannot be reached (every broker down) or keeps answering EndTxn
    with a retriable error: commit_transaction(timeout=1) raises
    TransactionOutcomeUnknownError after retrying EndTxn until then (counted at the
    brokers), abort_transaction() is refused (the broker may have committed) and changes
    nothing, and commit_transaction() called again once the coordinator answers commits."""
    mock_cluster.create_topic("t", partitions=1)
    mock_cluster.track_requests()
    p = _in_flight_commit(mock_config)
    if fault == "brokers_down":
        for broker_id in (1, 2, 3):
            mock_cluster.set_broker_down(broker_id)
    else:
        mock_cluster.push_request_errors(
            ApiKey.END_TXN, *[KafkaError.COORDINATOR_LOAD_IN_PROGRESS] * 1000
        )
    with pytest.raises(TransactionOutcomeUnknownError) as info:
        p.commit_transaction(timeout=1.0)
    assert info.value.operation == "commit_transaction"
    assert info.value.category is ErrorCategory.RETRIABLE
    assert "do not abort" in str(info.value)
    tried = mock_cluster.requests(ApiKey.END_TXN)
    if fault == "coordinator_loading":
        assert tried > 1, "EndTxn was not retried"  # librdkafka retries until the deadline
    assert p.state == "committing"
    with pytest.raises(IllegalStateError, match="never abort"):
        p.abort_transaction()
    assert p.state == "committing" and p.in_transaction
    if fault == "brokers_down":
        for broker_id in (1, 2, 3):
            mock_cluster.set_broker_down(broker_id, down=False)
    else:
        mock_cluster.clear_request_errors(ApiKey.END_TXN)
    p.commit_transaction()  # the same commit, resumed: not a new transaction
    assert p.state == "ready"
    assert mock_cluster.requests(ApiKey.END_TXN) > tried
    assert mock_cluster.requests(ApiKey.INIT_PRODUCER_ID) == 1  # never re-initialised
    p.close()


def test_offsets_outlasting_their_deadline_make_the_transaction_abortable(
    mock_cluster, mock_config
):
    """AddOffsetsToTxn keeps answering a retriable error past send_offsets_to_transaction's
    timeout: whether the offsets joined the transaction is unknown, so it must not commit.
    The error is abortable and says only that (never "call it again", which would send the
    offsets a second time into a transaction that cannot commit); abort, then the same
    offsets in a new transaction commit."""
    mock_cluster.create_topic("t", partitions=1)
    consumer = Consumer({"bootstrap.servers": mock_cluster.bootstrap_servers, "group.id": "g"})
    p = _ready(mock_config())
    try:
        offsets = [TopicPartition("t", 0, 1)]
        p.begin_transaction()
        _deliver(p, "t", b"v", partition=0)
        mock_cluster.push_request_errors(
            ApiKey.ADD_OFFSETS_TO_TXN, *[KafkaError.COORDINATOR_LOAD_IN_PROGRESS] * 1000
        )
        with pytest.raises(TransactionAbortableError) as info:
            p.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 1.0)
        message = str(info.value)
        assert "abort the transaction" in message and "again" not in message, message
        assert p.state == "abortable error"
        with pytest.raises(CommitFailedException):
            p.commit_transaction()
        mock_cluster.clear_request_errors(ApiKey.ADD_OFFSETS_TO_TXN)
        p.abort_transaction()
        p.begin_transaction()
        p.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())
        p.commit_transaction()
        assert p.state == "ready"
    finally:
        p.close()
        consumer.close()


@pytest.mark.guarantee("1.9")
def test_retriable_errors_are_retried_with_backoff_until_operation_timeout(
    mock_cluster, mock_config, txn_id
):
    """kafka-txn's own retry loop (tenacity, kafka_txn/producer/librdkafka.py), which runs when
    librdkafka hands back a retriable error before the call's deadline (librdkafka
    retries coordinator errors itself until then: rdkafka_txnmgr.c). Here its EndTxn is
    refused locally at once, because the coordinator does not announce EndTxn
    (_UNSUPPORTED_FEATURE, flagged retriable): each try is counted by the injected
    sleep between tries. The pauses grow exponentially from 50 ms, none runs past
    operation_timeout, and then TransactionOutcomeUnknownError is raised. Once the
    coordinator announces EndTxn again (after a reconnect), the same loop commits."""
    mock_cluster.create_topic("t", partitions=1)
    mock_cluster.set_coordinator("transaction", txn_id, 1)
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        time.sleep(seconds)

    p = TransactionalProducer(mock_config(), operation_timeout=2.0, sleep=sleep)
    mock_cluster.set_api_version(ApiKey.END_TXN, -1, -1)
    p.init_transactions()
    p.begin_transaction()
    _deliver(p, "t", b"v", partition=0)
    with pytest.raises(TransactionOutcomeUnknownError) as info:
        p.commit_transaction()
    assert info.value.kafka_error.code() == KafkaError._UNSUPPORTED_FEATURE
    assert "within 2s" in str(info.value)
    # Tried len(pauses) + 1 times, with exponential backoff (tenacity's
    # wait_exponential(0.05, max=1) plus up to 50 ms of jitter); the last pause may be
    # cut short by the deadline, and no pause runs past it.
    assert len(pauses) >= 3, pauses
    for attempt, pause in enumerate(pauses[:-1]):
        base = min(0.05 * 2**attempt, 1.0)
        assert base <= pause <= base + 0.05, (attempt, pauses)
    assert sum(pauses) <= 2.0, pauses
    with pytest.raises(IllegalStateError):
        p.abort_transaction()
    # The coordinator announces EndTxn again; librdkafka learns it on reconnecting.
    mock_cluster.set_api_version(ApiKey.END_TXN, 0, 3)
    mock_cluster.set_broker_down(1)
    mock_cluster.set_broker_down(1, down=False)
    p.commit_transaction(timeout=60)
    assert p.state == "ready"
    p.close()


class _Held:
    """An object only a caller's frame refers to."""


@pytest.mark.guarantee("1.11")
def test_a_retried_call_lets_go_of_its_callers_frames(mock_cluster, mock_config, txn_id):
    """A commit that kafka-txn retries (EndTxn refused at once with the retriable
    _UNSUPPORTED_FEATURE, as in the test above) pins nothing once its exception is
    dropped: what the calling frame held is freed. confluent-kafka's KafkaError type
    claims Py_TPFLAGS_BASE_EXC_SUBCLASS, so on CPython 3.11 a KafkaException raised while
    another exception is being handled stores the handled one, with its traceback and
    every frame above it, in a KafkaError that is never freed: retries made inside an
    ``except`` block kept the caller's frames (a producer, a connection) for good."""
    mock_cluster.create_topic("t", partitions=1)
    mock_cluster.set_coordinator("transaction", txn_id, 1)
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        time.sleep(seconds)

    p = TransactionalProducer(mock_config(), operation_timeout=30, sleep=sleep)
    mock_cluster.set_api_version(ApiKey.END_TXN, -1, -1)
    p.init_transactions()
    p.begin_transaction()
    _deliver(p, "t", b"v", partition=0)

    def commit_holding(held: _Held) -> str:
        try:
            p.commit_transaction(timeout=2.5)  # tries for 1.5 s, then the floor
        except TransactionOutcomeUnknownError as exc:
            return exc.operation
        return "committed"

    held = _Held()
    freed = weakref.ref(held)
    assert commit_holding(held) == "commit_transaction"
    assert pauses, "the commit was not retried"
    del held
    gc.collect()
    assert freed() is None, "the caller's frame is still held"
    mock_cluster.set_api_version(ApiKey.END_TXN, 0, 3)
    mock_cluster.set_broker_down(1)
    mock_cluster.set_broker_down(1, down=False)
    p.commit_transaction(timeout=60)
    p.close()


@pytest.mark.parametrize(
    ("budget", "took", "tries"),
    [
        (5.0, 0.125, 9),  # short tries: the last pause is cut, the last retry gets 1 s
        (5.0, 1.5, 3),  # long tries: the second retry gets what is left, ~1.9 s
        (2.0, 0.75, 2),  # one retry, with 1.25 s
        (2.0, 1.25, 1),  # the first try leaves 0.75 s: no retry, the outcome is unknown
    ],
)
@pytest.mark.guarantee("1.9")
def test_every_retry_gets_the_floor_and_none_starts_with_less_left(
    mock_cluster, mock_config, txn_id, monkeypatch, budget, took, tries
):
    """The retry floor (kafka_txn/producer/librdkafka.py, _RETRY_FLOOR_S): a retry of a
    transactional call is given at least 1 s by librdkafka's timeout, and none starts
    with less than 1 s of the call's budget left; then the outcome stays unknown
    (TransactionOutcomeUnknownError naming the operation). A resumed
    commit_transaction() given 1 ms once made librdkafka assert and abort the process.
    A real Driver over a real producer whose EndTxn is refused at once (retriable
    _UNSUPPORTED_FEATURE); time is a fake clock (time.monotonic, which tenacity reads
    too) that each try advances by ``took`` and each pause by its length, and the
    pauses' jitter is fixed, so the timeouts librdkafka is given are exact."""
    from kafka_txn.producer.librdkafka import _RETRY_FLOOR_S

    floor = _RETRY_FLOOR_S

    mock_cluster.create_topic("t", partitions=1)
    mock_cluster.set_coordinator("transaction", txn_id, 1)
    now = [1000.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    p = TransactionalProducer(mock_config(), operation_timeout=30, sleep=sleep)
    mock_cluster.set_api_version(ApiKey.END_TXN, -1, -1)
    p.init_transactions()
    p.begin_transaction()
    _deliver(p, "t", b"v", partition=0)
    driver = p._io
    deadline = now[0] + budget
    given: list[tuple[float, float]] = []  # (librdkafka's timeout, budget left at the start)

    def commit(timeout: float) -> None:
        given.append((timeout, deadline - now[0]))
        now[0] += took
        driver.producer.commit_transaction(timeout)  # refused at once

    with monkeypatch.context() as patch, pytest.raises(TransactionOutcomeUnknownError) as info:
        patch.setattr(time, "monotonic", lambda: now[0])
        patch.setattr(random, "random", lambda: 0.5)  # tenacity's jitter: 25 ms
        driver.retrying("commit_transaction", commit, budget)
    assert info.value.operation == "commit_transaction"
    assert info.value.kafka_error.code() == KafkaError._UNSUPPORTED_FEATURE
    assert f"within {budget:g}s" in str(info.value)
    assert len(given) == tries, given
    assert given[0] == (budget, budget)  # the first try: the whole budget
    for timeout, left in given[1:]:
        assert timeout >= floor, given
        assert left >= floor - 1e-9, given  # float sums of the fake clock's steps
        assert timeout == max(floor, left), given
    # Retried until no retry could start with the floor left.
    assert given[-1][1] - took < floor, given
    mock_cluster.set_api_version(ApiKey.END_TXN, 0, 3)
    mock_cluster.set_broker_down(1)
    mock_cluster.set_broker_down(1, down=False)
    p.commit_transaction(timeout=60)
    p.close()


_HELD_END_TXN_APP = r"""
import logging, sys, uuid
from kafka_txn import TransactionalProducer, TransactionOutcomeUnknownError
from kafka_txn.testing import ApiKey, MockCluster

logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(message)s")
hold_ms, budget = int(sys.argv[1]), float(sys.argv[2])
with MockCluster(brokers=1) as cluster:
    cluster.create_topic("t", partitions=1)
    txn_id = uuid.uuid4().hex
    conf = {"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": txn_id,
            "debug": "eos"}
    p = TransactionalProducer(conf, operation_timeout=30)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"v", partition=0).result(timeout=10)
    cluster.delay_replies(1, ApiKey.END_TXN, hold_ms)
    outcome = "committed"
    try:
        p.commit_transaction(timeout=budget)
    except TransactionOutcomeUnknownError as exc:
        outcome = "unknown " + exc.operation
    print(outcome, flush=True)
    p.commit_transaction(timeout=30)  # resumed while the reply is still held
    print("committed", p.state, flush=True)
    p.close()
"""


@pytest.mark.adversary
@pytest.mark.guarantee("1.9")
def test_a_commit_whose_end_txn_reply_is_held_past_its_budget_is_resumed_safely():
    """End to end, in a child process (librdkafka's assertion aborts the process): the
    coordinator holds its EndTxn reply (2 s) past commit_transaction(timeout=0.5). The
    call raises TransactionOutcomeUnknownError without a retry (less than the 1 s floor
    is left), the process lives on when the reply arrives, and commit_transaction()
    called again commits. The timeouts librdkafka is given are read from its own debug
    log ("API timeout"): the first call's 0.5 s, then the resumed call's 30 s, and no
    short retry in between. Before the floor a 1 ms retry followed the first call; when librdkafka's
    main thread did not take up that resumed call within 1 ms, the call gave up its
    claim on the commit, and the EndTxn reply then hit "BUG: Invalid transaction state
    transition ... CommittingTransaction -> AbortedNotAcked" and abort(): a race, so
    this test asserts the call that opens it rather than the crash."""
    root = Path(__file__).resolve().parent.parent.parent
    child = subprocess.run(
        [sys.executable, "-c", _HELD_END_TXN_APP, "2000", "0.5"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "BUG" not in child.stderr
    assert child.stdout.splitlines() == ["unknown commit_transaction", "committed ready"]
    timeouts = re.findall(
        r"Transactional API called: commit_transaction \(.*?API timeout (-?\d+)\)", child.stderr
    )
    # The first call gets what is left of its 0.5 s, the resumed one of its 30 s (ms,
    # rounded down): no call in between, none shorter than the floor after the first.
    assert len(timeouts) == 2, timeouts
    assert 0 < int(timeouts[0]) <= 500 and 1000 <= int(timeouts[1]) <= 30000, timeouts


@pytest.mark.adversary
@pytest.mark.parametrize(
    "answer",
    [
        KafkaError.TRANSACTION_ABORTABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.UNKNOWN,
    ],
    ids=["TRANSACTION_ABORTABLE", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "UNKNOWN"],
)
@pytest.mark.guarantee("1.3")
def test_an_abort_refused_with_an_abortable_error_leaves_a_usable_producer(
    mock_cluster: MockCluster, mock_config: Callable[..., dict[str, Any]], answer: int
) -> None:
    """EndTxn(abort) answered with an error librdkafka calls abortable (not fatal): the
    abort did not complete and librdkafka can abort again, so abort_transaction() raises
    TransactionOutcomeUnknownError saying to call it again (docs/reference/errors.md: "from
    abort_transaction(): call the same method again"), the producer stays 'aborting',
    the second abort succeeds and the next transaction commits. (The mock cluster does
    not hide aborted records from read_committed readers, and the broker cannot be made
    to answer EndTxn so: librdkafka reaches the coordinator over its broker connection,
    not through the fault proxy.)"""
    mock_cluster.create_topic("orders", partitions=1)
    with TransactionalProducer(mock_config(), operation_timeout=10) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce("orders", b"to-abort")
        assert producer.flush(10) == 0
        mock_cluster.push_request_errors(ApiKey.END_TXN, answer)
        with pytest.raises(KafkaTxnError) as refused:
            producer.abort_transaction()
        # Promised (1.3, errors.md): the category follows the table, which says
        # abortable; FatalError means "the producer is unusable".
        exc = refused.value
        assert isinstance(exc, TransactionOutcomeUnknownError), repr(exc)
        assert not isinstance(exc, FatalError) and not exc.fatal(), repr(exc)
        assert exc.code() == answer and exc.operation == "abort_transaction"
        assert "call abort_transaction() again" in str(exc), str(exc)
        assert type(exc.__cause__) is KafkaException and exc.__cause__.__cause__ is None
        assert producer.state == "aborting"
        producer.abort_transaction()  # again, as the error says
        assert producer.state == "ready"
        producer.begin_transaction()
        producer.produce("orders", b"next")
        producer.commit_transaction()
        assert producer.state == "ready"
