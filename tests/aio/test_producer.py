"""``AsyncTransactionalProducer`` keeps ``TransactionalProducer``'s guarantees (9.1):
the same calls, lifecycle and error classes, on the real broker, the outcome read with
an independent read_committed client (kafka-python, ``broker.read_committed``); tasks
sharing one producer take turns in ``async with producer.transaction()``."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from confluent_kafka import KafkaError, Message

from kafka_txn import (
    CommitFailedException,
    IllegalStateError,
    PreparedTxnState,
    ProduceFailedException,
    ProducerFencedError,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)
from kafka_txn.aio import AsyncTransactionalProducer
from kafka_txn.twophase.recovery import TransactionOutcome
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support.rig import Broker

T = TypeVar("T")

_INVALID_TOPIC = "no spaces allowed"
"""A topic name Kafka refuses: the send fails before the record is queued."""


async def within(seconds: float, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``, cancelled after ``seconds`` (then asyncio.TimeoutError):
    ``asyncio.timeout()`` on Python 3.11+, ``asyncio.wait_for()`` before it."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)  # pragma: no cover - Python 3.10


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    """``asyncio.run(coro)``, failing instead of hanging past ``timeout`` seconds."""
    return asyncio.run(within(timeout, coro))


def two_phase(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "transaction.two.phase.commit.enable": True}


# --------------------------------------------------------------------------- parity
@pytest.mark.guarantee("9.1")
def test_commit_abort_and_every_send_form(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """init, begin (a second begin raises IllegalStateError), send() (its future
    resolves to the delivered Message),
    send_and_wait(), produce(on_delivery=...) (one that is not callable refused with
    TypeError, as by the sync producer) and commit: the three records are visible
    exactly once; an aborted transaction's record is not."""
    delivered: list[tuple[ProduceFailedException | None, Message]] = []

    async def main() -> None:
        async with AsyncTransactionalProducer(producer_config) as producer:
            assert producer.state == "new"
            await producer.init_transactions()
            assert producer.state == "ready"
            await producer.begin_transaction()
            assert producer.in_transaction
            with pytest.raises(IllegalStateError):  # one transaction at a time, as in sync
                await producer.begin_transaction()
            future = await producer.send(topic, b"sent", key=b"a")
            message = await future
            assert isinstance(message, Message)
            assert (message.topic(), message.key(), message.value()) == (topic, b"a", b"sent")
            offset = message.offset()
            assert message.error() is None and offset is not None and offset >= 0
            waited = await producer.send_and_wait(topic, b"waited", key=b"b", partition=1)
            assert (waited.partition(), waited.value()) == (1, b"waited")
            await producer.produce(
                topic, b"produced", key=b"c", on_delivery=lambda e, m: delivered.append((e, m))
            )
            with pytest.raises(TypeError, match="on_delivery"):  # refused, as in sync
                await producer.produce(topic, b"never", on_delivery="not callable")  # type: ignore[arg-type]
            await producer.commit_transaction()
            assert producer.state == "ready" and not producer.in_transaction
            assert [(e, m.value()) for e, m in delivered] == [(None, b"produced")]

            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"aborted", key=b"d")
            await producer.abort_transaction()
            assert producer.state == "ready"
        assert producer.state == "closed"

    run(main())
    assert sorted(broker.read_committed(topic, 3)) == [
        (b"a", b"sent"),
        (b"b", b"waited"),
        (b"c", b"produced"),
    ]


