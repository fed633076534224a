"""Dual write: store orders in PostgreSQL and publish an event for each to Kafka,
atomically (KIP-939's recipe, kafka-txn's DualWriter).

Scenario: each order is one transaction. The row and the event both happen or neither
does, even if the process dies between the database commit and the Kafka commit: the
next start of the writer recovers from the database. An order that fails validation
inside the transaction rolls back both sides (the abort path); a writer fenced by another
instance with the same transactional id stops with a FatalError (the fatal path).

Assumes: PostgreSQL reachable by the JDBC URL (the table is created if missing), and a
broker with transactions (Kafka >= 3.0 for two-phase commit).

    python examples/dual_write_postgres.py --bootstrap-servers 127.0.0.1:9092 \\
        --jdbc-url 'jdbc:postgresql://127.0.0.1:5432/test?user=postgres' --topic orders
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from sqlalchemy import Column, Integer, MetaData, Numeric, String, Table, insert

from kafka_txn import FatalError
from kafka_txn.dualwrite import DualWriter

log = logging.getLogger("dual_write_postgres")

ORDERS = Table(
    "example_orders",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("customer", String(64), nullable=False),
    Column("amount", Numeric(12, 2), nullable=False),
)


class InvalidOrder(ValueError):  # noqa: N818 - the domain's name
    """An order the business rules refuse."""


def place(writer: DualWriter, topic: str, order: dict[str, object]) -> bool:
    """One order in one atomic dual write; False if it was refused (nothing written)."""
    try:
        with writer.transaction() as tx:
            tx.connection.execute(insert(ORDERS).values(**order))
            if float(str(order["amount"])) <= 0:
                raise InvalidOrder(f"order {order['id']}: amount must be positive")
            tx.produce(
                topic,
                json.dumps({"type": "OrderPlaced", **order}, default=str).encode(),
                key=str(order["customer"]).encode(),
            )
    except InvalidOrder as exc:
        log.warning("refused, both sides rolled back: %s", exc)
        return False
    return True


def run(args: argparse.Namespace) -> tuple[int, int]:
    """Place --orders orders (every 5th is invalid); return (placed, refused)."""
    writer = DualWriter(
        {
            "bootstrap.servers": args.bootstrap_servers,
            # One id per writer instance; a restarted instance recovers its predecessor.
            "transactional.id": args.transactional_id,
            # Longer than an order's transaction plus a restart: see docs/guide/two-phase-commit.md.
            "transaction.timeout.ms": 120_000,
        },
        args.jdbc_url,
    )
    placed = refused = 0
    try:
        ORDERS.create(writer.engine, checkfirst=True)
        outcome = writer.start()  # recovery first: settles what a crash left prepared
        log.info("recovery: %s", outcome.value)
        for n in range(args.first_id, args.first_id + args.orders):
            amount = -1 if n % 5 == 4 else 10 + n
            order = {"id": n, "customer": f"c{n % 3}", "amount": amount}
            if place(writer, args.topic, order):
                placed += 1
            else:
                refused += 1
    except FatalError:
        log.exception("fenced or unusable: stopping this writer")
        raise
    finally:
        writer.close()
    return placed, refused


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        help="the Kafka cluster (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092, "
        "where `kafka-txn broker` listens)",
    )
    parser.add_argument("--jdbc-url", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--transactional-id", default="orders-writer-0")
    parser.add_argument("--orders", type=int, default=10)
    parser.add_argument("--first-id", type=int, default=1)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    placed, refused = run(args)
    print(f"placed {placed} orders (rows + events), refused {refused} (neither)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
