"""The exactly-once loop (``ExactlyOnceProcessor``) on Apache Kafka 4.4 started by this
module, under both group protocols: ``consumer`` (KIP-848, the default group coordinator
protocol of 4.x brokers) and ``classic``.

What it checks, for each protocol, with a transaction of the loop open and its offsets
not yet sent when the group changes:

- a second member joins: the group waits for the member at work (classic: the group
  stays in PreparingRebalance at its generation; consumer: the member keeps its epoch
  with the partitions pending revocation), so ``send_offsets_to_transaction`` is
  accepted, the transaction commits, and the partitions move on after it;
- the member is removed from the group while it works (past ``max.poll.interval.ms``,
  the rebalance timeout): the group answers its offsets ``UNKNOWN_MEMBER_ID``, ``run()``
  stops with ``FatalError`` and aborts the transaction, and the new owner has output
  every input;
- offsets sent with group metadata taken before a rebalance: what the group answers
  (``ILLEGAL_GENERATION``, or KIP-1251's acceptance of an older member epoch for a
  partition the member still owns);
- a ``STALE_MEMBER_EPOCH`` answer (what TxnOffsetCommit v6+ gets for an epoch the group
  refuses) stops the loop like ``ILLEGAL_GENERATION``.

Every run ends with an independent check: a kafka-python read_committed consumer (no
group, every partition assigned) sees each input's output exactly once, and the group's
committed offsets are one past the last input record of every partition.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tenacity
from confluent_kafka import Consumer, ConsumerGroupState, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_txn import FatalError, TransactionalProducer
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.eos import ExactlyOnceProcessor
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support.apache_kafka import ApacheKafka, require_java_and_maven
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary

PROTOCOLS = ["consumer", "classic"]
PARTITIONS = 4
PER_PARTITION = 10

# The broker's KIP-848 heartbeat interval (default 5 s, floor 5 s) made short, so that a
# member learns of a new target assignment within a second; everything else is Apache
# Kafka's default.
_BROKER_PROPERTIES = {
    "group.consumer.heartbeat.interval.ms": "1000",
    "group.consumer.min.heartbeat.interval.ms": "500",
}
# The rebalance timeout of a member that stalls (KIP-848 takes max.poll.interval.ms as
# the member's rebalance timeout; librdkafka leaves a classic group after it).
_STALL_MAX_POLL_MS = 6000


@pytest.fixture(scope="module")
def kafka() -> Iterator[Broker]:
    """An Apache Kafka broker of this module's own (tests/support/apache_kafka.py)."""
    require_java_and_maven()
    server = ApacheKafka(properties=_BROKER_PROPERTIES).start()
    try:
        yield Broker(server.bootstrap_servers, server.description)
    finally:
        server.stop()


