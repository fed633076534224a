"""The PySpark sink on a cluster: ``local-cluster[2,1,1024]``, two executors in JVMs of
their own, so the sink is pickled to them and each keeps its own per-executor state. A
streaming query of four micro-batches over four partitions, one task failed after its
database commit and retried on the other executor; Kafka (read_committed, kafka-python)
and PostgreSQL must hold the input exactly once.

The query runs in a subprocess (tests/apps/spark_cluster_app.py): a process has one
SparkContext, and tests/spark/test_sink.py keeps a local one for its module."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.spark_apps import assert_input_exactly_once, input_files, run_app

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = [pytest.mark.broker, pytest.mark.adversary]


def _task_ends(events: Path) -> list[dict[str, Any]]:
    """Every task's end from Spark's event log."""
    (log,) = events.iterdir()
    lines = (json.loads(line) for line in log.read_text().splitlines() if line)
    return [e for e in lines if e["Event"] == "SparkListenerTaskEnd"]


@pytest.mark.timeout(900)  # a cluster's start, then a run bounded by 300 s on its own
@pytest.mark.guarantee("5.1")
def test_sink_on_local_cluster_with_a_task_retried_on_the_other_executor(
    broker, postgres_jdbc, tmp_path
):
    values = input_files(tmp_path / "in")
    topic = broker.create_topic(partitions=2)
    table = f"cluster_{uuid.uuid4().hex[:10]}"
    (tmp_path / "faults").mkdir()
    (tmp_path / "work").mkdir()
    done = run_app(
        [sys.executable, str(ROOT / "tests" / "apps" / "spark_cluster_app.py"),
         "--input", str(tmp_path / "in"), "--checkpoint", str(tmp_path / "ckpt"),
         "--bootstrap-servers", broker.bootstrap_servers, "--topic", topic,
         "--jdbc-url", postgres_jdbc, "--dbtable", table,
         "--prefix", f"cluster-{uuid.uuid4().hex[:8]}",
         "--fault-dir", str(tmp_path / "faults"), "--work-dir", str(tmp_path / "work")],
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-6000:]
    assert (tmp_path / "faults" / "failed").exists()  # the hook fired

    tasks = _task_ends(tmp_path / "work" / "events")
    assert {t["Task Info"]["Executor ID"] for t in tasks} == {"0", "1"}
    (failed,) = (t for t in tasks if "injected task failure" in json.dumps(t["Task End Reason"]))
    (retry,) = (
        t for t in tasks
        if t["Stage ID"] == failed["Stage ID"]
        and t["Task Info"]["Index"] == failed["Task Info"]["Index"]
        and t["Task End Reason"]["Reason"] == "Success"
    )  # fmt: skip
    assert retry["Task Info"]["Executor ID"] != failed["Task Info"]["Executor ID"]

    assert_input_exactly_once(broker, topic, postgres_jdbc, table, values)
