"""Crash recovery (KIP-939 emulated): processes killed hard at each step of the recipe,
a fresh process recovers, and the records a read_committed consumer sees equal the rows
the database committed, each exactly once."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from kafka_txn import (
    InvalidPreparedStateError,
    PreparedTxnState,
    TransactionalProducer,
    TransactionDivergedError,
    TransactionOutcome,
)
from kafka_txn.testing import ApiKey, FaultProxy

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.broker


class App:
    """Runs tests/crash_app.py in subprocesses against one topic, id and database."""

    def __init__(self, broker, tmp_path: Path, txn_id: str) -> None:
        self.broker = broker
        self.topic = broker.create_topic(partitions=2)
        self.txn_id = txn_id
        self.db = tmp_path / "app.sqlite"

    def run(self, *args: str, expect_exit: int = 0) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "crash_app.py"),
             "--bootstrap-servers", self.broker.bootstrap_servers, "--topic", self.topic,
             "--transactional-id", self.txn_id, "--db", str(self.db), *args],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == expect_exit, done.stdout + done.stderr
        return done.stdout.splitlines()[0].removeprefix("outcome=")

    def rows(self) -> list[bytes]:
        with sqlite3.connect(self.db) as db:
            return sorted(r[0].encode() for r in db.execute("SELECT value FROM rows"))

    def kafka(self, expected: int) -> list[bytes]:
        return sorted(v for _, v in self.broker.read_committed(self.topic, expected=expected))

    def assert_consistent(self, expected_rows: int) -> None:
        rows = self.rows()
        assert len(rows) == expected_rows
        assert self.kafka(expected_rows) == rows  # nothing lost, nothing twice


@pytest.fixture
def app(broker, tmp_path, txn_id):
    return App(broker, tmp_path, txn_id)


def test_crash_after_prepare_before_decision_aborts(app):
    app.run("--batch", "0")
    app.run("--batch", "1", "--crash-at", "after_prepare", expect_exit=70)
    assert app.run("--mode", "recover") == TransactionOutcome.NOTHING_TO_COMMIT
    app.assert_consistent(5)


def test_crash_after_decision_before_kafka_commit_commits(app):
    app.run("--batch", "0", "--crash-at", "after_decision", expect_exit=71)
    assert app.kafka(0) == []  # prepared, not visible yet
    assert app.run("--mode", "recover") == TransactionOutcome.COMMITTED
    app.assert_consistent(5)


def test_crash_after_kafka_commit_recovery_is_a_no_op(app):
    app.run("--batch", "0", "--crash-at", "after_commit", expect_exit=72)
    assert app.run("--mode", "recover") == TransactionOutcome.ALREADY_COMMITTED
    app.assert_consistent(5)


def test_recovery_twice_gives_the_same_result(app):
    app.run("--batch", "0", "--crash-at", "after_decision", expect_exit=71)
    assert app.run("--mode", "recover") == TransactionOutcome.COMMITTED
    assert app.run("--mode", "recover") == TransactionOutcome.NOTHING_TO_COMMIT
    app.assert_consistent(5)
    app.run("--batch", "1")  # and the application carries on
    app.assert_consistent(10)


def test_epoch_reuse_hazard_never_commits_the_next_transaction(app):
    """Transaction N committed, N+1 open under the same producer id and epoch, crash:
    recovery with N's state must not commit N+1."""
    app.run("--batch", "0", "--crash-at", "after_commit", "--open-next", expect_exit=72)
    assert app.run("--mode", "recover") == TransactionOutcome.ALREADY_COMMITTED
    app.assert_consistent(5)
    assert b"b1-uncommitted" not in app.kafka(5)


# ---------------------------------------------------------------- in-process cases
def _two_phase(config: dict, **extra: object) -> dict:
    return {**config, "transaction.two.phase.commit.enable": True, **extra}


def _prepared(config: dict, topic: str) -> tuple[TransactionalProducer, PreparedTxnState]:
    p = TransactionalProducer(_two_phase(config))
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic, b"in-doubt")
    return p, p.prepare_transaction()


def _recover(config: dict, state: PreparedTxnState) -> TransactionOutcome:
    p = TransactionalProducer(_two_phase(config))
    try:
        p.init_transactions(keep_prepared_txn=True)
        return p.complete_transaction(state)
    finally:
        p.close()


