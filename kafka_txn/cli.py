"""``kafka-txn``: see and settle transactions without writing code.

    kafka-txn describe --bootstrap-servers B --transactional-id X [--json]
    kafka-txn recover --bootstrap-servers B --jdbc-url URL --transactional-id X
    kafka-txn force-terminate --bootstrap-servers B --transactional-id X
    kafka-txn demo [--bootstrap-servers B] [--batches N]

``-X key=value`` passes any librdkafka setting (security.protocol, sasl.*, ssl.*). Errors
are one line on stderr and a non-zero exit code: 1 for a failed operation, 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from .coordinator import ConnectionSettings, CoordinatorClient, CoordinatorError
from .coordinator.client import TransactionDescription
from .coordinator.connection import AuthenticationError, ProtocolError
from .errors import KafkaTxnError
from .producer import TransactionalProducer
from .twophase import coordinator_failure

__all__ = ["main"]

log = logging.getLogger("kafka_txn.cli")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    conf: dict[str, Any] = {}
    for item in args.X or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"kafka-txn: error: -X {item!r} is not key=value")
        conf[key.strip()] = value
    if args.bootstrap_servers:
        conf["bootstrap.servers"] = args.bootstrap_servers
    return conf


def _describe_id(conf: dict[str, Any], args: argparse.Namespace) -> TransactionDescription:
    """DescribeTransactions, with failures translated as everywhere else
    (``twophase.coordinator_failure``)."""
    try:
        with CoordinatorClient(
            ConnectionSettings.from_librdkafka(conf),
            args.transactional_id,
            deadline_s=args.timeout,
        ) as client:
            return client.describe()
    except (CoordinatorError, ProtocolError, AuthenticationError) as exc:
        raise coordinator_failure(
            exc, "describe", recovering=True, deadline_s=args.timeout
        ) from exc


def _describe(args: argparse.Namespace) -> int:
    seen = _describe_id(_settings(args), args)
    info = seen.as_dict()
    info["transactional_id"] = args.transactional_id
    if seen.start_time_ms >= 0:
        started = datetime.fromtimestamp(seen.start_time_ms / 1000, tz=timezone.utc)
        info["started_at"] = started.isoformat(timespec="milliseconds")
        info["age_s"] = round(time.time() - seen.start_time_ms / 1000, 3)
    if args.json:
        print(json.dumps(info, sort_keys=True))
        return 0
    print(f"transactional id : {args.transactional_id}")
    print(f"state            : {seen.state}")
    print(f"producer id/epoch: {seen.producer_id}/{seen.producer_epoch}")
    if "started_at" in info:
        print(f"started          : {info['started_at']} ({info['age_s']:.1f}s ago)")
    print(f"timeout          : {seen.timeout_ms} ms")
    parts = ", ".join(f"{t}{sorted(p)}" for t, p in sorted(seen.partitions.items())) or "-"
    print(f"partitions       : {parts}")
    return 0


def _recover(args: argparse.Namespace) -> int:
    from .dualwrite import DualWriter  # noqa: PLC0415 - needs the sql extra

    conf = {**_settings(args), "transactional.id": args.transactional_id}
    writer = DualWriter(
        conf,
        args.jdbc_url,
        user=args.user,
        password=args.password,
        state_table=args.state_table,
        create_state_table=False,
    )
    try:
        outcome = writer.start()
    finally:
        writer.close()
    print(f"{args.transactional_id}: {outcome.value}")
    return 0


def _force_terminate(args: argparse.Namespace) -> int:
    conf = {**_settings(args), "transactional.id": args.transactional_id}
    before = _describe_id(conf, args)
    # KIP-939's forceTerminateTransaction: initialising the id aborts whatever is open
    # and fences every producer that still holds it.
    with TransactionalProducer(conf, operation_timeout=args.timeout) as producer:
        producer.init_transactions()
    print(
        f"{args.transactional_id}: was {before.state} (producer id {before.producer_id}, "
        f"epoch {before.producer_epoch}); open transaction aborted, older producers fenced"
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo  # noqa: PLC0415 - needs the sql and test extras

    return run_demo(args.bootstrap_servers, batches=args.batches, seed=args.seed)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-txn", description="See and settle Kafka transactions."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, broker_required: bool = True) -> None:
        p.add_argument("--bootstrap-servers", required=broker_required)
        p.add_argument("-X", action="append", metavar="KEY=VALUE", help="librdkafka setting")
        p.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")

    p = sub.add_parser("describe", help="state, producer id/epoch, age, partitions")
    common(p)
    p.add_argument("--transactional-id", required=True)
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(run=_describe)

    p = sub.add_parser("recover", help="settle an in-doubt transaction from the database")
    common(p)
    p.add_argument("--transactional-id", required=True)
    p.add_argument("--jdbc-url", required=True)
    p.add_argument("--user")
    p.add_argument("--password")
    p.add_argument("--state-table", default="kafka_transaction_state")
    p.set_defaults(run=_recover)

    p = sub.add_parser("force-terminate", help="abort whatever is open (KIP-939)")
    common(p)
    p.add_argument("--transactional-id", required=True)
    p.set_defaults(run=_force_terminate)

    p = sub.add_parser("demo", help="dual writes with injected crashes, then verified")
    common(p, broker_required=False)
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--seed", type=int, default=7)
    p.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.run(args)
        return code
    except (KafkaTxnError, RuntimeError, OSError) as exc:
        print(f"kafka-txn: error: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(f"kafka-txn: error: {exc} (pip install 'kafka-txn[test]')", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
