"""``kafka-txn``: see and settle transactions without writing code, safely at 3 a.m.

    kafka-txn describe --bootstrap-servers B --transactional-id X [--json]
    kafka-txn recover --bootstrap-servers B --jdbc-url URL --transactional-id X [--yes]
    kafka-txn force-terminate --bootstrap-servers B --transactional-id X [--yes]
    kafka-txn demo [--bootstrap-servers B] [--batches N] [--seed S]

``-X key=value`` passes any librdkafka setting (security.protocol, sasl.*, ssl.*). Each
failure is one line on stderr. Exit codes: 0 done; 1 the operation failed (broker,
database, recovery); 2 bad arguments, ``-X`` settings included; 3 refused: fencing a
transactional id whose transaction started recently needs a confirmation (``--yes``, or
"y" at the terminal); 4 the transactional id is unknown (nothing was done).

``recover`` and ``force-terminate`` fence: every producer still using the id gets
``ProducerFencedError``. They ask first when the coordinator shows a transaction that
started less than ``max(its transaction timeout, 60 s)`` ago, or (recover) the state row
was written that recently (``_reasons_to_ask``).
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import os
import re
import socket
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from importlib import metadata
from typing import TYPE_CHECKING, Any, NoReturn

from . import __version__
from ._cli_database import (
    DatabaseUnusableError,
    StoredRow,
    describe_database,
    explain,
    open_database,
    read_state_row,
    require_drivers,
)
from ._cli_terminal import Deadline, NotConfirmedError, ask, configure_logging, waiting
from .config import validate_config
from .coordinator import ConnectionSettings, CoordinatorClient, CoordinatorError
from .coordinator.client import TransactionDescription
from .coordinator.connection import AuthenticationError, ProtocolError
from .errors import ConfigurationError, KafkaTxnError, UnsupportedBrokerError

if TYPE_CHECKING:  # SQLAlchemy is an extra, imported by recover only
    from sqlalchemy.engine import Engine

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNKNOWN_ID = 4

PASSWORD_ENV = "KAFKA_TXN_DB_PASSWORD"
"""Read for the database password when no --password option is given."""

RECENT_FLOOR_S = 60.0
"""A transaction that started less than max(its timeout, this) seconds ago may belong to
a live writer: fencing its id needs a confirmation."""

_OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")


class _CommandError(Exception):
    """A command's end other than success: the exit code and one line for stderr."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _UsageError(Exception):
    """Bad arguments found after argparse (``-X`` values, a missing environment
    variable): exit 2."""


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text).strip()


def _seconds(value: float) -> str:
    """4.98 -> "5", 2.25 -> "2.2": what an operator reads as "the timeout I gave"."""
    return f"{value:.1f}".removesuffix(".0")


# ---------------------------------------------------------------------- settings
def _kafka_settings(args: argparse.Namespace, *, producer: bool) -> dict[str, Any]:
    """The librdkafka settings of ``-X`` and ``--bootstrap-servers``, checked before
    anything connects: key=value syntax, what the coordinator client supports, and what
    librdkafka accepts (a throwaway handle without brokers, which connects nowhere)."""
    from confluent_kafka import KafkaException, Producer  # noqa: PLC0415

    conf: dict[str, Any] = {}
    for item in args.X or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise _UsageError(f"-X {item!r} is not key=value")
        conf[key.strip()] = value
    conf["bootstrap.servers"] = args.bootstrap_servers
    try:
        ConnectionSettings.from_librdkafka(conf)
        # log_level 0: this handle only checks the settings; its "no bootstrap.servers"
        # notice would be noise.
        probe = Producer({k: v for k, v in conf.items() if k != "bootstrap.servers"}
                         | {"log_level": 0})  # fmt: skip
        del probe
    except ConfigurationError as exc:
        raise _UsageError(f"-X: {exc.message}") from exc
    except KafkaException as exc:
        raise _UsageError(f"-X: librdkafka refuses the settings: {exc.args[0].str()}") from exc
    if producer:
        conf["transactional.id"] = args.transactional_id
        try:
            validate_config(conf)  # what a transactional producer requires
        except ConfigurationError as exc:
            raise _UsageError(f"-X: {exc.message}") from exc
        if not args.verbose:
            conf.setdefault("log_level", 0)  # and kafka_txn.librdkafka is quiet anyway
    return conf


