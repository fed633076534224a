"""A streaming query for the restart test: JSON files -> KafkaJdbcSink, availableNow, with
an optional step hook. Runs as its own process group so a hook can kill all of it."""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession

from kafka_txn.spark.sink import KafkaJdbcSink
from tests.support import spark_hooks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for name in ("input", "checkpoint", "bootstrap-servers", "topic", "jdbc-url", "dbtable",
                 "prefix"):  # fmt: skip
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--hook", default=None)
    parser.add_argument("--fault-dir", default=None)
    args = parser.parse_args(argv)
    os.environ["KAFKA_TXN_TEST_DRIVER_PGID"] = str(os.getpgid(0))
    # Local mode: the Python workers must be this interpreter, which has kafka-txn.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("kafka-txn-restart")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    sink = KafkaJdbcSink(
        transactional_id_prefix=args.prefix,
        kafka={"bootstrap.servers": args.bootstrap_servers},
        topic=args.topic,
        url=args.jdbc_url,
        dbtable=args.dbtable,
        on_step=getattr(spark_hooks, args.hook)(args.fault_dir) if args.hook else None,
    )
    stream = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .json(args.input)
        .repartition(2)
    )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