def test_a_prepared_transaction_survives_close_and_is_recovered(broker, topic, producer_config):
    p, state = _prepared(producer_config, topic)
    p.close()  # a PREPARED transaction is not aborted by close()
    assert _recover(producer_config, state) is TransactionOutcome.COMMITTED
    assert broker.read_committed(topic, expected=1) == [(None, b"in-doubt")]


def test_state_of_an_aborted_transaction_is_divergence(broker, topic, producer_config):
    p, state = _prepared(producer_config, topic)
    p.abort_transaction()
    p.close()
    with pytest.raises(TransactionDivergedError) as info:
        _recover(producer_config, state)
    err = info.value
    assert err.transactional_id == producer_config["transactional.id"]
    assert err.stored_state == str(state)
    assert err.observed["state"] in ("CompleteAbort", "PrepareAbort")
    assert broker.read_committed(topic, expected=0) == []


def test_state_of_a_fenced_transaction_is_divergence(broker, topic, producer_config):
    p, state = _prepared(producer_config, topic)
    with TransactionalProducer(producer_config) as usurper:
        usurper.init_transactions()  # aborts the prepared transaction, bumps the epoch
    with pytest.raises(TransactionDivergedError, match="newer producer epoch") as info:
        _recover(producer_config, state)
    assert info.value.observed["producer_epoch"] > state.producer_epoch
    assert broker.read_committed(topic, expected=0) == []
    p.close()


@pytest.mark.parametrize("code", [KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.PRODUCER_FENCED])
def test_end_txn_refusal_during_recovery_is_divergence(broker, topic, producer_config, code):
    p, state = _prepared(producer_config, topic)
    with FaultProxy(broker.bootstrap_servers) as proxy:
        proxy.push_errors(ApiKey.END_TXN, code)
        with pytest.raises(TransactionDivergedError) as info:
            _recover({**producer_config, "bootstrap.servers": proxy.bootstrap_servers}, state)
        assert info.value.kafka_error.code() == code
        assert (ApiKey.END_TXN, code) in proxy.injected
    assert broker.read_committed(topic, expected=0) == []  # nothing committed
    p.close()


def test_coordinator_moves_during_recovery_are_retried(broker, topic, producer_config):
    p, state = _prepared(producer_config, topic)
    with FaultProxy(broker.bootstrap_servers) as proxy:
        proxy.push_errors(ApiKey.FIND_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE)
        proxy.push_errors(
            ApiKey.DESCRIBE_TRANSACTIONS,
            KafkaError.NOT_COORDINATOR,
            KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        )
        proxy.push_errors(
            ApiKey.END_TXN, KafkaError.NOT_COORDINATOR, KafkaError.CONCURRENT_TRANSACTIONS
        )
        conf = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
        assert _recover(conf, state) is TransactionOutcome.COMMITTED
        assert len(proxy.injected) == 5
    assert broker.read_committed(topic, expected=1) == [(None, b"in-doubt")]
    p.close()


def test_state_of_another_transactional_id_or_cluster_is_refused(broker, topic, producer_config):
    p, state = _prepared(producer_config, topic)
    other_id = {**producer_config, "transactional.id": producer_config["transactional.id"] + "x"}
    with pytest.raises(InvalidPreparedStateError, match="belongs to transactional id"):
        _recover(other_id, state)
    other_cluster = state.model_copy(update={"cluster_id": "another-cluster"})
    with pytest.raises(InvalidPreparedStateError, match="prepared on Kafka cluster"):
        _recover(producer_config, other_cluster)
    java_form = PreparedTxnState(f"{state.producer_id}:{state.producer_epoch}")
    with pytest.raises(InvalidPreparedStateError, match="no transaction start time"):
        _recover(producer_config, java_form)
    # Refusals committed nothing, and the right state still recovers.
    assert _recover(producer_config, state) is TransactionOutcome.COMMITTED
    assert broker.read_committed(topic, expected=1) == [(None, b"in-doubt")]
    p.close()


def test_recovery_logs_carry_structured_fields(broker, topic, producer_config, caplog):
    p, state = _prepared(producer_config, topic)
    with caplog.at_level("INFO", logger="kafka_txn.recovery"):
        assert _recover(producer_config, state) is TransactionOutcome.COMMITTED
    [record] = [r for r in caplog.records if r.name == "kafka_txn.recovery"]
    assert record.transactional_id == producer_config["transactional.id"]
    assert record.outcome == "committed"
    p.close()
