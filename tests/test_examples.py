"""Every example runs, against the rig's broker, and does what its docstring promises."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest

from examples import consume_process_produce as example
from kafka_txn import FatalError, TransactionalProducer

ROOT = Path(__file__).resolve().parent.parent


def _seed(broker, topic: str, values: list[bytes]) -> None:
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"seed-{topic}"}
    with TransactionalProducer(conf) as p:
        p.init_transactions()
        with p.transaction():
            for i, v in enumerate(values):
                p.produce(topic, v, key=b"%d" % i)


def _args(broker, source, sink, group, *extra: str):
    return example.parse_args(
        [
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--input-topic",
            source,
            "--output-topic",
            sink,
            "--group",
            group,
            "--transactional-id",
            f"{group}-0",
            "--batch-size",
            "20",
            *extra,
        ]
    )


def test_consume_process_produce_is_exactly_once_under_injected_failure(broker):
    source = broker.create_topic(partitions=3)
    sink = broker.create_topic(partitions=3)
    inputs = [b"v%03d" % i for i in range(300)]
    _seed(broker, source, inputs)

    group = f"g-{uuid.uuid4().hex[:8]}"
    written = example.run(
        _args(broker, source, sink, group, "--idle-timeout", "3", "--fail-once-at", "77")
    )
    assert written == len(inputs)
    output = Counter(v for _, v in broker.read_committed(sink, expected=len(inputs)))
    assert output == Counter(v.upper() for v in inputs)


def test_consume_process_produce_stops_on_fatal_error(broker):
    source = broker.create_topic(partitions=1)
    sink = broker.create_topic(partitions=1)
    _seed(broker, source, [b"first"])
    group = f"g-{uuid.uuid4().hex[:8]}"
    outcome: list[BaseException | int] = []

    def target() -> None:
        try:
            outcome.append(example.run(_args(broker, source, sink, group, "--idle-timeout", "30")))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    assert broker.read_committed(sink, expected=1) == [(b"0", b"FIRST")]

    # A second instance with the same transactional.id fences the running one.
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{group}-0"}
    with TransactionalProducer(conf) as usurper:
        usurper.init_transactions()
        _seed(broker, source, [b"second"])
        worker.join(timeout=60)
    assert not worker.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], FatalError), outcome


def test_main_job_verifies_exactly_once(broker):
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "demo.py"),
            "--records",
            "300",
            "--fail-once-at",
            "120",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "VERIFIED: exactly once" in done.stdout
    assert "missing: 0, duplicated: 0, group offsets committed: 300/300" in done.stdout


@pytest.mark.parametrize("argv", [[], ["--bootstrap-servers", "x"]])
def test_example_requires_its_options(argv, capsys):
    with pytest.raises(SystemExit) as info:
        example.parse_args(argv)
    assert info.value.code == 2
    assert "required" in capsys.readouterr().err
