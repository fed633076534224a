"""The Spark sink through a broker outage longer than every timeout, on Apache Kafka: a
task whose broker stops answering inside its dual write fails (its Kafka abort runs out
of time), its cached writer is thrown away rather than reused, and once the broker
answers the batch is written whole, each row once in the table and in Kafka
(kafka-python, read_committed), with no transaction left open.

The outage is SIGSTOP to the module's own broker from inside the task (a step hook in
Spark's Python worker), ended by SIGCONT from a separate process.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.spark.sink import KafkaJdbcSink
from tests.support import spark_hooks
from tests.support.apache_kafka import FAST_TIMEOUT_ABORTS, ApacheKafka, running
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary

_TXN_TIMEOUT_MS = 6000
_OUTAGE_S = 10.0
"""Longer than transaction.timeout.ms, which is also the writers' operation timeout."""


@pytest.fixture(scope="module")
def kafka() -> Iterator[tuple[ApacheKafka, Broker]]:
    with running(properties=FAST_TIMEOUT_ABORTS) as server:
        yield server, Broker(server.bootstrap_servers, server.description)


@pytest.mark.guarantee("5.11")
def test_a_batch_whose_broker_stops_answering_is_written_once_when_it_answers_again(
    spark: Any, kafka: tuple[ApacheKafka, Broker], postgres_jdbc: str, tmp_path: Path
) -> None:
    """Batch 0 leaves each worker a cached writer. In batch 1 the broker pauses inside
    partition 0's dual write, for longer than the transaction timeout: the batch fails
    (or its task retries outlast the outage). Written again once the broker answers, it
    commits: the table and Kafka hold every row of both batches once, and no
    transaction is left open."""
    server, broker = kafka
    assert server.pid is not None
    topic = broker.create_topic(partitions=2)
    table = f"outage_{uuid.uuid4().hex[:10]}"
    hook = spark_hooks.PauseBrokerInBatch(str(tmp_path), pid=server.pid, seconds=_OUTAGE_S)
    sink = KafkaJdbcSink(
        transactional_id_prefix=f"outage-{uuid.uuid4().hex[:8]}",
        kafka={
            "bootstrap.servers": broker.bootstrap_servers,
            "transaction.timeout.ms": _TXN_TIMEOUT_MS,
        },
        url=postgres_jdbc,
        dbtable=table,
        topic=topic,
        on_step=hook,
    )

    def frame(values: list[str]) -> Any:
        return spark.createDataFrame([(v,) for v in values], "value string").repartition(2)

    first, second = ["a", "b", "c", "d"], ["e", "f", "g", "h"]
    sink.write(frame(first), batch_id=0)
    started = time.monotonic()
    try:
        try:
            sink.write(frame(second), batch_id=1)
        except Exception:  # the outage failed the batch: Spark's query would run it again
            time.sleep(max(0.0, _OUTAGE_S + 2.0 - (time.monotonic() - started)))
            sink.write(frame(second), batch_id=1)
    finally:
        server.resume()  # whatever happened, the broker answers again
    assert (tmp_path / "paused").exists(), "the outage never happened"
    expected = sorted(first + second)
    seen = sorted(v.decode() for _, v in broker.read_committed(topic, expected=len(expected)))
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    try:
        with engine.connect() as conn:
            rows = sorted(conn.execute(text(f"SELECT value FROM {table}")).scalars())
    finally:
        engine.dispose()
    assert (seen, rows) == (expected, expected)
    assert broker.open_partitions(topic) == {}
