"""asyncio: ``AsyncTransactionalProducer`` and ``AsyncDualWriter`` against the sync API,
aiokafka's transactional producer and the raw confluent-kafka producer, measured in one
run on the same broker (the test rig's choice, or the one ``--broker`` names:
bench/_broker.py), all behind the same delay proxy (``--delay-ms``, default 0: direct).

1. Producer throughput (100-byte values, 3-partition topics, a fresh topic and producer
   per run, every client at its default settings): records per second through the raw
   confluent-kafka ``Producer`` (the baseline), the same with a second thread calling
   ``poll(0.1)`` meanwhile (as ``AsyncTransactionalProducer``'s polling thread does:
   librdkafka's commit then competes with it for the delivery reports, see
   docs/performance.md), ``TransactionalProducer.produce()``,
   ``await AsyncTransactionalProducer.produce()`` (no callback: the cheap path),
   ``await AsyncTransactionalProducer.send()`` (a future per record, dropped, as in
   bench/producer_bench.py) and aiokafka's ``AIOKafkaProducer(transactional_id=...)``
   (``async with producer.transaction(): await producer.send(...)``); in 1000-record
   and in 1-record transactions. The async clients use ``async with
   producer.transaction()``, the sync ones begin and commit. "thread CPU" is the CPU time
   of the thread that calls the API (``time.thread_time``: the event loop's, for
   asyncio), "process CPU" that of the whole process (``time.process_time``: librdkafka's
   threads, kafka-txn's worker and polling threads, aiokafka's tasks), per record.
2. Event-loop lag: while a client commits transactions as fast as it can on the loop
   (yielding to it once between two transactions, as a handler that returns would), a
   probe task sleeps 1 ms again and again; its lag is how much later than 1 ms it wakes
   (p50, p99, max over the run), next to the longest pause of CPython's cyclic garbage
   collector during the run (which stops every thread, the loop's included). Loads: none
   (the probe alone, and the loop woken every 0.5 to 5 ms by a thread with nothing to do: the
   probe's resolution once something else wakes the loop), the async producer
   (``produce()`` and ``send()``), aiokafka, and the sync ``TransactionalProducer``
   called directly on the loop (what an asyncio application must not do).
3. Dual write: transactions per second through ``AsyncDualWriter`` and the sync
   ``DualWriter``, 1 and 10 rows (one INSERT, one record a row) a transaction, on
   PostgreSQL and on SQLite (a fresh file per run); then, on PostgreSQL, ``--tasks``
   tasks sharing one ``AsyncDualWriter`` (they take turns), as many tasks with an
   ``AsyncDualWriter`` each (a transactional id each), and as many threads with a sync
   ``DualWriter`` each. Also the mean time each step of the recipe took (``on_step``).

``--quick`` runs every scenario with small numbers (a smoke test) and then reads back,
with another client, that each producer scenario's first topic holds every record it
committed.

Runs are interleaved and rotated (a round runs every scenario of a part once); each
figure is the median of its runs (min..max), each ratio the median of the per-round
ratios (min..max) to the baseline named in its table.

    python bench/async_bench.py [--broker apache-kafka|noida] [--delay-ms 0]
        [--rounds 5] [--quick] [--only producer lag dual] [--tasks 4] [--gc-freeze]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiokafka
from aiokafka import AIOKafkaProducer
from confluent_kafka import Producer
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, text

from bench._broker import add_broker_argument, running_broker
from bench._common import Network, add_delay_argument, behind_delay, environment
from kafka_txn import TransactionalProducer
from kafka_txn.aio import AsyncDualWriter, AsyncTransactionalProducer
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import STEPS, DualWriter
from tests.support.databases import POSTGRES_JDBC, ensure_running
from tests.support.rig import Broker

VALUE = b"x" * 100
ROW = {"value": "x" * 100}
PROBE_S = 0.001
"""The probe's sleep: its lag is how much later than this it wakes."""


