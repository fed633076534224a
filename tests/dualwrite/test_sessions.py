"""DualWriter and the database session it is given: an engine in autocommit mode is
refused before anything is written, and a session statement timeout that ends the wait
for the state-row lock is the lock-timeout error (guarantees 4.2 and 4.9). The adversarial
schedules of tests/dualwrite/test_session_faults.py cover the same promises with
an earlier deployment's state row; these start from a fresh state table."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, text

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import ConfigurationError, TransactionAbortableError
from tests.support.rig import Broker


@pytest.mark.guarantee("4.2")
def test_an_autocommit_engine_is_refused_before_anything_is_written(
    broker: Broker, topic: str, producer_config: dict[str, Any], jdbc_url: str
) -> None:
    """Each statement of an AUTOCOMMIT session commits on its own: the state row would
    not stay locked, and a body's rows would stay when Kafka aborts. start() refuses it
    with the fix, on every database, before a Kafka transaction or the state row
    exists."""
    state = f"state_{uuid.uuid4().hex[:8]}"
    url = jdbc_to_sqlalchemy(jdbc_url)
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    writer = DualWriter(producer_config, engine, state_table=state)
    try:
        with pytest.raises(ConfigurationError, match="autocommit mode") as raised:
            writer.start()
        assert "Nothing was written" in str(raised.value)
        assert "isolation_level='READ COMMITTED'" in str(raised.value)
        refused = pytest.raises(ConfigurationError, match="autocommit mode")
        with refused, writer.transaction() as tx:  # the body never runs
            tx.produce(topic, b"never")
    finally:
        writer.close()
    assert broker.read_committed(topic, expected=0) == []
    assert broker.open_partitions(topic) == {}
    admin = create_engine(url)
    try:
        if inspect(admin).has_table(state):
            with admin.connect() as conn:
                rows = conn.execute(text(f"SELECT prepared_txn_state FROM {state}")).all()
            assert all(row[0] == "" for row in rows), "no transaction state was stored"
            with admin.begin() as conn:
                conn.execute(text(f"DROP TABLE {state}"))
    finally:
        admin.dispose()


@pytest.mark.guarantee("4.9")
def test_mariadb_max_statement_time_ending_the_lock_wait_is_the_lock_timeout_error(
    broker: Broker, topic: str, producer_config: dict[str, Any], mariadb_jdbc: str
) -> None:
    """MariaDB's max_statement_time (ER_STATEMENT_TIMEOUT, 1969) cancels the wait for
    the state-row lock before lock_timeout: TransactionAbortableError naming the cancel,
    nothing written, and the writer goes on once the holder is gone."""
    state = f"state_{uuid.uuid4().hex[:8]}"
    url = jdbc_to_sqlalchemy(mariadb_jdbc)
    admin = create_engine(url)
    engine = create_engine(url, connect_args={"init_command": "SET max_statement_time=0.5"})
    writer = DualWriter(producer_config, engine, state_table=state, lock_timeout=5.0)
    holder = admin.connect()
    try:
        writer.start()
        holder.begin()
        holder.execute(
            text(f"SELECT 1 FROM {state} WHERE transactional_id = :t FOR UPDATE"),
            {"t": producer_config["transactional.id"]},
        )
        cancelled = pytest.raises(TransactionAbortableError, match="cancelled the statement")
        with cancelled as raised, writer.transaction() as tx:
            tx.produce(topic, b"1")
        assert "Nothing was written" in str(raised.value)
        holder.rollback()
        with writer.transaction() as tx:
            tx.produce(topic, b"2")
    finally:
        holder.rollback()
        holder.close()
        writer.close()
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {state}"))
        admin.dispose()
    assert [v for _, v in broker.read_committed(topic, expected=1)] == [b"2"]
