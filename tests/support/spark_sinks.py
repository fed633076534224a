"""Helpers the Spark sink tests (tests/spark/) share: a sink on the rig's broker, the input
as a DataFrame or as rows, and both sides read back independently (Kafka with kafka-python's
read_committed consumer, the table with plain SQL)."""

from __future__ import annotations

import uuid
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from sqlalchemy import create_engine, text

from kafka_txn import TransactionalProducer
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.spark.sink import KafkaJdbcSink
from tests.support.rig import Broker

ROW_SCHEMA = "id INT, value STRING"
"""The schema of the rows ``rows`` makes."""


def make_sink(broker: Broker, jdbc: str, prefix: str | None = None, **extra: Any) -> KafkaJdbcSink:
    """A sink on the rig's broker (``kafka=`` adds Kafka settings), its prefix fresh
    unless given; the other keywords are the sink's own (topic, dbtable, on_step...)."""
    return KafkaJdbcSink(
        transactional_id_prefix=prefix or f"guard-{uuid.uuid4().hex[:8]}",
        kafka={"bootstrap.servers": broker.bootstrap_servers, **extra.pop("kafka", {})},
        url=jdbc,
        **extra,
    )


def make_frame(spark: SparkSession, values: list[str], partitions: int) -> DataFrame:
    """A DataFrame of one string column ``value`` in ``partitions`` partitions."""
    return spark.createDataFrame([(v,) for v in values], "value string").repartition(partitions)


def rows(first: int, count: int) -> list[tuple[int, str]]:
    """``count`` rows (i, "v<i>") from ``first`` on, of ROW_SCHEMA."""
    return [(i, f"v{i}") for i in range(first, first + count)]


def table_values(jdbc: str, table: str) -> list[str]:
    """The table's ``value`` column, sorted, read with plain SQL."""
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            return sorted(conn.execute(text(f"SELECT value FROM {table}")).scalars())
    finally:
        engine.dispose()


def kafka_values(broker: Broker, topic: str, expected: int) -> list[str]:
    """The values a read_committed consumer reads from ``topic``, sorted."""
    return sorted(
        (v or b"").decode() for _, v in broker.read_committed(topic, expected, timeout=20)
    )


def kafka_and_table(
    broker: Broker, topic: str, jdbc: str, table: str, expected: int
) -> tuple[list[str], list[str]]:
    """What a read_committed consumer reads from ``topic`` and the table's values, each
    sorted."""
    kafka = sorted(v.decode() for _, v in broker.read_committed(topic, expected=expected))
    return kafka, table_values(jdbc, table)


def abort_leftover(broker: Broker, transactional_id: str) -> None:
    """Initialise ``transactional_id`` once, aborting whatever it left open (cleanup)."""
    producer = TransactionalProducer(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": transactional_id}
    )
    try:
        producer.init_transactions()
    finally:
        producer.close()
