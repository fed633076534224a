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
was written that recently or its owner is a running process of this host
(``_cli_fencing.reasons_to_ask``). After the answer they look again, and refuse if
anything changed while the question was open; recover checks the state row once more
under its lock, before it settles or fences anything (``_cli_fencing.guard_row``).
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import logging
import os
import re
import ssl
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from importlib import metadata
from typing import TYPE_CHECKING, Any, NoReturn

from kafka_txn import __version__
from kafka_txn.cli.database import (
    DatabaseUnusableError,
    StoredRow,
    describe_database,
    explain,
    mark_settled_statement,
    open_database,
    read_state_row,
    require_drivers,
)
from kafka_txn.cli.fencing import (
    OPEN_STATES,
    RowChangedError,
    changes_since,
    guard_row,
    owner_note,
    owner_process,
    reasons_to_ask,
)
from kafka_txn.cli.terminal import Deadline, NotConfirmedError, ask, configure_logging, waiting
from kafka_txn.config import DEFAULT_TRANSACTION_TIMEOUT_MS, validate_config
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient, CoordinatorError
from kafka_txn.coordinator.client import TransactionDescription
from kafka_txn.coordinator.connection import (
    AuthenticationError,
    ProtocolError,
    SaslAuthenticationError,
)
from kafka_txn.errors import (
    ConfigurationError,
    KafkaTxnError,
    ProducerFencedError,
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
    TransactionOutcomeUnknownError,
    UnsupportedBrokerError,
)

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

_PYTHON_OBJECT_KEYS = ("error_cb", "throttle_cb", "stats_cb", "oauth_cb", "on_delivery", "logger")
"""confluent-kafka settings whose value is a Python object (a function; a Logger): a
command line only has strings."""

