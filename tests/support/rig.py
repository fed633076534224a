"""The test rig's broker, chosen in this order:

1. the cluster named by ``KAFKA_BOOTSTRAP_SERVERS`` (a user's own cluster);
2. testcontainers' Kafka when a Docker engine answers;
3. Apache Kafka (``tests/support/apache_kafka.py``, from its Maven artifacts) when ``java`` and
   ``mvn`` are there: version ``KAFKA_TXN_KAFKA_VERSION`` (default 4.4.0), formatted with
   ``transaction.version`` ``KAFKA_TXN_TRANSACTION_VERSION`` (default: the release's, 2);
4. the local noida-db from PyPI (pinned in pyproject.toml), the no-Java fallback.

``KAFKA_TXN_TEST_BROKER=apache-kafka|noida|testcontainers`` forces one of the last three
(CI runs the broker-facing tests on each of Apache Kafka TV2, TV1 and noida-db). A
started broker listens on a free loopback port and is stopped, by its PID, at the end.

Its description says what the broker reports about itself (cluster id, broker count, the
ApiVersions ranges of the APIs kafka-txn relies on, the finalized ``transaction.version``
feature), not what we assume it is.

If no broker can be had, this raises: CI fails rather than skipping broker tests.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from kafka_txn.cli.local_broker import LocalBroker
from tests.support.apache_kafka import ApacheKafka, java_and_maven

START_TIMEOUT_S = 60.0


@dataclass
class Broker:
    """A running broker: where it is, what it is, and how to stop it."""

    bootstrap_servers: str
    description: str
    _stop: Any = field(default=None, repr=False)
    #: The Apache Kafka process when the rig started one (tests that need Apache Kafka's
    #: own behaviour start a broker of their own instead: this one is shared).
    apache_kafka: ApacheKafka | None = field(default=None, repr=False)
    #: The replication factor of the topics ``create_topic`` makes (3 on a three-broker
    #: cluster, whose ``min.insync.replicas`` is 2).
    replication_factor: int = 1

    @property
    def kind(self) -> str:
        """``apache-kafka``, ``noida``, ``testcontainers`` or ``external``."""
        for prefix, kind in (
            ("Apache Kafka", "apache-kafka"),
            ("local noida-db", "noida"),
            ("testcontainers", "testcontainers"),
        ):
            if self.description.startswith(prefix):
                return kind
        return "external"

    @property
    def transaction_version(self) -> int:
        """The cluster's finalized ``transaction.version`` (see ``transaction_version``)."""
        return transaction_version(self.bootstrap_servers)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def create_topic(
        self, partitions: int = 1, prefix: str = "t", config: dict[str, str] | None = None
    ) -> str:
        """A new topic with a unique name, created and visible in metadata; ``config``
        (topic settings, say ``{"max.message.bytes": "2000"}``) set once it exists, by
        an incremental AlterConfigs, which every broker of the rig takes."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        admin = self.admin()  # must outlive the futures
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=self.replication_factor)],
            operation_timeout=30,
        )
        futures[name].result(timeout=60)
        if config:
            entries = [
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
                for key, value in config.items()
            ]
            resource = ConfigResource("topic", name, incremental_configs=entries)
            admin.incremental_alter_configs([resource])[resource].result(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            md = admin.list_topics(name, timeout=10)
            topic = md.topics.get(name)
            if topic is not None and topic.error is None and len(topic.partitions) == partitions:
                return name
            time.sleep(0.1)
        raise RuntimeError(f"topic {name} did not appear in metadata")

    def read_committed(
        self, topic: str, expected: int, timeout: float = 20.0, linger: float = 1.0
    ) -> list[tuple[bytes | None, bytes | None]]:
        """Every (key, value) a read_committed consumer sees in ``topic``, read with an
        independent client (kafka-python, not librdkafka). Every partition is assigned
        (no group, so no rebalance delay can make an empty read pass) and read from the
        beginning up to its last stable offset (the end offset a read_committed
        ListOffsets reports); it waits up to ``timeout`` for ``expected`` records, then
        reads ``linger`` seconds more, so that a duplicate or a record that should be
        invisible is caught. A read that cannot get to the last stable offset of every
        partition raises instead of returning what it saw so far: "nothing there" is only
        concluded after reading everything there is. (Commit markers are written after
        commit_transaction() returns: until then the records stay invisible.)"""
        return self._read(topic, "read_committed", expected, timeout, linger)

    def read_uncommitted(
        self, topic: str, expected: int, timeout: float = 20.0
    ) -> list[tuple[bytes | None, bytes | None]]:
        """Every (key, value) written to ``topic``, aborted and still open transactions
        included, read up to each partition's high watermark (kafka-python,
        read_uncommitted): what a transaction wrote, whatever became of it."""
        return self._read(topic, "read_uncommitted", expected, timeout, 0.0)

    def open_partitions(self, topic: str) -> dict[int, tuple[int, int]]:
        """The partitions of ``topic`` whose last stable offset is below the high
        watermark, as {partition: (last stable offset, high watermark)}: a transaction
        that wrote there is still open (neither committed nor aborted). Empty when every
        transaction that wrote to ``topic`` has ended."""
        from kafka import KafkaConsumer, TopicPartition

        ends: dict[str, dict[int, int]] = {}
        for isolation in ("read_committed", "read_uncommitted"):
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap_servers,
                isolation_level=isolation,
                enable_auto_commit=False,
                group_id=None,
            )
            try:
                partitions = [TopicPartition(topic, p) for p in self._partitions(consumer, topic)]
                ends[isolation] = {
                    tp.partition: o for tp, o in consumer.end_offsets(partitions).items()
                }
            finally:
                consumer.close()
        stable, high = ends["read_committed"], ends["read_uncommitted"]
        return {p: (stable[p], high[p]) for p in sorted(high) if stable[p] < high[p]}

    @staticmethod
    def _partitions(consumer: Any, topic: str, timeout: float = 20.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = consumer.partitions_for_topic(topic)
            if ids:
                return sorted(ids)
            time.sleep(0.1)
        raise RuntimeError(f"topic {topic} has no partitions in metadata")

    def _read(
        self, topic: str, isolation: str, expected: int, timeout: float, linger: float
    ) -> list[tuple[bytes | None, bytes | None]]:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            isolation_level=isolation,
            enable_auto_commit=False,
            group_id=None,
        )
        try:
            deadline = time.monotonic() + timeout
            partitions = [TopicPartition(topic, p) for p in self._partitions(consumer, topic)]
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            seen: list[tuple[bytes | None, bytes | None]] = []

            def read_to_end() -> None:
                # Under read_committed the end offsets are the last stable offsets (LSO).
                ends = consumer.end_offsets(partitions)
                limit = time.monotonic() + timeout
                while any(consumer.position(tp) < ends[tp] for tp in partitions):
                    if time.monotonic() >= limit:
                        behind = {
                            tp.partition: (consumer.position(tp), ends[tp])
                            for tp in partitions
                            if consumer.position(tp) < ends[tp]
                        }
                        raise AssertionError(
                            f"{isolation} read of {topic} could not get to the end offsets "
                            f"in {timeout:g}s: {{partition: (position, end)}} = {behind}"
                        )
                    self._poll_into(consumer, seen)

            while True:
                read_to_end()
                if len(seen) >= expected or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
            until = time.monotonic() + linger
            while time.monotonic() < until:
                read_to_end()
                self._poll_into(consumer, seen)
            return seen
        finally:
            consumer.close()

    @staticmethod
    def _poll_into(consumer: Any, seen: list[tuple[bytes | None, bytes | None]]) -> None:
        for records in consumer.poll(timeout_ms=100).values():
            seen.extend((r.key, r.value) for r in records)


# The Kafka APIs kafka-txn relies on (key, name), named with their version ranges in the
# broker's description: the transactional producer's (KIP-98), DescribeTransactions (KIP-664,
# recovery and `kafka-txn describe`), and the Produce and Fetch of the records themselves.
_RELIED_ON = (
    (0, "Produce"),
    (1, "Fetch"),
    (22, "InitProducerId"),
    (24, "AddPartitionsToTxn"),
    (25, "AddOffsetsToTxn"),
    (26, "EndTxn"),
    (28, "TxnOffsetCommit"),
    (65, "DescribeTransactions"),
)


def _api_versions(bootstrap: str) -> str:
    """The ApiVersions ranges the first bootstrap broker announces for the APIs we rely on,
    read with kafka-txn's own coordinator connection (read-only use), e.g.
    ``EndTxn v0-3``; an API the broker does not announce reads ``EndTxn absent``."""
    from kafka_txn.coordinator import ConnectionSettings
    from kafka_txn.coordinator.connection import BrokerConnection

    host, _, port = bootstrap.split(",", maxsplit=1)[0].strip().rpartition(":")
    address = (host.strip("[]"), int(port))
    try:
        connection = BrokerConnection(ConnectionSettings(bootstrap=(address,)), *address)
    except Exception as exc:  # a description must not fail the run; say what happened
        return f"unavailable ({exc})"
    try:
        versions = connection.versions
    finally:
        connection.close()
    ranges = []
    for key, name in _RELIED_ON:
        low_high = versions.get(key)
        ranges.append(f"{name} v{low_high[0]}-{low_high[1]}" if low_high else f"{name} absent")
    return ", ".join(ranges)


def describe_cluster(bootstrap: str) -> str:
    """What the cluster at ``bootstrap`` reports about itself: its cluster id and broker
    count (Metadata, through confluent-kafka) and its ApiVersions ranges."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    count = len(metadata.brokers)
    return (
        f"cluster id {metadata.cluster_id}, {count} broker{'' if count == 1 else 's'}; "
        f"transaction.version {transaction_version(bootstrap)}; "
        f"ApiVersions {_api_versions(bootstrap)}"
    )


