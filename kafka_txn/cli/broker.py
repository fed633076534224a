"""``kafka-txn broker``: a local Kafka broker for an application, in the foreground until
Ctrl-C (SIGINT) or SIGTERM.

Apache Kafka (``kafka_txn.cli.apache_kafka``: a single KRaft broker+controller formatted
with ``transaction.version=2``, from Maven artifacts) when ``java`` and ``mvn`` are on
PATH, else noida-db (``kafka_txn.cli.local_broker``, the ``demo`` extra); ``--kind``
forces one, and a ``--data-dir`` made by an earlier run keeps the kind it was made with.
Once the broker answers, stdout gets ``key=value`` lines, ``bootstrap.servers=HOST:PORT``
last, for a script to wait for. The broker runs in its own process group, so that a
Ctrl-C at the terminal reaches this command, which stops the broker by its PID (SIGTERM,
SIGKILL after a bound) and waits for it; on Linux the kernel also sends the broker SIGTERM
if this command dies without stopping it (``kafka_txn.cli.children``).
"""

from __future__ import annotations

import errno
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Protocol

from kafka_txn.cli.exits import EXIT_FAILED, EXIT_OK, CommandError, UsageError

__all__ = ["DEFAULT_PORT", "KINDS", "MARKER", "run_broker"]

KINDS = ("apache-kafka", "noida")
DEFAULT_PORT = 9092
MARKER = "kafka-txn-broker.properties"
"""The file a ``--data-dir`` gets on its first run: the broker kind, and for Apache Kafka
the controller port its KRaft quorum was formatted with (reused, so the recorded voter
endpoint stays right)."""

_WILDCARDS = ("0.0.0.0", "")
_POLL_S = 0.5


