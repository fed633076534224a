"""Which query owns a sink's prefix (guarantee 5.3, docs/guide/spark.md): the query id is
read from a thread-local Spark property, so a foreachBatch function that writes from a
worker thread is still the query's (and refused when the query restarts from a fresh
checkpoint), a plain thread writing another DataFrame while the query runs is refused
unless it names itself a batch job or names the query, and two sinks on one prefix, in
one query or as batch jobs, are refused. Spark local mode (the session-wide ``spark``
fixture), the local broker, kafka-python's read_committed consumer and direct SQL."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.errors import ConfigurationError, SinkOwnershipError
from tests.support.databases import drop_tables, unique_name
from tests.support.rig import Broker
from tests.support.spark_sinks import ROW_SCHEMA as SCHEMA
from tests.support.spark_sinks import kafka_values as _kafka_values
from tests.support.spark_sinks import make_sink
from tests.support.spark_sinks import rows as _rows
from tests.support.spark_sinks import table_values as _table_values

pytestmark = [pytest.mark.broker, pytest.mark.adversary]


def _sink(broker: Broker, jdbc: str, prefix: str, table: str, topic: str, **extra: Any) -> Any:
    return make_sink(broker, jdbc, prefix, dbtable=table, topic=topic, **extra)


# ---------------------------------------------------------------------------------------
# 5.3: the query id is read from a thread-local Spark property.


def _stream(
    spark: Any, folder: Path, rows: list[tuple[int, str]], checkpoint: Path, fn: Any
) -> str:
    """Run one streaming query over ``rows`` (one JSON file, a fresh input folder) to the
    end (availableNow), through the foreachBatch function ``fn``; return the query's id."""
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
    return str(query.id)


def _in_a_thread(sink: Any, thread_class: Any = threading.Thread) -> Any:
    """A foreachBatch function that writes through a worker thread, as functions writing
    several sinks in parallel do (a plain ``threading.Thread`` unless told)."""

    def write(df: Any, batch_id: int) -> None:
        failure: list[BaseException] = []

        def run() -> None:
            try:
                sink.write(df, batch_id)
            except BaseException as exc:
                failure.append(exc)

        thread = thread_class(target=run)
        thread.start()
        thread.join()
        if failure:
            raise failure[0]

    return write


@pytest.mark.guarantee("5.3")
def test_a_query_writing_from_a_thread_restarted_from_a_fresh_checkpoint_loses_nothing(
    spark: Any, broker: Broker, tmp_path: Path, postgres_jdbc: str
) -> None:
    """A foreachBatch function writing through a worker thread: the write is the query's,
    so the query restarted from a fresh checkpoint is refused before it writes."""
    topic = broker.create_topic(1)
    table = unique_name("rt4_thread")
    sink = _sink(broker, postgres_jdbc, f"rt4-thread-{uuid.uuid4().hex[:8]}", table, topic)
    try:
        _stream(spark, tmp_path / "in1", _rows(0, 3), tmp_path / "cp1", _in_a_thread(sink))
        assert _table_values(postgres_jdbc, table) == ["v0", "v1", "v2"]
        # The write from the thread is the query's (found by its DataFrame's session),
        # so the same query restarted from a fresh checkpoint, on new input, is refused
        # before it writes, as on foreachBatch's own thread. Never skipped.
        with pytest.raises(Exception, match="SinkOwnershipError"):  # wrapped by the query
            _stream(spark, tmp_path / "in2", _rows(3, 3), tmp_path / "cp2", _in_a_thread(sink))
        expected = ["v0", "v1", "v2"]
        assert _table_values(postgres_jdbc, table) == expected
        assert _kafka_values(broker, topic, len(expected)) == expected
    finally:
        sink.close()
        drop_tables(create_engine(jdbc_to_sqlalchemy(postgres_jdbc)), table)


def _owner(jdbc: str, prefix: str) -> str | None:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            return conn.execute(
                text("SELECT query_id FROM kafka_txn_sink_commits_queries WHERE sink = :p"),
                {"p": prefix},
            ).scalar()
    finally:
        engine.dispose()


