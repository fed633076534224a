"""What cancelling each call of ``AsyncTransactionalProducer`` does (9.3), one test per
row of the contract in ``kafka_txn/aio/producer.py``'s docstring, on the real broker.

A call is cancelled mid-flight by holding its request at a proxy in front of the broker
(``tests/proxies/kafka_proxy.py``: a ``Before`` rule that waits until the test releases
it), or, for begin_transaction(), which sends nothing, by holding the call in its
metrics hook on the producer's worker thread: the test knows the call is running before
it cancels, with no timing guess. Cancellation is both ``task.cancel()`` and
``asyncio.timeout()`` (``asyncio.wait_for()`` on Python 3.10). Outcomes are read with an
independent read_committed client."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_txn import CommitFailedException, FailureType, IllegalStateError
from kafka_txn.aio import AsyncTransactionalProducer
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support.rig import Broker

T = TypeVar("T")


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


def read(broker: Broker, topic: str, expected: int) -> list[tuple[bytes | None, bytes | None]]:
    """``broker.read_committed``, lingering half a second past the last stable offsets
    (the producers are closed by then: every marker is written or being written)."""
    return broker.read_committed(topic, expected, linger=0.5)


async def until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    """Wait (on the loop) until ``predicate()`` is true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


class Gate:
    """Holds something on another thread until ``release()``; ``entered`` says it is
    held (the call it belongs to is running)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._released = threading.Event()

    def hold(self, *_: object) -> None:
        self.entered.set()
        self._released.wait(30)

    async def wait_entered(self) -> None:
        await until(self.entered.is_set)

    def release(self) -> None:
        self._released.set()


class HeldRequest(Gate):
    """The next request of ``api`` held at the proxy."""

    def __init__(self, proxy: KafkaProxy, api: int) -> None:
        super().__init__()
        proxy.before(api, self.hold, times=1)


class HeldOperation(Gate):
    """A metrics hook that records the operations reported and the threads that ran
    them, and holds the producer's worker thread when ``name`` ends (the call has done
    its work and is reporting its duration), once; None: never."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__()
        self.name = name
        self.calls: list[tuple[str, bool]] = []
        self.threads: set[int] = set()

    def operation(self, name: str, seconds: float, ok: bool) -> None:
        self.calls.append((name, ok))
        self.threads.add(threading.get_ident())
        if name == self.name and not self.entered.is_set():
            self.hold()

    def record_failed(self, failure_type: FailureType) -> None:
        pass


@pytest.fixture
def proxy(broker: Broker) -> Iterator[KafkaProxy]:
    with KafkaProxy(broker.bootstrap_servers) as kafka_proxy:
        yield kafka_proxy


@pytest.fixture
def proxied(producer_config: dict[str, Any], proxy: KafkaProxy) -> dict[str, Any]:
    """Producer config whose every connection passes through the proxy."""
    return {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}


async def cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and check that CancelledError came out of it."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --------------------------------------------------------------------------- init
@pytest.mark.guarantee("9.3")
def test_init_cancelled_while_running_is_adopted_by_the_next_call(
    broker: Broker, topic: str, proxied: dict[str, Any], proxy: KafkaProxy
) -> None:
    """init_transactions() cancelled while its InitProducerId is held at the broker,
    then another init_transactions() cancelled while waiting its turn behind it: once
    released, a third call returns (it adopts the first one's success instead of
    raising "already called") and transactions work."""

    async def main() -> None:
        async with AsyncTransactionalProducer(proxied) as producer:
            held = HeldRequest(proxy, ApiKey.INIT_PRODUCER_ID)
            try:
                first = asyncio.create_task(producer.init_transactions())
                await held.wait_entered()
                await cancelled(first)
                waiting = asyncio.create_task(producer.init_transactions())
                await asyncio.sleep(0.05)
                await cancelled(waiting)
            finally:
                held.release()
            await producer.init_transactions()
            assert producer.state == "ready"
            async with producer.transaction():
                await producer.send(topic, b"after")

    run(main())
    assert read(broker, topic, 1) == [(None, b"after")]


