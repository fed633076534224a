"""The Spark sink's executor side: one partition of one batch as one dual write, with the
partition's ``DualWriter`` kept across batches in the Python worker.

Spark's own Kafka sink keeps producers in a per-executor cache; here the cache lives in
the Python worker process (``spark.python.worker.reuse``, on by default), keyed by the
transactional id and every setting that shapes the writer. A cached writer skips the
producer, engine, recovery and ``InitProducerId`` of a new one. Fencing stays correct:
whoever starts a writer for ``<prefix>-<p>`` (a retry on another executor, the driver
settling an unfinished transaction) takes the state row over, and a cached writer that
lost it is noticed before it writes (its owner token is no longer the row's) and
replaced by a new one, whose ``start()`` first recovers what the other one left.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import TaskContext
from sqlalchemy import Table, and_, insert, select
from sqlalchemy.engine import Connection, Engine

from kafka_txn.dualwrite.engine import engine_for
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import ReplayMismatchError, SinkOwnershipError
from kafka_txn.spark.ledger import batch_guard, commits_table
from kafka_txn.spark.options import SinkOptions, StepHook, with_isolation
from kafka_txn.spark.settle import shared_engine
from kafka_txn.spark.unavailable import in_sink_terms

if TYPE_CHECKING:
    from kafka_txn.spark.mapping import Mapping

__all__ = ["PartitionWriter", "close_cached_writers"]

log = logging.getLogger("kafka_txn.spark")

MAX_CACHED_WRITERS = 64
"""Writers kept per Python worker; the least recently used one is closed beyond that."""


class _Relay:
    """The cached writer's ``on_step``: forwards to the current task's hook, if any."""

    def __init__(self) -> None:
        self.target: StepHook | None = None
        self.context = (0, 0, 0)

    def __call__(self, step: str) -> None:
        if self.target is not None:
            self.target(step, *self.context)


@dataclass
class _Cached:
    writer: DualWriter
    relay: _Relay
    started: bool = False


_writers: OrderedDict[tuple[Any, ...], _Cached] = OrderedDict()
_engines: dict[tuple[Any, ...], tuple[Engine, Engine]] = {}
"""The worker's engines, one per database and credentials, each shared by the cached
writers of that database (the engine itself, and the view the writers get)."""
_lock = threading.Lock()


def _key(opts: SinkOptions, tid: str) -> tuple[Any, ...]:
    return (tid, opts.url, opts.user, opts.password, opts.state_table, opts.isolation_level,
            opts.lock_timeout,
            tuple(sorted((k, repr(v)) for k, v in opts.kafka.items())))  # fmt: skip


def _checkout(opts: SinkOptions, tid: str) -> _Cached:
    """The worker's writer for ``tid``, taken out of the cache (one task uses it)."""
    key = _key(opts, tid)
    with _lock:
        cached = _writers.pop(key, None)
    if cached is not None:
        return cached
    relay = _Relay()
    writer = DualWriter(
        {**opts.kafka, "transactional.id": tid},
        _engine(opts),
        state_table=opts.state_table,
        lock_timeout=opts.lock_timeout,
        mark_completed_after=None,  # marked at the end of each task, before the driver looks
        on_step=relay,
    )
    return _Cached(writer, relay)


def _engine(opts: SinkOptions) -> Engine:
    """The worker's engine for the sink's database, shared by its cached writers: a
    worker runs one task at a time, so its pool holds about one idle connection per
    database between batches, not one per cached writer. A writer's close() leaves it
    open; close_cached_writers() closes it."""
    # lock_timeout too: on MySQL/MariaDB and SQLite it is a setting of the connection.
    key = (opts.url, opts.user, opts.password, opts.isolation_level, opts.lock_timeout)
    with _lock:
        known = _engines.get(key)
        if known is None:
            engine = engine_for(opts.url, opts.user, opts.password)
            known = (engine, shared_engine(with_isolation(engine, opts.isolation_level)))
            _engines[key] = known
    return known[1]


def _check_in(opts: SinkOptions, tid: str, cached: _Cached) -> None:
    evicted: list[_Cached] = []
    with _lock:
        _writers[_key(opts, tid)] = cached
        while len(_writers) > MAX_CACHED_WRITERS:
            evicted.append(_writers.popitem(last=False)[1])
    for old in evicted:
        _close(old)


def _close(cached: _Cached) -> None:
    try:
        cached.writer.close()  # never aborts a prepared transaction
    except Exception as exc:  # a writer being thrown away: log, do not mask the cause
        log.warning("closing a sink writer of %s failed: %s", cached.writer.transactional_id, exc)


@atexit.register
def close_cached_writers() -> None:
    """Close every cached writer of this worker, and its engines (at exit; also for
    tests)."""
    with _lock:
        cached = list(_writers.values())
        _writers.clear()
        engines = [engine for engine, _ in _engines.values()]
        _engines.clear()
    for entry in cached:
        _close(entry)
    for engine in engines:
        engine.dispose()


class _AlreadyWrittenError(Exception):
    """Another attempt committed the partition while this one waited for the row lock."""


