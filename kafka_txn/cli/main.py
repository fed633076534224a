"""``kafka-txn``: see and settle transactions without writing code, safely at 3 a.m.

    kafka-txn describe --bootstrap-servers B --transactional-id X [--json]
    kafka-txn recover --bootstrap-servers B --jdbc-url URL --transactional-id X [--yes]
    kafka-txn force-terminate --bootstrap-servers B --transactional-id X [--yes]
    kafka-txn demo [--bootstrap-servers B] [--batches N] [--seed S]
    kafka-txn broker [--kind apache-kafka|noida] [--port N] [--listen ADDRESS] [--data-dir DIR]

``-X key=value`` passes any librdkafka setting (security.protocol, sasl.*, ssl.*). Each
failure is one line on stderr. Exit codes: 0 done; 1 the operation failed (broker,
database, recovery); 2 bad arguments, ``-X`` settings included; 3 refused: fencing a
transactional id whose transaction started recently needs a confirmation (``--yes``, or
"y" at the terminal); 4 the transactional id is unknown (nothing was done).

``recover`` and ``force-terminate`` fence: every producer still using the id gets
``ProducerFencedError``. They ask first when the coordinator shows a transaction that
started less than ``max(its transaction timeout, 60 s)`` ago, or (recover) the state row
was written that recently or its owner is a running process of this host
(``fencing.reasons_to_ask``). After the answer they look again, and refuse if
anything changed while the question was open; recover checks the state row once more
under its lock, before it settles or fences anything (``fencing.guard_row``).

This module is the parser and the dispatch. Each command has its module (``describe``,
``recover``, ``force_terminate``, ``demo``, ``broker``); ``settings`` checks ``-X`` and the other
connection settings, ``exits`` holds the exit codes and the one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import NoReturn

from kafka_txn import __version__
from kafka_txn.cli.database import DatabaseUnusableError
from kafka_txn.cli.describe import describe
from kafka_txn.cli.exits import (
    EXIT_FAILED,
    EXIT_REFUSED,
    EXIT_USAGE,
    CommandError,
    UsageError,
    fail,
    one_line,
)
from kafka_txn.cli.force_terminate import force_terminate
from kafka_txn.cli.recover import recover
from kafka_txn.cli.settings import PASSWORD_ENV
from kafka_txn.cli.terminal import configure_logging
from kafka_txn.errors import KafkaTxnError

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    try:
        from kafka_txn.cli.demo import run_demo  # noqa: PLC0415 - needs the demo extra
    except ImportError as exc:
        raise CommandError(
            EXIT_FAILED, f"kafka-txn demo needs {exc.name or exc}: pip install 'kafka-txn[demo]'"
        ) from exc
    return run_demo(args.bootstrap_servers, batches=args.batches, seed=args.seed)


def _broker(args: argparse.Namespace) -> int:
    from kafka_txn.cli.broker import run_broker  # noqa: PLC0415

    return run_broker(args.kind, listen=args.listen, port=args.port, data_dir=args.data_dir)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1 to 65535)")
    return value


# ---------------------------------------------------------------------- arguments
_FENCES = (
    "It FENCES: every producer still using the transactional id (a live writer included) "
    "gets ProducerFencedError. When a writer may be live (the coordinator shows a "
    "transaction that started less than max(its transaction timeout, 60s) ago; for "
    "recover also: the state row was written that recently, or its owner is a running "
    "process of this host), it asks first; --yes skips the question, and without a "
    "terminal (stdin) and without --yes it refuses (exit code 3). If the id changed while "
    "the question was open, it refuses too (exit code 3)."
)
_EPILOG = (
    "Exit codes: 0 done, 1 failed, 2 bad arguments, 3 refused (not confirmed), "
    "4 unknown transactional id."
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """argparse's usage error (exit 2), on one line after the usage."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)}\n")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def _kafka_options(p: argparse.ArgumentParser, fences: bool = False) -> None:
    p.add_argument(
        "--bootstrap-servers", required=True, metavar="HOST:PORT[,...]",
        help="the Kafka cluster (librdkafka's bootstrap.servers)",
    )  # fmt: skip
    p.add_argument("--transactional-id", required=True, metavar="ID", help="the transactional.id")
    p.add_argument(
        "-X", action="append", metavar="KEY=VALUE",
        help="any librdkafka setting, repeatable: security.protocol, sasl.mechanism, "
        "sasl.username, sasl.password, ssl.ca.location... (checked before anything "
        "connects; a bad one exits with 2)",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=_positive, default=30.0, metavar="SECONDS",
        help="bound on the whole command: broker and coordinator requests, retries, and "
        "database connections (default 30; waiting for your answer excluded)",
    )  # fmt: skip
    p.add_argument(
        "-v", "--verbose", action="count", default=0,
        help="log progress and librdkafka's own log lines to stderr (-vv: debug)",
    )  # fmt: skip
    if fences:
        p.add_argument(
            "-y", "--yes", action="store_true",
            help="fence without asking, even where a writer may be live",
        )  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    import confluent_kafka  # noqa: PLC0415

    parser = _Parser(
        prog="kafka-txn",
        description="See and settle Kafka transactions.",
        epilog=_EPILOG,
    )
    parser.add_argument(
        "--version", action="version",
        version=f"kafka-txn {__version__} (confluent-kafka {metadata.version('confluent-kafka')}, "
        f"librdkafka {confluent_kafka.libversion()[0]})",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "describe", help="state, producer id/epoch, age, partitions of a transactional id",
        description="What the transaction coordinator knows of a transactional id. Reads "
        "only: registers nothing, fences nothing. An unknown id exits with 4.",
        epilog=_EPILOG,
    )  # fmt: skip
    _kafka_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (for scripts)")
    p.set_defaults(run=describe)

    p = sub.add_parser(
        "recover", help="settle an in-doubt dual write as its database decided (fences)",
        description="Commit or abort the id's prepared Kafka transaction as the state "
        "row in the writers' database decided, like a DualWriter's start(). It never "
        "creates a database, a table or a state row: an id without a state row, or one "
        "the coordinator does not know, exits with 4 and nothing done. When recovery "
        "cannot settle it (Kafka aborted it, or cannot tell), it exits with 1 and says what "
        "to check and do by hand, with the UPDATE of the state row to run last. " + _FENCES,
        epilog=_EPILOG,
    )  # fmt: skip
    _kafka_options(p, fences=True)
    p.add_argument(
        "--jdbc-url", required=True, metavar="URL",
        help="the writers' database: jdbc:postgresql://, jdbc:mysql://, jdbc:mariadb:// "
        "or jdbc:sqlite:PATH (an existing file)",
    )  # fmt: skip
    p.add_argument("--user", help="database user (else the URL's user=)")
    password = p.add_mutually_exclusive_group()
    password.add_argument(
        "--password",
        help="database password; VISIBLE to other users in process lists and kept in "
        "shell history: prefer --password-env or --password-prompt",
    )
    password.add_argument(
        "--password-env", metavar="NAME",
        help=f"read the database password from environment variable NAME (without any "
        f"password option: from {PASSWORD_ENV} if set, else the URL's password=)",
    )  # fmt: skip
    password.add_argument(
        "--password-prompt", action="store_true",
        help="ask for the database password on the terminal (not echoed)",
    )  # fmt: skip
    p.add_argument(
        "--state-table", default="kafka_transaction_state", metavar="TABLE",
        help="the DualWriters' state table (default kafka_transaction_state)",
    )  # fmt: skip
    p.set_defaults(run=recover)

    p = sub.add_parser(
        "force-terminate", help="abort whatever is open for a transactional id (fences)",
        description="Initialise the transactional id, as KIP-939's "
        "forceTerminateTransaction: its open transaction is aborted. If a DualWriter's "
        "database committed that transaction, use recover instead: after an abort, the "
        "writer's next start() raises TransactionDivergedError. An id the coordinator "
        "does not know is not registered: exit code 4. " + _FENCES,
        epilog=_EPILOG,
    )  # fmt: skip
    _kafka_options(p, fences=True)
    p.set_defaults(run=force_terminate)

    p = sub.add_parser(
        "demo", help="dual writes with injected crashes, then verified",
        description="SQLite + Kafka dual writes in processes killed at random steps, each "
        "recovered by the next, then a check that both hold the same records exactly once. "
        "Needs pip install 'kafka-txn[demo]'.",
    )  # fmt: skip
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT[,...]",
        help="a Kafka cluster to use (default: start a local noida-db broker)",
    )  # fmt: skip
    p.add_argument(
        "--batches", type=int, default=12, metavar="N",
        help="how many batches to write (default 12)",
    )  # fmt: skip
    p.add_argument(
        "--seed", type=int, default=7, metavar="N",
        help="seed of the random crash steps (default 7)",
    )  # fmt: skip
    p.set_defaults(run=_demo, verbose=0)

    p = sub.add_parser(
        "broker", help="run a local Kafka broker for your application (Ctrl-C stops it)",
        description="A single local Kafka broker, in the foreground: Apache Kafka (one "
        "KRaft broker+controller, transaction.version 2) when java and mvn are on PATH, "
        "else noida-db (pip install 'kafka-txn[demo]'). Once it answers, prints key=value "
        "lines on stdout, bootstrap.servers=HOST:PORT last. Ctrl-C or SIGTERM stops it "
        "by its PID (SIGKILL if it has not stopped in time) and exits 0.",
    )  # fmt: skip
    p.add_argument(
        "--kind", choices=("apache-kafka", "noida"),
        help="which broker (default: the kind --data-dir was made with, else apache-kafka "
        "when java and mvn are on PATH, else noida)",
    )  # fmt: skip
    p.add_argument(
        "--port", type=_port, default=9092, metavar="N",
        help="the Kafka port (default 9092; a taken port fails at once)",
    )  # fmt: skip
    p.add_argument(
        "--listen", default="127.0.0.1", metavar="ADDRESS",
        help="the IPv4 address to listen on (default 127.0.0.1, this machine only; 0.0.0.0: "
        "every interface, the printed address being this host's name)",
    )  # fmt: skip
    p.add_argument(
        "--data-dir", metavar="DIR",
        help="keep the broker's data in DIR across runs (a new or empty folder the first "
        "time; default: a temporary folder, deleted when the broker stops)",
    )  # fmt: skip
    p.set_defaults(run=_broker, verbose=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: the exit code (argparse's own errors exit with 2)."""
    parser = _parser()
    args = parser.parse_args(argv)
    with configure_logging(args.verbose):
        try:
            code: int = args.run(args)
            return code
        except CommandError as exc:
            prefix = "refused" if exc.code == EXIT_REFUSED else "error"
            return fail(exc.code, f"{prefix}: {exc}")
        except UsageError as exc:
            return fail(EXIT_USAGE, f"{args.command}: error: {exc}")
        except DatabaseUnusableError as exc:
            return fail(EXIT_FAILED, f"error: {exc}")
        except KafkaTxnError as exc:
            return fail(EXIT_FAILED, f"error: {exc.message}")
        except ImportError as exc:
            return fail(EXIT_FAILED, f"error: {exc}")
        except (RuntimeError, OSError) as exc:
            return fail(EXIT_FAILED, f"error: {exc}")
        except KeyboardInterrupt:
            return fail(130, "interrupted")