def _coordinator_settings(conf: dict[str, Any], deadline: Deadline) -> ConnectionSettings:
    """The coordinator client's settings, each connection attempt and request bounded by
    what is left of ``--timeout`` (the client's own per-socket default is 10 s)."""
    settings = ConnectionSettings.from_librdkafka(conf)
    return dataclasses.replace(settings, timeout_s=min(settings.timeout_s, deadline.left()))


def _password(args: argparse.Namespace) -> str | None:
    """--password, --password-env NAME, --password-prompt, else $KAFKA_TXN_DB_PASSWORD,
    else None (the URL's own password= or none)."""
    if args.password is not None:
        return str(args.password)
    if args.password_env is not None:
        value = os.environ.get(args.password_env)
        if value is None:
            raise _UsageError(f"--password-env {args.password_env}: that variable is not set")
        return value
    if args.password_prompt:
        if not sys.stdin.isatty():
            raise _UsageError("--password-prompt needs a terminal: use --password-env NAME")
        return getpass.getpass(f"password for {args.user or 'the database user'}: ")
    return os.environ.get(PASSWORD_ENV)


# ---------------------------------------------------------------------- the coordinator
def _describe_id(
    conf: dict[str, Any], transactional_id: str, deadline: Deadline
) -> TransactionDescription:
    """DescribeTransactions, retried until the deadline; a failure is one line that says
    where and what to check."""
    servers = conf["bootstrap.servers"]
    budget = deadline.left()
    started = time.monotonic()
    try:
        with (
            waiting(f"the transaction coordinator via {servers}", deadline),
            CoordinatorClient(
                _coordinator_settings(conf, deadline), transactional_id, deadline_s=budget
            ) as client,
        ):
            return client.describe()
    except AuthenticationError as exc:
        raise _CommandError(
            EXIT_FAILED,
            f"the broker at {servers} refused to authenticate kafka-txn ({exc}): check the "
            "-X sasl.* and ssl.* settings",
        ) from exc
    except ProtocolError as exc:
        # Retried until the deadline, unless retrying cannot help: a peer that is not
        # Kafka (or not TLS where security.protocol says so) fails at once, and its
        # error already says what it is and what to check.
        if time.monotonic() - started < 0.9 * budget:
            detail = _one_line(str(exc))
            # The connection layer's message names the address it reached; say it once.
            raise _CommandError(
                EXIT_FAILED,
                f"{servers} is not a usable Kafka broker: {detail.removeprefix(f'{servers} ')}",
            ) from exc
        raise _CommandError(
            EXIT_FAILED,
            f"no usable answer from a Kafka broker at {servers} within "
            f"{_seconds(deadline.seconds)}s ({_one_line(str(exc))}): check "
            "--bootstrap-servers, that the broker runs, and -X security.protocol",
        ) from exc
    except CoordinatorError as exc:
        from confluent_kafka import KafkaError  # noqa: PLC0415

        if exc.code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise _CommandError(
                EXIT_FAILED,
                f"not authorized to describe transactional id {transactional_id!r}: grant "
                "DESCRIBE (and WRITE, to recover) on it to this principal",
            ) from exc
        raise _CommandError(
            EXIT_FAILED, f"the transaction coordinator refused ({exc}) for {_seconds(budget)}s"
        ) from exc
    except UnsupportedBrokerError as exc:
        raise _CommandError(EXIT_FAILED, exc.message) from exc


