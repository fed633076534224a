"""DualWriter never aborts Kafka before the last commit is stored settled (guarantee 4.7).

librdkafka's abort may bump the producer epoch (KIP-360: an abortable error that needs a
new epoch is cleared by InitProducerId, which ends the transaction). After that, the
coordinator's DescribeTransactions no longer shows how the last committed transaction
ended, so recovery could only report it unknowable. DualWriter therefore stores the last
commit's state marked completed before it aborts; when the database refuses that write,
it must leave the open transaction alone (the next start() stores the mark, then fences,
which aborts it), in a failed transaction's rollback and in close().

The mark is made to fail for real: a second PostgreSQL session holds the state table
locked in EXCLUSIVE mode (queued behind the failing transaction, so it gets the lock the
moment that transaction rolls back), and the writer's lock_timeout runs out."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
from sqlalchemy import create_engine, text

from kafka_txn import FatalError, TransactionOutcome
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.coordinator.client import TransactionDescription
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from tests.support.rig import Broker

pytestmark = [pytest.mark.broker, pytest.mark.adversary]


def _describe(broker: Broker, txn_id: str) -> TransactionDescription:
    settings = ConnectionSettings.from_librdkafka({"bootstrap.servers": broker.bootstrap_servers})
    with CoordinatorClient(settings, txn_id) as client:
        return client.describe()


@contextmanager
def _table_lock_queued(jdbc: str, table: str) -> Iterator[threading.Event]:
    """A session that asks for the state table's EXCLUSIVE lock now (it conflicts with the
    ROW SHARE lock of the writer's SELECT ... FOR UPDATE and with the ROW EXCLUSIVE lock of
    any UPDATE) and holds it, once granted, until the yielded event is set. Returns once
    that session waits for the lock.

    A table lock rather than the row's: PostgreSQL's lock manager grants a queued table
    lock inside the releasing transaction's own commit or rollback, so no later UPDATE can
    overtake it. A queued row lock is only granted once the waiting backend runs again; a
    row whose locker rolled back is free until then, and on a loaded machine the writer's
    own next UPDATE took it first (seen in CI)."""
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    release, granted = threading.Event(), threading.Event()
    pid: list[int] = []

    def hold() -> None:
        with engine.connect() as conn:
            pid.append(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            conn.execute(text(f"LOCK TABLE {table} IN EXCLUSIVE MODE"))
            granted.set()
            release.wait(60)
            conn.rollback()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        with engine.connect() as probe:
            deadline = time.monotonic() + 30
            while True:  # until the holder waits for the lock (or has it)
                if granted.is_set():
                    break
                if pid:
                    waiting = probe.execute(
                        text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :p"),
                        {"p": pid[0]},
                    ).scalar()
                    probe.rollback()
                    if waiting == "Lock":
                        break
                assert time.monotonic() < deadline, "the lock holder never queued"
                time.sleep(0.02)
        yield release
    finally:
        release.set()
        thread.join(30)
        engine.dispose()


@pytest.mark.guarantee("4.7")
def test_a_failed_transaction_is_not_aborted_while_the_last_commit_is_unsettled(
    broker, postgres_jdbc, txn_id
):
    topic = broker.create_topic()
    table = f"marks_{uuid.uuid4().hex[:10]}"
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    armed = threading.Event()
    with ExitStack() as blockers:

        def on_step(step: str) -> None:
            # In the second transaction, once its records are sent: queue another session
            # on the state table (this transaction holds the row lock), then fail it.
            if step == "after_send" and armed.is_set():
                armed.clear()
                blockers.enter_context(_table_lock_queued(postgres_jdbc, table))
                raise RuntimeError("the application's dual write failed")

        writer = DualWriter(
            conf, postgres_jdbc, state_table=table, lock_timeout=1.0,
            mark_completed_after=None, on_step=on_step,
        )  # fmt: skip
        try:
            writer.start()
            with writer.transaction() as tx:
                tx.produce(topic, b"first")  # committed; its completion mark stays due
            armed.set()
            failing = pytest.raises(RuntimeError, match="dual write failed")
            with failing, writer.transaction() as tx:
                tx.produce(topic, b"second")
            # The mark could not be stored (the table stays locked past lock_timeout): the
            # second transaction was not aborted, so the coordinator still shows the first
            # one's outcome as reachable (same epoch, a later transaction open), and the
            # writer has stopped.
            seen = _describe(broker, txn_id)
            assert seen.state == "Ongoing", seen
            with pytest.raises(FatalError, match="NOT aborted"), writer.transaction():
                pass
            # close() cannot store the mark either: it leaves the transaction open too.
            writer.close()
            after = _describe(broker, txn_id)
            assert (after.state, after.producer_epoch) == ("Ongoing", seen.producer_epoch)
        finally:
            writer.close()

    # The table is free again. A new writer settles the first commit (provably: the
    # coordinator still knows it), then its fence aborts the second transaction.
    successor = DualWriter(conf, postgres_jdbc, state_table=table)
    try:
        assert successor.start() is TransactionOutcome.ALREADY_COMMITTED
    finally:
        successor.close()
    ended = _describe(broker, txn_id)
    assert ended.producer_epoch > seen.producer_epoch and ended.state != "Ongoing", ended
    assert broker.read_committed(topic, expected=1) == [(None, b"first")]
