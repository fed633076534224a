"""close() frees what a producer held before it returns, in every state: librdkafka's
handle is destroyed by reference counting (its threads, sockets and memory with it),
with the garbage collector disabled and never run, whatever cycles the producer's own
objects are in and whatever still holds them (a stored fatal error, its traceback, a
caught exception, a DualWriter).

Each test opens and closes several producers in one state, checks after every close()
that confluent-kafka's Producer is gone (a weak reference to it, through a subclass: the
C type takes none), and then that this process's threads (/proc/self/task), file
descriptors (/proc/self/fd) and established TCP connections to the broker
(/proc/net/tcp and tcp6, the sockets among this process's descriptors) are back where
they were before the first producer, waiting a few seconds at most for librdkafka's
threads to finish exiting."""

from __future__ import annotations

import gc
import os
import socket
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import pytest
from confluent_kafka import KafkaError, Producer
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, text

import kafka_txn.producer.handle
from kafka_txn import (
    BrokerUnreachableError,
    CommitFailedException,
    DatabaseCommitUnknownError,
    FatalError,
    IllegalStateError,
    ProduceFailedException,
    ProducerFencedError,
    TransactionalProducer,
    TransactionInDoubtError,
    TransactionOutcomeUnknownError,
)
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.testing import ApiKey, MockCluster
from tests.support.adversaries import stand_in_describe
from tests.support.rig import Broker

EACH = 3
"""Producers opened and closed per state."""

SETTLE_S = 5.0
"""How long librdkafka's threads (and the sockets a broker closes on its side) get to be
gone once the handles are destroyed."""

TWO_PC = {"transaction.two.phase.commit.enable": True}


# ------------------------------------------------------------------ measuring
class Usage(NamedTuple):
    """What this process holds: OS threads, file descriptors, TCP connections to the
    broker."""

    threads: int
    fds: int
    connections: int

    def within(self, baseline: Usage) -> bool:
        return all(now <= then for now, then in zip(self, baseline, strict=True))


def _socket_inodes() -> set[int]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the directory's own descriptor, closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def _connections(ports: frozenset[int]) -> int:
    """This process's ESTABLISHED TCP connections to one of ``ports``."""
    own = _socket_inodes()
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)  # the header
            for line in lines:
                fields = line.split()
                remote, state, inode = fields[2], fields[3], int(fields[9])
                if state == "01" and inode in own and int(remote.rsplit(":", 1)[1], 16) in ports:
                    count += 1
    return count


def _usage(ports: frozenset[int]) -> Usage:
    return Usage(
        threads=len(os.listdir("/proc/self/task")),
        fds=len(os.listdir("/proc/self/fd")),
        connections=_connections(ports),
    )


def _ports(bootstrap_servers: str) -> frozenset[int]:
    return frozenset(int(server.rsplit(":", 1)[1]) for server in bootstrap_servers.split(","))


def _assert_back_to(baseline: Usage, ports: frozenset[int]) -> None:
    """The usage returns to ``baseline`` (or below) within ``SETTLE_S``."""
    deadline = time.monotonic() + SETTLE_S
    now = _usage(ports)
    while not now.within(baseline) and time.monotonic() < deadline:
        time.sleep(0.05)
        now = _usage(ports)
    assert now.within(baseline), f"still held after close(): {now}, before: {baseline}"


