"""``AsyncDualWriter`` keeps ``DualWriter``'s guarantees (9.4), on PostgreSQL (psycopg's
async mode), MariaDB (aiomysql) and SQLite (aiosqlite) with the real broker: commits land
once, a failed body rolls both sides back, tasks sharing a writer take turns, a sync and
an async writer on one transactional id fence each other and recover each other's
transactions (the same state row), completion marks are stored, every URL form is
accepted, a bad one or an unreachable database is named with its fix, and a writer
SIGKILLed at every step is recovered by a fresh ``AsyncDualWriter``. The outcome is read
with direct SQL and an independent read_committed consumer (kafka-python,
``broker.read_committed``)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
import uuid
from collections.abc import Awaitable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import Table, create_engine, insert, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import create_async_engine

from kafka_txn import (
    ConfigurationError,
    DatabaseUnavailableError,
    IllegalStateError,
    PreparedTxnState,
    ProducerFencedError,
    TransactionOutcome,
)
from kafka_txn.aio import AsyncDualWriter
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import STEPS, DualWriter
from tests.apps.dualwrite_app import events_table
from tests.support.apache_kafka import free_port
from tests.support.databases import drop_tables, id_value_table, sqlite_jdbc, unique_name
from tests.support.dual_writes import Scenario
from tests.support.rig import Broker

pytestmark = pytest.mark.broker

T = TypeVar("T")


async def within(seconds: float, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``, cancelled after ``seconds`` (then TimeoutError):
    ``asyncio.timeout()`` on Python 3.11+, ``asyncio.wait_for()`` before it."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)  # pragma: no cover - Python 3.10


def run(coro: Awaitable[T], timeout: float = 90.0) -> T:
    """``asyncio.run(coro)``, failing instead of hanging past ``timeout`` seconds."""
    return asyncio.run(within(timeout, coro))


class Sides:
    """One test's table of (id, value) rows and its topic, and how to read both back:
    the rows with direct SQL, the records with kafka-python's read_committed."""

    def __init__(self, broker: Broker, jdbc_url: str) -> None:
        self.broker = broker
        self.jdbc_url = jdbc_url
        self.topic = broker.create_topic(partitions=2)
        self.table: Table = id_value_table(unique_name("aev"))
        self.engine: Engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
        self.table.create(self.engine)

    def rows(self) -> list[str]:
        with self.engine.connect() as conn:
            return sorted(conn.execute(select(self.table.c.value)).scalars())

    def assert_same(self, expected: list[str]) -> None:
        """The rows are ``expected``, and a read_committed consumer sees the same
        values, each once."""
        rows = self.rows()
        assert rows == sorted(expected), rows
        records = self.broker.read_committed(self.topic, expected=len(rows))
        assert sorted((v or b"").decode() for _, v in records) == rows

    async def write(self, writer: AsyncDualWriter, key: int, value: str) -> None:
        """One dual write: a row and its record."""
        async with writer.transaction() as tx:
            await tx.connection.execute(insert(self.table).values(id=key, value=value))
            await tx.produce(self.topic, value.encode())

    def close(self) -> None:
        drop_tables(self.engine, self.table.name)
        self.engine.dispose()


@pytest.fixture
def sides(broker: Broker, jdbc_url: str) -> Iterator[Sides]:
    made = Sides(broker, jdbc_url)
    try:
        yield made
    finally:
        made.close()


def _conf(broker: Broker, txn_id: str) -> dict[str, Any]:
    return {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}


def _state_row(jdbc_url: str, txn_id: str, table: str = "kafka_transaction_state") -> Any:
    """The writer's state row (prepared_txn_state, owner), read with SQL."""
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    try:
        with engine.connect() as conn:
            return conn.execute(
                text(f"SELECT prepared_txn_state, owner FROM {table} WHERE transactional_id = :t"),
                {"t": txn_id},
            ).one()
    finally:
        engine.dispose()


def _completed(stored: str) -> bool:
    return PreparedTxnState.parse(stored).completed