@pytest.mark.guarantee("9.1")
def test_async_with_transaction_commits_and_an_exception_aborts(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """``async with producer.transaction()`` commits a body that ends; a body that
    raises is aborted (nothing of it visible), its exception propagates as it is, and
    the producer is ready for the next transaction."""

    class BodyError(Exception):
        pass

    async def main() -> None:
        async with AsyncTransactionalProducer(producer_config) as producer:
            await producer.init_transactions()
            async with producer.transaction() as txn:
                assert txn is producer and producer.in_transaction
                await producer.send(topic, b"committed")
            assert producer.state == "ready"
            with pytest.raises(BodyError):
                async with producer.transaction():
                    await producer.send_and_wait(topic, b"aborted")
                    raise BodyError
            assert producer.state == "ready"
            async with producer.transaction():
                await producer.send(topic, b"after")

    run(main())
    assert sorted(broker.read_committed(topic, 2)) == [(None, b"after"), (None, b"committed")]


@pytest.mark.guarantee("9.1")
def test_a_record_refused_before_it_is_queued_makes_the_commit_fail(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """A send to an invalid topic name raises ProduceFailedException at once; the
    commit then raises CommitFailedException (KIP-691: it never commits without the
    record) naming it as its cause, the abort works, and in ``async with`` the
    CommitFailedException comes after the abort; the next transaction commits."""

    async def main() -> None:
        async with AsyncTransactionalProducer(producer_config) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send(topic, b"lost")
            with pytest.raises(ProduceFailedException):
                await producer.send(_INVALID_TOPIC, b"refused")
            with pytest.raises(CommitFailedException) as failed:
                await producer.commit_transaction()
            assert isinstance(failed.value.__cause__, ProduceFailedException)
            assert producer.state == "abortable error"
            await producer.abort_transaction()

            with pytest.raises(CommitFailedException):
                async with producer.transaction():
                    await producer.send(topic, b"lost too")
                    with pytest.raises(ProduceFailedException):
                        await producer.produce(_INVALID_TOPIC, b"refused")
            assert producer.state == "ready"
            async with producer.transaction():
                await producer.send(topic, b"kept")

    run(main())
    assert broker.read_committed(topic, 1) == [(None, b"kept")]


@pytest.mark.guarantee("9.1")
def test_a_record_the_broker_refuses_fails_its_future_and_the_commit(
    broker: Broker, producer_config: dict[str, Any]
) -> None:
    """A record larger than its topic's max.message.bytes: the broker refuses it, its
    send() future raises ProduceFailedException, and the commit CommitFailedException
    with that failure as its cause; nothing of the transaction is visible."""
    topic = broker.create_topic(config={"max.message.bytes": "2000"})

    async def main() -> None:
        async with AsyncTransactionalProducer(producer_config) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send(topic, b"small")
            future = await producer.send(topic, b"x" * 10_000)
            with pytest.raises(ProduceFailedException) as refused:
                await future
            with pytest.raises(CommitFailedException) as failed:
                await producer.commit_transaction()
            assert failed.value.__cause__ is not None
            assert failed.value.kafka_error.code() == refused.value.kafka_error.code()
            await producer.abort_transaction()
            assert producer.state == "ready"

    run(main())
    assert broker.read_committed(topic, 0) == []


@pytest.mark.guarantee("9.1")
def test_a_commit_out_of_time_raises_outcome_unknown_and_commits_when_called_again(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """The coordinator answers every EndTxn COORDINATOR_LOAD_IN_PROGRESS (through the
    proxy) until the 1 s operation_timeout: commit_transaction() raises
    TransactionOutcomeUnknownError, as the sync producer does, the producer stays
    committing (never aborted), and commit_transaction() called again once the
    coordinator answers commits the records."""

    async def main() -> None:
        with KafkaProxy(broker.bootstrap_servers) as proxy:
            config = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
            async with AsyncTransactionalProducer(config, operation_timeout=1.0) as producer:
                await producer.init_transactions()
                await producer.begin_transaction()
                await producer.send(topic, b"committed late")
                loading = proxy.fail(ApiKey.END_TXN, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
                with pytest.raises(TransactionOutcomeUnknownError):
                    await producer.commit_transaction()
                assert producer.state == "committing"
                proxy.remove(loading)
                await producer.commit_transaction()
                assert producer.state == "ready"

    run(main())
    assert broker.read_committed(topic, 1) == [(None, b"committed late")]


@pytest.mark.guarantee("9.1")
def test_a_fenced_producer_raises_what_the_sync_one_raises(
    broker: Broker, topic: str, producer_config: dict[str, Any], txn_id: str
) -> None:
    """A second producer with the same transactional id fences the first: the fenced
    async producer's commit raises the same class as the sync producer's in the same
    schedule (ProducerFencedError), only the newer producer's records are visible, and
    it closes cleanly."""

    def sync_schedule(conf: dict[str, Any]) -> type[BaseException]:
        with TransactionalProducer(conf) as old, TransactionalProducer(conf) as new:
            old.init_transactions()
            new.init_transactions()
            old.begin_transaction()
            old.produce(topic, b"sync zombie")
            with pytest.raises(Exception) as raised:
                old.commit_transaction()
            return raised.type

    async def main() -> type[BaseException]:
        async with (
            AsyncTransactionalProducer(producer_config) as old,
            AsyncTransactionalProducer(producer_config) as new,
        ):
            await old.init_transactions()
            await new.init_transactions()
            await old.begin_transaction()
            await old.produce(topic, b"zombie")
            with pytest.raises(Exception) as raised:
                await old.commit_transaction()
            async with new.transaction():
                await new.send(topic, b"owner")
            return raised.type

    expected = sync_schedule({**producer_config, "transactional.id": f"{txn_id}-sync"})
    assert expected is ProducerFencedError
    assert run(main()) is expected
    assert broker.read_committed(topic, 1) == [(None, b"owner")]


@pytest.mark.guarantee("9.1")
def test_two_phase_commit_and_abort(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """prepare_transaction() returns the prepared state; complete_transaction() with
    it commits, with the empty state aborts; abort_transaction() of a prepared one
    aborts too. Only the committed transaction is visible."""

    async def main() -> None:
        async with AsyncTransactionalProducer(two_phase(producer_config)) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send(topic, b"committed")
            prepared = await producer.prepare_transaction()
            assert isinstance(prepared, PreparedTxnState) and not prepared.is_empty
            assert producer.state == "prepared"
            outcome = await producer.complete_transaction(prepared)
            assert outcome is TransactionOutcome.COMMITTED
            assert producer.state == "ready"

            await producer.begin_transaction()
            await producer.send(topic, b"aborted by complete")
            await producer.prepare_transaction()
            outcome = await producer.complete_transaction(PreparedTxnState())
            assert outcome is TransactionOutcome.ABORTED

            await producer.begin_transaction()
            await producer.send(topic, b"aborted by abort")
            await producer.prepare_transaction()
            await producer.abort_transaction()
            assert producer.state == "ready"

    run(main())
    assert broker.read_committed(topic, 1) == [(None, b"committed")]


@pytest.mark.guarantee("9.1")
def test_recovery_of_a_transaction_prepared_by_a_closed_producer(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """A producer prepares and closes without completing (a crash); a fresh one with
    init_transactions(keep_prepared_txn=True) and complete_transaction(stored_state,
    before_init=<coroutine function>) commits it: the hook runs on the event loop with
    the outcome, before the producer is initialised, and transactions work after."""
    config = two_phase(producer_config)
    seen: list[tuple[TransactionOutcome, str, bool]] = []

    async def main() -> None:
        crashed = AsyncTransactionalProducer(config)
        await crashed.init_transactions()
        await crashed.begin_transaction()
        await crashed.send(topic, b"decided")
        stored = str(await crashed.prepare_transaction())
        await crashed.close(timeout=5)  # leaves the prepared transaction open
        assert crashed.state == "closed"

        loop_thread = threading.get_ident()
        async with AsyncTransactionalProducer(config) as fresh:
            await fresh.init_transactions(keep_prepared_txn=True)
            assert fresh.state == "recovering"

            async def before_init(outcome: TransactionOutcome) -> None:
                await asyncio.sleep(0)  # a real coroutine: it awaits
                seen.append((outcome, fresh.state, threading.get_ident() == loop_thread))

            outcome = await fresh.complete_transaction(stored, before_init=before_init)
            assert outcome is TransactionOutcome.COMMITTED
            assert fresh.state == "ready"
            async with fresh.transaction():
                await fresh.send(topic, b"next")

    run(main())
    assert seen == [(TransactionOutcome.COMMITTED, "recovering", True)]
    assert sorted(broker.read_committed(topic, 2)) == [(None, b"decided"), (None, b"next")]


@pytest.mark.guarantee("9.1")
def test_flush_close_twice_and_calls_after_close_as_the_sync_producer(
    broker: Broker, topic: str, producer_config: dict[str, Any], txn_id: str
) -> None:
    """flush() waits until every queued record is delivered (0 left); close() twice is
    fine; after close every call raises what the sync producer's raises
    (IllegalStateError, naming the call)."""
    calls: dict[str, Callable[[Any], Any]] = {
        "init_transactions": lambda p: p.init_transactions(),
        "begin_transaction": lambda p: p.begin_transaction(),
        "send": lambda p: p.send(topic, b"late"),
        "produce": lambda p: p.produce(topic, b"late"),
        "commit_transaction": lambda p: p.commit_transaction(),
        "abort_transaction": lambda p: p.abort_transaction(),
        "prepare_transaction": lambda p: p.prepare_transaction(),
        "flush": lambda p: p.flush(),
    }

    def sync_errors() -> dict[str, str]:
        producer = TransactionalProducer({**producer_config, "transactional.id": f"{txn_id}-s"})
        producer.init_transactions()
        producer.close()
        producer.close()
        errors = {}
        for name, call in calls.items():
            with pytest.raises(IllegalStateError) as raised:
                call(producer)
            errors[name] = str(raised.value)
        return errors

    async def async_errors() -> dict[str, str]:
        producer = AsyncTransactionalProducer(producer_config)
        await producer.init_transactions()
        await producer.begin_transaction()
        futures = [await producer.send(topic, b"%d" % i) for i in range(20)]
        assert await producer.flush() == 0
        assert all(future.done() for future in futures)
        assert len(producer) == 0
        await producer.commit_transaction()
        await producer.close()
        await producer.close()
        assert producer.state == "closed"
        errors = {}
        for name, call in calls.items():
            with pytest.raises(IllegalStateError) as raised:
                await call(producer)
            errors[name] = str(raised.value)
        return errors

    expected = sync_errors()
    assert run(async_errors()) == expected
    assert len(broker.read_committed(topic, 20)) == 20


@pytest.mark.guarantee("9.1")
def test_a_call_waiting_behind_close_raises_illegal_state(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """A call made while close() runs (its abort of the open transaction held at the
    broker) waits its turn and then raises IllegalStateError, as a call after close()
    does, never CancelledError in a task nobody cancelled."""

    async def main() -> None:
        with KafkaProxy(broker.bootstrap_servers) as proxy:
            config = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
            producer = AsyncTransactionalProducer(config)
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"aborted by close")
            arrived, release = threading.Event(), threading.Event()

            def hold(_: object) -> None:
                arrived.set()
                release.wait(30)

            proxy.before(ApiKey.END_TXN, hold, times=1)
            try:
                closing = asyncio.create_task(producer.close())
                while not arrived.is_set():
                    await asyncio.sleep(0.01)
                late = asyncio.create_task(producer.begin_transaction())
                await asyncio.sleep(0.05)
                assert not late.done()  # waiting its turn behind close()
            finally:
                release.set()
            await closing
            with pytest.raises(IllegalStateError, match="after close"):
                await late
            assert producer.state == "closed"

    run(main())
    assert broker.read_committed(topic, 0) == []


# --------------------------------------------------------------------------- tasks
@pytest.mark.guarantee("9.1")
def test_tasks_sharing_a_producer_take_turns_and_all_commit(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """Eight tasks each run ``async with producer.transaction()`` with three sends at
    once: the transactions never overlap (each body sees only its own transaction),
    every one commits, and read_committed shows each record exactly once."""
    tasks, per_task = 8, 3
    inside: list[int] = []
    overlaps: list[int] = []

    async def main() -> None:
        async with AsyncTransactionalProducer(producer_config) as producer:
            await producer.init_transactions()

            async def one(n: int) -> None:
                async with producer.transaction():
                    if inside:
                        overlaps.append(n)
                    inside.append(n)
                    for i in range(per_task):
                        await producer.send(topic, b"%d-%d" % (n, i))
                        await asyncio.sleep(0)  # let the other tasks try to enter
                    inside.remove(n)

            await asyncio.gather(*(one(n) for n in range(tasks)))

    run(main())
    assert overlaps == []
    seen = broker.read_committed(topic, tasks * per_task)
    assert sorted(v or b"" for _, v in seen) == sorted(
        b"%d-%d" % (n, i) for n in range(tasks) for i in range(per_task)
    )
