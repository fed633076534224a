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
``error <ExceptionClass> <message>``, ``fatal <ExceptionClass> <message>``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from typing import TextIO

from sqlalchemy import Column, MetaData, String, Table, insert
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from kafka_txn import (
    ConfigurationError,
    IllegalStateError,
    InvalidPreparedStateError,
    KafkaTxnError,
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
    TransactionOutcomeUnknownError,
)
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


def data_table(name: str) -> Table:
    """The application's own table: one row per record id."""
    return Table(name, MetaData(), Column("id", String(64), primary_key=True))


class EventLog:
    """The append-only event file the test reads."""

    def __init__(self, path: str) -> None:
        self._file: TextIO = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def write(self, *words: object) -> None:
        line = " ".join(str(w) for w in words).replace("\n", " | ")
        self._file.write(line + "\n")
        self._file.flush()


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
            log.write("fatal", type(exc).__name__, exc)
            traceback.print_exc()
            lost = (TransactionDivergedError, TransactionOutcomeUnknowableError)
            return DIVERGED if isinstance(exc, lost) else UNEXPECTED
        except (KafkaTxnError, DBAPIError, SQLAlchemyError) as exc:
            # The writer is done: fenced, in doubt, its connection killed, ... A new one
            # recovers whatever it left, as after a crash.
            log.write("error", type(exc).__name__, exc)
        finally:
            try:
                writer.close()
            except (KafkaTxnError, SQLAlchemyError) as exc:
                log.write("error", "close", type(exc).__name__, exc)
        time.sleep(rng.uniform(0.0, args.max_backoff))


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
    args = parser.parse_args(argv)
    log = EventLog(args.log)
    try:
        return run(args, log)
    except Exception as exc:  # a bug here or in the library: show it, fail the test
        log.write("fatal", type(exc).__name__, exc)
        traceback.print_exc()
        return UNEXPECTED


if __name__ == "__main__":
    sys.exit(main())