_PROBE_LOG = logging.Logger("kafka_txn.cli.settings_probe", logging.CRITICAL + 1)
"""Where the settings probe's librdkafka log lines go: nowhere. A Logger outside the
logging tree, above every level (``debug`` raises librdkafka's log_level to 7, so
log_level alone does not silence it)."""
_PROBE_LOG.disabled = True


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
def _kafka_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The librdkafka settings of ``-X``, ``--bootstrap-servers`` and
    ``--transactional-id``, checked the same way for every command before anything
    connects: key=value syntax, no Python-object settings (callbacks, a logger), what the
    coordinator client supports, what a transactional producer requires
    (``validate_config``), and what librdkafka accepts for one (``acks``, ``retries``,
    ``max.in.flight``, ``message.timeout.ms`` against ``transaction.timeout.ms``...): a
    throwaway transactional producer without brokers, which connects nowhere and logs
    nowhere. Any failure is a _UsageError (exit 2)."""
    from confluent_kafka import KafkaException, Producer  # noqa: PLC0415

    conf: dict[str, Any] = {}
    for item in args.X or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise _UsageError(f"-X {item!r} is not key=value")
        if key in _PYTHON_OBJECT_KEYS:
            what = "a logging.Logger" if key == "logger" else "a Python function"
            raise _UsageError(
                f"-X {key}: confluent-kafka takes {what} there, which cannot come from a "
                "command line; leave it out"
            )
        conf[key] = value
    conf["bootstrap.servers"] = args.bootstrap_servers
    conf["transactional.id"] = args.transactional_id
    try:
        ConnectionSettings.from_librdkafka(conf)
        validated = validate_config(conf)  # what a transactional producer requires
        probe_conf = {k: v for k, v in validated.librdkafka.items() if k != "bootstrap.servers"}
        probe = Producer({**probe_conf, "logger": _PROBE_LOG})
        del probe
    except ConfigurationError as exc:
        raise _UsageError(f"-X: {exc.message}") from exc
    except KafkaException as exc:
        reason = exc.args[0].str().removeprefix("Failed to create producer: ")
        raise _UsageError(
            f"-X: librdkafka refuses these settings for a transactional producer: {reason}"
        ) from exc
    except (TypeError, ValueError) as exc:  # confluent-kafka's own checks of a value
        raise _UsageError(f"-X: confluent-kafka refuses these settings: {exc}") from exc
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
        if isinstance(exc.__cause__, ssl.SSLCertVerificationError):
            # Our side refused the broker's certificate, not the broker us. The
            # coordinator's message: "kafka-txn does not trust the TLS certificate of
            # ADDR (WHY): check ...".
            text = str(exc)
            detail = text.partition(" (")[2].rpartition("): check ")[0] or text
            raise _CommandError(
                EXIT_FAILED,
                f"kafka-txn does not trust the TLS certificate of the broker at {servers}, "
                f"and did not connect: {detail} (-X ssl.ca.location, ssl.ca.pem, "
                "ssl.endpoint.identification.algorithm)",
            ) from exc
        settings = (
            # The broker refused the login (credentials, mechanism), not a TLS certificate.
            "-X sasl.username, sasl.password and sasl.mechanism (Apache Kafka answers an "
            "unknown user exactly as a wrong password)"
            if isinstance(exc, SaslAuthenticationError)
            else "the -X sasl.* and ssl.* settings"
        )
        raise _CommandError(
            EXIT_FAILED,
            f"the broker at {servers} refused to authenticate kafka-txn ({exc}): check {settings}",
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


def _confirm_fencing(
    command: str, transactional_id: str, seen: TransactionDescription, row: StoredRow | None,
    yes: bool,
) -> bool:  # fmt: skip
    """Ask before fencing an id a live writer may hold (``reasons_to_ask``); True if a
    question was asked (the wait for the answer does not count against --timeout, and
    the caller must then look again: ``_refuse_if_changed``). Raises
    _CommandError(EXIT_REFUSED) when not confirmed."""
    reasons = reasons_to_ask(seen, row)
    if not reasons or yes:
        return False
    owner = owner_process(row.owner if row is not None else None)
    who = (
        # The state row's owner is gone, yet the id was used recently (the reasons).
        "so it is not that process, but another writer (on another host, or one that "
        "took the id over since) may be using it"
        if owner is not None and owner.running is False
        else "a writer may still be using it"
    )
    situation = (
        f"transactional id {transactional_id!r} {'; and it '.join(reasons)}"
        f"{owner_note(row)}: {who}, and {command} would fence it"
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


def _refuse_if_changed(
    command: str, transactional_id: str, seen: TransactionDescription, row: StoredRow | None,
    seen_now: TransactionDescription, row_now: StoredRow | None,
) -> None:  # fmt: skip
    """After the operator's "yes": refuse (exit 3, nothing done) if the coordinator's view
    or (recover) the state row changed while the question was open: the answer was about
    a writer that may not be the one holding the id now."""
    changed = changes_since(seen, row, seen_now, row_now, with_row=command == "recover")
    if changed:
        raise _CommandError(
            EXIT_REFUSED,
            f"transactional id {transactional_id!r} changed while you were asked: "
            f"{'; '.join(changed)}. Your answer was about what was there before, so "
            f"nothing was done: run {command} again to see who holds it now",
        )


# ---------------------------------------------------------------------- commands
def _describe(args: argparse.Namespace) -> int:
    conf = _kafka_settings(args)
    seen = _describe_id(conf, args.transactional_id, Deadline(args.timeout))
    info = _as_json(args.transactional_id, seen)
    if args.json:
        print(json.dumps(info, sort_keys=True))
    if not seen.found:
        raise _CommandError(EXIT_UNKNOWN_ID, _unknown_to_coordinator(args.transactional_id))
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


def _as_json(transactional_id: str, seen: TransactionDescription) -> dict[str, Any]:
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


def _unknown_to_coordinator(transactional_id: str) -> str:
    return (
        f"transactional id {transactional_id!r} is unknown to the transaction coordinator "
        "(never used, or expired after transactional.id.expiration.ms): check the id and "
        "--bootstrap-servers"
    )


def _recover(args: argparse.Namespace) -> int:
    """Settle the id's in-doubt transaction the way its database decided, through a
    DualWriter's start(); checks first, changes nothing until they pass: the state row
    exists (read without locking or writing), the coordinator knows the id, a writer
    that may be live is confirmed, nothing changed while the question was open, and
    (under the state-row lock, before anything is settled or fenced) the row is still
    the one checked."""
    conf = _kafka_settings(args)
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
                f"{_unknown_to_coordinator(tid)}; its state row {stored}; nothing was "
                f"done{_if_forgotten(tid, row.state, engine, args.state_table)}",
            )
        if _confirm_fencing("recover", tid, seen, row, args.yes):
            deadline = Deadline(args.timeout)  # the answer's wait does not count
            with waiting(where, deadline):
                row_now = read_state_row(engine, url, args.state_table, tid)
            seen_now = _describe_id(conf, tid, deadline)
            _refuse_if_changed("recover", tid, seen, row, seen_now, row_now)
        outcome = _settle(conf, engine, args, deadline, None if args.yes else row)
    finally:
        engine.dispose()
    print(f"{tid}: {outcome}")
    return EXIT_OK


def _settle(
    conf: dict[str, Any], engine: Engine, args: argparse.Namespace, deadline: Deadline,
    expected: StoredRow | None,
) -> str:  # fmt: skip
    """Recovery proper: a DualWriter's start() on the checked id (it never creates the
    table: create_state_table=False; the row exists), bounded by what is left of the
    deadline; its outcome's name. Unless ``--yes``, start() first checks, under the
    state-row lock, that the row is still ``expected`` (``guard_row``)."""
    from sqlalchemy.exc import SQLAlchemyError  # noqa: PLC0415 - checked by require_drivers

    from kafka_txn.dualwrite.writer import DualWriter  # noqa: PLC0415 - needs SQLAlchemy

    tid = args.transactional_id
    try:
        writer = DualWriter(
            conf,
            engine,
            state_table=args.state_table,
            create_state_table=False,
            lock_timeout=deadline.left(),
            operation_timeout=deadline.left(),
        )
        if expected is not None:
            guard_row(writer, expected)
        try:
            with waiting(f"recovery of {tid!r}", deadline):
                return writer.start().value
        finally:
            writer.close()
    except RowChangedError as exc:
        raise _CommandError(
            EXIT_REFUSED,
            f"transactional id {tid!r} changed hands before recover could lock its state "
            f"row: the row's owner is now {exc.owner} (last written {exc.updated}; it was "
            f"{expected.owner if expected else None}). Nothing was done: run recover again "
            "to see who holds it now",
        ) from None
    except ProducerFencedError as exc:
        raise _CommandError(
            EXIT_REFUSED,
            f"another writer took transactional id {tid!r} over while recover ran: recover "
            "settled the stored transaction as the database decided, and fenced nobody "
            f"({exc.message})",
        ) from exc
    except (TransactionDivergedError, TransactionOutcomeUnknowableError) as exc:
        raise _CommandError(EXIT_FAILED, _unsettled(exc, engine, args.state_table)) from exc
    except TransactionOutcomeUnknownError as exc:
        raise _CommandError(
            EXIT_FAILED,
            f"recover of {tid!r} did not complete within {_seconds(deadline.seconds)}s "
            f"({_reason(exc)}): the stored transaction may or may not have been settled, "
            "and the id's producers may or may not have been fenced. Nothing is lost: run "
            "recover again (it settles from the state row, never twice), and check with "
            "kafka-txn describe",
        ) from exc
    except KafkaTxnError as exc:
        _raise_if_timeout_refused(
            exc, conf, " (the stored transaction may be settled already: recovery comes "
            "first, and a second run does not settle it again)",
        )  # fmt: skip
        raise
    except SQLAlchemyError as exc:
        raise _CommandError(EXIT_FAILED, explain(exc, engine.url)) from exc


def _if_forgotten(tid: str, stored: str | None, engine: Engine, table: str) -> str:
    """For an id the coordinator does not know whose state row holds a transaction not
    settled: if the id and brokers are right, Kafka forgot it (expired after
    transactional.id.expiration.ms), and what to do is recovery's unknowable case."""
    from kafka_txn.errors import InvalidPreparedStateError  # noqa: PLC0415
    from kafka_txn.state import PreparedTxnState  # noqa: PLC0415 - pydantic, imported on demand

    try:
        state = PreparedTxnState.parse(stored or "")
    except InvalidPreparedStateError:
        return ""
    if state.is_empty or state.completed:
        return ""
    forgotten = TransactionOutcomeUnknowableError(
        "the coordinator no longer knows the id",
        transactional_id=tid,
        stored_state=str(state),
        observed={"found": False},
    )
    return (
        ". If the id and --bootstrap-servers are right, Kafka forgot it (expired after "
        f"transactional.id.expiration.ms): {_unsettled(forgotten, engine, table)}"
    )


