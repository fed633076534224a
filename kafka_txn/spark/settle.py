"""The Spark sink's driver settling the prefix's unfinished transactions before a batch.

Each unfinished transactional id is settled as a ``DualWriter.start()`` would settle
it (recovery commits the prepared Kafka transaction if the database committed it,
stores the state completed, and fences that id's writers), by a writer of its own.
What one costs is mostly the new producer's ``InitProducerId`` handshake and recovery's
round trips, so the ids are settled by a few threads at once, sharing one engine (one
connection per thread at a time). SQLite serializes writers on one
database-wide lock, held across each settle's Kafka round trips: there, one at a time.

Every id is attempted unless one fails for a reason that is not about that id alone (a
broker out of reach, a lock wait that ran out: the others would wait for the same);
then no further id is started. The batch does not run while any id is unsettled: the
first failure, in partition order, is raised with the others and the ids not tried
noted on it (``__notes__``) and each one logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.engine.base import OptionEngine

from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import (
    InvalidPreparedStateError,
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
)
from kafka_txn.producer.delivery import _add_note

__all__ = ["SETTLE_THREADS", "settle_unfinished", "shared_engine"]

log = logging.getLogger("kafka_txn.spark")

SETTLE_THREADS = 8
"""Unfinished transactional ids the driver settles at once (each one a DualWriter,
with its producer and, while it runs, one database connection: at most what a default
SQLAlchemy pool gives at once, 15)."""

_ABOUT_ONE_ID = (
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
    InvalidPreparedStateError,
)
"""Recovery's verdicts on one id's stored state: the other ids are still settled."""

_NOTED = 20
"""Other failures named on the raised one; the rest are in the log."""


class _SharedEngine(OptionEngine):
    """An engine as each of the writers sharing it sees it: the same pool, which
    ``DualWriter.close()`` (it disposes its engine's pool) leaves to the engine's owner."""

    def dispose(self, close: bool = True) -> None:
        pass


def shared_engine(engine: Engine) -> Engine:
    """``engine`` for writers that share its pool: their ``close()`` leaves it open."""
    return _SharedEngine(engine, {})


def settle_unfinished(
    tids: Sequence[str],
    *,
    kafka: Mapping[str, Any],
    engine: Engine,
    state_table: str,
    lock_timeout: float | None,
    threads: int = SETTLE_THREADS,
) -> None:
    """Settle every id of ``tids`` (see the module docstring); raise the first failure,
    in the order of ``tids``, once no settle runs any more."""
    if not tids:
        return
    shared = shared_engine(engine)
    workers = 1 if engine.dialect.name == "sqlite" else max(1, min(threads, len(tids)))
    stop = threading.Event()

    def settle(tid: str) -> bool:
        if stop.is_set():
            return False
        try:
            _settle(tid, kafka, shared, state_table, lock_timeout)
        except Exception as exc:
            log.error("could not settle %s before the batch: %s", tid, exc)
            if not isinstance(exc, _ABOUT_ONE_ID):
                stop.set()
            raise
        return True

    futures: list[Future[bool]] = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kafka-txn-settle") as pool:
        try:
            futures = [pool.submit(settle, tid) for tid in tids]
            wait(futures)
        except BaseException:  # interrupted: start no further id, let those running end
            stop.set()
            raise
    failures: list[tuple[str, BaseException]] = []
    untried = 0
    for tid, future in zip(tids, futures, strict=True):
        error = future.exception()
        if error is not None:
            failures.append((tid, error))
        elif not future.result():
            untried += 1
    if not failures:
        return
    tid, first = failures[0]
    settled = len(tids) - len(failures) - untried
    summary = (
        f"{tid} could not be settled before the batch, which did not run: "
        f"{len(failures)} of the {len(tids)} unfinished transactional ids failed"
        f"{f', {untried} were not tried after a failure' if untried else ''}, "
        f"{settled} were settled"
    )
    _add_note(first, summary)
    for other, error in failures[1 : 1 + _NOTED]:
        _add_note(first, f"also {other}: {type(error).__name__}: {_short(str(error))}")
    if len(failures) > 1 + _NOTED:
        _add_note(first, f"and {len(failures) - 1 - _NOTED} more (each one logged)")
    raise first


def _settle(
    tid: str,
    kafka: Mapping[str, Any],
    engine: Engine,
    state_table: str,
    lock_timeout: float | None,
) -> None:
    """Recover one unfinished per-partition transaction: commit it if the database
    committed it (a task died in between and its partition is absent or empty in the
    replay), or raise what recovery found. Fences that id's writers."""
    writer = DualWriter(
        {**kafka, "transactional.id": tid},
        engine,
        state_table=state_table,
        lock_timeout=lock_timeout,
    )
    try:
        outcome = writer.start()
        log.info("settled %s before the batch: %s", tid, outcome.value)
    finally:
        writer.close()


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
