"""``LocalBroker``: the noida-db broker from PyPI, started on loopback for ``kafka-txn demo``
and for the test rig. Private: not part of the public runtime API (``kafka_txn.testing``
holds the test helpers users may build on); noida-db comes with the ``demo`` extra
(``pip install 'kafka-txn[demo]'``) and the ``test`` extra."""

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

__all__ = ["LocalBroker"]


class LocalBroker:
    """The noida-db broker from PyPI (``pip install 'kafka-txn[demo]'``), Kafka service
    only, on 127.0.0.1 and a free port, in a temporary data folder. Its binary is started
    directly, not through its Python wrapper, so that the PID we hold is the server's."""

    START_TIMEOUT_S = 60.0

    def __init__(self) -> None:
        try:
            version = metadata.version("noida-db")
            binary = Path(str(resources.files("noida_db").joinpath("noida-db")))
        except (metadata.PackageNotFoundError, ModuleNotFoundError):
            raise RuntimeError(
                "no local broker: pip install 'kafka-txn[demo]' (noida-db), or name a "
                "broker with --bootstrap-servers"
            ) from None
        binary.chmod(0o755)
        self._data = Path(tempfile.mkdtemp(prefix="kafka-txn-broker-"))
        port = _free_port()
        self.bootstrap_servers = f"127.0.0.1:{port}"
        self.description = f"local noida-db {version}"
        log_path = self._data / "broker.log"
        with log_path.open("wb") as log_file:
            self._proc = subprocess.Popen(
                [str(binary), "start", "--data-dir", str(self._data / "data"),
                 "--host", "127.0.0.1", "--only", "kafka", "--kafka-port", str(port)],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.description += f" (pid {self._proc.pid})"
        try:
            self._wait_ready(log_path)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, log_path: Path) -> None:
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                output = log_path.read_text(errors="replace")
                raise RuntimeError(f"the broker exited with {self._proc.returncode}:\n{output}")
            try:
                AdminClient({"bootstrap.servers": self.bootstrap_servers}).list_topics(timeout=2)
                return
            except confluent_kafka.KafkaException:
                time.sleep(0.2)
        raise RuntimeError(f"broker at {self.bootstrap_servers} not ready in time")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and delete its data; idempotent."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        shutil.rmtree(self._data, ignore_errors=True)

    def __enter__(self) -> LocalBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
