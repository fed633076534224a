"""The library is silent unless logging is configured (docs/guide/operations.md, "Logging"):
a NullHandler on the ``kafka_txn`` logger keeps Python's last-resort handler from printing
the library's warnings to stderr, and configured logging still receives them.

The warning used is the one an operator meets first: librdkafka's "Connection refused"
lines, forwarded to ``kafka_txn.librdkafka`` while a producer cannot reach its broker.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import kafka_txn  # noqa: F401 - importing the package installs the handler

ROOT = Path(__file__).resolve().parent.parent.parent

# A producer pointed at a loopback port nobody listens on (held bound, never listening, so
# that connecting is refused and no other process can take it). init_transactions() gives
# up after its timeout; librdkafka has logged its connection failures by then.
_SCRIPT = """
import logging, sys
if sys.argv[2] == "configured":
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
from kafka_txn import KafkaTxnError, TransactionalProducer
producer = TransactionalProducer(
    {"bootstrap.servers": sys.argv[1], "transactional.id": "silent-unless-configured"}
)
try:
    producer.init_transactions(timeout=2)
except KafkaTxnError as exc:
    print("init_transactions raised", type(exc).__name__)
producer.close()
"""


def _run(logging_mode: str) -> subprocess.CompletedProcess[str]:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{closed.getsockname()[1]}"
        # -W ignore: warnings.warn() output (not logging) is not what this test is about.
        return subprocess.run(
            [sys.executable, "-W", "ignore", "-c", _SCRIPT, bootstrap, logging_mode],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def test_nothing_reaches_stderr_when_logging_is_not_configured() -> None:
    result = _run("unconfigured")
    assert result.returncode == 0, result.stderr
    assert "init_transactions raised" in result.stdout
    assert result.stderr == ""


def test_configured_logging_receives_the_library_warnings() -> None:
    result = _run("configured")
    assert result.returncode == 0, result.stderr
    assert "init_transactions raised" in result.stdout
    lines = [line for line in result.stderr.splitlines() if "Connection refused" in line]
    assert lines, result.stderr
    assert all(line.startswith("kafka_txn.librdkafka ") for line in lines), lines


def test_the_package_logger_has_a_null_handler_and_still_propagates() -> None:
    logger = logging.getLogger("kafka_txn")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert logger.propagate
