"""A Spark streaming query through ``KafkaJdbcSink`` (PostgreSQL) while the three-broker
cluster's brokers fail.

The query is tests/apps/spark_app.py (JSON files -> ``foreachBatch(KafkaJdbcSink)``,
``availableNow``, one file per micro-batch, two partitions: two transactional ids), run
as its own process group, again and again from its checkpoint, each time with new input
files, while ``BrokerFaults`` bounces the sink's transaction coordinators and the
topic's leaders and pauses brokers past the replica lag. A run that fails (a batch the
outage failed past Spark's task retries) is followed by another from the checkpoint, as
an operator restarts a query.

Then: once the cluster healed, the next run processes its new files and ends; the table
and a read_committed consumer (kafka-python) each hold every input record exactly once;
no transaction is left open on the topic; a failed run names an error the docs name.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from tests.support.cluster_faults import (
    SECONDS,
    SEED,
    BrokerFaults,
    Figures,
    Targets,
    assert_exactly_once,
    compare,
    documented_errors,
)
from tests.support.kafka_cluster import KafkaCluster
from tests.support.rig import Broker
from tests.support.spark_apps import run_app

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = [pytest.mark.cluster, pytest.mark.adversary]

ROWS = 40
RUN_LIMIT_S = 400.0


class Query:
    """The streaming query's input folder, checkpoint, topic and table."""

    def __init__(self, broker: Broker, jdbc: str, folder: Path) -> None:
        self.input = folder / "in"
        self.input.mkdir()
        self.checkpoint = folder / "ckpt"
        self.topic = broker.create_topic(partitions=2)
        self.table = f"cluster_sink_{uuid.uuid4().hex[:10]}"
        self.prefix = f"cluster-spark-{uuid.uuid4().hex[:8]}"
        self.jdbc = jdbc
        self.bootstrap = broker.bootstrap_servers
        self.files = 0
        self.values: list[str] = []
        self.failures: Counter[str] = Counter()
        self.runs = 0
        self.last_failure = ""

    def add_files(self, count: int) -> None:
        """``count`` new JSON files of ROWS records (value ``f<file>-r<row>``)."""
        for _ in range(count):
            lines = []
            for r in range(ROWS):
                value = f"f{self.files}-r{r}"
                self.values.append(value)
                lines.append(json.dumps({"key": f"k{r}", "value": value}))
            (self.input / f"part-{self.files:04d}.json").write_text("\n".join(lines) + "\n")
            self.files += 1

    def run(self) -> bool:
        """One run of the query over every file not yet processed; whether it ended well
        (a failure is counted by the kafka-txn error it names)."""
        self.runs += 1
        done = run_app(
            [sys.executable, str(ROOT / "tests" / "apps" / "spark_app.py"),
             "--input", str(self.input), "--checkpoint", str(self.checkpoint),
             "--bootstrap-servers", self.bootstrap, "--topic", self.topic,
             "--jdbc-url", self.jdbc, "--dbtable", self.table, "--prefix", self.prefix],
            RUN_LIMIT_S,
        )  # fmt: skip
        if done.returncode == 0:
            return True
        named = re.findall(r"kafka_txn\.errors\.(\w+)", done.stderr)
        self.failures[named[-1] if named else "other"] += 1
        self.last_failure = done.stderr[-4000:]
        return False

    def rows(self) -> list[str]:
        engine = create_engine(jdbc_to_sqlalchemy(self.jdbc))
        try:
            with engine.connect() as conn:
                return list(conn.execute(text(f"SELECT value FROM {self.table}")).scalars())
        finally:
            engine.dispose()


@pytest.mark.timeout(900 + 3 * SECONDS)
@pytest.mark.guarantee("7.3")
def test_streaming_query_under_broker_faults(
    cluster: KafkaCluster, cluster_broker: Broker, postgres_jdbc: str, tmp_path: Path
) -> None:
    """A streaming query through KafkaJdbcSink, run again from its checkpoint with new
    files while its transaction coordinators and leaders are bounced and brokers paused:
    the table and a read_committed consumer (kafka-python) each hold every input record
    once, nothing is left open, and the query ends well once the cluster healed."""
    query = Query(cluster_broker, postgres_jdbc, tmp_path)
    faults = BrokerFaults(
        cluster,
        Targets(
            lambda: [f"{query.prefix}-{p}" for p in range(2)],
            [(query.topic, p) for p in range(2)],
        ),
        SEED,
    )
    where = f"KAFKA_TXN_CLUSTER_SEED={SEED}"
    with faults.running(SECONDS):
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            query.add_files(3)
            query.run()
    # The cluster has healed: the query processes what is left and new files, and ends.
    query.add_files(1)
    assert query.run(), (
        f"the query failed after the cluster healed ({where}):\n{query.last_failure}"
    )
    comparison = compare(cluster_broker, query.topic, query.rows())
    # One micro-batch per file, one transaction per partition (two) in each.
    Figures("KafkaJdbcSink (Spark)", faults, 2 * query.files, comparison, query.failures).record()
    context = f"{where}; {faults.summary()}; {query.runs} runs"
    assert_exactly_once(comparison, context)
    assert sorted(comparison.rows) == sorted(query.values), context
    assert set(query.failures) <= documented_errors("spark"), (query.failures, context)
