"""A dual-write application for crash tests: Kafka records and database rows in one
decision, with a hard exit (os._exit, no cleanup) at a chosen step.

Each run first recovers (init_transactions(keep_prepared_txn=True) + complete_transaction
with the stored state), then writes one batch:
  begin, produce -> prepare -> [after_prepare] -> DB commit of rows + state (the decision)
  -> [after_decision] -> complete (Kafka commit) -> [after_commit] -> mark completed.
``--open-next`` (with after_commit) also begins the next transaction and sends a record
before exiting: the epoch-reuse hazard (N committed, N+1 open under the same pid/epoch).
``--hold STEP --hold-file F`` stops at STEP (``after_prepare``, ``after_decision``, or
``end_txn``: recovery's EndTxn, about to be sent) until the test, which sees F appear,
has done something to the cluster and deleted F.
Prints "outcome=<recovery outcome>" on its first line.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from kafka_txn import PreparedTxnState, TransactionalProducer
from kafka_txn.coordinator.client import CoordinatorClient

STEPS = ("none", "after_prepare", "after_decision", "after_commit")


def _db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS txn_state (tid TEXT PRIMARY KEY, state TEXT)")
    db.execute("CREATE TABLE IF NOT EXISTS rows (value TEXT)")
    return db


def stored_state(db: sqlite3.Connection, tid: str) -> PreparedTxnState:
    row = db.execute("SELECT state FROM txn_state WHERE tid = ?", (tid,)).fetchone()
    return PreparedTxnState(row[0] if row else "")


def store_state(db: sqlite3.Connection, tid: str, state: PreparedTxnState) -> None:
    db.execute("INSERT OR REPLACE INTO txn_state VALUES (?, ?)", (tid, str(state)))


HOLDS = ("none", "after_prepare", "after_decision", "end_txn")
HOLD_LIMIT_S = 120.0


def hold(args: argparse.Namespace, step: str) -> None:
    """At ``--hold``'s step: create ``--hold-file`` and wait until the test deletes it."""
    if args.hold != step:
        return
    path = Path(args.hold_file)
    path.touch()
    deadline = time.monotonic() + HOLD_LIMIT_S
    while path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"held at {step} for {HOLD_LIMIT_S:g}s: the test never let go")
        time.sleep(0.05)


def hold_end_txn(args: argparse.Namespace) -> None:
    """Make recovery's EndTxn wait at ``hold`` before it is sent (once)."""
    end_txn = CoordinatorClient.end_txn

    def held(self: CoordinatorClient, *a: Any, **kw: Any) -> None:
        hold(args, "end_txn")
        args.hold = "none"
        end_txn(self, *a, **kw)

    CoordinatorClient.end_txn = held  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--mode", choices=("run", "recover"), default="run")
    parser.add_argument("--crash-at", choices=STEPS, default="none")
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--records", type=int, default=5)
    parser.add_argument("--open-next", action="store_true")
    parser.add_argument("--hold", choices=HOLDS, default="none")
    parser.add_argument("--hold-file", default=None)
    parser.add_argument("--transaction-timeout-ms", type=int, default=None)
    args = parser.parse_args(argv)
    if args.hold == "end_txn":
        hold_end_txn(args)

    tid = args.transactional_id
    db = _db(args.db)
    producer = TransactionalProducer(
        {
            "bootstrap.servers": args.bootstrap_servers,
            "transactional.id": tid,
            "transaction.two.phase.commit.enable": True,
            **(
                {"transaction.timeout.ms": args.transaction_timeout_ms}
                if args.transaction_timeout_ms
                else {}
            ),
        }
    )
    producer.init_transactions(keep_prepared_txn=True)
    stored = stored_state(db, tid)
    outcome = producer.complete_transaction(
        stored, before_init=lambda _: store_state(db, tid, stored.mark_completed())
    )
    print(f"outcome={outcome.value}", flush=True)
    if args.mode == "recover":
        producer.close()
        return 0

    values = [f"b{args.batch}-r{i}" for i in range(args.records)]
    producer.begin_transaction()
    for value in values:
        producer.produce(args.topic, value.encode())
    state = producer.prepare_transaction()
    hold(args, "after_prepare")
    if args.crash_at == "after_prepare":
        os._exit(70)

    db.execute("BEGIN IMMEDIATE")  # the decision: rows and state commit together
    db.executemany("INSERT INTO rows VALUES (?)", [(v,) for v in values])
    store_state(db, tid, state)
    db.execute("COMMIT")
    hold(args, "after_decision")
    if args.crash_at == "after_decision":
        os._exit(71)

    producer.complete_transaction(state)
    if args.crash_at == "after_commit":
        if args.open_next:
            producer.begin_transaction()
            producer.produce(args.topic, f"b{args.batch + 1}-uncommitted".encode())
            producer.flush()
        os._exit(72)

    store_state(db, tid, state.mark_completed())
    producer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
