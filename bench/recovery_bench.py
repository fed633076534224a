"""Startup cost of recovery with many per-partition state rows: what a Spark
sink (or any fleet of DualWriters) pays after a restart when ``--ids`` transactional ids
of one prefix each have a state row, ``--unfinished`` of them left prepared in Kafka
after their database commit (a task killed between its two commits).

Measured on the test rig's broker (or the one ``--broker`` names: bench/_broker.py), with
Kafka and PostgreSQL behind the delay proxy (``--delay-ms``):

- the driver's scan for unfinished state rows before a batch (``Ledger.unfinished``:
  one SELECT of the prefix's rows, the states in the written completed form proven by
  a regex, the others parsed), median of 5, interleaved with the scan as it was (every row
  parsed), once while the ids are unfinished and once after they are all settled;
- settling every unfinished id on the driver, as ``KafkaJdbcSink`` does before the next
  batch (a DualWriter per id: ``start()`` recovers, commits the prepared transaction,
  stores the state completed, fences, closes). With ``--compare`` (the default), a
  quarter of the ids one by one with an engine each (as the sink did before), then
  two quarters with the sink's ``settle_unfinished`` (``--threads`` at once, one
  engine), then the last quarter one by one again; ``--no-compare`` settles all of them
  with ``settle_unfinished``;
- ``DualWriter.start()`` of an id whose state is completed, what each executor task pays
  for its first batch after a restart (init, recovery that finds nothing, fence), per
  id, over ``--starts`` ids, interleaved with its raw confluent-kafka baseline: a
  ``Producer()`` + ``init_transactions()`` on a fresh id, the handshake any
  transactional producer pays before its first transaction.

The state rows are made for real (one DualWriter transaction per id, directly, not
through the proxy): ``--ids`` producers are initialised, which takes a while.

    python bench/recovery_bench.py [--broker apache-kafka|noida] [--delay-ms 0]
        [--ids 1000] [--unfinished 1000] [--starts 50] [--threads 8] [--no-compare]
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
from sqlalchemy import Column, MetaData, String, Table, create_engine, select, text
from sqlalchemy.engine import Engine

from bench._broker import add_broker_argument, running_broker
from bench._common import Network, add_delay_argument, behind_delay, environment
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import InvalidPreparedStateError, TransactionInDoubtError
from kafka_txn.spark.ledger import Ledger
from kafka_txn.spark.settle import SETTLE_THREADS, settle_unfinished
from kafka_txn.state import PreparedTxnState
from kafka_txn.twophase.recovery import TransactionOutcome
from tests.support.databases import POSTGRES_JDBC, ensure_running


class _StopError(Exception):
    """Raised by the step hook right after the database commit: Kafka stays prepared."""


def _stop_after_db_commit(step: str) -> None:
    if step == "after_db_commit":
        raise _StopError


def _make_rows(
    bootstrap: str, engine: Engine, prefix: str, state: str, ids: int, unfinished: int, topic: str
) -> None:
    for i in range(ids):
        hook = _stop_after_db_commit if i < unfinished else None
        conf = {"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}-{i}"}
        writer = DualWriter(
            conf, engine, state_table=state, on_step=hook, mark_completed_after=None
        )
        try:
            writer.start()
            try:
                with writer.transaction() as tx:
                    tx.produce(topic, b"%d" % i)
            except TransactionInDoubtError:
                pass  # committed in the database, prepared in Kafka (the hook stopped it)
        finally:
            writer.close()
        if (i + 1) % 100 == 0:
            print(f"  {i + 1} state rows", flush=True)


def _scan_by_parsing(ledger: Ledger) -> list[str]:
    """The scan as it was before the SQL filter: every row of the prefix parsed."""
    tid = ledger.state.c.transactional_id
    head = f"{ledger.prefix}-"
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            select(tid, ledger.state.c.prepared_txn_state).where(
                tid.startswith(head, autoescape=True)
            )
        ).all()
    found = []
    for name, stored in rows:
        if not name[len(head) :].isdigit():
            continue
        try:
            state = PreparedTxnState.parse(stored)
        except InvalidPreparedStateError:
            found.append(name)
            continue
        if not (state.completed or state.is_empty):
            found.append(name)
    return sorted(found, key=lambda name: int(name[len(head) :]))


def _scans(ledger: Ledger, what: str) -> list[str]:
    """Old scan (parse every row) and new (is_settled) interleaved, 5 each."""
    old, new = [], []
    found: list[str] = []
    for _ in range(5):
        for scan, times in ((lambda: _scan_by_parsing(ledger), old), (ledger.unfinished, new)):
            t0 = time.perf_counter()
            found = scan()
            times.append(time.perf_counter() - t0)
    for label, times in (
        ("every row parsed (before)", old),
        ("written completed form proven by a regex (now)", new),
    ):
        print(
            f"scan of the prefix's state rows, {what}, {label}: "
            f"{statistics.median(times) * 1000:.1f} ms (median of 5; "
            f"{min(times) * 1000:.1f}..{max(times) * 1000:.1f}); found {len(found)}"
        )
    return found


def _settle_one_by_one(
    net: Network, state: str, tids: list[str], outcomes: dict[str, int]
) -> list[float]:
    """Before: one id after the other, each with a new engine (the sink's old _settle)."""
    assert net.jdbc is not None
    times = []
    for tid in tids:
        t1 = time.perf_counter()
        engine = create_engine(jdbc_to_sqlalchemy(net.jdbc))
        writer = DualWriter(
            {"bootstrap.servers": net.bootstrap_servers, "transactional.id": tid},
            engine, state_table=state,
        )  # fmt: skip
        try:
            outcome = writer.start()
        finally:
            writer.close()
        outcomes[outcome.value] = outcomes.get(outcome.value, 0) + 1
        times.append(time.perf_counter() - t1)
    return times


def _settle_in_parallel(
    net: Network, engine: Engine, state: str, tids: list[str], threads: int
) -> float:
    """Now: the sink's settle_unfinished, on the driver's one engine."""
    t0 = time.perf_counter()
    settle_unfinished(
        tids, kafka={"bootstrap.servers": net.bootstrap_servers}, engine=engine,
        state_table=state, lock_timeout=30.0, threads=threads,
    )  # fmt: skip
    return time.perf_counter() - t0


def _measure(net: Network, prefix: str, state: str, args: argparse.Namespace) -> None:
    assert net.jdbc is not None
    # Pooled as the sink's driver engine is (QueuePool, 5 kept), with room for the threads.
    engine = create_engine(jdbc_to_sqlalchemy(net.jdbc), max_overflow=max(10, args.threads))
    table = Table(
        state, MetaData(), Column("transactional_id", String(255)),
        Column("prepared_txn_state", String),
    )  # fmt: skip
    ledger = Ledger(engine, prefix, f"bench_commits_{uuid.uuid4().hex[:8]}", table)
    found = _scans(ledger, f"{args.unfinished} of {args.ids} unfinished")
    outcomes: dict[str, int] = {}
    if args.compare and found:
        # ABBA over four slices: half the ids one by one (before), half in parallel.
        quarter = -(-len(found) // 4)
        slices = [found[i * quarter : (i + 1) * quarter] for i in range(4)]
        one_by_one: list[float] = []
        parallel, parallel_ids = 0.0, 0
        for i, part in enumerate(slices):
            if not part:
                continue
            if i in (0, 3):
                one_by_one += _settle_one_by_one(net, state, part, outcomes)
            else:
                parallel += _settle_in_parallel(net, engine, state, part, args.threads)
                parallel_ids += len(part)
        total = sum(one_by_one)
        print(
            f"settling, before (one by one, an engine each), {len(one_by_one)} ids: "
            f"{total:.1f} s, {total / len(one_by_one) * 1000:.1f} ms per id (mean; median "
            f"{statistics.median(one_by_one) * 1000:.1f}, "
            f"{min(one_by_one) * 1000:.1f}..{max(one_by_one) * 1000:.1f}); "
            f"x{1000 / len(one_by_one):.2f} for 1,000 ids: "
            f"{total / len(one_by_one) * 1000:.1f} s"
        )
        print(
            f"settling, now ({args.threads} threads, one engine), {parallel_ids} ids: "
            f"{parallel:.1f} s, {parallel / parallel_ids * 1000:.1f} ms per id (mean); "
            f"for 1,000 ids: {parallel / parallel_ids * 1000:.1f} s; "
            f"ratio now/before {parallel / parallel_ids / (total / len(one_by_one)):.3f}"
        )
    elif found:
        total = _settle_in_parallel(net, engine, state, found, args.threads)
        print(
            f"settling {len(found)} unfinished ids on the driver ({args.threads} threads, "
            f"one engine): {total:.1f} s, {total / len(found) * 1000:.1f} ms per id (mean)"
        )
    assert outcomes.get(TransactionOutcome.COMMITTED.value, 0) <= len(found)
    assert ledger.unfinished() == [], "every id settled"
    _scans(ledger, f"all {args.ids} completed (every batch's case)")
    starts: list[float] = []
    raw: list[float] = []
    for i in range(min(args.starts, args.ids)):
        conf = {"bootstrap.servers": net.bootstrap_servers,
                "transactional.id": f"{prefix}-{args.ids - 1 - i}"}  # fmt: skip
        t1 = time.perf_counter()
        writer = DualWriter(conf, engine, state_table=state)
        writer.start()
        starts.append(time.perf_counter() - t1)
        writer.close()
        raw.append(_raw_init(net.bootstrap_servers, f"{prefix}-raw-{i}"))
    for label, times in (
        ("DualWriter() + start() of an id whose state is completed (a task's first "
         "batch after a restart)", starts),
        ("raw confluent-kafka Producer() + init_transactions() of a fresh id", raw),
    ):  # fmt: skip
        print(
            f"{label}: {statistics.median(times) * 1000:.1f} ms (median of {len(times)}; "
            f"{min(times) * 1000:.1f}..{max(times) * 1000:.1f})"
        )
    print(
        f"ratio of medians: {statistics.median(starts) / statistics.median(raw):.2f}x raw; "
        f"per interleaved pair: median "
        f"{statistics.median(s / r for s, r in zip(starts, raw, strict=True)):.2f}x"
    )
    engine.dispose()


def _raw_init(bootstrap: str, transactional_id: str) -> float:
    """Seconds a raw confluent-kafka transactional producer takes to be created and
    initialised (InitProducerId) on a new transactional id."""
    t0 = time.perf_counter()
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions()
    elapsed = time.perf_counter() - t0
    producer.close()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_delay_argument(parser)
    add_broker_argument(parser)
    parser.add_argument("--ids", type=int, default=1000)
    parser.add_argument("--unfinished", type=int, default=1000)
    parser.add_argument("--starts", type=int, default=50)
    parser.add_argument("--threads", type=int, default=SETTLE_THREADS,
                        help="settling threads (the sink's default)")  # fmt: skip
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True,
                        help="settle half the ids one by one, as before, ABBA")  # fmt: skip
    args = parser.parse_args(argv)
    jdbc = ensure_running("postgresql", POSTGRES_JDBC)
    prefix = f"bench-rec-{uuid.uuid4().hex[:8]}"
    state = f"bench_state_{uuid.uuid4().hex[:8]}"
    with running_broker(args.broker) as broker:
        direct = create_engine(jdbc_to_sqlalchemy(jdbc))
        try:
            topic = broker.create_topic(3)
            started = time.perf_counter()
            print(f"making {args.ids} state rows ({args.unfinished} left prepared in Kafka)...")
            _make_rows(
                broker.bootstrap_servers, direct, prefix, state, args.ids, args.unfinished, topic
            )
            print(f"made in {time.perf_counter() - started:.0f} s")
            with behind_delay(args.delay_ms, broker.bootstrap_servers, jdbc) as net:
                print(environment(net))
                _measure(net, prefix, state, args)
        finally:
            with direct.begin() as conn:
                conn.execute(text(f'DROP TABLE IF EXISTS "{state}"'))
            direct.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
