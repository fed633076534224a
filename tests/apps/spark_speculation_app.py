"""The speculation test's streaming query: JSON files -> repartition(4) -> KafkaJdbcSink
with ``spark.speculation=true``, on a Spark standalone cluster whose two workers are on
two loopback hosts, 127.0.0.1 and 127.0.0.2 (one executor each, one core each).

Why two hosts: Spark never runs a speculative copy on a host where the task already ran
an attempt (``TaskSetManager.dequeueTaskFromList`` skips a speculative task when
``hasAttemptOnHost(index, host)``), and in local mode it does not speculate at all
(``TaskSchedulerImpl.start()`` starts the speculation check only when ``!isLocal``). With
``local-cluster[...]`` every executor is on one host, so a copy is marked speculatable
and never launched. Two workers on two loopback addresses are two hosts to Spark.
(``--master local-cluster`` runs the same query there, to see that for oneself.)

The master and the workers are ``spark-class`` JVMs started here, in this process's
process group, and stopped here; the test kills the group whatever happens. The hook
(below) pauses partition 0 of batch 1 on its first attempt after its database commit,
until the speculative copy has taken the partition's transactional id over, then the
Python worker SIGKILLs itself. Until that pause, the first attempts of batch 1's other
partitions hold on after their Kafka commit: no task of the stage finishes, so none is
speculatable, before partition 0 is paused (see ``KillAfterCommitOnceSpeculated``).
Spark's event log (in --work-dir) records every attempt.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
from sqlalchemy import create_engine, text

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.spark.sink import KafkaJdbcSink
from tests.apps.spark_cluster_app import _spark_home
from tests.support.spark_hooks import _Hook

ROOT = Path(__file__).resolve().parent.parent.parent
PARTITIONS = 4
HOSTS = ("127.0.0.1", "127.0.0.2")
TAKEOVER_WAIT = 60.0
"""How long the paused attempt waits for another attempt to take its id over."""
PAUSE_WAIT = 120.0
"""How long batch 1's other partitions hold on, at most, for partition 0's pause."""


@dataclass(frozen=True)
class KillAfterCommitOnceSpeculated(_Hook):
    """Partition 0 of batch 1, first attempt, after its database commit (the rows and the
    marker are in; Kafka is still prepared): wait until another attempt of the partition
    has started a writer for its transactional id (the state row's owner changes; that
    writer's start() has recovered the prepared transaction and fenced this one), at most
    TAKEOVER_WAIT seconds, then SIGKILL this Python worker. Marker files: ``paused``,
    ``taken-over`` (the owner changed in time), ``killed``. Defined in the script, so
    cloudpickle ships it by value.

    The other partitions' first attempts of batch 1 hold on after their Kafka commit
    until ``paused`` exists (at most PAUSE_WAIT seconds; giving up leaves a
    ``gave-up-<partition>`` marker, which fails the test). Speculation needs half the
    stage's tasks finished (quantile 0.5 of four), so no copy of partition 0 can start
    (and commit the partition ahead of its first attempt) before that attempt is paused:
    a slow first attempt (a loaded machine) no longer loses the race. No
    deadlock with two one-core executors: Spark launches a stage's pending tasks lowest
    index first (``TaskSetManager.addPendingTasks`` queues them in reverse and
    ``dequeueTaskFromList`` takes from the end, in every locality list), so partition
    0's first attempt holds one of the two cores from the first offer on; the tasks that
    hold on can only take the other one. Once paused, they finish, the fourth runs, and
    partition 0, the only one still running and longer than the median, gets its copy on
    the other host."""

    url: str = ""
    prefix: str = ""
    state_table: str = "kafka_transaction_state"

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        if (batch_id, attempt, step) == (1, 0, "after_kafka_commit") and partition != 0:
            self._hold_until_paused(partition)
            return
        hit = (batch_id, partition, attempt, step) == (1, 0, 0, "after_db_commit")
        if not (hit and self.once("paused")):
            return
        query = text(f"SELECT owner FROM {self.state_table} WHERE transactional_id = :tid")
        tid = {"tid": f"{self.prefix}-{partition}"}
        engine = create_engine(jdbc_to_sqlalchemy(self.url))
        try:
            with engine.connect() as conn:
                mine = conn.execute(query, tid).scalar()
            deadline = time.monotonic() + TAKEOVER_WAIT
            while time.monotonic() < deadline:
                with engine.connect() as conn:
                    if conn.execute(query, tid).scalar() != mine:
                        self.once("taken-over")
                        break
                time.sleep(0.1)
        finally:
            engine.dispose()
        self.once("killed")
        os.kill(os.getpid(), signal.SIGKILL)  # a task killed after its database commit

    def _hold_until_paused(self, partition: int) -> None:
        paused = Path(self.folder) / "paused"
        deadline = time.monotonic() + PAUSE_WAIT
        while not paused.exists():
            if time.monotonic() >= deadline:
                self.once(f"gave-up-{partition}")  # the test's marker check names it
                return
            time.sleep(0.05)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _wait_for_port(host: str, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the master exited: {log.read_text()[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the master did not listen on {host}:{port}: {log.read_text()[-3000:]}")


def _standalone(home: Path, work: Path) -> tuple[str, list[subprocess.Popen[bytes]]]:
    """A standalone master on 127.0.0.1 and one worker (1 core, 1 GB) per host of HOSTS,
    each bound to its host (SPARK_LOCAL_IP: RPC and web UI), logging to ``work``."""
    procs: list[subprocess.Popen[bytes]] = []
    spark_class = str(home / "bin" / "spark-class")

    def launch(name: str, host: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = work / f"{name}.log"
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": host}
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [spark_class, *args], env=env, stdout=out, stderr=subprocess.STDOUT
            )  # same process group as this script: the test sweeps it
        procs.append(proc)
        return proc

    port = _free_port(HOSTS[0])
    try:
        master = launch("master", HOSTS[0], ["org.apache.spark.deploy.master.Master",
                        "--host", HOSTS[0], "--port", str(port), "--webui-port", "0"])  # fmt: skip
        _wait_for_port(HOSTS[0], port, master, work / "master.log")
        url = f"spark://{HOSTS[0]}:{port}"
        for n, host in enumerate(HOSTS):
            (work / f"worker-{n}").mkdir()
            launch(f"worker-{n}", host, ["org.apache.spark.deploy.worker.Worker",
                   "--host", host, "--port", "0", "--webui-port", "0", "--cores", "1",
                   "--memory", "1g", "--work-dir", str(work / f"worker-{n}"), url])  # fmt: skip
    except BaseException:
        _stop(procs)
        raise
    return url, procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):  # workers first, then the master
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for name in ("input", "checkpoint", "bootstrap-servers", "topic", "jdbc-url", "dbtable",
                 "prefix", "fault-dir", "work-dir"):  # fmt: skip
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--master", choices=("standalone", "local-cluster"), default="standalone")
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    home = _spark_home(work)
    os.environ["SPARK_HOME"] = str(home)
    os.environ["SPARK_LOCAL_IP"] = HOSTS[0]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    (work / "events").mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    if args.master == "standalone":
        master, procs = _standalone(home, work)
    else:
        master = "local-cluster[2,1,1024]"
    try:
        spark = (
            SparkSession.builder.master(master)
            .appName("kafka-txn-speculation")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", HOSTS[0])
            .config("spark.driver.bindAddress", HOSTS[0])
            .config("spark.executor.memory", "512m")
            .config("spark.executor.cores", "1")
            .config("spark.cores.max", "2")
            .config("spark.executorEnv.PYTHONPATH", str(ROOT))
            # Both executors registered before the first job, so that both hosts take tasks.
            .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
            .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
            .config("spark.locality.wait", "0")  # shuffle reads prefer the map's executor
            # Speculate as soon as possible: checked every 100 ms, a task is speculatable
            # once half the stage's tasks have finished and it runs longer than their
            # median (and 100 ms); by duration only (no processing-rate check).
            .config("spark.speculation", "true")
            .config("spark.speculation.interval", "100ms")
            .config("spark.speculation.multiplier", "1.0")
            .config("spark.speculation.quantile", "0.5")
            .config("spark.speculation.minTaskRuntime", "100ms")
            .config("spark.speculation.efficiency.enabled", "false")
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
                on_step=KillAfterCommitOnceSpeculated(
                    args.fault_dir, url=args.jdbc_url, prefix=args.prefix
                ),
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
            spark.stop()
    finally:
        _stop(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
