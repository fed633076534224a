"""Dual writes (``DualWriter``, PostgreSQL and MariaDB) while the three-broker cluster's
brokers fail.

Two schedules per database:

- **the coordinator bounced at each step**: a writer's transactional id has its
  transaction coordinator bounced (clean or hard, drawn from the seed) between prepare and
  the database commit, between the database commit and the Kafka commit, during
  recovery's EndTxn (the writer before stopped between its two commits), and while the
  coordinator aborts a transaction past its ``transaction.timeout.ms``; SIGKILLed right
  after it answered the Kafka commit; and the leader of the partition written to is
  bounced during the flush prepare waits for. A transaction that meets a moved
  coordinator before its decision commits or rolls back whole; one that meets it after
  the database commit still commits in Kafka (librdkafka retries EndTxn with the new
  coordinator; recovery's coordinator client finds it again). ``make test`` deals the
  points between the two databases (``chosen_points``), ``make soak`` runs every point
  on both;
- **writers under broker faults**: writer processes (tests/apps/adversary_app.py, each
  with a transactional id of its own, SIGKILLed and started again on the seed's timers)
  while ``BrokerFaults`` bounces coordinators and leaders and pauses brokers past the
  replica lag, two at a time among them (a partition below ``min.insync.replicas``).

After each: the rows equal the records a read_committed consumer (kafka-python) sees,
each exactly once, no transaction is left open on the topic, every error a writer saw
is one the docs name, and after the cluster healed every writer committed again.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, insert, select

from kafka_txn import TransactionOutcomeUnknownError
from kafka_txn.coordinator.client import CoordinatorClient
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.twophase.recovery import TransactionOutcome
from tests.apps.adversary_app import data_table
from tests.support.adversaries import Interrupted, jdbc_of
from tests.support.cluster_faults import (
    SECONDS,
    SEED,
    BrokerFaults,
    Figures,
    Targets,
    assert_exactly_once,
    compare,
    documented_errors,
    wait_for,
)
from tests.support.kafka_cluster import Bounce, KafkaCluster
from tests.support.rig import Broker

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = [pytest.mark.cluster, pytest.mark.adversary]

RECORDS = 3
WRITERS = 2
PROGRESS_S = 120.0
"""How long a writer may take, once the cluster has healed, to commit again."""


@pytest.fixture(params=["postgresql", "mariadb"])
def jdbc(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return jdbc_of(request.param, request, tmp_path)


@pytest.fixture
def table(jdbc: str) -> Iterator[str]:
    """A data table of its own (one row per record id), dropped at the end."""
    name = f"cluster_{uuid.uuid4().hex[:10]}"
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        data_table(name).create(engine)
        yield name
    finally:
        data_table(name).drop(engine, checkfirst=True)
        engine.dispose()


def rows(jdbc: str, table: str) -> list[str]:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(data_table(table).c.id)).scalars())
    finally:
        engine.dispose()


def started(conf: dict[str, Any], jdbc: str, **kwargs: Any) -> tuple[DualWriter, str]:
    """A writer whose ``start()`` succeeded (called again after
    TransactionOutcomeUnknownError, as its message says); the outcome."""
    for attempt in range(5):
        writer = DualWriter(conf, jdbc, **kwargs)
        try:
            return writer, writer.start().value
        except TransactionOutcomeUnknownError:
            writer.close()
            if attempt == 4:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


class CoordinatorBounce:
    """Bounces the transaction coordinator of ``txn_id`` (or ``node()``, any broker):
    down now, up again in a thread (the writer goes on meanwhile, as it would against a
    real outage)."""

    def __init__(self, cluster: KafkaCluster, txn_id: str) -> None:
        self.cluster, self.txn_id = cluster, txn_id
        self.threads: list[threading.Thread] = []
        self.done: list[str] = []

    def __call__(self, how: Bounce, where: str) -> None:
        self.node(self.cluster.transaction_coordinator(self.txn_id), how, where)

    def node(self, node: int, how: Bounce, where: str) -> None:
        self.cluster.take_down(node, how)
        self.done.append(f"{where}: {how} bounce of broker {node}")
        thread = threading.Thread(target=self.cluster.bring_up, args=(node,), daemon=True)
        thread.start()
        self.threads.append(thread)

    def healed(self) -> None:
        for thread in self.threads:
            thread.join(timeout=180)
        self.cluster.wait_healed()


@pytest.mark.timeout(900)
@pytest.mark.guarantee("7.3")
def test_the_coordinator_bounced_at_each_step_of_a_dual_write(
    cluster: KafkaCluster,
    cluster_broker: Broker,
    jdbc: str,
    table: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first schedule of the module docstring: each transaction commits on both sides
    or on neither, the ones bounced after the database commit commit in Kafka too, and
    the rows equal the records."""
    rng = random.Random(SEED)
    hows: list[Bounce] = [rng.choice(["clean", "hard"]) for _ in range(5)]
    topic = cluster_broker.create_topic(partitions=3)
    txn_id = f"cluster-dw-{uuid.uuid4().hex[:10]}"
    conf = {"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": txn_id}
    bounce = CoordinatorBounce(cluster, txn_id)
    errors: Counter[str] = Counter()
    told_committed: set[str] = set()
    data = data_table(table)
    where = f"KAFKA_TXN_CLUSTER_SEED={SEED}"

    def write(writer: DualWriter, batch: str, pause: float = 0.0, partition: int = -1) -> bool:
        ids = [f"{batch}-{i}" for i in range(RECORDS)]
        try:
            with writer.transaction() as tx:
                tx.connection.execute(insert(data), [{"id": i} for i in ids])
                for record_id in ids:
                    tx.produce(
                        topic, record_id.encode(), key=record_id.encode(), partition=partition
                    )
                if pause:
                    time.sleep(pause)
                    bounce(hows[3], "the coordinator aborting a timed-out transaction")
        except Exception as exc:
            errors[type(exc).__name__] += 1
            return False
        told_committed.update(ids)
        return True

    def hook_at(step: str, how: Bounce) -> Any:
        armed = [True]

        def on_step(name: str) -> None:
            if name == step and armed:
                armed.clear()
                bounce(how, step)

        return on_step

    def at_step(step: str, how: Bounce) -> None:
        """The coordinator bounced at ``step`` of a transaction, which goes on against
        the moved coordinator and commits; so does the next one."""
        writer, _ = started(conf, jdbc, on_step=hook_at(step, how))
        try:
            assert write(writer, step), f"{step}: {errors} ({where})"
            assert write(writer, f"{step}-next"), f"{step}: {errors} ({where})"
        finally:
            writer.close()

    def leader_during_flush() -> None:
        """The leader of the partition written to bounced during the flush prepare waits
        for: the records wait in librdkafka's queue (linger.ms) as the leader goes down,
        and prepare's flush delivers them to the next leader."""
        leader_down = [True]

        def leader_at_flush(name: str) -> None:
            if name == "after_send" and leader_down:
                leader_down.clear()
                bounce.node(cluster.leader(topic, 0), hows[4], "the leader during the flush")

        writer, _ = started({**conf, "linger.ms": 2000}, jdbc, on_step=leader_at_flush)
        try:
            assert write(writer, "flush", partition=0), f"flush: {errors} ({where})"
        finally:
            writer.close()

    def recovery_end_txn() -> None:
        """A writer stopped between its two commits (the database committed, Kafka holds
        the transaction prepared); the next start() commits it, with the coordinator
        bounced as its EndTxn is sent."""
        stopped = [True]

        def stop_after_db_commit(name: str) -> None:
            if name == "after_db_commit" and stopped:
                stopped.clear()
                raise Interrupted("stopped between the two commits")

        writer, _ = started(conf, jdbc, on_step=stop_after_db_commit)
        write_ids = [f"recovery-{i}" for i in range(RECORDS)]
        with pytest.raises(Interrupted), writer.transaction() as tx:
            tx.connection.execute(insert(data), [{"id": i} for i in write_ids])
            for record_id in write_ids:
                tx.produce(topic, record_id.encode(), key=record_id.encode())
        writer.close()
        end_txn = CoordinatorClient.end_txn
        bounced = [False]

        def end_txn_bounced(self: CoordinatorClient, *args: Any, **kwargs: Any) -> None:
            if not bounced[0]:
                bounced[0] = True
                bounce(hows[2], "recovery's EndTxn")
            end_txn(self, *args, **kwargs)

        monkeypatch.setattr(CoordinatorClient, "end_txn", end_txn_bounced)
        writer, outcome = started(conf, jdbc)
        monkeypatch.undo()
        try:
            assert bounced[0] and outcome == TransactionOutcome.COMMITTED.value, (outcome, where)
            told_committed.update(write_ids)
            assert write(writer, "after-recovery"), f"after recovery: {errors} ({where})"
        finally:
            writer.close()

    def timed_out_abort() -> None:
        """The coordinator bounced as it aborts a transaction past its timeout: the
        writer's prepare finds it aborted, the database rolls back, the next writer goes
        on."""
        timeout_ms = 3000
        writer, _ = started({**conf, "transaction.timeout.ms": timeout_ms}, jdbc)
        try:
            assert not write(writer, "timed-out", pause=timeout_ms / 1000 + 1.5), where
        finally:
            writer.close()
        writer, _ = started(conf, jdbc)
        try:
            assert write(writer, "after-timeout"), f"after the timed-out one: {errors} ({where})"
        finally:
            writer.close()

    points: list[tuple[str, Callable[[], None]]] = [
        ("between prepare and the database commit", lambda: at_step("after_prepare", hows[0])),
        ("between the two commits", lambda: at_step("after_db_commit", hows[1])),
        # SIGKILLed right after it answered the Kafka commit: the partitions' next leaders
        # take the markers (a one-node Kafka can lose them: docs/guide/operations.md).
        ("right after the Kafka commit", lambda: at_step("after_kafka_commit", "hard")),
        ("the leader during prepare's flush", leader_during_flush),
        ("during recovery's EndTxn", recovery_end_txn),
        ("as it aborts a timed-out transaction", timed_out_abort),
    ]
    for _, point in chosen_points(points, jdbc):
        bounce.healed()
        point()
    bounce.healed()

    comparison = compare(cluster_broker, topic, rows(jdbc, table))
    Figures(
        "DualWriter, the coordinator bounced at each step",
        _fixed_faults(cluster, bounce),
        len({r.rsplit("-", 1)[0] for r in comparison.rows}),
        comparison,
        errors,
    ).record()
    assert_exactly_once(comparison, f"{'; '.join(bounce.done)} ({where})")
    assert told_committed <= set(comparison.rows), where
    assert not any(r.startswith("timed-out") for r in comparison.rows), where
    assert set(errors) <= documented_errors("dual-write"), (errors, where)


