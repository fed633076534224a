"""Crash recovery (KIP-939 emulated): processes killed hard at each step of the recipe,
a fresh process recovers, and the records a read_committed consumer sees equal the rows
the database committed, each exactly once."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from kafka_txn import (
    FatalError,
    InvalidPreparedStateError,
    PreparedTxnState,
    TransactionalProducer,
    TransactionDivergedError,
    TransactionOutcome,
    TransactionOutcomeUnknowableError,
    TransactionOutcomeUnknownError,
)
from kafka_txn.cli.local_broker import LocalBroker
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.coordinator.client import TRANSACTIONAL_ID_NOT_FOUND
from kafka_txn.testing import ApiKey, FaultProxy
from tests.support.rig import Broker, freeze

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.broker


class App:
    """Runs tests/apps/crash_app.py in subprocesses against one topic, id and database."""

    def __init__(self, broker, tmp_path: Path, txn_id: str) -> None:
        self.broker = broker
        self.topic = broker.create_topic(partitions=2)
        self.txn_id = txn_id
        self.db = tmp_path / "app.sqlite"

    def run(self, *args: str, expect_exit: int = 0) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "apps" / "crash_app.py"),
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


def _describe(broker, txn_id: str):
    settings = ConnectionSettings.from_librdkafka({"bootstrap.servers": broker.bootstrap_servers})
    with CoordinatorClient(settings, txn_id) as client:
        return client.describe()


@pytest.mark.adversary
@pytest.mark.guarantee("3.1")
def test_crash_after_prepare_before_decision_aborts(app):
    """Killed after prepare, before the database decided: the next process aborts the
    prepared transaction rather than leaving it open. Before recovery the coordinator
    shows it Ongoing and it holds back the last stable offset of the partitions it wrote;
    after, it has ended (no partition's last stable offset is below its high watermark,
    the epoch moved on), and its records, which are in the log, are not visible."""
    app.run("--batch", "0")
    app.run("--batch", "1", "--crash-at", "after_prepare", expect_exit=70)
    prepared = _describe(app.broker, app.txn_id)
    assert prepared.state == "Ongoing", prepared
    assert app.broker.open_partitions(app.topic), "the prepared transaction holds no partition"
    assert app.run("--mode", "recover") == TransactionOutcome.NOTHING_TO_COMMIT
    after = _describe(app.broker, app.txn_id)
    assert after.state != "Ongoing", after
    # The init after recovery fenced the crashed producer: a new epoch (or producer id).
    moved_on = after.producer_epoch > prepared.producer_epoch
    assert moved_on or after.producer_id != prepared.producer_id, (prepared, after)
    assert app.broker.open_partitions(app.topic) == {}  # ended: committed or aborted ...
    written = {v for _, v in app.broker.read_uncommitted(app.topic, expected=10)}
    assert {b"b1-r%d" % i for i in range(5)} <= written  # ... its records are in the log ...
    app.assert_consistent(5)  # ... and not visible: aborted


@pytest.mark.adversary
@pytest.mark.guarantee("3.1")
def test_crash_after_decision_before_kafka_commit_commits(app):
    app.run("--batch", "0", "--crash-at", "after_decision", expect_exit=71)
    assert app.kafka(0) == []  # prepared, not visible yet
    assert app.run("--mode", "recover") == TransactionOutcome.COMMITTED
    app.assert_consistent(5)


@pytest.mark.adversary
@pytest.mark.guarantee("3.1")
def test_crash_after_kafka_commit_recovery_is_a_no_op(app):
    app.run("--batch", "0", "--crash-at", "after_commit", expect_exit=72)
    assert app.run("--mode", "recover") == TransactionOutcome.ALREADY_COMMITTED
    app.assert_consistent(5)


@pytest.mark.adversary
@pytest.mark.guarantee("3.1")
def test_recovery_twice_gives_the_same_result(app):
    app.run("--batch", "0", "--crash-at", "after_decision", expect_exit=71)
    assert app.run("--mode", "recover") == TransactionOutcome.COMMITTED
    assert app.run("--mode", "recover") == TransactionOutcome.NOTHING_TO_COMMIT
    app.assert_consistent(5)
    app.run("--batch", "1")  # and the application carries on
    app.assert_consistent(10)


@pytest.mark.adversary
@pytest.mark.guarantee("3.2")
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


@pytest.mark.adversary
@pytest.mark.guarantee("2.3")
def test_a_prepared_transaction_survives_close_and_is_recovered(
    broker, topic, producer_config, caplog
):
    p, state = _prepared(producer_config, topic)
    p.close()  # a PREPARED transaction is not aborted by close()
    with caplog.at_level(logging.INFO, logger="kafka_txn.recovery"):
        assert _recover(producer_config, state) is TransactionOutcome.COMMITTED
    tid = producer_config["transactional.id"]
    logged = [(r.getMessage(), r.transactional_id, r.outcome) for r in caplog.records
              if r.name == "kafka_txn.recovery"]  # fmt: skip
    assert logged == [(f"recovery of {tid!r} committed {state}", tid, "committed")]
    assert broker.read_committed(topic, expected=1) == [(None, b"in-doubt")]


@pytest.mark.adversary
@pytest.mark.guarantee("3.3")
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


@pytest.mark.adversary
@pytest.mark.guarantee("3.4")
def test_state_after_another_producer_initialised_the_id_is_unknowable(
    broker, topic, producer_config
):
    """Another producer's init_transactions() aborts the open transaction and bumps the
    epoch; the coordinator then shows Empty with no start time (noida-db: epoch e+1;
    Apache Kafka: e+2, fence then init, TransactionMetadata.prepareIncrementProducerEpoch).
    A transaction committed before such an init looks exactly the same, so recovery
    cannot tell, and says so rather than advise re-sending (which would duplicate a
    committed one)."""
    p, state = _prepared(producer_config, topic)
    with TransactionalProducer(producer_config) as usurper:
        usurper.init_transactions()  # aborts the prepared transaction, bumps the epoch
    with pytest.raises(TransactionOutcomeUnknowableError, match="epoch") as info:
        _recover(producer_config, state)
    assert info.value.observed["producer_epoch"] > state.producer_epoch
    assert "read_committed" in str(info.value)
    assert broker.read_committed(topic, expected=0) == []
    p.close()


REFUSALS = [
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_TXN_STATE,
    KafkaError.INVALID_PRODUCER_ID_MAPPING,
]


@pytest.mark.adversary
@pytest.mark.parametrize("code", REFUSALS)
@pytest.mark.guarantee("3.4")
def test_end_txn_refusal_of_a_transaction_still_open_is_unknowable_and_never_loops(
    broker, topic, producer_config, code
):
    """EndTxn(commit) refused, yet the coordinator still shows the stored transaction open
    under the stored identity: recovery describes again, and since that again says
    "commit", it stops with TransactionOutcomeUnknowableError after one EndTxn, having
    committed and aborted nothing; a later recovery commits it."""
    p, state = _prepared(producer_config, topic)
    sent: list[int] = []
    with FaultProxy(broker.bootstrap_servers) as proxy:
        proxy.push_errors(ApiKey.END_TXN, code)
        for _ in range(3):
            proxy.before(ApiKey.END_TXN, lambda: sent.append(1))
        conf = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
        with pytest.raises(TransactionOutcomeUnknowableError, match="still shows") as info:
            _recover(conf, state)
        assert info.value.kafka_error.code() == code
        assert info.value.observed["state"] == "Ongoing"
        assert "Recovery committed nothing." in str(info.value)
        assert (info.value.transactional_id, info.value.stored_state) == (
            producer_config["transactional.id"], str(state))  # fmt: skip
        assert sent == [1]  # one EndTxn, no loop
    assert broker.read_committed(topic, expected=0) == []  # nothing committed yet ...
    assert _recover(producer_config, state) is TransactionOutcome.COMMITTED  # ... nor aborted
    assert broker.read_committed(topic, expected=1) == [(None, b"in-doubt")]
    p.close()


def _abort_behind_its_back(producer_config: dict, state: PreparedTxnState) -> None:
    """Abort the stored transaction in the real broker with EndTxn(abort): the part of a
    coordinator timeout noida-db does not do by itself."""
    settings = ConnectionSettings.from_librdkafka(producer_config)
    with CoordinatorClient(settings, producer_config["transactional.id"]) as client:
        assert state.producer_id is not None and state.producer_epoch is not None
        client.end_txn(state.producer_id, state.producer_epoch, commit=False)


def _apache_epoch_bump(entry: dict) -> dict:
    """What Apache Kafka shows after its timeout abort: the epoch one higher, the aborted
    transaction's start time kept (TransactionCoordinator.abortTimedOutTransactions ->
    TransactionMetadata.prepareFenceProducerEpoch, then endTransaction(ABORT)).
    noida-db never times transactions out, so the proxy adds the bump. Apache Kafka shows
    PrepareAbort until the abort's markers are written, then CompleteAbort, both under
    the bumped epoch (tests/broker/test_behaviours.py)."""
    assert entry["transaction_state"] in ("PrepareAbort", "CompleteAbort"), entry
    return {**entry, "producer_epoch": entry["producer_epoch"] + 1}


@pytest.mark.adversary
@pytest.mark.guarantee("3.3")
def test_prepared_transaction_timed_out_is_divergence(broker, topic, producer_config):
    """Kafka timed the prepared transaction out (Apache: epoch e+1, CompleteAbort, same
    start): nothing of it is visible, so re-sending it from the database is safe."""
    p, state = _prepared(producer_config, topic)
    _abort_behind_its_back(producer_config, state)
    with FaultProxy(broker.bootstrap_servers) as proxy:
        proxy.rewrite_describe(_apache_epoch_bump)
        conf = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
        with pytest.raises(TransactionDivergedError, match=r"transaction\.timeout\.ms") as info:
            _recover(conf, state)
    assert info.value.observed["producer_epoch"] == state.producer_epoch + 1
    assert info.value.observed["transaction_start_time_ms"] == state.txn_start_ms
    assert "re-send them from the database" in str(info.value)
    assert broker.read_committed(topic, expected=0) == []
    p.close()


@pytest.mark.adversary
@pytest.mark.guarantee("3.3")
def test_next_transaction_timed_out_means_the_stored_one_was_committed(
    broker, topic, producer_config
):
    """Scenario 4: the stored transaction committed, the process died before
    storing it completed, and Kafka then timed out the NEXT transaction (Apache: epoch
    e+1, CompleteAbort, a later start). That later transaction needs the stored one to
    have ended, and a prepared transaction is never aborted by this library, so recovery
    reports it committed, as a read_committed consumer confirms."""
    p = TransactionalProducer(_two_phase(producer_config))
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic, b"stored")
    state = p.prepare_transaction()
    p.complete_transaction(state)  # committed; "crash" before storing it completed
    p.begin_transaction()
    p.produce(topic, b"next")
    p.flush()
    p.abort_transaction()  # the next transaction aborted: Kafka's timeout, minus the bump
    p.close()
    with FaultProxy(broker.bootstrap_servers) as proxy:
        proxy.rewrite_describe(_apache_epoch_bump)
        conf = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
        assert _recover(conf, state) is TransactionOutcome.ALREADY_COMMITTED
    assert broker.read_committed(topic, expected=1) == [(None, b"stored")]


@pytest.mark.adversary
@pytest.mark.guarantee("3.4")
def test_expired_transactional_id_is_unknowable(broker, topic, producer_config):
    """Scenario 4: a committed transaction whose state was never stored
    completed, and an id idle past transactional.id.expiration.ms, which Apache Kafka
    then answers with TRANSACTIONAL_ID_NOT_FOUND (TransactionCoordinator
    .handleDescribeTransactions; noida-db never expires ids, so the proxy answers it).
    Whether it committed cannot be learnt from Kafka: the error says so, and its advice
    is to check the topic, not to re-send (here that would duplicate the records)."""
    p = TransactionalProducer(_two_phase(producer_config))
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic, b"stored")
    state = p.prepare_transaction()
    p.complete_transaction(state)
    p.close()
    with FaultProxy(broker.bootstrap_servers) as proxy:
        proxy.push_errors(ApiKey.DESCRIBE_TRANSACTIONS, TRANSACTIONAL_ID_NOT_FOUND)
        conf = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
        with pytest.raises(TransactionOutcomeUnknowableError) as info:
            _recover(conf, state)
    message = str(info.value)
    assert "transactional.id.expiration.ms" in message and "read_committed" in message
    assert "re-send them from the database" not in message
    assert info.value.observed["found"] is False
    assert info.value.stored_state == str(state)
    assert broker.read_committed(topic, expected=1) == [(None, b"stored")]
    # Once the operator has checked and stored the state completed, recovery goes on.
    assert _recover(producer_config, state.mark_completed()) is (
        TransactionOutcome.NOTHING_TO_COMMIT
    )


@pytest.mark.guarantee("3.4")
def test_transactional_id_unknown_to_the_broker_is_unknowable(broker, producer_config):
    """The local broker's own answer for an id it does not know (Empty, producer id -1)
    is recognised as "not found" too."""
    state = PreparedTxnState(
        transactional_id=producer_config["transactional.id"], producer_id=1, producer_epoch=0,
        txn_start_ms=1_700_000_000_000,
    )  # fmt: skip
    with pytest.raises(TransactionOutcomeUnknowableError, match="forgotten") as info:
        _recover(producer_config, state)
    assert info.value.observed["found"] is False


@pytest.mark.adversary
@pytest.mark.guarantee("3.3")
def test_end_txn_refused_after_the_transaction_timed_out_is_divergence(
    broker, topic, producer_config
):
    """Kafka times the transaction out between recovery's DescribeTransactions and its
    EndTxn (Apache answers that EndTxn PRODUCER_FENCED, the epoch being one higher):
    recovery describes again and reports the divergence with the refusal's code."""
    p, state = _prepared(producer_config, topic)
    with FaultProxy(broker.bootstrap_servers) as proxy:

        def time_out() -> None:
            _abort_behind_its_back(producer_config, state)
            proxy.rewrite_describe(_apache_epoch_bump)

        proxy.before(ApiKey.END_TXN, time_out)
        proxy.push_errors(ApiKey.END_TXN, KafkaError.PRODUCER_FENCED)
        conf = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
        with pytest.raises(TransactionDivergedError, match="PRODUCER_FENCED") as info:
            _recover(conf, state)
        assert proxy.hook_errors == []
    assert info.value.kafka_error.code() == KafkaError.PRODUCER_FENCED
    # Apache Kafka shows PrepareAbort until the abort's markers are written
    assert info.value.observed["state"] in ("PrepareAbort", "CompleteAbort")
    assert broker.read_committed(topic, expected=0) == []
    p.close()


