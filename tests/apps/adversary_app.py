"""One dual writer of the dual-write soak (tests/dualwrite/test_soak.py), run as a process
that the test SIGKILLs, SIGSTOPs and restarts on real timers.

It loops forever: each transaction inserts ``--records`` rows with ids unique to this run
(``<tag>-<seq>-<i>``) into ``--table`` and produces the same ids to ``--topic``, through a
``DualWriter`` on a transactional id that other instances of this program share. When the
writer fails with an error that means "this writer is done" (fenced, in doubt, database
connection killed, coordinator trouble...) it closes the writer, backs off a little and
starts a new one in the same process, as a supervisor would. It follows the library's
advice literally: ``start()`` that raised ``TransactionOutcomeUnknownError`` ("call it
again") is called again on the same writer.

Errors the library must never raise here end the process: a recovery report that Kafka
lost what the database committed (``TransactionDivergedError``,
``TransactionOutcomeUnknowableError``) with exit code 4, anything else unexpected (misuse,
a bug) with exit code 1 and a traceback on stderr.

Every event is appended to ``--log`` as one line, flushed at once (a SIGKILL loses at
most the event under way): ``started <outcome>``, ``committed <seq> <ids...>``,
``error <ExceptionClass> <message>``, ``fatal <ExceptionClass> <message>``; an error
that carries a state ends with it (``prepared_state=<state>`` of a
TransactionInDoubtError, ``stored_state=<state>`` of a recovery report).
``late_init <called_ms> <failed_ms>``: a start() called at ``called_ms`` (wall clock)
initialised transactions (its InitProducerId completed), then, at ``failed_ms``, could
not release the state-row lock, which its session had lost meanwhile: that init may have
fenced a transaction a newer owner began in between (docs/guarantees.md, "not
guaranteed").

``--async`` runs the same loop with ``AsyncDualWriter`` (``asyncio.run``), on the same
transactional id and state row as the sync instances: the soak mixes both kinds. There,
SQLAlchemy's ``MissingGreenlet``/``AwaitRequired`` (a database call outside the writer's
greenlet: a bug of the async bridge) also end the process with exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import time
import traceback
from typing import TextIO

from sqlalchemy import Column, MetaData, String, Table, insert
from sqlalchemy.exc import AwaitRequired, DBAPIError, MissingGreenlet, SQLAlchemyError

from kafka_txn import (
    ConfigurationError,
    IllegalStateError,
    InvalidPreparedStateError,
    KafkaTxnError,
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
    TransactionOutcomeUnknownError,
)
from kafka_txn.aio import AsyncDualWriter
from kafka_txn.dualwrite.writer import DualWriter

DIVERGED = 4
"""Exit code: recovery reported that Kafka lost (or forgot) a committed transaction."""
UNEXPECTED = 1

_NEVER = (
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
    IllegalStateError,
    ConfigurationError,
    InvalidPreparedStateError,
)
"""Kafka-txn errors that mean a broken promise or a bug here, never a writer to restart."""
_NEVER_ASYNC = (*_NEVER, MissingGreenlet, AwaitRequired)
"""What the async writer must never raise either: SQLAlchemy's errors for a database call
made outside a greenlet (SQLAlchemyErrors, which would otherwise pass for a restart)."""


def data_table(name: str) -> Table:
    """The application's own table: one row per record id."""
    return Table(name, MetaData(), Column("id", String(64), primary_key=True))


class EventLog:
    """The append-only event file the test reads. With KAFKA_TXN_ADVERSARY_TRACE set,
    each event and kafka-txn's INFO log lines also go to stderr (the launch's ``.err``),
    timestamped, for a timeline across the launches of a failed run."""

    def __init__(self, path: str) -> None:
        self._file: TextIO = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._trace = bool(os.environ.get("KAFKA_TXN_ADVERSARY_TRACE"))
        if self._trace:
            logging.basicConfig(
                level=logging.INFO, format="%(created).3f %(process)d %(name)s %(message)s"
            )

    def write(self, *words: object) -> None:
        line = " ".join(str(w) for w in words).replace("\n", " | ")
        self._file.write(line + "\n")
        self._file.flush()
        if self._trace:
            logging.getLogger("adversary").info("%s", line[:300])


def carried(exc: BaseException) -> list[str]:
    """The state ``exc`` carries, as the last word of its event line: which transaction
    an in-doubt commit or a recovery report is about."""
    for name in ("prepared_state", "stored_state"):
        value = getattr(exc, name, None)
        if value:
            return [f"{name}={value}"]
    return []


def _now_ms() -> int:
    return int(time.time() * 1000)


def late_init(writer: DualWriter | AsyncDualWriter) -> bool:
    """Whether the writer's start() initialised transactions and then failed to commit
    the lock's release (DualWriter keeps that outcome for start() to finish)."""
    sync = writer._writer if isinstance(writer, AsyncDualWriter) else writer
    return sync._fenced is not None


