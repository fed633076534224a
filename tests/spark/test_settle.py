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
from tests.spark.test_guards import Interrupted, _frame, _sides, _sink

pytestmark = pytest.mark.broker


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
    sink = _sink(broker, jdbc_url, topic=topic, dbtable=table)
    sink.write(_frame(spark, ["first"], 1), batch_id=0)  # creates the tables
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
            sink.write(_frame(spark, ["next"], 1), batch_id=2)
        notes = "\n".join(getattr(raised.value, "__notes__", []))
        assert f"{sink.prefix}-5 could not be settled before the batch, which did not run" in notes
        assert "2 of the 6 unfinished transactional ids failed" in notes
        assert f"also {sink.prefix}-6: InvalidPreparedStateError" in notes
        # 1-4 settled all the same; the batch wrote nothing.
        assert ledger.unfinished() == [f"{sink.prefix}-5", f"{sink.prefix}-6"]
        left = [f"left{p}" for p in range(1, 5)]
        assert _sides(broker, topic, jdbc_url, table, 5) == (sorted(["first", *left]),) * 2
        with engine.begin() as conn:
            conn.execute(
                update(state)
                .where(state.c.transactional_id.in_([f"{sink.prefix}-5", f"{sink.prefix}-6"]))
                .values(prepared_txn_state="")
            )
        sink.write(_frame(spark, ["next"], 1), batch_id=2)
        everything = sorted(["first", "next", *left])
        assert _sides(broker, topic, jdbc_url, table, 6) == (everything,) * 2
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
