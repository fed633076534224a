"""Producer throughput, CPU and memory: kafka-txn against the raw confluent-kafka
transactional producer, measured in the same run on the same broker (the test rig's
choice, or the one ``--broker`` names: bench/_broker.py), both behind the same delay
proxy (``--delay-ms``, default 0: direct).

Scenarios (100-byte values, 3-partition topics, a fresh topic and producer per run):
200k records in 1000-record transactions through raw produce(), produce(),
produce_batch() ("batch") and send(); 20k records in 10-record transactions through raw
produce() and produce(), and the failure path: 10-record transactions, every other one
aborted ("+aborts"). "raw+cb" is raw with delivery reports handed to a C-level callable,
as kafka-txn's producer hands them: confluent-kafka's own cost per report. "err-only"
is an error-only producer (delivery.report.only.error=true: success reports dropped in
C), the others get every report. Runs are
interleaved and rotated; each figure is the median of its runs, with min..max, and each
ratio the median of the per-round ratios (a round runs every scenario once), with their
min..max. "CPU ns/rec" is the producing thread's CPU time per record
(``time.thread_time``), steadier than throughput on a shared machine.

Then the memory held per in-flight record (records produced, their delivery reports not
yet served, futures included): Python heap (tracemalloc) and C heap (glibc's
mallinfo2: librdkafka's copy of the record and its bookkeeping), raw produce() against
produce() and send(); and a 1M-record transaction through produce() and send() checks
that delivered records leave no Python object behind.

``--mock`` runs the CPU scenarios against librdkafka's mock cluster instead (no broker,
no network: the producing thread's own cost, with no broker sharing the machine's cores).

    python bench/producer_bench.py [--broker apache-kafka|noida] [--delay-ms 0]
        [--repeat 5] [--scale 1.0] [--mock] [--only 1000/txn] [--no-memory]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer

from bench._broker import add_broker_argument, running_broker
from bench._common import add_delay_argument, behind_delay, environment
from kafka_txn import TransactionalProducer
from kafka_txn.testing import MockCluster

VALUE = b"x" * 100
SETTLE_S = 1.0
"""Pause after each run on a real broker: it is still digesting the last run's records,
which would otherwise slow down whichever run comes next."""

Result = tuple[float, float]
"""(records per second, CPU nanoseconds per record on the producing thread)"""

TARGETS: dict[str, tuple[str, float]] = {
    # at 0 ms: throughput for send(), producing-thread CPU for produce()
    "send 1000/txn": ("rec/s", 0.85),
    "produce 1000/txn err-only": ("cpu", 1.3),
    "batch 1000/txn err-only": ("cpu", 1.1),
}


def _raw(
    bootstrap: str, topic: str, total: int, per_txn: int, aborts: bool = False, reports: str = ""
) -> Result:
    """Raw confluent-kafka; ``reports`` "all" or "err-only" hands delivery reports to a
    C-level callable (``dict.setdefault``) as kafka-txn's producer does, every one or
    failures only: what confluent-kafka itself costs per report, no Python frame."""
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "transactional.id": f"bench-{uuid.uuid4()}",
    }
    if reports:
        conf["on_delivery"] = {}.setdefault
        conf["delivery.report.only.error"] = reports == "err-only"
    p = Producer(conf)
    p.init_transactions()
    cpu = time.thread_time()
    start = time.perf_counter()
    for n in range(total // per_txn):
        p.begin_transaction()
        for _ in range(per_txn):
            try:
                p.produce(topic, VALUE)
            except BufferError:
                p.poll(0.05)
                p.produce(topic, VALUE)
        if aborts and n % 2:
            # Delivered first: right after a commit, an abort sent before the partitions
            # are registered is refused INVALID_TXN_STATE by Apache Kafka, which
            # librdkafka makes fatal (librdkafka issue 4849; kafka-txn's abort waits too).
            p.flush()
            p.abort_transaction()
        else:
            p.commit_transaction()
    elapsed = time.perf_counter() - start
    cpu = time.thread_time() - cpu
    p.flush()
    p.close()
    return total / elapsed, cpu / total * 1e9


def _ours(
    bootstrap: str, topic: str, total: int, per_txn: int, how: str, aborts: bool = False
) -> Result:
    """kafka-txn through ``how``: "produce", "send", "batch" (produce_batch), each with
    every delivery report, or with " err-only" (delivery.report.only.error=true)."""
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "transactional.id": f"bench-{uuid.uuid4()}",
    }
    if how.endswith(" err-only"):
        conf["delivery.report.only.error"] = True
    p = TransactionalProducer(conf)
    p.init_transactions()
    values = [VALUE] * per_txn
    cpu = time.thread_time()
    start = time.perf_counter()
    for n in range(total // per_txn):
        p.begin_transaction()
        if how.startswith("batch"):
            p.produce_batch(topic, values)
        else:
            send = p.send if how == "send" else p.produce
            for value in values:
                send(topic, value)
        if aborts and n % 2:
            p.abort_transaction()
        else:
            p.commit_transaction()
    elapsed = time.perf_counter() - start
    cpu = time.thread_time() - cpu
    p.close()
    return total / elapsed, cpu / total * 1e9


_MALLINFO2_FIELDS = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)
"""glibc's ``struct mallinfo2``, every field a size_t."""


