"""The exactly-once loop (``ExactlyOnceProcessor``) while the three-broker cluster's
brokers fail.

Two processors share a consumer group (KIP-848's ``consumer`` protocol, the 4.x default),
each with a transactional id of its own, and copy an input topic to an output topic
(``out-<value>``) while a feeder (an idempotent producer) keeps adding input. A processor
whose ``run()`` raises is replaced by a new one with the same transactional id, as a
supervisor would.

The schedule: the group coordinator is bounced (clean or hard, drawn from the seed) while
the first processor sends its offsets to a transaction; then ``BrokerFaults`` bounces the
transaction coordinators, the group coordinator and partition leaders, and pauses brokers
past the replica lag, for the schedule's seconds.

Then: once the cluster healed, the group commits the input that follows to its end, and
every processor stops when asked; a read_committed consumer (kafka-python) sees every
input's output exactly once and nothing else; no transaction is left open on the output;
every error that stopped a ``run()`` is one the docs name.
"""

from __future__ import annotations

import random
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import tenacity
from confluent_kafka import Message, Producer

from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord
from tests.support.cluster_faults import (
    SECONDS,
    SEED,
    BrokerFaults,
    Figures,
    Targets,
    assert_exactly_once,
    compare,
    documented_errors,
    wait_for,
)
from tests.support.eos_topics import committed_offsets, positions_after_last_record
from tests.support.kafka_cluster import Bounce, KafkaCluster
from tests.support.rig import Broker

pytestmark = [pytest.mark.cluster, pytest.mark.adversary]

PARTITIONS = 3
PROCESSORS = 2
PROGRESS_S = 120.0


class Feeder:
    """Adds input (``in-<n>``, every partition in turn) until stopped: an idempotent
    producer (acks=all), so a retried send is never written twice."""

    def __init__(self, cluster: KafkaCluster, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {"bootstrap.servers": cluster.bootstrap_servers, "enable.idempotence": True,
             "log_level": 0}
        )  # fmt: skip
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def feed(self, count: int) -> None:
        for _ in range(count):
            self.producer.produce(
                self.topic, b"in-%06d" % self.sent, partition=self.sent % PARTITIONS
            )
            self.sent += 1
        self.producer.poll(0)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.feed(6)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        left = self.producer.flush(120)
        assert left == 0, f"{left} inputs undelivered two minutes after the faults ended"


def stack_of(thread: threading.Thread) -> str:
    """Where ``thread`` is now (for a failure that names a hang)."""
    frame = sys._current_frames().get(thread.ident or -1)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(gone)"


class Slot:
    """One processor at a time for a transactional id; a new one after ``run()`` raised."""

    def __init__(self, make: Callable[[], ExactlyOnceProcessor]) -> None:
        self.make = make
        self.errors: list[BaseException] = []
        self.transactions = 0
        self.restarts = 0
        self.processor: ExactlyOnceProcessor | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            processor = self.processor = self.make()
            try:
                processor.run()
            except Exception as exc:
                self.errors.append(exc)
                self.restarts += 1
                time.sleep(0.5)
            finally:
                self.transactions += processor.stats.transactions

    def committed(self) -> int:
        """Transactions committed by this slot's processors so far."""
        current = self.processor
        return self.transactions + (current.stats.transactions if current else 0)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 120.0) -> str | None:
        """Stop the processor; None, or where it is if it did not stop in ``timeout``."""
        self._stop.set()
        if self.processor is not None:
            self.processor.stop()
        self._thread.join(timeout=timeout)
        return stack_of(self._thread) if self._thread.is_alive() else None


# docs/guarantees.md, "not guaranteed": librdkafka's send_offsets_to_transaction() can
# stay blocked past its timeout once the group coordinator has moved (librdkafka issue
# 5511: the TxnOffsetCommit's coordinator request waits for a broker state change that
# never comes). Only that hang, recognised by where the processor is stuck, is excused.
_STUCK_SEND_OFFSETS = (
    "not guaranteed (docs/guarantees.md): librdkafka's send_offsets_to_transaction() "
    "stayed blocked past its timeout after the group coordinator moved (librdkafka issue "
    "5511)"
)


def _stuck_in_send_offsets(stacks: list[str]) -> bool:
    return bool(stacks) and all(
        "producer.send_offsets_to_transaction(offsets, group_metadata, timeout)" in stack
        for stack in stacks
    )