@dataclass(frozen=True)
class Sizes:
    """How much each run does: the defaults, or ``--quick``'s smoke-test sizes."""

    big_txns: int  # 1000-record transactions per producer run
    small_txns: int  # 1-record transactions per producer run
    lag_s: float  # seconds of load per lag run
    dual_txns: int  # dual-write transactions per run (one writer)
    task_txns: int  # dual-write transactions per task (--tasks tasks)
    settle_s: float  # pause after each producer run (the broker digests the last one)


DEFAULT = Sizes(big_txns=100, small_txns=200, lag_s=2.0, dual_txns=100, task_txns=40, settle_s=1.0)
QUICK = Sizes(big_txns=5, small_txns=20, lag_s=0.5, dual_txns=10, task_txns=5, settle_s=0.2)


# ---------------------------------------------------------------------------- measuring
@dataclass(frozen=True)
class Result:
    """One run: units (records, or transactions) per second and CPU nanoseconds per unit
    on the calling thread and in the whole process."""

    rate: float
    thread_ns: float
    process_ns: float


class _Clock:
    """Wall clock, calling thread's CPU and process CPU, from its creation."""

    def __init__(self) -> None:
        self.thread = time.thread_time()
        self.process = time.process_time()
        self.wall = time.perf_counter()

    def result(self, units: int) -> Result:
        wall = time.perf_counter() - self.wall
        thread = time.thread_time() - self.thread
        process = time.process_time() - self.process
        return Result(units / wall, thread / units * 1e9, process / units * 1e9)


def _rounds(
    scenarios: dict[str, Callable[[], Any]], rounds: int, settle: float
) -> dict[str, list[Any]]:
    """Every scenario once per round, the order rotated each round, so that drift and
    position in a round hit all alike."""
    results: dict[str, list[Any]] = {name: [] for name in scenarios}
    names = list(scenarios)
    for round_no in range(rounds):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(scenarios[name]())
            time.sleep(settle)
    return results


def _ratio(values: Sequence[float], base: Sequence[float]) -> str:
    """Median (min..max) of the per-round ratios ``values / base``."""
    per_round = [v / b for v, b in zip(values, base, strict=True)]
    return f"{statistics.median(per_round):.2f}x ({min(per_round):.2f}..{max(per_round):.2f})"


def _range(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    return f"{fmt.format(min(values))}..{fmt.format(max(values))}"


def _conf(net: Network) -> dict[str, Any]:
    return {"bootstrap.servers": net.bootstrap_servers, "transactional.id": f"bench-{uuid.uuid4()}"}


# ---------------------------------------------------------------------------- 1. producers
def _raw(net: Network, topic: str, txns: int, per_txn: int, poller: bool = False) -> Result:
    """The raw confluent-kafka producer; ``poller``: with another thread calling
    ``poll(0.1)`` meanwhile, as ``AsyncTransactionalProducer``'s polling thread does (the
    commit's flush then competes with it for the delivery reports)."""
    p = Producer(_conf(net))
    p.init_transactions()
    polling = threading.Event()

    def poll() -> None:
        while polling.is_set():
            p.poll(0.1)

    thread = threading.Thread(target=poll, daemon=True)
    if poller:
        polling.set()
        thread.start()
    clock = _Clock()
    for _ in range(txns):
        p.begin_transaction()
        for _ in range(per_txn):
            try:
                p.produce(topic, VALUE)
            except BufferError:
                p.poll(0.05)
                p.produce(topic, VALUE)
        p.commit_transaction()
    result = clock.result(txns * per_txn)
    if poller:
        polling.clear()
        thread.join()
    p.flush()
    p.close()
    return result


def _sync(net: Network, topic: str, txns: int, per_txn: int) -> Result:
    with TransactionalProducer(_conf(net)) as p:
        p.init_transactions()
        clock = _Clock()
        for _ in range(txns):
            p.begin_transaction()
            for _ in range(per_txn):
                p.produce(topic, VALUE)
            p.commit_transaction()
        return clock.result(txns * per_txn)


def _async(net: Network, topic: str, txns: int, per_txn: int, futures: bool) -> Result:
    async def run() -> Result:
        async with AsyncTransactionalProducer(_conf(net)) as p:
            await p.init_transactions()
            send: Callable[[str, bytes], Awaitable[Any]] = p.send if futures else p.produce
            clock = _Clock()
            for _ in range(txns):
                async with p.transaction():
                    for _ in range(per_txn):
                        await send(topic, VALUE)
            return clock.result(txns * per_txn)

    return asyncio.run(run())


def _aiokafka_producer(net: Network) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=net.bootstrap_servers, transactional_id=f"bench-{uuid.uuid4()}"
    )


