"""Apache Kafka run locally: a combined broker+controller (KRaft, no ZooKeeper) started from
Apache Kafka's own Maven artifacts, stopped by its PID. ``kafka-txn broker`` runs one for
an application; the test rig (``tests/support/apache_kafka.py``) builds on the same class.

Maven resolves the pinned version (``apache_kafka.pom.xml`` beside this module,
``-Dkafka.version``) into its local repository (``~/.m2``) and gives the classpath; nothing
is downloaded by hand, and nothing here needs Maven until a broker starts. The log
directory is formatted with ``kafka.tools.StorageTool format --standalone`` (KIP-853's
dynamic quorum of one voter), with the ``transaction.version`` feature asked for (None:
the release's default, 2 on 4.x, which KIP-890's second part needs; a 4.x broker
formatted with ``--feature transaction.version=0`` is what clients of transaction
version 1 meet).
"""

from __future__ import annotations

import base64
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from kafka_txn.cli.children import die_with_parent

__all__ = [
    "BASE_PROPERTIES",
    "KAFKA_VERSION",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "ApacheKafka",
    "MavenError",
    "classpath",
    "free_port",
    "java_and_maven",
    "new_cluster_id",
    "warm_up",
]

#: The Apache Kafka version run unless another is named.
KAFKA_VERSION = "4.4.0"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0

BASE_PROPERTIES: Mapping[str, str] = {
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
    # A transaction past its transaction.timeout.ms is aborted within a second, not ten
    # (the timeouts themselves are unchanged).
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
}
"""Settings of every single-node broker: one replica of the internal topics (there is one
broker), no initial rebalance delay, a frequent check for timed-out transactions, and few
partitions of the internal topics (their creation on first use is what the first
transactional producer waits for). Everything else is Apache Kafka's default."""

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


@cache
def classpath(version: str = KAFKA_VERSION) -> str:
    """Apache Kafka ``version``'s classpath, resolved by Maven (cached in its local
    repository: the first call of a machine downloads, later ones read the cache)."""
    pom = resources.files("kafka_txn.cli").joinpath("apache_kafka.pom.xml")
    with (
        resources.as_file(pom) as pom_path,
        tempfile.NamedTemporaryFile("r", suffix=".classpath") as out,
    ):
        command = [
            "mvn", "-B", "-q", "-f", str(pom_path), f"-Dkafka.version={version}",
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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``host`` (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def warm_up(client_config: Mapping[str, Any], name: str = "kafka-txn-warm-up") -> None:
    """Create and load the internal topics a long-running cluster already has: the
    transaction log (a transactional producer's InitProducerId, as transactional id
    ``name``) and the offsets topic (OffsetFetch of group ``name``), so that the first
    client meets a cluster as users run it, not one creating ``__consumer_offsets`` under
    it. (librdkafka's consumer gives up on a committed-offset fetch answered
    NOT_COORDINATOR while that topic loads, and then never fetches an assigned partition.)"""
    from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: PLC0415

    config = {**client_config, "log_level": 0}
    producer = Producer({**config, "transactional.id": name})
    producer.init_transactions(START_TIMEOUT_S)
    producer.flush(0)
    consumer = Consumer({**config, "group.id": name})
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:  # OffsetFetch: answered once the group's coordinator has loaded
                consumer.committed([TopicPartition(name, 0)], timeout=10)
                return
            except KafkaException:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()


_K = TypeVar("_K", bound="ApacheKafka")


class ApacheKafka:
    """One Apache Kafka broker+controller.

    ``host`` is the address the client listener binds and advertises (``advertised_host``
    when clients must use another name, as for a wildcard bind), ``port`` its port (None: a
    free one); the controller listener is always on 127.0.0.1 (``controller_port``, None: a
    free one). ``folder`` holds server.properties, the logs and the data (``folder/data``);
    None: a temporary folder that ``stop()`` deletes. A given folder is kept, and a
    formatted one is started again without formatting.

    ``transaction_version`` is the ``transaction.version`` feature the log directory is
    formatted with (None: the release's default, 2 on 4.x). ``properties`` add to or
    replace server.properties entries (short timeouts, an authorizer, ...);
    ``listener_protocol`` is the security protocol of the client listener (``SASL_PLAINTEXT``
    with ``properties`` naming the mechanisms, and ``format_args`` adding
    ``--add-scram`` credentials). ``heap`` is the JVM's -Xmx. ``die_with_parent``: on Linux
    the kernel sends the broker SIGTERM when the thread that started it dies
    (``kafka_txn.cli.children``).

    ``start()`` returns once the broker answers Metadata and (``warm_up``) its transaction
    log and offsets topic are created and loaded; ``stop()`` ends the process by
    its PID (SIGTERM, a controlled shutdown, then SIGKILL after ``STOP_TIMEOUT_S``) and
    deletes a temporary folder; ``restart()`` stops and starts the same broker on the same
    ports and data, as an operator's rolling restart does; ``kill()`` is a crash (SIGKILL),
    data kept.
    """

    warm_up_name = "kafka-txn-warm-up"
    """The transactional id and group ``start()`` warms the internal topics up with."""

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
        host: str = "127.0.0.1",
        advertised_host: str | None = None,
        port: int | None = None,
        controller_port: int | None = None,
        folder: Path | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.version = version or KAFKA_VERSION
        self.transaction_version = transaction_version
        self.keep_folder = folder is not None
        self.folder = folder or Path(tempfile.mkdtemp(prefix="kafka-txn-apache-kafka-"))
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        advertised = advertised_host or host
        self.bootstrap_servers = f"{advertised}:{self.port}"
        self.listener_protocol = listener_protocol
        self._format_args = list(format_args)
        self._heap = heap
        self.warm_up = warm_up
        self._die_with_parent = die_with_parent
        self.cluster_id: str | None = None
        """The cluster id to format with (None: a new one); the nodes of a cluster share one."""
        self.standalone = True
        """Format as KIP-853's dynamic quorum of this one controller (``--standalone``);
        False for a broker-only node of a cluster, whose controllers run elsewhere."""
        self._proc: subprocess.Popen[bytes] | None = None
        self.properties = {
            **BASE_PROPERTIES,
            "listeners": (
                f"PLAINTEXT://{host}:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{advertised}:{self.port}",
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

    def poll(self) -> int | None:
        """The broker process's exit code; None while it runs or before it started."""
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, lines: int = 60) -> str:
        for path in (self.log, self.folder / "stdout.log"):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                if text:
                    return f"{path}:\n" + "\n".join(text)
        return "(no broker log)"

    # -- life cycle ----------------------------------------------------------------------

    def start(self: _K) -> _K:
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
        self.folder.mkdir(parents=True, exist_ok=True)
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
                preexec_fn=die_with_parent() if self._die_with_parent else None,  # noqa: PLW1509
            )  # fmt: skip

    def _warm_up(self) -> None:
        warm_up(self.admin_config(), self.warm_up_name)

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
        """Stop the broker by its PID (SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``) and
        delete its folder unless it was given; idempotent."""
        self._end_process(signal.SIGTERM)
        if not self.keep_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self: _K) -> _K:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
