"""PySpark sink speed against a naive foreachPartition that uses a plain
(non-transactional) confluent-kafka producer and plain inserts into the same kind of
table, in the same run, same broker and PostgreSQL, local[2]:

- throughput: 1M rows over 4 partitions in one batch (target >= 0.9x naive);
- micro-batch latency: batches of 1,000 rows over 8 partitions, one after another on one
  sink (its writers are kept across batches), median per-batch time after a first
  batch that warms up (target <= 1.5x naive).

    python bench/spark_sink_bench.py [--rows 1000000] [--partitions 4] [--repeat 2]
                                     [--batches 10]
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

from kafka_txn.spark import KafkaJdbcSink  # noqa: E402
from tests.databases import POSTGRES_JDBC, ensure_running  # noqa: E402
from tests.rig import start_broker  # noqa: E402


class NaivePartitionWriter:
    """Plain producer + plain inserts: fast, and neither atomic nor exactly once."""

    def __init__(self, bootstrap: str, topic: str, jdbc: str, table: str) -> None:
        self.bootstrap, self.topic, self.jdbc, self.table = bootstrap, topic, jdbc, table

    def __call__(self, rows: Iterable[Any]) -> None:
        from confluent_kafka import Producer
        from sqlalchemy import Column, LargeBinary, MetaData, Table, Text, create_engine, insert

        from kafka_txn.jdbc import jdbc_to_sqlalchemy

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
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args(argv)
    jdbc = ensure_running("postgresql", POSTGRES_JDBC)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = str(ROOT)
    broker = start_broker()
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        print(f"broker: {broker.description}; database: {jdbc}; rows: {args.rows:,}")
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
            _create_table(jdbc, table, df)
            start = time.perf_counter()
            df.foreachPartition(NaivePartitionWriter(broker.bootstrap_servers, topic, jdbc, table))
            naive.append(args.rows / (time.perf_counter() - start))

            sink = KafkaJdbcSink(
                transactional_id_prefix=f"bench-{uuid.uuid4().hex[:8]}",
                kafka={"bootstrap.servers": broker.bootstrap_servers},
                topic=broker.create_topic(3),
                url=jdbc,
                dbtable=f"sink_{uuid.uuid4().hex[:8]}",
            )
            start = time.perf_counter()
            sink.write(df, batch_id=0)
            sink_rates.append(args.rows / (time.perf_counter() - start))
        n, s = statistics.median(naive), statistics.median(sink_rates)
        print(f"\n{'1M rows, local[2]':<40}{'median rows/s':>14}{'runs':>26}")
        print(f"{'naive foreachPartition (not atomic)':<40}{n:>14,.0f}"
              f"{[round(x) for x in naive]!s:>26}")  # fmt: skip
        print(f"{'KafkaJdbcSink (exactly once)':<40}{s:>14,.0f}"
              f"{[round(x) for x in sink_rates]!s:>26}")  # fmt: skip
        print(f"\nratio: {s / n:.2f}x (target >= 0.9)")
        _micro_batches(spark, broker, jdbc, args.batches)
    finally:
        spark.stop()
        broker.stop()
    return 0


def _create_table(jdbc: str, table: str, df: Any) -> None:
    from sqlalchemy import create_engine

    from kafka_txn._ddl import create_table_if_missing
    from kafka_txn._spark_mapping import Mapping
    from kafka_txn.jdbc import jdbc_to_sqlalchemy

    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        create_table_if_missing(engine, Mapping.check(df.schema, "t").table(table))
    finally:
        engine.dispose()


def _micro_batches(spark: Any, broker: Any, jdbc: str, batches: int) -> None:
    """Per-batch latency of 1,000-row batches over 8 partitions."""
    frames = [
        spark.range(i * 1000, (i + 1) * 1000, numPartitions=8)
        .select(
            F.col("id").cast("string").cast("binary").alias("key"),
            F.concat(F.lit("value-"), F.col("id").cast("string")).alias("value"),
        )
        .cache()
        for i in range(batches + 1)
    ]
    for frame in frames:
        frame.count()
    topic = broker.create_topic(3)
    table = f"naive_{uuid.uuid4().hex[:8]}"
    _create_table(jdbc, table, frames[0])
    sink = KafkaJdbcSink(
        transactional_id_prefix=f"bench-small-{uuid.uuid4().hex[:8]}",
        kafka={"bootstrap.servers": broker.bootstrap_servers},
        topic=broker.create_topic(3),
        url=jdbc,
        dbtable=f"sink_{uuid.uuid4().hex[:8]}",
    )
    naive: list[float] = []
    timed: list[float] = []
    for batch_id, frame in enumerate(frames):  # interleaved; batch 0 warms up both
        start = time.perf_counter()
        frame.foreachPartition(NaivePartitionWriter(broker.bootstrap_servers, topic, jdbc, table))
        naive.append(time.perf_counter() - start)
        start = time.perf_counter()
        sink.write(frame, batch_id=batch_id)
        timed.append(time.perf_counter() - start)
    n, s = statistics.median(naive[1:]), statistics.median(timed[1:])
    print(f"\n{'1,000 rows x 8 partitions per batch':<40}{'median ms/batch':>16}{'first':>8}")
    print(f"{'naive foreachPartition (not atomic)':<40}{n * 1000:>16,.0f}{naive[0] * 1000:>8,.0f}")
    print(f"{'KafkaJdbcSink (exactly once)':<40}{s * 1000:>16,.0f}{timed[0] * 1000:>8,.0f}")
    print(f"\nratio: {s / n:.2f}x naive (target <= 1.5)")


if __name__ == "__main__":
    sys.exit(main())