def _aiokafka(net: Network, topic: str, txns: int, per_txn: int) -> Result:
    async def run() -> Result:
        p = _aiokafka_producer(net)
        await p.start()  # InitProducerId: not timed, as init_transactions() elsewhere
        try:
            clock = _Clock()
            for _ in range(txns):
                async with p.transaction():
                    for _ in range(per_txn):
                        await p.send(topic, VALUE)
            return clock.result(txns * per_txn)
        finally:
            await p.stop()

    return asyncio.run(run())


PRODUCERS: dict[str, Callable[[Network, str, int, int], Result]] = {
    "raw": _raw,
    "raw, polling thread": lambda net, topic, n, per: _raw(net, topic, n, per, poller=True),
    "sync produce": _sync,
    "async produce": lambda net, topic, n, per: _async(net, topic, n, per, futures=False),
    "async send": lambda net, topic, n, per: _async(net, topic, n, per, futures=True),
    "aiokafka": _aiokafka,
}


def _producer_part(broker: Broker, net: Network, sizes: Sizes, rounds: int, check: bool) -> None:
    topics: dict[str, list[tuple[str, int]]] = {}

    def scenario(client: str, txns: int, per_txn: int) -> Callable[[], Result]:
        def run() -> Result:
            topic = broker.create_topic(partitions=3, prefix="bench")
            topics.setdefault(f"{client} {per_txn}/txn", []).append((topic, txns * per_txn))
            return PRODUCERS[client](net, topic, txns, per_txn)

        return run

    scenarios = {
        f"{client} 1000/txn": scenario(client, sizes.big_txns, 1000) for client in PRODUCERS
    }
    scenarios |= {
        f"{client} 1/txn": scenario(client, sizes.small_txns, 1)
        for client in PRODUCERS
        if client != "async send"
    }
    results = _rounds(scenarios, rounds, sizes.settle_s)
    print(f"\n1. producer throughput: {sizes.big_txns} transactions of 1000 records, "
          f"{sizes.small_txns} of 1 record, 100-byte values, per run; {rounds} rounds")  # fmt: skip
    print(f"{'scenario':<29}{'median rec/s':>13}{'min..max':>20}{'vs raw':>21}"
          f"{'vs sync':>21}{'thread CPU':>12}{'process CPU':>13}{'vs raw':>21}")  # fmt: skip
    print(f"{'':<104}{'ns/rec':>12}{'ns/rec':>13}")
    for name, runs in results.items():
        size = name.rsplit(" ", 1)[1]
        raw, sync = results[f"raw {size}"], results[f"sync produce {size}"]
        rates = [r.rate for r in runs]
        line = f"{name:<29}{statistics.median(rates):>13,.0f}{_range(rates):>20}"
        line += f"{'' if runs is raw else _ratio(rates, [r.rate for r in raw]):>19}"
        line += (
            f"{'' if runs is raw or runs is sync else _ratio(rates, [r.rate for r in sync]):>19}"
        )
        line += f"{statistics.median(r.thread_ns for r in runs):>12,.0f}"
        process = [r.process_ns for r in runs]
        line += f"{statistics.median(process):>13,.0f}"
        line += f"{'' if runs is raw else _ratio(process, [r.process_ns for r in raw]):>21}"
        print(line)
    _load_average()
    if check:
        _check_committed(broker, topics)


