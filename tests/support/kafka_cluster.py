"""A three-broker Apache Kafka cluster for the fault schedules (tests/cluster/): brokers
1, 2 and 3 and a KRaft controller (node 0, a process of its own), all on loopback, from
the same Maven artifacts as the rig's single broker (``tests/support/apache_kafka.py``).

Why a controller of its own: bouncing or pausing brokers then never takes the metadata
quorum with it, so a schedule can take two of the three brokers away (a partition below
``min.insync.replicas``) and the cluster still knows who leads what.

The cluster is configured as production runs transactions: ``__transaction_state``,
``__consumer_offsets`` and data topics with replication factor 3 and
``min.insync.replicas=2``, no unclean leader election (Apache Kafka's default). Two
settings are shortened so that a schedule of seconds meets what takes minutes in
production: ``replica.lag.time.max.ms`` (a broker paused past it drops out of the ISR) and
the interval of the coordinator's check for timed-out transactions.

Helpers say where things are, computed as the broker computes them and read from the
cluster's metadata:

- ``transaction_coordinator(id)``: the leader of ``__transaction_state`` partition
  ``Utils.abs(id.hashCode) % transaction.state.log.num.partitions``
  (``TransactionStateManager.partitionFor``);
- ``group_coordinator(group)``: the leader of ``__consumer_offsets`` partition
  ``Utils.abs(group.hashCode) % offsets.topic.num.partitions``
  (``GroupCoordinatorService.partitionFor``, ``GroupMetadataManager.partitionFor``);
- ``leader(topic, partition)``: the partition's leader.

and do things to a broker: ``bounce(node, "clean")`` (SIGTERM: a controlled shutdown,
then start), ``bounce(node, "hard")`` (SIGKILL, then start), ``pause(nodes, seconds)``
(SIGSTOP, SIGCONT). Every process is stopped by its PID at the end.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Literal

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.support.apache_kafka import (
    START_TIMEOUT_S,
    ApacheKafka,
    free_port,
    new_cluster_id,
    require_java_and_maven,
    warm_up,
)
from tests.support.rig import Broker

BROKERS = (1, 2, 3)
CONTROLLER = 0
INTERNAL_PARTITIONS = 5
"""Partitions of ``__transaction_state`` and ``__consumer_offsets``."""
REPLICA_LAG_S = 6.0
"""``replica.lag.time.max.ms``: a follower that has not caught up for this long leaves the
ISR (Apache Kafka's default is 30 s). A pause longer than this costs a partition a replica
of its ISR; ``broker.session.timeout.ms`` (9 s, the default) later, the controller fences
the paused broker and moves its leaderships."""

_CLUSTER_PROPERTIES = {
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": str(INTERNAL_PARTITIONS),
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": str(INTERNAL_PARTITIONS),
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "replica.lag.time.max.ms": str(int(REPLICA_LAG_S * 1000)),
    "group.initial.rebalance.delay.ms": "0",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "num.partitions": "3",
    "auto.create.topics.enable": "false",
}

Bounce = Literal["clean", "hard"]


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def internal_partition(key: str, partitions: int = INTERNAL_PARTITIONS) -> int:
    """``Utils.abs(key.hashCode) % partitions``: the partition of ``__transaction_state``
    (a transactional id) or ``__consumer_offsets`` (a group id) that holds ``key``."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class KafkaCluster:
    """Three brokers and a controller; see the module docstring."""

    def __init__(self, version: str | None = None, heap: str = "512m") -> None:
        self.cluster_id = new_cluster_id()
        controller_port = free_port()
        quorum = f"127.0.0.1:{controller_port}"
        self.controller = ApacheKafka(version, heap="256m", warm_up=False)
        self.controller.cluster_id = self.cluster_id
        self.controller.controller_port = controller_port
        self.controller.properties = {
            "process.roles": "controller",
            "node.id": str(CONTROLLER),
            "controller.listener.names": "CONTROLLER",
            "listeners": f"CONTROLLER://{quorum}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
            "controller.quorum.bootstrap.servers": quorum,
            "log.dirs": str(self.controller.folder / "data"),
            # With eligible leader replicas (KIP-966, on by default from 4.1), the active
            # controller writes a cluster-level min.insync.replicas from its own static
            # configuration when none exists, and that overrides every broker's static
            # setting: set on the brokers alone, 2 would silently be 1.
            "min.insync.replicas": _CLUSTER_PROPERTIES["min.insync.replicas"],
        }
        self.nodes: dict[int, ApacheKafka] = {}
        for node_id in BROKERS:
            node = ApacheKafka(version, heap=heap, warm_up=False)
            node.cluster_id = self.cluster_id
            node.standalone = False
            node.properties = {
                "process.roles": "broker",
                "node.id": str(node_id),
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "controller.quorum.bootstrap.servers": quorum,
                "log.dirs": str(node.folder / "data"),
                **_CLUSTER_PROPERTIES,
            }
            self.nodes[node_id] = node
        self.bootstrap_servers = ",".join(n.bootstrap_servers for n in self.nodes.values())
        self.version = self.controller.version
        self._lock = threading.RLock()
        self._down: set[int] = set()

    # -- what it is ----------------------------------------------------------------------

    @property
    def description(self) -> str:
        pids = ", ".join(f"{i}: {n.pid}" for i, n in self.nodes.items())
        return (
            f"Apache Kafka {self.version} cluster (3 brokers, pids {pids}; a KRaft "
            f"controller, pid {self.controller.pid}; replication factor 3, "
            "min.insync.replicas 2)"
        )

    def broker(self) -> Broker:
        """The cluster as the rig's ``Broker`` (topics created with 3 replicas)."""
        return Broker(self.bootstrap_servers, self.description, replication_factor=3)

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})

    def leader(self, topic: str, partition: int, timeout: float = 60.0) -> int:
        """The node id of ``topic``/``partition``'s leader (waits while it has none)."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(KafkaException):
                md = self.admin().list_topics(topic, timeout=5)
                found = md.topics.get(topic)
                if found is not None and partition in found.partitions:
                    leader = found.partitions[partition].leader
                    if leader in self.nodes:
                        return int(leader)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{topic}/{partition} has no leader after {timeout:g}s")
            time.sleep(0.2)

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node id of ``transactional_id``'s transaction coordinator."""
        return self.leader("__transaction_state", internal_partition(transactional_id))

    def group_coordinator(self, group: str) -> int:
        """The node id of ``group``'s group coordinator."""
        return self.leader("__consumer_offsets", internal_partition(group))

    def up(self) -> set[int]:
        """The brokers the controller has registered and not fenced (in the metadata)."""
        md = self.admin().list_topics(timeout=10)
        return set(md.brokers) & set(self.nodes)

    def unhealed(self) -> dict[str, list[int]]:
        """The partitions (internal ones included) whose ISR lacks a replica or that have
        no leader, as {topic: [partitions]}; empty once the cluster has healed."""
        md = self.admin().list_topics(timeout=10)
        behind: dict[str, list[int]] = {}
        for name, topic in md.topics.items():
            for p, meta in topic.partitions.items():
                if meta.leader < 0 or set(meta.isrs) != set(meta.replicas):
                    behind.setdefault(name, []).append(p)
        return behind

    def wait_healed(self, timeout: float = 120.0) -> None:
        """Wait until every broker is up and every partition has its whole ISR back."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                up, behind = self.up(), self.unhealed()
                if up == set(self.nodes) and not behind:
                    return
                last = f"brokers up {sorted(up)}, partitions behind {behind}"
            except KafkaException as exc:
                last = exc
            time.sleep(0.5)
        raise TimeoutError(f"the cluster did not heal in {timeout:g}s: {last}")

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> KafkaCluster:
        """Start the controller and the brokers together, wait until all three brokers
        are registered, then create and load the internal topics (``ApacheKafka``'s
        warm-up, run once on the whole cluster)."""
        require_java_and_maven()
        try:
            self.controller.launch()
            for node in self.nodes.values():
                node.launch()
            self._wait_registered(set(self.nodes))
            warm_up({"bootstrap.servers": self.bootstrap_servers})
            self.wait_healed()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_registered(self, nodes: set[int], timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            for node_id in nodes:
                proc = self.nodes[node_id]._proc
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(
                        f"broker {node_id} exited with {proc.returncode} while starting:\n"
                        f"{self.nodes[node_id].log_tail()}"
                    )
            try:
                up = self.up()
                if nodes <= up:
                    return
                last = f"registered: {sorted(up)}"
            except KafkaException as exc:
                last = exc
            time.sleep(0.3)
        raise RuntimeError(
            f"brokers {sorted(nodes)} were not registered within {timeout:g}s ({last}):\n"
            + "\n".join(self.nodes[n].log_tail(20) for n in sorted(nodes))
        )

    def bounce(self, node_id: int, how: Bounce, down_s: float = 0.0) -> None:
        """Stop broker ``node_id`` (``clean``: SIGTERM, a controlled shutdown that moves
        its leaderships first; ``hard``: SIGKILL), keep it down ``down_s`` seconds, start
        it on the same ports and data, and wait until the controller has registered it."""
        self.take_down(node_id, how)
        time.sleep(down_s)
        self.bring_up(node_id)

    def take_down(self, node_id: int, how: Bounce) -> None:
        """The first half of ``bounce``: the broker is down when this returns."""
        with self._lock:
            node = self.nodes[node_id]
            if how == "hard":
                node.kill()
            else:
                node.terminate()
            self._down.add(node_id)

    def bring_up(self, node_id: int) -> None:
        """The second half of ``bounce``: start the broker again and wait until it is
        registered."""
        with self._lock:
            if node_id not in self._down:
                return
            self.nodes[node_id].launch()
            self._down.discard(node_id)
        self._wait_answers(node_id)
        self._wait_registered({node_id})

    def _wait_answers(self, node_id: int, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until broker ``node_id`` itself answers Metadata (a client bootstrapped
        from it alone sends its first request there). The controller's registration is
        no sign of a restart: a SIGKILLed broker stays registered until its session
        times out (``broker.session.timeout.ms``)."""
        node = self.nodes[node_id]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = node._proc
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"broker {node_id} exited with {proc.returncode} while starting:\n"
                    f"{node.log_tail()}"
                )
            with contextlib.suppress(KafkaException):
                admin = AdminClient({"bootstrap.servers": node.bootstrap_servers, "log_level": 0})
                md = admin.list_topics(timeout=2)
                if md.orig_broker_id == node_id and node_id in md.brokers:
                    return
            time.sleep(0.3)
        raise RuntimeError(
            f"broker {node_id} did not answer within {timeout:g}s:\n{node.log_tail(20)}"
        )

    @contextlib.contextmanager
    def paused(self, node_ids: Iterable[int]) -> Iterator[None]:
        """SIGSTOP the brokers for the block, SIGCONT them after it (however it ends)."""
        chosen = list(node_ids)
        for node_id in chosen:
            self.nodes[node_id].pause()
        try:
            yield
        finally:
            for node_id in chosen:
                with contextlib.suppress(AssertionError, ProcessLookupError):
                    self.nodes[node_id].resume()

    def pause(self, node_ids: Iterable[int], seconds: float) -> None:
        """SIGSTOP the brokers for ``seconds``, then SIGCONT them."""
        with self.paused(node_ids):
            time.sleep(seconds)

    def stop(self) -> None:
        """Stop every process by its PID and delete the folders; idempotent."""
        for node in self.nodes.values():
            node.stop()
        self.controller.stop()

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
