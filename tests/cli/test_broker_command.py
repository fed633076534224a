"""``kafka-txn broker`` as a user runs it: the installed console script in a subprocess,
its printed address used by kafka_txn's producer and checked with kafka-python's
read_committed consumer, then stopped by a signal. Every command a test starts, and the
broker it printed the PID of, the test stops by PID, whatever the test's outcome."""

from __future__ import annotations

import importlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_txn import TransactionalProducer
from kafka_txn.cli.broker import MARKER
from tests.support.apache_kafka import require_java_and_maven
from tests.support.rig import Broker

EXE = shutil.which("kafka-txn") or str(Path(sys.executable).parent / "kafka-txn")
READY_S = 180.0
"""The bound on the wait for the address (Apache Kafka: Maven, the JVM, the format)."""
GONE_S = 60.0
"""The bound on the command's and the broker's exit after a signal."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, timeout: float = GONE_S) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs after {timeout:g}s"
        time.sleep(0.1)


class _Command:
    """One ``kafka-txn broker`` subprocess: its printed ``key=value`` lines, and its stop."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [EXE, "broker", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.printed: dict[str, str] = {}

    def wait_ready(self) -> dict[str, str]:
        """The lines printed up to ``bootstrap.servers=``, as a dict. (Read by a thread:
        a text stream's buffer hides lines from a select() on its descriptor.)"""
        stdout = self.proc.stdout
        assert stdout is not None
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            for line in stdout:
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + READY_S
        while "bootstrap.servers" not in self.printed:
            assert time.monotonic() < deadline, f"no address in {READY_S:g}s"
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert self.proc.poll() is None, self._failure()
                continue
            key, sep, value = line.strip().partition("=")
            assert sep, f"not a key=value line: {line!r}"
            self.printed[key] = value
        return self.printed

    def _failure(self) -> str:
        self.proc.wait(timeout=GONE_S)
        assert self.proc.stderr is not None
        return f"exited with {self.proc.returncode}: {self.proc.stderr.read()}"

    def stop(self, sig: signal.Signals) -> int:
        """Send ``sig``; the exit code once the command has exited."""
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=GONE_S)

    def clean_up(self) -> None:
        """Whatever the test left: the command and the broker stopped by PID."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=GONE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=GONE_S)
        pid = self.printed.get("pid")
        if pid and _alive(int(pid)):
            os.kill(int(pid), signal.SIGKILL)
            _wait_gone(int(pid))
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def command() -> Iterator[type[_Command]]:
    """Starts commands; at the end stops each one, and its broker, by PID."""
    started: list[_Command] = []

    class Tracked(_Command):
        def __init__(self, *args: str) -> None:
            super().__init__(*args)
            started.append(self)

    yield Tracked
    for each in started:
        each.clean_up()


def _commit_one(bootstrap: str, topic: str, value: bytes) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(60)
    conf = {"bootstrap.servers": bootstrap, "transactional.id": f"broker-command-{topic}"}
    with TransactionalProducer(conf) as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.produce(topic, value, key=b"k")


def _serves_a_transaction_then_stops(command: type[_Command], kind: str, sig: signal.Signals):
    port = _free_port()
    cmd = command("--kind", kind, "--port", str(port))
    printed = cmd.wait_ready()
    assert printed["bootstrap.servers"] == f"127.0.0.1:{port}"
    assert printed["kind"] == kind
    assert printed["version"]
    broker_pid, folder = int(printed["pid"]), Path(printed["data-dir"])
    assert _alive(broker_pid)
    assert folder.is_dir()

    topic = f"broker-command-{uuid.uuid4().hex[:8]}"
    _commit_one(printed["bootstrap.servers"], topic, b"committed")
    seen = Broker(printed["bootstrap.servers"], kind).read_committed(topic, 1)
    assert seen == [(b"k", b"committed")]

    assert cmd.stop(sig) == 0
    _wait_gone(broker_pid, 1.0)  # the command waited for it
    assert not folder.exists()
    return printed


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_noida_broker_serves_a_transaction_and_stops_on_a_signal(
    command: type[_Command], sig: signal.Signals
) -> None:
    """--kind noida on a given port prints its address; a transaction committed there is
    seen by read_committed; SIGINT or SIGTERM ends the command with 0 once the broker's
    PID is gone and its temporary folder deleted."""
    _serves_a_transaction_then_stops(command, "noida", sig)


def test_apache_kafka_broker_serves_a_transaction_and_stops_on_sigint(
    command: type[_Command],
) -> None:
    """--kind apache-kafka: the same, on Apache Kafka formatted with transaction.version 2."""
    require_java_and_maven()
    printed = _serves_a_transaction_then_stops(command, "apache-kafka", signal.SIGINT)
    assert printed["transaction.version"] == "2"


def test_a_taken_port_fails_at_once_naming_the_fix(command: type[_Command]) -> None:
    """A port something listens on fails before any broker starts (no Maven, no JVM), in
    seconds, with exit code 1 and one line naming --port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        cmd = command("--port", str(port))
        code = cmd.proc.wait(timeout=30)
        elapsed = time.monotonic() - started
        assert cmd.proc.stderr is not None
        err = cmd.proc.stderr.read()
    assert code == 1
    assert f"port {port} on 127.0.0.1 is taken" in err
    assert "--port" in err
    assert len(err.strip().splitlines()) == 1, err
    assert elapsed < 10


