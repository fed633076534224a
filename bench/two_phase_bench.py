"""Two-phase commit latency: 10-record transactions through prepare_transaction() +
complete_transaction() against the raw confluent-kafka flush() + commit_transaction(), in
the same run, on the same broker (the test rig's choice, or the one ``--broker`` names:
bench/_broker.py), both behind the same delay proxy (``--delay-ms``, default 0: direct).
Runs are interleaved; the ratio is of the medians of all transactions, and each
interleaved pair's ratio is shown too.

Also shows that only the first prepare after init_transactions() waits for a librdkafka
statistics snapshot (the producer id/epoch); steady-state prepares do not.

    python bench/two_phase_bench.py [--broker apache-kafka|noida] [--delay-ms 0]
        [--transactions 300] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer

from bench._broker import add_broker_argument, running_broker
from bench._common import add_delay_argument, behind_delay, environment
from kafka_txn import TransactionalProducer

VALUE = b"x" * 100
AHEAD = [0, 0]
"""Prepares that used the DescribeTransactions sent during their flush, and all prepares."""
STEPS: dict[str, list[float]] = {}
"""Seconds per step of each timed transaction, raw and two-phase (see _steps)."""
RAW_STEPS = ("raw: begin", "raw: produce x10", "raw: flush", "raw: commit")
TWO_PHASE_STEPS = (
    "two-phase: begin (spacing wait included)",
    "two-phase: produce x10",
    "two-phase: prepare (flush, DescribeTransactions)",
    "two-phase: complete (EndTxn)",
)
RECORDS = 10


def _steps(names: tuple[str, ...], times: tuple[float, ...]) -> None:
    """Record the time between consecutive ``times`` under ``names``."""
    for name, start, end in zip(names, times, times[1:], strict=False):
        STEPS.setdefault(name, []).append(end - start)


def _raw(bootstrap: str, topic: str, count: int) -> list[float]:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    p.init_transactions()
    latencies = []
    for i in range(count + 1):
        start = time.perf_counter()
        p.begin_transaction()
        at = time.perf_counter()
        for _ in range(RECORDS):
            p.produce(topic, VALUE)
        flushing = time.perf_counter()
        p.flush()
        committing = time.perf_counter()
        p.commit_transaction()
        end = time.perf_counter()
        if i > 0:  # the first one warms up (metadata, connections), as below
            latencies.append(end - start)
            _steps(RAW_STEPS, (start, at, flushing, committing, end))
    p.close()
    return latencies


def _two_phase(bootstrap: str, topic: str, count: int) -> tuple[list[float], float, float]:
    p = TransactionalProducer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": uuid.uuid4().hex,
            "transaction.two.phase.commit.enable": True,
        }
    )
    p.init_transactions()
    latencies = []
    first_prepare = 0.0
    for i in range(count + 1):
        start = time.perf_counter()
        p.begin_transaction()
        at = time.perf_counter()
        for _ in range(RECORDS):
            p.produce(topic, VALUE)
        before = time.perf_counter()
        state = p.prepare_transaction()
        completing = time.perf_counter()
        if i == 0:
            first_prepare = completing - before
        p.complete_transaction(state)
        end = time.perf_counter()
        if i > 0:  # the first one, right after init, waits for statistics
            latencies.append(end - start)
            _steps(TWO_PHASE_STEPS, (start, at, before, completing, end))
    assert p._twophase is not None
    spacing = p._twophase.spacing_wait_s / (count + 1)
    AHEAD[0] += p._twophase.describes_ahead_used
    AHEAD[1] += count + 1
    p.close()
    return latencies, first_prepare, spacing


def _ms(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000 if q < 100 else max(values) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_delay_argument(parser)
    add_broker_argument(parser)
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with running_broker(args.broker) as broker:
        with behind_delay(args.delay_ms, broker.bootstrap_servers) as net:
            print(environment(net))
            raw: list[float] = []
            ours: list[float] = []
            pairs: list[float] = []
            firsts: list[float] = []
            spacing: list[float] = []
            for i in range(args.repeat):  # interleaved, alternating who goes first
                order = ("raw", "ours") if i % 2 == 0 else ("ours", "raw")
                run: dict[str, list[float]] = {}
                for who in order:
                    topic = broker.create_topic(3)
                    if who == "raw":
                        run[who] = _raw(net.bootstrap_servers, topic, args.transactions)
                    else:
                        run[who], first, wait = _two_phase(
                            net.bootstrap_servers, topic, args.transactions
                        )
                        firsts.append(first)
                        spacing.append(wait)
                raw += run["raw"]
                ours += run["ours"]
                pairs.append(statistics.median(run["ours"]) / statistics.median(run["raw"]))
        med_raw, med_ours = statistics.median(raw), statistics.median(ours)
        print(f"\n{'10-record transaction':<32}{'median ms':>10}{'p99 ms':>9}{'max ms':>9}")
        for name, values in (("raw flush + commit", raw), ("prepare + complete", ours)):
            print(
                f"{name:<32}{statistics.median(values) * 1000:>10.2f}"
                f"{_ms(values, 99):>9.2f}{max(values) * 1000:>9.2f}"
            )
        print(
            f"\nmedian latency ratio: {med_ours / med_raw:.2f}x (target <= 1.3 at 1 ms, "
            f"<= 1.6 at 0 ms); per interleaved pair: "
            + ", ".join(f"{x:.2f}" for x in sorted(pairs))
        )
        for names in (RAW_STEPS, TWO_PHASE_STEPS):
            print("median ms per step: " + "; ".join(
                f"{name} {statistics.median(STEPS[name]) * 1000:.2f}" for name in names
            ))  # fmt: skip
        print(f"prepares whose DescribeTransactions overlapped the flush: {AHEAD[0]} of {AHEAD[1]}")
        print(
            f"the start-time spacing guard slept {statistics.mean(spacing) * 1000:.2f}"
            " ms per transaction on average (see twophase.TwoPhase.space_transactions)"
        )
        print(
            f"first prepare after init (waits for statistics): "
            f"{statistics.median(firsts) * 1000:.1f} ms; steady-state p99 above stays "
            "below the 100 ms statistics interval: no wait"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
