"""The broker a benchmark runs on: the test rig's (``tests/support/rig.py``), chosen the same way,
so that a figure in docs/performance.md comes from the broker the test suite runs on.

The rig's order applies: ``KAFKA_BOOTSTRAP_SERVERS`` (a cluster of one's own), else
testcontainers when Docker answers, else Apache Kafka from Maven when ``java`` and ``mvn``
are there, else the local noida-db. ``--broker apache-kafka|noida|testcontainers`` forces
one, as ``KAFKA_TXN_TEST_BROKER`` does for the tests (and for every benchmark of
``make bench``); ``KAFKA_TXN_TRANSACTION_VERSION`` formats Apache Kafka with another
``transaction.version``, as in the rig.

    parser = argparse.ArgumentParser()
    add_broker_argument(parser)                 # --broker, default: the rig's choice
    args = parser.parse_args()
    with running_broker(args.broker) as broker:  # started, announced, stopped
        ...

The broker is announced before anything is measured, with its kind and the rig's
description (what it reports about itself: version, cluster id, transaction.version,
ApiVersions), and named again under the results: each raw-against-kafka-txn ratio is
measured on that one broker, in one run.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.rig import FORCED, Broker, chosen, start_broker

__all__ = ["add_broker_argument", "running_broker"]


def add_broker_argument(parser: argparse.ArgumentParser) -> None:
    """``--broker``: the broker to start, instead of the test rig's choice."""
    parser.add_argument(
        "--broker",
        choices=FORCED,
        default=None,
        help="the broker to start (default: KAFKA_TXN_TEST_BROKER if set, else the test "
        "rig's order: KAFKA_BOOTSTRAP_SERVERS, testcontainers, Apache Kafka from Maven, "
        "noida-db)",
    )


@contextmanager
def running_broker(forced: str | None = None) -> Iterator[Broker]:
    """The rig's broker (``forced`` overrides ``KAFKA_TXN_TEST_BROKER``), announced on
    standard output, for the ``with`` block; one it started is stopped after it, by its
    PID, whatever happened. A forced broker with ``KAFKA_BOOTSTRAP_SERVERS`` set is refused: the rig
    would use that cluster and the figures would be reported under the wrong name."""
    if forced is not None:
        if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
            raise SystemExit(
                f"--broker {forced}: KAFKA_BOOTSTRAP_SERVERS is set and the test rig "
                "would use that cluster; unset it to start a broker"
            )
        os.environ["KAFKA_TXN_TEST_BROKER"] = forced
    print(f"broker chosen: {chosen()}", flush=True)
    broker = start_broker()
    try:
        print(f"broker: {broker.kind}: {broker.description}", flush=True)
        yield broker
        print(f"\nmeasured on {broker.kind} ({_short(broker.description)})", flush=True)
    finally:
        broker.stop()


def _short(description: str) -> str:
    """What the broker is (the description up to its address) and the
    ``transaction.version`` it reported."""
    reported = re.search(r"transaction\.version (\d+);", description)
    tv = f", transaction.version {reported.group(1)} reported" if reported else ""
    return description.split(" at ", 1)[0] + tv