def _reasons_to_ask(
    seen: TransactionDescription, row: StoredRow | None, now: float | None = None
) -> list[str]:
    """Why fencing the id may hit a live writer (empty: no reason to ask). The window is
    ``max(the transaction timeout the coordinator reports, 60 s)``:

    - the coordinator shows a transaction that started within it, in any state: open
      (Ongoing, PrepareCommit, PrepareAbort), its writer may be mid-transaction; just
      completed (the coordinator keeps the last start time), its writer likely still runs.
      An older one is past its timeout: no writer can still commit it.
    - the state row was written within it (by the database's clock): a DualWriter writes
      it at start() and at every commit, so a live writer between transactions shows."""
    window = max(seen.timeout_ms / 1000, RECENT_FLOOR_S)
    reasons = []
    if seen.start_time_ms >= 0:
        age = (time.time() if now is None else now) - seen.start_time_ms / 1000
        if age < window:
            what = "is still open" if seen.state in _OPEN_STATES else "has ended"
            reasons.append(
                f"has a transaction that started {age:.1f}s ago and {what} (state "
                f"{seen.state}, producer id {seen.producer_id}, epoch {seen.producer_epoch})"
            )
    if row is not None and row.age_s is not None and row.age_s < window:
        reasons.append(f"has a state row last written {row.age_s:.1f}s ago")
    return reasons


def _owner_note(row: StoredRow | None) -> str:
    """What the state row says about the writer that last took the id over: its owner
    token (``host:pid:uuid8``, see DualWriter), and whether that process still runs
    when the host is this one."""
    if row is None or not row.owner:
        return ""
    note = f"; the state row's owner is {row.owner} (last written {row.updated})"
    host, pid, _ = row.owner.rsplit(":", 2) if row.owner.count(":") >= 2 else ("", "", "")
    if pid.isdigit() and host == socket.gethostname():
        try:
            os.kill(int(pid), 0)  # signal 0: only asks whether the process exists
            alive = True
        except ProcessLookupError:
            alive = False
        except PermissionError:  # it exists, under another user
            alive = True
        note += f", and process {pid} on this host {'is' if alive else 'is not'} running"
    return note


def _confirm_fencing(
    command: str, transactional_id: str, seen: TransactionDescription, row: StoredRow | None,
    yes: bool,
) -> bool:  # fmt: skip
    """Ask before fencing an id a live writer may hold (``_reasons_to_ask``); True if a
    question was asked (the wait for the answer does not count against --timeout).
    Raises _CommandError(EXIT_REFUSED) when not confirmed."""
    reasons = _reasons_to_ask(seen, row)
    if not reasons or yes:
        return False
    window = max(seen.timeout_ms / 1000, RECENT_FLOOR_S)
    situation = (
        f"transactional id {transactional_id!r} {', and '.join(reasons)} (less than "
        f"{window:g}s: the transaction timeout, at least 60s){_owner_note(row)}: a writer "
        f"may still be using it, and {command} "
        "would fence it"
    )
    try:
        ask(f"kafka-txn: {situation}.\nProceed with {command}?")
    except NotConfirmedError as exc:
        raise _CommandError(
            EXIT_REFUSED,
            f"{situation}. {exc}; nothing was done. Stop that writer first, or run again "
            "with --yes if it is gone",
        ) from None
    return True


