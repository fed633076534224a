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
recovers what it left prepared), and a ``(sink, batch, partition)`` commit marker is
written in the same database transaction as the rows and the prepared state, so a
replayed partition finds its marker and writes nothing. This needs the batch's partitions
to hold the same rows when replayed, as Spark's replayable sources (files, Kafka) give.

pyspark is an optional extra: ``pip install 'kafka-txn[spark]'``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    and_,
    insert,
    select,
)
from sqlalchemy.types import TypeEngine

try:
    from pyspark import TaskContext
    from pyspark.sql import types as spark_types
except ImportError as exc:  # an optional extra
    raise ImportError("kafka_txn.spark needs pyspark: pip install 'kafka-txn[spark]'") from exc

from .dualwrite import DualWriter, engine_for, validate_identifier
from .errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = ["KafkaJdbcSink", "StepHook"]

log = logging.getLogger("kafka_txn.spark")

StepHook = Callable[[str, int, int, int], None]
"""``hook(step, batch_id, partition, attempt)``, called after each DualWriter step in the
executor (fault injection, tracing). Must be picklable: a module-level function."""

_KAFKA_COLUMNS = ("key", "value", "topic", "partition", "headers")


def _sql_type(name: str, spark_type: Any) -> TypeEngine[Any]:
    T = spark_types  # noqa: N806 - reads like Spark's own code
    simple: dict[type, TypeEngine[Any]] = {
        T.StringType: Text(),
        T.BinaryType: LargeBinary(),
        T.ByteType: Integer(),
        T.ShortType: Integer(),
        T.IntegerType: Integer(),
        T.LongType: BigInteger(),
        T.FloatType: Float(),
        T.DoubleType: Float(),
        T.BooleanType: Boolean(),
        T.TimestampType: DateTime(),
        T.TimestampNTZType: DateTime(),
        T.DateType: Date(),
    }
    for spark_cls, sql_type in simple.items():
        if isinstance(spark_type, spark_cls):
            return sql_type
    if isinstance(spark_type, T.DecimalType):
        return Numeric(spark_type.precision, spark_type.scale)
    raise ConfigurationError(
        f"column {name!r} has type {spark_type.simpleString()}, which has no SQL column "
        "type here: cast it (e.g. to_json() for structs, maps and arrays) or drop it"
    )


@dataclass(frozen=True)
class _Mapping:
    """Which columns the batch has, checked on the driver."""

    columns: tuple[str, ...]
    db_columns: tuple[str, ...]
    has_key: bool
    has_topic: bool
    has_partition: bool
    has_headers: bool
    sql_types: dict[str, TypeEngine[Any]] = field(default_factory=dict)

    @classmethod
    def check(cls, schema: StructType, default_topic: str | None) -> _Mapping:
        T = spark_types  # noqa: N806
        fields = {f.name: f.dataType for f in schema.fields}
        text_or_bytes = (T.StringType, T.BinaryType)
        if "value" not in fields:
            raise ConfigurationError(
                "the DataFrame has no 'value' column: Kafka records need one (string or "
                f"binary); columns are {sorted(fields)}"
            )
        for name in ("key", "value"):
            if name in fields and not isinstance(fields[name], text_or_bytes):
                raise ConfigurationError(
                    f"column {name!r} must be string or binary, not "
                    f"{fields[name].simpleString()}: cast it"
                )
        if "topic" in fields and not isinstance(fields["topic"], T.StringType):
            raise ConfigurationError("column 'topic' must be a string")
        if "topic" not in fields and not default_topic:
            raise ConfigurationError(
                "no topic: give the sink topic=... or add a 'topic' column to the DataFrame"
            )
        if "partition" in fields and not isinstance(fields["partition"], T.IntegerType):
            raise ConfigurationError("column 'partition' must be an int")
        if "headers" in fields:
            headers = fields["headers"]
            ok = (
                isinstance(headers, T.ArrayType)
                and isinstance(headers.elementType, T.StructType)
                and [f.name for f in headers.elementType.fields] == ["key", "value"]
            )
            if not ok:
                raise ConfigurationError(
                    "column 'headers' must be array<struct<key:string,value:binary>>, as in "
                    "Spark's Kafka sink"
                )
        db_columns = tuple(n for n in fields if n != "headers")
        for name in db_columns:
            validate_identifier(name, "column name")
        sql_types = {name: _sql_type(name, fields[name]) for name in db_columns}
        return cls(
            columns=tuple(fields),
            db_columns=db_columns,
            has_key="key" in fields,
            has_topic="topic" in fields,
            has_partition="partition" in fields,
            has_headers="headers" in fields,
            sql_types=sql_types,
        )


def _commits_table(name: str) -> Table:
    return Table(
        validate_identifier(name, "commits_table"),
        MetaData(),
        Column("sink", String(200), nullable=False),
        Column("batch_id", BigInteger, nullable=False),
        Column("partition_id", Integer, nullable=False),
        PrimaryKeyConstraint("sink", "batch_id", "partition_id"),
    )


def _data_table(name: str, mapping: _Mapping) -> Table:
    return Table(
        validate_identifier(name, "dbtable"),
        MetaData(),
        *(Column(col, mapping.sql_types[col]) for col in mapping.db_columns),
    )