@pytest.mark.timeout(600 + 3 * SECONDS)
@pytest.mark.guarantee("7.3")
def test_processors_under_broker_faults(cluster: KafkaCluster, cluster_broker: Broker) -> None:
    """Two processors in one group copy a growing input while the group coordinator is
    bounced as offsets are sent, then coordinators and leaders are bounced and brokers
    paused: every input's output is seen exactly once (kafka-python, read_committed), the
    group's offsets reach the end of the input once the cluster healed, nothing is left
    open, and every processor stops when asked."""
    source = cluster_broker.create_topic(partitions=PARTITIONS)
    sink = cluster_broker.create_topic(partitions=PARTITIONS)
    group = f"cluster-eos-{uuid.uuid4().hex[:8]}"
    ids = [f"cluster-eos-{slot}-{uuid.uuid4().hex[:8]}" for slot in range(PROCESSORS)]
    how: Bounce = random.Random(SEED).choice(["clean", "hard"])
    bounced: list[str] = []
    bring_ups: list[threading.Thread] = []

    def process(record: Message) -> list[OutputRecord]:
        time.sleep(0.002)
        return [OutputRecord(sink, b"out-" + (record.value() or b""), record.key())]

    def bounce_group_coordinator_at_offsets(processor: ExactlyOnceProcessor) -> None:
        """Bounce the group coordinator as ``processor`` sends offsets, once."""
        send = processor.producer.send_offsets_to_transaction

        def send_offsets(*args: Any, **kwargs: Any) -> None:
            if not bounced:
                node = cluster.group_coordinator(group)
                cluster.take_down(node, how)
                bounced.append(f"sending offsets: {how} bounce of broker {node}")
                thread = threading.Thread(target=cluster.bring_up, args=(node,), daemon=True)
                thread.start()
                bring_ups.append(thread)
            send(*args, **kwargs)

        processor.producer.send_offsets_to_transaction = send_offsets  # type: ignore[method-assign]

    def maker(txn_id: str, first: bool) -> Callable[[], ExactlyOnceProcessor]:
        def make() -> ExactlyOnceProcessor:
            processor = ExactlyOnceProcessor(
                {"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                 "log_level": 0},
                {"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": txn_id,
                 "log_level": 0},
                [source], process, batch_size=20, backoff=tenacity.wait_fixed(0.1),
            )  # fmt: skip
            if first and not bounced:
                bounce_group_coordinator_at_offsets(processor)
            return processor

        return make

    slots = [Slot(maker(txn_id, slot == 0)) for slot, txn_id in enumerate(ids)]
    feeder = Feeder(cluster, source)
    faults = BrokerFaults(
        cluster,
        Targets(lambda: ids, [(t, p) for t in (source, sink) for p in range(PARTITIONS)], group),
        SEED,
    )
    where = f"KAFKA_TXN_CLUSTER_SEED={SEED}"
    try:
        # The feeder runs throughout: the first member to join may take every partition
        # and drain what is there before the group gives the second its share.
        feeder.start()
        for slot in slots:
            slot.start()
        wait_for(lambda: bool(bounced), 120, f"the group coordinator's bounce ({where})")
        for thread in bring_ups:
            thread.join(timeout=180)
        cluster.wait_healed()
        with faults.running(SECONDS):
            faults.wait_until_stopped(SECONDS + 5)
        # The cluster has healed: the group commits the input that follows, to its end
        # (a member the group gave no partition commits nothing, rightly).
        before = [slot.committed() for slot in slots]
        feeder.stop()
        feeder.feed(30)
        assert feeder.producer.flush(60) == 0, "input undelivered after the cluster healed"
        ends = positions_after_last_record(cluster_broker, source, feeder.sent)
        try:
            wait_for(
                lambda: committed_offsets(cluster_broker, group, source, PARTITIONS) == ends,
                PROGRESS_S,
                f"the group's offsets at the end of the input after the cluster healed "
                f"({where}; {faults.summary()}; errors {[s.errors for s in slots]}; "
                f"committed {[s.committed() for s in slots]} (when it healed: {before}); "
                "the processors are at:\n" + "\n".join(stack_of(s._thread) for s in slots),
            )
        except AssertionError:
            stacks = [stack_of(s._thread) for s in slots]
            stuck = [t for t in stacks if "send_offsets_to_transaction" in t]
            if _stuck_in_send_offsets(stuck):
                pytest.xfail(f"{_STUCK_SEND_OFFSETS} ({where}; {faults.summary()})")
            raise
    finally:
        hung = [where_stuck for slot in slots if (where_stuck := slot.stop()) is not None]
    if hung:
        if _stuck_in_send_offsets(hung):
            pytest.xfail(f"{_STUCK_SEND_OFFSETS} ({where}; {faults.summary()})")
        raise AssertionError("a processor did not stop within 120 s; it is at:\n" + "\n".join(hung))
    inputs = [
        (v or b"").decode()
        for _, v in cluster_broker.read_committed(source, expected=feeder.sent, timeout=90)
    ]
    comparison = compare(cluster_broker, sink, [f"out-{v}" for v in inputs])
    errors = Counter(type(e).__name__ for slot in slots for e in slot.errors)
    faults.tally[f"bounces {how}"] += 1
    faults.done.insert(0, bounced[0])
    Figures(
        "ExactlyOnceProcessor",
        faults,
        sum(slot.committed() for slot in slots),
        comparison,
        errors,
    ).record()
    context = f"{where}; {faults.summary()}"
    assert len(inputs) == feeder.sent, f"the input itself lost or doubled records ({context})"
    assert_exactly_once(comparison, context)
    assert set(errors) <= documented_errors("eos"), (errors, context)
