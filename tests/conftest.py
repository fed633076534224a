"""Fixtures: the session's broker (see tests/rig.py), a fresh topic per test, and a
librdkafka mock cluster per test for fault injection."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_txn.testing import MockCluster
from tests.rig import Broker, start_broker

ROOT = Path(__file__).resolve().parent.parent

_SESSION: dict[str, Broker] = {}


def pytest_configure(config: pytest.Config) -> None:
    if config.option.collectonly:
        return
    _SESSION["broker"] = start_broker()  # raises, failing the run, when none can be had


def pytest_unconfigure(config: pytest.Config) -> None:
    broker = _SESSION.pop("broker", None)
    if broker is not None:
        broker.stop()


def pytest_report_header(config: pytest.Config) -> str:
    broker = _SESSION.get("broker")
    return f"kafka broker: {broker.description if broker else 'none (collection only)'}"


@pytest.fixture(scope="session")
def broker() -> Broker:
    assert "broker" in _SESSION, "the broker starts in pytest_configure"
    return _SESSION["broker"]


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
    from tests.databases import MARIADB_JDBC, ensure_running

    return ensure_running("mariadb", MARIADB_JDBC)


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
