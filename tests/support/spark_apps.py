"""Helpers of the Spark tests that run a streaming query in a subprocess of its own
(tests/apps/spark_cluster_app.py, tests/apps/spark_speculation_app.py: a process has one
SparkContext): the input files, the app run as its own process group and killed whatever
happens, and the check that both sides hold the input exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy

ROOT = Path(__file__).resolve().parent.parent.parent
FILES, ROWS = 4, 50
"""Input files (one per micro-batch) and rows per file."""


def input_files(folder: Path) -> list[str]:
    """FILES JSON files of ROWS records each (key ``k<r>``, value ``f<f>-r<r>``) in a new
    ``folder``; their values."""
    folder.mkdir()
    values = []
    for f in range(FILES):
        lines = []
        for r in range(ROWS):
            values.append(f"f{f}-r{r}")
            lines.append(json.dumps({"key": f"k{r}", "value": f"f{f}-r{r}"}))
        (folder / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    return values


def run_app(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
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