# ---------------------------------------------------------------------- commands
def _describe(args: argparse.Namespace) -> int:
    conf = _kafka_settings(args, producer=False)
    seen = _describe_id(conf, args.transactional_id, Deadline(args.timeout))
    info = seen.as_dict()
    info["transactional_id"] = args.transactional_id
    if seen.start_time_ms >= 0:
        started = datetime.fromtimestamp(seen.start_time_ms / 1000, tz=timezone.utc)
        info["started_at"] = started.isoformat(timespec="milliseconds")
        info["age_s"] = round(time.time() - seen.start_time_ms / 1000, 3)
    if args.json:
        print(json.dumps(info, sort_keys=True))
    if not seen.found:
        raise _CommandError(EXIT_UNKNOWN_ID, _unknown_to_coordinator(args.transactional_id))
    if args.json:
        return EXIT_OK
    print(f"transactional id : {args.transactional_id}")
    print(f"state            : {seen.state}")
    print(f"producer id/epoch: {seen.producer_id}/{seen.producer_epoch}")
    if "started_at" in info:
        print(f"started          : {info['started_at']} ({info['age_s']:.1f}s ago)")
    print(f"timeout          : {seen.timeout_ms} ms")
    parts = ", ".join(f"{t}{sorted(p)}" for t, p in sorted(seen.partitions.items())) or "-"
    print(f"partitions       : {parts}")
    return EXIT_OK


def _unknown_to_coordinator(transactional_id: str) -> str:
    return (
        f"transactional id {transactional_id!r} is unknown to the transaction coordinator "
        "(never used, or expired after transactional.id.expiration.ms): check the id and "
        "--bootstrap-servers"
    )


def _recover(args: argparse.Namespace) -> int:
    """Settle the id's in-doubt transaction the way its database decided, through a
    DualWriter's start(); checks first, changes nothing until they pass: the state row
    exists (read without locking or writing), the coordinator knows the id, and a
    recent transaction is confirmed."""
    conf = _kafka_settings(args, producer=True)
    tid = args.transactional_id
    password = _password(args)
    try:
        require_drivers(args.jdbc_url)
    except ImportError as exc:
        raise _CommandError(EXIT_FAILED, str(exc)) from exc
    deadline = Deadline(args.timeout)
    try:
        engine, url = open_database(args.jdbc_url, args.user, password, deadline.left())
    except ConfigurationError as exc:  # a malformed or unsupported URL
        raise _UsageError(f"--jdbc-url: {exc.message}") from exc
    try:
        where = describe_database(url)
        with waiting(where, deadline):
            row = read_state_row(engine, url, args.state_table, tid)
        if row is None:
            raise _CommandError(
                EXIT_UNKNOWN_ID,
                f"transactional id {tid!r} is unknown: the state table {args.state_table!r} "
                f"of {where} has no row for it (recover settles a DualWriter's id from that "
                "writer's database and --state-table); nothing was done",
            )
        seen = _describe_id(conf, tid, deadline)
        if not seen.found:
            stored = f"holds {row.state!r}" if row.state else "holds no transaction"
            raise _CommandError(
                EXIT_UNKNOWN_ID,
                f"{_unknown_to_coordinator(tid)}; its state row {stored}; nothing was done",
            )
        if _confirm_fencing("recover", tid, seen, row, args.yes):
            deadline = Deadline(args.timeout)  # the answer's wait does not count
        outcome = _settle(conf, engine, args, deadline)
    finally:
        engine.dispose()
    print(f"{tid}: {outcome}")
    return EXIT_OK


def _settle(
    conf: dict[str, Any], engine: Engine, args: argparse.Namespace, deadline: Deadline
) -> str:
    """Recovery proper: a DualWriter's start() on the checked id (it never creates the
    table: create_state_table=False; the row exists), bounded by what is left of the
    deadline; its outcome's name."""
    from sqlalchemy.exc import SQLAlchemyError  # noqa: PLC0415 - checked by require_drivers

    from .dualwrite import DualWriter  # noqa: PLC0415 - needs SQLAlchemy

    try:
        writer = DualWriter(
            conf,
            engine,
            state_table=args.state_table,
            create_state_table=False,
            lock_timeout=deadline.left(),
            operation_timeout=deadline.left(),
        )
        try:
            with waiting(f"recovery of {args.transactional_id!r}", deadline):
                return writer.start().value
        finally:
            writer.close()
    except SQLAlchemyError as exc:
        raise _CommandError(EXIT_FAILED, explain(exc, engine.url)) from exc