def _start(writer: DualWriter, log: EventLog, attempts: int = 3) -> None:
    """``start()``, called again after TransactionOutcomeUnknownError as its message says."""
    for attempt in range(1, attempts + 1):
        try:
            outcome = writer.start()
        except TransactionOutcomeUnknownError as exc:
            if attempt == attempts:
                raise
            log.write("error", type(exc).__name__, f"start() attempt {attempt}: {exc}")
            continue
        log.write("started", outcome.value)
        return


def run(args: argparse.Namespace, log: EventLog) -> int:
    rng = random.Random(args.seed)
    table = data_table(args.table)
    conf = {
        "bootstrap.servers": args.bootstrap_servers,
        "transactional.id": args.transactional_id,
    }
    seq = 0
    while True:
        writer = DualWriter(conf, args.jdbc_url)
        called = _now_ms()
        try:
            _start(writer, log)
            while True:
                seq += 1
                ids = [f"{args.tag}-{seq}-{i}" for i in range(args.records)]
                with writer.transaction() as tx:
                    tx.connection.execute(insert(table), [{"id": i} for i in ids])
                    for record_id in ids:
                        tx.produce(args.topic, record_id.encode(), key=record_id.encode())
                log.write("committed", seq, *ids)
        except _NEVER as exc:
            log.write("fatal", type(exc).__name__, exc, *carried(exc))
            traceback.print_exc()
            lost = (TransactionDivergedError, TransactionOutcomeUnknowableError)
            return DIVERGED if isinstance(exc, lost) else UNEXPECTED
        except (KafkaTxnError, DBAPIError, SQLAlchemyError) as exc:
            # The writer is done: fenced, in doubt, its connection killed, ... A new one
            # recovers whatever it left, as after a crash.
            log.write("error", type(exc).__name__, exc, *carried(exc))
        finally:
            if late_init(writer):
                log.write("late_init", called, _now_ms())
            try:
                writer.close()
            except (KafkaTxnError, SQLAlchemyError) as exc:
                log.write("error", "close", type(exc).__name__, exc)
        time.sleep(rng.uniform(0.0, args.max_backoff))


async def _start_async(writer: AsyncDualWriter, log: EventLog, attempts: int = 3) -> None:
    """``_start`` for an ``AsyncDualWriter``."""
    for attempt in range(1, attempts + 1):
        try:
            outcome = await writer.start()
        except TransactionOutcomeUnknownError as exc:
            if attempt == attempts:
                raise
            log.write("error", type(exc).__name__, f"start() attempt {attempt}: {exc}")
            continue
        log.write("started", outcome.value)
        return


async def run_async(args: argparse.Namespace, log: EventLog) -> int:
    """``run`` with an ``AsyncDualWriter``: the same transactions, events and exit codes."""
    rng = random.Random(args.seed)
    table = data_table(args.table)
    conf = {
        "bootstrap.servers": args.bootstrap_servers,
        "transactional.id": args.transactional_id,
    }
    seq = 0
    while True:
        writer = AsyncDualWriter(conf, args.jdbc_url)
        called = _now_ms()
        try:
            await _start_async(writer, log)
            while True:
                seq += 1
                ids = [f"{args.tag}-{seq}-{i}" for i in range(args.records)]
                async with writer.transaction() as tx:
                    await tx.connection.execute(insert(table), [{"id": i} for i in ids])
                    for record_id in ids:
                        await tx.produce(args.topic, record_id.encode(), key=record_id.encode())
                log.write("committed", seq, *ids)
        except _NEVER_ASYNC as exc:
            log.write("fatal", type(exc).__name__, exc, *carried(exc))
            traceback.print_exc()
            lost = (TransactionDivergedError, TransactionOutcomeUnknowableError)
            return DIVERGED if isinstance(exc, lost) else UNEXPECTED
        except (KafkaTxnError, DBAPIError, SQLAlchemyError) as exc:
            log.write("error", type(exc).__name__, exc, *carried(exc))
        finally:
            if late_init(writer):
                log.write("late_init", called, _now_ms())
            try:
                await writer.close()
            except (KafkaTxnError, SQLAlchemyError) as exc:
                log.write("error", "close", type(exc).__name__, exc)
        await asyncio.sleep(rng.uniform(0.0, args.max_backoff))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jdbc-url", required=True)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--tag", required=True, help="unique to this process")
    parser.add_argument("--log", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--records", type=int, default=3)
    parser.add_argument("--max-backoff", type=float, default=0.3)
    parser.add_argument("--async", dest="use_async", action="store_true")
    args = parser.parse_args(argv)
    log = EventLog(args.log)
    try:
        return asyncio.run(run_async(args, log)) if args.use_async else run(args, log)
    except Exception as exc:  # a bug here or in the library: show it, fail the test
        log.write("fatal", type(exc).__name__, exc)
        traceback.print_exc()
        return UNEXPECTED


if __name__ == "__main__":
    sys.exit(main())
