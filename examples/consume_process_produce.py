"""Exactly-once consume-process-produce: KIP-691's template, written out in full.

Scenario: read records from --input-topic, transform each one, write the results to
--output-topic, and commit the consumed offsets in the same transaction, so every input
record is reflected in the output exactly once, whatever fails.

This file is a self-contained, readable version of the failure table that
kafka_txn.eos.ExactlyOnceProcessor implements (docs/guide/eos.md): copy it when you need to
change the loop itself, use the processor when you do not.

One transaction per batch:
  1. transmission: begin; process each record and produce its output; send the
     consumer's offsets with its group metadata (KIP-447). A failure here (but a fatal
     one) only means: do not commit.
  2. commit; or, after any other failure, ABORT FIRST, THEN REWIND each partition to the
     batch's first offset in it (no offset fetch: while the transaction is open its
     offsets are pending, and Apache Kafka answers a read_committed consumer's offset
     fetch with UNSTABLE_OFFSET_COMMIT). The records are read and tried again.

Which failure leads to which action:
  process() raises                 abort, rewind, pause, retry; counted against the record
  an output Kafka rejects          abort, rewind; the batch again one record per
   (MESSAGE_REJECTED: too large,   transaction, so the others commit; alone, the
   invalid, unknown partition)     rejection counts against its record
  a record failed --max-attempts   recovered in the next transaction, with its offset:
   times                           to --dead-letter-topic (without one, or if that
                                   record is rejected too: skipped, logged as an error)
  anything else abortable          abort, rewind, pause, retry; never the record's fault,
   (delivery timed out, ...)       never recovered
  commit outcome unknown           commit again, never abort (it may have committed);
                                   after COMMIT_TRIES tries the loop stops
  FatalError (fenced, ...) or a    close both clients and stop
   fatal consumer error
  other consumer errors            logged; librdkafka goes on by itself

Rebalances happen inside consume(), which the loop calls only between transactions:
every batch read before was committed, or aborted and rewound, so a partition is never
given up half done, and its next owner starts at the offsets the last commit wrote.

Running several instances, and taking over: give every instance the same --group and
its own --transactional-id, stable across its restarts (e.g. a pod's ordinal).
- A restart with the same id fences the old process (its next transactional call raises
  FatalError: it stops) and aborts what it left open, at init_transactions().
- An instance whose partitions moved to another one (it stalled past the session
  timeout, say) is fenced by the group (KIP-447): its offsets carry an old group
  generation and are refused, FatalError again. If its offsets went in before, the new
  owner's read_committed offset fetch waits until its transaction is settled.
- A crashed instance that never comes back leaves its transaction open until
  transaction.timeout.ms; until then the new owner of its partitions waits (if the
  transaction holds offsets), and so do read_committed readers of its outputs.
SIGTERM or SIGINT ends the loop after the current transaction; closing the consumer
leaves the group, so the others take its partitions over at once.

Assumes: the topics exist; the broker supports transactions and KIP-447 (Kafka >= 2.5).
--fail-once-at N injects one processing failure at the N-th record to show the abort.

    python examples/consume_process_produce.py --bootstrap-servers 127.0.0.1:9092 \\
        --input-topic in --output-topic out --group demo --transactional-id demo-0 \\
        --dead-letter-topic in.DLT
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from kafka_txn import (
    DeliveryCallback,
    FailureType,
    FatalError,
    KafkaTxnError,
    ProduceFailedException,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)
from kafka_txn.eos import DeadLetterRecoverer

log = logging.getLogger("consume_process_produce")

COMMIT_TRIES = 3
"""How many times a commit whose outcome is unknown (or an abort that did not complete)
is tried before the loop stops."""

Position = tuple[str, int, int]
"""(topic, partition, offset) of an input record."""


class InjectedError(Exception):
    """The failure --fail-once-at injects into processing."""


def process(msg: Message) -> bytes:
    """The business logic: here, upper-case the value."""
    return (msg.value() or b"").upper()


@dataclass
class Stats:
    """What a run did; ``run()`` fills in the one it is given."""

    records: int = 0  # input records committed: processed, dead-lettered or skipped
    transactions: int = 0
    aborts: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    assigned: int = 0  # partitions received in rebalances
    revoked: int = 0  # partitions given up (or lost) in rebalances


def position(msg: Message) -> Position:
    return (str(msg.topic()), msg.partition() or 0, msg.offset() or 0)


def next_offsets(batch: Sequence[Message]) -> list[TopicPartition]:
    """The offsets to commit for a batch: one past the last record of each partition."""
    last: dict[tuple[str, int], int] = {}
    for topic, partition, offset in map(position, batch):
        last[(topic, partition)] = offset
    return [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]


def rewind(consumer: Consumer, batch: Sequence[Message]) -> None:
    """Seek each partition of the batch back to its first offset in it, so that the
    records of an aborted transaction are read again. Call it after the abort. (Not to
    the group's committed offset: no offset fetch is needed, and a partition without
    one would restart at auto.offset.reset.)"""
    first: dict[tuple[str, int], int] = {}
    for topic, partition, offset in map(position, batch):
        first.setdefault((topic, partition), offset)
    for (topic, partition), offset in first.items():
        consumer.seek(TopicPartition(topic, partition, offset))


def backoff(attempt: int) -> float:
    """The pause before try ``attempt + 1``: 0.1 s, doubling, at most 5 s."""
    return float(min(0.1 * 2 ** (attempt - 1), 5.0))


def rejected(exc: BaseException) -> bool:
    """True if Kafka refused an output as bad (FailureType.MESSAGE_REJECTED): raised by
    produce() itself, or the cause of the CommitFailedException of the commit that
    flushed it."""
    for candidate in (exc, exc.__cause__):
        if isinstance(candidate, ProduceFailedException):
            return candidate.failure_type is FailureType.MESSAGE_REJECTED
    return False


def make_consumer(args: argparse.Namespace) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": args.bootstrap_servers,
            "group.id": args.group,
            # Never read records of aborted or open transactions; fetch committed offsets
            # with KIP-447's require_stable (librdkafka retries UNSTABLE_OFFSET_COMMIT).
            "isolation.level": "read_committed",
            # Offsets are committed only through the producer's transaction.
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )


def make_producer(args: argparse.Namespace) -> TransactionalProducer:
    return TransactionalProducer(
        {
            "bootstrap.servers": args.bootstrap_servers,
            # Stable across restarts of this instance: a restarted instance fences its
            # zombie predecessor and aborts what it left open.
            "transactional.id": args.transactional_id,
            # Must exceed the longest transaction; the broker aborts older ones.
            "transaction.timeout.ms": 60_000,
        }
    )


class FailureInjector:
    """Raises InjectedError once, at the N-th record processed (None: never)."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.seen = 0

    def check(self) -> None:
        self.seen += 1
        if self.at is not None and self.seen == self.at:
            self.at = None
            raise InjectedError(f"injected failure at record {self.seen}")