def _load_average() -> None:
    print("load average at the end: " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


def _check_committed(broker: Broker, topics: dict[str, list[tuple[str, int]]]) -> None:
    """Each scenario's first topic holds exactly the records it committed (read_committed,
    with another client): a client that did not commit would be measured for nothing."""
    for name, runs in topics.items():
        topic, expected = runs[0]
        seen = len(broker.read_committed(topic, expected, linger=0.2))
        if seen != expected:
            raise SystemExit(f"{name}: {seen} records committed in {topic}, {expected} sent")
    print(f"checked: every scenario's records committed ({len(topics)} topics read back)")


# ---------------------------------------------------------------------------- 2. loop lag
@dataclass(frozen=True)
class Lag:
    """One run: the probe's lags (ms), the load's records per second, and the longest
    pause of CPython's cyclic garbage collector (ms, any thread: it holds the GIL)."""

    p50: float
    p99: float
    max: float
    samples: int
    rate: float
    gc_max: float


class _GcPauses:
    """The longest collection of CPython's cyclic garbage collector while it is
    installed (``gc.callbacks``): a collection stops every thread holding the GIL, the
    event loop's included, whichever thread's allocations triggered it."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
        else:
            self.longest = max(self.longest, now - self._started)

    def __enter__(self) -> _GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def _under_load(load: Callable[[float], Awaitable[int]], seconds: float) -> Lag:
    """Run ``load(deadline)`` (it returns the records it committed) while a probe task
    sleeps ``PROBE_S`` again and again, recording how late it wakes."""
    lags: list[float] = []
    running = [True]

    async def probe() -> None:
        while running[0]:
            start = time.perf_counter()
            await asyncio.sleep(PROBE_S)
            lags.append(time.perf_counter() - start - PROBE_S)

    task = asyncio.get_running_loop().create_task(probe())
    await asyncio.sleep(0)  # the probe is sleeping before the load starts
    with _GcPauses() as pauses:
        start = time.perf_counter()
        records = await load(start + seconds)
        elapsed = time.perf_counter() - start
        running[0] = False
        await task
    ordered = sorted(lag * 1000 for lag in lags)
    return Lag(
        _percentile(ordered, 0.5), _percentile(ordered, 0.99), ordered[-1], len(ordered),
        records / elapsed, pauses.longest * 1000,
    )  # fmt: skip


def _lag_idle(net: Network, topic: str, wake_ms: int, seconds: float) -> Lag:
    """No load; with ``wake_ms``, a thread wakes the loop with nothing to do
    (``call_soon_threadsafe``) every 0.5 to ``wake_ms`` ms (at random: a regular period
    would fall into step with the probe), as a worker's hand-over or a batch of delivery
    reports does: the probe's resolution once something else wakes the loop (asyncio
    waits in epoll, whose timeout is whole milliseconds, rounded up)."""

    async def idle(deadline: float) -> int:
        await asyncio.sleep(deadline - time.perf_counter())
        return 0

    async def run() -> Lag:
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def wake() -> None:
            while not stop.wait(random.uniform(0.5, wake_ms) / 1000):
                loop.call_soon_threadsafe(lambda: None)

        thread = threading.Thread(target=wake, daemon=True)
        if wake_ms:
            thread.start()
        try:
            return await _under_load(idle, seconds)
        finally:
            stop.set()
            if wake_ms:
                thread.join()

    return asyncio.run(run())


def _lag_async(net: Network, topic: str, per_txn: int, seconds: float, futures: bool) -> Lag:
    async def run() -> Lag:
        async with AsyncTransactionalProducer(_conf(net)) as p:
            await p.init_transactions()
            send: Callable[[str, bytes], Awaitable[Any]] = p.send if futures else p.produce

            async def load(deadline: float) -> int:
                records = 0
                while time.perf_counter() < deadline:
                    async with p.transaction():
                        for _ in range(per_txn):
                            await send(topic, VALUE)
                    records += per_txn
                    await asyncio.sleep(0)
                return records

            return await _under_load(load, seconds)

    return asyncio.run(run())


def _lag_aiokafka(net: Network, topic: str, per_txn: int, seconds: float) -> Lag:
    async def run() -> Lag:
        p = _aiokafka_producer(net)
        await p.start()
        try:

            async def load(deadline: float) -> int:
                records = 0
                while time.perf_counter() < deadline:
                    async with p.transaction():
                        for _ in range(per_txn):
                            await p.send(topic, VALUE)
                    records += per_txn
                    await asyncio.sleep(0)
                return records

            return await _under_load(load, seconds)
        finally:
            await p.stop()

    return asyncio.run(run())


def _lag_sync_on_loop(net: Network, topic: str, per_txn: int, seconds: float) -> Lag:
    """The sync producer called from a coroutine: every call blocks the loop (the
    commit for its whole round trip to the coordinator)."""

    async def run() -> Lag:
        with TransactionalProducer(_conf(net)) as p:
            p.init_transactions()

            async def load(deadline: float) -> int:
                records = 0
                while time.perf_counter() < deadline:
                    p.begin_transaction()
                    for _ in range(per_txn):
                        p.produce(topic, VALUE)
                    p.commit_transaction()
                    records += per_txn
                    await asyncio.sleep(0)
                return records

            return await _under_load(load, seconds)

    return asyncio.run(run())


LAG_LOADS: dict[str, Callable[[Network, str, int, float], Lag]] = {
    "async produce": lambda net, topic, per, s: _lag_async(net, topic, per, s, futures=False),
    "async send": lambda net, topic, per, s: _lag_async(net, topic, per, s, futures=True),
    "aiokafka": _lag_aiokafka,
    "sync on the loop": _lag_sync_on_loop,
}


def _lag_part(broker: Broker, net: Network, sizes: Sizes, rounds: int) -> None:
    def scenario(
        load: Callable[[Network, str, int, float], Lag], per_txn: int
    ) -> Callable[[], Lag]:
        return lambda: load(
            net, broker.create_topic(partitions=3, prefix="bench"), per_txn, sizes.lag_s
        )

    scenarios = {
        "no load (probe alone)": scenario(_lag_idle, 0),
        "no load, woken 0.5..5 ms": scenario(_lag_idle, 5),
    }
    for per_txn in (1000, 1):
        scenarios |= {
            f"{name} {per_txn}/txn": scenario(load, per_txn)
            for name, load in LAG_LOADS.items()
            if not (name == "async send" and per_txn == 1)
        }
    results = _rounds(scenarios, rounds, sizes.settle_s)
    print(f"\n2. event-loop lag: a task sleeping {PROBE_S * 1000:g} ms, how late it wakes, "
          f"while the load commits transactions for {sizes.lag_s:g} s; {rounds} rounds "
          f"(median of the runs' figures; p99 and max: min..max of the runs too)")  # fmt: skip
    print(f"{'load':<26}{'p50 ms':>8}{'p99 ms':>8}{'min..max':>14}{'max ms':>9}"
          f"{'min..max':>16}{'samples':>9}{'load rec/s':>12}{'GC max ms':>11}")  # fmt: skip
    for name, runs in results.items():
        p99, top = [r.p99 for r in runs], [r.max for r in runs]
        print(
            f"{name:<26}{statistics.median(r.p50 for r in runs):>8.2f}"
            f"{statistics.median(p99):>8.2f}{_range(p99, '{:.2f}'):>14}"
            f"{statistics.median(top):>9.2f}{_range(top, '{:.1f}'):>16}"
            f"{statistics.median(r.samples for r in runs):>9,.0f}"
            f"{statistics.median(r.rate for r in runs):>12,.0f}"
            f"{statistics.median(r.gc_max for r in runs):>11.2f}"
        )
    _load_average()


# ---------------------------------------------------------------------------- 3. dual write
def _table() -> Table:
    return Table(
        f"bench_{uuid.uuid4().hex[:10]}",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("value", String(100)),
    )


class _Steps:
    """Time from the start of each transaction, or from the step before, to each step of
    the recipe (``on_step``), for one writer used by one task or thread at a time."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {step: [] for step in STEPS}
        self.on = False
        self._last = 0.0

    def start(self) -> None:
        self._last = time.perf_counter()

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        if self.on:
            self.times[step].append(now - self._last)
        self._last = now


