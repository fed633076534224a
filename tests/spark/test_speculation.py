"""The PySpark sink with ``spark.speculation=true`` and a task killed after its database
commit, while a speculative copy of it runs.

Spark launches a speculative copy only on a host where the task has not run an attempt
(``TaskSetManager.dequeueTaskFromList``: ``!(speculative && hasAttemptOnHost(index,
host))``), and in local mode it never checks for speculatable tasks (``TaskSchedulerImpl
.start()``: ``!isLocal && SPECULATION_ENABLED``). So neither ``local[...]`` nor
``local-cluster[...]`` (every executor on one host) ever runs one: the task would only be
retried. The query therefore runs on a standalone cluster started by
tests/apps/spark_speculation_app.py: a master and two workers, on 127.0.0.1 and 127.0.0.2,
one executor with one core on each. Speculation is aggressive (checked every 100 ms,
quantile 0.5, multiplier 1.0, minTaskRuntime 100 ms, no processing-rate check).

What it exercises: four micro-batches of four partitions. In batch 1, partition 0's first
attempt commits its database transaction (rows, marker, prepared Kafka state) and
pauses, its Kafka transaction prepared and its producer alive. Until it pauses, the
other partitions' first attempts hold on after their Kafka commit, so that no task has
finished and no copy can start before the pause, however slow the first attempt is (on a
loaded machine, a copy started earlier committed the partition first and the first
attempt found the marker). Then they finish, and Spark marks partition 0 speculatable
and launches a copy on the other host (asserted from the event log: a
``SparkListenerTaskStart`` with ``"Speculative": true`` for that task, on the other
host, and that copy's success). The copy's writer recovers the prepared transaction (it
commits it in Kafka, the database having committed it) and takes the transactional id
over, fencing the paused attempt; finding the partition's marker, it writes nothing. As
soon as the paused attempt sees the id taken over (the state row's owner changed), its
Python worker SIGKILLs itself. Spark records that attempt as crashed ("Python worker
exited unexpectedly") or, when the copy's success reaches the driver first, as killed
because another attempt succeeded: either is accepted. Kafka (read_committed,
kafka-python) and PostgreSQL (plain SQL) must hold the input exactly once.

What it does not exercise: a speculative copy that writes the partition itself (the
pause comes after the first attempt's database commit, so the copy always finds the
marker), a copy waiting for the state-row lock while the first attempt is inside its
transaction, the first attempt dying before the copy recovers it (then the copy's
recovery, not a retry's, would find a dead producer: the same recovery path the cluster
test's retry takes), and speculation across real machines. Under ``local-cluster`` the
same query gets no copy: the driver marks the task speculatable, the idle executor on the
same host never receives it, and only the retry after the kill recovers the partition
(``--master local-cluster`` in the app shows it).

The query runs in a subprocess, in its own process group, killed whatever happens."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.apps.spark_speculation_app import HOSTS, PARTITIONS
from tests.support.spark_apps import assert_input_exactly_once, input_files, run_app

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = [pytest.mark.broker, pytest.mark.adversary]


def _events(folder: Path) -> list[dict[str, Any]]:
    (log,) = folder.iterdir()
    return [json.loads(line) for line in log.read_text().splitlines() if line]


@pytest.mark.timeout(900)  # a standalone cluster's start, then a run bounded by 300 s
@pytest.mark.guarantee("5.10")
def test_sink_with_speculation_and_a_task_killed_after_its_database_commit(
    broker, postgres_jdbc, tmp_path
):
    values = input_files(tmp_path / "in")
    topic = broker.create_topic(partitions=2)
    table = f"speculation_{uuid.uuid4().hex[:10]}"
    faults, work = tmp_path / "faults", tmp_path / "work"
    faults.mkdir()
    work.mkdir()
    done = run_app(
        [sys.executable, str(ROOT / "tests" / "apps" / "spark_speculation_app.py"),
         "--input", str(tmp_path / "in"), "--checkpoint", str(tmp_path / "ckpt"),
         "--bootstrap-servers", broker.bootstrap_servers, "--topic", topic,
         "--jdbc-url", postgres_jdbc, "--dbtable", table,
         "--prefix", f"spec-{uuid.uuid4().hex[:8]}",
         "--fault-dir", str(faults), "--work-dir", str(work)],
        timeout=300,
    )  # fmt: skip
    logs = "".join(p.read_text()[-2000:] for p in sorted(work.glob("*.log")))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-6000:] + logs
    # The hook paused, saw another attempt take the partition's id over, and killed itself.
    assert {p.name for p in faults.iterdir()} == {"paused", "taken-over", "killed"}

    events = _events(work / "events")
    starts = [e for e in events if e["Event"] == "SparkListenerTaskStart"]
    assert {e["Task Info"]["Host"] for e in starts} == set(HOSTS)
    # Batch 1's job that runs the sink's four-task stage, whose task index is the partition.
    # The one-task stage reading the file runs in the same job with pyspark 3.5 and 4.0;
    # with 4.3, whose micro-batch plans run under adaptive query execution, it first runs
    # as a job of its own (the shuffle materialized when the sink asks for the partition
    # count), which this job then skips.
    (job,) = (
        e for e in events
        if e["Event"] == "SparkListenerJobStart" and e["Properties"]["streaming.sql.batchId"] == "1"
        and any(s["Number of Tasks"] == PARTITIONS for s in e["Stage Infos"])
    )  # fmt: skip
    (stage,) = (s["Stage ID"] for s in job["Stage Infos"] if s["Number of Tasks"] == PARTITIONS)
    ends = {
        e["Task Info"]["Task ID"]: e["Task End Reason"] for e in events
        if e["Event"] == "SparkListenerTaskEnd" and e["Stage ID"] == stage
    }  # fmt: skip
    attempts = [e["Task Info"] for e in starts if e["Stage ID"] == stage]
    (first, copy) = sorted(
        (a for a in attempts if a["Index"] == 0), key=lambda a: a["Attempt"]
    )  # partition 0: the paused attempt and its speculative copy, and no other
    assert (first["Speculative"], copy["Speculative"]) == (False, True)
    assert copy["Host"] != first["Host"]
    assert ends[copy["Task ID"]]["Reason"] == "Success"
    # The paused attempt's Python worker died by its own SIGKILL ("killed" above): Spark
    # records a crashed worker, or, had the copy's success reached the driver first, the
    # kill it sent that attempt.
    end = ends[first["Task ID"]]
    assert end["Reason"] == "TaskKilled" or "exited unexpectedly" in json.dumps(end), end
    succeeded = {a["Index"] for a in attempts if ends[a["Task ID"]]["Reason"] == "Success"}
    assert succeeded == set(range(PARTITIONS))

    assert_input_exactly_once(broker, topic, postgres_jdbc, table, values)
