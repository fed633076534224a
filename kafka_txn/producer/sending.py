"""The send path of ``TransactionalProducer`` around its fast path (which stays in
``produce()``/``send()``, one frame over confluent-kafka's produce()): the serializers,
the wait for room in a full local queue, records librdkafka or confluent-kafka refuse
before queuing them, a send a signal interrupted, and the count of sends under way that
prepare, commit and abort wait for.

A record that never entered librdkafka would not stop librdkafka from committing: each
such failure is recorded (``Deliveries.record_failure``), so that commit_transaction()
refuses (KIP-691).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.serialization import MessageField, SerializationContext

from kafka_txn.classification import classify, produce_failure
from kafka_txn.errors import (
    ErrorCategory,
    IllegalStateError,
    KafkaTxnError,
    ProduceFailedException,
    TransactionAbortableError,
    _RecordTypeError,
)
from kafka_txn.producer.arguments import topic_problem
from kafka_txn.producer.delivery import Deliveries, _add_note
from kafka_txn.producer.librdkafka import Driver

__all__ = ["Sends", "Serializer"]

Serializer = Callable[[Any, SerializationContext], bytes | None]
"""A confluent-kafka ``Serializer`` or any callable of the same shape."""

_SEND_NAMES = frozenset({"produce", "produce_batch", "send"})
"""TransactionalProducer's send methods, whose frames hold ``under_way`` as a local."""

_ZIP_MISMATCH = re.compile(r"zip\(\) argument 2 is (shorter|longer) than argument 1")
"""What ``zip(values, keys, strict=True)`` raises when the lengths differ."""

_PADDING = 8
"""Entries ``Sends.under_way`` holds when no send is under way. CPython shrinks a
list's storage when it falls below half its capacity, so an empty list would free and
reallocate its storage on every append/pop pair (~40 ns); eight entries keep one
capacity for up to eight sends under way at once."""

_MAX_KNOWN_TOPICS = 10_000
"""Valid topic names ``Sends.topics`` remembers; a producer sending to more names than
this checks the others on every send (a regular expression, ~0.3 µs)."""

DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``."""


class Sends:
    """The sends of one TransactionalProducer: what its ``produce()``/``send()`` hand on
    when a record does not go straight into librdkafka, and how many are under way."""

    def __init__(
        self,
        *,
        deliveries: Deliveries,
        io: Driver,
        queue_full_timeout: float,
        key_serializer: Serializer | None,
        value_serializer: Serializer | None,
        max_message_bytes: int = DEFAULT_MESSAGE_MAX_BYTES,
    ) -> None:
        self._deliveries = deliveries
        self._max_message_bytes = max_message_bytes
        self.topics: set[str] = set()
        """Topic names already found valid (``check_topic``): produce()/send() test a
        name against this set, and call ``check_topic`` only for one not in it."""
        self._io = io
        self._queue_full_timeout = queue_full_timeout
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        # produce()/send() calls under way, for prepare, commit and abort to wait for (see
        # await_sends): each send appends an entry before its state check and pops one
        # when it returns. list.append, list.pop and len() are single C calls, atomic
        # under the GIL; one list costs less per record than a lock or two counters.
        # The producer appends and pops itself.
        self.under_way: list[None] = [None] * _PADDING
        self.defer_full_queue = False
        """True: a full queue raises librdkafka's ``BufferError`` out of produce()/send()
        at once, unrecorded, for the caller to wait for room its own way and try again
        (``kafka_txn.aio``, whose event loop must not block); ``queue_full`` records the
        failure once it gives up."""

    def serialize(self, topic: str, key: Any, value: Any, headers: Any) -> tuple[Any, Any]:
        field = MessageField.KEY
        try:
            if self._key_serializer is not None:
                key = self._key_serializer(key, SerializationContext(topic, field, headers))
            field = MessageField.VALUE
            if self._value_serializer is not None:
                value = self._value_serializer(value, SerializationContext(topic, field, headers))
        except Exception as exc:
            code = (
                KafkaError._KEY_SERIALIZATION
                if field == MessageField.KEY
                else KafkaError._VALUE_SERIALIZATION
            )
            failure = produce_failure(
                KafkaError(code, f"{field} serializer failed: {exc!r}"), topic, None, None
            )
            self._deliveries.record_failure(failure)
            raise failure from exc
        return key, value

    def check_topic(self, topic: Any, partition: Any, key: Any) -> None:
        """A topic name produce()/send() meets for the first time: a valid one is
        remembered; an invalid one (Kafka's rule, ``arguments.topic_problem``) is
        refused here, before librdkafka queues the record, as a failed record
        (TOPIC_EXCEPTION, MESSAGE_REJECTED) that makes the transaction uncommittable;
        librdkafka would queue it and fail only when its metadata request is refused,
        at commit. A topic that is no str is left to confluent-kafka, which refuses its
        type (``refused``)."""
        if not isinstance(topic, str):
            return
        problem = topic_problem(topic)
        if problem is None:
            if len(self.topics) < _MAX_KNOWN_TOPICS:
                self.topics.add(topic)
            return
        err = KafkaError(
            KafkaError.TOPIC_EXCEPTION,
            f"refused by the client before it was sent: {topic[:60]!r} is not a valid "
            f"topic name ({problem})",
        )
        failure = produce_failure(
            err,
            topic,
            partition if isinstance(partition, int) else None,
            key if isinstance(key, (bytes, str)) else None,
        )
        self._deliveries.record_failure(failure)
        raise failure

    def produce_failed(
        self,
        exc: Exception,
        topic: str,
        value: Any,
        key: Any,
        partition: int,
        cb: Callable[..., None] | None,
        timestamp: int,
        headers: Any,
    ) -> None:
        """The slow path of produce()/send(): a record librdkafka refused, arguments of
        the wrong type, or a full queue, where it serves delivery reports until there is
        room, like Java's send() blocking up to max.block.ms. A send that close() overtook
        (another thread's, after its state check) is refused as after close(). A record
        ``check_topic`` refused is recorded already: its failure is raised as it is."""
        if isinstance(exc, ProduceFailedException):
            raise exc
        if self.defer_full_queue and isinstance(exc, BufferError):
            raise exc
        deadline = time.monotonic() + self._queue_full_timeout
        while isinstance(exc, BufferError):
            if time.monotonic() >= deadline:
                raise self.queue_full(topic, partition, key) from None
            self._io.poll(0.05)
            try:
                self._io.produce(topic, value, key, partition, cb, None, timestamp, headers)
                return
            except Exception as again:  # dispatched below, like the first failure
                exc = again
        if isinstance(exc, IllegalStateError):  # the handle was let go of: Handle.detach
            raise exc
        if isinstance(exc, KafkaException):
            refusal = self.sync_failure(exc, topic, partition, key, value)
            raise refusal from refusal.__cause__ or exc
        failure = self.refused(exc, topic, value, key, partition)
        if isinstance(exc, TypeError):
            raise self.type_error(exc, key, value, failure) from None
        raise failure from exc

    def batch(self, topic: str, records: Iterator[Any], keyed: bool, partition: int) -> int:
        """The records of ``produce_batch()``, queued one by one in a loop with nothing
        per record but confluent-kafka's produce() and the loop's own count: the state
        check, the mark of a send under way and the topic check were done once for the
        batch. A record that does not go straight in takes ``produce()``'s slow path
        (``produce_failed``): a full queue is waited for and the batch goes on; a refused
        record is recorded, as in produce(), and raised, the records after it not
        queued. An iterable that raises, or keys and values that turn out of different
        lengths, leave the records before queued: that is recorded as a failed record
        too, so that the transaction cannot commit a part of the batch. Returns how many
        records were queued: all of them."""
        produce = self._io.produce
        serializing = self._key_serializer is not None or self._value_serializer is not None
        done = count = 0
        value: Any = None
        key: Any = None
        while True:
            # count: records taken from the iterable; done: records queued. They differ
            # after an exception only when produce() raised for the record taken last.
            try:
                if serializing:
                    for count, record in enumerate(records, done + 1):
                        value, key = record if keyed else (record, None)
                        key, value = self.serialize(topic, key, value, None)
                        produce(topic, value, key, partition)
                        done = count
                elif keyed and partition == -1:
                    for count, (value, key) in enumerate(records, done + 1):
                        produce(topic, value, key)
                        done = count
                elif keyed:
                    for count, (value, key) in enumerate(records, done + 1):
                        produce(topic, value, key, partition)
                        done = count
                elif partition == -1:
                    for count, value in enumerate(records, done + 1):
                        produce(topic, value)
                        done = count
                else:
                    for count, value in enumerate(records, done + 1):
                        produce(topic, value, None, partition)
                        done = count
                return done
            except Exception as exc:
                failed: Exception = exc
            if self._io.produce is not produce:
                # close() (a signal handler on this thread) let go of the handle during
                # the batch: refused as after close(), as produce() is (Handle.detach).
                raise IllegalStateError("produce_batch() called after close()") from None
            # Outside the except block, as in produce(): the slow path calls librdkafka.
            if count == done:  # the iterable raised, not produce()
                self._broken_batch(failed, topic, partition, done, keyed)
            try:
                self.produce_failed(failed, topic, value, key, partition, None, 0, None)
            except Exception as exc:
                _add_note(
                    exc,
                    f"record {done} of the batch (counting from 0): the {done} before it "
                    "were queued, none after it",
                )
                raise
            done = count  # queued once there was room: the batch goes on

    def _broken_batch(
        self, exc: Exception, topic: str, partition: int, done: int, keyed: bool
    ) -> None:
        """A batch's iterable raised ``exc`` after ``done`` records were queued. With
        none queued, the transaction is as it was: ``exc`` is raised as it is (keys and
        values of different lengths, which ``zip(strict=True)`` found, as a
        ``ValueError`` that says so). Otherwise a part of the batch is in the
        transaction: that is recorded as a failed record, which is raised."""
        mismatch = (
            keyed
            and isinstance(exc, ValueError)
            and exc.__traceback__ is not None
            and exc.__traceback__.tb_next is None  # raised by zip itself, not inside it
            and _ZIP_MISMATCH.fullmatch(str(exc)) is not None
        )
        what = "the batch's keys and values differ in length" if mismatch else None
        if done == 0:
            if what is not None:
                raise ValueError(f"produce_batch(): {what}: pass one key per value") from None
            raise exc
        err = KafkaError(
            KafkaError._INVALID_ARG,
            f"{what or f'the batch iterable raised {exc!r}'} after {done} records were "
            "queued: the transaction cannot commit a part of the batch; abort it",
        )
        failure = produce_failure(err, topic, partition if partition >= 0 else None, None)
        self._deliveries.record_failure(failure)
        raise failure from exc

    def queue_full(self, topic: str, partition: int, key: Any) -> ProduceFailedException:
        """The failure of a record that found no room in librdkafka's queue within
        ``queue_full_timeout``: recorded (the transaction cannot commit without it) and
        returned for the send to raise."""
        err = KafkaError(
            KafkaError._QUEUE_FULL, f"local queue still full after {self._queue_full_timeout:g}s"
        )
        failure = produce_failure(err, topic, partition, key)
        self._deliveries.record_failure(failure)
        return failure

    def sync_failure(
        self, exc: KafkaException, topic: str, partition: int, key: Any, value: Any = None
    ) -> KafkaTxnError:
        err = exc.args[0]
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            err = KafkaError(err.code(), self._too_large(key, value))
        if classify(err)[0] is ErrorCategory.FATAL or err.code() == KafkaError._FATAL:
            return self._io.on_call_error(exc, "produce")
        if err.code() == KafkaError._STATE:
            # librdkafka's transaction already failed, most likely through a delivery
            # report not served yet: serve it, so that the real cause is recorded first.
            self._io.drain()
        failure = produce_failure(err, topic, partition, key)
        # The record never entered librdkafka, so librdkafka would commit without it:
        # remember it so that commit_transaction() refuses (KIP-691).
        self._deliveries.record_failure(failure)
        if err.code() != KafkaError._STATE:
            return failure
        # The transaction failed before this send: an earlier record's delivery failed
        # (the broker refused it...), or the coordinator made it abortable. As Java's
        # send() in an error state throws the transaction's error, not a failure of the
        # record at hand, this is the transaction's abortable error, its cause the record
        # that failed it: a caller must not take this record for the culprit.
        culprit = self._deliveries.first_failure
        if culprit is failure:
            culprit = None
        refused = TransactionAbortableError(
            "produce() refused: the transaction already failed"
            + (f" ({culprit})" if culprit is not None else f" ({err.str()})")
            + "; abort it and retry (the record that failed it, if one did, is this "
            "error's cause)",
            kafka_error=culprit.kafka_error if culprit is not None else err,
        )
        refused.__cause__ = culprit
        return refused

    def _too_large(self, key: Any, value: Any) -> str:
        """librdkafka's produce() refuses a record whose key, value and headers exceed
        ``message.max.bytes`` (rd_kafka_msg_new0) with MSG_SIZE_TOO_LARGE, which
        confluent-kafka words "Broker: Message size too large": the broker never saw it."""
        size = sum(
            len(part.encode() if isinstance(part, str) else part)
            for part in (key, value)
            if isinstance(part, (bytes, str))
        )
        return (
            f"refused by the client before it was sent: the record's key and value are "
            f"{size} bytes, more than the producer's message.max.bytes "
            f"({self._max_message_bytes}); send smaller records, or raise message.max.bytes "
            "in the producer config (the topic's max.message.bytes must allow them too)"
        )

    def refused(
        self, exc: Exception, topic: Any, value: Any, key: Any, partition: Any
    ) -> ProduceFailedException:
        """confluent-kafka refused produce()'s arguments with a Python exception before
        the record was queued: a str it cannot encode as UTF-8 (UnicodeEncodeError, as a
        str serializer's failure would be), an int out of range (OverflowError), a
        wrong type (TypeError)... librdkafka never saw the record and would commit
        without it: it is recorded as a failed record (MESSAGE_REJECTED), so that
        commit_transaction() refuses (KIP-691), and returned for produce() to raise
        (from ``exc``); for a TypeError, one that is also a TypeError (``type_error``)."""
        code, what = KafkaError._INVALID_ARG, "produce() arguments rejected by confluent-kafka"
        if isinstance(exc, UnicodeEncodeError):
            if _unencodable(topic):
                what = "topic name is not valid UTF-8"
            elif _unencodable(value):
                code, what = KafkaError._VALUE_SERIALIZATION, "value str is not valid UTF-8"
            elif _unencodable(key):
                code, what = KafkaError._KEY_SERIALIZATION, "key str is not valid UTF-8"
        failure = produce_failure(
            KafkaError(code, f"{what}: {exc!r}"),
            topic if isinstance(topic, str) else None,
            partition if isinstance(partition, int) else None,
            key if isinstance(key, (bytes, str)) else None,
        )
        failure.__cause__ = exc
        self._deliveries.record_failure(failure)
        return failure

    def type_error(
        self, exc: TypeError, key: Any, value: Any, failure: ProduceFailedException
    ) -> ProduceFailedException:
        """The ``ProduceFailedException`` (also a ``TypeError``) produce() raises for an
        argument of the wrong type: ``failure``'s record, with a message naming the
        argument and the fix."""
        message = f"produce() arguments rejected by confluent-kafka: {exc}"
        pairs = (("value", value, "value_serializer"), ("key", key, "key_serializer"))
        for name, obj, option in pairs:
            if obj is not None and not isinstance(obj, (bytes, str)):
                message = (
                    f"{name} must be bytes, str or None, got {type(obj).__name__}: encode it "
                    f"first or pass {option}=... to TransactionalProducer"
                )
                break
        return _RecordTypeError(
            message,
            kafka_error=failure.kafka_error,
            failure_type=failure.failure_type,
            category=failure.category or ErrorCategory.ABORTABLE,
            topic=failure.topic,
            partition=failure.partition,
            key=failure.key,
        )

    def interrupted(self, exc: BaseException, topic: str, partition: int, key: Any) -> None:
        """A signal's exception (KeyboardInterrupt...) came out of produce()/send(): it may
        have come right after librdkafka queued the record, so whether the record is in
        the transaction is unknown, while the caller was told the send failed (and may
        send it again). The transaction must not commit: the send counts as a failed
        record, which commit and prepare report (abort and retry)."""
        err = KafkaError(
            KafkaError._INTR,
            f"{type(exc).__name__} during produce()/send(): the record may have been "
            "queued though the call raised, so this transaction cannot commit; abort it",
        )
        self._deliveries.record_failure(
            produce_failure(err, topic, partition, key if isinstance(key, (bytes, str)) else None)
        )

    def refuse_inside_own_send(self, call: str) -> None:
        """``call`` (commit, abort, prepare, complete) made on a thread that is inside a
        send of this producer: a signal handler, a serializer, a batch's iterable or a
        callback a full queue's wait served. That send passed its state check and goes
        on queuing after ``call`` returns (a batch, its remaining records), so the call
        would not cover it: its records would join the next transaction, or part of a
        batch would commit. Refused before anything changes. ``close()`` is not refused
        (a SIGTERM handler's): the sends after it are refused as after close()."""
        # No send under way at all (the list at its padding): not inside one either, and
        # no stack to walk. A send appends before its state check (see await_sends).
        if len(self.under_way) > _PADDING and self._own_sends(2):
            raise IllegalStateError(
                f"{call}() called from inside a produce()/produce_batch()/send() of this "
                "producer on the same thread (a signal handler, serializer, callback or "
                f"batch iterable?): it would not cover the records that send has still to "
                f"queue; call {call}() once the send has returned (close() may be called)"
            )

    def _own_sends(self, depth: int = 1) -> int:
        """produce()/send() calls of this producer under way on the calling thread
        itself: a signal handler (SIGTERM calling close()) runs on the main thread
        between two bytecodes, also inside a send whose librdkafka produce() returned.
        Those sends cannot return while this thread waits, so they are not waited for:
        their record is queued already, and the abort (or commit) covers it. Found by
        walking this thread's frames (no cost per record)."""
        own = 0
        frame: FrameType | None = sys._getframe(depth)
        while frame is not None:
            if (
                frame.f_code.co_name in _SEND_NAMES
                and frame.f_locals.get("under_way") is self.under_way
            ):
                own += 1
            frame = frame.f_back
        return own

    def await_sends(self, deadline: float) -> bool:
        """Wait until no produce()/send() is under way; False if one still is at
        ``deadline``. The state is no longer IN_TRANSACTION (preparing, committing,
        aborting), so a send that starts later is refused. Under the GIL the list's
        appends, pops and length are sequentially consistent, and a send appends before
        it reads the state and pops after librdkafka's produce() returned: the length
        back at its padding proves that at that instant no send had passed its state
        check unfinished, and every later one reads the new state. (The gap this closes
        is real even without a serializer: between the state check and librdkafka's
        enqueue, an allocation may run the garbage collector, whose finalizers are
        Python code, where the GIL may pass to the thread that prepares.)"""
        under_way = self.under_way
        if len(under_way) <= _PADDING:
            return True  # nothing under way: no stack to walk
        idle = _PADDING + self._own_sends()
        while True:
            if len(under_way) <= idle:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0002)


def _unencodable(obj: Any) -> bool:
    """``obj`` is a str that UTF-8 cannot encode (a lone surrogate)."""
    if not isinstance(obj, str):
        return False
    try:
        obj.encode()
    except UnicodeEncodeError:
        return True
    return False