def test_data_dir_keeps_a_committed_record_across_runs(
    command: type[_Command], tmp_path: Path
) -> None:
    """With --data-dir, a record committed in one run is read back after the broker was
    stopped and started again (Apache Kafka, same folder); the folder is kept."""
    require_java_and_maven()
    data = tmp_path / "broker"
    topic = f"broker-command-{uuid.uuid4().hex[:8]}"

    first = command("--kind", "apache-kafka", "--port", str(_free_port()), "--data-dir", str(data))
    printed = first.wait_ready()
    assert Path(printed["data-dir"]) == data
    _commit_one(printed["bootstrap.servers"], topic, b"kept")
    assert first.stop(signal.SIGINT) == 0
    assert (data / MARKER).is_file()

    # no --kind: the folder's kind
    second = command("--port", str(_free_port()), "--data-dir", str(data))
    printed = second.wait_ready()
    assert printed["kind"] == "apache-kafka"
    seen = Broker(printed["bootstrap.servers"], "apache-kafka").read_committed(topic, 1)
    assert seen == [(b"k", b"kept")]
    assert second.stop(signal.SIGTERM) == 0
    assert data.is_dir()


def test_a_data_dir_of_another_kind_or_foreign_content_is_refused(
    command: type[_Command], tmp_path: Path
) -> None:
    """A --data-dir made for another kind, or a non-empty folder the command did not make,
    is a usage error (exit 2) naming the fix; nothing starts."""
    made = tmp_path / "made"
    made.mkdir()
    (made / MARKER).write_text("kind=noida\n")
    cmd = command("--kind", "apache-kafka", "--data-dir", str(made), "--port", str(_free_port()))
    assert cmd.proc.wait(timeout=30) == 2
    assert cmd.proc.stderr is not None
    assert "run with --kind noida" in cmd.proc.stderr.read()

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    cmd = command("--data-dir", str(foreign), "--port", str(_free_port()))
    assert cmd.proc.wait(timeout=30) == 2
    assert cmd.proc.stderr is not None
    assert "give a new or empty folder" in cmd.proc.stderr.read()
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_broker_stops_when_the_command_is_killed(
    command: type[_Command], tmp_path: Path
) -> None:
    """SIGKILL of the command (no clean-up of its own): the kernel signals the broker
    (PR_SET_PDEATHSIG), which exits."""
    data = tmp_path / "broker"
    cmd = command("--kind", "noida", "--port", str(_free_port()), "--data-dir", str(data))
    printed = cmd.wait_ready()
    broker_pid = int(printed["pid"])
    cmd.stop(signal.SIGKILL)
    _wait_gone(broker_pid)


def test_the_apache_kafka_pom_is_package_data() -> None:
    """The Maven pom the broker's classpath is resolved from ships inside the package."""
    pom = resources.files("kafka_txn.cli").joinpath("apache_kafka.pom.xml")
    assert "<artifactId>kafka_2.13</artifactId>" in pom.read_text()


@pytest.mark.parametrize(
    "module", ["consume_process_produce", "dual_write_postgres", "spark_streaming_sink"]
)
def test_examples_default_to_the_address_the_broker_serves(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each example's --bootstrap-servers defaults to KAFKA_BOOTSTRAP_SERVERS, else to
    127.0.0.1:9092, the default address of ``kafka-txn broker``."""
    example = importlib.import_module(f"examples.{module}")
    required = {
        "consume_process_produce": ["--input-topic", "in", "--output-topic", "out",
                                    "--group", "g", "--transactional-id", "t"],
        "dual_write_postgres": ["--jdbc-url", "jdbc:sqlite:x.db", "--topic", "t"],
        "spark_streaming_sink": ["--jdbc-url", "jdbc:sqlite:x.db", "--input", "i",
                                 "--checkpoint", "c"],
    }[module]  # fmt: skip
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    assert example.parse_args(required).bootstrap_servers == "127.0.0.1:9092"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker-1:9093")
    assert example.parse_args(required).bootstrap_servers == "broker-1:9093"
    given = example.parse_args([*required, "--bootstrap-servers", "b:1"])
    assert given.bootstrap_servers == "b:1"