def _force_terminate(args: argparse.Namespace) -> int:
    from .producer import TransactionalProducer  # noqa: PLC0415

    conf = _kafka_settings(args, producer=True)
    tid = args.transactional_id
    deadline = Deadline(args.timeout)
    before = _describe_id(conf, tid, deadline)
    if not before.found:
        raise _CommandError(
            EXIT_UNKNOWN_ID,
            f"{_unknown_to_coordinator(tid)}; force-terminate does not register an id: "
            "nothing was done",
        )
    if _confirm_fencing("force-terminate", tid, before, None, args.yes):
        deadline = Deadline(args.timeout)
    # KIP-939's forceTerminateTransaction: initialising the id aborts whatever is open
    # and fences every producer that still holds it (the coordinator bumps the epoch).
    with (
        waiting(f"the transaction coordinator of {tid!r}", deadline),
        TransactionalProducer(conf, operation_timeout=deadline.left()) as producer,
    ):
        producer.init_transactions()
    what = "open transaction aborted" if before.state in _OPEN_STATES else "no transaction was open"
    print(
        f"{tid}: was {before.state} (producer id {before.producer_id}, epoch "
        f"{before.producer_epoch}); {what}, older producers fenced"
    )
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    try:
        from ._demo import run_demo  # noqa: PLC0415 - needs the demo extra
    except ImportError as exc:
        raise _CommandError(
            EXIT_FAILED, f"kafka-txn demo needs {exc.name or exc}: pip install 'kafka-txn[demo]'"
        ) from exc
    return run_demo(args.bootstrap_servers, batches=args.batches, seed=args.seed)


# ---------------------------------------------------------------------- arguments
_FENCES = (
    "It FENCES: every producer still using the transactional id (a live writer included) "
    "gets ProducerFencedError. When a writer may be live (the coordinator shows a "
    "transaction that started less than max(its transaction timeout, 60s) ago, or, for "
    "recover, the state row was written that recently), it asks first; --yes skips the "
    "question, and without a terminal (stdin) and without --yes it refuses (exit code 3)."
)
_EPILOG = (
    "Exit codes: 0 done, 1 failed, 2 bad arguments, 3 refused (not confirmed), "
    "4 unknown transactional id."
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """argparse's usage error (exit 2), on one line after the usage."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {_one_line(message)}\n")


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
    p.set_defaults(run=_describe)

    p = sub.add_parser(
        "recover", help="settle an in-doubt dual write as its database decided (fences)",
        description="Commit or abort the id's prepared Kafka transaction as the state "
        "row in the writers' database decided, like a DualWriter's start(). It never "
        "creates a database, a table or a state row: an id without a state row, or one "
        "the coordinator does not know, exits with 4 and nothing done. " + _FENCES,
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
    p.set_defaults(run=_recover)

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
    p.set_defaults(run=_force_terminate)

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: the exit code (argparse's own errors exit with 2)."""
    parser = _parser()
    args = parser.parse_args(argv)
    with configure_logging(args.verbose):
        try:
            code: int = args.run(args)
            return code
        except _CommandError as exc:
            prefix = "refused" if exc.code == EXIT_REFUSED else "error"
            return _fail(exc.code, f"{prefix}: {exc}")
        except _UsageError as exc:
            return _fail(EXIT_USAGE, f"{args.command}: error: {exc}")
        except DatabaseUnusableError as exc:
            return _fail(EXIT_FAILED, f"error: {exc}")
        except KafkaTxnError as exc:
            return _fail(EXIT_FAILED, f"error: {exc.message}")
        except ImportError as exc:
            return _fail(EXIT_FAILED, f"error: {exc}")
        except (RuntimeError, OSError) as exc:
            return _fail(EXIT_FAILED, f"error: {exc}")
        except KeyboardInterrupt:
            return _fail(130, "interrupted")


def _fail(code: int, message: str) -> int:
    print(f"kafka-txn: {_one_line(message)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
