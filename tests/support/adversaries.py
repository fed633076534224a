"""Helpers shared by the adversarial test files (test_producer_adversaries,
test_redteam_producer_2, test_redteam_3_producer, test_redteam_dualwrite_2,
test_redteam_3_dualwrite): the stand-ins for a signal, the proxied and two-phase
producer configurations, the prepared-then-crashed producer, and the dual-write tables,
hooks and checks those files build their schedules from.

A test module takes a fixture from here by naming it at module level (``proxy =
support.proxy``), as pytest collects the fixtures a module holds."""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tenacity
from sqlalchemy import Table, event, text
from sqlalchemy.engine import Engine

from kafka_txn import PreparedTxnState, TransactionalProducer
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord
from kafka_txn.twophase.recovery import TransactionOutcome
from tests.proxies.kafka_proxy import KafkaProxy
from tests.support.databases import sorted_values, unique_name
from tests.support.rig import Broker

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
