"""``LocalBroker``: the noida-db broker from PyPI, started on loopback for ``kafka-txn demo``,
``kafka-txn broker --kind noida`` and the test rig. Private: not part of the public runtime
API (``kafka_txn.testing`` holds the test helpers users may build on); noida-db comes with
the ``demo`` extra (``pip install 'kafka-txn[demo]'``) and the ``test`` extra."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from importlib import metadata, resources
from pathlib import Path

import confluent_kafka
from confluent_kafka.admin import AdminClient

from kafka_txn.cli import children

__all__ = ["LocalBroker"]


class LocalBroker:
    """The noida-db broker from PyPI (``pip install 'kafka-txn[demo]'``), Kafka service
    only, on 127.0.0.1 and a free port, in a temporary data folder. Its binary is started
    directly, not through its Python wrapper, so that the PID we hold is the server's."""

    START_TIMEOUT_S = 60.0

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        advertised_host: str | None = None,
        port: int | None = None,
        folder: Path | None = None,
        die_with_parent: bool = False,
    ) -> None:
        """Start the broker and wait until it answers Metadata. ``host`` is the address it
        binds, ``advertised_host`` the one clients use (default ``host``), ``port`` its
        Kafka port (None: a free one). ``folder`` holds its data (``folder/data``) and log
        (``folder/broker.log``) and is kept; None: a temporary folder ``stop()`` deletes.
        ``die_with_parent``: on Linux the kernel sends the server SIGTERM when the thread
        that started it dies (``kafka_txn.cli.children``)."""
        try:
            self.version = metadata.version("noida-db")
            binary = Path(str(resources.files("noida_db").joinpath("noida-db")))
        except (metadata.PackageNotFoundError, ModuleNotFoundError):
            raise RuntimeError(
                "no local broker: pip install 'kafka-txn[demo]' (noida-db), or name a "
                "broker with --bootstrap-servers"
            ) from None
        binary.chmod(0o755)
        self.keep_folder = folder is not None
        self._data = folder or Path(tempfile.mkdtemp(prefix="kafka-txn-broker-"))
        self._data.mkdir(parents=True, exist_ok=True)
        port = port or _free_port()
        self.bootstrap_servers = f"{advertised_host or host}:{port}"
        self.description = f"local noida-db {self.version}"
        log_path = self._data / "broker.log"
        with log_path.open("ab") as log_file:
            self._proc = subprocess.Popen(
                [str(binary), "start", "--data-dir", str(self._data / "data"),
                 "--host", host, "--only", "kafka", "--kafka-port", str(port)],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=children.die_with_parent() if die_with_parent else None,  # noqa: PLW1509
            )  # fmt: skip
        self.description += f" (pid {self._proc.pid})"
        try:
            self._wait_ready(log_path)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self._proc.pid

    def poll(self) -> int | None:
        """The server's exit code; None while it runs."""
        return self._proc.poll()

    @property
    def folder(self) -> Path:
        """Where its data and log are."""
        return self._data

    def _wait_ready(self, log_path: Path) -> None:
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                output = log_path.read_text(errors="replace")
                raise RuntimeError(f"the broker exited with {self._proc.returncode}:\n{output}")
            try:
                # log_level 0: no "connection refused" lines on stderr while it starts
                admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
                admin.list_topics(timeout=2)
                return
            except confluent_kafka.KafkaException:
                time.sleep(0.2)
        raise RuntimeError(f"broker at {self.bootstrap_servers} not ready in time")

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, SIGKILL after ten seconds) and delete its
        folder unless it was given; idempotent."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        if not self.keep_folder:
            shutil.rmtree(self._data, ignore_errors=True)

    def __enter__(self) -> LocalBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
