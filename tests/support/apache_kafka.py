"""Apache Kafka for the test rig: a combined broker+controller (KRaft, no ZooKeeper) run
from Apache Kafka's own Maven artifacts, on free loopback ports, stopped by its PID.

The launching is the package's (``kafka_txn/cli/apache_kafka.py``, which ``kafka-txn broker``
runs too): Maven resolves the pinned version (``kafka_txn/cli/apache_kafka.pom.xml``,
``-Dkafka.version``) into its local repository and gives the classpath; the log directory is
formatted with ``kafka.tools.StorageTool format --standalone``, with the
``transaction.version`` feature asked for. This module adds what the suite needs on top:
``KAFKA_TXN_KAFKA_VERSION`` picks the version, ``KAFKA_TXN_BROKER_LOGS`` keeps each broker's
log, and a test that cannot run Apache Kafka fails naming what to install.

Used three ways: as the session's broker (``tests/support/rig.py``), as a broker a test starts
for itself with the settings it needs (short transaction timeouts and expirations, an
authorizer and SASL/SCRAM, a restart between two transactions), and by the benchmarks.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kafka_txn.cli import apache_kafka as _package
from kafka_txn.cli.apache_kafka import (
    KAFKA_VERSION,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    MavenError,
    classpath,
    free_port,
    java_and_maven,
    new_cluster_id,
)

__all__ = [
    "FAST_TIMEOUT_ABORTS",
    "KAFKA_VERSION",
    "ROOT",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "ApacheKafka",
    "MavenError",
    "classpath",
    "free_port",
    "java_and_maven",
    "new_cluster_id",
    "require_java_and_maven",
    "running",
    "warm_up",
]

ROOT = Path(__file__).resolve().parent.parent.parent

_WARM_UP_NAME = "kafka-txn-rig-warm-up"


def require_java_and_maven() -> None:
    """Fail (never skip) the calling test when Apache Kafka cannot run here."""
    if not java_and_maven():
        import pytest

        pytest.fail(
            "this test runs Apache Kafka from its Maven artifacts (tests/support/apache_kafka.py): "
            "install a JDK 17 or later and Maven and put java and mvn on PATH (Debian: "
            "apt-get install openjdk-17-jre-headless maven)",
            pytrace=False,
        )


def warm_up(client_config: Mapping[str, Any]) -> None:
    """Create and load the transaction log and the offsets topic before the first test
    (``kafka_txn.cli.apache_kafka.warm_up``), as the rig's transactional id and group."""
    _package.warm_up(client_config, _WARM_UP_NAME)


class ApacheKafka(_package.ApacheKafka):
    """One Apache Kafka broker+controller on 127.0.0.1, in a temporary folder
    (``kafka_txn.cli.apache_kafka.ApacheKafka``, whose arguments it takes), at
    ``KAFKA_TXN_KAFKA_VERSION`` when no version is given. ``stop()`` keeps the broker's
    log in the folder ``KAFKA_TXN_BROKER_LOGS`` names, if any (CI keeps them, to read a
    failure the broker explains), before deleting its folder."""

    warm_up_name = _WARM_UP_NAME

    def __init__(self, version: str | None = None, **settings: Any) -> None:
        super().__init__(version or os.environ.get("KAFKA_TXN_KAFKA_VERSION"), **settings)

    def stop(self) -> None:
        """Stop the broker by its PID and delete its folder; idempotent."""
        self.terminate()
        keep = os.environ.get("KAFKA_TXN_BROKER_LOGS")
        if keep and self.log.exists():
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(self.log, Path(keep) / f"{self.folder.name}.log")
        super().stop()


FAST_TIMEOUT_ABORTS: Mapping[str, str] = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"
}
"""The coordinator looks for transactions past transaction.timeout.ms every 10 s by
default; once a second with this, so that a timeout abort comes soon after the timeout."""


@contextmanager
def running(**settings: Any) -> Iterator[ApacheKafka]:
    """A module's own broker (``ApacheKafka(**settings)``), stopped by its PID at the end;
    skips unless Java and Maven are here (``require_java_and_maven``)."""
    require_java_and_maven()
    server = ApacheKafka(**settings).start()
    try:
        yield server
    finally:
        server.stop()