def transaction_version(bootstrap: str) -> int:
    """The cluster's finalized ``transaction.version`` feature (KIP-584 features in the
    ApiVersions v3+ answer, read with kafka-python): 2 means KIP-890's second part is on,
    every transaction bumps the producer epoch at EndTxn (TV2), 0 or 1 means it is not.
    A broker that finalizes no such feature (before Apache Kafka 3.8, noida-db) is 0."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        features = admin.describe_features()
    except Exception:  # an ApiVersions v3 the broker does not give: no features
        return 0
    finally:
        admin.close()
    finalized = features.get("transaction.version", {}).get("finalized")
    return int(finalized[1]) if finalized else 0


def _wait_ready(bootstrap: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=2)
            return
        except KafkaException as exc:
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"broker at {bootstrap} not ready after {START_TIMEOUT_S}s: {last}")


def start_noida() -> Broker:
    """The local noida-db (kafka_txn.cli.local_broker.LocalBroker), started for this session."""
    local = LocalBroker()
    return Broker(local.bootstrap_servers, local.description, local.stop)


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


def start_testcontainers() -> Broker:
    from testcontainers.community.kafka import KafkaContainer

    # A single broker: the transaction log must not ask for three replicas, or every
    # transactional producer would wait forever for its coordinator.
    container = (
        KafkaContainer("confluentinc/cp-kafka:7.6.0")  # Kafka 3.6: DescribeTransactions
        .with_kraft()
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
    )
    container.start()
    bootstrap = container.get_bootstrap_server()
    _wait_ready(bootstrap)
    return Broker(bootstrap, f"testcontainers Kafka ({container.image})", container.stop)


class OwnKafka:
    """A test module's own Apache Kafka: the process (to pause, kill or restart, by PID)
    and the rig's kafka-python reader of it."""

    def __init__(self, server: ApacheKafka) -> None:
        self.server = server
        self.broker = Broker(server.bootstrap_servers, server.description)

    @property
    def bootstrap_servers(self) -> str:
        return self.server.bootstrap_servers


