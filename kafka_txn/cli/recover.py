"""``kafka-txn recover``: settle a DualWriter's in-doubt transaction the way its database
decided, through the writer's own ``start()`` (KIP-939's recovery, emulated client-side).

It changes nothing until its checks pass: the state row exists (read without locking or
writing), the coordinator knows the id, the operator confirmed when a writer may be live,
nothing changed while the question was open, and, under the state-row lock, the row is
still the one checked. When recovery cannot settle the transaction (Kafka aborted what
the database committed, or cannot tell), it exits with 1 and says what to check and do
by hand, with the compare-and-set UPDATE of the state row to run last.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from kafka_txn.cli.coordinator import describe_id, unknown_to_coordinator
from kafka_txn.cli.database import (
    StoredRow,
    describe_database,
    explain,
    mark_settled_statement,
    open_database,
    read_state_row,
    require_drivers,
)
from kafka_txn.cli.exits import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNKNOWN_ID,
    CommandError,
    UsageError,
    failure_reason,
    format_seconds,
    raise_if_timeout_refused,
)
from kafka_txn.cli.fencing import RowChangedError, confirm_fencing, guard_row, refuse_if_changed
from kafka_txn.cli.settings import database_password, kafka_settings
from kafka_txn.cli.terminal import Deadline, waiting
from kafka_txn.errors import (
    ConfigurationError,
    KafkaTxnError,
    ProducerFencedError,
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
    TransactionOutcomeUnknownError,
)

if TYPE_CHECKING:  # SQLAlchemy is an extra, imported by recover only
    from sqlalchemy.engine import Engine

__all__ = ["recover", "settle"]


def recover(args: argparse.Namespace) -> int:
    """Settle the id's in-doubt transaction the way its database decided, through a
    DualWriter's start(); checks first, changes nothing until they pass: the state row
    exists (read without locking or writing), the coordinator knows the id, a writer
    that may be live is confirmed, nothing changed while the question was open, and
    (under the state-row lock, before anything is settled or fenced) the row is still
    the one checked."""
    conf = kafka_settings(args)
    tid = args.transactional_id
    password = database_password(args)
    try:
        require_drivers(args.jdbc_url)
    except ImportError as exc:
        raise CommandError(EXIT_FAILED, str(exc)) from exc
    deadline = Deadline(args.timeout)
    try:
        engine, url = open_database(args.jdbc_url, args.user, password, deadline.left())
    except ConfigurationError as exc:  # a malformed or unsupported URL
        raise UsageError(f"--jdbc-url: {exc.message}") from exc
    try:
        where = describe_database(url)
        with waiting(where, deadline):
            row = read_state_row(engine, url, args.state_table, tid)
        if row is None:
            raise CommandError(
                EXIT_UNKNOWN_ID,
                f"transactional id {tid!r} is unknown: the state table {args.state_table!r} "
                f"of {where} has no row for it (recover settles a DualWriter's id from that "
                "writer's database and --state-table); nothing was done",
            )
        seen = describe_id(conf, tid, deadline)
        if not seen.found:
            stored = f"holds {row.state!r}" if row.state else "holds no transaction"
            raise CommandError(
                EXIT_UNKNOWN_ID,
                f"{unknown_to_coordinator(tid)}; its state row {stored}; nothing was "
                f"done{_if_forgotten(tid, row.state, engine, args.state_table)}",
            )
        if confirm_fencing("recover", tid, seen, row, args.yes):
            deadline = Deadline(args.timeout)  # the answer's wait does not count
            with waiting(where, deadline):
                row_now = read_state_row(engine, url, args.state_table, tid)
            seen_now = describe_id(conf, tid, deadline)
            refuse_if_changed("recover", tid, seen, row, seen_now, row_now)
        outcome = settle(conf, engine, args, deadline, None if args.yes else row)
    finally:
        engine.dispose()
    print(f"{tid}: {outcome}")
    return EXIT_OK


def settle(
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
        raise CommandError(
            EXIT_REFUSED,
            f"transactional id {tid!r} changed hands before recover could lock its state "
            f"row: the row's owner is now {exc.owner} (last written {exc.updated}; it was "
            f"{expected.owner if expected else None}). Nothing was done: run recover again "
            "to see who holds it now",
        ) from None
    except ProducerFencedError as exc:
        raise CommandError(
            EXIT_REFUSED,
            f"another writer took transactional id {tid!r} over while recover ran: recover "
            "settled the stored transaction as the database decided, and fenced nobody "
            f"({exc.message})",
        ) from exc
    except (TransactionDivergedError, TransactionOutcomeUnknowableError) as exc:
        raise CommandError(EXIT_FAILED, _unsettled(exc, engine, args.state_table)) from exc
    except TransactionOutcomeUnknownError as exc:
        raise CommandError(
            EXIT_FAILED,
            f"recover of {tid!r} did not complete within {format_seconds(deadline.seconds)}s "
            f"({failure_reason(exc)}): the stored transaction may or may not have been settled, "
            "and the id's producers may or may not have been fenced. Nothing is lost: run "
            "recover again (it settles from the state row, never twice), and check with "
            "kafka-txn describe",
        ) from exc
    except KafkaTxnError as exc:
        raise_if_timeout_refused(
            exc, conf, " (the stored transaction may be settled already: recovery comes "
            "first, and a second run does not settle it again)",
        )  # fmt: skip
        raise
    except SQLAlchemyError as exc:
        raise CommandError(EXIT_FAILED, explain(exc, engine.url)) from exc


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
