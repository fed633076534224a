"""JDBC URLs: parsed into SQLAlchemy URLs (``urls``), their parameters (``params``), and
redacted wherever they are printed (``redact``).
"""

from typing import TYPE_CHECKING

from kafka_txn._extras import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers; at run time, __getattr__ below
    from kafka_txn.dualwrite.jdbc.urls import SUPPORTED_SCHEMES, jdbc_to_sqlalchemy

_EXPORTS = {
    "SUPPORTED_SCHEMES": "kafka_txn.dualwrite.jdbc.urls",
    "jdbc_to_sqlalchemy": "kafka_txn.dualwrite.jdbc.urls",
}

__all__ = ["SUPPORTED_SCHEMES", "jdbc_to_sqlalchemy"]

if not TYPE_CHECKING:  # hidden from type checkers: they would type any name as object
    __getattr__ = lazy_exports(__name__, _EXPORTS)
