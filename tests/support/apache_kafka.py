"""Apache Kafka for the test rig: a combined broker+controller (KRaft, no ZooKeeper) run
from Apache Kafka's own Maven artifacts, on free loopback ports, stopped by its PID.

Maven resolves the pinned version (tests/support/apache_kafka_pom/pom.xml, ``-Dkafka.version``)
into its local repository and gives the classpath; nothing is downloaded by hand. The log
directory is formatted with ``kafka.tools.StorageTool format --standalone`` (KIP-853's
dynamic quorum of one voter), with the ``transaction.version`` feature asked for, so that
a cluster of transaction version 1 is a 4.x broker formatted with
``--feature transaction.version=0`` (the version ``TransactionVersion.TV_0``/``TV_1``
clients then use: KIP-890's second part needs ``transaction.version=2``).

Used three ways: as the session's broker (``tests/support/rig.py``), as a broker a test starts
for itself with the settings it needs (short transaction timeouts and expirations, an
authorizer and SASL/SCRAM, a restart between two transactions), and by the benchmarks.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

ROOT = Path(__file__).resolve().parent.parent.parent
POM = ROOT / "tests" / "support" / "apache_kafka_pom" / "pom.xml"

#: The Apache Kafka the suite runs on unless KAFKA_TXN_KAFKA_VERSION names another.
KAFKA_VERSION = "4.4.0"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0

# Settings every broker of the rig gets: one replica of the internal topics (one broker),
# no initial rebalance delay, a frequent check for timed-out transactions, and few
# partitions of the internal topics (their creation on first use is what the first
# transactional producer waits for). Everything else is Apache Kafka's default, so that
# tests meet what users run.
_BASE_PROPERTIES = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "5",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # A transaction past its transaction.timeout.ms is aborted within a second, not ten:
    # tests that let the coordinator time one out wait less (the timeouts are unchanged).
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
}

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


class MavenError(RuntimeError):
    """Maven could not give Apache Kafka's classpath."""


def java_and_maven() -> bool:
    """Whether this machine can run Apache Kafka from Maven: ``java`` and ``mvn`` on PATH."""
    return shutil.which("java") is not None and shutil.which("mvn") is not None


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