@pytest.mark.guarantee("9.3")
def test_init_cancelled_while_waiting_its_turn_never_runs(
    proxied: dict[str, Any], proxy: KafkaProxy
) -> None:
    """Two init_transactions() at once, the first held at the broker, the second
    cancelled (asyncio.timeout) while it waits for its turn: it never ran (the
    metrics hook saw one init), the first succeeds, and a later init_transactions()
    raises IllegalStateError, as a second init of the sync producer does."""
    metrics = HeldOperation()

    async def main() -> None:
        async with AsyncTransactionalProducer(proxied, metrics=metrics) as producer:
            held = HeldRequest(proxy, ApiKey.INIT_PRODUCER_ID)
            try:
                first = asyncio.create_task(producer.init_transactions())
                await held.wait_entered()
                with pytest.raises(asyncio.TimeoutError):
                    await within(0.1, producer.init_transactions())
            finally:
                held.release()
            await first
            assert producer.state == "ready"
            with pytest.raises(IllegalStateError, match="already called"):
                await producer.init_transactions()

    run(main())
    inits = [ok for name, ok in metrics.calls if name == "init_transactions"]
    assert inits == [True, False]  # the first, and the last (refused): never the cancelled


# --------------------------------------------------------------------------- begin
@pytest.mark.guarantee("9.3")
@pytest.mark.parametrize("form", ["begin_transaction", "async with"])
def test_begin_cancelled_while_running_is_undone(
    broker: Broker, topic: str, producer_config: dict[str, Any], form: str
) -> None:
    """begin_transaction() (called, or entering ``async with producer.transaction()``)
    cancelled while it runs on the worker: the transaction it began is aborted (the
    producer is back to ready, nothing open at the broker), on the worker, never on
    the loop, and the next transaction commits alone, even when the caller kept the
    CancelledError (and so the frames it holds) until the next transaction was open."""
    metrics = HeldOperation("begin_transaction")
    kept: list[BaseException] = []

    async def main() -> int:
        async with AsyncTransactionalProducer(producer_config, metrics=metrics) as producer:
            await producer.init_transactions()

            async def body() -> None:
                if form == "begin_transaction":
                    await producer.begin_transaction()
                else:
                    async with producer.transaction():
                        await producer.send(topic, b"never sent", partition=0)

            task = asyncio.create_task(body())
            try:
                await metrics.wait_entered()
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError as exc:
                    kept.append(exc)  # as a log handler or an error report may
            finally:
                metrics.release()
            assert kept, "the task was not cancelled"
            await until(lambda: ("abort_transaction", True) in metrics.calls)
            assert producer.state == "ready" and not producer.in_transaction
            async with producer.transaction():
                await producer.send(topic, b"next", partition=0)
                kept.clear()
                gc.collect()  # whatever the exception kept alive goes now
        return threading.get_ident()

    loop_thread = run(main())
    assert metrics.calls.count(("abort_transaction", True)) == 1
    assert loop_thread not in metrics.threads
    assert read(broker, topic, 1) == [(None, b"next")]
    assert broker.open_partitions(topic) == {}