def _unsettled(
    exc: TransactionDivergedError | TransactionOutcomeUnknowableError, engine: Engine, table: str
) -> str:
    """What recover says when recovery cannot settle the stored transaction: what Kafka
    shows, what to check and do by hand, what not to do. The library's message tells a
    program to call ``DualWriter.resolve()``; at a command line that step is a
    compare-and-set UPDATE of the state row, given in full, run after the re-send."""
    from kafka_txn.state import PreparedTxnState  # noqa: PLC0415 - pydantic, imported on demand

    tid, stored, seen = exc.transactional_id, exc.stored_state, exc.observed
    update = mark_settled_statement(
        engine, table, tid, stored, str(PreparedTxnState(stored).mark_completed())
    )
    if not seen.get("found", True):
        shown = "the coordinator no longer knows the id"
    else:
        shown = (
            f"the coordinator shows state {seen.get('state')}, producer id "
            f"{seen.get('producer_id')}, epoch {seen.get('producer_epoch')}, transaction "
            f"started at {seen.get('transaction_start_time_ms')} ms"
        )
    dont = (
        "Do not run force-terminate for this (it leaves the state row as it is), and do "
        "not delete the state row or empty its state (the writer would go on without "
        "those records). Until the row is updated, the writer's start() and recover "
        "report the same"
    )
    if isinstance(exc, TransactionDivergedError):
        return (
            f"recover of {tid!r} cannot settle it: Kafka aborted the transaction that the "
            f"database committed ({shown}; stored state {stored!r}). None of its records "
            "became visible through that transaction; an earlier re-send (this advice "
            "followed before, interrupted before the UPDATE) may have sent them since. By "
            "hand: 1. read the topics it wrote with a read_committed consumer "
            "(kafka-console-consumer.sh --isolation-level read_committed) and produce "
            "again that database transaction's records that are not there (all of them "
            "unless an earlier re-send is there; your application's re-send, or a "
            "producer of your own); 2. only then mark the transaction settled in the "
            f"state row, so that the writer can start: {update}; (it changes 1 row; 0 "
            "rows: another writer moved on, run recover again). Do not update the row "
            f"before the records are sent again: they would be lost. {dont}. Then remove "
            "the cause: a transaction.timeout.ms shorter than a crash, restart and "
            "recovery take, or two writers sharing the transactional id"
        )
    return (
        f"recover of {tid!r} cannot settle it: whether Kafka committed the transaction "
        f"that the database committed cannot be known ({shown}; stored state {stored!r}). "
        "Do not send all its records again (some may be in the topic: duplicates) and do "
        "not just mark it settled (some may be missing: lost). By hand: 1. read the "
        "topics it wrote with a read_committed consumer (kafka-console-consumer.sh "
        "--isolation-level read_committed) and find which of that database transaction's "
        "records are there; 2. produce only the missing ones; 3. then mark the "
        f"transaction settled in the state row, so that the writer can start: {update}; "
        "(it changes 1 row; 0 rows: another writer moved on, run recover again). "
        f"{dont}"
    )