# --------------------------------------------------------------------------- parity
@pytest.mark.guarantee("9.4")
def test_commits_land_once_and_a_failed_body_rolls_both_back(
    broker: Broker, sides: Sides, txn_id: str
) -> None:
    """Through a JDBC URL: transactions commit (send() and its future resolving to the
    delivered record, produce(), send_and_wait()); a body that raises, a body whose
    statement fails (a duplicate key: IntegrityError, the body's own error, raised as
    is) and a body that ends the database transaction itself (ConfigurationError, 4.2)
    leave nothing on either side; the writer goes on and commits again. The rows equal
    the records, each once."""

    async def scenario() -> None:
        topic = sides.topic
        # send()/send_and_wait() need every delivery report: the documented opt-out of
        # the writer's error-only default.
        conf = {**_conf(broker, txn_id), "delivery.report.only.error": False}
        async with AsyncDualWriter(conf, sides.jdbc_url) as writer:
            async with writer.transaction() as tx:
                await tx.connection.execute(insert(sides.table).values(id=1, value="a"))
                delivered = await tx.send(topic, b"a")
            assert (await delivered).offset() >= 0
            async with writer.transaction() as tx:
                await tx.connection.execute(insert(sides.table).values(id=2, value="b"))
                await tx.produce(topic, b"b")
                msg = await tx.send_and_wait(topic, b"c")
                assert msg.value() == b"c"
                await tx.connection.execute(insert(sides.table).values(id=3, value="c"))

            with pytest.raises(ValueError, match="the body fails"):
                async with writer.transaction() as tx:
                    await tx.connection.execute(insert(sides.table).values(id=4, value="x1"))
                    await tx.send(topic, b"x1")
                    raise ValueError("the body fails")
            with pytest.raises(IntegrityError):
                async with writer.transaction() as tx:
                    await tx.produce(topic, b"x2")
                    await tx.connection.execute(insert(sides.table).values(id=5, value="x2"))
                    await tx.connection.execute(insert(sides.table).values(id=1, value="x2"))
            with pytest.raises(ConfigurationError, match="ended the database transaction"):
                async with writer.transaction() as tx:
                    await tx.connection.execute(insert(sides.table).values(id=6, value="x3"))
                    await tx.produce(topic, b"x3")
                    await tx.connection.rollback()
                    await tx.connection.execute(insert(sides.table).values(id=7, value="x3"))
                    await tx.produce(topic, b"x3")
            await sides.write(writer, 8, "d")
            assert writer.producer.state == "ready"

    run(scenario())
    sides.assert_same(["a", "b", "c", "d"])


@pytest.mark.guarantee("9.4")
def test_tasks_sharing_a_writer_take_turns_and_nesting_is_refused(
    broker: Broker, sides: Sides, txn_id: str
) -> None:
    """Through a sync SQLAlchemy URL (its driver replaced by the async one): eight tasks
    each run a transaction on one writer, their bodies yielding to the loop; never two
    bodies at once, all commit. ``transaction()`` and ``start()`` called in a body raise
    IllegalStateError at once instead of waiting for themselves, and that body still
    commits."""
    url = jdbc_to_sqlalchemy(sides.jdbc_url).render_as_string(hide_password=False)
    inside: list[int] = []
    most = 0

    async def one(writer: AsyncDualWriter, n: int) -> None:
        nonlocal most
        async with writer.transaction() as tx:
            inside.append(n)
            most = max(most, len(inside))
            # id 0 would be AUTO_INCREMENT's on MariaDB: ids start at 1.
            await tx.connection.execute(insert(sides.table).values(id=n + 1, value=f"t{n}"))
            await asyncio.sleep(0.01)
            await tx.produce(sides.topic, f"t{n}".encode())
            inside.remove(n)

    async def scenario() -> None:
        async with AsyncDualWriter(_conf(broker, txn_id), url) as writer:
            assert writer.engine.dialect.is_async
            await asyncio.gather(*(one(writer, n) for n in range(8)))
            async with writer.transaction() as tx:
                with pytest.raises(IllegalStateError, match="inside a transaction"):
                    async with writer.transaction():
                        pass
                with pytest.raises(IllegalStateError, match="inside a transaction"):
                    await writer.start()
                await tx.connection.execute(insert(sides.table).values(id=100, value="outer"))
                await tx.produce(sides.topic, b"outer")

    run(scenario())
    assert most == 1
    sides.assert_same([*(f"t{n}" for n in range(8)), "outer"])


