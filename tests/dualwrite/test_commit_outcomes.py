"""What a DualWriter's caller is told once the database COMMIT was sent: the COMMIT applied
and its answer lost (4.3: "committed when the database committed and only its reply was
lost"; on MariaDB through tests/proxies/mysql_proxy.py, on PostgreSQL in
tests/dualwrite/test_writer.py), and the on_step hook failing after both commits (4.13:
the error says both committed, and the writer goes on). Real broker, MariaDB and SQLite;
Kafka is read with a read_committed consumer, the database with SQL."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine, text

from kafka_txn import DatabaseCommitUnknownError, TransactionOutcome
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.state import PreparedTxnState
from tests.proxies.mysql_proxy import MysqlCommitReplyLoser
from tests.support.adversaries import names_fixture
from tests.support.databases import drop_tables as _drop
from tests.support.databases import id_value_table as _events
from tests.support.databases import sorted_values as _values
from tests.support.databases import sqlite_jdbc
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary

names = names_fixture("outcome")


def test_mariadb_commit_whose_ok_is_lost_is_unknown_then_committed_by_the_next_start(
    broker: Broker, mariadb_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    """MariaDB applies the COMMIT and its OK never arrives: the writer raises
    DatabaseCommitUnknownError, leaves the state stored and not completed, and the next
    start() commits the Kafka transaction."""
    topic = broker.create_topic()
    events = _events(names["events"])
    direct = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    proxy = MysqlCommitReplyLoser(("127.0.0.1", 3306))
    proxied = f"jdbc:mariadb://127.0.0.1:{proxy.port}/test?user=root&sslMode=DISABLED"
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}

    def on_step(step: str) -> None:
        if step == "after_state_write":
            proxy.arm()

    try:
        events.metadata.create_all(direct)
        writer = DualWriter(
            conf, proxied, state_table=names["state"], on_step=on_step, mark_completed_after=None
        )
        writer.start()
        with pytest.raises(DatabaseCommitUnknownError), writer.transaction() as tx:
            tx.connection.execute(events.insert(), {"id": 1, "value": "kept"})
            tx.produce(topic, b"kept")
        writer.close()
        assert proxy.lost == 1
        assert _values(direct, events) == ["kept"]  # MariaDB committed
        with direct.connect() as conn:
            stored = PreparedTxnState(
                conn.execute(text(f"SELECT prepared_txn_state FROM {names['state']}")).scalar_one()
            )
        assert not stored.is_empty and not stored.completed
        again = DualWriter(conf, mariadb_jdbc, state_table=names["state"])
        assert again.start() is TransactionOutcome.COMMITTED
        again.close()
        assert broker.read_committed(topic, expected=1) == [(None, b"kept")]
    finally:
        proxy.close()
        _drop(direct, names["events"], names["state"])
        direct.dispose()


# ---------------------------------------------------------------------------------------
# 4.13 / dual-write.md "Threads, and interruptions after the database decided": "Once the
# database COMMIT was sent, ... any exception from your on_step hook. The writer refuses
# every later call with TransactionInDoubtError." The hook's last step, after_kafka_commit,
# comes after the Kafka commit too: nothing is in doubt, so its exception must say that
# both sides committed (a caller that retried what raised would write it twice on both
# sides), and the writer takes the next call.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.13")
def test_a_hook_failing_after_the_kafka_commit_says_both_committed(
    broker: Broker, tmp_path: Any, names: dict[str, str], txn_id: str
) -> None:
    """The hook raises at after_kafka_commit: its error carries a note saying not to
    retry, both sides hold the row once, and the next transaction runs."""
    topic = broker.create_topic()
    events = _events(names["events"])

    raised: list[str] = []

    def hook(step: str) -> None:
        if step == "after_kafka_commit" and not raised:
            raised.append(step)
            raise RuntimeError("tracing backend down")

    writer = DualWriter(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id},
        sqlite_jdbc(tmp_path),
        state_table=names["state"],
        on_step=hook,
    )
    try:
        events.metadata.create_all(writer.engine)
        writer.start()
        with pytest.raises(RuntimeError) as hook_error, writer.transaction() as tx:
            tx.connection.execute(events.insert(), {"id": 1, "value": "once"})
            tx.produce(topic, b"once")
        # 4.13: both sides committed, and the error says so (a caller must not retry)
        assert any("do not retry" in note for note in hook_error.value.__notes__)
        assert _values(writer.engine, events) == ["once"]
        assert broker.read_committed(topic, expected=1) == [(None, b"once")]
        with writer.transaction() as tx:  # nothing is in doubt: the writer goes on
            tx.connection.execute(events.insert(), {"id": 2, "value": "next"})
            tx.produce(topic, b"next")
        assert _values(writer.engine, events) == ["next", "once"]
        assert sorted(v for _, v in broker.read_committed(topic, expected=2)) == [b"next", b"once"]
    finally:
        writer.close()