@pytest.mark.adversary
@pytest.mark.guarantee("3.5")
def test_zombie_running_during_recovery_is_reported_not_hidden(broker, topic, producer_config):
    """Scenario 8. DescribeTransactions -> EndTxn is check-then-act: the original
    producer, still alive, commits the stored transaction and begins its next one in
    between, and recovery's EndTxn (same producer id and epoch) commits that next one,
    which its database never decided. Recovery cannot prevent this (the caller must stop
    every other instance of the id first; DualWriter's lock does), but it must not report
    a clean commit: it describes after EndTxn and raises TransactionOutcomeUnknowableError
    naming the zombie."""
    zombie, state = _prepared(producer_config, topic)
    with FaultProxy(broker.bootstrap_servers) as proxy:

        def zombie_goes_on() -> None:
            zombie.complete_transaction(state)  # commits the stored transaction
            zombie.begin_transaction()
            zombie.produce(topic, b"zombie-next")
            zombie.flush()

        proxy.before(ApiKey.END_TXN, zombie_goes_on)
        conf = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
        with pytest.raises(TransactionOutcomeUnknowableError, match="zombie") as info:
            _recover(conf, state)
        assert proxy.hook_errors == []
    assert info.value.observed["state"] in ("PrepareCommit", "CompleteCommit")
    assert info.value.observed["transaction_start_time_ms"] > state.txn_start_ms
    assert "stop or fence every other instance" in str(info.value).lower()
    # EndTxn(commit) was sent: the error must not say that recovery committed nothing.
    assert "committed nothing" not in str(info.value)
    assert (info.value.transactional_id, info.value.stored_state) == (
        producer_config["transactional.id"], str(state))  # fmt: skip
    # What the error reports did happen: the zombie's undecided record was committed.
    got = sorted(v for _, v in broker.read_committed(topic, expected=2))
    assert got == [b"in-doubt", b"zombie-next"]
    zombie.close()


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "not authorized"),
        (KafkaError.UNKNOWN, "UNKNOWN"),  # UNKNOWN_SERVER_ERROR
    ],
)
def test_other_end_txn_errors_are_translated_in_one_place(
    broker, topic, producer_config, code, says
):
    """EndTxn errors that say nothing of the transaction go through the one translation
    of coordinator failures (twophase.coordinator_failure): a FatalError, as the same code
    is through librdkafka; nothing is committed or aborted, and recovery can run again."""
    p, state = _prepared(producer_config, topic)
    with FaultProxy(broker.bootstrap_servers) as proxy:
        proxy.push_errors(ApiKey.END_TXN, code)
        conf = {**producer_config, "bootstrap.servers": proxy.bootstrap_servers}
        with pytest.raises(FatalError, match=says) as info:
            _recover(conf, state)
    assert info.value.kafka_error.code() == code
    assert broker.read_committed(topic, expected=0) == []
    assert _recover(producer_config, state) is TransactionOutcome.COMMITTED
    p.close()


