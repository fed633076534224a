"""Plain two-phase commit (``prepare_transaction()`` / ``complete_transaction()``), with
crashes and recovery in fresh processes, while the three-broker cluster's brokers fail.

The application is tests/apps/crash_app.py: each run recovers what the run before left
(``init_transactions(keep_prepared_txn=True)``, ``complete_transaction(stored)``), then
writes one batch: prepare, the decision (rows and prepared state in one SQLite commit),
the Kafka commit; it may exit hard (``os._exit``) after any of those steps, and may stop
at a step until the test has bounced the transaction coordinator.

Two schedules:

- **the coordinator bounced at each step** (clean or hard, drawn from the seed): between
  prepare and the decision, between the decision and the Kafka commit, during recovery's
  EndTxn in a fresh process (the run before exited after its decision), and while the
  coordinator aborts a prepared transaction past its ``transaction.timeout.ms`` (the run
  before exited before its decision, or after it: then recovery names the divergence,
  as the coordinator that took over shows the transaction aborted);
- **runs crashing under broker faults**: each run exits after a step drawn from the seed
  (or finishes) while ``BrokerFaults`` bounces coordinators and leaders and pauses
  brokers; the next run, a fresh process, recovers.

After each: the rows equal the records a read_committed consumer (kafka-python) sees,
each exactly once, no transaction is left open, every error a run raised is one the docs
name, and once the cluster healed the runs commit again.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.support.cluster_faults import (
    SECONDS,
    SEED,
    BrokerFaults,
    Figures,
    Targets,
    assert_exactly_once,
    compare,
    documented_errors,
)
from tests.support.kafka_cluster import Bounce, KafkaCluster
from tests.support.rig import Broker

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = [pytest.mark.cluster, pytest.mark.adversary]

CRASHED = {70: "after_prepare", 71: "after_decision", 72: "after_commit"}
RUN_LIMIT_S = 240.0


class App:
    """crash_app.py on one transactional id, topic and SQLite file."""

    def __init__(self, cluster: KafkaCluster, broker: Broker, folder: Path) -> None:
        self.cluster = cluster
        self.topic = broker.create_topic(partitions=3)
        self.txn_id = f"cluster-2pc-{uuid.uuid4().hex[:10]}"
        folder.mkdir(parents=True, exist_ok=True)
        self.db = folder / "app.sqlite"
        self.hold_file = folder / "held"
        self.batch = 0
        self.errors: Counter[str] = Counter()
        self.crashes = 0
        self.bounces: list[str] = []
        self._threads: list[threading.Thread] = []

    def run(
        self,
        *,
        mode: str = "run",
        crash_at: str = "none",
        hold: str = "none",
        bounce: Bounce = "hard",
        timeout_ms: int | None = None,
    ) -> tuple[int, str]:
        """One run (a fresh process); its exit code and first output line. At ``hold``,
        the transaction coordinator is bounced: down now, up again in a thread."""
        self.batch += 1
        self.hold_file.unlink(missing_ok=True)
        args = [
            sys.executable, str(ROOT / "tests" / "apps" / "crash_app.py"),
            "--bootstrap-servers", self.cluster.bootstrap_servers, "--topic", self.topic,
            "--transactional-id", self.txn_id, "--db", str(self.db), "--mode", mode,
            "--crash-at", crash_at, "--batch", str(self.batch), "--records", "3",
            "--hold", hold, "--hold-file", str(self.hold_file),
            *(["--transaction-timeout-ms", str(timeout_ms)] if timeout_ms else []),
        ]  # fmt: skip
        proc = subprocess.Popen(
            args, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + RUN_LIMIT_S
        while proc.poll() is None:
            if self.hold_file.exists():
                self.bounce(bounce, hold)
                self.hold_file.unlink()
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"crash_app.py ran past {RUN_LIMIT_S:g}s (a hang)")
            time.sleep(0.05)
        out, err = proc.communicate()
        if proc.returncode in CRASHED:
            self.crashes += 1
        elif proc.returncode != 0:
            last = err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"
            self.errors[last.split(":", 1)[0].rsplit(".", 1)[-1]] += 1
        return proc.returncode, (out.splitlines() or [""])[0]

    def bounce(self, how: Bounce, where: str) -> None:
        node = self.cluster.transaction_coordinator(self.txn_id)
        self.cluster.take_down(node, how)
        self.bounces.append(f"{where}: {how} bounce of broker {node}")
        thread = threading.Thread(target=self.cluster.bring_up, args=(node,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def healed(self) -> None:
        for thread in self._threads:
            thread.join(timeout=180)
        self.cluster.wait_healed()

    def rows(self) -> list[str]:
        with sqlite3.connect(self.db) as db:
            return [value for (value,) in db.execute("SELECT value FROM rows")]

    def check(self, broker: Broker, faults: BrokerFaults, capability: str) -> None:
        comparison = compare(broker, self.topic, self.rows())
        Figures(
            capability,
            faults,
            len({r.split("-")[0] for r in comparison.rows}),
            comparison,
            self.errors,
            self.crashes,
        ).record()
        context = f"KAFKA_TXN_CLUSTER_SEED={SEED}; {faults.summary()}; {self.bounces}"
        assert_exactly_once(comparison, context)
        assert set(self.errors) <= documented_errors("two-phase-commit"), (self.errors, context)


@pytest.mark.timeout(900)
@pytest.mark.guarantee("7.3")
def test_the_coordinator_bounced_at_each_step_of_two_phase_commit(
    cluster: KafkaCluster, cluster_broker: Broker, tmp_path: Path
) -> None:
    """The first schedule of the module docstring: a run bounced before or after its
    decision still commits, recovery commits through a bounce of its EndTxn, and a
    prepared transaction the coordinator aborts while bounced stays out of both sides."""
    rng = random.Random(SEED)
    hows: list[Bounce] = [rng.choice(["clean", "hard"]) for _ in range(4)]
    app = App(cluster, cluster_broker, tmp_path)
    assert app.run()[0] == 0
    for hold, how in (("after_prepare", hows[0]), ("after_decision", hows[1])):
        app.healed()
        code, _ = app.run(hold=hold, bounce=how)
        assert code == 0, (hold, app.errors, app.bounces)

    app.healed()
    assert app.run(crash_at="after_decision")[0] == 71
    code, outcome = app.run(mode="recover", hold="end_txn", bounce=hows[2])
    assert (code, outcome) == (0, "outcome=committed"), (app.errors, app.bounces)

    # A prepared transaction left undecided past transaction.timeout.ms: the coordinator
    # aborts it (its check runs every second here) as it is bounced.
    app.healed()
    timeout_ms = 3000
    assert app.run(crash_at="after_prepare", timeout_ms=timeout_ms)[0] == 70
    time.sleep(timeout_ms / 1000 + 1.2)
    app.bounce(hows[3], "the coordinator aborting a timed-out transaction")
    code, outcome = app.run(mode="recover")
    assert code == 0, (app.errors, app.bounces)
    assert app.run()[0] == 0

    # The same timeout after the decision (the database committed, the run exited before
    # the Kafka commit): recovery in a fresh process, against the coordinator that took
    # over, names the divergence (the coordinator shows the stored transaction aborted),
    # never "unknowable". A separate application: its database is meant to diverge.
    app.healed()
    diverged = App(cluster, cluster_broker, tmp_path / "diverged")
    assert diverged.run()[0] == 0
    assert diverged.run(crash_at="after_decision", timeout_ms=timeout_ms)[0] == 71
    time.sleep(timeout_ms / 1000 + 1.2)
    diverged.bounce("hard", "the coordinator aborting a decided, timed-out transaction")
    assert diverged.run(mode="recover")[0] != 0
    assert diverged.errors == Counter({"TransactionDivergedError": 1}), diverged.errors
    diverged.healed()
    app.bounces += diverged.bounces

    faults = BrokerFaults(cluster, Targets(list, []))
    for done in app.bounces:
        faults.tally[f"bounces {'clean' if ': clean' in done else 'hard'}"] += 1
        faults.done.append(done)
    app.check(cluster_broker, faults, "two-phase commit, the coordinator bounced at each step")


@pytest.mark.timeout(600 + 3 * SECONDS)
@pytest.mark.guarantee("7.3")
def test_runs_crashing_under_broker_faults(
    cluster: KafkaCluster, cluster_broker: Broker, tmp_path: Path
) -> None:
    """Runs that exit hard after a seeded step (prepare, the decision, the Kafka commit)
    while coordinators and leaders are bounced and brokers paused, each recovered by the
    next fresh process: the rows are the records, each once, nothing is left open, and
    the runs commit again once the cluster healed."""
    app = App(cluster, cluster_broker, tmp_path)
    faults = BrokerFaults(
        cluster, Targets(lambda: [app.txn_id], [(app.topic, p) for p in range(3)]), SEED
    )
    crashes = random.Random(SEED + 2)
    with faults.running(SECONDS):
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            app.run(crash_at=crashes.choice(["none", *CRASHED.values()]))
    # The cluster has healed: the next runs recover and commit.
    for _ in range(2):
        code, _ = app.run()
        assert code == 0, (app.errors, faults.summary())
    app.check(cluster_broker, faults, "two-phase commit, runs crashing under broker faults")
