"""The test rig's broker: a real cluster named by KAFKA_BOOTSTRAP_SERVERS, else
testcontainers' Kafka when a Docker engine answers, else the local noida-db from PyPI
(pinned in pyproject.toml), started on a free loopback port and stopped at the end.

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
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_txn._local_broker import LocalBroker

START_TIMEOUT_S = 60.0


@dataclass
class Broker:
    """A running broker: where it is, what it is, and how to stop it."""

    bootstrap_servers: str
    description: str
    _stop: Any = field(default=None, repr=False)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def create_topic(self, partitions: int = 1, prefix: str = "t") -> str:
        """A new topic with a unique name, created and visible in metadata."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        admin = self.admin()  # must outlive the futures
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=30,
        )
        futures[name].result(timeout=60)
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
        beginning up to its last stable offset; it waits up to ``timeout`` for
        ``expected`` records, then reads ``linger`` seconds more, so that a duplicate or
        a record that should be invisible is caught. (Commit markers are written after
        commit_transaction() returns: until then the records stay invisible.)"""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            isolation_level="read_committed",
            enable_auto_commit=False,
            group_id=None,
        )
        try:
            partitions = None
            deadline = time.monotonic() + timeout
            while partitions is None and time.monotonic() < deadline:
                ids = consumer.partitions_for_topic(topic)
                partitions = [TopicPartition(topic, p) for p in sorted(ids)] if ids else None
                if partitions is None:
                    time.sleep(0.1)
            if partitions is None:
                raise RuntimeError(f"topic {topic} has no partitions in metadata")
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            seen: list[tuple[bytes | None, bytes | None]] = []

            def read_to_stable_end() -> bool:
                ends = consumer.end_offsets(partitions)  # the LSO, under read_committed
                while any(consumer.position(tp) < ends[tp] for tp in partitions):
                    if time.monotonic() >= deadline + linger:
                        return False
                    self._poll_into(consumer, seen)
                return True

            while time.monotonic() < deadline:
                if read_to_stable_end() and len(seen) >= expected:
                    break
                time.sleep(0.05)
            until = time.monotonic() + linger
            while time.monotonic() < until:
                read_to_stable_end()
                self._poll_into(consumer, seen)
            return seen
        finally:
            consumer.close()

    @staticmethod
    def _poll_into(consumer: Any, seen: list[tuple[bytes | None, bytes | None]]) -> None:
        for records in consumer.poll(timeout_ms=100).values():
            seen.extend((r.key, r.value) for r in records)


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
    """The local noida-db (kafka_txn._local_broker.LocalBroker), started for this session."""
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


def start_broker() -> Broker:
    """The broker the whole test session uses, chosen in the documented order."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        _wait_ready(external)
        return Broker(external, f"KAFKA_BOOTSTRAP_SERVERS={external} (real cluster)")
    if _docker_answers():
        return start_testcontainers()
    return start_noida()


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
