"""``kafka-txn recover``'s advice for a divergence (docs/guide/operations.md), followed by
an operator who is interrupted half way and runs the command again: step 1 (check the
topic read_committed, re-send only the records that are not there) then step 2 (the
compare-and-set UPDATE of the state row) leave each record in Kafka once. Real broker and
SQLite; Kafka is read with a read_committed consumer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import insert, text

from kafka_txn import PreparedTxnState, TransactionalProducer
from kafka_txn.cli.main import main as kafka_txn_cli
from kafka_txn.dualwrite.writer import DualWriter
from tests.support import adversaries as support
from tests.support.adversaries import committed_values
from tests.support.databases import id_value_table, sorted_values, sqlite_jdbc, unique_name
from tests.support.rig import Broker

make_writer = support.make_writer


@pytest.mark.adversary
def test_recover_advice_for_a_divergence_followed_twice_duplicates_nothing(
    make_writer: Callable[..., DualWriter],
    broker: Broker,
    topic: str,
    txn_id: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """recover reports the divergence twice (the operator re-sent, then was interrupted
    before updating the row); following the advice both times re-sends nothing twice."""
    jdbc = sqlite_jdbc(tmp_path)
    state_table = unique_name("st")
    events = id_value_table(unique_name("ev"))
    writer = make_writer(txn_id, jdbc, state_table=state_table, tables=[events.name])
    events.create(writer.engine)
    writer.start()  # creates the state row
    writer.close()
    # A divergence: the database decided "commit" for a prepared transaction that Kafka
    # aborted (on Apache Kafka, transaction.timeout.ms; the local broker has no timeout,
    # so the prepared transaction is aborted by its producer instead: the coordinator
    # then shows it CompleteAbort under the stored identity, which recovery reads as
    # diverged).
    producer = TransactionalProducer(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id,
         "transaction.two.phase.commit.enable": True}
    )  # fmt: skip
    producer.init_transactions()
    producer.begin_transaction()
    for value in ("a", "b"):
        producer.produce(topic, value.encode())
    state = producer.prepare_transaction()
    with writer.engine.begin() as conn:
        conn.execute(insert(events), [{"id": 1, "value": "a"}, {"id": 2, "value": "b"}])
        conn.execute(
            text(f"UPDATE {state_table} SET prepared_txn_state = :s WHERE transactional_id = :t"),
            {"s": str(state), "t": txn_id},
        )
    producer.complete_transaction(PreparedTxnState(""))
    producer.close()

    def resend_missing() -> None:
        """Step 1 as the advice gives it: read the topic read_committed, then produce
        (your application's re-send, or a producer of your own) the rows' records that
        are not there."""
        there = committed_values(broker, topic, expected=2, timeout=5)
        own = TransactionalProducer(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{txn_id}-re"}
        )
        own.init_transactions()
        own.begin_transaction()
        for value in sorted_values(writer.engine, events):
            if value not in there:
                own.produce(topic, value.encode())
        own.commit_transaction()
        own.close()

    argv = ["recover", "--bootstrap-servers", broker.bootstrap_servers, "--transactional-id",
            txn_id, "--jdbc-url", jdbc, "--state-table", state_table, "--yes"]  # fmt: skip
    # Run 1: diverged; the operator re-sends (step 1) and is interrupted before step 2.
    # Run 2: the same advice; the operator follows it through (steps 1 and 2).
    for _run in (1, 2):
        capsys.readouterr()
        assert kafka_txn_cli(argv) == 1
        said = capsys.readouterr().err
        assert "Kafka aborted the transaction that the database committed" in said, said
        assert "--isolation-level read_committed" in said, said
        if "produce again that database transaction's records that are not there" in said:
            resend_missing()
    with writer.engine.begin() as conn:  # step 2, the compare-and-set UPDATE
        conn.execute(
            text(
                f"UPDATE {state_table} SET prepared_txn_state = :done "
                "WHERE transactional_id = :t AND prepared_txn_state = :s"
            ),
            {"done": str(state.mark_completed()), "t": txn_id, "s": str(state)},
        )
    # Advice that re-sent without checking the topic first would leave a, a, b, b.
    assert committed_values(broker, topic, expected=4, timeout=5) == ["a", "b"]