def _dual_sync(
    net: Network, jdbc: str, topic: str, count: int, rows: int, steps: _Steps | None = None
) -> Result:
    writer = DualWriter(_conf(net), jdbc, on_step=steps)
    writer.start()
    table = _table()
    table.create(writer.engine)
    values = [ROW] * rows
    with writer.transaction() as tx:  # the first waits for librdkafka's statistics
        tx.produce(topic, b"warm-up")
    clock = _Clock()
    for _ in range(count):
        if steps is not None:
            steps.on = True
            steps.start()
        with writer.transaction() as tx:
            tx.connection.execute(insert(table), values)
            for _ in range(rows):
                tx.produce(topic, VALUE)
    result = clock.result(count)
    if steps is not None:
        steps.on = False
    table.drop(writer.engine)
    writer.close()
    return result


async def _async_writer(
    net: Network, jdbc: str, topic: str, table: Table | None, steps: _Steps | None = None
) -> AsyncDualWriter:
    """A started AsyncDualWriter that has committed one transaction (not timed: the first
    waits for librdkafka's statistics); ``table`` created through its engine if given."""
    writer = AsyncDualWriter(_conf(net), jdbc, on_step=steps)
    await writer.start()
    if table is not None:
        async with writer.engine.begin() as conn:
            await conn.run_sync(table.create)
    async with writer.transaction() as tx:
        await tx.produce(topic, b"warm-up")
    return writer


