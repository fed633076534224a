"""``kafka-txn describe``: what the transaction coordinator knows of a transactional id
(state, producer id and epoch, when its transaction started, its partitions), as lines
for a person or one JSON object (``--json``). It only reads: DescribeTransactions
registers nothing and fences nothing. An unknown id exits with 4.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone
from typing import Any

from kafka_txn.cli.coordinator import describe_id, unknown_to_coordinator
from kafka_txn.cli.exits import EXIT_OK, EXIT_UNKNOWN_ID, CommandError
from kafka_txn.cli.settings import kafka_settings
from kafka_txn.cli.terminal import Deadline
from kafka_txn.coordinator.client import TransactionDescription

__all__ = ["as_json", "describe"]


def describe(args: argparse.Namespace) -> int:
    conf = kafka_settings(args)
    seen = describe_id(conf, args.transactional_id, Deadline(args.timeout))
    info = as_json(args.transactional_id, seen)
    if args.json:
        print(json.dumps(info, sort_keys=True))
    if not seen.found:
        raise CommandError(EXIT_UNKNOWN_ID, unknown_to_coordinator(args.transactional_id))
    if args.json:
        return EXIT_OK
    print(f"transactional id : {args.transactional_id}")
    print(f"state            : {seen.state}")
    print(f"producer id/epoch: {seen.producer_id}/{seen.producer_epoch}")
    if info["started_at"] is not None:
        print(f"started          : {info['started_at']} ({info['age_s']:.1f}s ago)")
    print(f"timeout          : {seen.timeout_ms} ms")
    parts = ", ".join(f"{t}{p}" for t, p in info["partitions"].items()) or "-"
    print(f"partitions       : {parts}")
    return EXIT_OK


def as_json(transactional_id: str, seen: TransactionDescription) -> dict[str, Any]:
    """``describe --json``'s object: every key always present (docs/guide/operations.md has
    the schema), null where unknown (no transaction started: no start time, no age)."""
    info = seen.as_dict()
    info["transactional_id"] = transactional_id
    info["partitions"] = {t: sorted(p) for t, p in sorted(seen.partitions.items())}
    info["started_at"] = info["age_s"] = None
    if seen.start_time_ms >= 0:
        started = datetime.fromtimestamp(seen.start_time_ms / 1000, tz=timezone.utc)
        info["started_at"] = started.isoformat(timespec="milliseconds")
        info["age_s"] = round(time.time() - seen.start_time_ms / 1000, 3)
    return info
