"""Dual write throughput on PostgreSQL: transactions through DualWriter against a naive,
non-atomic dual write (a database transaction and a Kafka transaction committed one after
the other, no prepare and no state row), in the same run, same broker (the test rig's
choice, or the one ``--broker`` names: bench/_broker.py) and database, both behind the
same delay proxy (``--delay-ms``). Runs are interleaved; medians and spreads.

Also prints the median time of each step of the recipe (from ``on_step``).

    python bench/dual_write_bench.py [--broker apache-kafka|noida] [--delay-ms 0]
        [--transactions 200] [--repeat 5]
    python bench/dual_write_bench.py --rows 1 10 100 1000 --writers 1 4 16   # scale

With several ``--rows`` or ``--writers`` values it measures every combination (each with
its own interleaved naive baseline) and prints a table: rows per transaction against
concurrent writers (one transactional id, one thread and one connection each).

``--failure-path``: every other transaction fails (its body raises after its INSERT and
records: the database rolls back, Kafka aborts), on both sides; txn/s counts failed and
committed ones. A third writer, interleaved too, runs DualWriter with the identity
candidate turned off (``IdentityTracker.use_candidates``), so that every prepare after
an abort waits for librdkafka's next statistics snapshot: the failure path without the
candidate, for comparison in the same run.

    python bench/dual_write_bench.py --failure-path --rows 1 10

``--floor``: two more writers, interleaved too, run the recipe's own round trips with
nothing of kafka-txn's around them, as the protocol's floor: raw psycopg for the
writer's statements (BEGIN with the lock as one simple query; the state UPDATE and
COMMIT in one pipeline), raw confluent-kafka for Kafka (flush, commit), the body as
above through SQLAlchemy, the start-time spacing kept (1.1 ms from the last flush's
end to the next begin), and one DescribeTransactions after the flush (kafka-txn's
coordinator client; DualWriter overlaps it with the flush when the coordinator's round
trip is 1 ms or more) or none ("floor without describe"). One writer, happy path only.

    python bench/dual_write_bench.py --floor [--delay-ms 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    insert,
    text,
)

from bench._broker import add_broker_argument, running_broker
from bench._common import Network, add_delay_argument, behind_delay, environment, spread
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import STEPS, DualWriter
from tests.support.databases import POSTGRES_JDBC, ensure_running
from tests.support.rig import Broker

VALUE = "x" * 100


def _table() -> Table:
    return Table(
        f"bench_{uuid.uuid4().hex[:10]}",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("value", String(100)),
    )


PRODUCE_FIRST = [False]
"""--produce-first: the body sends its records before its INSERT (else after)."""

FAILURE_PATH = [False]
"""--failure-path: every other transaction's body raises ``_Failed`` after its writes."""


class _Failed(Exception):  # noqa: N818 - not an error: the failure the scenario asks for
    """The body of a transaction that fails on purpose (--failure-path)."""


def _fails(i: int) -> bool:
    return FAILURE_PATH[0] and i % 2 == 1


def _write(
    conn: Any, produce: Callable[..., Any], table: Table, topic: str, values: list[dict[str, str]]
) -> None:
    """The body of one transaction, naive and DualWriter alike: the INSERT of ``values``
    and one record each, in the order --produce-first says."""
    if PRODUCE_FIRST[0]:
        for row in values:
            produce(topic, row["value"].encode())
    conn.execute(insert(table), values)
    if not PRODUCE_FIRST[0]:
        for row in values:
            produce(topic, row["value"].encode())


