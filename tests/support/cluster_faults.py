"""Broker faults on the three-broker cluster (``tests/support/kafka_cluster.py``), drawn
from a seeded generator, and the checks every fault schedule of tests/cluster/ ends with.

``BrokerFaults`` runs in a thread while a capability works: one fault at a time, each
followed by a gap, until the block ends. A fault is one of

- ``bounce`` of the transaction coordinator of one of the capability's transactional ids,
  of the leader of one of its data partitions, or of its group's coordinator, either
  ``clean`` (SIGTERM: a controlled shutdown that moves leaderships first) or ``hard``
  (SIGKILL: leaderships move when the controller fences the broker, after
  ``broker.session.timeout.ms``), the broker kept down a moment, then started again;
- ``pause`` of one broker, or of two (SIGSTOP, SIGCONT), past ``replica.lag.time.max.ms``:
  with one paused, the partitions it follows lose a replica of their ISR; with two, the
  partitions led by the third are below ``min.insync.replicas`` and produce waits (librdkafka
  retries NOT_ENOUGH_REPLICAS) until they come back.

Every draw is made whatever the cluster's state, so a seed (``KAFKA_TXN_CLUSTER_SEED``,
printed and named in every failure) replays the same faults in the same order; timing is
real, so not the same interleavings.

The checks (``assert_exactly_once``) read Kafka with an independent client (kafka-python,
read_committed, every partition assigned) and the database with plain SQL.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.kafka_cluster import BROKERS, REPLICA_LAG_S, KafkaCluster
from tests.support.rig import Broker

ROOT = Path(__file__).resolve().parent.parent.parent

SEED = int(os.environ.get("KAFKA_TXN_CLUSTER_SEED", "25025"))
SECONDS = float(os.environ.get("KAFKA_TXN_CLUSTER_SECONDS", "20"))
"""How long the faults go on per schedule (``make soak``: as long as asked)."""
HEAL_TIMEOUT_S = 180.0
"""How long a healed cluster may take to have every broker up and every ISR whole."""


@dataclass(frozen=True)
class Targets:
    """What a schedule's faults aim at: the capability's transactional ids, its data
    partitions and its consumer group (None: no group)."""

    transactional_ids: Callable[[], Sequence[str]]
    partitions: Sequence[tuple[str, int]]
    group: str | None = None


@dataclass
class Fault:
    """One fault, as drawn."""

    kind: str  # "bounce" or "pause"
    target: str  # "transaction coordinator", "leader", "group coordinator", "broker(s)"
    how: str  # "clean"/"hard" for a bounce, "1"/"2" brokers for a pause
    pick: float
    length: float

    def __str__(self) -> str:
        return f"{self.kind} {self.how} ({self.target}, {self.length:.1f}s)"


@dataclass
class BrokerFaults:
    """The seeded fault schedule; ``run()`` (or ``with faults.running():``) acts until
    stopped. ``tally`` counts what was done (``bounces clean``, ``bounces hard``,
    ``pauses of 1 broker``, ``pauses of 2 brokers``) and ``done`` lists it in order."""

    cluster: KafkaCluster
    targets: Targets
    seed: int = SEED
    tally: Counter[str] = field(default_factory=Counter)
    done: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _error: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def draw(self) -> Fault:
        """The next fault; draws the same numbers whatever it turns out to be."""
        kinds = ["transaction coordinator", "leader", "broker(s)"]
        if self.targets.group is not None:
            kinds.append("group coordinator")
        target = self.rng.choice(kinds)
        bounce_how = self.rng.choice(["clean", "hard"])
        paused = self.rng.choice(["1", "1", "2"])
        pick = self.rng.random()
        length = self.rng.uniform(0.0, 3.0)
        if target == "broker(s)":
            return Fault("pause", target, paused, pick, REPLICA_LAG_S + 1.0 + length)
        return Fault("bounce", target, bounce_how, pick, length)

    def node(self, fault: Fault) -> int:
        """The broker a bounce aims at, found now in the cluster's metadata."""
        if fault.target == "transaction coordinator":
            ids = self.targets.transactional_ids()
            if ids:
                return self.cluster.transaction_coordinator(ids[int(fault.pick * len(ids))])
        if fault.target == "group coordinator" and self.targets.group is not None:
            return self.cluster.group_coordinator(self.targets.group)
        topic, partition = self.targets.partitions[int(fault.pick * len(self.targets.partitions))]
        return self.cluster.leader(topic, partition)

    def act(self, fault: Fault) -> None:
        if fault.kind == "bounce":
            node = self.node(fault)
            self.done.append(f"{fault}: broker {node}")
            self.cluster.bounce(node, "hard" if fault.how == "hard" else "clean", fault.length)
            self.tally[f"bounces {fault.how}"] += 1
        else:
            count = int(fault.how)
            first = int(fault.pick * len(BROKERS))
            nodes = [BROKERS[(first + i) % len(BROKERS)] for i in range(count)]
            self.done.append(f"{fault}: brokers {nodes}")
            self.cluster.pause(nodes, fault.length)
            self.tally[f"pauses of {count} broker{'s' if count > 1 else ''}"] += 1

    def run(self) -> None:
        """Act until stopped: a fault, a gap of up to 2 s, the next."""
        try:
            while not self._stop.is_set():
                fault = self.draw()
                gap = self.rng.uniform(0.2, 2.0)
                self.act(fault)
                self._stop.wait(gap)
        except BaseException as exc:  # the test re-raises it
            self._error.append(exc)

    @contextmanager
    def running(self, seconds: float | None = None) -> Iterator[BrokerFaults]:
        """Run the schedule in a thread during the block (or for ``seconds`` of it, if
        given: the block then goes on with the cluster healing); then wait until the
        cluster has healed."""
        thread = threading.Thread(target=self.run, name="broker-faults", daemon=True)
        timer = None
        if seconds is not None:
            timer = threading.Timer(seconds, self._stop.set)
            timer.start()
        thread.start()
        try:
            yield self
        finally:
            self.stop(thread)
            if timer is not None:
                timer.cancel()

    def stop(self, thread: threading.Thread) -> None:
        """Stop drawing faults, let the one under way finish, and wait for the cluster
        to heal; a fault that failed (a broker that would not start) is raised."""
        self._stop.set()
        thread.join(timeout=HEAL_TIMEOUT_S)
        if thread.is_alive():
            raise AssertionError(f"a broker fault did not end in {HEAL_TIMEOUT_S:g}s")
        if self._error:
            raise self._error[0]
        self.cluster.wait_healed(HEAL_TIMEOUT_S)

    def wait_until_stopped(self, timeout: float) -> None:
        """Block until the schedule's ``seconds`` are up (``running(seconds)``)."""
        self._stop.wait(timeout)

    @property
    def faults(self) -> int:
        return sum(self.tally.values())

    def summary(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(self.tally.items())) or "no fault"
        return f"seed {self.seed}: {counts}; in order: {'; '.join(self.done)}"


