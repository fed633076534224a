"""The exactly-once consume-process-produce loop (KIP-691's template), with an
after-rollback policy in the manner of Spring for Apache Kafka.

Each batch is one transaction::

    transmission: begin; for each record: process() and produce its outputs;
                  send the consumer's offsets to the transaction
    commit:       commit; or, after any failure, rewind the consumer to the last
                  committed offsets and abort

A record whose ``process()`` raises makes the transaction roll back; when it comes round
again it is retried, with backoff, up to ``max_attempts``; after that the recoverer gets it
inside the next transaction (by default: publish it with its error to a dead-letter
topic), and its offset commits with that transaction, so a poison record neither blocks
the partition nor is lost. A FatalError (fenced, not authorized, ...) ends the loop: both
clients are closed and the error is raised.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import tenacity
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from .errors import ConfigurationError, FatalError, KafkaTxnError
from .producer import TransactionalProducer

__all__ = [
    "DeadLetterRecoverer",
    "ExactlyOnceProcessor",
    "OutputRecord",
    "ProcessorStats",
    "Recoverer",
]

log = logging.getLogger("kafka_txn.eos")


class OutputRecord(NamedTuple):
    """A record ``process()`` wants produced."""

    topic: str
    value: bytes | str | None
    key: bytes | str | None = None
    headers: list[tuple[str, bytes]] | None = None
    partition: int = -1


class Recoverer(Protocol):
    """Called inside a transaction for a record that failed ``max_attempts`` times; what
    it produces commits together with the record's offset."""

    def __call__(
        self, record: Message, error: BaseException, producer: TransactionalProducer
    ) -> None: ...


@dataclass(frozen=True)
class DeadLetterRecoverer:
    """Publishes the failed record, unchanged, to ``topic`` with headers naming where it
    came from and why it failed (Spring's DeadLetterPublishingRecoverer, transactional)."""

    topic: str

    def __call__(
        self, record: Message, error: BaseException, producer: TransactionalProducer
    ) -> None:
        headers = list(record.headers() or [])
        headers += [
            ("kafka_txn.dlt.original.topic", str(record.topic()).encode()),
            ("kafka_txn.dlt.original.partition", str(record.partition()).encode()),
            ("kafka_txn.dlt.original.offset", str(record.offset()).encode()),
            ("kafka_txn.dlt.exception.class", type(error).__name__.encode()),
            ("kafka_txn.dlt.exception.message", str(error).encode()[:4096]),
        ]
        producer.produce(self.topic, record.value(), record.key(), headers=headers)


@dataclass
class ProcessorStats:
    """What a run did."""

    transactions: int = 0
    records: int = 0
    outputs: int = 0
    aborts: int = 0
    retries: int = 0
    recovered: int = 0


class _ProcessingFailedError(Exception):
    def __init__(self, record: Message, error: BaseException) -> None:
        super().__init__(str(error))
        self.record = record
        self.error = error


def _backoff(wait: tenacity.wait.wait_base, attempt: int) -> float:
    """The pause tenacity's ``wait`` strategy gives before try ``attempt + 1``."""
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    state.attempt_number = attempt
    return float(wait(state))


@dataclass
class _Attempts:
    """Failed attempts per record position, kept until the record commits."""

    counts: dict[tuple[str, int, int], int] = field(default_factory=dict)
    errors: dict[tuple[str, int, int], BaseException] = field(default_factory=dict)

    def forget_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        for key in [k for k in self.counts if (k[0], k[1]) in gone]:
            self.counts.pop(key, None)
            self.errors.pop(key, None)


