"""The test rig itself (tests/conftest.py, tests/support/rig.py): the broker starts only when a
test needs it, so tests that need none run on a machine without one; and the run names
the broker that ran by what the broker reports about itself."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient

from tests.support.apache_kafka import ApacheKafka, java_and_maven
from tests.support.rig import _RELIED_ON, Broker, chosen, transaction_version

ROOT = Path(__file__).resolve().parent.parent.parent


def _pytest(*args: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_tests_that_need_no_broker_start_none() -> None:
    # KAFKA_BOOTSTRAP_SERVERS names a loopback port that refuses connections (bound, never
    # listening) and comes first in the rig's order: had anything tried to start the
    # broker, it would have waited for it and failed the run.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        result = _pytest(
            "tests/twophase/test_state.py", bootstrap=f"127.0.0.1:{closed.getsockname()[1]}"
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout
    assert "kafka broker: not started (no test needed one)" in result.stdout


def test_broker_description_is_what_the_broker_reports(broker: Broker) -> None:
    metadata = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10)
    count = len(metadata.brokers)
    assert f"cluster id {metadata.cluster_id}, {count} broker" in broker.description
    assert "real cluster" not in broker.description
    # ApiVersions as an independent client (kafka-python, not our connection code) reads it.
    # (Its api_versions() maps keys to an enum that lacks the newest APIs Apache Kafka
    # 4.x announces, such as key 93: the raw table is read instead.)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        admin.describe_features()  # connects, so the version table is filled in
        versions = {int(k): v for k, v in admin._manager.broker_version_data.api_versions.items()}
        features = admin.describe_features()
    finally:
        admin.close()
    for key, name in _RELIED_ON:
        low, high = versions[key]
        assert f"{name} v{low}-{high}" in broker.description
    finalized = features.get("transaction.version", {}).get("finalized", (0, 0))[1]
    assert f"; transaction.version {finalized}; " in broker.description
    assert broker.transaction_version == finalized


def test_the_run_names_the_broker_that_ran(broker: Broker) -> None:
    # A nested run of one broker test, pointed at this session's broker: the line printed
    # when its broker started and the summary both describe it.
    result = _pytest(
        f"{Path(__file__).relative_to(ROOT)}::test_broker_description_is_what_the_broker_reports",
        bootstrap=broker.bootstrap_servers,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    cluster_id = broker.description.split("cluster id ", 1)[1].split(",", 1)[0]
    expected = (
        f"kafka broker: KAFKA_BOOTSTRAP_SERVERS at {broker.bootstrap_servers}: "
        f"cluster id {cluster_id}, "
    )
    assert result.stdout.count(expected) == 2, result.stdout
    assert (
        f"not started yet (KAFKA_BOOTSTRAP_SERVERS={broker.bootstrap_servers}, "
        "when the first test needs it)"
    ) in result.stdout


def test_every_broker_facing_test_is_a_conformance_test() -> None:
    """``pytest -m conformance`` selects exactly the tests that use the broker:
    a test asking for it through another fixture is selected, a pure one is not."""
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "conformance",
         "tests/producer/test_producer.py", "tests/twophase/test_state.py",
         "tests/broker/test_kafka_fidelity.py"],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stdout + listed.stderr
    ids = [line for line in listed.stdout.splitlines() if "::" in line]
    assert any(i.startswith("tests/producer/test_producer.py::") for i in ids), (
        ids
    )  # via producer_config
    assert any(i.startswith("tests/broker/test_kafka_fidelity.py::") for i in ids), ids
    assert not any(i.startswith("tests/twophase/test_state.py::") for i in ids), ids


def test_the_broker_is_chosen_in_the_documented_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """KAFKA_BOOTSTRAP_SERVERS first; KAFKA_TXN_TEST_BROKER forces one of the others and a
    wrong value names the ones there are; otherwise Apache Kafka where Java and Maven
    are (no Docker engine on this machine's kind), else noida-db."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("KAFKA_TXN_TEST_BROKER", "noida")
    assert chosen() == "external"
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS")
    assert chosen() == "noida"
    monkeypatch.setenv("KAFKA_TXN_TEST_BROKER", "kafka")
    with pytest.raises(RuntimeError, match="apache-kafka, noida, testcontainers"):
        chosen()
    monkeypatch.delenv("KAFKA_TXN_TEST_BROKER")
    monkeypatch.setattr("tests.support.rig._docker_answers", lambda: False)
    assert chosen() == ("apache-kafka" if java_and_maven() else "noida")
    monkeypatch.setattr("tests.support.rig.java_and_maven", lambda: False)
    assert chosen() == "noida"


def test_apache_kafka_is_formatted_as_asked_and_stopped_by_its_pid() -> None:
    """A broker formatted with transaction.version 0 finalizes no transaction.version
    (``kafka.tools.StorageTool``: a feature at level 0 is not written), answers, and is
    gone with its folder once stopped: the process ended (and reaped), nothing left."""
    kafka = ApacheKafka(transaction_version=0).start()
    pid = kafka.pid
    assert pid is not None
    try:
        assert transaction_version(kafka.bootstrap_servers) == 0
        assert "formatted with transaction.version 0" in kafka.description
        assert Path(f"/proc/{pid}").exists()
    finally:
        kafka.stop()
    assert not Path(f"/proc/{pid}").exists()
    assert not kafka.folder.exists()
    kafka.stop()  # idempotent
