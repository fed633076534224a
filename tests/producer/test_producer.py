"""TransactionalProducer against what a user's code does around it: a delivery callback
that raises while commit, abort or close serves it, and sends under way in other threads
when commit or abort starts; close() after an init that timed out or a fatal error."""

from __future__ import annotations

import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from kafka_txn import (
    BrokerUnreachableError,
    CommitFailedException,
    IllegalStateError,
    ProduceFailedException,
    ProducerFencedError,
    TransactionalProducer,
)
from tests.support.rig import Broker

pytestmark = pytest.mark.broker


class CallbackBugError(Exception):
    """A bug in the application's delivery callback."""


def _raising_callback(err: Any, msg: Any) -> None:
    raise CallbackBugError("bug in the application's callback")


def _values(broker: Broker, topic: str, expected: int) -> list[bytes | None]:
    return [value for _, value in broker.read_committed(topic, expected)]


def _note(exc: BaseException) -> str:
    return " ".join(getattr(exc, "__notes__", ()))


# ---------------------------------------------------------------- callbacks that raise
@pytest.mark.guarantee("1.7")
def test_a_commit_that_succeeded_is_not_undone_by_a_callback_that_raises(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """commit_transaction() serves the record's report inside librdkafka's commit, which
    succeeds; the callback's exception is raised after the producer is ready again, with
    a note saying the commit succeeded, so nothing leads to an abort and a retry that
    would write the record twice."""
    topic = broker.create_topic(partitions=1)
    with TransactionalProducer(producer_config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"order-1", on_delivery=_raising_callback)
        with pytest.raises(CallbackBugError) as info:
            producer.commit_transaction()
        assert "commit_transaction() succeeded" in _note(info.value)
        assert producer.state == "ready"
        with pytest.raises(IllegalStateError, match="no transaction is open"):
            producer.commit_transaction()  # never a CommitFailedException ("abort, retry")
        producer.begin_transaction()
        producer.produce(topic, b"order-2")
        producer.commit_transaction()
    assert _values(broker, topic, 2) == [b"order-1", b"order-2"]


@pytest.mark.guarantee("1.7")
def test_an_abort_that_succeeded_leaves_a_usable_producer_when_a_callback_raises(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """abort_transaction() purges a queued record and serves its report after the
    abort succeeded; the callback's exception comes after the producer is ready, never
    leaving it 'aborting' (where a second abort would make it fatal)."""
    topic = broker.create_topic(partitions=1)
    with TransactionalProducer({**producer_config, "linger.ms": 5_000}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"aborted", on_delivery=_raising_callback)
        with pytest.raises(CallbackBugError) as info:
            producer.abort_transaction()
        assert "abort_transaction() succeeded" in _note(info.value)
        assert producer.state == "ready"
        producer.begin_transaction()
        producer.produce(topic, b"order-2")
        producer.commit_transaction()
    assert _values(broker, topic, 1) == [b"order-2"]


@pytest.mark.guarantee("1.7")
def test_close_closes_when_a_callback_raises_during_its_abort(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """close() in a transaction aborts it; a callback raising while that abort is served
    does not stop the close: the producer is closed, then the exception is raised."""
    topic = broker.create_topic(partitions=1)
    producer = TransactionalProducer({**producer_config, "linger.ms": 5_000})
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce(topic, b"aborted", on_delivery=_raising_callback)
    with pytest.raises(CallbackBugError) as info:
        producer.close()
    assert "close() aborted the open transaction and closed the producer" in _note(info.value)
    assert producer.state == "closed"
    producer.close()  # nothing left to raise
    assert _values(broker, topic, 0) == []


# ---------------------------------------------------------------- close() stays quiet
def _warnings_of(call: Callable[[], None]) -> list[str]:
    """The warnings ``call`` emits, every one shown (``"always"``) so none is missed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [f"{w.category.__name__}: {w.message}" for w in caught]


@pytest.mark.adversary
@pytest.mark.broker
@pytest.mark.guarantee("1.12")
def test_close_after_an_init_that_timed_out_warns_nothing() -> None:
    """init_transactions() against a loopback port nobody answers on runs out of its 1 s
    (BrokerUnreachableError: the port is refused) while librdkafka's init stays under
    way; close() then neither lets confluent-kafka's own close() try an abort that
    librdkafka refuses ("Conflicting init_transactions API call is already in progress",
    a RuntimeWarning), nor hangs."""
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    producer = TransactionalProducer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": uuid.uuid4().hex},
        operation_timeout=1.0,
    )
    with pytest.raises(BrokerUnreachableError):
        producer.init_transactions()
    assert _warnings_of(producer.close) == []
    assert producer.state == "closed"


@pytest.mark.adversary
@pytest.mark.guarantee("1.12")
def test_close_of_a_fenced_producer_warns_nothing(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """A producer fenced mid-transaction is in a fatal state, where librdkafka refuses
    every abort; close() warns nothing, and the newer producer's init aborted the fenced
    one's transaction: nothing of it is visible."""
    topic = broker.create_topic(partitions=1)
    old = TransactionalProducer(producer_config)
    old.init_transactions()
    old.begin_transaction()
    old.produce(topic, b"fenced")
    old.flush()
    with TransactionalProducer(producer_config) as new:
        new.init_transactions()
        with pytest.raises(ProducerFencedError):
            old.produce(topic, b"fenced-2")
            old.commit_transaction()
        assert _warnings_of(old.close) == []
        with new.transaction():
            new.produce(topic, b"new")
    assert _values(broker, topic, 1) == [b"new"]


# ---------------------------------------------------------------- sends in other threads
def _blocking_serializer() -> tuple[Callable[[Any, Any], bytes], threading.Event, threading.Event]:
    """A value serializer that blocks on the value "slow" until released, then fails on
    "slow-bad" and encodes "slow"; the events: entered, release."""
    entered, release = threading.Event(), threading.Event()

    def serialize(value: Any, ctx: Any) -> bytes:
        if str(value).startswith("slow"):
            entered.set()
            assert release.wait(30)
            if value == "slow-bad":
                raise ValueError("cannot encode")
        return str(value).encode()

    return serialize, entered, release


def _release_once_state_leaves(
    producer: TransactionalProducer, state: str, release: threading.Event
) -> threading.Thread:
    """Release the serializer once the producer's state is no longer ``state``: the
    commit or abort has started (and, with its wait for sends, is waiting there)."""

    def watch() -> None:
        while producer.state == state and not release.is_set():
            time.sleep(0.001)
        release.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


@pytest.mark.adversary
@pytest.mark.guarantee("1.8")
def test_commit_waits_for_a_send_under_way_and_never_commits_past_its_failed_record(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """A produce() in another thread is inside its serializer when commit_transaction()
    starts; the commit waits for it, sees its record fail, and raises
    CommitFailedException with that record's failure as the cause: nothing commits."""
    topic = broker.create_topic(partitions=1)
    serialize, entered, release = _blocking_serializer()
    sender_error: list[BaseException] = []
    with TransactionalProducer(producer_config, value_serializer=serialize) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, "order-1")

        def send() -> None:
            try:
                producer.produce(topic, "slow-bad")
            except BaseException as exc:
                sender_error.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        assert entered.wait(30)
        watcher = _release_once_state_leaves(producer, "in transaction", release)
        try:
            with pytest.raises(CommitFailedException) as info:
                producer.commit_transaction()
        finally:
            release.set()
            sender.join(30)
            watcher.join(30)
        assert isinstance(info.value.__cause__, ProduceFailedException)
        assert "serializer failed" in str(info.value)
        assert [type(e) for e in sender_error] == [ProduceFailedException]
        producer.abort_transaction()
    assert _values(broker, topic, 0) == []


@pytest.mark.adversary
@pytest.mark.guarantee("1.8")
def test_abort_waits_for_a_send_under_way_so_its_record_never_joins_the_next_transaction(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """A produce() in another thread is inside its serializer when abort_transaction()
    starts; the abort waits for it, so the record enters the aborted transaction (the
    send returns normally) and never reaches librdkafka outside a transaction or in the
    next one."""
    topic = broker.create_topic(partitions=1)
    serialize, entered, release = _blocking_serializer()
    sender_error: list[BaseException] = []
    with TransactionalProducer(producer_config, value_serializer=serialize) as producer:
        producer.init_transactions()
        producer.begin_transaction()

        def send() -> None:
            try:
                producer.produce(topic, "slow")
            except BaseException as exc:
                sender_error.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        assert entered.wait(30)
        watcher = _release_once_state_leaves(producer, "in transaction", release)
        try:
            producer.abort_transaction()
            producer.begin_transaction()
            sender.join(30)
        finally:
            release.set()
            sender.join(30)
            watcher.join(30)
        assert sender_error == []
        producer.produce(topic, "order-2")
        producer.commit_transaction()
    assert _values(broker, topic, 1) == [b"order-2"]


@pytest.mark.adversary
@pytest.mark.guarantee("1.10")
def test_produce_send_and_poll_from_many_threads(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """docs/guide/producer.md: produce()/send()/poll() may be called from several threads. Eight
    threads start together and each sends 250 records into one transaction, alternating
    produce() with a delivery callback and send(), and calling poll() as they go. Every
    future and every callback resolves once and without error, the commit succeeds,
    and an independent read_committed consumer sees exactly the 2,000 records, each once."""
    threads, per_thread = 8, 250
    topic = broker.create_topic(partitions=3)
    futures: list[Any] = []
    reports: list[tuple[Any, bytes | None]] = []
    errors: list[BaseException] = []
    together = threading.Barrier(threads)

    def on_delivery(err: Any, msg: Any) -> None:
        reports.append((err, msg.value()))  # served by whichever thread polls

    with TransactionalProducer(producer_config) as producer:
        producer.init_transactions()
        producer.begin_transaction()

        def work(t: int) -> None:
            try:
                together.wait(30)
                for i in range(per_thread):
                    value = f"t{t}-r{i}".encode()
                    if i % 2:
                        futures.append(producer.send(topic, value, key=b"t%d" % t))
                    else:
                        producer.produce(topic, value, key=b"t%d" % t, on_delivery=on_delivery)
                    if i % 10 == 0:
                        producer.poll(0)
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert not any(w.is_alive() for w in workers)
        assert errors == []
        producer.commit_transaction()
        assert len(futures) == threads * per_thread // 2
        assert all(f.done() and f.exception() is None for f in futures)
        assert len(reports) == threads * per_thread // 2
        assert all(err is None for err, _ in reports)

    def values(step: int) -> list[bytes]:
        return sorted(
            f"t{t}-r{i}".encode() for t in range(threads) for i in range(0, per_thread, step)
        )

    assert sorted(value for _, value in reports) == values(2)  # the produce() half
    assert sorted(_values(broker, topic, threads * per_thread)) == values(1)
