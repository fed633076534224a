"""Exactly-once consume-process-produce: the KIP-691 template in Python.

Scenario: read records from --input-topic, transform each one, write the results to
--output-topic, and commit the consumed offsets in the same transaction, so every input
record is reflected in the output exactly once, whatever fails.

The loop has two phases (KIP-691):
  1. transmission: begin, process, produce, send the consumer's offsets. Any exception
     here only means "do not commit".
  2. commit: commit, or abort. CommitFailedException (and any abortable error) means:
     abort, and only then rewind the consumer to the batch's first offsets; the records
     are read and processed again in the next transaction. (Abort first: while the
     transaction is open its offsets are pending, and Apache Kafka refuses a
     read_committed consumer's offset fetch with UNSTABLE_OFFSET_COMMIT.) A commit that
     raises TransactionOutcomeUnknownError may have committed: it is called again,
     never aborted.
A FatalError (fenced, not authorized, ...) ends the loop: both clients are closed and the
error is re-raised. --fail-once-at N injects one processing failure at the N-th record to
show the abort path.

Assumes: the topics exist; the broker supports transactions (Kafka >= 2.5 for
consumer-group fencing via send_offsets_to_transaction's group metadata).

    python examples/consume_process_produce.py --bootstrap-servers 127.0.0.1:9092 \\
        --input-topic in --output-topic out --group demo --transactional-id demo-0
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from confluent_kafka import Consumer, Message, TopicPartition

from kafka_txn import (
    FatalError,
    KafkaTxnError,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)

log = logging.getLogger("consume_process_produce")


class InjectedError(Exception):
    """The failure --fail-once-at injects into processing."""


def process(msg: Message) -> bytes:
    """The business logic: here, upper-case the value."""
    return (msg.value() or b"").upper()


def rewind(consumer: Consumer, batch: Sequence[Message]) -> None:
    """Seek each partition of the batch back to its first offset in it, so that the
    records of an aborted transaction are read again. (Not to the group's committed
    offset: a partition without one would restart at auto.offset.reset, and no offset
    fetch is needed.) Call it after the abort."""
    first: dict[tuple[str, int], int] = {}
    for msg in batch:
        first.setdefault((msg.topic(), msg.partition()), msg.offset())
    for (topic, partition), offset in first.items():
        consumer.seek(TopicPartition(topic, partition, offset))


def next_offsets(batch: Sequence[Message]) -> list[TopicPartition]:
    """The offsets to commit for a batch: one past the last record of each partition."""
    last: dict[tuple[str, int], int] = {}
    for msg in batch:
        last[(msg.topic(), msg.partition())] = msg.offset()
    return [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]


def make_consumer(args: argparse.Namespace) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": args.bootstrap_servers,
            "group.id": args.group,
            # Never read records of aborted or open transactions.
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


def transmit(
    producer: TransactionalProducer,
    consumer: Consumer,
    batch: Sequence[Message],
    output_topic: str,
    injector: FailureInjector,
) -> bool:
    """Phase 1: begin, process, produce, add the offsets. True if the batch may commit;
    any failure here (but a fatal one) only means: do not commit."""
    try:
        producer.begin_transaction()
        for msg in batch:
            injector.check()
            producer.produce(output_topic, process(msg), key=msg.key())
        producer.send_offsets_to_transaction(
            next_offsets(batch), consumer.consumer_group_metadata()
        )
        return True
    except FatalError:
        raise
    except (KafkaTxnError, InjectedError) as exc:
        log.warning("transmission failed, aborting: %s", exc)
        return False


COMMIT_TRIES = 3
"""How many times a commit whose outcome is unknown is tried before giving up."""


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


def commit_or_abort(
    producer: TransactionalProducer,
    consumer: Consumer,
    batch: Sequence[Message],
    should_commit: bool,
) -> bool:
    """Phase 2: commit, or abort and then rewind. True if the transaction committed."""
    try:
        if should_commit:
            commit(producer)
            return True
    except (FatalError, TransactionOutcomeUnknownError):
        raise
    except KafkaTxnError as exc:  # CommitFailedException or another abortable error
        log.warning("commit failed, aborting: %s", exc)
    producer.abort_transaction()  # first: the transaction's offsets stop being pending
    rewind(consumer, batch)
    return False


def run(args: argparse.Namespace) -> int:
    """Run the loop until --idle-timeout passes with no input; return records written."""
    consumer = make_consumer(args)
    producer = make_producer(args)
    injector = FailureInjector(args.fail_once_at)
    written = 0
    try:
        producer.init_transactions()
        consumer.subscribe([args.input_topic])
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < args.idle_timeout:
            batch = [
                m
                for m in consumer.consume(num_messages=args.batch_size, timeout=0.5)
                if m.error() is None
            ]
            if not batch:
                continue
            idle_since = time.monotonic()
            should_commit = transmit(producer, consumer, batch, args.output_topic, injector)
            if commit_or_abort(producer, consumer, batch, should_commit):
                written += len(batch)
        return written
    except FatalError:
        # KIP-691: a fatal error ends this producer; close both clients and stop.
        log.exception("fatal error: closing the producer and the consumer")
        raise
    finally:
        producer.close()
        consumer.close()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument(
        "--idle-timeout", type=float, default=5.0, help="stop after this many seconds without input"
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
    written = run(args)
    print(f"wrote {written} records exactly once to {args.output_topic}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