def commit(producer: TransactionalProducer) -> None:
    """commit_transaction(), called again while its outcome is unknown: the broker may
    have written the commit, so it is never aborted. After COMMIT_TRIES the error goes
    up; a restart with the same transactional.id settles the transaction."""
    for attempt in range(1, COMMIT_TRIES + 1):
        try:
            producer.commit_transaction()
            return
        except TransactionOutcomeUnknownError as exc:
            if attempt == COMMIT_TRIES:
                raise
            log.warning("commit outcome unknown (try %d): %s; committing again", attempt, exc)
            time.sleep(backoff(attempt))


def abort(producer: TransactionalProducer) -> None:
    """abort_transaction(), called again while it does not complete (records still in
    flight, the coordinator away), COMMIT_TRIES times in all."""
    for attempt in range(1, COMMIT_TRIES + 1):
        try:
            producer.abort_transaction()
            return
        except TransactionOutcomeUnknownError as exc:
            if attempt == COMMIT_TRIES:
                raise
            log.warning("abort did not complete (try %d): %s; aborting again", attempt, exc)
            time.sleep(backoff(attempt))


class TransactionFailedError(Exception):
    """A transaction that must not commit: ``error`` says why, ``record`` is the input it
    counts against (None: no single input is to blame)."""

    def __init__(self, error: BaseException, record: Message | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.record = record


class Loop:
    """One instance: its two clients, and what it remembers about failed records."""

    def __init__(self, args: argparse.Namespace, stats: Stats, stop: threading.Event) -> None:
        self.args = args
        self.stats = stats
        self.stop = stop
        self.injector = FailureInjector(args.fail_once_at)
        self.attempts: dict[Position, int] = {}  # failed tries of a record not yet committed
        self.errors: dict[Position, BaseException] = {}  # and its last error
        # Per partition, the last offset of a batch that an output rejection failed: up
        # to there, records go one per transaction, so a rejection names its record.
        self.one_by_one: dict[tuple[str, int], int] = {}
        self.rejections: dict[Position, ProduceFailedException] = {}  # in this transaction
        self.batch_failures = 0  # in a row, not counted against any record
        self.consumer = make_consumer(args)
        self.producer = make_producer(args)

    def run(self) -> int:
        try:
            self.producer.init_transactions()  # fences an older instance with this id
            self.consumer.subscribe(
                [self.args.input_topic],
                on_assign=self.on_assign,
                on_revoke=self.on_revoke,
                on_lost=self.on_lost,
            )
            idle_since = time.monotonic()
            while not self.stop.is_set():
                batch = self.poll()
                if batch:
                    idle_since = time.monotonic()
                    self.run_batch(batch)
                elif time.monotonic() - idle_since > self.args.idle_timeout:
                    break
            return self.stats.records
        except (FatalError, TransactionOutcomeUnknownError):
            # KIP-691: a fatal error ends this producer; close both clients and stop. A
            # commit still unsettled is left to the next init_transactions() of this id.
            log.exception("stopping: closing the producer and the consumer")
            raise
        finally:
            self.producer.close()
            self.consumer.close()  # leaves the group: the others rebalance at once

    def poll(self) -> list[Message]:
        """The next batch. Consumer errors are logged; a fatal one stops the loop."""
        batch = []
        for msg in self.consumer.consume(num_messages=self.args.batch_size, timeout=0.5):
            err = msg.error()
            if err is None:
                batch.append(msg)
            elif err.fatal() or err.code() == KafkaError._FATAL:
                # librdkafka hands its fatal consumer error (a static member fenced by
                # another with the same group.instance.id, say) to consume() as code
                # _FATAL, with confluent-kafka's fatal() flag left False.
                raise FatalError(f"fatal consumer error: {err.str()}", kafka_error=err)
            elif err.code() == KafkaError._PARTITION_EOF:
                log.debug("end of %s [%s] at offset %s", msg.topic(), msg.partition(), msg.offset())
            else:
                log.warning("consumer error (librdkafka carries on): %s", err.str())
        return batch

    def run_batch(self, batch: list[Message]) -> None:
        """Commit the batch in one transaction, or one record per transaction while an
        output rejection is being narrowed down. After a failed transaction the rest of
        the batch is dropped: the consumer was rewound, it comes again."""
        pending = batch
        while pending and not self.stop.is_set():
            size = 1 if self.one_by_one else len(pending)
            try:
                self.transaction(pending[:size])
            except TransactionFailedError as failure:
                self.roll_back(failure, pending[:size], pending)
                return
            pending = pending[size:]

    def transaction(self, chunk: list[Message]) -> None:
        """One transaction over ``chunk``; raises TransactionFailedError if it must abort."""
        self.rejections.clear()
        recovered: list[str] = []
        try:
            # Phase 1: transmission.
            self.producer.begin_transaction()
            for msg in chunk:
                if self.attempts.get(position(msg), 0) >= self.args.max_attempts:
                    recovered.append(self.recover(msg))
                else:
                    self.transmit(msg)
            self.producer.send_offsets_to_transaction(
                next_offsets(chunk), self.consumer.consumer_group_metadata()
            )
            # Phase 2: commit (again while its outcome is unknown).
            commit(self.producer)
        except (FatalError, TransactionOutcomeUnknownError):
            raise
        except KafkaTxnError as exc:  # CommitFailedException, a refused send, ...
            raise TransactionFailedError(exc) from exc
        self.committed(chunk, recovered)

    def transmit(self, msg: Message) -> None:
        try:
            self.injector.check()
            value = process(msg)
            self.producer.produce(
                self.args.output_topic, value, key=msg.key(), on_delivery=self.watch(msg)
            )
        except KafkaTxnError:
            raise  # Kafka's verdict: judged after the abort
        except Exception as exc:  # process() raised, or made an output Kafka cannot take
            raise TransactionFailedError(exc, msg) from exc

    def watch(self, msg: Message) -> DeliveryCallback:
        """The delivery callback of ``msg``'s output: notes a rejection, whichever call
        (produce, commit's flush, abort) serves the report."""

        def on_delivery(error: ProduceFailedException | None, _: Message) -> None:
            if error is not None and error.failure_type is FailureType.MESSAGE_REJECTED:
                self.rejections.setdefault(position(msg), error)

        return on_delivery

    def recover(self, msg: Message) -> str:
        """A record that failed --max-attempts times goes, in this transaction and with
        its offset, to the dead-letter topic; without one (or when its dead-letter record
        was rejected too) it is skipped. Either way its partition moves on."""
        key = position(msg)
        if self.args.dead_letter_topic and self.attempts[key] == self.args.max_attempts:
            DeadLetterRecoverer(self.args.dead_letter_topic)(msg, self.errors[key], self.producer)
            return "dead-lettered"
        log.error("skipping record %s after %d failed tries: %s", key, self.attempts[key],
                  self.errors[key])  # fmt: skip
        return "skipped"

    def roll_back(
        self, failure: TransactionFailedError, chunk: list[Message], pending: list[Message]
    ) -> None:
        """Abort, THEN rewind every partition of ``pending``, then decide how the records
        come round again."""
        log.warning("transaction of %d records failed, aborting: %s", len(chunk), failure.error)
        # KIP-447: abort first. Until the abort the group has pending offsets of this
        # transaction. The abort also serves delivery reports still queued.
        abort(self.producer)
        self.stats.aborts += 1
        rewind(self.consumer, pending)
        record = failure.record
        if record is None and (self.rejections or rejected(failure.error)):
            if len(chunk) > 1:  # which input's output was it? One per transaction tells.
                for topic, partition, offset in map(position, chunk):
                    last = self.one_by_one.get((topic, partition), offset)
                    self.one_by_one[(topic, partition)] = max(offset, last)
                log.info("an output was rejected: these records go one per transaction")
                return
            record = chunk[0]  # alone in its transaction: the rejection is its own
        if record is None:  # not a record's fault: the batch again, after a pause
            self.batch_failures += 1
            time.sleep(backoff(self.batch_failures))
            return
        key = position(record)
        self.attempts[key] = self.attempts.get(key, 0) + 1
        self.errors[key] = failure.error
        if self.attempts[key] >= self.args.max_attempts:
            log.warning("record %s failed %d times: recovering it next", key, self.attempts[key])
            return
        time.sleep(backoff(self.attempts[key]))

    def committed(self, chunk: list[Message], recovered: list[str]) -> None:
        self.stats.transactions += 1
        self.stats.records += len(chunk)
        self.stats.dead_lettered += recovered.count("dead-lettered")
        self.stats.skipped += recovered.count("skipped")
        self.batch_failures = 0
        for msg in chunk:
            key = position(msg)
            self.attempts.pop(key, None)
            self.errors.pop(key, None)
            if self.one_by_one.get(key[:2], key[2]) <= key[2]:
                self.one_by_one.pop(key[:2], None)

    # Rebalance callbacks run inside consume(), that is between transactions.
    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Reading starts at the group's committed offsets, fetched with require_stable:
        while a previous owner's transaction holds offsets of these partitions, librdkafka
        waits (UNSTABLE_OFFSET_COMMIT is retried) until it commits or aborts."""
        self.stats.assigned += len(partitions)
        log.info("assigned %s", [(tp.topic, tp.partition) for tp in partitions])

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """No transaction is open here: every batch read was committed, or aborted and
        rewound (and librdkafka drops from a batch being collected the records of
        partitions revoked meanwhile). Forget what was kept about their records."""
        self.stats.revoked += len(partitions)
        log.info("revoked %s", [(tp.topic, tp.partition) for tp in partitions])
        gone = {(tp.topic, tp.partition) for tp in partitions}
        for key in [k for k in self.attempts if k[:2] in gone]:
            del self.attempts[key]
            self.errors.pop(key, None)
        for tp in gone:
            self.one_by_one.pop(tp, None)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions lost (the session timed out): another member may own them already.
        The last transaction was settled before this consume(); the group would refuse
        its offsets now (old generation: FatalError)."""
        log.warning("lost %s", [(tp.topic, tp.partition) for tp in partitions])
        self.on_revoke(consumer, partitions)


def run(
    args: argparse.Namespace, stats: Stats | None = None, stop: threading.Event | None = None
) -> int:
    """Run the loop until --idle-timeout passes with no input, or ``stop`` is set (the
    current transaction ends first); return how many input records it committed
    (processed, dead-lettered or skipped). Raises FatalError and, for a commit still
    unsettled after COMMIT_TRIES tries, TransactionOutcomeUnknownError."""
    return Loop(args, stats or Stats(), stop or threading.Event()).run()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        help="the Kafka cluster (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092, "
        "where `kafka-txn broker` listens)",
    )
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument(
        "--idle-timeout", type=float, default=5.0, help="stop after this many seconds without input"
    )
    parser.add_argument(
        "--max-attempts", type=int, default=3, help="tries per record before it is recovered"
    )
    parser.add_argument(
        "--dead-letter-topic",
        default=None,
        help="where a record goes after --max-attempts failures (default: skip it)",
    )
    parser.add_argument(
        "--fail-once-at",
        type=int,
        default=None,
        help="inject one processing failure at the N-th record read",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    stop = threading.Event()  # SIGTERM/SIGINT: finish the transaction, leave the group
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stats = Stats()
    try:
        run(args, stats, stop)
    except FatalError as exc:
        log.error("stopped by a fatal error: %s. Start the instance again.", exc)
        return 1
    except TransactionOutcomeUnknownError as exc:
        log.error(
            "stopped with a commit whose outcome is unknown (%s). Start the instance again "
            "with the same --transactional-id: it settles that commit.",
            exc,
        )
        return 1
    print(f"committed {stats.records} input records exactly once to {args.output_topic} "
          f"({stats.dead_lettered} dead-lettered, {stats.skipped} skipped)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
