"""The Spark sink's bookkeeping in the database, run on the driver before each batch.

Three tables, named after the commits table ``C``:

``C``
    One commit marker per (sink, query, batch, partition), written in the same database
    transaction as the partition's rows and prepared Kafka state: a replayed partition
    that finds its marker writes nothing.
``C_queries``
    Which streaming query owns each transactional-id prefix. Markers and state rows are
    per prefix, so a second query on one prefix (or one restarted from a fresh
    checkpoint, whose batch ids start again at 0) would find the first one's markers and
    skip its own batches. It is refused unless told to start over.
``C_batches``
    How many partitions each batch had when it was first written. A replay with another
    partition count cannot match its markers (the rows of a committed partition moved):
    refused, naming the batch, once any partition of it committed.

Before each batch the driver also settles every unfinished per-partition transaction of
the prefix (a state row not marked completed: a task that died between its database and
Kafka commits, whose partition may be absent or empty in the replay).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    and_,
    func,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import Select

from ._ddl import create_table_if_missing
from .dualwrite import validate_identifier
from .errors import (
    ConfigurationError,
    InvalidPreparedStateError,
    ReplayMismatchError,
    SinkOwnershipError,
)
from .state import PreparedTxnState

__all__ = ["BATCH_JOB", "Ledger", "batch_guard", "batches_table", "commits_table", "queries_table"]

log = logging.getLogger("kafka_txn.spark")

BATCH_JOB = ""
"""The query id recorded for ``sink.write()`` outside a streaming query."""


def commits_table(name: str) -> Table:
    """The commit markers."""
    return Table(
        validate_identifier(name, "commits_table"),
        MetaData(),
        Column("sink", String(200), nullable=False),
        Column("query_id", String(64), nullable=False),
        Column("batch_id", BigInteger, nullable=False),
        Column("partition_id", Integer, nullable=False),
        PrimaryKeyConstraint("sink", "query_id", "batch_id", "partition_id"),
    )


def queries_table(commits: str) -> Table:
    return Table(
        validate_identifier(f"{commits}_queries", "commits_table + '_queries'"),
        MetaData(),
        Column("sink", String(200), primary_key=True),
        Column("query_id", String(64), nullable=False),
        Column("updated_at", DateTime, nullable=False),
    )


def batches_table(commits: str) -> Table:
    return Table(
        validate_identifier(f"{commits}_batches", "commits_table + '_batches'"),
        MetaData(),
        Column("sink", String(200), nullable=False),
        Column("query_id", String(64), nullable=False),
        Column("batch_id", BigInteger, nullable=False),
        Column("partitions", Integer, nullable=False),
        PrimaryKeyConstraint("sink", "query_id", "batch_id"),
    )


def batch_guard(commits: str, prefix: str, query_id: str, batch_id: int) -> Select[Any]:
    """For a task, under its state-row lock: the batch's recorded partition count and
    the prefix's owning query, read FOR SHARE (PostgreSQL ``FOR SHARE``, MySQL/MariaDB
    ``LOCK IN SHARE MODE``; SQLite's write lock already serializes). A task whose batch
    was re-recorded with another shape, or whose query lost the prefix, refuses to
    write; and the driver's re-recording waits for tasks inside their transaction."""
    b, q = batches_table(commits), queries_table(commits)
    return (
        select(b.c.partitions, q.c.query_id)
        .select_from(b.join(q, q.c.sink == b.c.sink))
        .where(b.c.sink == prefix, b.c.query_id == query_id, b.c.batch_id == batch_id)
        .with_for_update(read=True)
    )


def _describe(query_id: str) -> str:
    return (
        "a batch job (sink.write() outside a query)"
        if query_id == BATCH_JOB
        else (f"streaming query {query_id}")
    )


