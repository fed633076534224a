"""Structured Streaming into Kafka and a database, exactly once (kafka-txn's
KafkaJdbcSink with foreachBatch).

Scenario: JSON files of events arrive in --input; each micro-batch goes to a Kafka topic
(read_committed consumers see each event once) and is appended to a database table, with
the same guarantee, across task retries and restarts from --checkpoint. Restart the
script after killing it: nothing is lost or written twice.

Assumes: a broker with transactions (Kafka >= 3.0), a database reachable by the JDBC
URL, and a transactional id prefix that stays the same across restarts of this query.

    python examples/spark_streaming_sink.py --bootstrap-servers 127.0.0.1:9092 \\
        --jdbc-url 'jdbc:postgresql://127.0.0.1:5432/test?user=postgres' \\
        --input /tmp/events --checkpoint /tmp/ckpt --topic events --dbtable events
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

from kafka_txn.spark import KafkaJdbcSink

log = logging.getLogger("spark_streaming_sink")


def run(args: argparse.Namespace) -> None:
    """Run the query until the files present now are processed (availableNow)."""
    # Local mode: the Python workers must be this interpreter, which has kafka-txn.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("kafka-txn-sink-example")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")  # loopback only
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    sink = KafkaJdbcSink(
        # One transactional id per partition is derived from it: keep it stable.
        transactional_id_prefix=args.prefix,
        kafka={"bootstrap.servers": args.bootstrap_servers},
        topic=args.topic,
        url=args.jdbc_url,
        dbtable=args.dbtable,
    )
    events = (
        spark.readStream.schema("id long, user string, action string")
        # Replayable source: a restarted batch reads the same files, so its partitions
        # hold the same rows and their commit markers make the replay a no-op.
        .option("maxFilesPerTrigger", 1)
        .json(args.input)
        .select(
            F.col("user").alias("key"),
            F.to_json(F.struct("id", "user", "action")).alias("value"),
            F.col("id"),
        )
    )
    query = (
        events.writeStream.foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    finally:
        spark.stop()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        help="the Kafka cluster (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092, "
        "where `kafka-txn broker` listens)",
    )
    parser.add_argument("--jdbc-url", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--topic", default="events")
    parser.add_argument("--dbtable", default="events")
    parser.add_argument("--prefix", default="events-sink")
    parser.add_argument("--master", default="local[2,4]")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    run(parse_args(argv))
    print("processed every file present exactly once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