@pytest.mark.adversary
@pytest.mark.guarantee("9.4", "4.4")
def test_sync_and_async_writers_fence_each_other_through_one_state_row(
    broker: Broker, sides: Sides, txn_id: str
) -> None:
    """A DualWriter and an AsyncDualWriter (given an AsyncEngine) with one transactional
    id and state table: each newer start() takes the id over, and the older writer's
    next transaction raises ProducerFencedError before it writes anything; the state
    row names the last owner. Sync calls run on a thread, so that the loop goes on."""
    state_table = unique_name("ast")
    conf = _conf(broker, txn_id)

    def sync_write(writer: DualWriter, key: int, value: str) -> None:
        with writer.transaction() as tx:
            tx.connection.execute(insert(sides.table).values(id=key, value=value))
            tx.produce(sides.topic, value.encode())

    async def scenario() -> str:
        first = DualWriter(conf, sides.jdbc_url, state_table=state_table)
        try:
            await asyncio.to_thread(first.start)
            await asyncio.to_thread(sync_write, first, 1, "sync-1")
            engine = create_async_engine(jdbc_to_sqlalchemy(sides.jdbc_url).set(
                drivername={"postgresql": "postgresql+psycopg", "mysql": "mysql+aiomysql",
                            "sqlite": "sqlite+aiosqlite"}[sides.engine.dialect.name]
            ))  # fmt: skip
            second = AsyncDualWriter(conf, engine, state_table=state_table)
            try:
                await second.start()
                with pytest.raises(ProducerFencedError):
                    await asyncio.to_thread(sync_write, first, 2, "fenced-sync")
                await sides.write(second, 3, "async-1")
                third = DualWriter(conf, sides.jdbc_url, state_table=state_table)
                try:
                    await asyncio.to_thread(third.start)
                    with pytest.raises(ProducerFencedError):
                        await sides.write(second, 4, "fenced-async")
                    await asyncio.to_thread(sync_write, third, 5, "sync-2")
                    return third.owner
                finally:
                    await asyncio.to_thread(third.close)
            finally:
                await second.close()
        finally:
            await asyncio.to_thread(first.close)

    try:
        owner = run(scenario())
        assert _state_row(sides.jdbc_url, txn_id, state_table).owner == owner
        sides.assert_same(["sync-1", "async-1", "sync-2"])
    finally:
        drop_tables(sides.engine, state_table)


@pytest.mark.adversary
@pytest.mark.guarantee("9.4", "4.1")
def test_each_kind_recovers_what_the_other_left_after_its_database_commit(
    broker: Broker, jdbc_url: str
) -> None:
    """tests/apps/dualwrite_app.py SIGKILLed right after the database commit, once as a
    DualWriter, recovered by an AsyncDualWriter's start() (it commits the prepared
    transaction), then as an AsyncDualWriter (``--async``), recovered by a DualWriter's:
    both batches are in the database and in Kafka, each once."""
    s = Scenario(broker, jdbc_url)
    conf = _conf(broker, s.txn_id)

    async def recover_async() -> TransactionOutcome:
        async with AsyncDualWriter(conf, jdbc_url) as writer:
            return await writer.start()

    crashed = s.run("--batch", "0", "--crash-at", "after_db_commit")
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    assert run(recover_async()) == TransactionOutcome.COMMITTED
    crashed = s.run("--async", "--batch", "1", "--crash-at", "after_db_commit")
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    with DualWriter(conf, jdbc_url) as writer:
        assert writer.start() == TransactionOutcome.COMMITTED
    s.assert_equal_sides(8)


@pytest.mark.guarantee("9.4")
def test_completion_marks_are_stored_after_a_commit_and_at_close(
    broker: Broker, sides: Sides, txn_id: str
) -> None:
    """With ``mark_completed_after=2``, the state row holds the commit's plain state
    right after it, and its completed state within seconds, with no other call (a timer
    on the loop). With ``mark_completed_after=None``, the mark waits for ``close()``."""
    conf = _conf(broker, txn_id)

    async def stored() -> str:
        return str((await asyncio.to_thread(_state_row, sides.jdbc_url, txn_id)).prepared_txn_state)

    async def scenario() -> None:
        async with AsyncDualWriter(conf, sides.jdbc_url, mark_completed_after=2.0) as writer:
            await sides.write(writer, 1, "a")
            assert not _completed(await stored())  # 2 s to go: not yet
            for _ in range(100):
                if _completed(await stored()):
                    break
                await asyncio.sleep(0.2)
            assert _completed(await stored()), "not marked completed within 20 s"
        async with AsyncDualWriter(conf, sides.jdbc_url, mark_completed_after=None) as writer:
            await sides.write(writer, 2, "b")
            plain = await stored()
            assert not _completed(plain)
        assert await stored() == str(PreparedTxnState.parse(plain).mark_completed())

    run(scenario())