# --------------------------------------------------------------------------- commit
@pytest.mark.guarantee("9.3")
def test_commit_cancelled_mid_flight_runs_on_and_commits(
    broker: Broker, topic: str, proxied: dict[str, Any], proxy: KafkaProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """commit_transaction() cancelled (task.cancel()) while its EndTxn is held at the
    broker: it runs on and commits (never aborted), the producer ends ready, and a
    ``kafka_txn.aio`` log line says the cancelled commit succeeded."""
    caplog.set_level(logging.INFO, logger="kafka_txn.aio")

    async def main() -> None:
        async with AsyncTransactionalProducer(proxied) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            for i in range(5):
                await producer.send(topic, b"%d" % i)
            held = HeldRequest(proxy, ApiKey.END_TXN)
            try:
                task = asyncio.create_task(producer.commit_transaction())
                await held.wait_entered()
                await cancelled(task)
                assert producer.state == "committing"
            finally:
                held.release()
            await until(lambda: producer.state == "ready")

    run(main())
    assert sorted(read(broker, topic, 5)) == [(None, b"%d" % i) for i in range(5)]
    assert any(
        "commit_transaction()" in r.getMessage() and "succeeded" in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.guarantee("9.3")
def test_complete_of_a_prepared_transaction_cancelled_mid_flight_commits(
    broker: Broker, topic: str, proxied: dict[str, Any], proxy: KafkaProxy
) -> None:
    """complete_transaction() of a prepared transaction cancelled (asyncio.timeout)
    while its EndTxn is held: it runs on and commits, never aborted."""
    config = {**proxied, "transaction.two.phase.commit.enable": True}

    async def main() -> None:
        async with AsyncTransactionalProducer(config) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send(topic, b"prepared")
            prepared = await producer.prepare_transaction()
            held = HeldRequest(proxy, ApiKey.END_TXN)
            try:
                with pytest.raises(asyncio.TimeoutError):
                    await within(0.1, producer.complete_transaction(prepared))
                await held.wait_entered()
                assert producer.state in ("prepared", "in doubt")
            finally:
                held.release()
            await until(lambda: producer.state == "ready")

    run(main())
    assert read(broker, topic, 1) == [(None, b"prepared")]


# --------------------------------------------------------------------------- prepare
@pytest.mark.guarantee("9.3")
def test_prepare_cancelled_aborts_the_transaction(
    broker: Broker, topic: str, proxied: dict[str, Any], proxy: KafkaProxy
) -> None:
    """prepare_transaction() cancelled while the coordinator holds its
    DescribeTransactions: its state never reached the caller, so the transaction is
    aborted once prepare ends; the producer is ready and prepares the next one."""
    config = {**proxied, "transaction.two.phase.commit.enable": True}

    async def main() -> None:
        async with AsyncTransactionalProducer(config) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send(topic, b"undone", partition=0)
            held = HeldRequest(proxy, ApiKey.DESCRIBE_TRANSACTIONS)
            try:
                task = asyncio.create_task(producer.prepare_transaction())
                await held.wait_entered()
                await cancelled(task)
            finally:
                held.release()
            await until(lambda: producer.state == "ready")
            await producer.begin_transaction()
            await producer.send(topic, b"next", partition=0)
            await producer.complete_transaction(await producer.prepare_transaction())

    run(main())
    assert read(broker, topic, 1) == [(None, b"next")]


# --------------------------------------------------------------------------- offsets
@pytest.mark.guarantee("9.3")
def test_send_offsets_cancelled_while_running_makes_the_commit_refuse(
    broker: Broker, topic: str, proxied: dict[str, Any], proxy: KafkaProxy
) -> None:
    """send_offsets_to_transaction() cancelled while its AddOffsetsToTxn is held:
    whether the offsets joined is unknown to the caller, so the commit refuses with
    CommitFailedException; the abort works and nothing is visible."""
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": f"g-{time.monotonic_ns()}"}
    )

    async def main() -> None:
        async with AsyncTransactionalProducer(proxied) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send(topic, b"output")
            held = HeldRequest(proxy, ApiKey.ADD_OFFSETS_TO_TXN)
            try:
                task = asyncio.create_task(
                    producer.send_offsets_to_transaction(
                        [TopicPartition(topic, 0, 1)], consumer.consumer_group_metadata()
                    )
                )
                await held.wait_entered()
                await cancelled(task)
            finally:
                held.release()
            with pytest.raises(CommitFailedException, match="cancelled"):
                await producer.commit_transaction()
            await producer.abort_transaction()
            assert producer.state == "ready"

    try:
        run(main())
    finally:
        consumer.close()
    assert read(broker, topic, 0) == []


# --------------------------------------------------------------------------- abort
@pytest.mark.guarantee("9.3")
def test_abort_cancelled_mid_flight_runs_on(
    broker: Broker, topic: str, proxied: dict[str, Any], proxy: KafkaProxy
) -> None:
    """abort_transaction() cancelled (asyncio.timeout) while its EndTxn is held: it runs
    on, the producer ends ready, and nothing of the transaction is visible."""

    async def main() -> None:
        async with AsyncTransactionalProducer(proxied) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"aborted", partition=0)
            held = HeldRequest(proxy, ApiKey.END_TXN)
            try:
                with pytest.raises(asyncio.TimeoutError):
                    await within(0.1, producer.abort_transaction())
                await held.wait_entered()
                assert producer.state == "aborting"
            finally:
                held.release()
            await until(lambda: producer.state == "ready")
            async with producer.transaction():
                await producer.send(topic, b"next", partition=0)

    run(main())
    assert read(broker, topic, 1) == [(None, b"next")]