class _Broker(Protocol):
    bootstrap_servers: str

    @property
    def pid(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def stop(self) -> None: ...


class _Stopped(BaseException):
    """SIGINT or SIGTERM reached the command: stop the broker and exit 0."""


def run_broker(kind: str | None, *, listen: str, port: int, data_dir: str | None) -> int:
    """Run the broker until SIGINT or SIGTERM; the exit code (0 once it has stopped)."""
    folder = _data_dir(data_dir)
    marker = _read_marker(folder) if folder is not None else {}
    kind = _choose_kind(kind, marker.get("kind"), folder)
    _check_port(listen, port)
    advertised = socket.getfqdn() if listen in _WILDCARDS else listen
    with _signals_stop():
        broker: _Broker | None = None
        try:
            if kind == "apache-kafka":
                broker, lines = _start_apache_kafka(listen, advertised, port, folder, marker)
            else:
                broker, lines = _start_noida(listen, advertised, port, folder)
            for key, value in lines:
                print(f"{key}={value}")
            print(f"bootstrap.servers={broker.bootstrap_servers}", flush=True)
            _say(f"{kind} broker ready at {broker.bootstrap_servers}; Ctrl-C stops it")
            while (code := broker.poll()) is None:
                time.sleep(_POLL_S)
            raise CommandError(
                EXIT_FAILED, f"the broker (pid {broker.pid}) exited by itself with code {code}"
            )
        except _Stopped:
            if broker is not None:
                _say("stopping the broker")
            return EXIT_OK
        finally:
            if broker is not None:
                broker.stop()


def _start_apache_kafka(
    listen: str, advertised: str, port: int, folder: Path | None, marker: dict[str, str]
) -> tuple[_Broker, list[tuple[str, str]]]:
    from kafka_txn.cli.apache_kafka import ApacheKafka, free_port, java_and_maven  # noqa: PLC0415

    if not java_and_maven():
        raise CommandError(
            EXIT_FAILED,
            "--kind apache-kafka needs java (17 or later) and mvn on PATH (Debian: apt-get "
            "install openjdk-17-jre-headless maven), or use --kind noida",
        )
    controller_port = int(marker.get("controller.port", 0)) or free_port()
    server = ApacheKafka(
        transaction_version=2, host=listen, advertised_host=advertised, port=port,
        controller_port=controller_port, folder=folder, die_with_parent=True,
    )  # fmt: skip
    if folder is not None:
        _write_marker(folder, {"kind": "apache-kafka", "controller.port": str(controller_port)})
    _say(f"starting Apache Kafka {server.version} in {server.folder}")
    try:
        server.start()
    except BaseException:  # a signal while Maven resolves: the temporary folder goes too
        server.stop()
        raise
    return server, [
        ("kind", "apache-kafka"),
        ("version", server.version),
        ("transaction.version", "2"),
        ("pid", str(server.pid)),
        ("data-dir", str(server.folder)),
    ]


def _start_noida(
    listen: str, advertised: str, port: int, folder: Path | None
) -> tuple[_Broker, list[tuple[str, str]]]:
    from kafka_txn.cli.local_broker import LocalBroker  # noqa: PLC0415

    if folder is not None:
        _write_marker(folder, {"kind": "noida"})
    try:
        server = LocalBroker(
            host=listen, advertised_host=advertised, port=port, folder=folder,
            die_with_parent=True,
        )  # fmt: skip
    except RuntimeError as exc:
        if "pip install" in str(exc):  # noida-db is not installed
            raise CommandError(
                EXIT_FAILED,
                "no broker to run: install Java 17+ and Maven (java and mvn on PATH) for "
                "Apache Kafka, or pip install 'kafka-txn[demo]' for noida-db",
            ) from exc
        raise
    return server, [
        ("kind", "noida"),
        ("version", server.version),
        ("pid", str(server.pid)),
        ("data-dir", str(server.folder)),
    ]


def _choose_kind(asked: str | None, recorded: str | None, folder: Path | None) -> str:
    if recorded is not None and asked is not None and asked != recorded:
        raise UsageError(
            f"--data-dir {folder} holds a {recorded} broker's data: run with --kind "
            f"{recorded}, or give another --data-dir"
        )
    if asked is not None:
        return asked
    if recorded is not None:
        return recorded
    from kafka_txn.cli.apache_kafka import java_and_maven  # noqa: PLC0415

    return "apache-kafka" if java_and_maven() else "noida"


def _data_dir(given: str | None) -> Path | None:
    if given is None:
        return None
    folder = Path(given).expanduser().resolve()
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--data-dir {folder} is a file: give a folder")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / MARKER).is_file():
        raise UsageError(
            f"--data-dir {folder} is not empty and was not made by kafka-txn broker "
            f"(no {MARKER}): give a new or empty folder"
        )
    return folder


def _read_marker(folder: Path) -> dict[str, str]:
    path = folder / MARKER
    if not path.is_file():
        return {}
    entries = (line.partition("=") for line in path.read_text().splitlines())
    return {key.strip(): value.strip() for key, sep, value in entries if sep}


def _write_marker(folder: Path, entries: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text("".join(f"{k}={v}\n" for k, v in entries.items()))


def _check_port(listen: str, port: int) -> None:
    """Fail at once when the port is taken, before anything starts. SO_REUSEADDR, as the
    broker's own listener has: only a listening socket makes the port taken, not the
    TIME_WAIT connections a broker stopped a moment ago leaves."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((listen, port))
        except socket.gaierror as exc:
            raise UsageError(f"--listen {listen}: not an address or host name ({exc})") from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CommandError(
                    EXIT_FAILED,
                    f"port {port} on {listen} is taken (another broker? `ss -ltnp "
                    f"'sport = :{port}'` shows what listens): stop it, or pick a free port "
                    "with --port",
                ) from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UsageError(
                    f"--listen {listen} is not an address of this machine: give one of its "
                    "IPv4 addresses (127.0.0.1, the default, or 0.0.0.0 for all)"
                ) from None
            raise CommandError(
                EXIT_FAILED, f"cannot listen on {listen}:{port}: {exc.strerror}"
            ) from None


@contextmanager
def _signals_stop() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``_Stopped`` once; later ones are ignored until the
    broker has stopped (its stop is bounded), so that a second Ctrl-C cannot cut the stop
    short and leave the broker behind."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def stop(signum: int, frame: FrameType | None) -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise _Stopped(signum)

    for sig in previous:
        signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _say(message: str) -> None:
    print(f"kafka-txn broker: {message}", file=sys.stderr, flush=True)
