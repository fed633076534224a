"""Fixtures: the session's broker (see tests/rig.py), a fresh topic per test, and a
librdkafka mock cluster per test for fault injection.

The broker starts when the first test that needs it asks for the ``broker`` fixture, and
stops at the end of the session: tests that need no broker (tests/test_state.py, say) run
anywhere. The header says how the broker will be chosen; the line printed when it starts,
and the terminal summary, name the broker that ran and what it reports about itself.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_txn.testing import MockCluster
from tests.apache_kafka import KAFKA_VERSION
from tests.rig import Broker, chosen, start_broker

ROOT = Path(__file__).resolve().parent.parent

# What became of the session's broker once a test needed it, for the terminal summary:
# its description, or why it could not be had.
_OUTCOME: list[str] = []


def pytest_report_header(config: pytest.Config) -> str:
    choice = chosen()
    what = {
        "external": f"KAFKA_BOOTSTRAP_SERVERS={os.environ.get('KAFKA_BOOTSTRAP_SERVERS')}",
        "testcontainers": "testcontainers' Kafka (a Docker engine answers)",
        "apache-kafka": (
            f"Apache Kafka {os.environ.get('KAFKA_TXN_KAFKA_VERSION') or KAFKA_VERSION} from "
            "Maven, transaction.version "
            f"{os.environ.get('KAFKA_TXN_TRANSACTION_VERSION') or 'of the release (2)'}"
        ),
        "noida": "the local noida-db",
    }[choice]
    return f"kafka broker: not started yet ({what}, when the first test needs it)"


def _announce(config: pytest.Config, line: str) -> None:
    """Print ``line`` now, past pytest's output capture (it runs inside a fixture)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


@pytest.fixture(scope="session")
def broker(pytestconfig: pytest.Config) -> Iterator[Broker]:
    """The session's broker, started on first use and stopped at the end of the session.
    If none can be had, this raises, and pytest reports the same error for every test that
    needs it (a session fixture's failure is cached): CI fails rather than skipping."""
    try:
        started = start_broker()
    except Exception as exc:
        _OUTCOME.append(f"failed to start: {exc}")
        raise
    _OUTCOME.append(started.description)
    _announce(pytestconfig, f"kafka broker: {started.description}")
    try:
        yield started
    finally:
        started.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that talks to the broker is a conformance test (``pytest -m
    conformance``): it must pass unchanged on Apache Kafka named by
    KAFKA_BOOTSTRAP_SERVERS. A test talks to the broker when it asks for the ``broker``
    fixture, directly or through another fixture (``topic``, ``producer_config``, ...);
    it also gets the ``broker`` marker if its module did not set it."""
    for item in items:
        if "broker" in getattr(item, "fixturenames", ()):
            for name in ("broker", "conformance"):
                if item.get_closest_marker(name) is None:
                    item.add_marker(name)
        if _SLOW.match(item.path.name) and item.get_closest_marker("slow") is None:
            item.add_marker("slow")


# The modules whose tests each take tens of seconds of Spark jobs or timed fault
# schedules, whatever the broker: `make test` runs them once, on Apache Kafka; the
# conformance matrix's extra brokers leave them out (-m "conformance and not slow").
_SLOW = re.compile(r"test_(spark\w*|adversarial|examples)\.py")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    described = _OUTCOME[0] if _OUTCOME else "not started (no test needed one)"
    terminalreporter.write_line(f"kafka broker: {described}")


@pytest.fixture
def topic(broker: Broker) -> str:
    return broker.create_topic(partitions=3)


@pytest.fixture
def txn_id() -> str:
    return f"txn-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def producer_config(broker: Broker, txn_id: str) -> dict[str, Any]:
    return {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}


@pytest.fixture
def mock_cluster() -> Iterator[MockCluster]:
    with MockCluster(brokers=3) as cluster:
        yield cluster


@pytest.fixture
def mock_config(mock_cluster: MockCluster, txn_id: str) -> Callable[..., dict[str, Any]]:
    """Producer config for the mock cluster; keyword arguments add librdkafka settings
    with '_' standing for '.'."""

    def make(**extra: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap.servers": mock_cluster.bootstrap_servers,
            "transactional.id": txn_id,
            "retry.backoff.ms": 10,
        }
        conf.update({k.replace("_", "."): v for k, v in extra.items()})
        return conf

    return make


@pytest.fixture(scope="session")
def postgres_jdbc() -> str:
    from tests.databases import POSTGRES_JDBC, ensure_running

    return ensure_running("postgresql", POSTGRES_JDBC)


@pytest.fixture(scope="session")
def mariadb_jdbc() -> str:
    from tests.databases import MARIADB_JDBC, ensure_running, upgrade_default_tables

    jdbc = ensure_running("mariadb", MARIADB_JDBC)
    upgrade_default_tables(jdbc)
    return jdbc


@pytest.fixture(params=["postgresql", "mariadb", "sqlite"])
def jdbc_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """Each supported database in turn, as a JDBC URL."""
    if request.param == "sqlite":
        from tests.databases import sqlite_jdbc

        return sqlite_jdbc(tmp_path)
    fixture = "postgres_jdbc" if request.param == "postgresql" else "mariadb_jdbc"
    return str(request.getfixturevalue(fixture))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the Spark tests (a process has one SparkContext)."""
    from pyspark.sql import SparkSession

    # Spark's Python workers import the hooks from tests/: put the repository on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2,4]")  # 2 threads, 4 attempts per task
        .appName("kafka-txn-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