@pytest.mark.guarantee("9.4")
def test_calls_racing_or_after_close_are_refused_at_once(
    broker: Broker, tmp_path: Path, txn_id: str
) -> None:
    """A transaction() called while close() runs, and start(), transaction() and
    store_completed() after it, raise IllegalStateError at once, not
    TransactionAbortableError after lock_timeout (20 s here) with the event loop stopped
    on the writer's lock meanwhile. close() again returns."""
    jdbc = sqlite_jdbc(tmp_path)

    async def scenario() -> None:
        writer = AsyncDualWriter(_conf(broker, txn_id), jdbc, lock_timeout=20.0)
        await writer.start()

        async def write() -> None:
            async with writer.transaction() as tx:
                await tx.produce("unused", b"x")

        closing = asyncio.create_task(writer.close())
        await asyncio.sleep(0)  # close() has begun
        with pytest.raises(IllegalStateError, match="close"):
            await write()
        await closing
        for call in (writer.start(), write(), writer.store_completed()):
            with pytest.raises(IllegalStateError, match="after close"):
                await call
        await writer.close()

    run(scenario())


# --------------------------------------------------------------------------- configuration
def test_bad_urls_and_drivers_are_named_with_their_fix(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ConfigurationError, before any producer exists: a string that is no URL, a
    database kafka-txn does not support, a driver SQLAlchemy does not know, a missing
    async driver (aiosqlite made unimportable) naming the extra that installs it, a
    user given with SQLite. Outside a running loop: RuntimeError saying where to create
    the writer."""
    conf = _conf(broker, "t")

    async def refused(database: Any, match: str, **kwargs: Any) -> None:
        with pytest.raises(ConfigurationError, match=match):
            AsyncDualWriter(conf, database, **kwargs)

    async def scenario() -> None:
        await refused("::::", "neither a JDBC URL nor a SQLAlchemy URL")
        await refused("oracle://u@h/db", "dialect 'oracle' is not supported")
        await refused("postgresql+nosuchdriver://h/db", "no dialect/driver")
        await refused(f"jdbc:sqlite:{tmp_path}/x.db", "SQLite takes no user", user="app")
        with monkeypatch.context() as patched:
            patched.setitem(sys.modules, "aiosqlite", None)
            await refused(f"jdbc:sqlite:{tmp_path}/x.db", r"kafka-txn\[asyncio\]")

    run(scenario())
    with pytest.raises(RuntimeError, match="inside a running event loop"):
        AsyncDualWriter(conf, f"jdbc:sqlite:{tmp_path}/x.db")


@contextmanager
def _silent_port() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel's backlog) and never answers."""
    with closing(socket.socket()) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


@pytest.mark.guarantee("9.4", "4.16")
def test_a_database_that_cannot_be_opened_is_named_with_its_fix(
    broker: Broker, postgres_jdbc: str, mariadb_jdbc: str, tmp_path: Path
) -> None:
    """start() raises DatabaseUnavailableError naming the fix in AsyncDualWriter's
    terms, the driver's error as its cause, and close() then returns: PostgreSQL on a
    closed port and on a host name that does not resolve, MariaDB on a port that never
    answers the handshake (bounded by connectTimeout, as PyMySQL bounds the sync
    writer's), MariaDB with an unknown database, SQLite in a directory that does not
    exist."""
    closed = free_port()

    async def unavailable(jdbc: str, match: str) -> None:
        writer = AsyncDualWriter(_conf(broker, f"t-{uuid.uuid4().hex[:8]}"), jdbc)
        try:
            with pytest.raises(DatabaseUnavailableError, match=match) as caught:
                await writer.start()
            assert isinstance(caught.value.__cause__, OperationalError)
            message = str(caught.value)  # in the terms of the class the caller made
            assert message.startswith("AsyncDualWriter.start(): "), message
            assert " DualWriter" not in message and "(DualWriter" not in message, message
        finally:
            await within(30, writer.close())

    async def scenario(silent: int) -> None:
        await unavailable(
            f"jdbc:postgresql://127.0.0.1:{closed}/test?user=postgres",
            "nothing accepts connections.*is PostgreSQL running",
        )
        await unavailable(
            "jdbc:postgresql://no-such-host.invalid:5432/test?user=postgres",
            "the host 'no-such-host.invalid' does not resolve: check AsyncDualWriter's",
        )
        await unavailable(
            f"jdbc:mariadb://127.0.0.1:{silent}/test?user=root&connectTimeout=1000",
            "no answer from .* in time: check the host and port",
        )
        await unavailable(
            mariadb_jdbc.replace("/test?", "/no_such_database?"),
            "there is no database 'no_such_database'.*create it",
        )
        await unavailable(
            f"jdbc:sqlite:{tmp_path}/missing/dir/x.db",
            "cannot open the SQLite file.*check that its directory exists",
        )

    with _silent_port() as silent:
        run(scenario(silent))


# --------------------------------------------------------------------------- SIGKILL
SEED = int(os.environ.get("KAFKA_TXN_ASYNC_STEPS_SEED", "9404"))
_DATABASES = ("postgresql", "mariadb", "sqlite")


def _step_databases() -> list[tuple[str, str]]:
    """(step, database) pairs: every step on every database with
    KAFKA_TXN_ASYNC_EVERY_STEP set; otherwise each step once, the seed
    (KAFKA_TXN_ASYNC_STEPS_SEED) dealing the steps between the three databases, two
    each, so that every step and every database is covered in a third of the time (the
    sync writer's every-step test, tests/dualwrite/test_writer.py, runs them all)."""
    if os.environ.get("KAFKA_TXN_ASYNC_EVERY_STEP"):
        return [(step, db) for step in STEPS for db in _DATABASES]
    order = list(STEPS)
    random.Random(SEED).shuffle(order)
    return sorted(
        ((step, _DATABASES[i % 3]) for i, step in enumerate(order)), key=lambda p: STEPS.index(p[0])
    )


_STEP_DATABASES = _step_databases()


@pytest.mark.adversary
@pytest.mark.parametrize(
    ("step", "database"), _STEP_DATABASES, ids=[f"{s}-{d}" for s, d in _STEP_DATABASES]
)
@pytest.mark.guarantee("9.4", "4.1")
def test_async_writer_killed_at_every_step_is_recovered(
    broker: Broker, step: str, database: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """tests/apps/dualwrite_app.py ``--async`` commits batch 0, then is SIGKILLed at
    ``step`` of batch 1 (its batch 0 completion mark not yet stored: the next
    transaction holds it). A fresh AsyncDualWriter's start() recovers: batch 1 is
    committed on both sides if the database committed it, on neither otherwise; the
    application then writes batch 2. Rows equal records, each once."""
    print(f"KAFKA_TXN_ASYNC_STEPS_SEED={SEED}: {step} on {database}")
    if database == "sqlite":
        jdbc = sqlite_jdbc(tmp_path)
    else:
        jdbc = str(
            request.getfixturevalue(f"{'postgres' if database == 'postgresql' else 'mariadb'}_jdbc")
        )
    s = Scenario(broker, jdbc)
    crashed = s.run(
        "--async", "--batch", "0", "--batches", "2", "--crash-at", step, "--crash-batch", "1"
    )
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    assert "committed=0" in crashed.stdout
    committed = STEPS.index(step) >= STEPS.index("after_db_commit")
    # Before the database commit, recovery settles batch 0 (committed, its mark held by
    # batch 1; stored already if the loop was late to begin batch 1) and aborts batch 1.
    expected = {
        "after_db_commit": {TransactionOutcome.COMMITTED},
        "after_kafka_commit": {TransactionOutcome.ALREADY_COMMITTED},
    }.get(step, {TransactionOutcome.ALREADY_COMMITTED, TransactionOutcome.NOTHING_TO_COMMIT})

    async def recover_and_go_on() -> TransactionOutcome:
        async with AsyncDualWriter(_conf(broker, s.txn_id), jdbc) as writer:
            outcome = await writer.start()
            values = [f"b2-r{i}" for i in range(4)]
            async with writer.transaction() as tx:
                await tx.connection.execute(
                    insert(events_table(s.table)), [{"batch": 2, "value": v} for v in values]
                )
                for value in values:
                    await tx.produce(s.topic, value.encode())
            return outcome

    assert run(recover_and_go_on()) in expected
    s.assert_equal_sides(12 if committed else 8)