# --------------------------------------------------------------------------- waiting
@pytest.mark.guarantee("9.3")
def test_calls_cancelled_while_waiting_their_turn(
    broker: Broker, topic: str, proxied: dict[str, Any], proxy: KafkaProxy
) -> None:
    """While send_offsets_to_transaction() runs (its AddOffsetsToTxn held), a second
    send_offsets_to_transaction() and a begin wait their turn and are cancelled: neither
    runs (no second AddOffsetsToTxn, no operation reported to the metrics hook), but the
    cancelled send_offsets_to_transaction() leaves the transaction uncommittable (its
    caller cannot know whether it ran): the commit raises CommitFailedException naming
    it, the abort works, and nothing is visible."""
    metrics = HeldOperation()
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": f"g-{time.monotonic_ns()}"}
    )
    offsets = [TopicPartition(topic, 0, 1)]

    async def main() -> None:
        async with AsyncTransactionalProducer(proxied, metrics=metrics) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send(topic, b"dropped")
            group = consumer.consumer_group_metadata()
            held = HeldRequest(proxy, ApiKey.ADD_OFFSETS_TO_TXN)
            try:
                running = asyncio.create_task(producer.send_offsets_to_transaction(offsets, group))
                await held.wait_entered()
                waiting = [
                    asyncio.create_task(producer.send_offsets_to_transaction(offsets, group)),
                    asyncio.create_task(producer.begin_transaction()),
                ]
                await asyncio.sleep(0.05)
                for task in waiting:
                    await cancelled(task)
                reported = list(metrics.calls)
            finally:
                held.release()
            await running
            await asyncio.sleep(0.1)  # a call that wrongly ran would have run by now
            began = [("init_transactions", True), ("begin_transaction", True)]
            assert metrics.calls == reported == began
            assert producer.state == "in transaction"
            assert proxy.count(ApiKey.ADD_OFFSETS_TO_TXN) == 1
            with pytest.raises(CommitFailedException, match="send_offsets_to_transaction"):
                await producer.commit_transaction()
            await producer.abort_transaction()

    try:
        run(main())
    finally:
        consumer.close()
    assert read(broker, topic, 0) == []


@pytest.mark.guarantee("9.3")
def test_ending_calls_cancelled_while_waiting_their_turn_run_all_the_same(
    broker: Broker, topic: str, proxied: dict[str, Any], proxy: KafkaProxy
) -> None:
    """A commit_transaction() queued behind a running send_offsets_to_transaction() (its
    AddOffsetsToTxn held) and cancelled before the worker took it up runs all the same
    once its turn comes: the transaction is committed, records and offsets."""
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": f"g-{time.monotonic_ns()}"}
    )
    offsets = [TopicPartition(topic, 0, 1)]

    async def main() -> None:
        async with AsyncTransactionalProducer(proxied) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send(topic, b"kept")
            group = consumer.consumer_group_metadata()
            held = HeldRequest(proxy, ApiKey.ADD_OFFSETS_TO_TXN)
            try:
                running = asyncio.create_task(producer.send_offsets_to_transaction(offsets, group))
                await held.wait_entered()
                commit = asyncio.create_task(producer.commit_transaction())
                await asyncio.sleep(0.05)
                await cancelled(commit)
                assert producer.state == "in transaction"  # not taken up yet
            finally:
                held.release()
            await running
            for _ in range(200):
                if producer.state == "ready":
                    break
                await asyncio.sleep(0.05)
            assert producer.state == "ready"

    try:
        run(main())
    finally:
        consumer.close()
    assert read(broker, topic, 1) == [(None, b"kept")]