@pytest.mark.guarantee("5.3")
def test_writes_from_other_threads_are_the_query_s_or_refused_never_a_batch_job(
    spark: Any, broker: Broker, tmp_path: Path, postgres_jdbc: str
) -> None:
    """An InheritableThread sees the query; a plain thread writing a DataFrame that is
    not the query's batch while the query runs is refused (ConfigurationError), unless
    it names itself a batch job (query_id=""), or names the query."""
    from pyspark import InheritableThread

    topic = broker.create_topic(1)
    tables = [unique_name(f"rt4_thr{i}") for i in range(3)]
    tag = uuid.uuid4().hex[:8]
    prefixes = [f"rt4-thr{i}-{tag}" for i in range(3)]
    sinks = [
        _sink(broker, postgres_jdbc, p, t, topic) for p, t in zip(prefixes, tables, strict=True)
    ]
    outcomes: dict[str, Any] = {}

    def in_thread(key: str, fn: Any) -> None:
        def run() -> None:
            try:
                fn()
                outcomes[key] = "written"
            except BaseException as exc:
                outcomes[key] = exc

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()

    def fn(df: Any, batch_id: int) -> None:
        _in_a_thread(sinks[0], InheritableThread)(df, batch_id)
        other = spark.createDataFrame(_rows(100, 2), SCHEMA)  # not the query's batch
        in_thread("plain", lambda: sinks[1].write(other, batch_id))
        in_thread("call", lambda: sinks[1](other, batch_id))
        in_thread("batch job", lambda: sinks[1].write(other, batch_id, query_id=""))
        query = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        in_thread("named", lambda: sinks[2].write(other, batch_id, query_id=query))
        with pytest.raises(ConfigurationError, match="leave query_id out"):
            sinks[2].write(df, batch_id, query_id="another")
        with pytest.raises(ConfigurationError, match="at most 64 characters"):
            sinks[2].write(df, batch_id, query_id="x" * 65)

    try:
        query_id = _stream(spark, tmp_path / "in", _rows(0, 3), tmp_path / "cp", fn)
        assert _owner(postgres_jdbc, prefixes[0]) == query_id
        assert _table_values(postgres_jdbc, tables[0]) == ["v0", "v1", "v2"]
        for key in ("plain", "call"):
            assert isinstance(outcomes[key], ConfigurationError), outcomes[key]
            assert "InheritableThread" in str(outcomes[key])
        assert outcomes["batch job"] == "written"
        assert _owner(postgres_jdbc, prefixes[1]) == ""
        assert outcomes["named"] == "written"
        assert _owner(postgres_jdbc, prefixes[2]) == query_id
        # No query running: write() from any thread is a batch job, as before.
        in_thread("after", lambda: sinks[1].write(spark.createDataFrame(_rows(102, 1), SCHEMA), 1))
        assert outcomes["after"] == "written"
        assert _table_values(postgres_jdbc, tables[1]) == ["v100", "v101", "v102"]
    finally:
        for sink in sinks:
            sink.close()
        drop_tables(create_engine(jdbc_to_sqlalchemy(postgres_jdbc)), *tables)


# ---------------------------------------------------------------------------------------
# 5.3 / "The check covers sinks that share a commits table": two sinks on one prefix in
# one query (or batch jobs) of one process are refused.


@pytest.mark.guarantee("5.3")
def test_two_sinks_on_one_prefix_in_one_query_are_refused_or_both_written(
    spark: Any, broker: Broker, tmp_path: Path, postgres_jdbc: str
) -> None:
    """Two sinks on one prefix in one query: the second is refused before it writes; batch
    jobs likewise, until one takes the prefix over with start_over=True."""
    topic_a, topic_b = broker.create_topic(1), broker.create_topic(1)
    table_a, table_b = unique_name("rt4_two_a"), unique_name("rt4_two_b")
    prefix = f"rt4-two-{uuid.uuid4().hex[:8]}"
    sink_a = _sink(broker, postgres_jdbc, prefix, table_a, topic_a)
    sink_b = _sink(broker, postgres_jdbc, prefix, table_b, topic_b)

    def both(df: Any, batch_id: int) -> None:
        sink_a.write(df, batch_id)
        sink_b.write(df, batch_id)

    more: list[Any] = []

    try:
        # The second sink is refused before it writes (it would find the first one's
        # markers and write nothing); the first one's batch is written.
        with pytest.raises(Exception, match=r"SinkOwnershipError(?s:.*)is used by another sink"):
            _stream(spark, tmp_path / "in", _rows(0, 4), tmp_path / "cp", both)
        expected = [f"v{i}" for i in range(4)]
        assert _table_values(postgres_jdbc, table_a) == expected
        assert _kafka_values(broker, topic_a, 4) == expected
        # Batch jobs likewise: a sink for table B on the prefix batch jobs of table A
        # used is refused; with start_over=True it takes the prefix over, and writes.
        jobs = f"{prefix}-jobs"
        more.append(_sink(broker, postgres_jdbc, jobs, table_a, topic_a))
        more.append(_sink(broker, postgres_jdbc, jobs, table_b, topic_b))
        more.append(_sink(broker, postgres_jdbc, jobs, table_b, topic_b, start_over=True))
        more[0].write(spark.createDataFrame(_rows(4, 1), SCHEMA), batch_id=0)
        with pytest.raises(SinkOwnershipError, match="is used by another sink"):
            more[1].write(spark.createDataFrame(_rows(5, 1), SCHEMA), batch_id=1)
        more[2].write(spark.createDataFrame(_rows(5, 1), SCHEMA), batch_id=1)
        assert _table_values(postgres_jdbc, table_b) == ["v5"]
    finally:
        for sink in (sink_a, sink_b, *more):
            sink.close()
        drop_tables(create_engine(jdbc_to_sqlalchemy(postgres_jdbc)), table_a, table_b)
