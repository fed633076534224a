"""Helpers the adversarial schedules (``pytest -m adversary``) of several feature folders
share: the stand-ins for a signal, the proxied and two-phase producer configurations, the
prepared-then-crashed producer, a stand-in for the DescribeTransactions the mock cluster
lacks, a successor initialising while an answer is held, and the dual-write tables,
writers, hooks, child processes and checks the dual-write schedules are built from.

A test module takes a fixture from here by naming it at module level (``proxy =
support.proxy``), as pytest collects the fixtures a module holds."""

from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tenacity
from sqlalchemy import Table, create_engine, event, text
from sqlalchemy.engine import Engine

from kafka_txn import PreparedTxnState, TransactionalProducer
from kafka_txn.coordinator.client import TransactionDescription
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord
from kafka_txn.twophase.recovery import TransactionOutcome
from tests.proxies.kafka_proxy import KafkaProxy, Request
from tests.support.databases import (
    drop_tables,
    id_value_table,
    sorted_values,
    sqlite_jdbc,
    unique_name,
)
from tests.support.rig import Broker

ROOT = Path(__file__).resolve().parent.parent.parent

# --------------------------------------------------------------------------- signals


class Interrupted(BaseException):
    """Stands for a signal handler's exception (KeyboardInterrupt, SystemExit), or for
    anything that stops a writer right after its database commit (4.13: left
    prepared)."""


def raise_after_c_call(name: str, exc: type[BaseException]) -> Callable[..., Any]:
    """A profile function that raises ``exc`` when the C function ``name`` returns: the
    schedule of a signal that arrived while the C call ran, whose handler's exception
    CPython raises at the evaluation check right after the call returns."""

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_return" and getattr(arg, "__name__", "") == name:
            sys.setprofile(None)
            raise exc(f"signal during {name}()")

    return profile


@contextlib.contextmanager
def profiled(profile: Callable[..., Any]) -> Iterator[None]:
    """Run the block with ``profile`` as the profile function; removed afterwards."""
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


def interrupt_after(
    name: str, call: Callable[[], Any], exc: type[BaseException] = Interrupted
) -> None:
    """Run ``call`` with a signal's exception (``exc``) raised right after the C call
    ``name`` returned; the exception must come out of ``call``."""
    with profiled(raise_after_c_call(name, exc)), pytest.raises(exc):
        call()


def interrupt_at_line(function: Any, snippet: str, armed: list[bool]) -> Callable[..., Any]:
    """A trace function that raises KeyboardInterrupt, as a signal handler would, at the
    line of ``function`` holding ``snippet``, once ``armed`` holds something (it is
    cleared as the interruption strikes)."""
    source, first = inspect.getsourcelines(function)
    line = first + next(i for i, source_line in enumerate(source) if snippet in source_line)
    code = function.__code__

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is not code:
            return None

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line" and frame.f_lineno == line and armed:
                armed.clear()
                raise KeyboardInterrupt  # as a signal handler would, at this point
            return local

        return local

    return tracer


# --------------------------------------------------------------------------- producers


