"""The cluster test's streaming query: JSON files -> repartition(4) -> KafkaJdbcSink under
``local-cluster[2,1,1024]``: a standalone master and two workers inside the driver's JVM,
each of the two executors in a JVM of its own with its own Python workers, so the sink,
its settings and the hook travel pickled, as on a real cluster. availableNow, one file
per micro-batch; one task of batch 1 fails after its database commit and, with
excludeOnFailure, is retried on the other executor. Spark's event log (in --work-dir)
says which executor ran which attempt. Runs as its own process group; the test sweeps it.

What local-cluster needs from a pip-installed PySpark, set here before the JVM starts:
- SPARK_HOME: pyspark's launcher defaults it to the package folder, which works, but the
  workers then put their executors' folders in ``$SPARK_HOME/work``, inside the
  virtualenv. A folder of symlinks to the package's entries keeps them in --work-dir.
- SPARK_LOCAL_IP: the in-JVM master and workers (and so the executors) bind to the
  machine's hostname address otherwise; spark.driver.host only covers the driver.
- PYSPARK_PYTHON (read by the SparkContext of a driver started as plain Python; Spark's
  ``spark.pyspark.python`` only reaches it through spark-submit) and
  spark.executorEnv.PYTHONPATH: the executors' Python workers must run this interpreter,
  which has kafka-txn and confluent-kafka, and import ``tests`` (the hook's base class).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from kafka_txn.spark.sink import KafkaJdbcSink
from tests.support.spark_hooks import _Hook

ROOT = Path(__file__).resolve().parent.parent.parent
PARTITIONS = 4


class FailAfterDatabaseCommit(_Hook):
    """Fail partition 0 of batch 1 once, on its first attempt, after its database commit
    (the worst moment: the rows and the marker are in, Kafka is still prepared). Defined
    in the script, so cloudpickle ships it by value, as spark-submit users' code is."""

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        hit = batch_id == 1 and partition == 0 and attempt == 0 and step == "after_db_commit"
        if hit and self.once("failed"):
            raise RuntimeError("injected task failure after the database commit")


def _spark_home(folder: Path) -> Path:
    """The pip-installed Spark, with ``work/`` (executor folders and logs) under ``folder``."""
    home = folder / "spark-home"
    home.mkdir()
    for entry in Path(pyspark.__file__).resolve().parent.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    return home


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for name in ("input", "checkpoint", "bootstrap-servers", "topic", "jdbc-url", "dbtable",
                 "prefix", "fault-dir", "work-dir"):  # fmt: skip
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    os.environ["SPARK_HOME"] = str(_spark_home(work))
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    (work / "events").mkdir()
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")  # 2 workers, 1 core, 1 GB each
        .appName("kafka-txn-cluster")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.executorEnv.PYTHONPATH", str(ROOT))
        # A failed task is not retried on the executor it failed on (task-level
        # exclusion), so the retry must fence and recover from the other JVM. Raised
        # thresholds keep an executor from being excluded for a whole stage or the app.
        .config("spark.excludeOnFailure.enabled", "true")
        .config("spark.excludeOnFailure.task.maxTaskAttemptsPerExecutor", "1")
        .config("spark.excludeOnFailure.task.maxTaskAttemptsPerNode", "3")
        .config("spark.excludeOnFailure.stage.maxFailedTasksPerExecutor", "100")
        .config("spark.excludeOnFailure.stage.maxFailedExecutorsPerNode", "100")
        .config("spark.excludeOnFailure.application.maxFailedTasksPerExecutor", "100")
        .config("spark.excludeOnFailure.application.maxFailedExecutorsPerNode", "100")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", (work / "events").as_uri())
        .config("spark.eventLog.rolling.enabled", "false")  # one plain JSON-lines file,
        .config("spark.eventLog.compress", "false")  # read by the test
        .getOrCreate()
    )
    try:
        sink = KafkaJdbcSink(
            transactional_id_prefix=args.prefix,
            kafka={"bootstrap.servers": args.bootstrap_servers},
            topic=args.topic,
            url=args.jdbc_url,
            dbtable=args.dbtable,
            on_step=FailAfterDatabaseCommit(args.fault_dir),
        )
        stream = (
            spark.readStream.schema("key string, value string")
            .option("maxFilesPerTrigger", 1)
            .json(args.input)
            .repartition(PARTITIONS)
        )
        query = (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", args.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    finally:
        spark.stop()  # stops the executors and the in-JVM master and workers
    return 0


if __name__ == "__main__":
    sys.exit(main())