@cache
def classpath(version: str = KAFKA_VERSION) -> str:
    """Apache Kafka ``version``'s classpath, resolved by Maven (cached in its local
    repository: the first call of a machine downloads, later ones read the cache)."""
    with tempfile.NamedTemporaryFile("r", suffix=".classpath") as out:
        command = [
            "mvn", "-B", "-q", "-f", str(POM), f"-Dkafka.version={version}",
            "dependency:build-classpath", f"-Dmdep.outputFile={out.name}",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise MavenError(
                f"Maven could not resolve Apache Kafka {version} ({' '.join(command)}):\n"
                f"{done.stdout[-3000:]}{done.stderr[-2000:]}"
            )
        return out.read().strip()


def new_cluster_id() -> str:
    """Kafka's Uuid.randomUuid().toString(): URL-safe base64 of 16 random bytes. One that
    starts with "-" would be read by StorageTool as an option: drawn again."""
    cluster_id = "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    return cluster_id


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def warm_up(client_config: Mapping[str, Any]) -> None:
    """Create and load the internal topics a long-running cluster already has: the
    transaction log (a transactional producer's InitProducerId) and the offsets topic
    (OffsetFetch of a group), so that the first test meets a cluster as users run it,
    not one creating ``__consumer_offsets`` under it. (librdkafka's consumer gives up
    on a committed-offset fetch answered NOT_COORDINATOR while that topic loads, and
    then never fetches an assigned partition.)"""
    from confluent_kafka import Consumer, Producer, TopicPartition

    config = {**client_config, "log_level": 0}
    producer = Producer({**config, "transactional.id": "kafka-txn-rig-warm-up"})
    producer.init_transactions(START_TIMEOUT_S)
    producer.flush(0)
    consumer = Consumer({**config, "group.id": "kafka-txn-rig-warm-up"})
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:  # OffsetFetch: answered once the group's coordinator has loaded
                consumer.committed([TopicPartition("kafka-txn-rig-warm-up", 0)], timeout=10)
                return
            except KafkaException:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()


class ApacheKafka:
    """One Apache Kafka broker+controller on 127.0.0.1, in a temporary folder.

    ``transaction_version`` is the ``transaction.version`` feature the log directory is
    formatted with (None: the release's default, 2 on 4.x). ``properties`` add to or
    replace server.properties entries (short timeouts, an authorizer, ...);
    ``listener_protocol`` is the security protocol of the client listener (``SASL_PLAINTEXT``
    with ``properties`` naming the mechanisms, and ``format_args`` adding
    ``--add-scram`` credentials). ``heap`` is the JVM's -Xmx.

    ``start()`` returns once the broker answers Metadata and (``warm_up``) its transaction
    log and offsets topic are created and loaded; ``stop()`` ends the process by
    its PID (SIGTERM, a controlled shutdown, then SIGKILL) and deletes the folder;
    ``restart()`` stops and starts the same broker on the same ports and data, as an
    operator's rolling restart does; ``kill()`` is a crash (SIGKILL), data kept.
    """

    def __init__(
        self,
        version: str | None = None,
        *,
        transaction_version: int | None = None,
        properties: Mapping[str, str] | None = None,
        listener_protocol: str = "PLAINTEXT",
        format_args: Iterable[str] = (),
        heap: str = "512m",
        warm_up: bool = True,
    ) -> None:
        self.version = version or os.environ.get("KAFKA_TXN_KAFKA_VERSION") or KAFKA_VERSION
        self.transaction_version = transaction_version
        self.folder = Path(tempfile.mkdtemp(prefix="kafka-txn-apache-kafka-"))
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        self.listener_protocol = listener_protocol
        self._format_args = list(format_args)
        self._heap = heap
        self.warm_up = warm_up
        self.cluster_id: str | None = None
        """The cluster id to format with (None: a new one); the nodes of a cluster share one."""
        self.standalone = True
        """Format as KIP-853's dynamic quorum of this one controller (``--standalone``);
        False for a broker-only node of a cluster, whose controllers run elsewhere."""
        self._proc: subprocess.Popen[bytes] | None = None
        self.properties = {
            **_BASE_PROPERTIES,
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "listener.security.protocol.map": (
                f"PLAINTEXT:{listener_protocol},CONTROLLER:PLAINTEXT"
            ),
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "log.dirs": str(self.folder / "data"),
            **(properties or {}),
        }

    # -- what it is ----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def log(self) -> Path:
        """The broker's own log (log4j2, INFO)."""
        return self.folder / "server.log"

    @property
    def description(self) -> str:
        tv = "default" if self.transaction_version is None else str(self.transaction_version)
        return (
            f"Apache Kafka {self.version} (KRaft broker+controller, pid {self.pid}, "
            f"formatted with transaction.version {tv})"
        )

    def log_tail(self, lines: int = 60) -> str:
        for path in (self.log, self.folder / "stdout.log"):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                if text:
                    return f"{path}:\n" + "\n".join(text)
        return "(no broker log)"

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> ApacheKafka:
        """Format the log directory (first start only), start the broker, and wait until
        it answers."""
        self.launch()
        try:
            self._wait_ready()
            if self.warm_up:
                self._warm_up()
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> None:
        """Format the log directory (first start only) and start the process, without
        waiting for it: the nodes of a cluster start together, as none of them is ready
        before a quorum of controllers is (``start()`` waits)."""
        cp = classpath(self.version)
        config = self.folder / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties.items()))
        (self.folder / "log4j2.properties").write_text(_LOG4J2.format(log=self.log))
        if not (self.folder / "data" / "meta.properties").exists():
            self._format(cp, config)
        stdout = (self.folder / "stdout.log").open("ab")
        with stdout:
            self._proc = subprocess.Popen(
                [*self._java(cp), "kafka.Kafka", str(config)],
                stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def _warm_up(self) -> None:
        warm_up(self.admin_config())

    def _java(self, cp: str) -> list[str]:
        return [
            "java", f"-Xmx{self._heap}", "-Xss1m", "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.folder / 'log4j2.properties'}",
            "-cp", cp,
        ]  # fmt: skip

    def _format(self, cp: str, config: Path) -> None:
        cluster_id = self.cluster_id or new_cluster_id()
        features = (
            []
            if self.transaction_version is None
            else ["--feature", f"transaction.version={self.transaction_version}"]
        )
        command = [
            *self._java(cp), "kafka.tools.StorageTool", "format", "-t", cluster_id,
            "-c", str(config), *(["--standalone"] if self.standalone else []), *features,
            *self._format_args,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(
                f"formatting Apache Kafka {self.version}'s log directory failed:\n"
                f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )

    def admin_config(self) -> dict[str, Any]:
        """What a client needs to reach the broker's client listener as its super user
        (PLAINTEXT: only the bootstrap servers)."""
        return {"bootstrap.servers": self.bootstrap_servers}

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"Apache Kafka {self.version} exited with {self._proc.returncode} "
                    f"while starting:\n{self.log_tail()}"
                )
            try:
                # log_level 0: no "connection refused" lines while the JVM starts
                admin = AdminClient({**self.admin_config(), "log_level": 0})
                metadata = admin.list_topics(timeout=2)
                if metadata.brokers:
                    return
            except KafkaException as exc:
                last = exc
            time.sleep(0.2)
        raise RuntimeError(
            f"Apache Kafka at {self.bootstrap_servers} did not answer within "
            f"{START_TIMEOUT_S:g}s ({last}):\n{self.log_tail()}"
        )

    def _end_process(self, sig: signal.Signals) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a paused broker would not act on SIGTERM
        proc.send_signal(sig)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)

    def kill(self) -> None:
        """A crash: SIGKILL, the data kept for ``start()``."""
        self._end_process(signal.SIGKILL)

    def terminate(self) -> None:
        """A controlled shutdown (SIGTERM), the data kept for ``start()``."""
        self._end_process(signal.SIGTERM)

    def pause(self) -> None:
        """An outage with the process kept: SIGSTOP. The broker answers nothing (its
        sockets stay open, so clients time out rather than see a refused connection)
        until ``resume()``; its clocks go on, so transactions it holds may time out."""
        assert self._proc is not None, "the broker is not running"
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """The end of ``pause()``'s outage: SIGCONT."""
        assert self._proc is not None, "the broker is not running"
        self._proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """A clean restart on the same ports and data (SIGTERM: controlled shutdown)."""
        self._end_process(signal.SIGTERM)
        self.start()

    def stop(self) -> None:
        """Stop the broker by its PID and delete its folder; idempotent. With
        ``KAFKA_TXN_BROKER_LOGS`` naming a folder, the broker's log is kept there first
        (CI keeps them, to read a failure the broker explains)."""
        self._end_process(signal.SIGTERM)
        keep = os.environ.get("KAFKA_TXN_BROKER_LOGS")
        if keep and self.log.exists():
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(self.log, Path(keep) / f"{self.folder.name}.log")
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


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