def txn_config(bootstrap: str, txn_id: str, *, two_phase: bool = False) -> dict[str, Any]:
    """A transactional producer's configuration for ``bootstrap`` (a broker or a proxy)."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "transactional.id": txn_id}
    if two_phase:
        config["transaction.two.phase.commit.enable"] = True
    return config


@pytest.fixture
def two_phase_config(producer_config: dict[str, Any]) -> dict[str, Any]:
    return {**producer_config, "transaction.two.phase.commit.enable": True}


@pytest.fixture
def proxy(broker: Broker) -> Iterator[KafkaProxy]:
    with KafkaProxy(broker.bootstrap_servers) as p:
        yield p


def prepared_then_crashed(
    config: dict[str, Any], topic: str, value: bytes, *, partition: int = -1
) -> PreparedTxnState:
    """A producer that prepares a transaction of one record and closes, leaving the
    prepared transaction open as a crash would; its state, as the database stored it."""
    crashed = TransactionalProducer(config, operation_timeout=20)
    crashed.init_transactions()
    crashed.begin_transaction()
    crashed.produce(topic, value, partition=partition)
    stored = crashed.prepare_transaction()
    crashed.close(timeout=5)
    return stored


def recover(config: dict[str, Any], stored: PreparedTxnState) -> TransactionOutcome:
    """A fresh process's recovery of ``stored``: a new producer initialised keeping the
    prepared transaction completes it; its outcome."""
    fresh = TransactionalProducer(config, operation_timeout=20)
    try:
        fresh.init_transactions(keep_prepared_txn=True)
        return fresh.complete_transaction(stored)
    finally:
        fresh.close(timeout=5)


def settle_id(broker: Broker, txn_id: str) -> None:
    """A new instance of ``txn_id`` initialises on the broker: whatever is still open
    under the id is aborted."""
    cleaner = TransactionalProducer(txn_config(broker.bootstrap_servers, txn_id))
    cleaner.init_transactions()
    cleaner.close()


class RecordingProducer:
    """Delegates to confluent-kafka's Producer and records the timeouts librdkafka's
    commit_transaction() is given."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.commit_timeouts: list[float] = []

    def commit_transaction(self, timeout: float) -> None:
        self.commit_timeouts.append(timeout)
        self._inner.commit_transaction(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def record_commit_timeouts(producer: TransactionalProducer) -> RecordingProducer:
    """Puts a RecordingProducer between ``producer`` and confluent-kafka's Producer."""
    stand_in = RecordingProducer(producer._io.producer)
    producer._io.producer = stand_in
    return stand_in


def stand_in_describe(producer: TransactionalProducer) -> None:
    """librdkafka's mock cluster has no DescribeTransactions (API 65), which prepare
    needs; this answers it as Apache Kafka would for the producer's own open transaction,
    so that prepare succeeds and librdkafka's real EndTxn error handling can be driven."""
    twophase = producer._twophase
    assert twophase is not None

    def describe() -> TransactionDescription:
        pid, epoch = twophase.identity.identity or (-1, -1)
        return TransactionDescription(
            producer.transactional_id, "Ongoing", pid, epoch, 60_000, int(time.time() * 1000)
        )

    twophase.client.describe = describe  # type: ignore[method-assign]


def successor_initialises_before_the_answer(
    broker: Broker, txn_id: str, started: list[TransactionalProducer], errors: list[BaseException]
) -> Any:
    """A Fail rule's edit (tests/proxies/kafka_proxy.py): runs once the broker has
    answered the forwarded request (the coordinator applied it) and before the proxy hands
    the made-up error to the client. A successor with the same transactional id, talking
    to the broker directly, initialises meanwhile (fencing the first producer), and is
    appended to ``started``; the first gets its answer only once that init returned."""

    def edit(_request: Request, _response: Any) -> None:
        successor = TransactionalProducer(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id},
            operation_timeout=20,
        )
        started.append(successor)
        try:
            successor.init_transactions()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    return edit


def three_inputs(broker: Broker, txn_id: str) -> tuple[str, str]:
    """A source topic holding in-0, in-1, in-2 (committed) and an empty sink topic."""
    source = broker.create_topic(partitions=1)
    sink = broker.create_topic(partitions=1)
    feeder = TransactionalProducer(txn_config(broker.bootstrap_servers, f"{txn_id}-in"))
    try:
        feeder.init_transactions()
        with feeder.transaction():
            for i in range(3):
                feeder.produce(source, f"in-{i}".encode(), partition=0)
    finally:
        feeder.close(timeout=5)
    return source, sink


def prefixing_processor(
    broker: Broker, bootstrap: str, txn_id: str, source: str, sink: str
) -> ExactlyOnceProcessor:
    """A processor writing ``out-<value>`` to ``sink`` for each record of ``source``,
    its producer connected through ``bootstrap``."""
    return ExactlyOnceProcessor(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": f"g-{txn_id}"},
        txn_config(bootstrap, txn_id),
        [source],
        lambda record: [OutputRecord(sink, b"out-" + record.value())],
        backoff=tenacity.wait_fixed(0.1),
    )


# --------------------------------------------------------------------------- dual writes


def names_fixture(prefix: str) -> Any:
    """A ``names`` fixture: an events table and a state table no other run uses."""

    @pytest.fixture
    def names() -> Iterator[dict[str, str]]:
        yield {"events": unique_name(f"{prefix}_events"), "state": unique_name(f"{prefix}_state")}

    return names