class ExactlyOnceProcessor:
    """Runs ``process(record) -> outputs`` over ``topics`` exactly once.

    ``consumer_config`` needs ``group.id`` (read_committed and manual offsets are set
    here); ``producer_config`` needs a ``transactional.id``. ``max_attempts`` tries per
    record, with ``backoff`` (a tenacity wait strategy) between them, then ``recoverer``
    (default: ``DeadLetterRecoverer(dead_letter_topic)``; without either, the record is
    retried forever and blocks its partition, as a log line says each time).
    """

    def __init__(
        self,
        consumer_config: dict[str, Any],
        producer_config: dict[str, Any],
        topics: Sequence[str],
        process: Callable[[Message], Iterable[OutputRecord | tuple[Any, ...]]],
        *,
        max_attempts: int = 3,
        backoff: tenacity.wait.wait_base | None = None,
        recoverer: Recoverer | None = None,
        dead_letter_topic: str | None = None,
        batch_size: int = 500,
        poll_timeout: float = 0.5,
    ) -> None:
        if "group.id" not in consumer_config:
            raise ConfigurationError("consumer_config needs group.id (offsets commit to it)")
        if max_attempts < 1:
            raise ConfigurationError("max_attempts must be >= 1")
        if not topics or isinstance(topics, str):
            raise ConfigurationError(
                f"topics must be a non-empty list of topic names, got {topics!r}"
            )
        if batch_size < 1:
            raise ConfigurationError("batch_size must be >= 1")
        for key in ("enable.auto.commit", "isolation.level"):
            if key in consumer_config:
                raise ConfigurationError(
                    f"{key} is set by ExactlyOnceProcessor (offsets commit only through "
                    "transactions, and only committed records are read): remove it"
                )
        if recoverer is None and dead_letter_topic is not None:
            recoverer = DeadLetterRecoverer(dead_letter_topic)
        self.topics = list(topics)
        self.process = process
        self.max_attempts = max_attempts
        self.backoff = backoff or (
            tenacity.wait_exponential(multiplier=0.1, max=5.0) + tenacity.wait_random(0, 0.1)
        )
        self.recoverer = recoverer
        self.batch_size = batch_size
        self.poll_timeout = poll_timeout
        self.stats = ProcessorStats()
        self._attempts = _Attempts()
        self._stop = threading.Event()
        self.consumer = Consumer(
            {
                **consumer_config,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": consumer_config.get("auto.offset.reset", "earliest"),
            }
        )
        self.producer = TransactionalProducer(producer_config)

    def stop(self) -> None:
        """Ask ``run()`` to return after the current transaction (thread-safe)."""
        self._stop.set()

    def run(
        self, *, idle_timeout: float | None = None, max_batches: int | None = None
    ) -> ProcessorStats:
        """Loop until ``stop()``, ``idle_timeout`` seconds without input, or
        ``max_batches`` transactions; returns the stats. Closes both clients at the end."""
        try:
            self.producer.init_transactions()
            self.consumer.subscribe(self.topics, on_revoke=self._on_revoke, on_lost=self._on_revoke)
            idle_since = time.monotonic()
            while not self._stop.is_set():
                if max_batches is not None and self.stats.transactions >= max_batches:
                    break
                batch = self._consume()
                if not batch:
                    if idle_timeout is not None and time.monotonic() - idle_since > idle_timeout:
                        break
                    continue
                idle_since = time.monotonic()
                self._one_transaction(batch)
            return self.stats
        except FatalError:
            log.exception("fatal error: closing the producer and the consumer")
            raise
        finally:
            self.close()

    def _consume(self) -> list[Message]:
        batch = []
        for msg in self.consumer.consume(self.batch_size, self.poll_timeout):
            err = msg.error()
            if err is None:
                batch.append(msg)
            elif err.fatal():
                raise FatalError(f"consumer failed: {err.str()}", kafka_error=err)
            else:  # informational (e.g. a partition EOF, a broker going away)
                log.info("consumer: %s", err.str())
        return batch

    def close(self) -> None:
        """Close both clients (idempotent)."""
        self.producer.close()
        with contextlib.suppress(RuntimeError):  # already closed
            self.consumer.close()

    # ------------------------------------------------------------------ one transaction
    def _one_transaction(self, batch: list[Message]) -> None:
        failure: _ProcessingFailedError | None = None
        recovered: list[tuple[str, int, int]] = []
        # Phase 1: transmission. Any failure (but a fatal one) only means: do not commit.
        try:
            self.producer.begin_transaction()
            for record in batch:
                self._transmit(record, recovered)
            self.producer.send_offsets_to_transaction(
                _next_offsets(batch), self.consumer.consumer_group_metadata()
            )
            should_commit = True
        except FatalError:
            raise
        except _ProcessingFailedError as exc:
            failure, should_commit = exc, False
        except KafkaTxnError as exc:
            log.warning("transmission failed, aborting: %s", exc)
            should_commit = False
        # Phase 2: commit, or rewind and abort.
        if should_commit:
            try:
                self.producer.commit_transaction()
                self._committed(batch, recovered)
                return
            except FatalError:
                raise
            except KafkaTxnError as exc:  # CommitFailedException and friends
                log.warning("commit failed, aborting: %s", exc)
        self._rewind()
        self.producer.abort_transaction()
        self.stats.aborts += 1
        if failure is not None:
            self._after_rollback(failure)

    def _transmit(self, record: Message, recovered: list[tuple[str, int, int]]) -> None:
        key = _position(record)
        attempts = self._attempts.counts.get(key, 0)
        if attempts >= self.max_attempts and self.recoverer is not None:
            self.recoverer(record, self._attempts.errors[key], self.producer)
            recovered.append(key)
            return
        try:
            outputs = list(self.process(record))
        except Exception as exc:
            self._attempts.counts[key] = attempts + 1
            self._attempts.errors[key] = exc
            raise _ProcessingFailedError(record, exc) from exc
        for out in outputs:
            o = out if isinstance(out, OutputRecord) else OutputRecord(*out)
            self.producer.produce(o.topic, o.value, o.key, o.partition, headers=o.headers)
            self.stats.outputs += 1

    def _committed(self, batch: list[Message], recovered: list[tuple[str, int, int]]) -> None:
        self.stats.transactions += 1
        self.stats.records += len(batch)
        self.stats.recovered += len(recovered)
        for record in batch:
            key = _position(record)
            self._attempts.counts.pop(key, None)
            self._attempts.errors.pop(key, None)

    def _after_rollback(self, failure: _ProcessingFailedError) -> None:
        record = failure.record
        key = _position(record)
        attempts = self._attempts.counts.get(key, 0)
        self.stats.retries += 1
        if attempts >= self.max_attempts:
            if self.recoverer is None:
                log.error(
                    "record %s failed %d times and there is no recoverer: retrying it, "
                    "and its partition waits (%s)", key, attempts, failure.error,
                )  # fmt: skip
            else:
                log.warning("record %s failed %d times: recovering it next", key, attempts)
                return  # no pause: the recoverer takes it in the next transaction
        pause = _backoff(self.backoff, attempts)
        log.info("record %s failed (attempt %d): %s; retrying in %.2fs",
                 key, attempts, failure.error, pause)  # fmt: skip
        time.sleep(pause)

    def _rewind(self) -> None:
        """Seek every assigned partition back to the group's committed offset, so the
        records of the aborted transaction are read again."""
        assignment = self.consumer.assignment()
        if not assignment:
            return
        for tp in self.consumer.committed(assignment, timeout=30):
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Rebalance callbacks run inside consume(), between transactions: nothing of a
        # revoked partition is in flight. Its retry counts move on with it.
        self._attempts.forget_partitions(partitions)


def _position(record: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed record."""
    return (str(record.topic()), record.partition() or 0, record.offset() or 0)


def _next_offsets(batch: Sequence[Message]) -> list[TopicPartition]:
    last: dict[tuple[str, int], int] = {}
    for msg in batch:
        topic, partition, offset = _position(msg)
        last[(topic, partition)] = offset
    return [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
