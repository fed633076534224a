"""The producer id/epoch prepare uses after an abort (kafka_txn/twophase/identity.py,
``IdentityTracker``): the identity from before the abort is a candidate that prepare's
own DescribeTransactions confirms (this transaction Ongoing under exactly that id and
epoch, with a start time newer than any seen) or refuses, and the next statistics
snapshot stays the authority.

The decision table runs without a broker. On the real broker: alternating committed
and aborted transactions, with a two-phase producer and with a DualWriter, prepare after
an abort without waiting for a statistics snapshot (told by the tracker's counters,
never by timing); and an abort that bumps the epoch (a Produce answered
UNKNOWN_PRODUCER_ID: librdkafka marks the transaction abortable with an epoch bump,
rd_kafka_handle_idempotent_Produce_error, and its abort fetches the new epoch) falls back
to the statistics and commits under the new epoch."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, select, text

from kafka_txn import (
    FatalError,
    PreparedTxnState,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionalProducer,
    TransactionOutcome,
)
from kafka_txn.coordinator.client import TransactionDescription
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.twophase.failures import not_this_producer
from kafka_txn.twophase.identity import IdentityTracker, confirms
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support.rig import Broker

P, E, S = 4001, 7, 1_732_212_345_678
"""The candidate's producer id and epoch, and the start time of the last transaction
the producer saw at the coordinator."""


def snapshot(
    pid: int = P, epoch: int = E, txn_state: str = "Ready", idemp_state: str = "Assigned"
) -> str:
    """A librdkafka statistics payload, as much of it as the tracker reads."""
    return json.dumps(
        {
            "name": "rdkafka#producer-1",
            "type": "producer",
            "eos": {
                "idemp_state": idemp_state,
                "idemp_stateage": 1000,
                "txn_state": txn_state,
                "txn_stateage": 1000,
                "txn_may_enq": True,
                "producer_id": pid,
                "producer_epoch": epoch,
                "epoch_cnt": 1,
            },
        }
    )


def seen(
    state: str = "Ongoing", pid: int = P, epoch: int = E, start: int = S + 5
) -> TransactionDescription:
    return TransactionDescription("orders-0", state, pid, epoch, 60_000, start)


def after_abort(identity: tuple[int, int] = (P, E)) -> IdentityTracker:
    """A tracker whose producer had ``identity`` (from a snapshot), then aborted."""
    tracker = IdentityTracker(None)
    tracker.on_stats(snapshot(*identity))
    assert tracker.identity == identity
    tracker.after_abort()
    assert (tracker.identity, tracker.candidate) == (None, identity)
    return tracker


# ---------------------------------------------------------------- the decision table
# (what the coordinator shows for the transaction being prepared, confirmed?)
CASES = [
    ("confirmed: Ongoing, same id and epoch, newer start", seen(), True),
    ("confirmed: the start time one millisecond newer", seen(start=S + 1), True),
    ("the abort bumped the epoch (KIP-360)", seen(epoch=E + 1), False),
    ("bumped twice (a fence, then a transaction version 2 abort)", seen(epoch=E + 2), False),
    ("another instance's init fenced this one", seen(epoch=E + 1, start=S + 9), False),
    ("a new producer id (epoch exhausted, or the id expired)", seen(pid=P + 1, epoch=0), False),
    ("an older epoch", seen(epoch=E - 1), False),
    ("the aborted transaction, aborting", seen("PrepareAbort", start=S + 2), False),
    ("the aborted transaction, aborted", seen("CompleteAbort", start=S + 2), False),
    ("nothing registered yet: the last commit", seen("CompleteCommit", start=S), False),
    ("nothing registered yet: Empty", seen("Empty", start=-1), False),
    ("committing", seen("PrepareCommit"), False),
    ("Ongoing with the last start time", seen(start=S), False),
    ("Ongoing with an older start time (a clock step back)", seen(start=S - 1), False),
    ("Ongoing without a start time", seen(start=-1), False),
    ("the coordinator's timeout abort, under way", seen(epoch=E + 1, start=S + 5), False),
]


@pytest.mark.parametrize(("answer", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.guarantee("2.8")
def test_the_candidate_is_confirmed_only_by_its_own_open_transaction(
    answer: TransactionDescription, expected: bool
) -> None:
    assert confirms((P, E), answer, S) is expected
    tracker = after_abort()
    assert tracker.resolve(answer, S) == ((P, E) if expected else None)
    assert (tracker.confirmed, tracker.refused) == ((1, 0) if expected else (0, 1))
    assert tracker.provisional is expected
    assert tracker.candidate is None  # decided either way: a refused one is not tried again
    assert tracker.resolve(seen(), S) == ((P, E) if expected else None)


def test_without_a_start_time_seen_any_stamped_start_time_is_newer() -> None:
    assert confirms((P, E), seen(start=0), None)
    assert not confirms((P, E), seen(start=-1), None)


# (the next settled snapshot, the identity after it, a disagreement?)
LATER = [
    ("agrees", snapshot(), (P, E), False),
    ("disagrees: another epoch", snapshot(epoch=E + 1), (P, E + 1), True),
    ("disagrees: another producer id", snapshot(pid=P + 1, epoch=0), (P + 1, 0), True),
]


@pytest.mark.parametrize(
    ("payload", "identity", "disagrees"), [c[1:] for c in LATER], ids=[c[0] for c in LATER]
)
@pytest.mark.guarantee("2.8")
def test_the_next_snapshot_checks_a_confirmed_candidate(
    payload: str, identity: tuple[int, int], disagrees: bool
) -> None:
    """The snapshot is the authority: its identity replaces the candidate's. One that
    disagrees is counted and turns the candidates off for this producer, so every
    later prepare after an abort waits for the statistics, as without candidates."""
    tracker = after_abort()
    assert tracker.resolve(seen(), S) == (P, E)
    tracker.on_stats(payload)
    assert (tracker.identity, tracker.provisional) == (identity, False)
    assert tracker.disagreements == int(disagrees)
    assert tracker.use_candidates is not disagrees
    tracker.after_abort()
    assert tracker.candidate == (None if disagrees else identity)
    answer = seen(pid=identity[0], epoch=identity[1], start=S + 9)
    assert tracker.resolve(answer, S + 5) == (None if disagrees else identity)


@pytest.mark.parametrize(
    "payload",
    [
        snapshot(epoch=E + 1, txn_state="AbortingTransaction"),  # mid-abort
        snapshot(epoch=E + 1, txn_state="AbortableError"),
        snapshot(epoch=E + 1, idemp_state="WaitPID"),  # mid-bump
        snapshot(pid=-1, epoch=-1, idemp_state="Assigned"),
        '{"name": "rdkafka#producer-1"}',  # no eos object
    ],
    ids=["aborting", "abortable", "wait-pid", "no-pid", "no-eos"],
)
def test_an_unsettled_snapshot_neither_checks_nor_replaces_a_confirmed_candidate(
    payload: str,
) -> None:
    tracker = after_abort()
    assert tracker.resolve(seen(), S) == (P, E)
    tracker.on_stats(payload)
    assert (tracker.identity, tracker.provisional, tracker.disagreements) == ((P, E), True, 0)
    tracker.on_stats(snapshot())  # the next settled one does
    assert (tracker.identity, tracker.provisional, tracker.snapshots) == ((P, E), False, 2)


def test_a_snapshot_before_prepare_decides_and_the_candidate_is_not_used() -> None:
    """The abort bumped the epoch and a snapshot says so before prepare asks: prepare
    uses the snapshot's identity, whatever the coordinator's answer shows."""
    tracker = after_abort()
    tracker.on_stats(snapshot(epoch=E + 1))
    assert (tracker.identity, tracker.candidate) == ((P, E + 1), None)
    assert tracker.resolve(seen(), S) == (P, E + 1)  # confirm() then checks it as usual
    assert (tracker.confirmed, tracker.refused, tracker.disagreements) == (0, 0, 0)


def test_a_refused_candidate_leaves_the_identity_to_the_next_snapshot() -> None:
    tracker = after_abort()
    assert tracker.resolve(seen(epoch=E + 1), S) is None
    tracker.on_stats(snapshot(epoch=E + 1))
    assert (tracker.identity, tracker.disagreements, tracker.use_candidates) == (
        (P, E + 1), 0, True,
    )  # fmt: skip


def test_aborts_without_a_snapshot_between_keep_the_first_candidate() -> None:
    """Two aborts in a row, no snapshot between: the identity from before the first is
    still a candidate (it was the producer's once, all the argument needs); an init
    forgets it."""
    tracker = after_abort()
    tracker.after_abort()
    assert (tracker.identity, tracker.candidate) == (None, (P, E))
    tracker.invalidate()  # init_transactions(): a new epoch for sure
    assert (tracker.identity, tracker.candidate) == (None, None)
    assert tracker.resolve(seen(), S) is None


def test_a_confirmed_candidate_is_the_candidate_of_the_next_abort() -> None:
    tracker = after_abort()
    assert tracker.resolve(seen(), S) == (P, E)
    tracker.after_abort()  # no snapshot came meanwhile
    assert (tracker.identity, tracker.candidate) == (None, (P, E))
    assert tracker.resolve(seen(start=S + 9), S + 5) == (P, E)


def test_the_users_stats_cb_still_gets_every_snapshot() -> None:
    got: list[str] = []
    tracker = IdentityTracker(got.append)
    payloads = [snapshot(), snapshot(txn_state="InTransaction"), snapshot(epoch=E + 1)]
    for payload in payloads:
        tracker.on_stats(payload)
    assert got == payloads


# ---------------------------------------------------------------- on the real broker
TWO_PC = {"transaction.two.phase.commit.enable": True, "statistics.interval.ms": 500}


@pytest.mark.broker
@pytest.mark.guarantee("2.8")
def test_a_two_phase_producer_prepares_after_an_abort_without_waiting_for_statistics(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """Committed and aborted transactions alternate (aborted before prepare, and
    prepared then completed with another state). Every prepare after an abort goes
    without a statistics wait: under the candidate the coordinator confirmed, or the
    snapshot's identity if one came first. All states share one id/epoch."""
    with TransactionalProducer({**producer_config, **TWO_PC}) as producer:
        producer.init_transactions()
        tracker = producer._twophase.identity  # type: ignore[union-attr]
        committed, states = [], []
        for i in range(8):
            producer.begin_transaction()
            value = b"%d" % i
            producer.produce(topic, value)
            waits, confirmed, snapshots = tracker.waits, tracker.confirmed, tracker.snapshots
            if i % 4 == 1:
                producer.abort_transaction()  # failed before prepare
                continue
            state = producer.prepare_transaction()
            if i > 0:  # no wait: the identity was known, or a candidate was confirmed
                assert tracker.waits == waits, i
            if i % 2 == 0 and i > 0:  # the previous one aborted: confirmed, or a snapshot
                assert (tracker.confirmed, tracker.snapshots) in (
                    (confirmed + 1, snapshots), (confirmed, snapshots + 1),
                ), i  # fmt: skip
            if i % 4 == 3:  # the decider rolled back: another transaction's state aborts
                assert producer.complete_transaction(PreparedTxnState.EMPTY) is (
                    TransactionOutcome.ABORTED
                )
            else:
                assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
                committed.append(value)
            states.append(state)
        assert tracker.confirmed >= 1 and tracker.disagreements == 0 and tracker.refused == 0
        assert len({(s.producer_id, s.producer_epoch) for s in states}) == 1
        assert len({s.txn_start_ms for s in states}) == len(states)
    got = broker.read_committed(topic, expected=len(committed))
    assert sorted(v for _, v in got) == sorted(committed)


@pytest.mark.broker
@pytest.mark.guarantee("2.8")
def test_an_abort_that_bumps_the_epoch_falls_back_to_the_statistics(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """A Produce answered UNKNOWN_PRODUCER_ID makes librdkafka's transaction abortable
    with an epoch bump; its abort fetches epoch + 1 (InitProducerId). The next prepare
    sees its transaction under epoch + 1, refuses the candidate, waits for a snapshot
    (which says epoch + 1) and prepares under it; the commit lands."""
    with KafkaProxy(broker.bootstrap_servers) as proxy:
        config = {**producer_config, **TWO_PC, "bootstrap.servers": proxy.bootstrap_servers}
        with TransactionalProducer(config) as producer:
            producer.init_transactions()
            tracker = producer._twophase.identity  # type: ignore[union-attr]
            producer.begin_transaction()
            producer.produce(topic, b"first", partition=0)
            first = producer.prepare_transaction()
            producer.complete_transaction(first)

            rule = proxy.fail(ApiKey.PRODUCE, KafkaError.UNKNOWN_PRODUCER_ID, times=1)
            producer.begin_transaction()
            producer.produce(topic, b"refused", partition=0)
            with pytest.raises(TransactionAbortableError):
                producer.prepare_transaction()
            assert rule.hits == 1
            producer.abort_transaction()

            waits = tracker.waits
            producer.begin_transaction()
            producer.produce(topic, b"after the bump", partition=0)
            state = producer.prepare_transaction()
            assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
            assert (state.producer_id, state.producer_epoch) == (
                first.producer_id, (first.producer_epoch or 0) + 1,
            )  # fmt: skip
            # Refused by the coordinator's answer (then a wait), unless a snapshot came
            # first; never confirmed.
            assert tracker.refused <= 1 and tracker.waits == waits + tracker.refused
            assert (tracker.confirmed, tracker.disagreements) == (0, 0)
    got = broker.read_committed(topic, expected=2)
    assert [v for _, v in got] == [b"first", b"after the bump"]


class _BodyFailedError(Exception):
    pass


class _Probe:
    """DualWriter's on_step: the tracker's counters as each transaction begins and once
    it is prepared (nothing between those serves a snapshot but prepare itself)."""

    def __init__(self) -> None:
        self.tracker: IdentityTracker | None = None
        self.at: dict[str, tuple[int, int, int]] = {}

    def __call__(self, step: str) -> None:
        if step in ("after_begin", "after_prepare") and self.tracker is not None:
            t = self.tracker
            self.at[step] = (t.waits, t.confirmed, t.snapshots)


@pytest.fixture
def dual_writer(
    broker: Broker, txn_id: str, postgres_jdbc: str
) -> Iterator[tuple[DualWriter, Table, _Probe]]:
    events = Table(
        f"id_events_{uuid.uuid4().hex[:10]}", MetaData(),
        Column("id", Integer, primary_key=True), Column("value", String(64)),
    )  # fmt: skip
    state = f"id_state_{uuid.uuid4().hex[:10]}"
    probe = _Probe()
    writer = DualWriter(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id,
         "statistics.interval.ms": 500},
        postgres_jdbc, state_table=state, on_step=probe,
    )  # fmt: skip
    events.metadata.create_all(writer.engine)
    writer.start()
    probe.tracker = writer.producer._twophase.identity  # type: ignore[union-attr]
    yield writer, events, probe
    engine = create_engine(writer.engine.url)
    writer.close()
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {events.name}"))
        conn.execute(text(f"DROP TABLE IF EXISTS {state}"))
    engine.dispose()


@pytest.mark.broker
@pytest.mark.guarantee("2.8")
def test_a_dual_writer_commits_after_a_failed_transaction_without_waiting_for_statistics(
    broker: Broker, topic: str, dual_writer: tuple[DualWriter, Table, _Probe]
) -> None:
    """Failed and committed dual writes alternate; each commit after a failure prepares
    without a statistics wait (under the confirmed candidate, or a snapshot's identity
    if one came first), and the database and Kafka hold the same rows."""
    writer, events, probe = dual_writer
    tracker = probe.tracker
    assert tracker is not None
    committed: list[str] = []
    for i in range(8):
        value = f"v{i}"
        try:
            with writer.transaction() as tx:
                tx.connection.execute(events.insert(), {"id": i, "value": value})
                tx.produce(topic, value.encode())
                if i % 2:
                    raise _BodyFailedError
        except _BodyFailedError:
            continue
        committed.append(value)
        if i > 0:
            waits, confirmed, snapshots = probe.at["after_begin"]
            assert probe.at["after_prepare"] in (
                (waits, confirmed + 1, snapshots), (waits, confirmed, snapshots + 1),
            ), i  # fmt: skip
    assert tracker.confirmed >= 1 and tracker.disagreements == 0 and tracker.refused == 0
    with writer.engine.connect() as conn:
        assert sorted(conn.execute(select(events.c.value)).scalars()) == committed
    got = broker.read_committed(topic, expected=len(committed))
    assert sorted((v or b"").decode() for _, v in got) == committed


def _holding(state: str, pid: int, epoch: int) -> TransactionDescription:
    return TransactionDescription("tid", state, pid, epoch, 60000, -1 if pid < 0 else 1)


@pytest.mark.parametrize(
    ("seen", "error", "says"),
    [
        # Apache Kafka: TRANSACTIONAL_ID_NOT_FOUND; noida-db after a restart: Empty, -1.
        (_holding("Empty", -1, -1), FatalError, "does not know transactional id"),
        (_holding("CompleteAbort", 7, 4), ProducerFencedError, "transaction.timeout.ms"),
        (_holding("Empty", 7, 5), ProducerFencedError, "epoch was bumped"),
        (_holding("Ongoing", 8, 0), ProducerFencedError, "another producer initialised"),
        (_holding("Ongoing", 7, 2), FatalError, "went back"),
    ],
)
@pytest.mark.guarantee("2.8")
def test_prepare_names_why_the_coordinator_does_not_show_this_producer(
    seen: TransactionDescription, error: type[FatalError], says: str
) -> None:
    """Prepare's refusal when the coordinator shows another identity than this
    producer's (7/3) says which of the causes the answer shows, never "a newer producer"
    for an id the coordinator forgot or a state that went back; every one says to close
    the producer and create a new one."""
    exc = not_this_producer("tid", seen, 7, 3)
    assert type(exc) is error
    assert says in str(exc) and "create a new one" in str(exc)
    if error is FatalError:
        assert "another producer" not in str(exc)
