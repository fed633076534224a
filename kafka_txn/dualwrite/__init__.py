"""Kafka and a SQL database written atomically: KIP-939's dual-write recipe.

``DualWriter`` (``writer``) runs the recipe; the modules beside it hold what it stands on:
the engine and its sessions, the state row and its lock, the completion marks, the body's
guards, the DDL, exact ids and the PostgreSQL pipeline; ``jdbc`` turns JDBC URLs into
SQLAlchemy URLs and redacts them. Needs the ``[sql]`` extra.
"""

from typing import TYPE_CHECKING

from kafka_txn._extras import lazy_exports, missing_extra

try:
    import sqlalchemy  # noqa: F401 - the [sql] extra is installed
except ImportError as exc:
    raise missing_extra("kafka_txn.dualwrite", "sql", exc) from exc

if TYPE_CHECKING:  # the real types for type checkers; at run time, __getattr__ below
    from kafka_txn.dualwrite.engine import engine_for, validate_identifier
    from kafka_txn.dualwrite.writer import STEPS, DualWriter, DualWriteTransaction

_EXPORTS = {
    "STEPS": "kafka_txn.dualwrite.writer",
    "DualWriteTransaction": "kafka_txn.dualwrite.writer",
    "DualWriter": "kafka_txn.dualwrite.writer",
    "engine_for": "kafka_txn.dualwrite.engine",
    "validate_identifier": "kafka_txn.dualwrite.engine",
}

__all__ = ["STEPS", "DualWriteTransaction", "DualWriter", "engine_for", "validate_identifier"]

if not TYPE_CHECKING:  # hidden from type checkers: they would type any name as object
    __getattr__ = lazy_exports(__name__, _EXPORTS)
