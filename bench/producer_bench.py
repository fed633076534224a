"""Producer throughput: kafka-txn against the raw confluent-kafka transactional producer,
measured in the same run on the same broker (the test rig's: KAFKA_BOOTSTRAP_SERVERS, else
testcontainers, else a local noida-db).

Scenarios (100-byte values): 200k records in 1000-record transactions through produce()
and send(); 20k records in 10-record transactions through produce(). Runs are interleaved
and repeated; the median of each is reported with its ratio to raw. Then a 1M-record
transaction checks that delivered records leave no Python object behind.

    python bench/producer_bench.py [--repeat 5] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer

from kafka_txn import TransactionalProducer
from tests.rig import Broker, start_broker

VALUE = b"x" * 100
SETTLE_S = 1.0
"""Pause after each run: the broker is still digesting the last run's records, which
would otherwise slow down whichever run comes next."""


Result = tuple[float, float]
"""(records per second, CPU nanoseconds per record on the producing thread)"""


def _raw(conf: dict[str, object], topic: str, total: int, per_txn: int) -> Result:
    p = Producer(conf)
    p.init_transactions()
    cpu = time.thread_time()
    start = time.perf_counter()
    for _ in range(total // per_txn):
        p.begin_transaction()
        for _ in range(per_txn):
            try:
                p.produce(topic, VALUE)
            except BufferError:
                p.poll(0.05)
                p.produce(topic, VALUE)
        p.commit_transaction()
    elapsed = time.perf_counter() - start
    cpu = time.thread_time() - cpu
    p.flush()
    p.close()
    return total / elapsed, cpu / total * 1e9


def _ours(conf: dict[str, object], topic: str, total: int, per_txn: int, futures: bool) -> Result:
    p = TransactionalProducer(conf)
    p.init_transactions()
    send = p.send if futures else p.produce
    cpu = time.thread_time()
    start = time.perf_counter()
    for _ in range(total // per_txn):
        p.begin_transaction()
        for _ in range(per_txn):
            send(topic, VALUE)
        p.commit_transaction()
    elapsed = time.perf_counter() - start
    cpu = time.thread_time() - cpu
    p.close()
    return total / elapsed, cpu / total * 1e9


def _memory_check(broker: Broker, topic: str, records: int) -> tuple[int, float]:
    conf = {
        "bootstrap.servers": broker.bootstrap_servers,
        "transactional.id": f"bench-mem-{uuid.uuid4().hex[:6]}",
    }
    with TransactionalProducer(conf) as p:
        p.init_transactions()
        p.begin_transaction()
        gc.collect()
        before = len(gc.get_objects())
        start = time.perf_counter()
        for _ in range(records):
            p.produce(topic, VALUE)
        p.flush()
        gc.collect()
        held = len(gc.get_objects()) - before
        p.commit_transaction()
        return held, records / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply record counts")
    args = parser.parse_args(argv)

    broker = start_broker()
    try:
        print(f"broker: {broker.description}")

        def conf() -> dict[str, object]:
            return {
                "bootstrap.servers": broker.bootstrap_servers,
                "transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
            }

        big, small = int(200_000 * args.scale), int(20_000 * args.scale)

        def fresh() -> str:  # a new topic per run: a growing log must not favour any run
            return broker.create_topic(partitions=3, prefix="bench")

        scenarios: dict[str, Callable[[], Result]] = {
            "raw 1000/txn": lambda: _raw(conf(), fresh(), big, 1000),
            "produce 1000/txn": lambda: _ours(conf(), fresh(), big, 1000, futures=False),
            "send 1000/txn": lambda: _ours(conf(), fresh(), big, 1000, futures=True),
            "raw 10/txn": lambda: _raw(conf(), fresh(), small, 10),
            "produce 10/txn": lambda: _ours(conf(), fresh(), small, 10, futures=False),
        }
        results: dict[str, list[Result]] = {name: [] for name in scenarios}
        names = list(scenarios)
        for round_no in range(args.repeat):
            # Interleaved and rotated, so drift and position in a round hit all alike.
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                results[name].append(scenarios[name]())
                time.sleep(SETTLE_S)
        med = {name: statistics.median(r[0] for r in v) for name, v in results.items()}
        cpu = {name: statistics.median(r[1] for r in v) for name, v in results.items()}

        print(
            f"\n{'scenario':<18}{'median rec/s':>13}{'min..max':>21}{'vs raw':>8}"
            f"{'target':>8}{'CPU ns/rec':>12}{'vs raw':>8}"
        )
        targets = {"produce 1000/txn": 0.95, "send 1000/txn": 0.85, "produce 10/txn": 0.9}
        for name, value in med.items():
            base = "raw 1000/txn" if "1000" in name else "raw 10/txn"
            target = targets.get(name)
            raw = name.startswith("raw")
            ratio = "" if raw else f"{value / med[base]:.2f}x"
            cpu_ratio = "" if raw else f"{cpu[name] / cpu[base]:.2f}x"
            rates = [r[0] for r in results[name]]
            spread = f"{min(rates):,.0f}..{max(rates):,.0f}"
            goal = "" if target is None else f">={target}"
            print(
                f"{name:<18}{value:>13,.0f}{spread:>21}{ratio:>8}{goal:>8}"
                f"{cpu[name]:>12,.0f}{cpu_ratio:>8}"
            )

        records = int(1_000_000 * args.scale)
        held, rate = _memory_check(broker, broker.create_topic(partitions=3), records)
        print(
            f"\n{records:,}-record transaction: {rate:,.0f} rec/s; "
            f"Python objects held after delivery: {held}"
        )
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
