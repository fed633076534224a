"""Writers kept across batches share their Python worker's engine: between batches a
worker holds about one idle database connection, not one per transactional id it has
served (which grew to 64 per worker, docs/guide/spark.md). Real broker, PostgreSQL, Spark
local[2]; the connections are counted in pg_stat_activity by application name."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine, text

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from tests.support.spark_sinks import kafka_and_table, make_frame, make_sink

pytestmark = pytest.mark.broker


def test_kept_writers_share_their_workers_connections(spark, broker, postgres_jdbc):
    """Two batches of 8 partitions (8 transactional ids) on local[2]: both are written
    once, and afterwards the sink's Python workers hold fewer idle connections than
    the 8 writers they keep (each worker: one per database; local[2] runs 2 tasks at a
    time, so a few workers at most)."""
    name = f"kt{uuid.uuid4().hex[:10]}"
    jdbc = f"{postgres_jdbc}&ApplicationName={name}"
    topic = broker.create_topic(partitions=2)
    table = f"conn_{uuid.uuid4().hex[:10]}"
    sink = make_sink(broker, jdbc, topic=topic, dbtable=table)
    values = [f"v{i}" for i in range(40)]
    sink.write(make_frame(spark, values[:20], 8), batch_id=0)
    sink.write(make_frame(spark, values[20:], 8), batch_id=1)
    sink.close()  # the driver's own connections
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    try:
        with engine.connect() as conn:
            held = conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"),
                {"n": name},
            ).scalar()
    finally:
        engine.dispose()
    assert (
        kafka_and_table(broker, topic, postgres_jdbc, table, len(values)) == (sorted(values),) * 2
    )
    assert held is not None and 1 <= held < 8, held
