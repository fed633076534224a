"""Red-team round 4 (the PySpark sink and what it relies on): schedules against the
documented promises of docs/guarantees.md section 5 and docs/spark.md, in Spark local
mode (the session-wide ``spark`` fixture), on the local broker, checked with kafka-python's
read_committed consumer and direct SQL. A strict xfail marks a documented promise that
the schedule breaks."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from kafka_txn import TransactionalProducer
from kafka_txn.errors import ConfigurationError, SinkOwnershipError
from kafka_txn.jdbc import jdbc_to_sqlalchemy
from kafka_txn.spark import KafkaJdbcSink
from tests.databases import drop_tables, unique_name
from tests.rig import Broker

SCHEMA = "id INT, value STRING"


@dataclass(frozen=True)
class KillAttemptsOf:
    """SIGKILL the Python worker running ``partition`` of ``batch`` at ``step``, on every
    attempt (the job then fails once Spark's retries run out). Runs in Spark's workers:
    a picklable object of an importable module."""

    batch: int
    partition: int
    step: str

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        if (step, batch_id, partition) == (self.step, self.batch, self.partition):
            os.kill(os.getpid(), signal.SIGKILL)


def _sink(broker: Broker, jdbc: str, prefix: str, table: str, topic: str, **extra: Any) -> Any:
    return KafkaJdbcSink(
        transactional_id_prefix=prefix,
        kafka={"bootstrap.servers": broker.bootstrap_servers, **extra.pop("kafka", {})},
        topic=topic,
        url=jdbc,
        dbtable=table,
        **extra,
    )


def _rows(first: int, count: int) -> list[tuple[int, str]]:
    return [(i, f"v{i}") for i in range(first, first + count)]


def _table_values(jdbc: str, table: str) -> list[str]:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            return sorted(conn.execute(text(f"SELECT value FROM {table}")).scalars())
    finally:
        engine.dispose()


def _kafka_values(broker: Broker, topic: str, expected: int) -> list[str]:
    return sorted(
        (v or b"").decode() for _, v in broker.read_committed(topic, expected, timeout=20)
    )


def _abort_leftover(broker: Broker, transactional_id: str) -> None:
    """Initialise ``transactional_id`` once, aborting whatever it left open (cleanup)."""
    producer = TransactionalProducer(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": transactional_id}
    )
    try:
        producer.init_transactions()
    finally:
        producer.close()


# ---------------------------------------------------------------------------------------
# 5.5: a Kafka transaction whose task died before its database commit is not in the
# state table, so the driver's scan never settles it.


@pytest.mark.xfail(
    strict=True,
    reason=(
        "5.5: a task SIGKILLed after prepare, before its database commit, leaves its Kafka "
        "transaction open; the batch replayed with fewer partitions (allowed: nothing of "
        "it committed) never runs that id again and the driver's scan of state rows does "
        "not see it, so the transaction stays open across the next batches and "
        "read_committed readers of the topic stall until transaction.timeout.ms"
    ),
)
def test_a_transaction_left_open_before_the_database_commit_is_settled_before_the_next_batch(
    spark: Any, broker: Broker, postgres_jdbc: str
) -> None:
    topic = broker.create_topic(1)
    table = unique_name("rt4_open")
    prefix = f"rt4-open-{uuid.uuid4().hex[:8]}"
    rows = _rows(0, 6)
    sink = _sink(
        broker, postgres_jdbc, prefix, table, topic,
        on_step=KillAttemptsOf(batch=7, partition=3, step="after_state_write"),
        kafka={"transaction.timeout.ms": 600000},
    )  # fmt: skip
    try:
        # Batch 7, first run: 4 partitions, only partition 3 holds rows; every attempt
        # of it is killed after prepare and the state write, before the database COMMIT.
        first = spark.createDataFrame(
            spark.sparkContext.parallelize(range(4), 4).flatMap(lambda i: rows if i == 3 else []),
            SCHEMA,
        )
        assert first.rdd.getNumPartitions() == 4
        with pytest.raises(Exception, match=r"(?s)Python worker|crash|exited"):
            sink.write(first, batch_id=7)
        assert _table_values(postgres_jdbc, table) == []  # nothing of it committed
        # The batch replayed with another shape (allowed: nothing of it committed), then
        # the next batch: both on partitions 0 and 1.
        sink.write(spark.createDataFrame(rows, SCHEMA).repartition(2), batch_id=7)
        sink.write(spark.createDataFrame(_rows(6, 4), SCHEMA).repartition(2), batch_id=8)
        assert _table_values(postgres_jdbc, table) == sorted(f"v{i}" for i in range(10))
        # No transaction of the prefix is left open: the topic's last stable offset is
        # its high watermark, and every record is visible.
        assert broker.open_partitions(topic) == {}
        assert _kafka_values(broker, topic, 10) == sorted(f"v{i}" for i in range(10))
    finally:
        _abort_leftover(broker, f"{prefix}-3")
        sink.close()
        drop_tables(create_engine(jdbc_to_sqlalchemy(postgres_jdbc)), table)


# ---------------------------------------------------------------------------------------
# 5.3: the query id is read from a thread-local Spark property.


def _stream(
    spark: Any, folder: Path, rows: list[tuple[int, str]], checkpoint: Path, fn: Any
) -> None:
    """Run one streaming query over ``rows`` (one JSON file, a fresh input folder) to the
    end (availableNow), through the foreachBatch function ``fn``."""
    folder.mkdir(parents=True)
    (folder / "part-0.json").write_text(
        "".join(json.dumps({"id": i, "value": v}) + "\n" for i, v in rows)
    )
    query = (
        spark.readStream.schema(SCHEMA)
        .json(str(folder))
        .writeStream.foreachBatch(fn)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def _in_a_thread(sink: Any) -> Any:
    """A foreachBatch function that writes through a worker thread, as functions writing
    several sinks in parallel do (a plain ``threading.Thread``)."""

    def write(df: Any, batch_id: int) -> None:
        failure: list[BaseException] = []

        def run() -> None:
            try:
                sink.write(df, batch_id)
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        if failure:
            raise failure[0]

    return write


@pytest.mark.xfail(
    strict=True,
    reason=(
        "5.3: sink.write() called from a thread of the foreachBatch function does not see "
        "Spark's thread-local sql.streaming.queryId and takes the query for a batch job; "
        "a restart from a fresh checkpoint (batch ids from 0 again) is then not refused, "
        "and its batch 0 finds the old query's markers and is skipped: its rows are lost "
        "from Kafka and the table, without an error"
    ),
)
def test_a_query_writing_from_a_thread_restarted_from_a_fresh_checkpoint_loses_nothing(
    spark: Any, broker: Broker, tmp_path: Path, postgres_jdbc: str
) -> None:
    topic = broker.create_topic(1)
    table = unique_name("rt4_thread")
    sink = _sink(broker, postgres_jdbc, f"rt4-thread-{uuid.uuid4().hex[:8]}", table, topic)
    try:
        _stream(spark, tmp_path / "in1", _rows(0, 3), tmp_path / "cp1", _in_a_thread(sink))
        assert _table_values(postgres_jdbc, table) == ["v0", "v1", "v2"]
        # The same query restarted from a fresh checkpoint, on new input: refused, or
        # its rows are written. Never skipped.
        refused = False
        try:
            _stream(spark, tmp_path / "in2", _rows(3, 3), tmp_path / "cp2", _in_a_thread(sink))
        except Exception as exc:  # the query's failure wraps the sink's
            refused = "SinkOwnershipError" in str(exc) or isinstance(exc, SinkOwnershipError)
            if not refused:
                raise
        expected = ["v0", "v1", "v2"] if refused else [f"v{i}" for i in range(6)]
        assert _table_values(postgres_jdbc, table) == expected
        assert _kafka_values(broker, topic, len(expected)) == expected
    finally:
        sink.close()
        drop_tables(create_engine(jdbc_to_sqlalchemy(postgres_jdbc)), table)


# ---------------------------------------------------------------------------------------
# 5.3 / "The check covers sinks that share a commits table": two sinks on one prefix in
# one query.


@pytest.mark.xfail(
    strict=True,
    reason=(
        "5.3: two sinks on one prefix sharing the commits table, written by one query "
        "(two tables and topics from one foreachBatch), are not refused: the second "
        "sink finds the first one's commit markers and writes nothing, without an error"
    ),
)
def test_two_sinks_on_one_prefix_in_one_query_are_refused_or_both_written(
    spark: Any, broker: Broker, tmp_path: Path, postgres_jdbc: str
) -> None:
    topic_a, topic_b = broker.create_topic(1), broker.create_topic(1)
    table_a, table_b = unique_name("rt4_two_a"), unique_name("rt4_two_b")
    prefix = f"rt4-two-{uuid.uuid4().hex[:8]}"
    sink_a = _sink(broker, postgres_jdbc, prefix, table_a, topic_a)
    sink_b = _sink(broker, postgres_jdbc, prefix, table_b, topic_b)

    def both(df: Any, batch_id: int) -> None:
        sink_a.write(df, batch_id)
        sink_b.write(df, batch_id)

    try:
        refused = False
        try:
            _stream(spark, tmp_path / "in", _rows(0, 4), tmp_path / "cp", both)
        except Exception as exc:
            refused = "SinkOwnershipError" in str(exc) or "ConfigurationError" in str(exc)
            if not refused:
                raise
        expected = [f"v{i}" for i in range(4)]
        if not refused:
            assert _table_values(postgres_jdbc, table_b) == expected
            assert _kafka_values(broker, topic_b, 4) == expected
        assert refused or _table_values(postgres_jdbc, table_a) == expected
    finally:
        sink_a.close()
        sink_b.close()
        drop_tables(create_engine(jdbc_to_sqlalchemy(postgres_jdbc)), table_a, table_b)


# ---------------------------------------------------------------------------------------
# docs/spark.md: "The Kafka settings are checked on the driver too, when the sink is
# built, the way each task's TransactionalProducer checks them"; 5.9.


# 5.9 / spark.md: Kafka settings every task's TransactionalProducer refuses were accepted
# by KafkaJdbcSink(...) and failed only inside every task of the first batch.
@pytest.mark.parametrize(
    "setting",
    [
        {"acks": "1"},
        {"max.in.flight.requests.per.connection": 10},
        {"retries": 0},
        {"message.max.bytes": 100},
    ],
    ids=["acks=1", "max.in.flight=10", "retries=0", "message.max.bytes=100"],
)
def test_kafka_settings_a_task_producer_refuses_are_refused_when_the_sink_is_built(
    tmp_path: Path, setting: dict[str, Any]
) -> None:
    conf = {"bootstrap.servers": "127.0.0.1:9", "transactional.id": "rt4-0", **setting}
    with pytest.raises(ConfigurationError):  # what each task's producer does
        TransactionalProducer(conf).close()
    with pytest.raises(ConfigurationError):
        KafkaJdbcSink(
            transactional_id_prefix="rt4",
            kafka={"bootstrap.servers": "127.0.0.1:9", **setting},
            topic="t",
            url=f"jdbc:sqlite:{tmp_path / 'db.sqlite'}",
            dbtable="t",
        )