def jdbc_of(database: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The JDBC URL of ``database`` (postgresql, mariadb or sqlite) for this test: the
    servers' fixtures, or an SQLite file in ``tmp_path``."""
    if database == "sqlite":
        return sqlite_jdbc(tmp_path)
    fixture = "mariadb_jdbc" if database == "mariadb" else "postgres_jdbc"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def make_writer(broker: Broker) -> Iterator[Callable[..., DualWriter]]:
    """DualWriters on a state table of the test's choosing (lock timeout 5 s); closed,
    their state table and ``tables`` dropped at the end."""
    made: list[tuple[DualWriter, list[str]]] = []

    def make(txn_id: str, jdbc: str, *, state_table: str, tables: list[str]) -> DualWriter:
        writer = DualWriter(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id},
            jdbc,
            state_table=state_table,
            lock_timeout=5.0,
        )
        made.append((writer, [state_table, *tables]))
        return writer

    yield make
    for writer, tables in made:
        writer.close()
        drop_tables(writer.engine, *tables)


@pytest.fixture
def cleanup() -> Iterator[list[tuple[str, list[str]]]]:
    """(jdbc, tables) to drop at the end of the test."""
    todo: list[tuple[str, list[str]]] = []
    yield todo
    for jdbc, tables in todo:
        engine = create_engine(jdbc_to_sqlalchemy(jdbc))
        try:
            drop_tables(engine, *tables)
        finally:
            engine.dispose()


def values_in(jdbc: str, table: str) -> list[str]:
    """The values of the (id, value) table ``table``, sorted, read with SQL."""
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        return sorted_values(engine, id_value_table(table))
    finally:
        engine.dispose()


def committed_values(broker: Broker, topic: str, expected: int, **read: Any) -> list[str]:
    """The values a read_committed consumer reads from ``topic``, sorted (``read``: the
    rest of Broker.read_committed's arguments)."""
    return sorted((v or b"").decode() for _, v in broker.read_committed(topic, expected, **read))


def run_child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh Python process (``python -c``) that imports this
    checkout's kafka_txn and tests; its output and exit code (-9: SIGKILLed)."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def mariadb_non_strict(engine: Engine) -> None:
    """Every connection of ``engine`` runs outside strict mode (sql_mode='')."""

    @event.listens_for(engine, "connect")
    def non_strict(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET SESSION sql_mode = ''")


def hand_made_state_table(engine: Engine, state: str, state_column: str) -> None:
    """A state table made by hand (not by the writer), its state column ``state_column``
    (name, type and constraints)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                f"CREATE TABLE {state} (transactional_id VARCHAR(255) PRIMARY KEY, "
                f"{state_column}, updated_at DATETIME, "
                "owner VARCHAR(255))"
            )
        )


def stop_after_db_commit(armed: list[bool] | None = None) -> Callable[[str], None]:
    """An on_step hook raising Interrupted right after the database commit (4.13: the
    transaction is left prepared), always or, with ``armed``, once it holds something."""

    def hook(step: str) -> None:
        if step == "after_db_commit" and (armed is None or armed):
            raise Interrupted

    return hook


def diverge(conf: dict[str, Any], jdbc: str, state: str, topic: str, events: Table) -> None:
    """A dual write committed in the database whose Kafka transaction was aborted (another
    producer initialised the id): start() then reports it diverged or unknowable."""
    first = DualWriter(conf, jdbc, state_table=state, on_step=stop_after_db_commit())
    events.metadata.create_all(first.engine)
    first.start()
    with pytest.raises(Interrupted), first.transaction() as tx:
        tx.connection.execute(events.insert(), {"id": 1, "value": "row-1"})
        tx.produce(topic, b"row-1")
    first.close()  # prepared; the database committed
    other = TransactionalProducer(conf)  # Kafka aborts it: recovery cannot settle it
    other.init_transactions()
    other.close()


def both_sides(
    broker: Broker, engine: Engine, events: Table, topic: str, **read: Any
) -> tuple[list[str], list[str]]:
    """The values in the events table and those a read_committed consumer reads from
    ``topic`` (sorted; ``expected`` defaults to the table's row count)."""
    in_db = sorted_values(engine, events)
    read.setdefault("expected", len(in_db))
    in_kafka = sorted(v.decode() for _, v in broker.read_committed(topic, **read))
    return in_db, in_kafka