def start_apache_kafka() -> Broker:
    """Apache Kafka from Maven (tests/support/apache_kafka.py), at the version and transaction
    version the environment names."""
    tv = os.environ.get("KAFKA_TXN_TRANSACTION_VERSION")
    kafka = ApacheKafka(transaction_version=int(tv) if tv else None).start()
    return Broker(kafka.bootstrap_servers, kafka.description, kafka.stop, kafka)


FORCED = ("apache-kafka", "noida", "testcontainers")


def chosen() -> str:
    """Which broker the session will have, in the rig's order, without starting one:
    ``external``, ``testcontainers``, ``apache-kafka`` or ``noida``."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return "external"
    forced = os.environ.get("KAFKA_TXN_TEST_BROKER")
    if forced:
        if forced not in FORCED:
            raise RuntimeError(
                f"KAFKA_TXN_TEST_BROKER={forced!r}: use one of {', '.join(FORCED)}, or unset it"
            )
        return forced
    if _docker_answers():
        return "testcontainers"
    return "apache-kafka" if java_and_maven() else "noida"


def start_broker() -> Broker:
    """The broker the whole test session uses, chosen in the documented order, described
    by where it came from and what it reports about itself."""
    choice = chosen()
    if choice == "external":
        external = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        _wait_ready(external)
        broker = Broker(external, "KAFKA_BOOTSTRAP_SERVERS")
    elif choice == "testcontainers":
        broker = start_testcontainers()
    elif choice == "apache-kafka":
        broker = start_apache_kafka()
    else:
        broker = start_noida()
    try:
        broker.description += f" at {broker.bootstrap_servers}: "
        broker.description += describe_cluster(broker.bootstrap_servers)
    except BaseException:
        broker.stop()
        raise
    return broker


def freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until the kernel has stopped it: the signal is delivered
    asynchronously, and a request sent right after os.kill() could otherwise still be
    answered (Linux: state ``T`` in /proc/<pid>/stat)."""
    os.kill(pid, signal.SIGSTOP)
    stat = Path(f"/proc/{pid}/stat")
    for _ in range(500):  # at most ~5 s; a stop takes microseconds
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("T", "t"):
            return
        time.sleep(0.01)
