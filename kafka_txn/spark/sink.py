"""A PySpark sink that writes each micro-batch to Kafka and a JDBC database exactly once.

    sink = KafkaJdbcSink(
        transactional_id_prefix="orders-sink",          # stable across query restarts
        kafka={"bootstrap.servers": "kafka:9092"}, topic="orders",
        url="jdbc:postgresql://db:5432/shop", dbtable="orders", user="app", password=pw,
    )
    df.writeStream.foreachBatch(sink).option("checkpointLocation", ...).start()
    sink.write(df, batch_id=0)                          # a batch job

Rows become Kafka records the way Spark's Kafka data source maps them (``value``
required; ``key``, ``topic``, ``partition``, ``headers`` optional; string or binary) and
rows of ``dbtable`` (append; every column but ``headers``). The schema is checked on the
driver before anything is written.

Exactly once under task retries, speculative duplicates, executor loss and restarts from
the checkpoint: each partition of a batch is one ``DualWriter`` transaction with the
stable transactional id ``<prefix>-<partition>`` (a retry fences its zombie and first
recovers what it left prepared), and a ``(sink, query, batch, partition)`` commit marker
is written in the same database transaction as the rows and the prepared state, so a
replayed partition finds its marker and writes nothing. Before each batch the driver
checks that the prefix belongs to this query, that a replayed batch has the partition
count it was first written with, and settles every unfinished transaction of the prefix
and, after a batch with more partitions, the ids this one does not use
(``kafka_txn.spark.ledger``, ``kafka_txn.spark.settle``: several at once). Writers are
kept across batches in each Python worker, sharing its engine (``kafka_txn.spark.tasks``).
This needs the batch's partitions to hold the same rows when replayed, as Spark's
replayable sources (files, Kafka) give.

pyspark is an optional extra: ``pip install 'kafka-txn[spark]'``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import Column, MetaData, String, Table
from sqlalchemy.engine import Engine

from kafka_txn.dualwrite.ddl import create_table_if_missing
from kafka_txn.dualwrite.engine import engine_for, validate_identifier
from kafka_txn.dualwrite.jdbc.urls import redact_jdbc_url, redact_settings
from kafka_txn.errors import SinkOwnershipError
from kafka_txn.spark.ledger import Ledger
from kafka_txn.spark.mapping import Mapping as RowMapping
from kafka_txn.spark.mapping import qualified_table
from kafka_txn.spark.options import SinkOptions, StepHook, with_isolation
from kafka_txn.spark.query import resolve_query_id
from kafka_txn.spark.settle import settle_unfinished
from kafka_txn.spark.tasks import PartitionWriter
from kafka_txn.spark.unavailable import check_database, in_sink_terms

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KafkaJdbcSink", "StepHook"]

log = logging.getLogger("kafka_txn.spark")

# What each prefix writes, per database, commits table and query (or batch jobs), as
# sinks of this process used it: two sinks on one prefix (one query writing two tables)
# would share commit markers, and the second would skip every batch the first wrote.
_PREFIX_USES: dict[tuple[str, str, str, str], tuple[str, str | None]] = {}
_PREFIX_USES_LOCK = threading.Lock()


class KafkaJdbcSink:
    """foreachBatch sink writing to Kafka and a JDBC table exactly once (see the module
    docstring and docs/guide/spark.md).

    ``options`` takes Spark-style names, case-insensitive (``kafka.bootstrap.servers``,
    ``topic``, ``url``, ``dbtable``, ``user``, ``password``, ``batchsize``,
    ``isolationLevel``, ``transactionalIdPrefix``, ``commitsTable``, ``stateTable``,
    ``onStep``, ``startOver``, ``lockTimeout``); keyword arguments win. An option the sink does not
    honour is refused by name. ``dbtable`` may be schema-qualified (``public.orders``).

    ``start_over=True`` lets this query take the prefix over from another one (after a
    restart from a fresh checkpoint): set it for the first batch only."""

    def __init__(
        self,
        *,
        transactional_id_prefix: str | None = None,
        url: str | None = None,
        dbtable: str | None = None,
        topic: str | None = None,
        kafka: Mapping[str, Any] | None = None,
        user: str | None = None,
        password: str | None = None,
        options: Mapping[str, Any] | None = None,
        commits_table: str | None = None,
        state_table: str | None = None,
        insert_batch_size: int | None = None,
        isolation_level: str | None = None,
        on_step: StepHook | None = None,
        start_over: bool | None = None,
        lock_timeout: float | None = None,
    ) -> None:
        keywords = {
            "transactional_id_prefix": transactional_id_prefix, "url": url,
            "dbtable": dbtable, "topic": topic, "kafka": kafka, "user": user,
            "password": password, "commits_table": commits_table,
            "state_table": state_table, "insert_batch_size": insert_batch_size,
            "isolation_level": isolation_level, "on_step": on_step, "start_over": start_over,
            "lock_timeout": lock_timeout,
        }  # fmt: skip
        self.options = SinkOptions.build(keywords, options)
        o = self.options
        qualified_table(o.dbtable, "dbtable")  # names are checked now, not in a batch
        validate_identifier(o.state_table, "state_table")
        Ledger.check_names(o.commits_table)
        self._engine: Engine | None = None
        self._ledger: Ledger | None = None
        self._tables_ready: set[tuple[str, ...]] = set()

    # The attributes users read; the settings themselves live in ``options``.
    @property
    def prefix(self) -> str:
        return self.options.transactional_id_prefix

    @property
    def kafka(self) -> dict[str, Any]:
        return self.options.kafka

    @property
    def topic(self) -> str | None:
        return self.options.topic

    @property
    def dbtable(self) -> str:
        return self.options.dbtable

    def __repr__(self) -> str:
        # Secrets stay out: the URL redacted (redact_jdbc_url), Kafka's password-like
        # settings masked, the database password not shown.
        o = self.options
        return (
            f"KafkaJdbcSink(transactional_id_prefix={o.transactional_id_prefix!r}, "
            f"url={redact_jdbc_url(o.url)!r}, dbtable={o.dbtable!r}, topic={o.topic!r}, "
            f"kafka={redact_settings(o.kafka)!r})"
        )

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` entry point. Refuses (``ConfigurationError``) to run where
        the streaming query cannot be told, rather than write as a batch job."""
        self._write(df, batch_id, None, foreach_batch=True)

    def write(self, df: DataFrame, batch_id: int, *, query_id: str | None = None) -> None:
        """Write one batch; running it again with the same ``batch_id`` writes nothing
        new (per-partition commit markers). Outside a streaming query (a batch job),
        every ``batch_id`` names one write.

        The streaming query is the one running on this thread (Spark's local property
        ``sql.streaming.queryId``, also seen by a ``pyspark.InheritableThread``), else
        the active query whose batch ``df`` is. With no query running, ``write()`` is a
        batch job; called from a thread that sees no query while one runs, and ``df``
        not one of its batches, it is refused with ``ConfigurationError`` rather than
        taken for a batch job: pass ``query_id`` (the query's id; ``""`` for a batch
        job)."""
        self._write(df, batch_id, query_id, foreach_batch=False)

    def _write(
        self, df: DataFrame, batch_id: int, query_id: str | None, *, foreach_batch: bool
    ) -> None:
        o = self.options
        mapping = RowMapping.check(df.schema, o.topic)
        query_id = resolve_query_id(df, query_id, foreach_batch=foreach_batch)
        self._claim_prefix(query_id)
        ledger = self._prepare(mapping)
        replaces = ledger.check_owner(query_id, o.start_over)
        partitions = df.rdd.getNumPartitions()  # the RDD foreachPartition runs (cached)
        beyond = ledger.beyond(partitions)
        unfinished = sorted(
            set(ledger.unfinished()) | set(beyond), key=lambda tid: int(tid.rsplit("-", 1)[1])
        )
        if unfinished:
            # An engine for the settling writers alone (their lock_timeout is a setting
            # of the connection on MySQL/MariaDB), closed once they are done: its pool
            # (5 kept, 10 more) has room for SETTLE_THREADS connections at once.
            engine = with_isolation(engine_for(o.url, o.user, o.password), o.isolation_level)
            try:
                with in_sink_terms(
                    f"KafkaJdbcSink batch {batch_id} (settling {unfinished})", engine
                ):
                    settle_unfinished(
                        unfinished, kafka=o.kafka, engine=engine, state_table=o.state_table,
                        lock_timeout=o.lock_timeout,
                    )  # fmt: skip
            finally:
                engine.dispose()
        if beyond:
            ledger.settled_beyond(partitions)
        ledger.record_batch(query_id, batch_id, partitions, replaces)
        df.foreachPartition(PartitionWriter(o, query_id, batch_id, partitions, mapping))

    def close(self) -> None:
        """Release the driver's database connections (the sink can still be used)."""
        if self._engine is not None:
            self._engine.dispose()

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles what foreachBatch closes over; engines do not travel.
        return {**self.__dict__, "_engine": None, "_ledger": None}

    # ------------------------------------------------------------------ internals
    def _claim_prefix(self, query_id: str) -> None:
        """Refuse a prefix another sink of this process used for another table or topic
        in the same query (or batch jobs), database and commits table:
        SinkOwnershipError; ``start_over`` takes the prefix over. Sinks in other
        processes are not seen (docs/guide/spark.md)."""
        o = self.options
        key = (o.url, o.commits_table, o.transactional_id_prefix, query_id)
        mine = (o.dbtable, o.topic)
        with _PREFIX_USES_LOCK:
            if o.start_over:
                _PREFIX_USES[key] = mine
            theirs = _PREFIX_USES.setdefault(key, mine)
        if theirs != mine:
            raise SinkOwnershipError(
                f"transactional id prefix {o.transactional_id_prefix!r} is used by another "
                f"sink of this process, writing table {theirs[0]!r} and topic {theirs[1]!r}; "
                f"this one writes table {mine[0]!r} and topic {mine[1]!r}. Two sinks on one "
                "prefix share commit markers: the second would skip every batch the first "
                "wrote. Give each sink its own transactional_id_prefix (or, if the other "
                "sink is retired for good, start_over=True)",
                kafka_error=None,
            )

    def _prepare(self, mapping: RowMapping) -> Ledger:
        """The engine, the ledger and the tables (DDL once per schema, idempotent under
        concurrency: a second driver or a task creating them at once is fine)."""
        o = self.options
        if self._ledger is None:
            engine = with_isolation(engine_for(o.url, o.user, o.password), o.isolation_level)
            try:  # a database that cannot be opened is named with its fix, in the sink's terms
                check_database(engine)
            except BaseException:
                engine.dispose()
                raise
            state = Table(
                o.state_table, MetaData(),
                Column("transactional_id", String(255)), Column("prepared_txn_state", String),
            )  # fmt: skip
            self._engine = engine
            self._ledger = Ledger(engine, o.transactional_id_prefix, o.commits_table, state)
        if mapping.db_columns not in self._tables_ready:
            assert self._engine is not None
            create_table_if_missing(self._engine, mapping.table(o.dbtable))
            self._ledger.create_tables()
            self._tables_ready.add(mapping.db_columns)
        return self._ledger