def chosen_points(
    points: list[tuple[str, Callable[[], None]]], jdbc: str
) -> list[tuple[str, Callable[[], None]]]:
    """The points this database's run bounces at: every one with
    ``KAFKA_TXN_CLUSTER_EVERY_STEP`` set (``make soak``); otherwise half, the seed
    dealing them between PostgreSQL and MariaDB, so that ``make test`` covers every
    point once in about half the time."""
    if os.environ.get("KAFKA_TXN_CLUSTER_EVERY_STEP"):
        return points
    order = list(range(len(points)))
    random.Random(SEED).shuffle(order)
    mine = order[0 if jdbc.startswith("jdbc:postgresql") else 1 :: 2]
    return [points[i] for i in sorted(mine)]


def _fixed_faults(cluster: KafkaCluster, bounce: CoordinatorBounce) -> BrokerFaults:
    """A BrokerFaults that did nothing but carries the point bounces' tally, for Figures."""
    faults = BrokerFaults(cluster, Targets(list, []))
    for done in bounce.done:
        faults.tally[f"bounces {'clean' if ': clean' in done else 'hard'}"] += 1
        faults.done.append(done)
    return faults


# ------------------------------------------------------------- writers under broker faults


class Writers:
    """Writer processes of tests/apps/adversary_app.py, one transactional id per slot;
    ``kill()`` SIGKILLs one and starts it again."""

    def __init__(self, broker: Broker, jdbc: str, table: str, topic: str, folder: Path) -> None:
        self.broker, self.jdbc, self.table, self.topic = broker, jdbc, table, topic
        self.folder = folder
        self.ids = [f"cluster-w{slot}-{uuid.uuid4().hex[:8]}" for slot in range(WRITERS)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * WRITERS
        self.launches = [0] * WRITERS
        self.kills = 0

    def launch(self, slot: int) -> None:
        self.launches[slot] += 1
        tag = f"w{slot}.{self.launches[slot]}"
        with (self.folder / f"{tag}.err").open("wb") as err:
            self.procs[slot] = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "apps" / "adversary_app.py"),
                 "--jdbc-url", self.jdbc, "--bootstrap-servers", self.broker.bootstrap_servers,
                 "--topic", self.topic, "--transactional-id", self.ids[slot],
                 "--table", self.table, "--tag", tag, "--log", str(self.folder / f"w{slot}.log"),
                 "--seed", str(SEED + slot), "--records", str(RECORDS)],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip

    def kill(self, slot: int) -> None:
        proc = self.procs[slot]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            self.kills += 1
        self.launch(slot)

    def kill_all(self) -> None:
        for slot, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                self.procs[slot] = None

    def exited(self) -> list[str]:
        """What writers that ended by themselves said (never expected)."""
        out = []
        for slot, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is not None:
                err = self.folder / f"w{slot}.{self.launches[slot]}.err"
                out.append(f"w{slot} exited {proc.returncode}: {err.read_text()[-3000:]}")
        return out

    def events(self, slot: int) -> list[list[str]]:
        path = self.folder / f"w{slot}.log"
        if not path.exists():
            return []
        return [line.split(" ") for line in path.read_text(errors="replace").splitlines()]

    def commits(self, slot: int) -> int:
        return sum(1 for words in self.events(slot) if words[0] == "committed")


