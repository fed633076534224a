"""Cancelling an ``AsyncDualWriter`` call at every point (9.5), on PostgreSQL, MariaDB and
SQLite with the real broker, by ``task.cancel()`` and by ``asyncio.timeout()`` expiring:

- waiting for its turn behind another task's transaction: it never runs;
- during ``start()`` (held at the state-row lock by another session): ``start()`` runs
  on, and ``start()`` again returns its outcome;
- while the writer locks the row (held by another session) or has begun (held at
  ``after_begin``): the body never runs, what was begun is rolled back on both sides,
  the turn is handed back, the next transaction works;
- in the body: both sides roll back;
- after the body, held at each step from ``after_send`` to ``after_kafka_commit``: the
  caller gets the cancellation at once, the dual write still commits on both sides, the
  next task waits until it has, then commits too.

A step is held by the writer's ``on_step`` hook: it runs in the writer's greenlet, on the
loop, so it awaits an ``asyncio.Event`` with SQLAlchemy's ``await_`` (blocking there
would block the loop). Each schedule ends with the rows, read with SQL, equal to the
records an independent read_committed consumer (kafka-python) sees, each once.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest
from sqlalchemy import create_engine, insert, select, text
from sqlalchemy.util import concurrency

from kafka_txn import ProducerFencedError, TransactionOutcome
from kafka_txn.aio import AsyncDualWriter
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from tests.aio.test_dual_writer import Sides, run, within
from tests.support.rig import Broker

pytestmark = [pytest.mark.broker, pytest.mark.adversary]

T = TypeVar("T")

await_ = getattr(concurrency, "await_", None) or concurrency.await_only
"""SQLAlchemy's ``await_`` (2.1; ``await_only`` in 2.0)."""

AFTER_THE_BODY = ("after_send", "after_prepare", "after_state_write", "after_db_commit",
                  "after_kafka_commit")  # fmt: skip


class Hold:
    """An ``on_step`` hook that, once armed, holds the writer at one step: it sets
    ``reached`` and waits (awaiting on the loop, from the writer's greenlet) until
    ``release`` is set."""

    def __init__(self) -> None:
        self._at: str | None = None
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    def arm(self, step: str) -> None:
        self._at = step
        self.reached.clear()
        self.release.clear()

    def __call__(self, step: str) -> None:
        if step == self._at:
            self._at = None
            self.reached.set()
            await_(self.release.wait())


