"""The PySpark sink on a cluster: ``local-cluster[2,1,1024]``, two executors in JVMs of
their own, so the sink is pickled to them and each keeps its own per-executor state. A
streaming query of four micro-batches over four partitions, one task failed after its
database commit and retried on the other executor; Kafka (read_committed, kafka-python)
and PostgreSQL must hold the input exactly once.

The query runs in a subprocess (tests/apps/spark_cluster_app.py): a process has one
SparkContext, and tests/spark/test_sink.py keeps a local one for its module."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.broker

FILES, ROWS = 4, 50  # one file per micro-batch


def _input_files(folder: Path) -> list[str]:
    folder.mkdir()
    values = []
    for f in range(FILES):
        lines = []
        for r in range(ROWS):
            values.append(f"f{f}-r{r}")
            lines.append(json.dumps({"key": f"k{r}", "value": f"f{f}-r{r}"}))
        (folder / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    return values


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run the app as its own process group; kill whatever of the group is left (driver,
    executor JVMs, Python workers) however it ends."""
    proc = subprocess.Popen(
        args, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group is gone: nothing left
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            out, err = proc.communicate()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _task_ends(events: Path) -> list[dict[str, Any]]:
    """Every task's end from Spark's event log."""
    (log,) = events.iterdir()
    lines = (json.loads(line) for line in log.read_text().splitlines() if line)
    return [e for e in lines if e["Event"] == "SparkListenerTaskEnd"]


def assert_input_exactly_once(
    broker: Any, topic: str, jdbc: str, table: str, values: list[str]
) -> None:
    """Kafka (kafka-python, read_committed) and the table (plain SQL) each hold the
    input files' records exactly once, keys with their values."""
    kafka = broker.read_committed(topic, expected=len(values))
    assert sorted(v.decode() for _, v in kafka) == sorted(values)
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(f"SELECT key, value FROM {table}")).all()
    finally:
        engine.dispose()
    assert sorted(value for _, value in rows) == sorted(values)
    assert {(key, value) for key, value in rows} == {
        (f"k{r}", f"f{f}-r{r}") for f in range(FILES) for r in range(ROWS)
    }


@pytest.mark.timeout(900)  # a cluster's start, then a run bounded by 300 s on its own
@pytest.mark.guarantee("5.1")
def test_sink_on_local_cluster_with_a_task_retried_on_the_other_executor(
    broker, postgres_jdbc, tmp_path
):
    values = _input_files(tmp_path / "in")
    topic = broker.create_topic(partitions=2)
    table = f"cluster_{uuid.uuid4().hex[:10]}"
    (tmp_path / "faults").mkdir()
    (tmp_path / "work").mkdir()
    done = _run(
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
