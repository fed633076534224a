"""The driver settles every unfinished transaction of the prefix before a batch, several
at once (kafka_txn.spark.settle): all of them are attempted, and while any one cannot
be settled the batch does not run and the error names each id that failed. Real broker,
PostgreSQL, MariaDB and SQLite (one at a time there), Spark local."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, create_engine, select, text, update

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import InvalidPreparedStateError, TransactionAbortableError
from kafka_txn.spark.ledger import Ledger, commits_table
from kafka_txn.spark.mapping import Mapping
from kafka_txn.spark.settle import settle_unfinished
from tests.support.adversaries import Interrupted
from tests.support.databases import drop_tables, unique_name
from tests.support.spark_hooks import KillEveryAttempt
from tests.support.spark_sinks import (
    ROW_SCHEMA,
    abort_leftover,
    kafka_and_table,
    kafka_values,
    make_frame,
    make_sink,
    rows,
    table_values,
)

pytestmark = [pytest.mark.broker, pytest.mark.adversary]


def _leave_prepared(
    broker: Any, jdbc: str, sink: Any, mapping: Mapping, topic: str, table: str, p: int
) -> None:
    """What partition ``p``'s task of batch 1 did before it died right after its database
    commit: the rows and marker committed, the Kafka transaction left prepared."""

    def die(step: str) -> None:
        if step == "after_db_commit":
            raise Interrupted

    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{sink.prefix}-{p}"}
    task = DualWriter(conf, jdbc, on_step=die)
    with pytest.raises(Interrupted), task.transaction() as tx:
        tx.connection.execute(mapping.table(table).insert(), [{"value": f"left{p}"}])
        tx.produce(topic, f"left{p}".encode())
        tx.connection.execute(
            commits_table("kafka_txn_sink_commits")
            .insert()
            .values(sink=sink.prefix, query_id="", batch_id=1, partition_id=p)
        )
    task.close()  # the prepared transaction stays open


@pytest.mark.guarantee("5.5")
def test_unfinished_ids_are_settled_together_and_one_that_fails_stops_the_batch(
    spark, broker, jdbc_url
):
    """Partitions 1-4 each left a transaction prepared after the database commit; the
    state rows of partitions 5 and 6 cannot be read (tampered). Before batch 2 the
    driver settles 1-4 (committed in Kafka, stored completed), fails on 5 and 6, and
    does not run the batch: the error raised is 5's, naming it, with 6 noted. Once the
    two rows are repaired, batch 2 runs, and both sides hold every record once."""
    topic = broker.create_topic(partitions=2)
    mapping = Mapping.check(spark.createDataFrame([], "value string").schema, topic)
    table = f"settle_{uuid.uuid4().hex[:10]}"
    sink = make_sink(broker, jdbc_url, topic=topic, dbtable=table)
    sink.write(make_frame(spark, ["first"], 1), batch_id=0)  # creates the tables
    for p in range(1, 5):
        _leave_prepared(broker, jdbc_url, sink, mapping, topic, table, p)
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        for p in (5, 6):  # a row for each, then tampered
            with DualWriter({"bootstrap.servers": broker.bootstrap_servers,
                             "transactional.id": f"{sink.prefix}-{p}"}, jdbc_url):  # fmt: skip
                pass
        ledger = Ledger(engine, sink.prefix, "kafka_txn_sink_commits", _state(sink))
        state = ledger.state
        with engine.begin() as conn:
            conn.execute(
                update(state)
                .where(state.c.transactional_id.in_([f"{sink.prefix}-5", f"{sink.prefix}-6"]))
                .values(prepared_txn_state="tampered")
            )
        assert ledger.unfinished() == [f"{sink.prefix}-{p}" for p in range(1, 7)]
        with pytest.raises(InvalidPreparedStateError) as raised:
            sink.write(make_frame(spark, ["next"], 1), batch_id=2)
        notes = "\n".join(getattr(raised.value, "__notes__", []))
        assert f"{sink.prefix}-5 could not be settled before the batch, which did not run" in notes
        assert "2 of the 6 unfinished transactional ids failed" in notes
        assert f"also {sink.prefix}-6: InvalidPreparedStateError" in notes
        # 1-4 settled all the same; the batch wrote nothing.
        assert ledger.unfinished() == [f"{sink.prefix}-5", f"{sink.prefix}-6"]
        left = [f"left{p}" for p in range(1, 5)]
        assert kafka_and_table(broker, topic, jdbc_url, table, 5) == (sorted(["first", *left]),) * 2
        with engine.begin() as conn:
            conn.execute(
                update(state)
                .where(state.c.transactional_id.in_([f"{sink.prefix}-5", f"{sink.prefix}-6"]))
                .values(prepared_txn_state="")
            )
        sink.write(make_frame(spark, ["next"], 1), batch_id=2)
        everything = sorted(["first", "next", *left])
        assert kafka_and_table(broker, topic, jdbc_url, table, 6) == (everything,) * 2
        assert ledger.unfinished() == []
    finally:
        sink.close()
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()


def _state(sink: Any) -> Table:
    return Table(
        sink.options.state_table, MetaData(),
        Column("transactional_id", String(255)), Column("prepared_txn_state", String),
    )  # fmt: skip


@pytest.mark.guarantee("5.5")
def test_a_failure_that_is_not_about_one_id_stops_further_settles(broker, postgres_jdbc):
    """settle_unfinished one at a time over three unfinished ids, the first one's state
    row locked by another session (its lock wait runs out: a failure that every other
    id would meet as well, like a broker out of reach). The other two are not started;
    the error says so and names the first; they stay unfinished for the next batch."""
    prefix = f"settle-{uuid.uuid4().hex[:8]}"
    topic = broker.create_topic()
    kafka = {"bootstrap.servers": broker.bootstrap_servers}

    def die(step: str) -> None:
        if step == "after_db_commit":
            raise Interrupted

    tids = [f"{prefix}-{p}" for p in range(3)]
    for tid in tids:
        task = DualWriter({**kafka, "transactional.id": tid}, postgres_jdbc, on_step=die)
        with pytest.raises(Interrupted), task.transaction() as tx:
            tx.produce(topic, tid.encode())
        task.close()
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    state = Table(
        "kafka_transaction_state", MetaData(),
        Column("transactional_id", String(255)), Column("prepared_txn_state", String),
    )  # fmt: skip
    ledger = Ledger(engine, prefix, "kafka_txn_sink_commits", state)
    try:
        assert ledger.unfinished() == tids
        with engine.connect() as holder:
            holder.begin()
            holder.execute(
                select(state.c.transactional_id)
                .where(state.c.transactional_id == tids[0])
                .with_for_update()
            )
            with pytest.raises(TransactionAbortableError) as raised:
                settle_unfinished(
                    tids, kafka=kafka, engine=engine, state_table="kafka_transaction_state",
                    lock_timeout=1.0, threads=1,
                )  # fmt: skip
            holder.rollback()
        notes = "\n".join(getattr(raised.value, "__notes__", []))
        assert f"{tids[0]} could not be settled before the batch" in notes
        assert "1 of the 3 unfinished transactional ids failed, 2 were not tried" in notes
        assert ledger.unfinished() == tids
        settle_unfinished(tids, kafka=kafka, engine=engine,
                          state_table="kafka_transaction_state", lock_timeout=None)  # fmt: skip
        assert ledger.unfinished() == []
        assert sorted(v.decode() for _, v in broker.read_committed(topic, expected=3)) == tids
    finally:
        engine.dispose()


# 5.5: a Kafka transaction whose task died before its database commit is not in the
# state table (its row rolled back, still completed): the driver settles the ids above
# the batch's partition count once a batch used them.


@pytest.mark.guarantee("5.5")
def test_a_transaction_left_open_before_the_database_commit_is_settled_before_the_next_batch(
    spark: Any, broker: Any, postgres_jdbc: str
) -> None:
    """Partition 3 of a 4-partition batch killed on every attempt between its state write
    and its database COMMIT, the batch replayed on 2 partitions, then the next batch:
    the transaction id 3 left open is settled, nothing of the prefix stays open, and
    both sides hold every row once."""
    topic = broker.create_topic(1)
    table = unique_name("settle_open")
    prefix = f"settle-open-{uuid.uuid4().hex[:8]}"
    first_rows = rows(0, 6)
    sink = make_sink(
        broker, postgres_jdbc, prefix, dbtable=table, topic=topic,
        on_step=KillEveryAttempt(batch=7, partition=3, step="after_state_write"),
        kafka={"transaction.timeout.ms": 600000},
    )  # fmt: skip
    try:
        # Batch 7, first run: 4 partitions, only partition 3 holds rows; every attempt
        # of it is killed after prepare and the state write, before the database COMMIT.
        first = spark.createDataFrame(
            spark.sparkContext.parallelize(range(4), 4).flatMap(
                lambda i: first_rows if i == 3 else []
            ),
            ROW_SCHEMA,
        )
        assert first.rdd.getNumPartitions() == 4
        with pytest.raises(Exception, match=r"(?s)Python worker|crash|exited"):
            sink.write(first, batch_id=7)
        assert table_values(postgres_jdbc, table) == []  # nothing of it committed
        # The batch replayed with another shape (allowed: nothing of it committed), then
        # the next batch: both on partitions 0 and 1.
        sink.write(spark.createDataFrame(first_rows, ROW_SCHEMA).repartition(2), batch_id=7)
        sink.write(spark.createDataFrame(rows(6, 4), ROW_SCHEMA).repartition(2), batch_id=8)
        assert table_values(postgres_jdbc, table) == sorted(f"v{i}" for i in range(10))
        # No transaction of the prefix is left open: the topic's last stable offset is
        # its high watermark, and every record is visible.
        assert broker.open_partitions(topic) == {}
        assert kafka_values(broker, topic, 10) == sorted(f"v{i}" for i in range(10))
    finally:
        abort_leftover(broker, f"{prefix}-3")
        sink.close()
        drop_tables(create_engine(jdbc_to_sqlalchemy(postgres_jdbc)), table)
