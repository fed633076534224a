"""PySpark sink speed against a naive foreachPartition that uses a plain
(non-transactional) confluent-kafka producer and plain inserts into the same kind of
table, in the same run, same broker (the test rig's choice, or the one ``--broker`` names:
bench/_broker.py) and PostgreSQL, local[2]:

- throughput: 1M rows over 4 partitions in one batch (target >= 0.9x naive);
- micro-batch latency: batches of 1,000 rows over 8 partitions, one after another on one
  sink (its writers are kept across batches), median per-batch time after a first
  batch that warms up (target <= 1.5x naive).

    python bench/spark_sink_bench.py [--broker apache-kafka|noida] [--delay-ms 0]
        [--rows 1000000] [--partitions 4] [--repeat 2] [--batches 10]
    python bench/spark_sink_bench.py --scale [--delay-ms 0] [--batches 5]

Both the naive writer and the sink go through the same delay proxies (``--delay-ms``).
``--scale`` measures micro-batch latency for 1, 10, 100 and 1,000 rows per partition and
1, 4 and 16 partitions (transactional ids) per batch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402, N812

from bench._broker import add_broker_argument, running_broker  # noqa: E402
from bench._common import (  # noqa: E402
    Network,
    add_delay_argument,
    behind_delay,
    environment,
)
from kafka_txn.spark.sink import KafkaJdbcSink  # noqa: E402
from tests.support.databases import POSTGRES_JDBC, ensure_running  # noqa: E402


class NaivePartitionWriter:
    """Plain producer + plain inserts: fast, and neither atomic nor exactly once."""

    def __init__(self, bootstrap: str, topic: str, jdbc: str, table: str) -> None:
        self.bootstrap, self.topic, self.jdbc, self.table = bootstrap, topic, jdbc, table

    def __call__(self, rows: Iterable[Any]) -> None:
        from confluent_kafka import Producer
        from sqlalchemy import Column, LargeBinary, MetaData, Table, Text, create_engine, insert

        from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy

        table = Table(self.table, MetaData(), Column("key", LargeBinary), Column("value", Text))
        engine = create_engine(jdbc_to_sqlalchemy(self.jdbc))
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        chunk: list[Any] = []
        with engine.begin() as conn:
            for row in rows:
                chunk.append(row)
                if len(chunk) == 1000:
                    self._flush(conn, producer, table, chunk, insert)
                    chunk = []
            if chunk:
                self._flush(conn, producer, table, chunk, insert)
        producer.flush()
        engine.dispose()

    def _flush(self, conn: Any, producer: Any, table: Any, chunk: list[Any], insert: Any) -> None:
        conn.execute(insert(table), [{"key": bytes(r["key"]), "value": r["value"]} for r in chunk])
        for r in chunk:
            while True:
                try:
                    producer.produce(self.topic, r["value"], bytes(r["key"]))
                    break
                except BufferError:
                    producer.poll(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_delay_argument(parser)
    add_broker_argument(parser)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument(
        "--scale", action="store_true",
        help="only micro-batch latency, for 1/10/100/1000 rows per partition and "
        "1/4/16 partitions (transactional ids) per batch",
    )  # fmt: skip
    parser.add_argument("--scale-rows", type=int, nargs="+", default=[1, 10, 100, 1000],
                        help="with --scale: rows per partition")  # fmt: skip
    parser.add_argument("--scale-partitions", type=int, nargs="+", default=[1, 4, 16],
                        help="with --scale: partitions per batch")  # fmt: skip
    args = parser.parse_args(argv)
    jdbc = ensure_running("postgresql", POSTGRES_JDBC)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = str(ROOT)
    with running_broker(args.broker) as broker:
        spark = _session()
        try:
            with behind_delay(args.delay_ms, broker.bootstrap_servers, jdbc) as net:
                print(environment(net, f"pyspark {spark.version}, local[2]"))
                if args.scale:
                    spark.stop()
                    _scale(broker, net, args.batches, args.scale_rows, args.scale_partitions)
                else:
                    _throughput(spark, broker, net, args)
                    _micro_batches(spark, broker, net, args.batches, 1000, 8)
        finally:
            spark.stop()
    return 0


def _session() -> Any:
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _throughput(spark: Any, broker: Any, net: Network, args: argparse.Namespace) -> None:
    """``--rows`` rows in ``--partitions`` partitions, one batch, naive and sink
    interleaved ``--repeat`` times."""
    assert net.jdbc is not None
    print(f"rows: {args.rows:,}")
    df = (
        spark.range(args.rows, numPartitions=args.partitions)
        .select(
            F.col("id").cast("string").cast("binary").alias("key"),
            F.concat(F.lit("value-"), F.col("id").cast("string")).alias("value"),
        )
        .cache()
    )
    df.count()
    naive: list[float] = []
    sink_rates: list[float] = []
    for _ in range(args.repeat):  # interleaved
        topic = broker.create_topic(3)
        table = f"naive_{uuid.uuid4().hex[:8]}"
        _create_table(net.jdbc, table, df)
        start = time.perf_counter()
        df.foreachPartition(NaivePartitionWriter(net.bootstrap_servers, topic, net.jdbc, table))
        naive.append(args.rows / (time.perf_counter() - start))

        sink_table = f"sink_{uuid.uuid4().hex[:8]}"
        sink = KafkaJdbcSink(
            transactional_id_prefix=f"bench-{uuid.uuid4().hex[:8]}",
            kafka={"bootstrap.servers": net.bootstrap_servers},
            topic=broker.create_topic(3),
            url=net.jdbc,
            dbtable=sink_table,
        )
        start = time.perf_counter()
        sink.write(df, batch_id=0)
        sink_rates.append(args.rows / (time.perf_counter() - start))
        sink.close()
        _drop_tables(net.jdbc, table, sink_table)
    n, s = statistics.median(naive), statistics.median(sink_rates)
    label = f"{args.rows:,} rows, {args.partitions} partitions"
    print(f"\n{label:<40}{'median rows/s':>14}{'runs':>26}")
    print(f"{'naive foreachPartition (not atomic)':<40}{n:>14,.0f}"
          f"{[round(x) for x in naive]!s:>26}")  # fmt: skip
    print(f"{'KafkaJdbcSink (exactly once)':<40}{s:>14,.0f}"
          f"{[round(x) for x in sink_rates]!s:>26}")  # fmt: skip
    print(f"\nratio: {s / n:.2f}x (target >= 0.9)")


def _create_table(jdbc: str, table: str, df: Any) -> None:
    from sqlalchemy import create_engine

    from kafka_txn.dualwrite.ddl import create_table_if_missing
    from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
    from kafka_txn.spark.mapping import Mapping

    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        create_table_if_missing(engine, Mapping.check(df.schema, "t").table(table))
    finally:
        engine.dispose()


def _drop_tables(jdbc: str, *tables: str) -> None:
    """Drop what a run created in the database, once it is done with it."""
    from sqlalchemy import create_engine, text

    from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy

    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.begin() as conn:
            for table in tables:
                conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
    finally:
        engine.dispose()


def _frames(spark: Any, count: int, rows: int, partitions: int) -> list[Any]:
    frames = [
        spark.range(i * rows, (i + 1) * rows, numPartitions=partitions)
        .select(
            F.col("id").cast("string").cast("binary").alias("key"),
            F.concat(F.lit("value-"), F.col("id").cast("string")).alias("value"),
        )
        .cache()
        for i in range(count)
    ]
    for frame in frames:
        frame.count()
    return frames


def _micro_batches(
    spark: Any, broker: Any, net: Network, batches: int, rows: int, partitions: int,
    quiet: bool = False,
) -> tuple[list[float], list[float]]:  # fmt: skip
    """Per-batch latency of ``rows``-row batches over ``partitions`` partitions, naive
    and sink interleaved batch by batch on one sink (its writers kept across batches);
    the first batch warms both up and is reported apart."""
    assert net.jdbc is not None
    frames = _frames(spark, batches + 1, rows, partitions)
    topic = broker.create_topic(3)
    table = f"naive_{uuid.uuid4().hex[:8]}"
    _create_table(net.jdbc, table, frames[0])
    sink_table = f"sink_{uuid.uuid4().hex[:8]}"
    sink = KafkaJdbcSink(
        transactional_id_prefix=f"bench-small-{uuid.uuid4().hex[:8]}",
        kafka={"bootstrap.servers": net.bootstrap_servers},
        topic=broker.create_topic(3),
        url=net.jdbc,
        dbtable=sink_table,
    )
    naive: list[float] = []
    timed: list[float] = []
    writer = NaivePartitionWriter(net.bootstrap_servers, topic, net.jdbc, table)
    for batch_id, frame in enumerate(frames):  # interleaved; batch 0 warms up both
        start = time.perf_counter()
        frame.foreachPartition(writer)
        naive.append(time.perf_counter() - start)
        start = time.perf_counter()
        sink.write(frame, batch_id=batch_id)
        timed.append(time.perf_counter() - start)
    sink.close()
    _drop_tables(net.jdbc, table, sink_table)
    for frame in frames:
        frame.unpersist()
    if not quiet:
        n, s = statistics.median(naive[1:]), statistics.median(timed[1:])
        label = f"{rows:,} rows x {partitions} partitions per batch"
        print(f"\n{label:<40}{'median ms/batch':>16}{'min..max':>16}{'first':>8}")
        for name, values in (
            ("naive foreachPartition (not atomic)", naive),
            ("KafkaJdbcSink (exactly once)", timed),
        ):
            rest = values[1:]
            print(f"{name:<40}{statistics.median(rest) * 1000:>16,.0f}"
                  f"{f'{min(rest) * 1000:,.0f}..{max(rest) * 1000:,.0f}':>16}"
                  f"{values[0] * 1000:>8,.0f}")  # fmt: skip
        print(f"\nratio: {s / n:.2f}x naive (target <= 1.5)")
    return naive[1:], timed[1:]


def _scale(
    broker: Any, net: Network, batches: int, row_counts: list[int],
    partition_counts: list[int],
) -> None:  # fmt: skip
    """Micro-batch latency against rows per partition and partitions per batch (each
    partition is one transactional id, one dual-write transaction per batch).

    Each combination runs in a Spark session of its own, as a query of its own would:
    every Python worker keeps its sink writers (and each writer's idle database
    connection) after the sink is closed, up to 64, so the 12 sinks of one session held
    up to 2 x 64 PostgreSQL connections and the 16-partition runs failed with 'too many
    clients' (max_connections 100)."""
    print(
        f"\n{'rows/partition':>14}{'partitions':>11}{'naive ms':>10}{'sink ms':>9}"
        f"{'ratio':>7}{'sink ms per partition txn':>27}"
    )
    for partitions in partition_counts:
        for rows in row_counts:
            spark = _session()
            try:
                naive, sink = _micro_batches(
                    spark, broker, net, batches, rows * partitions, partitions, quiet=True
                )
            finally:
                spark.stop()
            n, s = statistics.median(naive), statistics.median(sink)
            print(
                f"{rows:>14,}{partitions:>11}{n * 1000:>10,.0f}{s * 1000:>9,.0f}"
                f"{s / n:>7.2f}{s * 1000 / partitions:>27,.1f}",
                flush=True,
            )


if __name__ == "__main__":
    sys.exit(main())
