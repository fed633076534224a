"""The PySpark sink in local mode: batch writes, task retries and a query killed mid-batch
and restarted from its checkpoint. Kafka (read_committed), the database and the input
must hold the same records, each exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from kafka_txn import ConfigurationError
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.spark.sink import KafkaJdbcSink
from tests.support import spark_hooks

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.broker


@pytest.fixture
def fault_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "faults"
    folder.mkdir()
    return folder


def _db_values(jdbc: str, table: str) -> list[str]:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            return sorted(conn.execute(text(f"SELECT value FROM {table}")).scalars())
    finally:
        engine.dispose()


def _sink(broker, jdbc: str, **extra) -> tuple[KafkaJdbcSink, str, str]:
    topic = broker.create_topic(partitions=2)
    table = f"sink_{uuid.uuid4().hex[:10]}"
    sink = KafkaJdbcSink(
        transactional_id_prefix=f"sink-{uuid.uuid4().hex[:8]}",
        kafka={"bootstrap.servers": broker.bootstrap_servers},
        topic=topic,
        url=jdbc,
        dbtable=table,
        **extra,
    )
    return sink, topic, table


def _assert_exactly_once(broker, topic: str, jdbc: str, table: str, expected: list[str]):
    kafka = sorted(v.decode() for _, v in broker.read_committed(topic, expected=len(expected)))
    assert kafka == sorted(expected)
    assert _db_values(jdbc, table) == sorted(expected)


@pytest.mark.adversary
@pytest.mark.parametrize("db", ["postgresql", "sqlite", "sqlite-relative-path"])
@pytest.mark.guarantee("5.1")
def test_batch_write_and_replay(spark, broker, db, postgres_jdbc, tmp_path, monkeypatch):
    jdbc = postgres_jdbc if db == "postgresql" else f"jdbc:sqlite:{tmp_path}/sink.db"
    if db == "sqlite-relative-path":
        # Relative to the driver's working directory, which is not the Python workers'
        # (they started with the Spark session): the sink makes the path absolute.
        monkeypatch.chdir(tmp_path)
        jdbc = "jdbc:sqlite:sink.db"
    sink, topic, table = _sink(broker, jdbc)
    values = [f"v{i}" for i in range(200)]
    df = spark.createDataFrame(
        [(f"k{i}".encode(), v) for i, v in enumerate(values)], "key binary, value string"
    ).repartition(4)
    sink.write(df, batch_id=0)
    _assert_exactly_once(broker, topic, jdbc, table, values)
    sink.write(df, batch_id=0)  # a replayed batch finds its markers: nothing twice
    _assert_exactly_once(broker, topic, jdbc, table, values)


def test_the_sink_called_outside_any_streaming_query_is_a_batch_job(spark, broker, postgres_jdbc):
    """``sink(df, batch_id)``, foreachBatch's entry point, called by a batch job (no
    streaming query runs, so no foreachBatch can be calling) writes as ``write()`` does,
    once per batch id (docs/guide/spark.md, "Which query a write belongs to")."""
    assert not spark.streams.active
    sink, topic, table = _sink(broker, postgres_jdbc)
    values = [f"b{i}" for i in range(20)]
    df = spark.createDataFrame([(v,) for v in values], "value string").repartition(2)
    sink(df, 3)
    sink(df, 3)  # the same batch again: nothing twice
    _assert_exactly_once(broker, topic, postgres_jdbc, table, values)


def _input_files(folder: Path, files: int, rows: int) -> list[str]:
    folder.mkdir()
    values = []
    for f in range(files):
        lines = []
        for r in range(rows):
            value = f"f{f}-r{r}"
            values.append(value)
            lines.append(json.dumps({"key": f"k{r}", "value": value}))
        (folder / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    return values


@pytest.mark.adversary
@pytest.mark.timeout(600)  # a streaming query bounded by 300 s, then the checks
@pytest.mark.parametrize(
    ("hook", "injected"),
    [
        (spark_hooks.FailFirstAttempt, {"fail-after_prepare", "fail-after_db_commit"}),
        (spark_hooks.FailInBatchOne, {"partition-0", "partition-1"}),
    ],
    ids=["FailFirstAttempt", "FailInBatchOne"],
)
@pytest.mark.guarantee("5.1")
def test_task_retries_are_exactly_once(
    spark, broker, postgres_jdbc, tmp_path, fault_dir, hook, injected
):
    values = _input_files(tmp_path / "in", files=3, rows=40)
    sink, topic, table = _sink(broker, postgres_jdbc, on_step=hook(str(fault_dir)))
    stream = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "in"))
        .repartition(2)
    )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=300)
    assert query.exception() is None
    # Every failure the hook names really happened, each once (a marker per failure).
    assert {marker.name for marker in fault_dir.iterdir()} == injected
    _assert_exactly_once(broker, topic, postgres_jdbc, table, values)


@pytest.mark.adversary
@pytest.mark.timeout(900)  # two runs of the query, each bounded by 300 s
@pytest.mark.guarantee("5.1")
def test_query_killed_mid_batch_and_restarted_from_checkpoint(
    broker, postgres_jdbc, tmp_path, fault_dir
):
    values = _input_files(tmp_path / "in", files=3, rows=40)
    topic = broker.create_topic(partitions=2)
    table = f"sink_{uuid.uuid4().hex[:10]}"
    args = [sys.executable, str(ROOT / "tests" / "apps" / "spark_app.py"),
            "--input", str(tmp_path / "in"), "--checkpoint", str(tmp_path / "ckpt"),
            "--bootstrap-servers", broker.bootstrap_servers, "--topic", topic,
            "--jdbc-url", postgres_jdbc, "--dbtable", table,
            "--prefix", f"restart-{uuid.uuid4().hex[:8]}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run(
        [*args, "--hook", "KillDriverMidBatch", "--fault-dir", str(fault_dir)], env=env,
        capture_output=True,
        text=True, timeout=300, check=False, start_new_session=True,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stdout[-2000:] + killed.stderr[-4000:]
    assert (fault_dir / "killed").exists()
    restarted = subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=300, check=False,
        start_new_session=True,
    )  # fmt: skip
    assert restarted.returncode == 0, restarted.stderr[-4000:]
    _assert_exactly_once(broker, topic, postgres_jdbc, table, values)


@pytest.mark.guarantee("5.2")
def test_schema_errors_come_before_any_write(spark, broker, postgres_jdbc):
    sink, _, table = _sink(broker, postgres_jdbc)
    no_value = spark.createDataFrame([("a",)], "key string")
    with pytest.raises(ConfigurationError, match="no 'value' column"):
        sink.write(no_value, 0)
    bad_value = spark.createDataFrame([(1,)], "value int")
    with pytest.raises(ConfigurationError, match="'value' must be string or binary"):
        sink.write(bad_value, 0)
    unsupported = spark.createDataFrame([("v", {"a": 1})], "value string, extra map<string,int>")
    with pytest.raises(ConfigurationError, match="'extra' has type map<string,int>"):
        sink.write(unsupported, 0)
    bad_name = spark.createDataFrame([("v", 1)], "value string, `x;drop` int")
    with pytest.raises(ConfigurationError, match="not a plain SQL identifier"):
        sink.write(bad_name, 0)
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    try:
        with engine.connect() as conn:  # nothing was created or written
            assert not conn.execute(text("SELECT to_regclass(:t)"), {"t": table}).scalar()
    finally:
        engine.dispose()


def test_sink_settings_are_checked(broker):
    with pytest.raises(ConfigurationError, match="bootstrap servers missing"):
        KafkaJdbcSink(transactional_id_prefix="p", url="jdbc:sqlite:x.db", dbtable="t")
    with pytest.raises(ConfigurationError, match=r"transactional\.id is set by the sink"):
        KafkaJdbcSink(
            transactional_id_prefix="p", url="jdbc:sqlite:x.db", dbtable="t",
            kafka={"bootstrap.servers": "h:1", "transactional.id": "x"},
        )  # fmt: skip
    sink = KafkaJdbcSink(
        transactional_id_prefix="p",
        options={"kafka.bootstrap.servers": "h:1", "url": "jdbc:sqlite:x.db", "dbtable": "t",
                 "topic": "out"},
    )  # fmt: skip
    assert (sink.kafka, sink.topic, sink.dbtable) == ({"bootstrap.servers": "h:1"}, "out", "t")
