"""The PySpark sink: each micro-batch to Kafka and a JDBC table, exactly once.

``KafkaJdbcSink`` (``sink``) runs on the driver; ``tasks`` runs each partition as one
``DualWriter`` transaction on the executors; ``ledger`` holds the commit markers,
``settle`` finishes what failed tasks left, ``query`` watches the streaming query,
``options`` and ``mapping`` check the sink's options and the rows' schema. Needs the
``[spark]`` extra.
"""

from typing import TYPE_CHECKING

from kafka_txn._extras import lazy_exports, missing_extra

try:  # the [spark] extra: pyspark, and SQLAlchemy for the database side
    import pyspark  # noqa: F401
    import sqlalchemy  # noqa: F401
except ImportError as exc:
    raise missing_extra("kafka_txn.spark", "spark", exc) from exc

if TYPE_CHECKING:  # the real types for type checkers; at run time, __getattr__ below
    from kafka_txn.spark.sink import KafkaJdbcSink, StepHook

_EXPORTS = {
    "KafkaJdbcSink": "kafka_txn.spark.sink",
    "StepHook": "kafka_txn.spark.sink",
}

__all__ = ["KafkaJdbcSink", "StepHook"]

if not TYPE_CHECKING:  # hidden from type checkers: they would type any name as object
    __getattr__ = lazy_exports(__name__, _EXPORTS)
