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
Kafka commits, whose partition may be absent or empty in the replay), and, when the
batch has fewer partitions than one before it, the ids above its count (``beyond``: a
task that died after its prepare and before its database commit left its Kafka
transaction open, and no task of the smaller batch runs that id again).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
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

from kafka_txn.dualwrite.ddl import create_table_if_missing
from kafka_txn.dualwrite.engine import validate_identifier
from kafka_txn.dualwrite.exact_ids import exact_string, fix_statement, inexact, pads
from kafka_txn.errors import (
    ConfigurationError,
    InvalidPreparedStateError,
    ReplayMismatchError,
    SinkOwnershipError,
)
from kafka_txn.state import MAX_SERIALIZED_LENGTH, PreparedTxnState

__all__ = [
    "BATCH_JOB",
    "Ledger",
    "batch_guard",
    "batches_table",
    "commits_table",
    "is_settled",
    "queries_table",
]

log = logging.getLogger("kafka_txn.spark")

BATCH_JOB = ""
"""The query id recorded for ``sink.write()`` outside a streaming query."""


def commits_table(name: str) -> Table:
    """The commit markers."""
    return Table(
        validate_identifier(name, "commits_table"),
        MetaData(),
        Column("sink", exact_string(200), nullable=False),
        Column("query_id", exact_string(64), nullable=False),
        Column("batch_id", BigInteger, nullable=False),
        Column("partition_id", Integer, nullable=False),
        PrimaryKeyConstraint("sink", "query_id", "batch_id", "partition_id"),
    )


def queries_table(commits: str) -> Table:
    return Table(
        validate_identifier(f"{commits}_queries", "commits_table + '_queries'"),
        MetaData(),
        Column("sink", exact_string(200), primary_key=True),
        Column("query_id", exact_string(64), nullable=False),
        Column("updated_at", DateTime, nullable=False),
    )


def batches_table(commits: str) -> Table:
    return Table(
        validate_identifier(f"{commits}_batches", "commits_table + '_batches'"),
        MetaData(),
        Column("sink", exact_string(200), nullable=False),
        Column("query_id", exact_string(64), nullable=False),
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


# A completed state in the exact form PreparedTxnState writes one (kafka_txn/state.py),
# narrowed so that every string it matches parses as a completed state: the fields in
# their written order, each at most once and nothing else; ASCII only, the ids with
# nothing to percent-decode; integers short enough to be within their bounds (pid and
# start under 2**63 with 18 digits, epoch under 32767 with 4, timeout under 2**31 with
# 9). Anything else (a longer number, an encoded id, a key from a newer kafka-txn, a
# tampered row) does not match and goes through the full parse. A regex in the
# query would send fewer rows, but PostgreSQL's engine takes 20-45 us a row on this
# pattern, as much as the parse it saves; Python's takes about 1 us.
_SETTLED = re.compile(
    "kafka-txn:1;(?:tid=[A-Za-z0-9._~-]+;)?pid=[0-9]{1,18};epoch=[0-9]{1,4};"
    "(?:start=[0-9]{1,18};)?(?:cluster=[A-Za-z0-9._~-]+;)?(?:timeout=[0-9]{1,9};)?done=1"
)


def is_settled(stored: object) -> bool:
    """Whether a stored state parses as empty or completed (``PreparedTxnState.parse``),
    without parsing the ones in the written completed form: those are proven by
    ``_SETTLED`` alone. Anything that does not parse is not settled."""
    if stored == "":
        return True
    if (
        isinstance(stored, str)
        and len(stored) <= MAX_SERIALIZED_LENGTH
        and _SETTLED.fullmatch(stored) is not None
    ):
        return True
    try:
        state = PreparedTxnState.parse(stored)  # type: ignore[arg-type]
    except InvalidPreparedStateError:
        return False  # recovery reports it properly
    return state.completed or state.is_empty


def _is_partition(name: str, head: str) -> bool:
    """``name`` is ``head`` followed by a partition number (ASCII digits)."""
    number = name[len(head) :]
    return name.startswith(head) and number.isascii() and number.isdigit()


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
        # Partitions below this count may hold a transaction an earlier batch left open
        # (read from the batches table at the first batch, then kept in memory).
        self._high: int | None = None

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
        self._check_sink_columns()

    def _check_sink_columns(self) -> None:
        """Refuse tables whose ``sink`` column (the transactional-id prefix) compares
        inexactly (MySQL/MariaDB tables created by an earlier kafka-txn ignore case):
        sinks on prefixes ``Orders`` and ``orders`` would share markers, and one would
        skip the other's batches."""
        with self.engine.connect() as conn:
            fixes = [
                (why, fix_statement(conn, table, "sink"))
                for table in (self.commits, self.queries, self.batches)
                if (why := inexact(conn, table, "sink")) is not None
            ]
            padded = self.prefix.endswith(" ") and pads(conn, self.commits, "sink")
        if fixes:
            raise ConfigurationError(
                f"the sink column of the commits tables does not compare transactional id "
                f"prefixes exactly ({fixes[0][0]}), so prefix {self.prefix!r} would share "
                "commit markers with every prefix that differs from it only in case, and "
                "skip their batches. Prefixes are case-sensitive: run "
                + "; ".join(f"`{fix}`" for _, fix in fixes)
                + " (each fails while two rows differ only in case), or give the sink "
                "another commits_table (option commitsTable)"
            )
        if padded:
            raise ConfigurationError(
                f"transactional id prefix {self.prefix!r} ends in a space, which the "
                f"collation of {self.commits.name}.sink ignores (PAD SPACE): it would share "
                "commit markers with the prefix without it. Use a prefix without trailing "
                "spaces"
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
        """Transactional ids of the prefix whose last state is not marked completed (or
        does not parse: recovery then reports what is wrong with it)."""
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
        found = [
            name
            for name, text in rows
            # Not another prefix that merely starts with this one, nor one that differs in
            # case (MySQL/MariaDB's LIKE ignores it under their default collations): the
            # partition number in ASCII digits, the prefix compared here, case and all.
            if _is_partition(name, head) and not is_settled(text)
        ]
        return sorted(found, key=lambda name: int(name[len(head) :]))

    def beyond(self, partitions: int) -> list[str]:
        """Transactional ids of the prefix at or above ``partitions`` that a batch may
        have used since they were last settled: a task killed after its prepare and
        before its database commit leaves its Kafka transaction open while its state row
        (rolled back) still reads completed, and a batch with fewer partitions never
        runs that id again. Only the first call reads the database (the highest count
        recorded for the prefix); the common path, no fewer partitions than before, is
        one comparison."""
        if self._high is None:
            with self.engine.connect() as conn:
                high = conn.execute(
                    select(func.max(self.batches.c.partitions)).where(
                        self.batches.c.sink == self.prefix
                    )
                ).scalar()
            self._high = int(high or 0)
        return [f"{self.prefix}-{p}" for p in range(partitions, self._high)]

    def settled_beyond(self, partitions: int) -> None:
        """The ids ``beyond(partitions)`` named were settled."""
        self._high = partitions

    def record_batch(
        self, query_id: str, batch_id: int, partitions: int, replaces: str | None
    ) -> None:
        """Take the prefix (over ``replaces``, if given) and record or check the batch's
        partition count, in one database transaction."""
        now = func.now()
        # Before the batch can run: its ids may be left open from here on.
        self._high = max(self._high or 0, partitions)
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