@pytest.mark.adversary
@pytest.mark.guarantee("3.7")
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


class _InitReplyLate:
    """confluent-kafka's Producer whose init_transactions() reaches the broker (which
    bumps the epoch) but whose reply comes too late: while ``late`` is set every call
    raises _TIMED_OUT, as librdkafka's does when its timeout runs out first; once
    cleared, the reply has arrived and the call succeeds. (The proxy cannot hold
    librdkafka's own InitProducerId: librdkafka reaches the coordinator directly.)"""

    def __init__(self, producer) -> None:
        self._producer = producer
        self._reached_broker = False
        self.late = True

    def init_transactions(self, timeout: float) -> None:
        if not self._reached_broker:
            self._producer.init_transactions(30)
            self._reached_broker = True
        if self.late:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Local: Timed out"))

    def __getattr__(self, name: str):
        return getattr(self._producer, name)

    def __len__(self) -> int:
        return len(self._producer)


@pytest.mark.adversary
@pytest.mark.guarantee("3.8")
def test_recovery_that_committed_and_then_could_not_initialise_resumes_with_the_init(
    broker, topic, producer_config
):
    """Recovery's EndTxn commits the stored transaction, then init_transactions() does
    not finish in time although the broker bumped the epoch. complete_transaction() says
    what it did and to call it again; called again with the same state it only
    initialises and returns the same outcome, instead of recovering again from a
    coordinator whose epoch moved on (which would claim the outcome unknowable and that
    recovery committed nothing)."""
    p, state = _prepared(producer_config, topic)
    p.close()
    settled = []
    second = TransactionalProducer(_two_phase(producer_config))
    try:
        second.init_transactions(keep_prepared_txn=True)
        late = second._io.producer = _InitReplyLate(second._io.producer)
        with pytest.raises(TransactionOutcomeUnknownError) as info:
            second.complete_transaction(state, before_init=settled.append, timeout=1.0)
        message = str(info.value)
        assert "recovery settled the stored transaction (outcome: committed)" in message
        assert "call complete_transaction() again with the same state" in message
        assert second.state == "recovering"
        assert broker.read_committed(topic, expected=1) == [(None, b"in-doubt")]
        late.late = False
        again = second.complete_transaction(state, before_init=settled.append)
        assert again is TransactionOutcome.COMMITTED
        assert settled == [TransactionOutcome.COMMITTED]  # the hook ran once
        assert second.state == "ready"
    finally:
        second.close()
    assert broker.read_committed(topic, expected=1) == [(None, b"in-doubt")]