@pytest.mark.guarantee("9.3")
def test_a_commit_or_prepare_cancelled_at_once_always_runs(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """commit_transaction(), complete_transaction() and prepare_transaction() cancelled
    by asyncio.timeout(0), before the worker can take them up, run all the same: every
    commit lands (read_committed counts them), and every prepare is followed by its
    abort, so the next transaction begins."""
    config = {**producer_config, "transaction.two.phase.commit.enable": True}
    rounds = 20

    async def main() -> None:
        async with AsyncTransactionalProducer(config) as producer:
            await producer.init_transactions()
            for i in range(rounds):
                await producer.begin_transaction()
                await producer.send(topic, b"commit-%d" % i)
                with pytest.raises(asyncio.TimeoutError):
                    await within(0, producer.commit_transaction())
                await producer.begin_transaction()  # waits for the commit, then begins
                await producer.send(topic, b"prepared-%d" % i)
                with pytest.raises(asyncio.TimeoutError):
                    await within(0, producer.prepare_transaction())
                await producer.begin_transaction()  # after the prepare and its abort
                await producer.send(topic, b"complete-%d" % i)
                state = await producer.prepare_transaction()
                with pytest.raises(asyncio.TimeoutError):
                    await within(0, producer.complete_transaction(state))
                await producer.begin_transaction()
                await producer.abort_transaction()

    run(main(), timeout=120)
    values = sorted(value for _, value in read(broker, topic, 2 * rounds))
    expected = sorted(
        [b"commit-%d" % i for i in range(rounds)] + [b"complete-%d" % i for i in range(rounds)]
    )
    assert values == expected


@pytest.mark.guarantee("9.3")
def test_a_send_waiting_for_room_never_joins_the_next_transaction(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """Sends waiting for room in a full queue (5 records, lingering 3 s) outlive their
    transaction: asyncio.gather() in the body does not cancel them when another of its
    awaitables raises, so transaction() aborts while they wait. When the next
    transaction begins, they must not be queued into it: each raises IllegalStateError,
    and read_committed shows the next transaction's record alone."""
    config = {**producer_config, "queue.buffering.max.messages": 5, "linger.ms": 3000}

    async def main() -> list[BaseException | None]:
        async with AsyncTransactionalProducer(config) as producer:
            await producer.init_transactions()
            sends: list[asyncio.Future[Any]] = []

            async def lookup() -> None:
                await asyncio.sleep(0.2)
                raise ValueError("lookup failed")

            with pytest.raises(ValueError):
                async with producer.transaction():
                    sends.extend(
                        asyncio.ensure_future(producer.send(topic, b"first-%d" % i))
                        for i in range(10)
                    )
                    await asyncio.gather(*sends, lookup())
            async with producer.transaction():
                await producer.send(topic, b"second")
                await asyncio.sleep(0.2)  # the waiting sends find room meanwhile
            return [s.exception() if s.done() else None for s in sends]

    outcomes = run(main())
    assert any(isinstance(exc, IllegalStateError) for exc in outcomes), outcomes
    values = [value for _, value in read(broker, topic, 1)]
    assert values == [b"second"]


# --------------------------------------------------------------------------- sends
@pytest.mark.guarantee("9.3")
def test_a_send_waiting_for_room_cancelled_makes_the_commit_refuse(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """A send waiting for room in a full local queue (2 records, lingering 10 s)
    cancelled by asyncio.timeout(): the record was not queued, so the commit refuses
    with CommitFailedException; the abort works and nothing is visible."""
    config = {**producer_config, "queue.buffering.max.messages": 2, "linger.ms": 10_000}

    async def main() -> None:
        async with AsyncTransactionalProducer(config) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send(topic, b"0")
            await producer.send(topic, b"1")
            with pytest.raises(asyncio.TimeoutError):
                await within(0.2, producer.send(topic, b"no room"))
            with pytest.raises(CommitFailedException, match="cancelled"):
                await producer.commit_transaction()
            await producer.abort_transaction()
            assert producer.state == "ready"

    run(main())
    assert read(broker, topic, 0) == []


@pytest.mark.guarantee("9.3")
def test_waiting_on_a_send_future_cancelled_keeps_the_record(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """The wait on a send()'s future cancelled (asyncio.timeout, before the delivery:
    the producer lingers 500 ms): only the wait ends; the record stays in the
    transaction, which commits it."""
    config = {**producer_config, "linger.ms": 500}

    async def main() -> None:
        async with AsyncTransactionalProducer(config) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            future = await producer.send(topic, b"kept")
            with pytest.raises(asyncio.TimeoutError):
                await within(0.05, future)
            assert future.cancelled()
            await producer.commit_transaction()

    run(main())
    assert read(broker, topic, 1) == [(None, b"kept")]


# --------------------------------------------------------------------------- async with
@pytest.mark.guarantee("9.3")
@pytest.mark.parametrize("how", ["task.cancel", "asyncio.timeout"])
def test_a_cancelled_transaction_body_is_aborted(
    broker: Broker, topic: str, producer_config: dict[str, Any], how: str
) -> None:
    """The body of ``async with producer.transaction()`` cancelled after its records
    reached the broker: the transaction is aborted, CancelledError (TimeoutError out
    of asyncio.timeout) propagates, also when a delivery callback of the body raised
    (its exception is left to the next call, which raises it and does nothing), the
    producer is ready and commits the next transaction (on the same partition: an
    abandoned open transaction would hide it)."""

    class BoomError(Exception):
        pass

    def boom(failure: Any, message: Any) -> None:
        raise BoomError

    async def main() -> None:
        async with AsyncTransactionalProducer(producer_config) as producer:
            await producer.init_transactions()
            delivered = asyncio.Event()

            async def body() -> None:
                async with producer.transaction():
                    await producer.produce(topic, b"aborted", partition=0, on_delivery=boom)
                    # delivered after the first, in the same batch: its callback ran
                    await producer.send_and_wait(topic, b"aborted too", partition=0)
                    delivered.set()
                    await asyncio.sleep(30)

            if how == "task.cancel":
                task = asyncio.create_task(body())
                await delivered.wait()
                await cancelled(task)
            else:
                with pytest.raises(asyncio.TimeoutError):
                    await within(1.0, body())
                assert delivered.is_set()
            assert producer.state == "ready"
            with pytest.raises(BoomError):
                await producer.begin_transaction()
            assert producer.state == "ready"
            async with producer.transaction():
                await producer.send(topic, b"next", partition=0)

    run(main())
    assert read(broker, topic, 1) == [(None, b"next")]


@pytest.mark.guarantee("9.3")
def test_the_commit_of_async_with_cancelled_runs_on_and_commits(
    broker: Broker, topic: str, proxied: dict[str, Any], proxy: KafkaProxy
) -> None:
    """The commit at the end of ``async with producer.transaction()`` cancelled while
    its EndTxn is held: CancelledError propagates out of the block, the commit runs
    on and commits, and the next task's transaction takes its turn after it."""

    async def main() -> None:
        async with AsyncTransactionalProducer(proxied) as producer:
            await producer.init_transactions()

            async def body() -> None:
                async with producer.transaction():
                    await producer.send(topic, b"committed")

            held = HeldRequest(proxy, ApiKey.END_TXN)
            try:
                task = asyncio.create_task(body())
                await held.wait_entered()
                await cancelled(task)
            finally:
                held.release()
            async with producer.transaction():
                await producer.send(topic, b"next")

    run(main())
    assert sorted(read(broker, topic, 2)) == [(None, b"committed"), (None, b"next")]


# --------------------------------------------------------------------------- close
@pytest.mark.guarantee("9.3")
@pytest.mark.parametrize("when", ["running", "waiting"])
def test_close_cancelled_ends_closed(
    broker: Broker, topic: str, proxied: dict[str, Any], proxy: KafkaProxy, when: str
) -> None:
    """close() cancelled while it runs (its abort of the open transaction held at the
    broker), or while it waits for its turn behind an abort_transaction() so held: it
    runs on all the same, the producer ends closed (calls then raise
    IllegalStateError), and nothing of the transaction is visible."""

    async def main() -> None:
        producer = AsyncTransactionalProducer(proxied)
        await producer.init_transactions()
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted")
        held = HeldRequest(proxy, ApiKey.END_TXN)
        try:
            if when == "running":
                task = asyncio.create_task(producer.close())
                await held.wait_entered()
            else:
                aborting = asyncio.create_task(producer.abort_transaction())
                await held.wait_entered()
                task = asyncio.create_task(producer.close())
                await asyncio.sleep(0.05)
            await cancelled(task)
        finally:
            held.release()
        if when == "waiting":
            await aborting
        await until(lambda: producer.state == "closed")
        with pytest.raises(IllegalStateError):
            await producer.begin_transaction()
        await producer.close()

    run(main())
    assert read(broker, topic, 0) == []