@dataclass
class Comparison:
    """The database's values against what a read_committed consumer sees in a topic."""

    rows: list[str]
    records: list[str]
    open_partitions: dict[int, tuple[int, int]]

    @property
    def duplicated(self) -> int:
        """Records seen, and rows stored, more than once."""
        return (len(self.records) - len(set(self.records))) + (len(self.rows) - len(set(self.rows)))

    @property
    def lost(self) -> int:
        """Rows whose record Kafka does not show committed, and records without a row."""
        return len(set(self.rows) ^ set(self.records))


def compare(broker: Broker, topic: str, database: Iterable[str]) -> Comparison:
    """Read ``topic`` with an independent client (kafka-python, read_committed, every
    partition assigned, up to each last stable offset) and compare it with ``database``;
    also which partitions still have a transaction open (last stable offset below the
    high watermark)."""
    rows = sorted(database)
    seen = broker.read_committed(topic, expected=len(rows), timeout=90, linger=2.0)
    records = sorted((value or b"").decode() for _, value in seen)
    return Comparison(rows, records, broker.open_partitions(topic))


def assert_exactly_once(comparison: Comparison, context: str) -> None:
    """The rows are the records, each exactly once, and no transaction is left open."""
    c = comparison
    twice = sorted(v for v, n in Counter(c.records).items() if n > 1)
    assert not twice, f"{context}: records seen more than once: {twice[:10]}"
    assert len(c.rows) == len(set(c.rows)), f"{context}: rows stored more than once"
    only_kafka = sorted(set(c.records) - set(c.rows))
    only_db = sorted(set(c.rows) - set(c.records))
    assert not only_kafka and not only_db, (
        f"{context}: Kafka and the database differ: only in Kafka {only_kafka[:10]}, "
        f"only in the database {only_db[:10]} ({len(c.records)} records, {len(c.rows)} rows)"
    )
    assert not c.open_partitions, (
        f"{context}: transactions left open, {{partition: (last stable offset, high "
        f"watermark)}} = {c.open_partitions}"
    )


@dataclass
class Figures:
    """What one schedule survived, for docs/guarantees.md's table: printed, and appended
    as a JSON line to the file ``KAFKA_TXN_CLUSTER_REPORT`` names (``make soak``)."""

    capability: str
    faults: BrokerFaults
    transactions: int
    comparison: Comparison
    errors: Counter[str]
    kills: int = 0

    def record(self) -> None:
        line = {
            "capability": self.capability,
            "seed": self.faults.seed,
            "faults": dict(self.faults.tally),
            "client_crashes": self.kills,
            "transactions": self.transactions,
            "records": len(self.comparison.records),
            "lost": self.comparison.lost,
            "duplicated": self.comparison.duplicated,
            "errors": dict(self.errors),
        }
        print(f"cluster figures: {json.dumps(line)}; {self.faults.summary()}")
        path = os.environ.get("KAFKA_TXN_CLUSTER_REPORT")
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")


_DOCUMENTED: dict[str, frozenset[str]] = {}


def documented_errors(*pages: str) -> frozenset[str]:
    """The exception class names the docs name: docs/reference/errors.md (the tree) and
    the given guide pages (``docs/guide/<page>.md``)."""
    key = ",".join(pages)
    if key not in _DOCUMENTED:
        names: set[str] = set()
        for path in [
            ROOT / "docs" / "reference" / "errors.md",
            *(ROOT / "docs" / "guide" / f"{p}.md" for p in pages),
        ]:
            names |= set(re.findall(r"\b([A-Z][A-Za-z]+(?:Error|Exception))\b", path.read_text()))
        _DOCUMENTED[key] = frozenset(names)
    return _DOCUMENTED[key]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait up to ``timeout`` seconds for ``condition``; a hang fails, naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g}s")
        time.sleep(0.2)