@pytest.mark.adversary
@pytest.mark.guarantee("3.6")
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


@pytest.mark.adversary
@pytest.mark.guarantee("3.9")
def test_recovery_while_the_coordinator_stays_unreachable_is_unknown_and_decides_nothing(
    txn_id,
):
    """A prepared transaction waits for recovery, and the broker (a private one, frozen
    with SIGSTOP) does not answer: complete_transaction() raises
    TransactionOutcomeUnknownError and the producer stays recovering. Nothing was
    decided meanwhile: once the broker answers, the coordinator still shows the stored
    transaction open under its producer id, epoch and start time, and the same call
    again commits it, exactly once."""
    with LocalBroker() as local:
        rig = Broker(local.bootstrap_servers, local.description)
        topic = rig.create_topic()
        conf = {"bootstrap.servers": local.bootstrap_servers, "transactional.id": txn_id}
        p, state = _prepared(conf, topic)
        p.close()  # left prepared for recovery
        fresh = TransactionalProducer(_two_phase(conf), operation_timeout=1.0)
        try:
            freeze(local._proc.pid)
            try:
                fresh.init_transactions(keep_prepared_txn=True)
                with pytest.raises(TransactionOutcomeUnknownError, match="call it again"):
                    fresh.complete_transaction(state)
                assert fresh.state == "recovering"
            finally:
                os.kill(local._proc.pid, signal.SIGCONT)
            seen = _describe(rig, txn_id)
            assert seen.state == "Ongoing", seen
            assert (seen.producer_id, seen.producer_epoch, seen.start_time_ms) == (
                state.producer_id, state.producer_epoch, state.txn_start_ms,
            )  # fmt: skip
            assert fresh.complete_transaction(state) is TransactionOutcome.COMMITTED
        finally:
            fresh.close()
        assert rig.read_committed(topic, expected=1) == [(None, b"in-doubt")]
        assert rig.open_partitions(topic) == {}
