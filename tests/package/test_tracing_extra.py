"""Tracing is an optional extra: without OpenTelemetry installed the package, the
producer and ``kafka_txn.tracing`` import and run, and only asking for tracing raises an
ImportError naming ``kafka-txn[otel]``; with it installed, nothing imports OpenTelemetry
until tracing is asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

_SCRIPT = textwrap.dedent(
    """
    import json, sys

    class NoOtel:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "opentelemetry":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    if sys.argv[1] == "blocked":
        sys.meta_path.insert(0, NoOtel())
    report = {}
    import kafka_txn.tracing
    from kafka_txn import TransactionalProducer
    from kafka_txn._extras import installed
    producer = TransactionalProducer({"transactional.id": "t", "bootstrap.servers": "127.0.0.1:1"})
    producer.close()
    report["installed"] = installed("otel")
    report["loaded"] = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
    try:
        kafka_txn.tracing.Tracing()
    except ImportError as exc:
        report["error"] = [type(exc).__name__, exc.name, str(exc)]
    else:
        report["error"] = None
    print(json.dumps(report))
    """
)


def _run(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_opentelemetry_only_tracing_names_the_extra() -> None:
    """OpenTelemetry missing: the producer works untraced, ``installed("otel")`` is
    False, and ``Tracing()`` raises ModuleNotFoundError with ``pip install
    'kafka-txn[otel]'``."""
    report = _run("blocked")
    assert report["installed"] is False
    assert report["loaded"] == []
    kind, name, message = report["error"]
    assert kind == "ModuleNotFoundError"
    assert name.startswith("opentelemetry")
    assert "pip install 'kafka-txn[otel]'" in message


def test_an_untraced_producer_never_imports_opentelemetry() -> None:
    """OpenTelemetry installed: a producer built without ``tracing=`` imports none of it
    (tracing is opt-in); ``Tracing()`` then works."""
    report = _run("installed")
    assert report["installed"] is True
    assert report["loaded"] == []
    assert report["error"] is None
