"""``AsyncTransactionalProducer`` and its event loop (9.2): every callback (delivery
reports, ``error_cb``, ``stats_cb``, ``logger``) runs on the loop's thread, never on
librdkafka's; a callback's exception is raised by the producer's next call, as the sync
producer does; and the loop is never blocked: a probe task sleeping 5 ms at a time
measures how late it wakes while a commit the coordinator holds for seconds runs, and
while sends wait for room in a full local queue.

The bound on the probe's lateness is generous (``_MAX_LAG``): a loaded two-core machine
may delay a wake-up by a hundred milliseconds, while a blocking call would delay it by
the second or more the commit (or the wait for room) takes, which each test checks it
took."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest
from confluent_kafka import Message

from kafka_txn import (
    CommitFailedException,
    ProduceFailedException,
    TransactionalProducer,
)
from kafka_txn.aio import AsyncTransactionalProducer
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support.rig import Broker

T = TypeVar("T")

_MAX_LAG = 0.25
"""The most a 5 ms sleep of the probe may overshoot (seconds). Measured on two cores:
about 2 ms idle, 26 ms to 130 ms with three busy processes besides; a blocking call
would show 1 s or more in each test (a quarter of that or less is the bound)."""

_TWO_PHASE = {"transaction.two.phase.commit.enable": True}

_SLOW_COMMIT_MS = 1500
"""How long the coordinator holds its answer to EndTxn in the slow-commit test."""


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


class LagProbe:
    """A task that sleeps 5 ms at a time and records how late each wake-up is; at the
    end, how late the pending one is so far (a loop blocked until then counts too)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._since = time.perf_counter()

    async def _probe(self) -> None:
        while True:
            self._since = time.perf_counter()
            await asyncio.sleep(0.005)
            self.lags.append(time.perf_counter() - self._since - 0.005)

    async def __aenter__(self) -> LagProbe:
        self._task = asyncio.create_task(self._probe())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self.lags.append(max(0.0, time.perf_counter() - self._since - 0.005))
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    @property
    def worst(self) -> float:
        return max(self.lags)

    def describe(self) -> str:
        ordered = sorted(self.lags)
        median = ordered[len(ordered) // 2]
        return (
            f"{len(ordered)} wake-ups, median lag {median * 1000:.2f} ms, "
            f"max {self.worst * 1000:.2f} ms"
        )


@pytest.fixture
def proxy(broker: Broker) -> Iterator[KafkaProxy]:
    with KafkaProxy(broker.bootstrap_servers) as kafka_proxy:
        yield kafka_proxy


# --------------------------------------------------------------------------- callbacks
@pytest.mark.guarantee("9.2")
def test_every_callback_runs_on_the_event_loop_thread(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """Config ``on_delivery``, ``produce(on_delivery=...)``, ``stats_cb``
    (statistics.interval.ms), a ``logger`` (debug protocol) and ``error_cb`` (of a
    second producer whose broker address nobody listens on: connection refused) all
    run, and every one of their calls runs on the event loop's thread."""
    threads: dict[str, set[int]] = {
        name: set() for name in ("on_delivery", "produce", "error_cb", "stats_cb", "logger")
    }

    def on(name: str) -> Any:
        return lambda *args: threads[name].add(threading.get_ident())

    class Logger:
        def log(self, level: int, msg: str, *args: Any) -> None:
            threads["logger"].add(threading.get_ident())

    config = {
        **producer_config,
        "on_delivery": on("on_delivery"),
        "stats_cb": on("stats_cb"),
        "statistics.interval.ms": 100,
        "logger": Logger(),
        "debug": "protocol",
    }
    unreachable = {
        "bootstrap.servers": "127.0.0.1:1",
        "transactional.id": f"{producer_config['transactional.id']}-unreachable",
        "error_cb": on("error_cb"),
    }

    async def main() -> int:
        async with (
            AsyncTransactionalProducer(config) as producer,
            AsyncTransactionalProducer(unreachable),
        ):
            await producer.init_transactions()
            async with producer.transaction():
                for i in range(10):
                    await producer.send(topic, b"%d" % i)
                    await producer.produce(topic, b"p%d" % i, on_delivery=on("produce"))
            deadline = time.monotonic() + 10
            while not all(threads.values()) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        return threading.get_ident()

    loop_thread = run(main())
    assert threads == {name: {loop_thread} for name in threads}


@pytest.mark.guarantee("9.2")
@pytest.mark.parametrize("pause", [0.0, 0.5], ids=["served-by-the-commit", "served-before"])
def test_a_delivery_callbacks_exception_is_raised_by_the_commit_as_in_sync(
    broker: Broker, topic: str, producer_config: dict[str, Any], txn_id: str, pause: float
) -> None:
    """A ``produce(on_delivery=...)`` callback raises, its report served during the
    commit or before it (by the polling thread): the commit commits and then raises the
    callback's exception itself (with a note that the commit succeeded), as the sync
    producer's commit does; the next record's callback still runs; the producer is ready
    and the records are visible."""

    class BoomError(Exception):
        pass

    def boom(failure: ProduceFailedException | None, message: Message) -> None:
        raise BoomError(message.value())

    def sync_commit() -> tuple[type[BaseException], str]:
        conf = {**producer_config, "transactional.id": f"{txn_id}-sync"}
        with TransactionalProducer(conf) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.produce(topic, b"sync", on_delivery=boom)
            with pytest.raises(BoomError) as raised:
                producer.commit_transaction()
            return raised.type, producer.state

    others: list[bytes | None] = []

    async def async_commit() -> tuple[type[BaseException], str]:
        async with AsyncTransactionalProducer(producer_config) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.produce(topic, b"async", on_delivery=boom)
            await producer.produce(
                topic, b"other", on_delivery=lambda e, m: others.append(m.value())
            )
            await asyncio.sleep(pause)
            with pytest.raises(BoomError) as raised:
                await producer.commit_transaction()
            assert any(
                "commit_transaction() succeeded" in n
                for n in getattr(raised.value, "__notes__", [])
            )
            async with producer.transaction():  # raised once: the next call is clean
                await producer.send(topic, b"next")
            return raised.type, producer.state

    assert sync_commit() == (BoomError, "ready")
    assert run(async_commit()) == (BoomError, "ready")
    assert others == [b"other"]  # the raising callback did not stop the next one
    assert sorted(broker.read_committed(topic, 4)) == [
        (None, b"async"),
        (None, b"next"),
        (None, b"other"),
        (None, b"sync"),
    ]


@pytest.mark.guarantee("9.2")
def test_prepare_returns_its_state_and_leaves_a_callbacks_exception_to_the_next_call(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """Two-phase commit, a delivery callback raising while prepare runs (its report
    served by prepare's flush or the polling thread, the callback run on the loop):
    prepare returns the prepared state (raising there would lose it), and the next call,
    complete_transaction(), commits and then raises the callback's exception with a note
    that it succeeded. A callback that raised before prepare_transaction() is called is
    raised by it before it runs: nothing is done, and prepare then works."""

    class BoomError(Exception):
        pass

    called: list[bytes | None] = []

    def boom(failure: ProduceFailedException | None, message: Message) -> None:
        called.append(message.value())
        raise BoomError(message.value())

    def notes(exc: BaseException) -> str:
        return " ".join(getattr(exc, "__notes__", []))

    async def main() -> None:
        conf = {**producer_config, **_TWO_PHASE}
        async with AsyncTransactionalProducer(conf) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.produce(topic, b"during", on_delivery=boom)
            prepared = await producer.prepare_transaction()  # no await in between
            assert not prepared.is_empty and producer.state == "prepared"
            with pytest.raises(BoomError, match="during") as raised:
                await producer.complete_transaction(prepared)
            assert "complete_transaction() succeeded" in notes(raised.value)
            assert producer.state == "ready"

            await producer.begin_transaction()
            await producer.produce(topic, b"raised before", on_delivery=boom)
            deadline = time.monotonic() + 10
            while len(called) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            with pytest.raises(BoomError, match="raised before") as raised:
                await producer.prepare_transaction()
            assert "prepare_transaction() did nothing" in notes(raised.value)
            assert producer.state == "in transaction"
            await producer.complete_transaction(await producer.prepare_transaction())

    run(main())
    assert sorted(broker.read_committed(topic, 2)) == [(None, b"during"), (None, b"raised before")]


@pytest.mark.guarantee("9.2")
def test_a_stats_callbacks_exception_is_raised_by_flush(
    topic: str, producer_config: dict[str, Any]
) -> None:
    """A ``stats_cb`` raises (once) while no call runs: the next call, flush(), raises
    it, as the sync producer's flush() would; the call after that does not."""
    armed: list[bool] = []
    raised_once: list[bool] = []

    class BoomError(Exception):
        pass

    def stats(_: str) -> None:
        if armed and not raised_once:
            raised_once.append(True)
            raise BoomError

    config = {**producer_config, "stats_cb": stats, "statistics.interval.ms": 100}

    async def main() -> None:
        async with AsyncTransactionalProducer(config) as producer:
            await producer.init_transactions()
            armed.append(True)  # from now on no call runs until flush()
            deadline = time.monotonic() + 10
            while not raised_once and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            with pytest.raises(BoomError):
                await producer.flush()
            assert await producer.flush() == 0

    run(main())


@pytest.mark.guarantee("9.2")
def test_reports_after_the_loop_closed_are_dropped_with_a_debug_line(
    topic: str, producer_config: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A producer left open when its loop ends, a record still lingering: its report,
    served afterwards, is dropped with a debug line of ``kafka_txn.aio`` (its callback
    never runs, nothing raises), and the producer still closes, from another loop."""
    caplog.set_level(logging.DEBUG, logger="kafka_txn.aio")
    called: list[Message] = []

    async def leave_open() -> AsyncTransactionalProducer:
        producer = AsyncTransactionalProducer({**producer_config, "linger.ms": 300})
        await producer.init_transactions()
        await producer.begin_transaction()
        await producer.produce(topic, b"late", on_delivery=lambda e, m: called.append(m))
        return producer

    producer = asyncio.run(leave_open())
    deadline = time.monotonic() + 10
    while "not delivered" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "event loop closed" in caplog.text
    assert called == []
    asyncio.run(producer.close())
    assert producer.state == "closed"


# --------------------------------------------------------------------------- never blocked
@pytest.mark.guarantee("9.2")
def test_the_loop_runs_while_the_coordinator_holds_the_commit(
    broker: Broker, topic: str, producer_config: dict[str, Any], proxy: KafkaProxy
) -> None:
    """The coordinator (the real broker, through the proxy) holds its answer to EndTxn
    for 1.5 s: the commit takes that long, and meanwhile the probe's 5 ms sleeps are
    never late by more than ``_MAX_LAG``; the records are committed."""
    config = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}

    async def main() -> tuple[float, LagProbe]:
        async with AsyncTransactionalProducer(config) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            for i in range(100):
                await producer.send(topic, b"%d" % i)
            proxy.delay(ApiKey.END_TXN, _SLOW_COMMIT_MS, times=1)
            async with LagProbe() as probe:
                start = time.monotonic()
                await producer.commit_transaction()
                took = time.monotonic() - start
        return took, probe

    took, probe = run(main())
    print(f"slow commit ({took:.2f} s): {probe.describe()}")
    assert took >= _SLOW_COMMIT_MS / 1000 * 0.9
    assert probe.worst < _MAX_LAG, probe.describe()
    assert len(probe.lags) > 50
    assert len(broker.read_committed(topic, 100)) == 100


@pytest.mark.guarantee("9.2")
def test_a_send_waits_for_room_in_a_full_queue_without_blocking_the_loop(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """librdkafka's queue holds 5 records and lingers 1 s before sending: the sixth of
    ten sends finds it full and waits for room with ``await`` (a second), the probe is
    never late by more than ``_MAX_LAG``, and all ten records commit."""
    config = {
        **producer_config,
        "queue.buffering.max.messages": 5,
        "linger.ms": 1000,
    }

    async def main() -> tuple[float, LagProbe]:
        async with AsyncTransactionalProducer(config) as producer:
            await producer.init_transactions()
            async with LagProbe() as probe:
                start = time.monotonic()
                async with producer.transaction():
                    for i in range(10):
                        await producer.send(topic, b"%d" % i)
                took = time.monotonic() - start
        return took, probe

    took, probe = run(main())
    print(f"full queue ({took:.2f} s): {probe.describe()}")
    assert took >= 1.0  # the queue was full until the first five went, after 1 s
    assert probe.worst < _MAX_LAG, probe.describe()
    assert len(broker.read_committed(topic, 10)) == 10


@pytest.mark.guarantee("9.2")
def test_a_send_that_finds_no_room_in_time_fails_and_the_commit_refuses(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """The queue holds 2 records and lingers 10 s: the third send waits for room
    (without blocking the loop) until ``queue_full_timeout`` (1 s), then raises
    ProduceFailedException; the commit refuses with CommitFailedException, the abort
    works, and nothing is visible."""
    config = {
        **producer_config,
        "queue.buffering.max.messages": 2,
        "linger.ms": 10_000,
    }

    async def main() -> LagProbe:
        async with AsyncTransactionalProducer(config, queue_full_timeout=1.0) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send(topic, b"0")
            await producer.send(topic, b"1")
            async with LagProbe() as probe:
                start = time.monotonic()
                with pytest.raises(ProduceFailedException) as failed:
                    await producer.send(topic, b"2")
                assert time.monotonic() - start >= 1.0
            assert "queue" in str(failed.value).lower()
            with pytest.raises(CommitFailedException):
                await producer.commit_transaction()
            await producer.abort_transaction()
            assert producer.state == "ready"
        return probe

    probe = run(main())
    print(f"queue_full_timeout: {probe.describe()}")
    assert probe.worst < _MAX_LAG, probe.describe()
    assert broker.read_committed(topic, 0) == []
