"""The exactly-once consume-process-produce loop (KIP-691's template), with an
after-rollback policy in the manner of Spring for Apache Kafka.

Each batch is one transaction::

    transmission: begin; for each record: process() and produce its outputs;
                  send the consumer's offsets to the transaction
    commit:       commit (again while its outcome is unknown, never aborted); or, after
                  any other failure, abort and then rewind the consumer to the batch's
                  first offset of each partition

A record whose ``process()`` raises, or one of whose outputs Kafka rejects
(``FailureType.MESSAGE_REJECTED``), makes the transaction roll back; when it comes round
again it is retried, with backoff, up to ``max_attempts`` (after a rejection its batch
goes one record per transaction, so the rest of the partition commits); after that the
recoverer gets it inside the next transaction (by default: publish it with its error to
a dead-letter topic), and its offset commits with that transaction, so a poison record
neither blocks the partition nor is lost. A record that could not be delivered, or a
transaction that failed around the records, is not the record's fault: the batch is
retried after a backoff pause and never recovered. A FatalError (fenced, not authorized,
...) ends the loop: both clients are closed and the error is raised; so does a commit
still unsettled after ``commit_attempts`` tries (``TransactionOutcomeUnknownError``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import tenacity
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition, libversion

from kafka_txn.config import ProducerSettings, error_reports_by_default
from kafka_txn.errors import (
    BrokerUnreachableError,
    ConfigurationError,
    FailureType,
    FatalError,
    KafkaTxnError,
    ProduceFailedException,
    TransactionOutcomeUnknownError,
    root_exception,
)
from kafka_txn.metrics import MetricsHook
from kafka_txn.producer import arguments
from kafka_txn.producer.delivery import DeliveryCallback
from kafka_txn.producer.reachability import restated
from kafka_txn.producer.transactional import TransactionalProducer
from kafka_txn.producer.watch import counts_deliveries
from kafka_txn.tracing import Tracing, as_tracing

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

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
    """What a run did. Committed work: ``transactions`` committed, the input
    ``records`` whose offsets they committed, the ``outputs`` of ``process()`` they
    committed, and the inputs ``recovered`` (handed to the recoverer) in them. Attempts:
    ``attempted_outputs`` (outputs produced in every transaction, those aborted
    included), ``aborts`` (transactions aborted) and ``retries`` (rollbacks, each
    followed by the records coming round again)."""

    transactions: int = 0
    records: int = 0
    outputs: int = 0
    aborts: int = 0
    retries: int = 0
    recovered: int = 0
    attempted_outputs: int = 0


class _TransactionFailedError(Exception):
    """Why a transaction of the loop cannot commit: ``record`` is the input it is
    counted against (None: the whole batch), ``rejected`` whether Kafka refused an output
    as bad (``FailureType.MESSAGE_REJECTED``)."""

    def __init__(
        self, error: BaseException, record: Message | None = None, *, rejected: bool = False
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.record = record
        self.rejected = rejected


def _failure_type(exc: BaseException) -> FailureType | None:
    """The ``FailureType`` of the failed record behind ``exc`` (itself, or the root cause
    a ``CommitFailedException`` or a refused send carries), None if no record failed."""
    for candidate in (exc, exc.__cause__):
        if isinstance(candidate, ProduceFailedException):
            return candidate.failure_type
    return None


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
    here); ``producer_config`` needs a ``transactional.id`` (either may be any
    ``Mapping``, and ``producer_config`` a ``ProducerSettings``). ``max_attempts`` tries per
    record, with ``backoff`` (a tenacity wait strategy) between them, then ``recoverer``
    (default: ``DeadLetterRecoverer(dead_letter_topic)``; without either, the record is
    retried forever and blocks its partition, as a log line says each time). A record
    counts as failed when ``process()`` raises or when Kafka rejects one of its outputs
    (``FailureType.MESSAGE_REJECTED``). ``commit_attempts`` is how many times a commit
    whose outcome is unknown (or an abort that did not complete) is tried before
    ``run()`` stops with ``TransactionOutcomeUnknownError`` (each try lasts up to the
    producer's operation timeout, ``transaction.timeout.ms`` by default). ``metrics``
    and ``tracing`` go to the producer (``TransactionalProducer``), and ``metrics``
    also gets each transaction of the loop as the operation ``process_transaction``
    (its duration; ``ok``: it committed). ``sleep`` takes the backoff pauses.
    """

    def __init__(
        self,
        consumer_config: Mapping[str, Any],
        producer_config: Mapping[str, Any] | ProducerSettings,
        topics: Sequence[str],
        process: Callable[[Message], Iterable[OutputRecord | tuple[Any, ...]]],
        *,
        max_attempts: int = 3,
        backoff: tenacity.wait.wait_base | None = None,
        recoverer: Recoverer | None = None,
        dead_letter_topic: str | None = None,
        batch_size: int = 500,
        poll_timeout: float = 0.5,
        commit_attempts: int = 3,
        metrics: MetricsHook | None = None,
        tracing: Tracing | TracerProvider | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not isinstance(consumer_config, Mapping):
            raise TypeError(
                "ExactlyOnceProcessor(consumer_config=...) must be a dict of librdkafka "
                f"consumer properties, got {type(consumer_config).__name__}"
            )
        if "group.id" not in consumer_config:
            raise ConfigurationError("consumer_config needs group.id (offsets commit to it)")
        call = "ExactlyOnceProcessor"
        for name, number in (
            ("max_attempts", max_attempts),
            ("commit_attempts", commit_attempts),
            ("batch_size", batch_size),
        ):
            if isinstance(number, int) and not isinstance(number, bool) and number < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {number}")
            arguments.count(number, call, name)  # a TypeError for any other type
        if not topics or isinstance(topics, str) or not isinstance(topics, Sequence):
            raise ConfigurationError(
                f"topics must be a non-empty list of topic names, got {topics!r}"
            )
        for name in topics:
            if isinstance(name, str) and name.startswith("^"):  # "^...": a regex
                arguments.topic_pattern(name, call, "topics")
            else:
                arguments.topic(name, call, "topics")
        if dead_letter_topic is not None:
            arguments.topic(dead_letter_topic, call, "dead_letter_topic")
        arguments.callback(process, call, "process", none=False)
        arguments.callback(recoverer, call, "recoverer")
        if backoff is not None and not isinstance(backoff, tenacity.wait.wait_base):
            raise TypeError(
                f"{call}(backoff=...) must be a tenacity wait strategy (tenacity.wait_*) or "
                f"None, got {backoff!r} ({type(backoff).__name__})"
            )
        arguments.wait(poll_timeout, call, "poll_timeout")
        arguments.callback(sleep, call, "sleep", none=False)
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
        self.commit_attempts = commit_attempts
        self.backoff = backoff or (
            tenacity.wait_exponential(multiplier=0.1, max=5.0) + tenacity.wait_random(0, 0.1)
        )
        self.recoverer = recoverer
        self.batch_size = batch_size
        self.poll_timeout = poll_timeout
        self.stats = ProcessorStats()
        self._sleep = sleep
        self._attempts = _Attempts()
        # Per partition, the last offset of a batch that an output rejection failed: up to
        # there, records go one per transaction, so the rejection names its record.
        self._one_by_one: dict[tuple[str, int], int] = {}
        self._batch_failures = 0  # consecutive failures not counted against a record
        # Inputs whose output Kafka rejected in the current transaction, with the error.
        self._rejected: dict[tuple[str, int, int], tuple[Message, BaseException]] = {}
        self._stop = threading.Event()
        # Checked before either client exists.
        self._metrics = arguments.hook(
            metrics, "ExactlyOnceProcessor", "metrics", ("operation", "record_failed")
        )
        traced = as_tracing(tracing, "ExactlyOnceProcessor")
        self.consumer = Consumer(
            {
                **consumer_config,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": consumer_config.get("auto.offset.reset", "earliest"),
            }
        )
        self._outputs = 0  # produced in the open transaction
        conf = _without_rebootstrap(producer_config)
        if isinstance(conf, dict):  # the processor hands out no futures: error-only
            error_reports_by_default(conf, counted=counts_deliveries(metrics, traced))
        self.producer = TransactionalProducer(
            conf,
            metrics=metrics,
            tracing=traced,
        )

    def stop(self) -> None:
        """Ask ``run()`` to return after the current transaction (thread-safe)."""
        self._stop.set()

    def run(
        self, *, idle_timeout: float | None = None, max_batches: int | None = None
    ) -> ProcessorStats:
        """Loop until ``stop()``, ``idle_timeout`` seconds without input, or
        ``max_batches`` transactions; returns the stats. Closes both clients at the end.

        Raises ``FatalError`` (fenced, not authorized, ...) and
        ``TransactionOutcomeUnknownError`` (a commit still unsettled after
        ``commit_attempts`` tries: it was not aborted; a processor started again with the
        same transactional.id settles it and resumes from the committed offsets)."""
        arguments.wait(idle_timeout, "run", "idle_timeout", none="no limit")
        arguments.count(max_batches, "run", "max_batches", minimum=0, none="no limit")
        failed: BaseException | None = None
        try:
            try:
                self.producer.init_transactions()
            except BrokerUnreachableError as exc:
                # run() closes both clients when it stops: a new processor runs again.
                raise restated(
                    exc, "ExactlyOnceProcessor.run()",
                    "then create the processor again and call run()",
                ) from root_exception(exc)  # fmt: skip
            self.consumer.subscribe(self.topics, on_revoke=self._on_revoke, on_lost=self._on_revoke)
            idle_since = time.monotonic()
            while not self._done(max_batches):
                batch = self._consume()
                if not batch:
                    if idle_timeout is not None and time.monotonic() - idle_since > idle_timeout:
                        break
                    continue
                idle_since = time.monotonic()
                self._run_batch(batch, max_batches)
            return self.stats
        except BaseException as exc:
            failed = exc
            if isinstance(exc, FatalError):
                log.exception("fatal error: closing the producer and the consumer")
            raise
        finally:
            if failed is None:
                self.close()
            else:
                # What stopped the loop is what run() raises: an exception from closing
                # (a delivery callback raising while close() aborts) only goes to the log.
                try:
                    self.close()
                except Exception:
                    log.exception("while closing after %r", failed)

    def _done(self, max_batches: int | None) -> bool:
        return self._stop.is_set() or (
            max_batches is not None and self.stats.transactions >= max_batches
        )

    def _consume(self) -> list[Message]:
        batch = []
        for msg in self.consumer.consume(self.batch_size, self.poll_timeout):
            err = msg.error()
            if err is None:
                batch.append(msg)
            elif err.fatal() or err.code() == KafkaError._FATAL:
                # librdkafka hands the consumer's fatal error (a static member fenced by
                # another with its group.instance.id, say) to consume() as an error of
                # code _FATAL whose fatal() flag confluent-kafka leaves False.
                raise FatalError(f"consumer failed: {err.str()}", kafka_error=err)
            else:  # informational (e.g. a partition EOF, a broker going away)
                log.info("consumer: %s", err.str())
        return batch

    def close(self) -> None:
        """Close both clients (idempotent); the consumer also when the producer's close()
        raises (a delivery callback's exception, raised once the producer is closed)."""
        try:
            self.producer.close()
        finally:
            with contextlib.suppress(RuntimeError):  # already closed
                self.consumer.close()

    # ------------------------------------------------------------------ one batch
    def _run_batch(self, batch: list[Message], max_batches: int | None) -> None:
        """Commit ``batch`` in as few transactions as allowed: records of a range that an
        output rejection failed go one per transaction. After a failed transaction the
        rest of the batch is dropped (the consumer was rewound: it comes again)."""
        pending = batch
        while pending:
            if self._done(max_batches):
                return  # the rest is not committed: read again by whoever runs next
            size = self._chunk_size(pending)
            if not self._one_transaction(pending[:size], pending):
                return
            pending = pending[size:]

    def _chunk_size(self, pending: list[Message]) -> int:
        if not self._one_by_one:
            return len(pending)
        size = 0
        for record in pending:
            if self._isolated(record):
                return max(size, 1)
            size += 1
        return size

    def _isolated(self, record: Message) -> bool:
        topic, partition, offset = _position(record)
        last = self._one_by_one.get((topic, partition))
        return last is not None and offset <= last

    # ------------------------------------------------------------------ one transaction
    def _one_transaction(self, chunk: list[Message], pending: list[Message]) -> bool:
        """One transaction over ``chunk``; True if it committed. On failure: abort, then
        rewind every partition of ``pending`` (chunk and unprocessed rest) to its first
        offset there, then pause as the failure asks."""
        start = time.perf_counter()
        committed = False
        try:
            committed = self._transaction(chunk, pending)
            return committed
        finally:
            if self._metrics is not None:
                seconds = time.perf_counter() - start
                self._metrics.operation("process_transaction", seconds, committed)

    def _transaction(self, chunk: list[Message], pending: list[Message]) -> bool:
        failure: _TransactionFailedError | None = None
        recovered: list[tuple[str, int, int]] = []
        self._rejected.clear()
        self._outputs = 0
        # Phase 1: transmission. Any failure (but a fatal one) only means: do not commit.
        try:
            self.producer.begin_transaction()
            for record in chunk:
                self._transmit(record, recovered)
            self.producer.send_offsets_to_transaction(
                _next_offsets(chunk), self.consumer.consumer_group_metadata()
            )
        except FatalError:
            raise
        except _TransactionFailedError as exc:
            failure = exc
        except KafkaTxnError as exc:
            failure = _TransactionFailedError(exc)
        # Phase 2: commit, or abort and rewind.
        if failure is None:
            try:
                self._commit(chunk)
                self._committed(chunk, recovered)
                return True
            except (FatalError, TransactionOutcomeUnknownError):
                raise
            except KafkaTxnError as exc:  # CommitFailedException and friends
                failure = _TransactionFailedError(exc)
        log.warning("transaction of %d records failed, aborting: %s", len(chunk), failure)
        # KIP-447/KIP-691: abort first. Until the abort, the group has pending offsets
        # of this transaction, and a read_committed offset fetch would be refused.
        self._abort(chunk)  # serves the delivery reports still queued
        self.stats.aborts += 1
        self._blame_rejections(failure, chunk)
        self._rewind(pending)
        self._after_rollback(failure, chunk)
        return False

    def _blame_rejections(self, failure: _TransactionFailedError, chunk: list[Message]) -> None:
        """Count an output Kafka refused as bad against the input that produced it,
        whichever call noticed the failure first; then the chunk goes one record per
        transaction. A rejection no report names (a recoverer's output, say), or one
        that names several inputs (a whole record batch refused), is a record's only in
        a one-record transaction."""
        if not self._rejected and _failure_type(failure.error) is FailureType.MESSAGE_REJECTED:
            if len(chunk) == 1:
                self._rejected[_position(chunk[0])] = (chunk[0], failure.error)
            else:
                failure.rejected = True
        if len(self._rejected) > 1 and len(chunk) > 1:
            # Outputs of several inputs refused together: librdkafka fails every record
            # of a record batch the broker refuses (MSG_SIZE_TOO_LARGE over the topic's
            # max.message.bytes, say) and, unlike Java's producer, does not split it. No
            # one input is to blame yet: one record per transaction tells them apart.
            failure.rejected = True
            self._rejected.clear()
            return
        for record, error in self._rejected.values():
            self._count(record, error)
            failure.rejected = True
            if failure.record is None:
                failure.record = record
        self._rejected.clear()

    def _commit(self, chunk: list[Message]) -> None:
        """commit_transaction(), tried again while its outcome is unknown (never aborted:
        the broker may have written the commit), ``commit_attempts`` times in all."""
        self._settle(self.producer.commit_transaction, "commit_transaction", chunk)

    def _abort(self, chunk: list[Message]) -> None:
        """abort_transaction(), tried again while it does not complete (records still in
        flight, a coordinator away), ``commit_attempts`` times in all."""
        self._settle(self.producer.abort_transaction, "abort_transaction", chunk)

    def _settle(self, call: Callable[[], None], operation: str, chunk: list[Message]) -> None:
        for attempt in range(1, self.commit_attempts + 1):
            try:
                call()
                return
            except TransactionOutcomeUnknownError as exc:
                if attempt == self.commit_attempts:
                    raise TransactionOutcomeUnknownError(
                        f"the outcome of the transaction of {len(chunk)} records (from "
                        f"{_position(chunk[0])}) is unknown: {operation}() did not settle "
                        f"in {attempt} tries ({exc}). "
                        + ("It was not aborted. " if operation == "commit_transaction" else "")
                        + "Start a processor with the same transactional.id: its "
                        "init_transactions() completes or aborts the transaction, and it "
                        "resumes from the group's committed offsets either way",
                        kafka_error=exc.kafka_error,
                        operation=operation,
                    ) from root_exception(exc)
                pause = _backoff(self.backoff, attempt)
                log.warning("%s: outcome unknown (try %d of %d): %s; trying again in %.2fs",
                            operation, attempt, self.commit_attempts, exc, pause)  # fmt: skip
                self._sleep(pause)

    def _count(self, record: Message, error: BaseException) -> None:
        key = _position(record)
        self._attempts.counts[key] = self._attempts.counts.get(key, 0) + 1
        self._attempts.errors[key] = error

    def _watch(self, record: Message) -> DeliveryCallback:
        """The delivery callback of ``record``'s outputs: notes a rejected output."""
        key = _position(record)

        def on_delivery(error: ProduceFailedException | None, message: Message) -> None:
            if error is not None and error.failure_type is FailureType.MESSAGE_REJECTED:
                self._rejected.setdefault(key, (record, error))

        return on_delivery

    def _transmit(self, record: Message, recovered: list[tuple[str, int, int]]) -> None:
        key = _position(record)
        attempts = self._attempts.counts.get(key, 0)
        if attempts >= self.max_attempts and self.recoverer is not None:
            try:
                self.recoverer(record, self._attempts.errors[key], self.producer)
            except KafkaTxnError:
                raise  # judged like any other call of the transaction
            except Exception as exc:  # a failed recovery: abort and try it again
                raise _TransactionFailedError(exc, record) from exc
            recovered.append(key)
            return
        try:
            outputs = list(self.process(record))
        except Exception as exc:
            self._count(record, exc)
            raise _TransactionFailedError(exc, record) from exc
        on_delivery = self._watch(record) if outputs else None
        for out in outputs:
            try:
                o = out if isinstance(out, OutputRecord) else OutputRecord(*out)
                self.producer.produce(
                    o.topic, o.value, o.key, o.partition, on_delivery, headers=o.headers
                )
            except ProduceFailedException as exc:  # this output, refused at once
                if exc.failure_type is FailureType.MESSAGE_REJECTED:
                    self._rejected.setdefault(key, (record, exc))
                raise
            except KafkaTxnError:
                raise
            except Exception as exc:  # an output process() got wrong (type, shape): its
                self._count(record, exc)  # record's failure, as if process() had raised
                raise _TransactionFailedError(exc, record) from exc
            self._outputs += 1
            self.stats.attempted_outputs += 1

    def _committed(self, chunk: list[Message], recovered: list[tuple[str, int, int]]) -> None:
        self.stats.transactions += 1
        self.stats.records += len(chunk)
        self.stats.outputs += self._outputs
        self.stats.recovered += len(recovered)
        self._batch_failures = 0
        for record in chunk:
            key = _position(record)
            self._attempts.counts.pop(key, None)
            self._attempts.errors.pop(key, None)
            last = self._one_by_one.get(key[:2])
            if last is not None and key[2] >= last:
                del self._one_by_one[key[:2]]

    def _after_rollback(self, failure: _TransactionFailedError, chunk: list[Message]) -> None:
        """Decide how the rolled-back records come round again, and pause before that."""
        self.stats.retries += 1
        if failure.rejected:  # go one record per transaction until past this chunk
            for topic, partition, offset in (_position(r) for r in chunk):
                tp = (topic, partition)
                self._one_by_one[tp] = max(offset, self._one_by_one.get(tp, offset))
        record = failure.record
        if record is None:  # delivery or transaction failure: the batch again, after a pause
            self._batch_failures += 1
            pause = _backoff(self.backoff, self._batch_failures)
            log.info("batch failed (%d in a row): %s; retrying in %.2fs",
                     self._batch_failures, failure.error, pause)  # fmt: skip
            self._sleep(pause)
            return
        key = _position(record)
        attempts = self._attempts.counts.get(key, 0)
        if attempts >= self.max_attempts:
            if self.recoverer is None:
                log.error(
                    "record %s failed %d times and there is no recoverer: retrying it, "
                    "and its partition waits (%s)", key, attempts, failure.error,
                )  # fmt: skip
            elif attempts == self.max_attempts:
                log.warning("record %s failed %d times: recovering it next", key, attempts)
                return  # no pause: the recoverer takes it in the next transaction
            else:  # the recoverer's own transaction failed on this record
                log.error("recovering record %s failed: %s; trying again", key, failure.error)
        pause = _backoff(self.backoff, attempts)
        log.info("record %s failed (attempt %d): %s; retrying in %.2fs",
                 key, attempts, failure.error, pause)  # fmt: skip
        self._sleep(pause)

    def _rewind(self, pending: list[Message]) -> None:
        """Seek each partition of ``pending`` back to its first offset there: the records
        of the aborted transaction and those not yet processed are read again. (Not the
        group's committed offset: a partition without one would restart from
        auto.offset.reset, and a read_committed offset fetch may be refused.)"""
        first: dict[tuple[str, int], int] = {}
        for topic, partition, offset in (_position(r) for r in pending):
            first.setdefault((topic, partition), offset)
        for (topic, partition), offset in first.items():
            self.consumer.seek(TopicPartition(topic, partition, offset))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Rebalance callbacks run inside consume(), between transactions: nothing of a
        # revoked partition is in flight. Its retry counts move on with it.
        self._attempts.forget_partitions(partitions)
        gone = {(tp.topic, tp.partition) for tp in partitions}
        for key in [k for k in self._one_by_one if k in gone]:
            del self._one_by_one[key]


def _without_rebootstrap(
    config: Mapping[str, Any] | ProducerSettings,
) -> Mapping[str, Any] | ProducerSettings:
    """The processor's producer settings, with ``metadata.recovery.strategy=none`` unless
    the user chose a strategy (librdkafka 2.10 and later, which re-bootstrap by default).

    Re-bootstrapping after an outage of every broker (KIP-899; a one-node cluster
    restarted) decommissions librdkafka's broker handles, but its coordinator cache
    (``rk_coord_cache``) keeps the group coordinator's old handle: the TxnOffsetCommit
    step of ``send_offsets_to_transaction()`` (``rd_kafka_coord_req()``, from
    ``rd_kafka_txn_handle_AddOffsetsToTxn``) then waits for a handle that never comes
    up. ``rd_kafka_coord_req_fsm()`` runs again only on another broker's state change,
    and the request's timeout is never checked, so the call blocks past its timeout and
    the loop commits nothing until the next outage (librdkafka issue 5511). With
    ``none`` the handles outlive the outage and reconnect. The cost: a cluster whose
    every broker changed address while all were down is not found again from
    ``bootstrap.servers``."""
    if isinstance(config, ProducerSettings):
        conf = config.to_librdkafka()
    elif isinstance(config, Mapping):
        conf = dict(config)
    else:
        return config  # not a configuration: TransactionalProducer says so
    if libversion()[1] >= 0x020A0000:
        conf.setdefault("metadata.recovery.strategy", "none")
    return conf


def _position(record: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed record."""
    return (str(record.topic()), record.partition() or 0, record.offset() or 0)


def _next_offsets(batch: Sequence[Message]) -> list[TopicPartition]:
    last: dict[tuple[str, int], int] = {}
    for msg in batch:
        topic, partition, offset = _position(msg)
        last[(topic, partition)] = offset
    return [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