async def _async_body(
    writer: AsyncDualWriter,
    table: Table,
    topic: str,
    count: int,
    rows: int,
    steps: _Steps | None = None,
) -> None:
    values = [ROW] * rows
    for _ in range(count):
        if steps is not None:
            steps.on = True
            steps.start()
        async with writer.transaction() as tx:
            await tx.connection.execute(insert(table), values)
            for _ in range(rows):
                await tx.produce(topic, VALUE)


async def _drop(writer: AsyncDualWriter, table: Table) -> None:
    async with writer.engine.begin() as conn:
        await conn.run_sync(table.drop)


def _dual_async(
    net: Network, jdbc: str, topic: str, count: int, rows: int, steps: _Steps | None = None
) -> Result:
    async def run() -> Result:
        table = _table()
        writer = await _async_writer(net, jdbc, topic, table, steps)
        clock = _Clock()
        await _async_body(writer, table, topic, count, rows, steps)
        result = clock.result(count)
        if steps is not None:
            steps.on = False
        await _drop(writer, table)
        await writer.close()
        return result

    return asyncio.run(run())


def _tasks_shared(net: Network, jdbc: str, topic: str, tasks: int, count: int) -> Result:
    """``tasks`` tasks, one AsyncDualWriter: they take turns."""

    async def run() -> Result:
        table = _table()
        writer = await _async_writer(net, jdbc, topic, table)
        clock = _Clock()
        await asyncio.gather(*(_async_body(writer, table, topic, count, 1) for _ in range(tasks)))
        result = clock.result(tasks * count)
        await _drop(writer, table)
        await writer.close()
        return result

    return asyncio.run(run())