@contextlib.contextmanager
def row_locked(jdbc_url: str, txn_id: str) -> Iterator[None]:
    """Another session holds the writer's state-row lock until the block ends:
    SELECT ... FOR UPDATE on PostgreSQL and MariaDB, a write transaction (BEGIN
    IMMEDIATE) on SQLite, which locks the database."""
    url = jdbc_to_sqlalchemy(jdbc_url)
    if url.get_backend_name() == "sqlite":
        holder = sqlite3.connect(url.database or "", isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(
                text(
                    "SELECT owner FROM kafka_transaction_state "
                    "WHERE transactional_id = :t FOR UPDATE"
                ),
                {"t": txn_id},
            ).one()
            yield
            conn.rollback()
    finally:
        engine.dispose()


async def cancelled(task: asyncio.Task[Any], how: str) -> None:
    """Cancel ``task`` (``how`` = "cancel"), or let its ``asyncio.timeout()`` expire
    (``how`` = "timeout"), or let it be cancelled by whoever does (``how`` =
    "already"), and check that it ended with that, at once: whatever the writer runs on
    for it is held meanwhile."""
    if how in ("cancel", "already"):
        if how == "cancel":
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        with pytest.raises(asyncio.TimeoutError):  # TimeoutError from Python 3.11
            await task


@pytest.fixture
def sides(broker: Broker, jdbc_url: str) -> Iterator[Sides]:
    made = Sides(broker, jdbc_url)
    try:
        yield made
    finally:
        made.close()


def _conf(broker: Broker, txn_id: str) -> dict[str, Any]:
    return {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}


def _has_row(sides: Sides, value: str) -> bool:
    with sides.engine.connect() as conn:
        found = conn.execute(select(sides.table.c.value).where(sides.table.c.value == value))
        return found.first() is not None


async def _wait_until(predicate: Any, what: str, seconds: float = 30.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{what}: not within {seconds:g} s")


# --------------------------------------------------------------------------- before it runs
@pytest.mark.guarantee("9.5")
def test_a_call_cancelled_before_its_turn_never_runs_and_a_cancelled_start_runs_on(
    broker: Broker, sides: Sides, txn_id: str
) -> None:
    """A transaction waiting for its turn behind another task's body, cancelled or timed
    out, never runs (its body never starts); the other commits. A second writer's
    start(), cancelled while another session holds the state-row lock, raises
    CancelledError at once and runs on once the lock is released: start() again returns
    its outcome, and it has taken the id over (the first writer is fenced)."""
    conf = _conf(broker, txn_id)

    async def scenario() -> None:
        first = AsyncDualWriter(conf, sides.jdbc_url)
        second = AsyncDualWriter(conf, sides.jdbc_url)
        try:
            await first.start()
            await sides.write(first, 1, "a")
            go_on, in_body = asyncio.Event(), asyncio.Event()

            async def holder() -> None:
                async with first.transaction() as tx:
                    await tx.connection.execute(insert(sides.table).values(id=2, value="h"))
                    await tx.produce(sides.topic, b"h")
                    in_body.set()
                    await go_on.wait()

            ran: list[str] = []

            async def waiter(name: str) -> None:
                async with first.transaction() as tx:
                    ran.append(name)
                    await tx.produce(sides.topic, name.encode())

            holding = asyncio.create_task(holder())
            await in_body.wait()
            by_cancel = asyncio.create_task(waiter("by-cancel"))
            by_timeout = asyncio.create_task(within(0.3, waiter("by-timeout")))
            await asyncio.sleep(0.1)  # both wait for their turn
            await cancelled(by_cancel, "cancel")
            await cancelled(by_timeout, "timeout")
            go_on.set()
            await holding
            assert ran == []
            await sides.write(first, 3, "after-turn")

            with row_locked(sides.jdbc_url, txn_id):
                starting = asyncio.create_task(second.start())
                await asyncio.sleep(0.3)  # into start(): at the lock, or on its way there
                await cancelled(starting, "cancel")  # at once: the lock is still held
            outcome = await second.start()  # runs on, then hands back its turn
            assert outcome in (TransactionOutcome.ALREADY_COMMITTED,
                               TransactionOutcome.NOTHING_TO_COMMIT)  # fmt: skip
            assert await second.start() is outcome
            with pytest.raises(ProducerFencedError):
                await sides.write(first, 4, "fenced")
            await sides.write(second, 5, "after-start")
        finally:
            await first.close()
            await second.close()

    run(scenario())
    sides.assert_same(["a", "h", "after-turn", "after-start"])


# --------------------------------------------------------------------------- entering, the body
@pytest.mark.guarantee("9.5")
def test_cancelled_while_it_locks_begins_or_runs_its_body_rolls_both_back(
    broker: Broker, sides: Sides, txn_id: str
) -> None:
    """A transaction cancelled while it waits for the state-row lock (another session
    holds it), while held right after it began its Kafka transaction (``after_begin``),
    just as that step ended (its result not yet delivered), or in its body (cancelled,
    or its timeout expiring): the caller gets CancelledError (TimeoutError) at once, the
    body never runs in the first three, nothing of it becomes visible on either side,
    and the next transaction commits."""
    hold = Hold()

    async def scenario() -> None:
        async with AsyncDualWriter(_conf(broker, txn_id), sides.jdbc_url, on_step=hold) as writer:
            await sides.write(writer, 1, "a")
            ran: list[str] = []

            async def never(name: str) -> None:
                async with writer.transaction() as tx:
                    ran.append(name)
                    await tx.produce(sides.topic, name.encode())

            with row_locked(sides.jdbc_url, txn_id):
                locking = asyncio.create_task(never("locking"))
                await asyncio.sleep(0.3)  # waiting for the row lock
                await cancelled(locking, "cancel")
            await sides.write(writer, 2, "after-lock")

            hold.arm("after_begin")
            beginning = asyncio.create_task(never("beginning"))
            await hold.reached.wait()
            await cancelled(beginning, "cancel")
            hold.release.set()
            await sides.write(writer, 3, "after-begin")

            # Cancelled as the writer finished beginning: the step has ended, its
            # result not yet delivered to the caller (a done callback of the step's
            # task cancels the caller right after the step's own ending).
            hold.arm("after_begin")
            ending = asyncio.create_task(never("ending"))
            await hold.reached.wait()
            (step,) = writer._steps
            step.add_done_callback(lambda _: ending.cancel())
            hold.release.set()
            await cancelled(ending, "already")
            await sides.write(writer, 5, "after-ending")
            assert ran == []

            for n, how in enumerate(("cancel", "timeout")):
                in_body = asyncio.Event()

                async def body(key: int, value: str, ready: asyncio.Event = in_body) -> None:
                    async with writer.transaction() as tx:
                        await tx.connection.execute(insert(sides.table).values(id=key, value=value))
                        await tx.produce(sides.topic, value.encode())
                        ready.set()
                        await asyncio.Event().wait()  # until cancelled

                if how == "cancel":
                    task = asyncio.create_task(body(10 + n, f"body-{how}"))
                else:
                    task = asyncio.create_task(within(0.5, body(10 + n, f"body-{how}")))
                await in_body.wait()
                await cancelled(task, how)
                assert not _has_row(sides, f"body-{how}")
            await sides.write(writer, 4, "after-body")
            assert writer.producer.state == "ready"

    run(scenario())
    sides.assert_same(["a", "after-lock", "after-begin", "after-ending", "after-body"])


# --------------------------------------------------------------------------- after the body
@pytest.mark.guarantee("9.5")
def test_cancelled_after_its_body_the_dual_write_still_commits_on_both_sides(
    broker: Broker, sides: Sides, txn_id: str
) -> None:
    """At each step from ``after_send`` (before the prepare) to ``after_kafka_commit``,
    the writer is held and its caller cancelled (task.cancel(), or its timeout
    expiring, in turn): the caller gets the cancellation at once; a second task's
    transaction, started meanwhile, does not begin while the step is held; once
    released, the dual write commits on both sides and the second task's after it."""
    hold = Hold()

    async def scenario() -> None:
        async with AsyncDualWriter(_conf(broker, txn_id), sides.jdbc_url, on_step=hold) as writer:
            for n, step in enumerate(AFTER_THE_BODY):
                how = ("cancel", "timeout")[n % 2]
                hold.arm(step)
                write = sides.write(writer, 10 + n, f"cut-{step}")
                cut = asyncio.create_task(write if how == "cancel" else within(0.5, write))
                await hold.reached.wait()
                await cancelled(cut, how)
                entered: list[str] = []

                async def after(key: int, value: str, log: list[str] = entered) -> None:
                    async with writer.transaction() as tx:
                        log.append(value)
                        await tx.connection.execute(insert(sides.table).values(id=key, value=value))
                        await tx.produce(sides.topic, value.encode())

                following = asyncio.create_task(after(20 + n, f"next-{step}"))
                await asyncio.sleep(0.1)
                assert entered == [], f"a transaction began while {step} was held"
                hold.release.set()
                await following
                assert _has_row(sides, f"cut-{step}")

    run(scenario())
    sides.assert_same([*(f"cut-{s}" for s in AFTER_THE_BODY),
                       *(f"next-{s}" for s in AFTER_THE_BODY)])  # fmt: skip


@pytest.mark.guarantee("9.5")
def test_the_same_task_calls_again_at_once_after_its_call_was_cancelled(
    broker: Broker, sides: Sides, txn_id: str
) -> None:
    """A task whose transaction() was cancelled (its timeout expiring after the body,
    while the writer commits: the step runs on) calls transaction() again at once: the
    second call waits for the step that runs on and then commits, never taken for a
    transaction() called inside its own body (IllegalStateError). Both dual writes are
    on both sides."""
    hold = Hold()

    async def scenario() -> None:
        async with AsyncDualWriter(_conf(broker, txn_id), sides.jdbc_url, on_step=hold) as writer:
            hold.arm("after_prepare")

            async def release_soon() -> None:
                await hold.reached.wait()
                await asyncio.sleep(0.3)
                hold.release.set()

            releasing = asyncio.create_task(release_soon())
            with pytest.raises(asyncio.TimeoutError):
                await within(0.1, sides.write(writer, 1, "cut"))
            await sides.write(writer, 2, "again")  # the same task, at once
            await releasing

    run(scenario())
    sides.assert_same(["cut", "again"])
