"""Helpers of the dual-write tests that tests/dualwrite/ and tests/cli/ share: a scenario
around tests/apps/dualwrite_app.py (a topic, a transactional id, an events table, and the
app run as a process on them), and a divergence made the way production makes it (the
database committed, Kafka aborted)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Table, create_engine, select

from kafka_txn import PreparedTxnState
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from tests.apps.dualwrite_app import events_table
from tests.support.rig import Broker

ROOT = Path(__file__).resolve().parent.parent.parent


class Scenario:
    """One topic, transactional id, events table and database, and the app around them."""

    def __init__(self, broker: Broker, jdbc_url: str) -> None:
        self.broker = broker
        self.jdbc_url = jdbc_url
        self.topic = broker.create_topic(partitions=2)
        suffix = uuid.uuid4().hex[:10]
        self.txn_id = f"dw-{suffix}"
        self.table = f"events_{suffix}"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run tests/apps/dualwrite_app.py on this scenario with ``args``."""
        return subprocess.run(
            [sys.executable, str(ROOT / "tests" / "apps" / "dualwrite_app.py"),
             "--jdbc-url", self.jdbc_url, "--bootstrap-servers", self.broker.bootstrap_servers,
             "--topic", self.topic, "--transactional-id", self.txn_id,
             "--events-table", self.table, *args],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip

    def rows(self) -> list[bytes]:
        """The events table's values, read with SQL, sorted."""
        engine = create_engine(jdbc_to_sqlalchemy(self.jdbc_url))
        try:
            with engine.connect() as conn:
                values = conn.execute(select(events_table(self.table).c.value)).scalars()
                return sorted(v.encode() for v in values)
        finally:
            engine.dispose()

    def assert_equal_sides(self, expected: int) -> None:
        """``expected`` rows, and a read_committed consumer sees the same values."""
        rows = self.rows()
        assert len(rows) == expected
        kafka = sorted(v for _, v in self.broker.read_committed(self.topic, expected=expected))
        assert kafka == rows


def diverged(
    broker: Broker, jdbc_url: str, txn_id: str
) -> tuple[str, Table, dict[str, Any], PreparedTxnState]:
    """The writer's recipe, with Kafka aborting after the database decided: the row
    ``lost`` is in the database, not in Kafka. On Apache Kafka the coordinator aborts it
    as it does in production: the transaction outlives its transaction.timeout.ms
    (``TransactionCoordinator.abortTimedOutTransactions`` bumps the epoch and aborts).
    noida-db times no transaction out: there the prepared producer aborts it itself,
    under the stored epoch (a divergence only a caller aborting after the database
    committed can make)."""
    topic = broker.create_topic()
    events = events_table(f"events_{uuid.uuid4().hex[:10]}")
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    timed_out = broker.kind != "noida"
    short = {**conf, "transaction.timeout.ms": 4000} if timed_out else conf
    writer = DualWriter(short, jdbc_url, mark_completed_after=None)
    events.create(writer.engine, checkfirst=True)
    writer.start()
    writer.producer.begin_transaction()
    writer.producer.produce(topic, b"lost")
    state = writer.producer.prepare_transaction()
    with writer.engine.begin() as conn:
        conn.execute(events.insert(), [{"batch": 0, "value": "lost"}])
        conn.execute(
            writer.state_table.update()
            .where(writer.state_table.c.transactional_id == txn_id)
            .values(prepared_txn_state=str(state))
        )
    if timed_out:
        writer.close()  # leaves the prepared transaction to the coordinator's timeout
        deadline = time.monotonic() + 60
        while broker.open_partitions(topic):
            assert time.monotonic() < deadline, "the coordinator did not abort it in 60 s"
            time.sleep(0.25)
    else:
        writer.producer.abort_transaction()
        writer.close()
    return topic, events, conf, state
