"""confluent-kafka's ``Producer`` itself: building one (librdkafka's refusals of a setting
become ``ConfigurationError``), probing settings without connecting, and the ``Handle``
through which this library calls it and, at close(), lets go of it, so that its
librdkafka handle (threads, sockets, memory) is destroyed there and then.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, Producer

from kafka_txn.config import user_key_for
from kafka_txn.errors import ConfigurationError, IllegalStateError

__all__ = ["Handle", "build_producer", "probe_settings"]

_PROBE_LOG = logging.Logger("kafka_txn.settings_probe", logging.CRITICAL + 1)
"""Where a settings probe's librdkafka log lines go: nowhere (a Logger outside the
logging tree, above every level: ``debug`` raises librdkafka's log_level)."""
_PROBE_LOG.disabled = True


def probe_settings(librdkafka: Mapping[str, Any]) -> None:
    """Run librdkafka's own checks of ``librdkafka`` (value ranges, the idempotent
    producer's constraints such as ``acks=all``) as a producer's construction would,
    without connecting: a handle made without bootstrap servers, destroyed at once.
    Raises ``ConfigurationError`` as ``TransactionalProducer`` does. For settings checked
    where no producer is built (the Spark sink's driver)."""
    conf = {k: v for k, v in librdkafka.items() if k != "bootstrap.servers"}
    probe = build_producer({**conf, "logger": _PROBE_LOG})
    del probe


def build_producer(conf: dict[str, Any]) -> Producer:
    """confluent-kafka's Producer; librdkafka's refusals become ConfigurationError naming
    the key as the user wrote it."""
    try:
        return Producer(conf)
    except KafkaException as exc:
        err = exc.args[0]
        reason = err.str()
        named = re.search(r'property "([^"]+)"', reason)
        if named is not None:
            key = user_key_for(named.group(1), conf)
            if key != named.group(1):
                reason += f" (set as {key!r})"
        raise ConfigurationError(
            f"librdkafka rejected the producer configuration: {reason}. Check the "
            "property name and value against librdkafka's CONFIGURATION.md",
            kafka_error=err,
        ) from exc
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"librdkafka rejected the producer configuration: {exc}") from exc


class Handle:
    """confluent-kafka's ``Producer`` as this library calls it: one method per call it
    makes, each passing straight through. Frames, bound methods and closures of this
    library hold this object, never the Producer itself, and a stored exception's
    traceback keeps such frames (and their locals) alive, in cycles with the objects
    that store it. ``detach()``, at close(), lets go of the Producer: nothing else holds
    it then (``Driver.produce`` and the producer's own ``_produce`` are let go of too),
    so reference counting destroys it there and then (rd_kafka_destroy: librdkafka's
    threads, sockets and memory), whatever still holds this object. Every call after
    that is refused as after close(); ``len()`` is 0."""

    __slots__ = ("_producer",)

    def __init__(self, producer: Producer) -> None:
        self._producer: Producer | None = producer

    def detach(self) -> None:
        """Let go of the Producer; calls from now on raise ``IllegalStateError``."""
        self._producer = None

    def _live(self, operation: str) -> Producer:
        producer = self._producer
        if producer is None:
            raise IllegalStateError(f"{operation}() called after close()")
        return producer

    def produce(self, *args: Any) -> None:
        self._live("produce").produce(*args)

    def poll(self, timeout: float = -1) -> int:
        return self._live("poll").poll(timeout)

    def flush(self, timeout: float = -1) -> int:
        return self._live("flush").flush(timeout)

    def init_transactions(self, timeout: float = -1) -> None:
        self._live("init_transactions").init_transactions(timeout)

    def begin_transaction(self) -> None:
        self._live("begin_transaction").begin_transaction()

    def commit_transaction(self, timeout: float = -1) -> None:
        self._live("commit_transaction").commit_transaction(timeout)

    def abort_transaction(self, timeout: float = -1) -> None:
        self._live("abort_transaction").abort_transaction(timeout)

    def send_offsets_to_transaction(
        self, offsets: list[Any], group_metadata: Any, timeout: float = -1
    ) -> None:
        producer = self._live("send_offsets_to_transaction")
        producer.send_offsets_to_transaction(offsets, group_metadata, timeout)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self._live("list_topics").list_topics(topic, timeout)

    def close(self) -> None:
        """confluent-kafka's close(), where it has one."""
        close = getattr(self._live("close"), "close", None)
        if close is not None:
            close()

    def __len__(self) -> int:
        producer = self._producer
        return 0 if producer is None else len(producer)

    def __bool__(self) -> bool:
        return True  # as confluent-kafka's Producer: even when nothing is queued