# ---------------------------------------------------------------- helpers
def _seed(kafka: Broker, topic: str, values: list[bytes]) -> None:
    """``values`` in one transaction, spread evenly over the partitions."""
    conf = {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
    with TransactionalProducer(conf) as producer:
        producer.init_transactions()
        with producer.transaction():
            for i, value in enumerate(values):
                producer.produce(topic, value, key=value, partition=i % PARTITIONS)


def _wave(first: int) -> list[bytes]:
    return [b"v-%04d" % i for i in range(first, first + PARTITIONS * PER_PARTITION)]


def _consumer_config(kafka: Broker, group: str, protocol: str, name: str) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "group.id": group,
        "group.protocol": protocol,
        "client.id": name,
    }
    if protocol == "classic":  # the KIP-848 group takes these from the broker
        conf |= {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
    return conf


class _Spied(ExactlyOnceProcessor):
    """An ExactlyOnceProcessor that notes, in order, what became of each
    ``send_offsets_to_transaction()`` and commit, and the partitions revoked from it."""

    def __init__(self, name: str, events: list[tuple[Any, ...]], *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.name, self.events = name, events
        send, commit = self.producer.send_offsets_to_transaction, self.producer.commit_transaction

        def send_offsets(offsets: list[TopicPartition], metadata: Any, *a: Any) -> None:
            try:
                send(offsets, metadata, *a)
            except BaseException as exc:
                events.append((name, "send_offsets refused", exc))
                raise
            events.append((name, "send_offsets", {tp.partition: tp.offset for tp in offsets}))

        def commit_transaction(*a: Any) -> None:
            commit(*a)
            events.append((name, "committed"))

        self.producer.send_offsets_to_transaction = send_offsets  # type: ignore[method-assign]
        self.producer.commit_transaction = commit_transaction  # type: ignore[method-assign]

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions:
            self.events.append((self.name, "revoked", sorted(tp.partition for tp in partitions)))
        super()._on_revoke(consumer, partitions)


class _Run:
    """Two processors of one group over one source topic: ``a`` stops inside
    ``process()`` on its second record (its transaction open at the coordinator, its
    offsets not sent) until ``release()``; ``b`` runs freely."""

    def __init__(self, kafka: Broker, protocol: str, *, a_consumer: dict[str, Any]) -> None:
        self.kafka, self.protocol = kafka, protocol
        self.source, self.sink = kafka.create_topic(PARTITIONS), kafka.create_topic(2)
        self.group = f"g-{uuid.uuid4().hex[:8]}"
        self.sent: list[bytes] = []
        self.events: list[tuple[Any, ...]] = []
        self.handled: dict[str, Counter[bytes]] = {"a": Counter(), "b": Counter()}
        self.blocked, self._gate = threading.Event(), threading.Event()
        self.results: dict[str, object] = {}
        self.txn_ids = {name: f"eos-{name}-{self.group}" for name in ("a", "b")}
        self.processors = {
            name: _Spied(
                name,
                self.events,
                {
                    **_consumer_config(kafka, self.group, protocol, f"{name}-{self.group}"),
                    **(a_consumer if name == "a" else {}),
                },
                {
                    "bootstrap.servers": kafka.bootstrap_servers,
                    "transactional.id": self.txn_ids[name],
                },
                [self.source],
                self._process(name),
                backoff=tenacity.wait_fixed(0.05),
                batch_size=200,
            )
            for name in ("a", "b")
        }
        self._threads: dict[str, threading.Thread] = {}

    def _process(self, name: str) -> Callable[[Any], list[tuple[str, bytes]]]:
        def process(record: Any) -> list[tuple[str, bytes]]:
            self.handled[name][record.value()] += 1
            if name == "a" and sum(self.handled["a"].values()) == 2:
                self.blocked.set()  # the first record's output is produced: txn open
                self._gate.wait(120)
            return [(self.sink, record.value())]

        return process

    def feed(self, values: list[bytes]) -> None:
        _seed(self.kafka, self.source, values)
        self.sent.extend(values)

    def start(self, name: str) -> None:
        processor = self.processors[name]

        def run() -> None:
            try:
                self.results[name] = processor.run()  # until stop()
            except BaseException as exc:
                self.results[name] = exc

        self._threads[name] = threading.Thread(target=run, name=f"processor-{name}")
        self._threads[name].start()

    def release(self) -> None:
        self._gate.set()

    def wait_all_committed(self, timeout: float = 90.0) -> None:
        """Until the group's committed offsets are past every input record."""
        ends = _after_last_record(self.kafka, self.source)
        _wait(
            lambda: _committed(self.kafka, self.group, self.source) == ends,
            "the group committed every input",
            timeout,
        )

    def stop(self) -> None:
        for processor in self.processors.values():
            processor.stop()
        self.join()

    def join(self) -> None:
        for thread in self._threads.values():
            thread.join(timeout=120)
        assert not any(t.is_alive() for t in self._threads.values()), "a processor hangs"

    def wait_open(self, name: str) -> None:
        """Until the coordinator shows ``name``'s transaction open (its first output's
        partition registered)."""
        _wait(
            lambda: _transaction_state(self.kafka, self.txn_ids[name]) == "Ongoing",
            f"the transaction of {name} is open at the coordinator",
        )

    def close(self) -> None:
        self.release()
        for name, processor in self.processors.items():
            processor.stop()
            if name not in self._threads:  # never ran: run() did not close it
                processor.close()
        with contextlib.suppress(AssertionError):
            self.join()

    def of(self, name: str, what: str) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] == name and e[1] == what]

    def describe_group(self) -> Any:
        admin = AdminClient({"bootstrap.servers": self.kafka.bootstrap_servers})
        return admin.describe_consumer_groups([self.group])[self.group].result(timeout=10)

    def member(self, description: Any, name: str) -> Any | None:
        client_id = f"{name}-{self.group}"
        return next((m for m in description.members if m.client_id == client_id), None)