def _threads(writers: int, body: Callable[[int], None]) -> float:
    """Run ``body(i)`` in ``writers`` threads at once; the seconds they took together."""
    barrier = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            body(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


def _naive(broker: Broker, net: Network, count: int, rows: int, writers: int) -> float:
    """Transactions per second, all writers together."""
    assert net.jdbc is not None
    engine = create_engine(jdbc_to_sqlalchemy(net.jdbc), pool_size=writers + 1)
    table = _table()
    table.create(engine)
    topic = broker.create_topic(3)
    producers = []
    for _ in range(writers):
        p = Producer(
            {"bootstrap.servers": net.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
        )
        p.init_transactions()
        producers.append(p)
    values = [{"value": VALUE} for _ in range(rows)]

    def body(i: int) -> None:
        producer = producers[i]
        for n in range(count):
            producer.begin_transaction()
            try:
                with engine.begin() as conn:
                    _write(conn, producer.produce, table, topic, values)
                    if _fails(n):
                        raise _Failed
            except _Failed:
                # Delivered first, so that librdkafka's EndTxn(abort) cannot overtake the
                # AddPartitionsToTxn the coordinator refuses while the previous commit's
                # markers are written: librdkafka makes the INVALID_TXN_STATE it then gets
                # fatal (what TransactionalProducer's abort waits for, producer/completion.py).
                producer.flush()
                producer.abort_transaction()
                continue
            producer.commit_transaction()  # not atomic with the database commit above

    for producer in producers:  # warm-up: connections, metadata
        producer.begin_transaction()
        with engine.begin() as conn:
            conn.execute(text("SELECT 1"))
            producer.produce(topic, b"warm-up")
        producer.commit_transaction()
    elapsed = _threads(writers, body)
    for p in producers:
        p.close()
    table.drop(engine)
    engine.dispose()
    return writers * count / elapsed


class _Steps:
    """Time spent in each step of the recipe (between two on_step calls), per thread."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.times: dict[str, list[float]] = {step: [] for step in STEPS}
        self.on = False

    def start(self) -> None:
        self.local.last = time.perf_counter()

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        if self.on:
            self.times[step].append(now - self.local.last)
        self.local.last = now


def _dual(
    broker: Broker,
    net: Network,
    count: int,
    rows: int,
    writers: int,
    steps: _Steps,
    candidates: bool = True,
    identity: list[tuple[int, int, int]] | None = None,
) -> float:
    """Transactions per second, all writers together. ``candidates``: False turns the
    identity candidate off (every prepare after an abort waits for statistics).
    ``identity``: gets (prepares that waited for a snapshot, candidates confirmed,
    candidates refused) per writer."""
    assert net.jdbc is not None
    topic = broker.create_topic(3)
    table = _table()
    values = [{"value": VALUE} for _ in range(rows)]
    dual = []
    for _ in range(writers):
        conf = {"bootstrap.servers": net.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
        writer = DualWriter(conf, net.jdbc, on_step=steps)
        writer.start()
        assert writer.producer._twophase is not None
        writer.producer._twophase.identity.use_candidates = candidates
        dual.append(writer)
    table.create(dual[0].engine)
    for writer in dual:  # the first transaction waits for statistics: not timed
        steps.start()
        with writer.transaction() as tx:
            tx.produce(topic, b"warm-up")

    def body(i: int) -> None:
        writer = dual[i]
        for n in range(count):
            steps.start()
            try:
                with writer.transaction() as tx:
                    _write(tx.connection, tx.produce, table, topic, values)
                    if _fails(n):
                        raise _Failed
            except _Failed:
                pass

    tracked = [w.producer._twophase.identity for w in dual if w.producer._twophase is not None]
    before = [(t.waits, t.confirmed, t.refused) for t in tracked]
    steps.on = True
    elapsed = _threads(writers, body)
    steps.on = False
    if identity is not None:
        for t, (waits, confirmed, refused) in zip(tracked, before, strict=True):
            identity.append((t.waits - waits, t.confirmed - confirmed, t.refused - refused))
    table.drop(dual[0].engine)
    for writer in dual:
        writer.close()
    return writers * count / elapsed


def _floor_state_table(engine: Any, tid: str) -> str:
    """A state table with ``tid``'s row, for ``_floor``; its name."""
    state = f"bench_state_{uuid.uuid4().hex[:10]}"
    with engine.begin() as setup:
        setup.execute(text(f"CREATE TABLE {state} (id VARCHAR(255) PRIMARY KEY, "
                           "state VARCHAR(512) NOT NULL, updated_at TIMESTAMP)"))  # fmt: skip
        setup.execute(text(f"INSERT INTO {state} VALUES (:tid, '', now())"), {"tid": tid})
    return state


def _floor(broker: Broker, net: Network, count: int, rows: int, describe: bool) -> float:
    """Transactions per second of the recipe's own round trips, nothing of kafka-txn's
    around them (``--floor``): see the module docstring."""
    assert net.jdbc is not None
    engine = create_engine(jdbc_to_sqlalchemy(net.jdbc), pool_size=1)
    table = _table()
    table.create(engine)
    tid = uuid.uuid4().hex
    state = _floor_state_table(engine, tid)
    topic = broker.create_topic(3)
    conf = {"bootstrap.servers": net.bootstrap_servers, "transactional.id": tid}
    producer = Producer(conf)
    producer.init_transactions()
    client = CoordinatorClient(ConnectionSettings.from_librdkafka(conf), tid)
    values = [{"value": VALUE} for _ in range(rows)]
    lock = f"BEGIN; SELECT state, txid_current() FROM {state} WHERE id = '{tid}' FOR UPDATE"
    write = f"UPDATE {state} SET state = %s, updated_at = now() WHERE id = %s"
    conn = engine.connect()
    driver: Any = conn.connection.driver_connection
    driver.autocommit = True  # BEGIN goes with the lock
    last_flushed = [0.0]

    def transaction() -> None:
        wait = last_flushed[0] + 0.0011 - time.monotonic()  # the start-time spacing
        if wait > 0:
            time.sleep(wait)
        cursor = driver.cursor()
        cursor.execute(lock, prepare=False)
        cursor.nextset()
        cursor.fetchone()
        producer.begin_transaction()
        _write(conn, producer.produce, table, topic, values)
        producer.flush()
        last_flushed[0] = time.monotonic()
        stored = client.describe().state if describe else "Ongoing"
        with driver.pipeline():
            cursor.execute(write, (stored, tid))
            cursor.execute("COMMIT")
        conn.commit()  # SQLAlchemy's transaction of the body: psycopg sends nothing
        producer.commit_transaction()

    transaction()  # warm-up: connections, metadata, the coordinator
    start = time.perf_counter()
    for _ in range(count):
        transaction()
    elapsed = time.perf_counter() - start
    driver.autocommit = False
    conn.close()
    producer.close()
    client.close()
    table.drop(engine)
    with engine.begin() as teardown:
        teardown.execute(text(f"DROP TABLE {state}"))
    engine.dispose()
    return count / elapsed


def _measure(
    broker: Broker, net: Network, args: argparse.Namespace, rows: int, writers: int
) -> dict[str, Any]:
    count = max(10, args.transactions * 10 // max(rows, 10))
    if writers > 1:
        count = max(10, count // 2)
    naive: list[float] = []
    dual: list[float] = []
    no_candidate: list[float] = []
    identity: list[tuple[int, int, int]] = []
    floor: list[float] = []
    floor_no_describe: list[float] = []
    steps = _Steps()
    order = ["naive", "dual"] + (["no-candidate"] if args.failure_path else [])
    if args.floor:
        order += ["floor", "floor-no-describe"]
    for i in range(args.repeat):  # interleaved, rotating who goes first
        for who in order[i % len(order) :] + order[: i % len(order)]:
            if who == "naive":
                naive.append(_naive(broker, net, count, rows, writers))
            elif who == "dual":
                dual.append(_dual(broker, net, count, rows, writers, steps, True, identity))
            elif who == "floor":
                floor.append(_floor(broker, net, count, rows, describe=True))
            elif who == "floor-no-describe":
                floor_no_describe.append(_floor(broker, net, count, rows, describe=False))
            else:
                no_candidate.append(
                    _dual(broker, net, count, rows, writers, _Steps(), candidates=False)
                )
    ratios = sorted(d / n for d, n in zip(dual, naive, strict=True))
    return {
        "rows": rows,
        "writers": writers,
        "count": count,
        "naive": naive,
        "dual": dual,
        "ratio": statistics.median(dual) / statistics.median(naive),
        "pair_ratios": ratios,
        "floor": floor,
        "floor_no_describe": floor_no_describe,
        "no_candidate": no_candidate,
        "identity": [sum(x) for x in zip(*identity, strict=True)] if identity else None,
        "steps": {k: statistics.median(v) * 1000 for k, v in steps.times.items() if v},
    }


def _database_version(jdbc: str) -> str:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            return "PostgreSQL " + str(conn.execute(text("SHOW server_version")).scalar_one())
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_delay_argument(parser)
    add_broker_argument(parser)
    parser.add_argument("--transactions", type=int, default=200, help="per run (10 rows)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rows", type=int, nargs="+", default=[10])
    parser.add_argument("--writers", type=int, nargs="+", default=[1])
    parser.add_argument(
        "--failure-path", action="store_true",
        help="every other transaction fails (database rollback, Kafka abort)",
    )  # fmt: skip
    parser.add_argument(
        "--produce-first", action="store_true",
        help="send the records before the INSERT (librdkafka then registers the "
        "partitions while the INSERT runs)",
    )  # fmt: skip
    parser.add_argument(
        "--floor", action="store_true",
        help="also measure the protocol's floor: the recipe's round trips on raw psycopg "
        "and raw confluent-kafka (one writer, happy path)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.floor and (args.failure_path or args.writers != [1]):
        parser.error("--floor measures one writer's happy path: drop --failure-path/--writers")
    PRODUCE_FIRST[0] = args.produce_first
    FAILURE_PATH[0] = args.failure_path
    jdbc = ensure_running("postgresql", POSTGRES_JDBC)
    with running_broker(args.broker) as broker:
        with behind_delay(args.delay_ms, broker.bootstrap_servers, jdbc) as net:
            print(environment(net, _database_version(jdbc)))
            print(
                "body: records sent "
                + ("before" if args.produce_first else "after")
                + " the INSERT"
                + ("; every other transaction fails (rollback, abort)" if args.failure_path else "")
            )
            results = [
                _measure(broker, net, args, rows, writers)
                for writers in args.writers
                for rows in args.rows
            ]
        for r in results:
            _report(r, args)
        if len(results) > 1:
            _table_report(results, args)
    return 0


def _report(r: dict[str, Any], args: argparse.Namespace) -> None:
    label = f"{r['rows']}-row transactions, {r['writers']} writer(s), {r['count']} each"
    print(f"\n{label:<44}{'median txn/s (min..max)':>28}")
    print(f"{'naive DB + Kafka (not atomic)':<44}{spread(r['naive']):>28}")
    print(f"{'DualWriter (atomic)':<44}{spread(r['dual']):>28}")
    if r["no_candidate"]:
        label = "DualWriter, no identity candidate"
        print(f"{label:<44}{spread(r['no_candidate']):>28}")
    target = " (target >= 0.85 at 1 ms; at 0 ms, near the floor)" if r["rows"] == 10 else ""
    pairs = ", ".join(f"{x:.2f}" for x in r["pair_ratios"])
    print(f"ratio of medians: {r['ratio']:.2f}x{target}; per interleaved pair: {pairs}")
    naive = statistics.median(r["naive"])
    for key, label in (("floor", "floor"), ("floor_no_describe", "floor without describe")):
        if r[key]:
            ratio = statistics.median(r[key]) / naive
            dual = statistics.median(r["dual"]) / statistics.median(r[key])
            print(f"{label:<44}{spread(r[key]):>28}  ({ratio:.2f}x naive; "
                  f"DualWriter {dual:.2f}x it)")  # fmt: skip
    steps = "  ".join(f"{k.removeprefix('after_')} {v:.2f}" for k, v in r["steps"].items())
    print(f"median ms until each step: {steps}")
    if r["no_candidate"]:
        waits, confirmed, refused = r["identity"]
        off = statistics.median(r["no_candidate"])
        print(f"failure path: DualWriter / no candidate {statistics.median(r['dual']) / off:.2f}x; "
              f"prepares that waited for statistics {waits}, candidates confirmed "
              f"{confirmed}, refused {refused} (all runs)")  # fmt: skip


def _table_report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nDualWriter vs naive at {args.delay_ms:g} ms (median txn/s over all writers; "
          "rows/s = txn/s x rows)")  # fmt: skip
    print(f"{'rows':>6}{'writers':>8}{'naive txn/s':>13}{'dual txn/s':>12}{'ratio':>7}"
          f"{'dual rows/s':>13}{'dual ms/txn':>12}")  # fmt: skip
    for r in results:
        n, d = statistics.median(r["naive"]), statistics.median(r["dual"])
        per_txn = 1000 * r["writers"] / d
        print(f"{r['rows']:>6}{r['writers']:>8}{n:>13,.0f}{d:>12,.0f}{d / n:>7.2f}"
              f"{d * r['rows']:>13,.0f}{per_txn:>12.2f}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