class KafkaJdbcSink:
    """foreachBatch sink writing to Kafka and a JDBC table exactly once (see the module
    docstring). ``options`` takes Spark-style names (``kafka.bootstrap.servers``, ``topic``,
    ``url``, ``dbtable``, ``user``, ``password``) and is merged under the keywords."""

    def __init__(
        self,
        *,
        transactional_id_prefix: str,
        url: str | None = None,
        dbtable: str | None = None,
        topic: str | None = None,
        kafka: Mapping[str, Any] | None = None,
        user: str | None = None,
        password: str | None = None,
        options: Mapping[str, str] | None = None,
        commits_table: str = "kafka_txn_spark_commits",
        state_table: str = "kafka_transaction_state",
        insert_batch_size: int = 1000,
        on_step: StepHook | None = None,
    ) -> None:
        opts = dict(options or {})
        self.kafka: dict[str, Any] = {
            k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.")
        }
        self.kafka.update(kafka or {})
        for key in ("transactional.id", "transaction.two.phase.commit.enable"):
            if key in self.kafka:
                raise ConfigurationError(
                    f"{key} is set by the sink (one id per partition from "
                    "transactional_id_prefix): remove it from the Kafka settings"
                )
        if "bootstrap.servers" not in self.kafka:
            raise ConfigurationError(
                "Kafka bootstrap servers missing: pass kafka={'bootstrap.servers': ...} "
                "or the option kafka.bootstrap.servers"
            )
        self.url = url or opts.get("url")
        self.dbtable = dbtable or opts.get("dbtable")
        if not self.url or not self.dbtable:
            raise ConfigurationError("the sink needs url= (a JDBC URL) and dbtable=")
        validate_identifier(self.dbtable, "dbtable")
        self.topic = topic or opts.get("topic")
        self.user = user if user is not None else opts.get("user")
        self.password = password if password is not None else opts.get("password")
        if not transactional_id_prefix or len(transactional_id_prefix) > 200:
            raise ConfigurationError(
                "transactional_id_prefix must be 1..200 characters and stable across "
                "restarts of the query (it names each partition's transactional id)"
            )
        self.prefix = transactional_id_prefix
        self.commits_table = commits_table
        self.state_table = validate_identifier(state_table, "state_table")
        _commits_table(commits_table)  # validates the name now
        if insert_batch_size < 1:
            raise ConfigurationError("insert_batch_size must be >= 1")
        self.insert_batch_size = insert_batch_size
        self.on_step = on_step
        self._tables_ready: set[tuple[str, ...]] = set()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` entry point."""
        self.write(df, batch_id)

    def write(self, df: DataFrame, batch_id: int) -> None:
        """Write one batch; running it again with the same ``batch_id`` writes nothing
        new (per-partition commit markers)."""
        mapping = _Mapping.check(df.schema, self.topic)
        self._create_tables(mapping)
        df.foreachPartition(_PartitionWriter(self, batch_id, mapping))

    def _create_tables(self, mapping: _Mapping) -> None:
        """DDL on the driver, so that executors never race on it; once per schema, not
        once per micro-batch."""
        if mapping.db_columns in self._tables_ready:
            return
        engine = engine_for(self.url or "", self.user, self.password)
        try:
            _data_table(self.dbtable or "", mapping).create(engine, checkfirst=True)
            _commits_table(self.commits_table).create(engine, checkfirst=True)
        finally:
            engine.dispose()
        self._tables_ready.add(mapping.db_columns)


class _PartitionWriter:
    """Runs in the executor: one partition of one batch as one dual write."""

    def __init__(self, sink: KafkaJdbcSink, batch_id: int, mapping: _Mapping) -> None:
        self.sink = sink
        self.batch_id = batch_id
        self.mapping = mapping

    def __call__(self, rows: Iterable[Any]) -> None:
        rows = iter(rows)
        first = next(rows, None)
        if first is None:
            return  # an empty partition writes nothing, now or when replayed
        rows = itertools.chain((first,), rows)
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        sink, hook = self.sink, self.sink.on_step
        writer = DualWriter(
            {**sink.kafka, "transactional.id": f"{sink.prefix}-{partition}"},
            sink.url or "",
            user=sink.user,
            password=sink.password,
            state_table=sink.state_table,
            on_step=(
                None if hook is None else lambda step: hook(step, self.batch_id, partition, attempt)
            ),
        )
        data = _data_table(sink.dbtable or "", self.mapping)
        commits = _commits_table(sink.commits_table)
        marker = {"sink": sink.prefix, "batch_id": self.batch_id, "partition_id": partition}
        try:
            writer.start()  # recovers what an earlier attempt of this partition left
            with writer.transaction() as tx:
                done = tx.connection.execute(
                    select(commits.c.batch_id).where(
                        and_(*(commits.c[k] == v for k, v in marker.items()))
                    )
                ).first()
                if done:
                    log.info("batch %s partition %s already written", self.batch_id, partition)
                    return
                for chunk in _chunks(rows, sink.insert_batch_size):
                    tx.connection.execute(
                        insert(data), [{c: r[c] for c in self.mapping.db_columns} for r in chunk]
                    )
                    for r in chunk:
                        self._produce(tx, r)
                tx.connection.execute(insert(commits).values(**marker))
        finally:
            writer.close()

    def _produce(self, tx: Any, row: Any) -> None:
        m = self.mapping
        topic = row["topic"] if m.has_topic and row["topic"] else self.sink.topic
        value = _bytes(row["value"])
        key = _bytes(row["key"]) if m.has_key else None
        partition = row["partition"] if m.has_partition and row["partition"] is not None else -1
        headers = [(h["key"], h["value"]) for h in row["headers"] or ()] if m.has_headers else None
        tx.produce(topic, value, key, partition, None, 0, headers)


def _bytes(value: Any) -> Any:
    """Spark hands binary columns over as bytearray; confluent-kafka wants bytes."""
    return bytes(value) if isinstance(value, bytearray) else value


def _chunks(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
