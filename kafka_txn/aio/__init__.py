"""kafka-txn for asyncio: the same producer, dual write and guarantees, awaitable.

- ``producer``: ``AsyncTransactionalProducer``, ``TransactionalProducer`` with its blocking
  calls on a thread of its own and its callbacks on the event loop.
- ``dualwrite``: ``AsyncDualWriter``, ``DualWriter`` over SQLAlchemy's asyncio engines.
- ``bridge``: the worker thread and the hand-over of calls to the event loop.
"""

from typing import TYPE_CHECKING

from kafka_txn._extras import lazy_exports

if TYPE_CHECKING:
    from kafka_txn.aio.dualwrite import AsyncDualWriter, AsyncDualWriteTransaction
    from kafka_txn.aio.producer import AsyncTransactionalProducer

_EXPORTS = {
    "AsyncDualWriter": "kafka_txn.aio.dualwrite",
    "AsyncDualWriteTransaction": "kafka_txn.aio.dualwrite",
    "AsyncTransactionalProducer": "kafka_txn.aio.producer",
}

__all__ = ["AsyncDualWriteTransaction", "AsyncDualWriter", "AsyncTransactionalProducer"]

if not TYPE_CHECKING:
    __getattr__ = lazy_exports(__name__, _EXPORTS)