class PartitionWriter:
    """Runs in the executor: one partition of one batch as one dual write. Pickled with
    the settings only (no engine, no producer)."""

    def __init__(
        self, opts: SinkOptions, query_id: str, batch_id: int, partitions: int, mapping: Mapping
    ) -> None:
        self.opts = opts
        self.query_id = query_id
        self.batch_id = batch_id
        self.partitions = partitions
        """The batch's partition count as the driver recorded it for this run."""
        self.mapping = mapping

    def __call__(self, rows: Iterable[Any]) -> None:
        rows = iter(rows)
        first = next(rows, None)
        if first is None:
            # Writes nothing; whatever an earlier attempt of this partition left
            # unfinished is settled by the driver before the next batch.
            return
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        tid = f"{self.opts.transactional_id_prefix}-{partition}"
        cached = _checkout(self.opts, tid)
        context = (self.batch_id, partition, attempt)
        cached.relay.target, cached.relay.context = self.opts.on_step, context
        where = f"KafkaJdbcSink batch {self.batch_id} partition {partition}"
        try:
            if not cached.started:
                with in_sink_terms(where, cached.writer.engine):
                    cached.writer.start()  # recovers what an earlier attempt of this id left
                cached.started = True
            commits = commits_table(self.opts.commits_table)
            marker = {"sink": self.opts.transactional_id_prefix, "query_id": self.query_id,
                      "batch_id": self.batch_id, "partition_id": partition}  # fmt: skip
            written, owner = self._look(cached.writer, commits, marker)
            if owner != cached.writer.owner:
                # Another writer of this id ran since (a retry elsewhere, the driver
                # settling it): this one is fenced. A new one first recovers what that
                # one left, so that a marker found below is also committed in Kafka.
                _close(cached)
                cached = _checkout(self.opts, tid)
                cached.relay.target, cached.relay.context = self.opts.on_step, context
                with in_sink_terms(where, cached.writer.engine):
                    cached.writer.start()
                cached.started = True
            if written:
                log.info("batch %s partition %s already written", self.batch_id, partition)
            else:
                self._transaction(cached.writer, commits, marker, itertools.chain((first,), rows))
        except BaseException:
            cached.relay.target = None
            _close(cached)  # a failed writer is not reused: the next one starts afresh
            raise
        cached.relay.target = None
        _check_in(self.opts, tid, cached)

    def _transaction(
        self, writer: DualWriter, commits: Table, marker: dict[str, Any], rows: Iterator[Any]
    ) -> None:
        data = self.mapping.table(self.opts.dbtable)
        try:
            with writer.transaction() as tx:
                # Again under the state-row lock: an attempt that held it may have
                # committed the partition while this one waited.
                if tx.connection.execute(_marker_query(commits, marker)).first():
                    raise _AlreadyWrittenError
                self._check_run(tx.connection)
                for chunk in _chunks(rows, self.opts.insert_batch_size):
                    tx.connection.execute(insert(data), [self.mapping.db_row(r) for r in chunk])
                    for r in chunk:
                        self.mapping.produce(tx, r, self.opts.topic)
                tx.connection.execute(insert(commits).values(**marker))
        except _AlreadyWrittenError:
            log.info(
                "batch %s partition %s written by another attempt",
                marker["batch_id"], marker["partition_id"],
            )  # fmt: skip
            return
        writer.store_completed()  # the driver reads completed marks before each batch

    def _check_run(self, conn: Connection) -> None:
        """This attempt belongs to the batch's current run: the driver has not recorded
        it again with another shape since, and the query still owns the prefix. Read
        FOR SHARE, so the driver's re-recording waits until this transaction ends."""
        o = self.opts
        guard = batch_guard(o.commits_table, o.transactional_id_prefix, self.query_id,
                            self.batch_id)  # fmt: skip
        row = conn.execute(guard).first()
        if row is None or row[1] != self.query_id:
            raise SinkOwnershipError(
                f"this attempt of batch {self.batch_id} belongs to a query that no longer "
                f"owns transactional id prefix {o.transactional_id_prefix!r} (owner now: "
                f"{None if row is None else row[1]!r}): it writes nothing",
                kafka_error=None,
            )
        if row[0] != self.partitions:
            raise ReplayMismatchError(
                f"this attempt of batch {self.batch_id} ran with {self.partitions} "
                f"partitions, and the batch has been replayed with {row[0]} since: it is a "
                "leftover of the earlier run and writes nothing",
                kafka_error=None,
            )

    @staticmethod
    def _look(writer: DualWriter, commits: Table, marker: dict[str, Any]) -> tuple[bool, Any]:
        """Is the partition's marker there, and who owns the state row: one connection,
        committed data only (outside the row lock; the marker is checked again under it
        before writing)."""
        state = writer.state_table
        with writer.engine.connect() as conn:
            written = conn.execute(_marker_query(commits, marker)).first() is not None
            owner = conn.execute(
                select(state.c.owner).where(state.c.transactional_id == writer.transactional_id)
            ).scalar()
        return written, owner


def _marker_query(commits: Table, marker: dict[str, Any]) -> Any:
    return select(commits.c.batch_id).where(and_(*(commits.c[k] == v for k, v in marker.items())))


def _chunks(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