class Ledger:
    """The driver's view of one sink's tables."""

    def __init__(self, engine: Engine, prefix: str, commits: str, state: Table) -> None:
        self.engine = engine
        self.prefix = prefix
        self.commits = commits_table(commits)
        self.queries = queries_table(commits)
        self.batches = batches_table(commits)
        self.state = state
        self._state_exists = False

    @staticmethod
    def check_names(commits: str) -> None:
        """Refuse a commits table name whose derived names are not plain identifiers."""
        commits_table(commits)
        queries_table(commits)
        batches_table(commits)

    def create_tables(self) -> None:
        """Idempotent, also when several drivers or tasks create them at once."""
        for table in (self.commits, self.queries, self.batches):
            create_table_if_missing(self.engine, table)
        columns = inspect(self.engine).get_columns(self.commits.name, schema=self.commits.schema)
        if "query_id" not in {c["name"] for c in columns}:
            raise ConfigurationError(
                f"the commits table {self.commits.name!r} was created by an older kafka-txn "
                "and has no query_id column: give the sink another commits_table "
                "(option commitsTable), or drop that table once no query uses it"
            )

    # ------------------------------------------------------------------ before a batch
    def owner(self) -> str | None:
        """The query id that owns the prefix, if any."""
        with self.engine.connect() as conn:
            return conn.execute(
                select(self.queries.c.query_id).where(self.queries.c.sink == self.prefix)
            ).scalar()

    def check_owner(self, query_id: str, start_over: bool) -> str | None:
        """Refuse ``query_id`` if another query owns the prefix, unless ``start_over``;
        return the previous owner that ``start_over`` replaces (None otherwise)."""
        owner = self.owner()
        if owner is None or owner == query_id:
            return None
        if start_over:
            return owner
        raise SinkOwnershipError(
            f"transactional id prefix {self.prefix!r} belongs to {_describe(owner)}; this "
            f"is {_describe(query_id)}. Two queries on one prefix, or a query restarted "
            "from a fresh checkpoint (its batch ids start again at 0), would skip batches "
            "the other one wrote. Give this query its own transactional_id_prefix; or, if "
            "the old query is stopped for good and this one is meant to start over, set "
            "start_over=True (option startOver) for its first batch",
            kafka_error=None,
        )

    def unfinished(self) -> list[str]:
        """Transactional ids of the prefix whose last state is not marked completed."""
        tid = self.state.c.transactional_id
        stored = self.state.c.prepared_txn_state
        head = f"{self.prefix}-"
        if not self._state_exists:
            # The first task's DualWriter creates it; until then nothing is unfinished.
            self._state_exists = inspect(self.engine).has_table(self.state.name)
            if not self._state_exists:
                return []
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(tid, stored).where(tid.startswith(head, autoescape=True))
            ).all()
        found = []
        for name, text in rows:
            if not name[len(head) :].isdigit():
                continue  # another prefix that merely starts with this one
            try:
                state = PreparedTxnState.parse(text)
            except InvalidPreparedStateError:
                found.append(name)  # recovery reports it properly
                continue
            if not (state.completed or state.is_empty):
                found.append(name)
        return sorted(found, key=lambda name: int(name[len(head) :]))

    def record_batch(
        self, query_id: str, batch_id: int, partitions: int, replaces: str | None
    ) -> None:
        """Take the prefix (over ``replaces``, if given) and record or check the batch's
        partition count, in one database transaction."""
        now = func.now()
        with self.engine.begin() as conn:
            self._take(conn, query_id, replaces, now)
            known = conn.execute(
                select(self.batches.c.partitions).where(self._batch(query_id, batch_id))
            ).scalar()
            if known is None:
                conn.execute(
                    insert(self.batches).values(
                        sink=self.prefix, query_id=query_id, batch_id=batch_id,
                        partitions=partitions,
                    )
                )  # fmt: skip
                return
            if known == partitions:
                return
            # Another shape. The UPDATE first: it waits for every attempt of the earlier
            # run still inside its transaction (each holds this row FOR SHARE, see
            # batch_guard), and any attempt after it reads the new count and refuses.
            # Only then are the markers final, so a zombie of the earlier shape can
            # neither commit behind this check nor after it.
            conn.execute(
                update(self.batches)
                .where(self._batch(query_id, batch_id))
                .values(partitions=partitions)
            )
            committed = self._committed_partitions(conn, query_id, batch_id)
            if committed:
                raise ReplayMismatchError(
                    f"batch {batch_id} of {_describe(query_id)} (prefix {self.prefix!r}) "
                    f"was written with {known} partitions and is replayed with "
                    f"{partitions}: partitions {committed} already committed, so the "
                    "replay cannot match what they wrote (rows would be lost or written "
                    "twice). Replay the batch with the same partitioning (a deterministic "
                    "plan: the same repartition() before the sink)",
                    kafka_error=None,
                )  # the transaction rolls back: the recorded count stays
            log.warning(
                "batch %s had %s partitions when first tried, none committed; now %s",
                batch_id, known, partitions,
            )  # fmt: skip

    def _take(self, conn: Connection, query_id: str, replaces: str | None, now: Any) -> None:
        q = self.queries
        if replaces is not None:
            taken = conn.execute(
                update(q)
                .where(and_(q.c.sink == self.prefix, q.c.query_id == replaces))
                .values(query_id=query_id, updated_at=now)
            ).rowcount
            if taken != 1:
                raise SinkOwnershipError(
                    f"transactional id prefix {self.prefix!r} changed hands while "
                    f"{_describe(query_id)} was starting over: run the batch again",
                    kafka_error=None,
                )
            log.warning(
                "prefix %r: %s replaces %s (start_over)",
                self.prefix, _describe(query_id), _describe(replaces),
            )  # fmt: skip
            return
        owner = conn.execute(select(q.c.query_id).where(q.c.sink == self.prefix)).scalar()
        if owner == query_id:
            return
        if owner is not None:  # another query took it between check and now
            self.check_owner(query_id, start_over=False)
        try:
            with conn.begin_nested():
                conn.execute(insert(q).values(sink=self.prefix, query_id=query_id, updated_at=now))
        except IntegrityError:
            self.check_owner(query_id, start_over=False)  # a concurrent first batch won

    def _batch(self, query_id: str, batch_id: int) -> Any:
        b = self.batches.c
        return and_(b.sink == self.prefix, b.query_id == query_id, b.batch_id == batch_id)

    def _committed_partitions(self, conn: Connection, query_id: str, batch_id: int) -> list[int]:
        c = self.commits.c
        return list(
            conn.execute(
                select(c.partition_id)
                .where(and_(c.sink == self.prefix, c.query_id == query_id, c.batch_id == batch_id))
                .order_by(c.partition_id)
            ).scalars()
        )
