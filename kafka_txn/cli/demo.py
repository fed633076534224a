"""``kafka-txn demo``: the main job. Dual writes (SQLite + Kafka) in child processes that
are SIGKILLed at random steps of the recipe; each next process recovers what the last one
left; at the end the database rows and what a read_committed consumer sees must be the
same records, each once.

Also the child's entry point: ``python -m kafka_txn.cli.demo worker ...``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, select

from kafka_txn.cli.local_broker import LocalBroker
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import STEPS, DualWriter

ROWS_PER_BATCH = 5
_EVENTS = Table("demo_events", MetaData(), Column("batch", Integer), Column("value", String(64)))


def run_demo(bootstrap: str | None, *, batches: int, seed: int) -> int:
    """Run the demo; 0 if the verification passed."""
    local = None if bootstrap else LocalBroker()
    servers = bootstrap or (local.bootstrap_servers if local else "")
    folder = tempfile.mkdtemp(prefix="kafka-txn-demo-")
    try:
        print(f"broker: {local.description if local else servers}")
        jdbc = f"jdbc:sqlite:{folder}/demo.db"
        topic = _create_topic(servers)
        txn_id = f"kafka-txn-demo-{uuid.uuid4().hex[:8]}"
        print(f"database: {jdbc}\ntopic: {topic}\ntransactional id: {txn_id}\n")
        rng = random.Random(seed)
        crashes: Counter[str] = Counter()
        outcomes: Counter[str] = Counter()
        committed = []
        for batch in range(batches):
            step = rng.choice(["none", "none", *STEPS])
            code, outcome = _worker(servers, jdbc, topic, txn_id, batch, step)
            outcomes[outcome] += 1
            if code == -signal.SIGKILL:
                crashes[step] += 1
            elif code != 0:
                print(f"worker for batch {batch} failed with exit code {code}")
                return 1
            if step == "none" or STEPS.index(step) >= STEPS.index("after_db_commit"):
                committed.append(batch)
            what = "completed" if step == "none" else f"killed at {step}"
            print(
                f"[{batch + 1:>3}/{batches}] start-up recovery: {outcome:<18} "
                f"then batch {batch}: {what}"
            )
        _, outcome = _worker(servers, jdbc, topic, txn_id, batches, "none", recover_only=True)
        outcomes[outcome] += 1
        print(f"[final] recovery: {outcome}")
        return _verify(servers, jdbc, topic, committed, crashes, outcomes)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if local is not None:
            local.stop()


def _create_topic(servers: str) -> str:
    name = f"kafka-txn-demo-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1)])[name].result(60)
    return name


def _worker(
    servers: str, jdbc: str, topic: str, txn_id: str, batch: int, step: str,
    recover_only: bool = False,
) -> tuple[int, str]:  # fmt: skip
    argv = [sys.executable, "-m", "kafka_txn.cli.demo", "worker", "--bootstrap-servers", servers,
            "--jdbc-url", jdbc, "--topic", topic, "--transactional-id", txn_id,
            "--batch", str(batch), "--crash-at", step]  # fmt: skip
    if recover_only:
        argv.append("--recover-only")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    lines = done.stdout.splitlines()
    outcome = lines[0].removeprefix("outcome=") if lines else "?"
    if done.returncode not in (0, -signal.SIGKILL):
        sys.stderr.write(done.stderr[-2000:])
    return done.returncode, outcome


def _verify(
    servers: str, jdbc: str, topic: str, committed: list[int],
    crashes: Counter[str], outcomes: Counter[str],
) -> int:  # fmt: skip
    expected = sorted(f"b{b}-r{i}" for b in committed for i in range(ROWS_PER_BATCH))
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    with engine.connect() as conn:
        rows = sorted(conn.execute(select(_EVENTS.c.value)).scalars())
    engine.dispose()
    kafka = sorted(_read_committed(servers, topic, len(expected)))
    print("\ncrashes injected: " + (", ".join(f"{k} x{v}" for k, v in sorted(crashes.items()))
                                    or "none"))  # fmt: skip
    print("recovery outcomes: " + ", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items())))
    print(f"batches that reached the database commit: {len(committed)}")
    print(f"database rows: {len(rows)}; read_committed records: {len(kafka)}; "
          f"expected: {len(expected)}")  # fmt: skip
    ok = rows == expected and kafka == expected
    if ok:
        print("VERIFIED: database and Kafka hold the same records, each exactly once")
        return 0
    lost = set(expected) - set(kafka)
    twice = [v for v, n in Counter(kafka).items() if n > 1]
    print(f"FAILED: lost in Kafka {sorted(lost)[:5]}, twice {twice[:5]}, rows match: "
          f"{rows == expected}")  # fmt: skip
    return 1


def _read_committed(servers: str, topic: str, expected: int, timeout: float = 30.0) -> list[str]:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe([topic])
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    linger_until = None
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen.append((msg.value() or b"").decode())
            if len(seen) >= expected and linger_until is None:
                linger_until = time.monotonic() + 1.0  # catch anything written twice
            if linger_until is not None and time.monotonic() > linger_until:
                break
    finally:
        consumer.close()
    return seen


def _worker_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kafka_txn.cli.demo worker")
    for name in ("bootstrap-servers", "jdbc-url", "topic", "transactional-id"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--crash-at", default="none")
    parser.add_argument("--recover-only", action="store_true")
    args = parser.parse_args(argv)

    def on_step(step: str) -> None:
        if step == args.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a hard crash: no cleanup at all

    writer = DualWriter(
        {"bootstrap.servers": args.bootstrap_servers, "transactional.id": args.transactional_id},
        args.jdbc_url,
        on_step=on_step,
    )
    _EVENTS.create(writer.engine, checkfirst=True)
    print(f"outcome={writer.start().value}", flush=True)
    if not args.recover_only:
        values = [f"b{args.batch}-r{i}" for i in range(ROWS_PER_BATCH)]
        with writer.transaction() as tx:
            tx.connection.execute(insert(_EVENTS), [{"batch": args.batch, "value": v}
                                                    for v in values])  # fmt: skip
            for value in values:
                tx.produce(args.topic, value.encode())
    writer.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"]:
        sys.exit("usage: python -m kafka_txn.cli.demo worker ...")
    sys.exit(_worker_main(sys.argv[2:]))