def _partitions(assignment: Any) -> set[int]:
    return {tp.partition for tp in (assignment.topic_partitions if assignment else [])}


def _wait(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.2)


def _transaction_state(kafka: Broker, transactional_id: str) -> str:
    settings = ConnectionSettings.from_librdkafka({"bootstrap.servers": kafka.bootstrap_servers})
    with CoordinatorClient(settings, transactional_id) as client:
        return client.describe().state


def _after_last_record(kafka: Broker, topic: str) -> dict[int, int]:
    """Per partition, one past its last record, read with kafka-python (read_committed,
    no group): where a group that consumed every record stands (commit markers take
    offsets too, so this is not a record count)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=kafka.bootstrap_servers,
        isolation_level="read_committed",
        enable_auto_commit=False,
        group_id=None,
    )
    try:
        partitions = [KTopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        last: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for tp, records in consumer.poll(timeout_ms=200).items():
                last[tp.partition] = max(last.get(tp.partition, -1), *(r.offset for r in records))
        return {p: o + 1 for p, o in last.items()}
    finally:
        consumer.close()


def _committed(kafka: Broker, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets of ``topic``, read with kafka-python's admin client."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        offsets = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}


def _assert_exactly_once(run: _Run) -> None:
    """Each input's output once (kafka-python, read_committed), and the group's offsets
    one past every input record."""
    got = Counter(v for _, v in run.kafka.read_committed(run.sink, expected=len(run.sent)))
    assert got == Counter(run.sent), (
        f"missing {sorted(set(run.sent) - set(got))}, "
        f"twice or more {sorted(v for v, n in got.items() if n > 1)}"
    )
    assert run.kafka.open_partitions(run.sink) == {}
    assert _committed(run.kafka, run.group, run.source) == _after_last_record(run.kafka, run.source)


def _rebalance_waits_for_a(run: _Run) -> bool:
    """Whether the group has taken ``b`` in and waits for ``a`` to give up partitions:
    classic, PreparingRebalance with both members (the generation does not move until
    ``a`` rejoins); consumer (KIP-848), ``a`` still owns partitions its target
    assignment no longer has (pending revocation, at its current epoch)."""
    group = run.describe_group()
    a, b = run.member(group, "a"), run.member(group, "b")
    if a is None or b is None:
        return False
    if run.protocol == "classic":
        return group.state is ConsumerGroupState.PREPARING_REBALANCING
    return _partitions(a.target_assignment) < _partitions(a.assignment)


# ---------------------------------------------------------------- the tests
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.guarantee("6.10")
def test_a_member_joining_while_a_transaction_is_open_does_not_refuse_its_offsets(kafka, protocol):
    """A second member joins while the first has a transaction open and its offsets not
    sent. The group coordinator waits for the member at work: a classic group stays in
    PreparingRebalance at its generation until every member rejoins
    (``ClassicGroup.validateOffsetCommit`` compares the generation only), and a
    consumer-protocol member keeps its member epoch while partitions are pending
    revocation (``ConsumerGroup.validateOffsetCommit``: the member's current epoch
    commits every partition it holds). So ``send_offsets_to_transaction`` is accepted,
    also for the partitions being revoked, and the transaction commits; the partitions
    move to the new member only when the loop's next ``consume()`` gives them up, and it
    starts from the offsets committed with that transaction. Then both members process
    new input, and every input is output once."""
    run = _Run(kafka, protocol, a_consumer={})
    try:
        run.feed(_wave(0))
        run.start("a")
        assert run.blocked.wait(60), "the first member never processed a record"
        run.wait_open("a")
        run.start("b")
        _wait(lambda: _rebalance_waits_for_a(run), "the group waits for the member at work")
        run.release()
        # The group took the offsets of the transaction open during the rebalance, for
        # every partition of the batch, and the commit went through.
        _wait(lambda: run.of("a", "committed"), "the first member committed")
        first = run.events.index(run.of("a", "send_offsets")[0])
        assert run.events[first + 1] == ("a", "committed")
        sent_offsets = run.events[first][2]
        _wait(lambda: run.of("a", "revoked"), "the first member gave partitions up")
        revoked = set(run.of("a", "revoked")[0][2])
        assert revoked & set(sent_offsets), (sent_offsets, revoked)  # offsets of moved ones
        _wait(
            lambda: _partitions(getattr(run.member(run.describe_group(), "b"), "assignment", None)),
            "the second member got partitions",
        )
        run.feed(_wave(1000))  # both members now have work
        _wait(lambda: run.handled["b"], "the second member processed a record")
        run.wait_all_committed()
        run.stop()
    finally:
        run.close()
    assert not run.of("a", "send_offsets refused") and not run.of("b", "send_offsets refused")
    assert all(not isinstance(r, BaseException) for r in run.results.values()), run.results
    assert run.handled["a"] and run.handled["b"]
    _assert_exactly_once(run)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.guarantee("6.10")
def test_a_member_removed_while_a_transaction_is_open_has_its_offsets_refused(kafka, protocol):
    """The member at work stalls in ``process()`` past ``max.poll.interval.ms`` while a
    second member waits for its partitions. Consumer protocol: the group coordinator
    fences the member that does not revoke within its rebalance timeout (KIP-848 takes
    ``max.poll.interval.ms``; GroupMetadataManager logs "failed to transition from epoch
    ... within ...") and removes it; classic: librdkafka leaves the group after
    ``max.poll.interval.ms`` and forgets its member id. Either way the second member
    gets every partition, reads from the committed offsets and outputs every input.
    When the stalled member sends its offsets, the group answers ``UNKNOWN_MEMBER_ID``
    (``ConsumerGroup``/``ClassicGroup.validateOffsetCommit``: no such member): KIP-691
    makes it fatal, so ``run()`` raises ``FatalError`` and its ``close()`` aborts the
    transaction, whose output no read_committed reader ever sees."""
    max_poll = {"max.poll.interval.ms": _STALL_MAX_POLL_MS}
    if protocol == "classic":
        max_poll["session.timeout.ms"] = _STALL_MAX_POLL_MS
    run = _Run(kafka, protocol, a_consumer=max_poll)
    try:
        run.feed(_wave(0))
        run.start("a")
        assert run.blocked.wait(60), "the first member never processed a record"
        run.wait_open("a")
        run.start("b")
        run.wait_all_committed()  # b, once the group gave it every partition
        assert sum(run.handled["b"].values()) == len(run.sent)
        run.release()
        _wait(lambda: "a" in run.results, "the stalled member's run() returned")
        run.stop()
    finally:
        run.close()
    [(_, _, refused)] = run.of("a", "send_offsets refused")
    assert isinstance(refused, FatalError)
    assert refused.kafka_error.code() == KafkaError.UNKNOWN_MEMBER_ID, refused
    assert run.results["a"] is refused  # run() stopped with it
    assert not run.of("a", "committed")
    assert not isinstance(run.results["b"], BaseException), run.results["b"]
    _assert_exactly_once(run)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_offsets_sent_with_group_metadata_from_before_a_rebalance(kafka, protocol):
    """What the group coordinator answers to TxnOffsetCommit with a generation or member
    epoch from before a rebalance (the loop never sends such offsets: it reads the group
    metadata right before it sends them). Classic: ``ILLEGAL_GENERATION`` for every
    partition (``ClassicGroup.validateOffsetCommit``). Consumer protocol: an older member
    epoch goes through KIP-1251's per-partition check
    (``ConsumerGroup.createAssignmentEpochValidator``): a partition the member still
    holds, assigned at or before that epoch, commits; a partition it gave up is refused
    with ``StaleMemberEpochException``, which ``OffsetMetadataManager`` answers as
    ``ILLEGAL_GENERATION`` to TxnOffsetCommit before v6 (librdkafka sends v3); both are
    fatal (KIP-691)."""
    source = kafka.create_topic(PARTITIONS)
    sink = kafka.create_topic(1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumers = {
        name: Consumer(
            {
                **_consumer_config(kafka, group, protocol, f"{name}-{group}"),
                "enable.auto.commit": False,
            }
        )
        for name in ("a", "b")
    }
    assigned = {name: set[int]() for name in consumers}

    def poll(name: str) -> None:
        consumers[name].poll(0.2)
        assigned[name] = {tp.partition for tp in consumers[name].assignment()}

    def outcome(partition: int, metadata: Any) -> str:
        conf = {
            "bootstrap.servers": kafka.bootstrap_servers,
            "transactional.id": f"stale-{uuid.uuid4().hex[:8]}",
        }
        with TransactionalProducer(conf) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.produce(sink, b"x")
            try:
                producer.send_offsets_to_transaction(
                    [TopicPartition(source, partition, 1)], metadata
                )
            except FatalError as exc:
                return exc.kafka_error.name()
            producer.commit_transaction()
            return "committed"

    try:
        consumers["a"].subscribe([source])
        _wait(lambda: poll("a") or len(assigned["a"]) == PARTITIONS, "a got every partition")
        before = consumers["a"].consumer_group_metadata()
        consumers["b"].subscribe([source])
        _wait(
            lambda: poll("a") or poll("b") or (assigned["a"] and assigned["b"]),
            "the rebalance moved partitions to b",
        )
        kept, moved = min(assigned["a"]), min(assigned["b"])
        answers = {"kept": outcome(kept, before), "moved": outcome(moved, before)}
    finally:
        for consumer in consumers.values():
            consumer.close()
    if protocol == "classic":
        assert answers == {"kept": "ILLEGAL_GENERATION", "moved": "ILLEGAL_GENERATION"}
    else:
        assert answers == {"kept": "committed", "moved": "ILLEGAL_GENERATION"}


@pytest.mark.guarantee("6.10")
def test_a_stale_member_epoch_answer_stops_the_loop_like_illegal_generation(kafka):
    """``STALE_MEMBER_EPOCH`` is what the group answers a KIP-848 member's
    TxnOffsetCommit v6+ with an epoch it refuses (``OffsetMetadataManager``:
    ``TxnOffsetCommitRequest.supportsStaleMemberEpochError``); before v6 the same refusal
    is ``ILLEGAL_GENERATION``. Java's TxnOffsetCommitHandler makes both a
    ``CommitFailedException``, which KIP-691 rules fatal, and librdkafka only flags it
    abortable. So the loop treats both alike: ``run()`` raises ``FatalError``, its
    ``close()`` aborts the transaction, and the next member outputs every input once."""
    source, sink = kafka.create_topic(PARTITIONS), kafka.create_topic(1)
    values = _wave(0)
    _seed(kafka, source, values)
    group = f"g-{uuid.uuid4().hex[:8]}"
    with KafkaProxy(kafka.bootstrap_servers) as proxy:
        refused = proxy.fail(ApiKey.TXN_OFFSET_COMMIT, KafkaError.STALE_MEMBER_EPOCH, times=1)
        stale = ExactlyOnceProcessor(
            _consumer_config(kafka, group, "consumer", "stale"),
            {
                "bootstrap.servers": proxy.bootstrap_servers,
                "transactional.id": f"eos-{uuid.uuid4().hex[:8]}",
            },
            [source],
            lambda r: [(sink, r.value())],
            batch_size=200,
        )
        with pytest.raises(FatalError, match="STALE_MEMBER_EPOCH") as info:
            stale.run(idle_timeout=60)
        assert refused.hits == 1
    assert info.value.kafka_error.code() == KafkaError.STALE_MEMBER_EPOCH
    assert kafka.read_committed(sink, expected=0) == []
    assert kafka.open_partitions(sink) == {}
    successor = ExactlyOnceProcessor(
        _consumer_config(kafka, group, "consumer", "successor"),
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "transactional.id": f"eos-{uuid.uuid4().hex[:8]}",
        },
        [source],
        lambda r: [(sink, r.value())],
        batch_size=200,
    )
    successor.run(idle_timeout=4)
    got = Counter(v for _, v in kafka.read_committed(sink, expected=len(values)))
    assert got == Counter(values)
    assert _committed(kafka, group, source) == _after_last_record(kafka, source)
