"""How one ``TransactionalProducer`` is put together: its validated configuration turned
into its components (lifecycle, deliveries, driver, sends, two-phase commit, completion,
closing) wired to each other and to librdkafka's callbacks, then confluent-kafka's
Producer built over them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import NamedTuple

from confluent_kafka import Producer

from kafka_txn.config import ValidatedConfig
from kafka_txn.errors import ConfigurationError
from kafka_txn.metrics import MetricsHook
from kafka_txn.producer import arguments
from kafka_txn.producer.closing import Closing
from kafka_txn.producer.completion import Completion
from kafka_txn.producer.delivery import Deliveries
from kafka_txn.producer.handle import build_producer
from kafka_txn.producer.librdkafka import Driver
from kafka_txn.producer.lifecycle import Lifecycle
from kafka_txn.producer.sending import DEFAULT_MESSAGE_MAX_BYTES, Sends, Serializer
from kafka_txn.twophase.prepare import TwoPhase

__all__ = ["Parts", "assemble", "resolve_operation_timeout"]

_LIBRDKAFKA_LOG = logging.getLogger("kafka_txn.librdkafka")


def resolve_operation_timeout(operation_timeout: float | None, validated: ValidatedConfig) -> float:
    """``operation_timeout`` as given, by default ``transaction.timeout.ms``; must be > 0."""
    transaction_timeout_s = validated.transaction_timeout_ms / 1000.0
    if operation_timeout is not None and (
        isinstance(operation_timeout, bool) or not isinstance(operation_timeout, (int, float))
    ):
        arguments.timeout(operation_timeout, "TransactionalProducer", "operation_timeout")
    resolved = operation_timeout if operation_timeout is not None else transaction_timeout_s
    if not (0 < resolved < math.inf):
        raise ConfigurationError(
            f"operation_timeout={operation_timeout!r} must be a positive, finite number of "
            "seconds or None (transaction.timeout.ms)"
        )
    return resolved


def _message_max_bytes(validated: ValidatedConfig) -> int:
    """The producer's ``message.max.bytes`` (librdkafka's default if unset), for the
    message of a record librdkafka refuses as larger."""
    try:
        return int(validated.librdkafka.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES))
    except (TypeError, ValueError):  # librdkafka refuses the value when the producer is built
        return DEFAULT_MESSAGE_MAX_BYTES


class Parts(NamedTuple):
    """The components of one TransactionalProducer."""

    life: Lifecycle
    deliveries: Deliveries
    io: Driver
    sends: Sends
    twophase: TwoPhase | None
    completion: Completion
    closing: Closing
    producer: Producer


def assemble(
    validated: ValidatedConfig,
    *,
    poll: Callable[[float], int],
    key_serializer: Serializer | None,
    value_serializer: Serializer | None,
    operation_timeout: float,
    queue_full_timeout: float,
    prepare_min_time_left: float | None,
    metrics: MetricsHook | None,
    sleep: Callable[[float], None],
) -> Parts:
    """Build a producer's components and wire them to each other and to librdkafka's
    callbacks; ``poll`` is the producer's own (delivery futures' ``result()`` polls)."""
    life = Lifecycle(validated.transactional_id)
    deliveries = Deliveries(
        user_on_delivery=validated.callbacks.get("on_delivery"),
        metrics=metrics,
        on_fatal=life.enter_fatal,
        poll=poll,
    )
    io = Driver(
        transactional_id=validated.transactional_id,
        life=life,
        deliveries=deliveries,
        operation_timeout=operation_timeout,
        sleep=sleep,
        user_error_cb=validated.callbacks.get("error_cb"),
        bootstrap_servers=str(validated.librdkafka.get("bootstrap.servers", "")),
    )
    sends = Sends(
        deliveries=deliveries,
        io=io,
        queue_full_timeout=queue_full_timeout,
        key_serializer=key_serializer,
        value_serializer=value_serializer,
        max_message_bytes=_message_max_bytes(validated),
    )
    conf = dict(validated.librdkafka)
    conf["on_delivery"] = deliveries.sink(validated.error_reports_only)
    conf["error_cb"] = io.on_error
    # librdkafka's own log lines go to Python logging (served from poll()), not stderr.
    conf.setdefault("logger", _LIBRDKAFKA_LOG)
    twophase = TwoPhase.configure(
        conf,
        validated,
        life=life,
        deliveries=deliveries,
        io=io,
        deadline_s=operation_timeout,
        min_time_left_s=prepare_min_time_left,
        sleep=sleep,
        metrics=metrics,
    )
    completion = Completion(
        life=life,
        deliveries=deliveries,
        io=io,
        sends=sends,
        twophase=twophase,
        operation_timeout=operation_timeout,
        metrics=metrics,
    )
    closing = Closing(
        life=life, deliveries=deliveries, io=io, twophase=twophase, completion=completion
    )
    producer = build_producer(conf)
    io.attach(producer)
    return Parts(life, deliveries, io, sends, twophase, completion, closing, producer)
