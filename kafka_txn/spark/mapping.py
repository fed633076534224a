"""How a DataFrame's rows become Kafka records and table rows, the way Spark's Kafka data
source maps them: ``value`` required; ``key``, ``topic``, ``partition``, ``headers``
optional; every column but ``headers`` also goes to the table. Checked on the driver."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import types as spark_types
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
    Table,
    Text,
)
from sqlalchemy.types import TypeEngine

from kafka_txn.dualwrite.engine import validate_identifier
from kafka_txn.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["Mapping", "qualified_table"]


def qualified_table(name: str, what: str, *columns: Any) -> Table:
    """A table named ``table`` or ``schema.table`` (as Spark's ``dbtable`` allows)."""
    schema, _, table = name.rpartition(".")
    if schema:
        validate_identifier(schema, f"{what} schema")
    return Table(validate_identifier(table, what), MetaData(), *columns, schema=schema or None)


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
class Mapping:
    """Which columns the batch has, checked on the driver."""

    columns: tuple[str, ...]
    db_columns: tuple[str, ...]
    has_key: bool
    has_topic: bool
    has_partition: bool
    has_headers: bool
    sql_types: dict[str, TypeEngine[Any]] = field(default_factory=dict)

    @classmethod
    def check(cls, schema: StructType, default_topic: str | None) -> Mapping:
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

    def table(self, name: str) -> Table:
        """The data table ``name`` (``table`` or ``schema.table``) for these columns."""
        columns = (Column(col, self.sql_types[col]) for col in self.db_columns)
        return qualified_table(name, "dbtable", *columns)

    def db_row(self, row: Any) -> dict[str, Any]:
        return {c: row[c] for c in self.db_columns}

    def produce(self, tx: Any, row: Any, default_topic: str | None) -> None:
        """Send ``row`` as a record in ``tx``'s transaction."""
        topic = row["topic"] if self.has_topic and row["topic"] else default_topic
        value = _bytes(row["value"])
        key = _bytes(row["key"]) if self.has_key else None
        partition = row["partition"] if self.has_partition and row["partition"] is not None else -1
        headers = (
            [(h["key"], _bytes(h["value"])) for h in row["headers"] or ()]
            if self.has_headers
            else None
        )
        tx.produce(topic, value, key, partition, None, 0, headers)


def _bytes(value: Any) -> Any:
    """Spark hands binary columns over as bytearray; confluent-kafka wants bytes."""
    return bytes(value) if isinstance(value, bytearray) else value