def _reason(exc: KafkaTxnError) -> str:
    """What librdkafka (or the coordinator client) said, without the library's advice to
    a program ("call init_transactions() again"), which is not the operator's."""
    return exc.kafka_error.str() if exc.kafka_error is not None else exc.message


def _raise_if_timeout_refused(exc: KafkaTxnError, conf: dict[str, Any], more: str) -> None:
    """The broker refused the init because transaction.timeout.ms exceeds its
    transaction.max.timeout.ms (INVALID_TRANSACTION_TIMEOUT, from InitProducerId): a
    setting only the broker can judge, named as such; the init failed, so nothing was
    fenced."""
    from confluent_kafka import KafkaError  # noqa: PLC0415

    if exc.kafka_error is None or exc.kafka_error.code() != KafkaError.INVALID_TRANSACTION_TIMEOUT:
        return
    timeout = conf.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
    raise _CommandError(
        EXIT_FAILED,
        f"the broker refuses transaction.timeout.ms={timeout} (more than its "
        "transaction.max.timeout.ms): pass a smaller -X transaction.timeout.ms, or none; "
        f"nothing was fenced{more}",
    ) from exc


def _force_terminate(args: argparse.Namespace) -> int:
    from kafka_txn.producer.transactional import TransactionalProducer  # noqa: PLC0415

    conf = _kafka_settings(args)
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
        now = _describe_id(conf, tid, deadline)
        _refuse_if_changed("force-terminate", tid, before, None, now, None)
        before = now
    # KIP-939's forceTerminateTransaction: initialising the id aborts whatever is open
    # and fences every producer that still holds it (the coordinator bumps the epoch).
    try:
        with (
            waiting(f"the transaction coordinator of {tid!r}", deadline),
            TransactionalProducer(conf, operation_timeout=deadline.left()) as producer,
        ):
            producer.init_transactions()
    except TransactionOutcomeUnknownError as exc:
        raise _CommandError(
            EXIT_FAILED,
            f"force-terminate of {tid!r} did not complete within "
            f"{_seconds(deadline.seconds)}s ({_reason(exc)}): the broker may or may not "
            "have aborted its open transaction and fenced its producers. Run the same "
            "command again (it is safe to repeat), or check with kafka-txn describe",
        ) from exc
    except KafkaTxnError as exc:
        _raise_if_timeout_refused(exc, conf, "")
        raise
    what = "open transaction aborted" if before.state in OPEN_STATES else "no transaction was open"
    print(
        f"{tid}: was {before.state} (producer id {before.producer_id}, epoch "
        f"{before.producer_epoch}); {what}, older producers fenced"
    )
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    try:
        from kafka_txn.cli.demo import run_demo  # noqa: PLC0415 - needs the demo extra
    except ImportError as exc:
        raise _CommandError(
            EXIT_FAILED, f"kafka-txn demo needs {exc.name or exc}: pip install 'kafka-txn[demo]'"
        ) from exc
    return run_demo(args.bootstrap_servers, batches=args.batches, seed=args.seed)


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