def _tasks_own(net: Network, jdbc: str, topic: str, tasks: int, count: int) -> Result:
    """``tasks`` tasks, an AsyncDualWriter (transactional id, engine) each."""

    async def run() -> Result:
        table = _table()
        writers = [
            await _async_writer(net, jdbc, topic, table if i == 0 else None) for i in range(tasks)
        ]
        clock = _Clock()
        await asyncio.gather(*(_async_body(w, table, topic, count, 1) for w in writers))
        result = clock.result(tasks * count)
        await _drop(writers[0], table)
        for w in writers:
            await w.close()
        return result

    return asyncio.run(run())


def _threads_own(net: Network, jdbc: str, topic: str, threads: int, count: int) -> Result:
    """``threads`` threads, a sync DualWriter each (dual_write_bench.py --writers)."""
    writers = [DualWriter(_conf(net), jdbc) for _ in range(threads)]
    table = _table()
    for i, writer in enumerate(writers):
        writer.start()
        if i == 0:
            table.create(writer.engine)
        with writer.transaction() as tx:
            tx.produce(topic, b"warm-up")
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def body(writer: DualWriter) -> None:
        barrier.wait()
        try:
            for _ in range(count):
                with writer.transaction() as tx:
                    tx.connection.execute(insert(table), [ROW])
                    tx.produce(topic, VALUE)
        except BaseException as exc:
            errors.append(exc)

    running = [threading.Thread(target=body, args=(w,)) for w in writers]
    for t in running:
        t.start()
    barrier.wait()
    clock = _Clock()
    for t in running:
        t.join()
    result = clock.result(threads * count)
    if errors:
        raise errors[0]
    table.drop(writers[0].engine)
    for writer in writers:
        writer.close()
    return result


