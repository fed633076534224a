"""Dual write throughput on PostgreSQL: 10-row transactions through DualWriter against a
naive, non-atomic dual write (a database transaction and a Kafka transaction committed
one after the other, no prepare and no state row), in the same run, same broker. Also
prints the database statements (round trips) per DualWriter transaction, COMMIT
included, a figure that does not depend on the machine's load.

    python bench/dual_write_bench.py [--transactions 200] [--repeat 3]
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
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, event, insert

from kafka_txn.dualwrite import DualWriter
from kafka_txn.jdbc import jdbc_to_sqlalchemy
from tests.databases import POSTGRES_JDBC, ensure_running
from tests.rig import Broker, start_broker

ROWS = 10


def _table() -> Table:
    return Table(
        f"bench_{uuid.uuid4().hex[:10]}",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("value", String(100)),
    )


def _naive(broker: Broker, jdbc: str, count: int) -> float:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    table = _table()
    table.create(engine)
    topic = broker.create_topic(3)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
    )
    producer.init_transactions()
    rows = [{"value": "x" * 100} for _ in range(ROWS)]
    start = time.perf_counter()
    for _ in range(count):
        producer.begin_transaction()
        with engine.begin() as conn:
            conn.execute(insert(table), rows)
            for row in rows:
                producer.produce(topic, row["value"].encode())
        producer.commit_transaction()  # not atomic with the database commit above
    rate = count / (time.perf_counter() - start)
    producer.close()
    table.drop(engine)
    engine.dispose()
    return rate


def _dual(broker: Broker, jdbc: str, count: int, statements: list[int]) -> float:
    topic = broker.create_topic(3)
    table = _table()
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
    rows = [{"value": "x" * 100} for _ in range(ROWS)]
    with DualWriter(conf, jdbc) as writer:
        table.create(writer.engine)
        with writer.transaction() as tx:  # the first one waits for statistics: not timed
            tx.produce(topic, b"warm-up")
        seen = [0]

        def count_statement(*args: object) -> None:
            seen[0] += 1

        event.listen(writer.engine, "before_cursor_execute", count_statement)
        event.listen(writer.engine, "commit", count_statement)
        start = time.perf_counter()
        for _ in range(count):
            with writer.transaction() as tx:
                tx.connection.execute(insert(table), rows)
                for row in rows:
                    tx.produce(topic, row["value"].encode())
        rate = count / (time.perf_counter() - start)
        event.remove(writer.engine, "before_cursor_execute", count_statement)
        event.remove(writer.engine, "commit", count_statement)
        statements.append(seen[0])
        table.drop(writer.engine)
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    jdbc = ensure_running("postgresql", POSTGRES_JDBC)
    broker = start_broker()
    try:
        print(f"broker: {broker.description}; database: {jdbc}")
        naive: list[float] = []
        dual: list[float] = []
        statements: list[int] = []
        for _ in range(args.repeat):  # interleaved
            naive.append(_naive(broker, jdbc, args.transactions))
            dual.append(_dual(broker, jdbc, args.transactions, statements))
        n, d = statistics.median(naive), statistics.median(dual)
        print(f"\n{'10-row transactions':<34}{'median txn/s':>13}{'runs':>30}")
        print(f"{'naive DB + Kafka (not atomic)':<34}{n:>13,.0f}{[round(x) for x in naive]!s:>30}")
        print(f"{'DualWriter (atomic)':<34}{d:>13,.0f}{[round(x) for x in dual]!s:>30}")
        print(f"\nratio: {d / n:.2f}x (target >= 0.8)")
        per_txn = sum(statements) / (args.transactions * len(statements))
        print(f"database statements per DualWriter transaction: {per_txn:.2f} (COMMIT included)")
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
