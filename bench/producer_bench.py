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


def _raw(conf: dict[str, object], topic: str, total: int, per_txn: int) -> float:
    p = Producer(conf)
    p.init_transactions()
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
    p.flush()
    p.close()
    return total / elapsed


def _ours(conf: dict[str, object], topic: str, total: int, per_txn: int, futures: bool) -> float:
    p = TransactionalProducer(conf)
    p.init_transactions()
    send = p.send if futures else p.produce
    start = time.perf_counter()
    for _ in range(total // per_txn):
        p.begin_transaction()
        for _ in range(per_txn):
            send(topic, VALUE)
        p.commit_transaction()
    elapsed = time.perf_counter() - start
    p.close()
    return total / elapsed


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

        scenarios: dict[str, Callable[[], float]] = {
            "raw 1000/txn": lambda: _raw(conf(), fresh(), big, 1000),
            "produce 1000/txn": lambda: _ours(conf(), fresh(), big, 1000, futures=False),
            "send 1000/txn": lambda: _ours(conf(), fresh(), big, 1000, futures=True),
            "raw 10/txn": lambda: _raw(conf(), fresh(), small, 10),
            "produce 10/txn": lambda: _ours(conf(), fresh(), small, 10, futures=False),
        }
        results: dict[str, list[float]] = {name: [] for name in scenarios}
        names = list(scenarios)
        for round_no in range(args.repeat):
            # Interleaved and rotated, so drift and position in a round hit all alike.
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                results[name].append(scenarios[name]())
                time.sleep(SETTLE_S)
        med = {name: statistics.median(v) for name, v in results.items()}

        print(f"\n{'scenario':<20}{'median rec/s':>14}{'min..max':>22}{'vs raw':>9}{'target':>9}")
        targets = {"produce 1000/txn": 0.95, "send 1000/txn": 0.85, "produce 10/txn": 0.9}
        for name, value in med.items():
            base = med["raw 1000/txn" if "1000" in name else "raw 10/txn"]
            target = targets.get(name)
            ratio = "" if name.startswith("raw") else f"{value / base:.2f}x"
            spread = f"{min(results[name]):,.0f}..{max(results[name]):,.0f}"
            goal = "" if target is None else f">={target}"
            print(f"{name:<20}{value:>14,.0f}{spread:>22}{ratio:>9}{goal:>9}")

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