@contextmanager
def _no_gc() -> Iterator[None]:
    """The garbage collector off: what is freed is freed by reference counting."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@pytest.fixture
def handles(monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[Producer]]:
    """Weak references to every confluent-kafka Producer a TransactionalProducer builds
    from now on, in order."""
    made: list[weakref.ref[Producer]] = []

    class Tracked(Producer):
        def __init__(self, conf: dict[str, Any]) -> None:
            super().__init__(conf)
            made.append(weakref.ref(self))

    monkeypatch.setattr(kafka_txn.producer.handle, "Producer", Tracked)
    return made


def _assert_closed_and_safe(producer: TransactionalProducer, topic: str) -> None:
    """Calls on a closed producer refuse as after close() (or with the fatal error that
    ended it) or answer sensibly; a second close() does nothing."""
    assert producer.state == "closed"
    assert len(producer) == 0
    assert "closed" in repr(producer)
    refused: tuple[type[Exception], ...] = (IllegalStateError, FatalError)
    for call in (producer.poll, producer.flush, lambda: producer.produce(topic, b"late")):
        with pytest.raises(refused) as info:
            call()
        assert isinstance(info.value, FatalError) or "called after close()" in str(info.value)
    producer.close()


def _check_release(
    handles: list[weakref.ref[Producer]],
    ports: frozenset[int],
    topic: str,
    open_in_state: Callable[[], tuple[TransactionalProducer, Callable[[], None]]],
) -> None:
    """``EACH`` times: a producer in some state (``open_in_state`` returns it and how to
    close it), closed; its Producer, and every other one built meanwhile, is gone right
    after the close. Then the usage is back to what it was before."""
    baseline = _usage(ports)
    with _no_gc():
        for _ in range(EACH):
            first = len(handles)
            producer, close = open_in_state()
            assert len(handles) > first and all(ref() is not None for ref in handles[first:])
            assert _usage(ports).threads > baseline.threads  # librdkafka's threads run
            close()
            assert [ref() for ref in handles[first:]] == [None] * (len(handles) - first), (
                f"a Producer outlived close() in state {producer!r}"
            )
            _assert_closed_and_safe(producer, topic)
            del producer, close
        _assert_back_to(baseline, ports)


def _txn_config(broker: Broker, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": broker.bootstrap_servers,
        "transactional.id": f"release-{uuid.uuid4().hex[:12]}",
        **extra,
    }


# ------------------------------------------------------------------ on the broker
def _new(broker: Broker, topic: str) -> tuple[TransactionalProducer, Callable[[], None]]:
    p = TransactionalProducer(_txn_config(broker))
    return p, p.close


def _recovering(broker: Broker, topic: str) -> tuple[TransactionalProducer, Callable[[], None]]:
    p = TransactionalProducer(_txn_config(broker, **TWO_PC))
    p.init_transactions(keep_prepared_txn=True)
    return p, p.close


def _ready(broker: Broker, topic: str) -> tuple[TransactionalProducer, Callable[[], None]]:
    p = TransactionalProducer(_txn_config(broker))
    p.init_transactions()
    return p, p.close


def _in_transaction(broker: Broker, topic: str) -> tuple[TransactionalProducer, Callable[[], None]]:
    p = TransactionalProducer(_txn_config(broker))
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic, b"aborted by close()")
    p.flush()
    return p, p.close


def _left_open(broker: Broker, topic: str) -> tuple[TransactionalProducer, Callable[[], None]]:
    p, _ = _in_transaction(broker, topic)
    return p, lambda: p._close(abort_open=False)  # DualWriter's close() when unmarked


def _abortable(broker: Broker, topic: str) -> tuple[TransactionalProducer, Callable[[], None]]:
    p = TransactionalProducer(_txn_config(broker))
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic, b"fits")
    with pytest.raises(ProduceFailedException):
        p.produce(topic, b"x" * 2_000_000)  # over message.max.bytes: refused at once
    with pytest.raises(CommitFailedException):
        p.commit_transaction()
    assert p.state == "abortable error"
    return p, p.close


def _fencing(broker: Broker, topic: str) -> tuple[TransactionalProducer, TransactionalProducer]:
    """A producer with a delivered record in its open transaction, and a newer one with
    the same transactional id whose init fenced it (the old one does not know yet)."""
    config = _txn_config(broker)
    old = TransactionalProducer(config)
    old.init_transactions()
    old.begin_transaction()
    old.produce(topic, b"fenced")
    old.flush()
    new = TransactionalProducer(config)
    new.init_transactions()  # fences the old one
    return old, new


def _fenced(broker: Broker, topic: str) -> tuple[TransactionalProducer, Callable[[], None]]:
    old, new = _fencing(broker, topic)
    with pytest.raises(ProducerFencedError):
        old.produce(topic, b"fenced-2")
        old.commit_transaction()
    assert old.state == "fatal error"

    def close() -> None:
        old.close()
        new.close()

    return old, close


def _prepared(broker: Broker, topic: str) -> tuple[TransactionalProducer, Callable[[], None]]:
    p = TransactionalProducer(_txn_config(broker, **TWO_PC))
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic, b"prepared, left for its decider")
    p.prepare_transaction()
    return p, p.close


BROKER_STATES: dict[str, Callable[[Broker, str], tuple[TransactionalProducer, Callable[[], None]]]]
BROKER_STATES = {
    "new": _new,
    "recovering": _recovering,
    "ready": _ready,
    "in transaction, aborted by close": _in_transaction,
    "in transaction, left open": _left_open,
    "abortable error": _abortable,
    "fenced": _fenced,
    "prepared": _prepared,
}


@pytest.mark.parametrize("state", list(BROKER_STATES))
@pytest.mark.guarantee("1.15")
def test_close_destroys_the_handle_and_frees_its_resources(
    broker: Broker, handles: list[weakref.ref[Producer]], state: str
) -> None:
    """In each state reached on the broker (never initialised; recovering; ready; in a
    transaction that close() aborts, or leaves open as DualWriter's close() may; after a
    failed record made it abortable; fenced by a newer producer with the same
    transactional.id, a fatal error; with a prepared transaction, which close() leaves
    for its decider), close() destroys confluent-kafka's Producer before it returns,
    with the garbage collector off, and several such producers leave no thread, file
    descriptor or broker connection behind."""
    topic = broker.create_topic(partitions=1)
    _check_release(
        handles,
        _ports(broker.bootstrap_servers),
        topic,
        lambda: BROKER_STATES[state](broker, topic),
    )


@pytest.mark.guarantee("1.15")
def test_close_while_the_fatal_error_is_handled_destroys_the_handle(
    broker: Broker, handles: list[weakref.ref[Producer]]
) -> None:
    """close() called in the ``except`` block of the fatal error a fenced producer raised
    (the error still being handled, its traceback through the frames that called
    librdkafka intact, and also kept by the producer as its fatal error): the Producer
    is gone when close() returns, and the error keeps its traceback."""
    topic = broker.create_topic(partitions=1)
    with _no_gc():
        old, new = _fencing(broker, topic)
        try:
            old.produce(topic, b"fenced-2")
            old.commit_transaction()
        except ProducerFencedError as exc:
            old.close()
            assert handles[0]() is None
            assert exc.__traceback__ is not None
            assert old._life.fatal is exc
        else:
            pytest.fail("the fenced producer committed")
        new.close()
        assert handles[1]() is None


@pytest.mark.broker
@pytest.mark.guarantee("1.15")
def test_close_after_an_init_that_timed_out_destroys_the_handle(
    handles: list[weakref.ref[Producer]],
) -> None:
    """init_transactions() against a loopback port nobody listens on runs out of its 1 s
    (BrokerUnreachableError: the port is refused), its init still under way inside
    librdkafka; close() leaves that to the handle's destruction,
    and the destruction happens before close() returns: no thread or descriptor stays."""
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    def timed_out() -> tuple[TransactionalProducer, Callable[[], None]]:
        p = TransactionalProducer(
            {"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": uuid.uuid4().hex},
            operation_timeout=1.0,
        )
        with pytest.raises(BrokerUnreachableError):
            p.init_transactions()
        return p, p.close

    _check_release(handles, frozenset({port}), "t", timed_out)


# ------------------------------------------------------------------ on the mock cluster
MOCK_TOPIC = "t"


@pytest.fixture
def mock() -> Iterator[MockCluster]:
    with MockCluster(brokers=1) as cluster:
        cluster.create_topic(MOCK_TOPIC, partitions=1)
        yield cluster


def _unknown_commit(
    mock: MockCluster, *, prepared: bool
) -> tuple[TransactionalProducer, Callable[[], None]]:
    """A producer whose commit's EndTxn keeps failing with a retriable error until the
    deadline: COMMITTING with the outcome unknown, or, prepared, IN_DOUBT."""
    conf: dict[str, Any] = {
        "bootstrap.servers": mock.bootstrap_servers,
        "transactional.id": f"release-{uuid.uuid4().hex[:12]}",
        "retry.backoff.ms": 10,
    }
    p = TransactionalProducer(conf | TWO_PC if prepared else conf, operation_timeout=1.0)
    p.init_transactions()
    if prepared:
        stand_in_describe(p)
    p.begin_transaction()
    p.produce(MOCK_TOPIC, b"kept")
    p.flush()  # the partition joins the transaction: EndTxn has something to end
    if prepared:
        p.prepare_transaction()
    mock.push_request_errors(ApiKey.END_TXN, *[KafkaError.COORDINATOR_LOAD_IN_PROGRESS] * 1000)
    if prepared:
        with pytest.raises(TransactionInDoubtError):
            p.commit_transaction()
        assert p.state == "in doubt"
    else:
        with pytest.raises(TransactionOutcomeUnknownError):
            p.commit_transaction()
        assert p.state == "committing"
    mock.push_request_errors(ApiKey.END_TXN)  # nothing more for the next producer
    return p, p.close


@pytest.mark.mock
@pytest.mark.parametrize("prepared", [False, True], ids=["committing", "in doubt"])
@pytest.mark.guarantee("1.15")
def test_close_with_a_commit_of_unknown_outcome_destroys_the_handle(
    mock: MockCluster, handles: list[weakref.ref[Producer]], prepared: bool
) -> None:
    """A commit whose outcome is unknown (committing), or a prepared transaction's commit
    that did not complete (in doubt), is never aborted by close(), which leaves it to
    the handle's destruction; that destruction happens before close() returns, although
    the error the commit raised (a traceback through the commit's frames) was stored or
    caught: no thread, descriptor or connection to the cluster stays."""
    _check_release(
        handles,
        _ports(mock.bootstrap_servers),
        MOCK_TOPIC,
        lambda: _unknown_commit(mock, prepared=prepared),
    )


# ------------------------------------------------------------------ DualWriter
@pytest.mark.guarantee("1.15")
def test_dual_writers_closed_after_their_database_session_ended_free_their_producers(
    broker: Broker, postgres_jdbc: str, handles: list[weakref.ref[Producer]]
) -> None:
    """A DualWriter whose database session ends between its Kafka prepare and its
    database COMMIT stops with DatabaseCommitUnknownError (kept: every later call raises
    it) and its producer left prepared; closed and started again with the same
    transactional.id, several times, as a service restarting its writer would. Each
    close() destroys the writer's Producer before it returns, with the garbage
    collector off, and no thread, descriptor or connection (to the broker or the
    database) is left behind."""
    topic = broker.create_topic(partitions=1)
    txn_id = f"release-{uuid.uuid4().hex[:12]}"
    state_table, rows_name = f"rel_state_{txn_id[-12:]}", f"rel_rows_{txn_id[-12:]}"
    rows = Table(rows_name, MetaData(), Column("id", Integer, primary_key=True))
    killer = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    rows.create(killer)  # and the killer's pooled connection is open from here on
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    backend: list[int] = []

    def on_step(step: str) -> None:
        if step == "after_state_write":
            with killer.begin() as conn:
                conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": backend[-1]})

    try:
        baseline = _usage(_ports(broker.bootstrap_servers))
        with _no_gc():
            for n in range(EACH):
                first = len(handles)
                writer = DualWriter(conf, postgres_jdbc, state_table=state_table, on_step=on_step)
                writer.start()  # settles what the previous writer left prepared
                with pytest.raises(DatabaseCommitUnknownError), writer.transaction() as tx:
                    backend.append(
                        tx.connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
                    )
                    tx.connection.execute(rows.insert().values(id=n))
                    tx.produce(topic, b"lost")
                assert writer.producer.state == "prepared"
                writer.close()
                assert [ref() for ref in handles[first:]] == [None] * (len(handles) - first)
                assert writer.producer.state == "closed" and len(writer.producer) == 0
                with pytest.raises(DatabaseCommitUnknownError):
                    writer.start()
                del writer, tx
            _assert_back_to(baseline, _ports(broker.bootstrap_servers))
        with DualWriter(conf, postgres_jdbc, state_table=state_table):
            pass  # its start() settles what the last writer left prepared
    finally:
        with killer.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {rows_name}"))
            conn.execute(text(f"DROP TABLE IF EXISTS {state_table}"))
        killer.dispose()
