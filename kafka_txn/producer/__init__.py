"""The transactional producer: KIP-691's error model over librdkafka.

- ``transactional``: ``TransactionalProducer``, the facade users hold.
- ``lifecycle``: the declared state machine (one table, one transition function).
- ``librdkafka``: the only code that calls confluent-kafka's ``Producer`` (``Driver``,
  ``Handle``), translating its errors through ``kafka_txn.classification``.
- ``completion``: commit and abort, retried and classified.
- ``delivery`` and ``futures``: per-record outcomes and the futures ``send()`` returns.
"""

from typing import TYPE_CHECKING

from kafka_txn._extras import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers; at run time, __getattr__ below
    from kafka_txn.producer.delivery import DeliveryCallback
    from kafka_txn.producer.futures import DeliveryFuture
    from kafka_txn.producer.transactional import Serializer, TransactionalProducer

_EXPORTS = {
    "DeliveryCallback": "kafka_txn.producer.delivery",
    "DeliveryFuture": "kafka_txn.producer.futures",
    "Serializer": "kafka_txn.producer.transactional",
    "TransactionalProducer": "kafka_txn.producer.transactional",
}

__all__ = ["DeliveryCallback", "DeliveryFuture", "Serializer", "TransactionalProducer"]

if not TYPE_CHECKING:  # hidden from type checkers: they would type any name as object
    __getattr__ = lazy_exports(__name__, _EXPORTS)