def _mallinfo() -> Callable[[], int] | None:
    """Bytes glibc's malloc has handed out (all arenas), or None off glibc."""
    try:
        libc = ctypes.CDLL(None)
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2_FIELDS]

    mallinfo2.restype = Info

    def in_use() -> int:
        info = mallinfo2()
        return int(info.uordblks + info.hblkhd)

    return in_use


def _held_in_flight(
    bootstrap: str, topic: str, scenario: str, records: int, python_heap: bool
) -> float:
    """Bytes per record held while ``records`` records wait for their delivery reports
    (none is served: no poll), on the Python heap (tracemalloc) or the C heap."""
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "transactional.id": f"bench-mem-{uuid.uuid4()}",
    }
    if scenario.endswith("err-only"):
        conf["delivery.report.only.error"] = True
    p: Producer | TransactionalProducer = (
        Producer(conf) if scenario == "raw" else TransactionalProducer(conf)
    )
    p.init_transactions()
    p.begin_transaction()
    call = p.send if isinstance(p, TransactionalProducer) and scenario == "send" else p.produce
    measure = _mallinfo()
    gc.collect()
    if python_heap:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
    else:
        assert measure is not None
        before = measure()
    for _ in range(records):
        call(topic, VALUE)  # futures are dropped: librdkafka keeps them until the report
    if python_heap:
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    else:
        assert measure is not None
        held = measure() - before
    p.commit_transaction()
    p.close() if isinstance(p, TransactionalProducer) else (p.flush(), p.close())
    return held / records


def _held_after_delivery(bootstrap: str, topic: str, records: int, futures: bool) -> int:
    """Python objects left once a ``records``-record transaction's reports were served."""
    conf = {"bootstrap.servers": bootstrap, "transactional.id": f"bench-mem-{uuid.uuid4()}"}
    with TransactionalProducer(conf) as p:
        p.init_transactions()
        p.begin_transaction()
        send = p.send if futures else p.produce
        gc.collect()
        before = len(gc.get_objects())
        for _ in range(records):
            send(topic, VALUE)
        p.flush()
        gc.collect()
        held = len(gc.get_objects()) - before
        p.commit_transaction()
        return held


def _ratios(
    results: dict[str, list[Result]], name: str, base: str, index: int
) -> tuple[float, float, float]:
    """Median, min and max of the per-round ratios of ``name`` to ``base``."""
    per_round = [r[index] / b[index] for r, b in zip(results[name], results[base], strict=True)]
    return statistics.median(per_round), min(per_round), max(per_round)


def _report(results: dict[str, list[Result]]) -> None:
    print(
        f"\n{'scenario':<27}{'median rec/s':>13}{'min..max':>21}{'vs raw':>19}"
        f"{'CPU ns/rec':>11}{'min..max':>15}{'vs raw':>19}  target"
    )
    for name, runs in results.items():
        base = "raw 1000/txn" if "1000" in name else "raw 10/txn"
        if name.endswith("+aborts") or "+aborts " in name:
            base += " +aborts"
        rates, cpus = [r[0] for r in runs], [r[1] for r in runs]
        line = f"{name:<27}{statistics.median(rates):>13,.0f}"
        line += f"{f'{min(rates):,.0f}..{max(rates):,.0f}':>21}"
        rate_ratio = cpu_ratio = ""
        if name not in (base, "raw 10/txn", "raw 1000/txn") and base in results:
            med, lo, hi = _ratios(results, name, base, 0)
            rate_ratio = f"{med:.2f}x ({lo:.2f}..{hi:.2f})"
            med, lo, hi = _ratios(results, name, base, 1)
            cpu_ratio = f"{med:.2f}x ({lo:.2f}..{hi:.2f})"
        line += f"{rate_ratio:>19}{statistics.median(cpus):>11,.0f}"
        line += f"{f'{min(cpus):,.0f}..{max(cpus):,.0f}':>15}{cpu_ratio:>19}"
        target = TARGETS.get(name)
        if target is not None:
            line += f"  {'rec/s >=' if target[0] == 'rec/s' else 'CPU <='} {target[1]}"
        print(line)


def _run_rounds(
    scenarios: dict[str, Callable[[], Result]], repeat: int, settle: float
) -> dict[str, list[Result]]:
    results: dict[str, list[Result]] = {name: [] for name in scenarios}
    names = list(scenarios)
    for round_no in range(repeat):
        # Interleaved and rotated, so drift and position in a round hit all alike.
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(scenarios[name]())
            time.sleep(settle)
    return results