@pytest.mark.timeout(600 + 3 * SECONDS)
@pytest.mark.guarantee("7.3")
def test_writers_under_broker_faults(
    cluster: KafkaCluster, cluster_broker: Broker, jdbc: str, table: str, tmp_path: Path
) -> None:
    """The second schedule of the module docstring: writers killed and restarted while
    brokers are bounced and paused; then rows == records, each once, every writer
    commits again after the cluster healed, and each error it saw is documented."""
    where = f"KAFKA_TXN_CLUSTER_SEED={SEED}"
    topic = cluster_broker.create_topic(partitions=3)
    writers = Writers(cluster_broker, jdbc, table, topic, tmp_path)
    faults = BrokerFaults(
        cluster, Targets(lambda: writers.ids, [(topic, p) for p in range(3)]), SEED
    )
    kills = random.Random(SEED + 1)
    try:
        for slot in range(WRITERS):
            writers.launch(slot)
        wait_for(lambda: all(writers.commits(s) for s in range(WRITERS)), 120, "first commits")
        with faults.running(SECONDS):
            deadline = time.monotonic() + SECONDS
            while time.monotonic() < deadline and not writers.exited():
                time.sleep(kills.uniform(2.0, 6.0))
                writers.kill(kills.randrange(WRITERS))
        assert not writers.exited(), f"{writers.exited()} ({where}; {faults.summary()})"
        # The cluster has healed: every writer commits again.
        before = [writers.commits(s) for s in range(WRITERS)]
        wait_for(
            lambda: all(writers.commits(s) > before[s] for s in range(WRITERS)),
            PROGRESS_S,
            f"a commit by every writer after the cluster healed ({where})",
        )
    finally:
        writers.kill_all()
    assert not writers.exited(), where
    for txn_id in writers.ids:  # one last writer each settles what the killed ones left
        writer, _ = started(
            {"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": txn_id}, jdbc
        )
        writer.close()

    events = [words for slot in range(WRITERS) for words in writers.events(slot)]
    errors = Counter(words[1] for words in events if words[0] == "error")
    told = {i for words in events if words[0] == "committed" for i in words[2:]}
    comparison = compare(cluster_broker, topic, rows(jdbc, table))
    Figures(
        "DualWriter, writers killed under broker faults",
        faults,
        len({r.rsplit("-", 1)[0] for r in comparison.rows}),
        comparison,
        errors,
        writers.kills,
    ).record()
    context = f"{where}; {faults.summary()}"
    assert_exactly_once(comparison, context)
    assert told <= set(comparison.rows), context
    assert faults.faults >= 1, context
    assert set(errors) <= documented_errors("dual-write"), (errors, context)
