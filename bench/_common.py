"""What every benchmark under bench/ shares: the ``--delay-ms`` option, the
delay proxies behind it, and the line that says where and with what a run was made.

    parser = argparse.ArgumentParser()
    add_delay_argument(parser)                  # --delay-ms, default 0
    add_broker_argument(parser)                 # --broker (bench/_broker.py)
    args = parser.parse_args()
    with running_broker(args.broker) as broker, behind_delay(
        args.delay_ms, broker.bootstrap_servers, POSTGRES_JDBC
    ) as net:
        print(environment(net))
        Producer({"bootstrap.servers": net.bootstrap_servers, ...})   # raw baseline
        DualWriter({"bootstrap.servers": net.bootstrap_servers, ...}, net.jdbc)  # ours

With ``--delay-ms 0`` (the default) nothing is proxied: ``net`` holds the addresses as
given (a proxy costs throughput even without delay). Otherwise Kafka goes through
``tests.proxies.kafka_proxy.KafkaProxy`` and the database through ``bench._delay.DelayProxy``,
both with that one-way delay on every byte, in one process of their own (their Python
code does not compete with the benchmark's for its GIL). The raw baseline and kafka-txn
must both use ``net``'s addresses, so that both pay the same latency in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent

__all__ = [
    "Network",
    "add_delay_argument",
    "behind_delay",
    "environment",
    "spread",
]


def add_delay_argument(parser: argparse.ArgumentParser) -> None:
    """``--delay-ms``: one-way delay added to every byte to and from the broker and the
    database (default 0: direct, no proxy)."""
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=0.0,
        help="one-way delay in ms added to every byte to and from Kafka and the database "
        "(a proxy in front of both; default 0: direct)",
    )


@dataclass(frozen=True)
class Network:
    """The addresses a benchmark connects to: the proxies' with a delay, else the
    originals."""

    delay_ms: float
    bootstrap_servers: str
    jdbc: str | None = None


@contextmanager
def behind_delay(
    delay_ms: float, bootstrap_servers: str, jdbc: str | None = None
) -> Iterator[Network]:
    """Kafka (and the database of ``jdbc``, if given) behind proxies adding ``delay_ms``
    one way, for the ``with`` block; no proxy at all when ``delay_ms`` is 0."""
    if delay_ms <= 0:
        yield Network(0.0, bootstrap_servers, jdbc)
        return
    command = [sys.executable, "-m", "bench._delay", "--delay-ms", str(delay_ms)]
    command += ["--kafka", bootstrap_servers]
    db_address = None
    if jdbc is not None:
        db_address = _jdbc_address(jdbc)
        command += ["--tcp", db_address]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the delay proxies did not start (exit code {proc.wait()})")
        served: dict[str, str] = json.loads(line)
        proxied_jdbc = None
        if jdbc is not None and db_address is not None:
            proxied_jdbc = jdbc.replace(f"//{db_address}/", f"//{served[db_address]}/", 1)
        yield Network(delay_ms, served[bootstrap_servers], proxied_jdbc)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _jdbc_address(jdbc: str) -> str:
    """``host:port`` of a ``jdbc:postgresql://host:port/db`` style URL."""
    parts = urlsplit(jdbc.removeprefix("jdbc:"))
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"{jdbc}: name the database's host and port")
    return f"{parts.hostname}:{parts.port}"


def environment(net: Network | None = None, database: str | None = None) -> str:
    """One line: date, machine, load, versions (and the delay), for the report."""
    import confluent_kafka
    import sqlalchemy

    cores = os.cpu_count()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    parts = [
        f"{datetime.date.today().isoformat()}",
        f"{cores} cores, {mem:.0f} GiB, load {load}",
        f"CPython {platform.python_version()}",
        f"confluent-kafka {_version_text(confluent_kafka.version())} "
        f"(librdkafka {confluent_kafka.libversion()[0]})",
        f"SQLAlchemy {sqlalchemy.__version__}",
    ]
    try:
        import psycopg

        parts.append(f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__})")
    except ImportError:
        pass
    if database:
        parts.append(database)
    if net is not None:
        parts.append(f"delay {net.delay_ms:g} ms one way" if net.delay_ms else "no delay proxy")
    return "; ".join(parts)


def _version_text(version: object) -> str:
    """confluent_kafka.version() is a string in some releases, (string, int) in others."""
    return str(version[0]) if isinstance(version, tuple) else str(version)


def spread(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    """``median (min..max)`` of a list of run results."""
    med = statistics.median(values)
    return f"{fmt.format(med)} ({fmt.format(min(values))}..{fmt.format(max(values))})"
