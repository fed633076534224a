"""The Spark sink against the ways a user goes wrong without being told: two queries on
one prefix, a restart from a fresh checkpoint, a replay with another partitioning, a
partition left prepared that the replay does not bring back, a fresh database hit by
many tasks at once, a cached writer that lost its id. Kafka is read back with kafka-python
(read_committed) and the table with plain SQL."""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from kafka_txn import ReplayMismatchError
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import ProducerFencedError
from kafka_txn.spark.ledger import Ledger, commits_table
from kafka_txn.spark.mapping import Mapping
from kafka_txn.spark.sink import KafkaJdbcSink
from kafka_txn.spark.tasks import PartitionWriter
from tests.support import spark_hooks
from tests.support.adversaries import Interrupted
from tests.support.spark_sinks import kafka_and_table, make_frame, make_sink

pytestmark = pytest.mark.broker


def _stream(spark: SparkSession, folder: Path, checkpoint: Path, sink: KafkaJdbcSink) -> Any:
    query = (
        spark.readStream.schema("value string")
        .json(str(folder))
        .repartition(2)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(StreamingQueryException):  # read through query.exception()
        query.awaitTermination(timeout=300)
    return query


def _files(folder: Path, name: str, values: list[str]) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text("".join(json.dumps({"value": v}) + "\n" for v in values))


# ------------------------------------------------------------------ query identity
@pytest.mark.adversary
@pytest.mark.guarantee("5.3")
def test_a_second_query_on_a_prefix_is_refused_naming_both_then_may_start_over(
    spark, broker, postgres_jdbc, tmp_path
):
    """Query A writes its batch 0. Query B, same prefix, fresh checkpoint (its batch ids
    start again at 0): refused before writing, naming both queries; B is not silently
    skipped as "already written". With start_over, B takes the prefix over and its
    batch 0 is written, once."""
    topic = broker.create_topic(partitions=2)
    table = f"guard_{uuid.uuid4().hex[:10]}"
    prefix = f"guard-{uuid.uuid4().hex[:8]}"
    first = [f"a{i}" for i in range(20)]
    _files(tmp_path / "a", "0", first)
    a = _stream(spark, tmp_path / "a", tmp_path / "ckpt-a", make_sink(broker, postgres_jdbc, prefix,
                topic=topic, dbtable=table))  # fmt: skip
    assert a.exception() is None
    second = [f"b{i}" for i in range(20)]
    _files(tmp_path / "b", "0", second)
    b = _stream(spark, tmp_path / "b", tmp_path / "ckpt-b", make_sink(broker, postgres_jdbc, prefix,
                topic=topic, dbtable=table))  # fmt: skip
    refused = str(b.exception())
    assert "SinkOwnershipError" in refused or "belongs to streaming query" in refused
    assert a.id in refused and b.id in refused
    assert kafka_and_table(broker, topic, postgres_jdbc, table, len(first)) == (sorted(first),) * 2
    again = _stream(
        spark, tmp_path / "b", tmp_path / "ckpt-b2",
        make_sink(broker, postgres_jdbc, prefix, topic=topic, dbtable=table, start_over=True),
    )  # fmt: skip
    assert again.exception() is None
    everything = sorted(first + second)
    assert (
        kafka_and_table(broker, topic, postgres_jdbc, table, len(everything)) == (everything,) * 2
    )


@pytest.mark.adversary
@pytest.mark.guarantee("5.3")
def test_a_batch_job_and_a_query_do_not_share_a_prefix(spark, broker, postgres_jdbc, tmp_path):
    """sink.write() outside a query owns its prefix as "a batch job"; a streaming query
    on it is refused, and says so."""
    topic = broker.create_topic()
    table = f"guard_{uuid.uuid4().hex[:10]}"
    sink = make_sink(broker, postgres_jdbc, topic=topic, dbtable=table)
    sink.write(make_frame(spark, ["x"], 1), batch_id=0)
    _files(tmp_path / "in", "0", ["y"])
    query = _stream(spark, tmp_path / "in", tmp_path / "ckpt", sink)
    assert "a batch job" in str(query.exception())
    assert kafka_and_table(broker, topic, postgres_jdbc, table, 1) == (["x"], ["x"])


# ------------------------------------------------------------------ replay shape
@pytest.mark.adversary
@pytest.mark.guarantee("5.4")
def test_a_replay_with_another_partition_count_is_refused_naming_the_batch(
    spark, broker, postgres_jdbc, tmp_path
):
    """Batch 3 fails with 4 partitions after three of them committed. Replayed with 2
    partitions it could not match their markers (rows lost or twice): refused, naming
    the batch and both counts, and nothing more is written. Replayed as it was, it
    completes exactly once."""
    topic = broker.create_topic(partitions=2)
    table = f"guard_{uuid.uuid4().hex[:10]}"
    folder = tmp_path / "faults"
    folder.mkdir()
    values = [f"v{i}" for i in range(80)]
    hook = spark_hooks.FailPartition(str(folder), partition=2, batch=3)
    failing = make_sink(broker, postgres_jdbc, topic=topic, dbtable=table, on_step=hook)
    with pytest.raises(Exception, match="injected failure of partition 2"):
        failing.write(make_frame(spark, values, 4), batch_id=3)
    kafka, rows = kafka_and_table(broker, topic, postgres_jdbc, table, 0)
    assert kafka == rows and 0 < len(rows) < len(values)  # three partitions committed
    sink = make_sink(broker, postgres_jdbc, failing.prefix, topic=topic, dbtable=table)
    with pytest.raises(ReplayMismatchError, match=r"batch 3 .* 4 partitions .* with 2"):
        sink.write(make_frame(spark, values, 2), batch_id=3)
    assert kafka_and_table(broker, topic, postgres_jdbc, table, len(rows)) == (kafka, rows)
    sink.write(make_frame(spark, values, 4), batch_id=3)
    assert (
        kafka_and_table(broker, topic, postgres_jdbc, table, len(values)) == (sorted(values),) * 2
    )


@pytest.mark.adversary
@pytest.mark.guarantee("5.4")
def test_a_batch_that_committed_nothing_may_be_replayed_with_another_shape(
    spark, broker, postgres_jdbc, tmp_path
):
    """With no partition committed, a replay's partitioning can change (the user fixed
    the plan): it is written once."""
    topic = broker.create_topic()
    table = f"guard_{uuid.uuid4().hex[:10]}"
    folder = tmp_path / "faults"
    folder.mkdir()
    values = [f"v{i}" for i in range(10)]
    failing = make_sink(broker, postgres_jdbc, topic=topic, dbtable=table,
                    on_step=spark_hooks.FailPartition(str(folder), partition=0))  # fmt: skip
    with pytest.raises(Exception, match="injected failure"):
        failing.write(make_frame(spark, values, 1), batch_id=0)
    sink = make_sink(broker, postgres_jdbc, failing.prefix, topic=topic, dbtable=table)
    sink.write(make_frame(spark, values, 3), batch_id=0)
    assert (
        kafka_and_table(broker, topic, postgres_jdbc, table, len(values)) == (sorted(values),) * 2
    )


@pytest.mark.adversary
@pytest.mark.guarantee("5.5")
def test_a_partition_left_prepared_is_committed_before_the_next_batch(
    spark, broker, jdbc_url, tmp_path
):
    """A task of partition 1 dies right after its database commit: Kafka holds its
    transaction prepared. The replay (here the next batch) has no partition 1 at all, so
    no task of that id runs again; the driver commits the prepared transaction before the
    batch, and both sides agree (before: it stayed open until Kafka timed it out)."""
    topic = broker.create_topic(partitions=2)
    table = f"guard_{uuid.uuid4().hex[:10]}"
    sink = make_sink(broker, jdbc_url, topic=topic, dbtable=table)
    sink.write(make_frame(spark, ["first"], 1), batch_id=0)  # creates the tables
    # What partition 1's task of batch 1 did before it died, as the sink does it.
    mapping = Mapping.check(spark.createDataFrame([], "value string").schema, topic)

    def die(step: str) -> None:
        if step == "after_db_commit":
            raise Interrupted

    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{sink.prefix}-1"}
    task = DualWriter(conf, jdbc_url, on_step=die)
    with pytest.raises(Interrupted), task.transaction() as tx:
        tx.connection.execute(mapping.table(table).insert(), [{"value": "left"}])
        tx.produce(topic, b"left")
        tx.connection.execute(
            commits_table("kafka_txn_sink_commits")
            .insert()
            .values(sink=sink.prefix, query_id="", batch_id=1, partition_id=1)
        )
    task.close()  # the prepared transaction stays open
    sink.write(make_frame(spark, ["next"], 1), batch_id=2)
    assert kafka_and_table(broker, topic, jdbc_url, table, 3) == (["first", "left", "next"],) * 2


# ------------------------------------------------------------------ replays do nothing
@pytest.mark.adversary
@pytest.mark.guarantee("5.6")
def test_a_replayed_partition_does_no_commit_cycle_and_fires_no_steps(
    spark, broker, postgres_jdbc, tmp_path
):
    topic = broker.create_topic()
    table = f"guard_{uuid.uuid4().hex[:10]}"
    steps = tmp_path / "steps"
    steps.mkdir()
    sink = make_sink(broker, postgres_jdbc, topic=topic, dbtable=table,
                 on_step=spark_hooks.RecordSteps(str(steps)))  # fmt: skip
    df = make_frame(spark, [f"v{i}" for i in range(10)], 2)
    sink.write(df, batch_id=0)
    fired = {p.name for p in steps.iterdir()}
    assert any(name.endswith("after_kafka_commit") for name in fired)
    sink.write(df, batch_id=0)
    assert {p.name for p in steps.iterdir()} == fired  # the replay did no work at all


# ------------------------------------------------------------------ fresh database, many tasks
@pytest.mark.adversary
@pytest.mark.guarantee("5.7")
def test_the_first_batch_on_a_fresh_database_needs_no_retry(spark, broker, jdbc_url, tmp_path):
    """Eight partitions on a database with none of the sink's tables, the state table
    included: every task's first attempt succeeds (a DDL race would fail some, and
    Spark's retries would hide it)."""
    topic = broker.create_topic(partitions=2)
    table = f"guard_{uuid.uuid4().hex[:10]}"
    steps = tmp_path / "steps"
    steps.mkdir()
    suffix = uuid.uuid4().hex[:8]
    sink = make_sink(broker, jdbc_url, topic=topic, dbtable=table, state_table=f"state_{suffix}",
                 commits_table=f"commits_{suffix}",
                 on_step=spark_hooks.RecordSteps(str(steps)))  # fmt: skip
    values = [f"v{i}" for i in range(80)]
    sink.write(make_frame(spark, values, 8), batch_id=0)
    attempts = {name.split("-")[2] for name in (p.name for p in steps.iterdir())}
    assert attempts == {"0"}
    assert kafka_and_table(broker, topic, jdbc_url, table, len(values)) == (sorted(values),) * 2


# ------------------------------------------------------------------ cached writers
@pytest.mark.adversary
@pytest.mark.guarantee("5.8")
def test_a_cached_writer_that_lost_its_id_is_replaced(spark, broker, postgres_jdbc):
    """After batch 0 the workers keep their writers. Another writer takes partition 0's
    id over (as a retry on another executor would). Batch 1 notices before writing,
    replaces the cached writer, and both sides hold every row once."""
    topic = broker.create_topic()
    table = f"guard_{uuid.uuid4().hex[:10]}"
    sink = make_sink(broker, postgres_jdbc, topic=topic, dbtable=table)
    sink.write(make_frame(spark, ["a", "b"], 1), batch_id=0)
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{sink.prefix}-0"}
    with DualWriter(conf, postgres_jdbc):
        pass  # start(): a newer owner, and the cached producer is fenced in Kafka
    sink.write(make_frame(spark, ["c"], 1), batch_id=1)
    assert kafka_and_table(broker, topic, postgres_jdbc, table, 3) == (["a", "b", "c"],) * 2


@pytest.mark.guarantee("5.9")
def test_a_schema_qualified_table_with_spark_style_options(spark, broker, postgres_jdbc):
    """dbTable given as public.<name>, options in Spark's spelling and case."""
    topic = broker.create_topic()
    table = f"guard_{uuid.uuid4().hex[:10]}"
    sink = KafkaJdbcSink(
        options={
            "kafka.bootstrap.servers": broker.bootstrap_servers,
            "transactionalIdPrefix": f"guard-{uuid.uuid4().hex[:8]}",
            "URL": postgres_jdbc,
            "dbTable": f"public.{table}",
            "Topic": topic,
            "batchSize": "3",
            "isolationLevel": "SERIALIZABLE",
        }
    )
    values = [f"v{i}" for i in range(7)]
    sink.write(make_frame(spark, values, 2), batch_id=0)
    assert (
        kafka_and_table(broker, topic, postgres_jdbc, table, len(values)) == (sorted(values),) * 2
    )


@pytest.mark.adversary
@pytest.mark.parametrize("driver_settles", [True, False], ids=["fenced", "guard"])
@pytest.mark.guarantee("5.4")
def test_a_leftover_attempt_of_a_reshaped_batch_writes_nothing(
    spark, broker, jdbc_url, tmp_path, monkeypatch, driver_settles
):
    """Batch 7 runs with 4 partitions and commits nothing, but an attempt of its partition
    3 is still alive (a lost executor, a task being killed): it has started its writer
    and found no marker. The batch is replayed with 2 partitions and writes every row.
    The leftover attempt then refuses to write, so no row is written twice: the driver
    settled the ids above the replay's count before it (``Ledger.beyond``), which fenced
    it; and, that settling left out, the batch was recorded again with another shape,
    which its guard reads."""
    if not driver_settles:
        monkeypatch.setattr(Ledger, "beyond", lambda self, partitions: [])
    topic = broker.create_topic()
    table = f"guard_{uuid.uuid4().hex[:10]}"
    folder = tmp_path / "faults"
    folder.mkdir()
    values = [f"v{i}" for i in range(8)]
    rows = [(v,) for v in values]

    def frame(partitions: int) -> DataFrame:  # parallelize() slices deterministically
        return spark.sparkContext.parallelize(rows, partitions).toDF("value string")

    hook = spark_hooks.FailPartition(str(folder), partition=0, batch=7)
    failing = make_sink(broker, jdbc_url, topic=topic, dbtable=table, on_step=hook)
    with pytest.raises(Exception, match="injected failure"):
        failing.write(frame(1), batch_id=7)  # records the batch; nothing commits
    sink = make_sink(broker, jdbc_url, failing.prefix, topic=topic, dbtable=table)
    first_run = frame(4)
    sink._prepare(Mapping.check(first_run.schema, topic)).record_batch("", 7, 4, None)
    leftover_rows = first_run.rdd.glom().collect()[3]
    leftover = PartitionWriter(
        sink.options, "", 7, 4, Mapping.check(first_run.schema, topic)
    )  # the first run's attempt of partition 3, as the sink's task runs it
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{sink.prefix}-3"}
    zombie = DualWriter(conf, jdbc_url, mark_completed_after=None)
    zombie.start()
    commits = commits_table("kafka_txn_sink_commits")
    marker = {"sink": sink.prefix, "query_id": "", "batch_id": 7, "partition_id": 3}
    assert leftover._look(zombie, commits, marker) == (False, zombie.owner)
    sink.write(frame(2), batch_id=7)  # the replay, with another shape
    refusal = (
        pytest.raises(ReplayMismatchError, match="leftover of the earlier run")
        if not driver_settles
        else pytest.raises(ProducerFencedError, match="took it over")
    )
    try:
        with refusal:
            leftover._transaction(zombie, commits, marker, iter(leftover_rows))
    finally:
        zombie.close()
    assert kafka_and_table(broker, topic, jdbc_url, table, len(values)) == (sorted(values),) * 2


@pytest.mark.guarantee("5.9")
def test_binary_headers_reach_kafka(spark, broker, postgres_jdbc):
    """Spark hands binary header values over as bytearray; they are sent as bytes (a
    bytearray header would fail every batch with headers)."""
    topic = broker.create_topic()
    table = f"guard_{uuid.uuid4().hex[:10]}"
    sink = make_sink(broker, postgres_jdbc, topic=topic, dbtable=table)
    df = spark.sql(
        "SELECT 'k' AS key, 'v' AS value, "
        "array(named_struct('key', 'h', 'value', CAST('x' AS BINARY))) AS headers"
    )
    sink.write(df, batch_id=0)
    assert kafka_and_table(broker, topic, postgres_jdbc, table, 1) == (["v"], ["v"])
