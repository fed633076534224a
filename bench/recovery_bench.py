"""Startup cost of recovery with many per-partition state rows (issue 13): what a Spark
sink (or any fleet of DualWriters) pays after a restart when ``--ids`` transactional ids
of one prefix each have a state row, ``--unfinished`` of them left prepared in Kafka
after their database commit (a task killed between its two commits).

Measured, with Kafka and PostgreSQL behind the delay proxy (``--delay-ms``):

- the driver's scan for unfinished state rows before a batch (``Ledger.unfinished``,
  one SELECT of the prefix's rows and a parse of each state), median of 5;
- settling every unfinished id on the driver, as ``KafkaJdbcSink`` does before the next
  batch (a DualWriter per id: ``start()`` recovers, commits the prepared transaction,
  stores the state completed, fences, closes), total and per id;
- ``DualWriter.start()`` of an id whose state is completed, what each executor task pays
  for its first batch after a restart (init, recovery that finds nothing, fence), per
  id, over ``--starts`` ids.

The state rows are made for real (one DualWriter transaction per id, directly, not
through the proxy): ``--ids`` producers are initialised, which takes a while.

    python bench/recovery_bench.py [--delay-ms 0] [--ids 1000] [--unfinished 1000]
                                   [--starts 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Column, MetaData, String, Table, create_engine, text
from sqlalchemy.engine import Engine

from bench._common import Network, add_delay_argument, behind_delay, environment
from kafka_txn._sink_ledger import Ledger
from kafka_txn.dualwrite import DualWriter
from kafka_txn.errors import TransactionInDoubtError
from kafka_txn.jdbc import jdbc_to_sqlalchemy
from kafka_txn.recovery import TransactionOutcome
from tests.databases import POSTGRES_JDBC, ensure_running
from tests.rig import start_broker


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


def _measure(net: Network, prefix: str, state: str, args: argparse.Namespace) -> None:
    assert net.jdbc is not None
    engine = create_engine(jdbc_to_sqlalchemy(net.jdbc))
    table = Table(
        state, MetaData(), Column("transactional_id", String(255)),
        Column("prepared_txn_state", String),
    )  # fmt: skip
    ledger = Ledger(engine, prefix, f"bench_commits_{uuid.uuid4().hex[:8]}", table)
    scans = []
    for _ in range(5):
        t0 = time.perf_counter()
        found = ledger.unfinished()
        scans.append(time.perf_counter() - t0)
    print(
        f"\nscan of {args.ids} state rows for unfinished ones: "
        f"{statistics.median(scans) * 1000:.1f} ms (median of 5; "
        f"{min(scans) * 1000:.1f}..{max(scans) * 1000:.1f}); found {len(found)}"
    )
    settle = []
    outcomes: dict[str, int] = {}
    t0 = time.perf_counter()
    for tid in found:
        t1 = time.perf_counter()
        writer = DualWriter(
            {"bootstrap.servers": net.bootstrap_servers, "transactional.id": tid},
            engine, state_table=state,
        )  # fmt: skip
        try:
            outcome = writer.start()
        finally:
            writer.close()
        outcomes[outcome.value] = outcomes.get(outcome.value, 0) + 1
        settle.append(time.perf_counter() - t1)
    total = time.perf_counter() - t0
    if settle:
        print(
            f"settling {len(found)} unfinished ids on the driver: {total:.1f} s, "
            f"{statistics.median(settle) * 1000:.1f} ms per id (median; "
            f"{min(settle) * 1000:.1f}..{max(settle) * 1000:.1f}); outcomes {outcomes}"
        )
    assert outcomes.get(TransactionOutcome.COMMITTED.value, 0) == len(found)
    starts = []
    for i in range(min(args.starts, args.ids)):
        conf = {"bootstrap.servers": net.bootstrap_servers,
                "transactional.id": f"{prefix}-{args.ids - 1 - i}"}  # fmt: skip
        t1 = time.perf_counter()
        writer = DualWriter(conf, engine, state_table=state)
        writer.start()
        starts.append(time.perf_counter() - t1)
        writer.close()
    print(
        f"DualWriter() + start() of an id whose state is completed (a task's first "
        f"batch after a restart): {statistics.median(starts) * 1000:.1f} ms "
        f"(median of {len(starts)}; {min(starts) * 1000:.1f}.."
        f"{max(starts) * 1000:.1f})"
    )
    engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_delay_argument(parser)
    parser.add_argument("--ids", type=int, default=1000)
    parser.add_argument("--unfinished", type=int, default=1000)
    parser.add_argument("--starts", type=int, default=50)
    args = parser.parse_args(argv)
    jdbc = ensure_running("postgresql", POSTGRES_JDBC)
    broker = start_broker()
    prefix = f"bench-rec-{uuid.uuid4().hex[:8]}"
    state = f"bench_state_{uuid.uuid4().hex[:8]}"
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
            print(f"broker: {broker.description}")
            print(environment(net))
            _measure(net, prefix, state, args)
    finally:
        with direct.begin() as conn:
            conn.execute(text(f'DROP TABLE IF EXISTS "{state}"'))
        direct.dispose()
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