def _dual_part(broker: Broker, net: Network, sizes: Sizes, rounds: int, tasks: int) -> None:
    assert net.jdbc is not None
    pg = net.jdbc
    folder = Path(tempfile.mkdtemp(prefix="kafka-txn-async-bench-"))

    def sqlite() -> str:  # a fresh file per run: a growing database must favour no run
        return f"jdbc:sqlite:{folder / uuid.uuid4().hex[:10]}.sqlite"

    def scenario(
        fn: Callable[..., Result], db: str, n: int, m: int, *more: Any
    ) -> Callable[[], Result]:
        def run() -> Result:
            jdbc = pg if db == "PostgreSQL" else sqlite()
            return fn(net, jdbc, broker.create_topic(partitions=3, prefix="bench"), n, m, *more)

        return run

    scenarios: dict[str, Callable[[], Result]] = {}
    steps: dict[str, _Steps] = {}
    for db in ("PostgreSQL", "SQLite"):
        for rows in (1, 10):
            for kind, fn in (("sync", _dual_sync), ("async", _dual_async)):
                name = f"{db} {rows} row {kind}"
                steps[name] = _Steps()
                scenarios[name] = scenario(fn, db, sizes.dual_txns, rows, steps[name])
    concurrent = {
        f"{tasks} threads, a DualWriter each": scenario(
            _threads_own, "PostgreSQL", tasks, sizes.task_txns
        ),
        f"{tasks} tasks, one AsyncDualWriter": scenario(
            _tasks_shared, "PostgreSQL", tasks, sizes.task_txns
        ),
        f"{tasks} tasks, an AsyncDualWriter each": scenario(
            _tasks_own, "PostgreSQL", tasks, sizes.task_txns
        ),
    }
    results = _rounds(scenarios | concurrent, rounds, 0.0)
    print(f"\n3. dual write: {sizes.dual_txns} transactions per run (1 or 10 rows, a record "
          f"per row); {rounds} rounds")  # fmt: skip
    print(f"{'database, rows':<18}{'sync txn/s':>12}{'min..max':>12}{'async txn/s':>13}"
          f"{'min..max':>12}{'async vs sync':>20}{'CPU ms/txn sync':>17}{'async':>7}")  # fmt: skip
    for db in ("PostgreSQL", "SQLite"):
        for rows in (1, 10):
            s, a = results[f"{db} {rows} row sync"], results[f"{db} {rows} row async"]
            sr, ar = [r.rate for r in s], [r.rate for r in a]
            print(
                f"{f'{db}, {rows}':<18}{statistics.median(sr):>12,.0f}{_range(sr):>12}"
                f"{statistics.median(ar):>13,.0f}{_range(ar):>12}{_ratio(ar, sr):>20}"
                f"{statistics.median(r.process_ns for r in s) / 1e6:>17.2f}"
                f"{statistics.median(r.process_ns for r in a) / 1e6:>7.2f}"
            )
    print("\nmean ms until each step of the recipe, from the previous one (on_step; from "
          "the start of the transaction() for begin): they add up to a transaction")  # fmt: skip
    print(f"{'':<24}" + "".join(f"{step.removeprefix('after_'):>14}" for step in STEPS))
    for name, collected in steps.items():
        print(f"{name:<24}" + "".join(
            f"{statistics.fmean(collected.times[step]) * 1000:>14.2f}" for step in STEPS
        ))  # fmt: skip
    print(f"\nPostgreSQL, {tasks} at once, {sizes.task_txns} 1-row transactions each "
          "(txn/s of all together; process CPU per transaction)")  # fmt: skip
    base = [r.rate for r in results[f"{tasks} threads, a DualWriter each"]]
    print(f"{'':<40}{'txn/s':>8}{'min..max':>12}{'vs threads':>20}{'CPU ms/txn':>12}")
    for name in concurrent:
        rates = [r.rate for r in results[name]]
        vs = "" if name.endswith("a DualWriter each") else _ratio(rates, base)
        cpu = statistics.median(r.process_ns for r in results[name]) / 1e6
        print(f"{name:<40}{statistics.median(rates):>8,.0f}{_range(rates):>12}{vs:>20}{cpu:>12.2f}")
    _load_average()


def _database_versions(jdbc: str) -> str:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            pg = str(conn.execute(text("SHOW server_version")).scalar_one())
    finally:
        engine.dispose()
    return f"PostgreSQL {pg}; SQLite {sqlite3.sqlite_version}; aiokafka {aiokafka.__version__}"


PARTS = ("producer", "lag", "dual")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds (default 5; 2 with --quick)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="small numbers: a smoke test of every scenario"
    )
    parser.add_argument(
        "--only", nargs="+", choices=PARTS, default=list(PARTS), help="the parts to run"
    )
    parser.add_argument(
        "--tasks", type=int, default=4, help="concurrent tasks in part 3 (default 4)"
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() before measuring, as an application may once it has started: the "
        "garbage collector's full collections then skip every object made until then",
    )
    add_delay_argument(parser)
    add_broker_argument(parser)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else DEFAULT
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 5)
    jdbc = ensure_running("postgresql", POSTGRES_JDBC) if "dual" in args.only else None
    with (
        running_broker(args.broker) as broker,
        behind_delay(args.delay_ms, broker.bootstrap_servers, jdbc) as net,
    ):
        versions = _database_versions(jdbc) if jdbc else f"aiokafka {aiokafka.__version__}"
        print(environment(net, versions))
        if args.gc_freeze:
            gc.collect()
            gc.freeze()
            print(f"gc.freeze(): {gc.get_freeze_count():,} objects left out of collections")
        if "producer" in args.only:
            _producer_part(broker, net, sizes, rounds, check=args.quick)
        if "lag" in args.only:
            _lag_part(broker, net, sizes, rounds)
        if "dual" in args.only:
            _dual_part(broker, net, sizes, rounds, args.tasks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
