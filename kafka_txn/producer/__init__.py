"""The transactional producer: KIP-691's error model over librdkafka.

- ``transactional``: ``TransactionalProducer``, the facade users hold (the public calls
  and the fast path of a send).
- ``assembly``: how a producer's components are built from its configuration and wired.
- ``lifecycle``: the declared state machine (one table, one transition function).
- ``handle``: confluent-kafka's ``Producer`` itself: built, probed, held (``Handle``) and
  let go of.
- ``librdkafka``: the calls into that Producer (``Driver``), retried and translated through
  ``kafka_txn.classification``, and librdkafka's error callback.
- ``sending``: the rest of a send: serializers, a full queue, refused records, the sends
  under way (``Sends``).
- ``completion``: begin, init, commit and abort, retried and classified.
- ``closing``: close(): what is aborted, what is left open, the release of the handle.
- ``delivery`` and ``futures``: per-record outcomes and the futures ``send()`` returns.
"""

from typing import TYPE_CHECKING

from kafka_txn._extras import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers; at run time, __getattr__ below
    from kafka_txn.producer.delivery import DeliveryCallback
    from kafka_txn.producer.futures import DeliveryFuture
    from kafka_txn.producer.sending import Serializer
    from kafka_txn.producer.transactional import TransactionalProducer

_EXPORTS = {
    "DeliveryCallback": "kafka_txn.producer.delivery",
    "DeliveryFuture": "kafka_txn.producer.futures",
    "Serializer": "kafka_txn.producer.sending",
    "TransactionalProducer": "kafka_txn.producer.transactional",
}

__all__ = ["DeliveryCallback", "DeliveryFuture", "Serializer", "TransactionalProducer"]

if not TYPE_CHECKING:  # hidden from type checkers: they would type any name as object
    __getattr__ = lazy_exports(__name__, _EXPORTS)