def _scenarios(
    bootstrap: str, fresh: Callable[[], str], scale: float, only: str
) -> dict[str, Callable[[], Result]]:
    big, small = int(200_000 * scale), int(20_000 * scale)
    every: dict[str, Callable[[], Result]] = {
        "raw 1000/txn": lambda: _raw(bootstrap, fresh(), big, 1000),
        "raw+cb 1000/txn": lambda: _raw(bootstrap, fresh(), big, 1000, reports="all"),
        "raw+cb 1000/txn err-only": lambda: _raw(bootstrap, fresh(), big, 1000, reports="err-only"),
        "produce 1000/txn": lambda: _ours(bootstrap, fresh(), big, 1000, "produce"),
        "produce 1000/txn err-only": lambda: _ours(
            bootstrap, fresh(), big, 1000, "produce err-only"
        ),
        "batch 1000/txn": lambda: _ours(bootstrap, fresh(), big, 1000, "batch"),
        "batch 1000/txn err-only": lambda: _ours(bootstrap, fresh(), big, 1000, "batch err-only"),
        "send 1000/txn": lambda: _ours(bootstrap, fresh(), big, 1000, "send"),
        "raw 10/txn": lambda: _raw(bootstrap, fresh(), small, 10),
        "produce 10/txn": lambda: _ours(bootstrap, fresh(), small, 10, "produce"),
        "produce 10/txn err-only": lambda: _ours(bootstrap, fresh(), small, 10, "produce err-only"),
        "raw 10/txn +aborts": lambda: _raw(bootstrap, fresh(), small, 10, aborts=True),
        "produce 10/txn +aborts err-only": lambda: _ours(
            bootstrap, fresh(), small, 10, "produce err-only", aborts=True
        ),
    }
    return {name: run for name, run in every.items() if only in name}


def _memory_report(bootstrap: str, fresh: Callable[[], str], scale: float) -> None:
    records = int(50_000 * scale)
    rows = []
    for scenario in ("raw", "produce", "produce err-only", "send"):
        py = statistics.median(
            _held_in_flight(bootstrap, fresh(), scenario, records, True) for _ in range(3)
        )
        c = (
            statistics.median(
                _held_in_flight(bootstrap, fresh(), scenario, records, False) for _ in range(3)
            )
            if _mallinfo() is not None
            else float("nan")
        )
        rows.append((scenario, py, c))
    print(f"\nmemory per in-flight record ({records:,} records, reports not served yet):")
    print(f"{'':<18}{'Python heap B':>15}{'C heap B':>10}{'total B':>9}")
    for scenario, py, c in rows:
        print(f"{scenario:<18}{py:>15,.0f}{c:>10,.0f}{py + c:>9,.0f}")
    total = int(1_000_000 * scale)
    for futures in (False, True):
        held = _held_after_delivery(bootstrap, fresh(), total, futures)
        call = "send()" if futures else "produce()"
        print(f"{total:,}-record transaction through {call}: Python objects held after "
              f"delivery: {held}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply record counts")
    parser.add_argument(
        "--mock", action="store_true", help="librdkafka's mock cluster instead of a broker"
    )
    parser.add_argument(
        "--only", default="", help="run the scenarios whose name contains this (e.g. 1000/txn)"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory figures")
    add_delay_argument(parser)
    add_broker_argument(parser)
    args = parser.parse_args(argv)

    if args.mock:
        if args.delay_ms:
            parser.error("--mock has no network to delay")
        if args.broker:
            parser.error("--mock runs on librdkafka's mock cluster, not on a broker")
        mock = MockCluster(brokers=1)
        names = (f"bench-{n}" for n in range(1_000_000))

        def mock_topic() -> str:
            name = next(names)
            mock.create_topic(name, partitions=3)
            return name

        print(f"{environment()}; librdkafka mock cluster")
        try:
            scenarios = _scenarios(mock.bootstrap_servers, mock_topic, args.scale, args.only)
            _report(_run_rounds(scenarios, args.repeat, settle=0.0))
            if not args.no_memory:
                _memory_report(mock.bootstrap_servers, mock_topic, args.scale)
        finally:
            mock.close()
        return 0

    with (
        running_broker(args.broker) as broker,
        behind_delay(args.delay_ms, broker.bootstrap_servers) as net,
    ):
        print(environment(net))

        def fresh() -> str:  # a new topic per run: a growing log must favour no run
            return broker.create_topic(partitions=3, prefix="bench")

        scenarios = _scenarios(net.bootstrap_servers, fresh, args.scale, args.only)
        _report(_run_rounds(scenarios, args.repeat, settle=SETTLE_S))
        if not args.no_memory:
            _memory_report(net.bootstrap_servers, fresh, args.scale)
    return 0


if __name__ == "__main__":
    sys.exit(main())
