"""``AsyncDualWriter``: ``DualWriter`` over SQLAlchemy's asyncio engines.

The recipe is ``DualWriter``'s own code, not a copy: the same state row, lock, owner
check, recovery, completion marks and failure paths. It runs the way SQLAlchemy runs
its own sync code over an async driver: in a greenlet (``greenlet_spawn``), where every
database call awaits the driver on the event loop (``await_``). Its Kafka calls are the
``AsyncTransactionalProducer``'s: they run on the producer's worker thread while the
greenlet awaits them, so the event loop is never blocked, by the database or by
librdkafka. The body of ``async with writer.transaction() as tx:`` is ordinary async
code on ``tx.connection``, an ``AsyncConnection`` over the connection that holds the
state-row lock in its open transaction.

Cancellation: a call cancelled while it waits for its turn (another task's transaction
of the same writer) never runs. Once it runs, the writer's steps (the lock, the begin,
the prepare, the state write, the two commits, recovery) are never cut short: a
cancelled caller gets ``CancelledError`` at once, and the step runs to its end in a task
of its own, which the writer's next call waits for. A body cancelled, like a body that
raises, rolls both sides back; a cancellation after the body (while the writer commits)
does not stop the commit: both sides commit, or the transaction is left for recovery, as
without the cancellation. ``kafka_txn.aio`` logs how each such step ended.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from kafka_txn._extras import missing_extra

try:
    from sqlalchemy.engine import URL
    from sqlalchemy.exc import NoSuchModuleError
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
    from sqlalchemy.util import concurrency as _concurrency
    from sqlalchemy.util.concurrency import greenlet_spawn
except ImportError as exc:
    raise missing_extra("kafka_txn.aio.AsyncDualWriter", "asyncio", exc) from exc
try:  # after SQLAlchemy: a machine without either is told about SQLAlchemy first
    import greenlet  # noqa: F401 - SQLAlchemy's asyncio extension imports it only when used
except ImportError as exc:
    raise missing_extra("kafka_txn.aio.AsyncDualWriter", "asyncio", exc) from exc

from kafka_txn.aio.bridge import log_outcome, running_loop
from kafka_txn.aio.producer import AsyncTransactionalProducer
from kafka_txn.config import ProducerSettings
from kafka_txn.dualwrite.engine import database_url, validate_seconds
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import ConfigurationError, IllegalStateError, TransactionAbortableError
from kafka_txn.metrics import MetricsHook
from kafka_txn.producer import arguments
from kafka_txn.producer.lifecycle import Lifecycle
from kafka_txn.producer.sending import Serializer
from kafka_txn.producer.transactional import TransactionalProducer
from kafka_txn.state import PreparedTxnState
from kafka_txn.tracing import Tracing
from kafka_txn.twophase.recovery import TransactionOutcome

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["AsyncDualWriteTransaction", "AsyncDualWriter"]

log = logging.getLogger("kafka_txn.aio")

T = TypeVar("T")

await_: Callable[[Awaitable[Any]], Any] = (
    getattr(_concurrency, "await_", None) or _concurrency.await_only
)
"""SQLAlchemy's ``await_`` (2.1), ``await_only`` in 2.0: awaits a coroutine on the loop
from sync code running in a ``greenlet_spawn`` greenlet."""

_ASYNC_DRIVERS = {
    # backend -> (the async driver kafka-txn uses, the sync drivers it stands in for)
    "postgresql": ("psycopg_async", {"psycopg", "psycopg2", "psycopg2cffi", "pg8000"}),
    "mysql": ("aiomysql", {"pymysql", "mysqldb", "mysqlconnector", "mariadbconnector"}),
    "mariadb": ("aiomysql", {"pymysql", "mysqldb", "mysqlconnector", "mariadbconnector"}),
    "sqlite": ("aiosqlite", {"pysqlite"}),
}
"""The async driver for each database a JDBC URL or a sync SQLAlchemy URL names:
psycopg 3's async mode, aiomysql (PyMySQL's protocol code), aiosqlite. A URL naming an
async driver SQLAlchemy knows (``postgresql+asyncpg://``) is used as it is."""

_EXTRA_HINT = "pip install 'kafka-txn[asyncio]' (or '.[asyncio]' from a checkout)"

_MYSQL_CONNECT_TIMEOUT = 10.0
"""Seconds an aiomysql connection may take to open when the URL sets no
``connect_timeout``: PyMySQL's default, which bounds the sync writer's connections."""


def async_engine_for(
    database: str | URL | AsyncEngine, user: str | None, password: str | None
) -> AsyncEngine:
    """An ``AsyncEngine`` for a JDBC URL, a SQLAlchemy URL (a sync driver is replaced
    by its async counterpart) or an ``AsyncEngine`` (returned as is)."""
    if isinstance(database, AsyncEngine):
        return database
    url = database_url(database, user, password, refuse_sqlite_login=True)
    backend, driver = url.get_backend_name(), url.get_driver_name()
    known = _ASYNC_DRIVERS.get(backend)
    if known is None:
        raise ConfigurationError(
            f"database dialect {backend!r} is not supported: use PostgreSQL, MySQL/MariaDB "
            "or SQLite (a JDBC URL, or postgresql+psycopg://, mysql+aiomysql://, "
            "sqlite+aiosqlite:///)"
        )
    if driver in known[1]:
        url = url.set(drivername=f"{backend}+{known[0]}")
    kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        kwargs["connect_args"] = {"timeout": 30}  # wait for the other writer's lock
    elif url.get_driver_name() == "aiomysql":
        kwargs["connect_args"] = {"async_creator_fn": _bounded_aiomysql_connect}
    try:
        engine = create_async_engine(url, **kwargs)
    except NoSuchModuleError as exc:
        raise ConfigurationError(
            f"SQLAlchemy has no dialect/driver {url.drivername!r}: use a JDBC URL, or "
            "postgresql+psycopg://, mysql+aiomysql://, sqlite+aiosqlite:///"
        ) from exc
    except ImportError as exc:
        raise ConfigurationError(
            f"the driver of {url.drivername} is not installed ({exc}): {_EXTRA_HINT} "
            "installs psycopg, aiomysql and aiosqlite, which JDBC URLs and "
            "postgresql+psycopg://, mysql+aiomysql://, sqlite+aiosqlite:/// use"
        ) from exc
    except Exception as exc:
        raise ConfigurationError(
            f"SQLAlchemy cannot make an asyncio engine of {url.drivername!r} ({exc}): use a "
            "JDBC URL, or postgresql+psycopg://, mysql+aiomysql://, sqlite+aiosqlite:///"
        ) from exc
    if not engine.sync_engine.dialect.is_async:  # pragma: no cover - create_async_engine refuses
        raise ConfigurationError(f"{url.drivername!r} is not an async driver")
    return engine


def _bounded_aiomysql_connect(*args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
    """``aiomysql.connect``, bounded as a whole by its ``connect_timeout`` (the URL's,
    else PyMySQL's 10 s). aiomysql bounds only the TCP connect, and with no timeout by
    default: the handshake's reads wait forever on a port that accepts and never
    answers (a Kafka broker, a stuck proxy), where the sync writer's PyMySQL gives up
    (``jdbc.bounded_engine``). It fails as PyMySQL does then, with
    ``OperationalError(2013)``, so that ``start()`` names the database with its fix
    (``DatabaseUnavailableError``)."""
    # Imported here: only a MySQL/MariaDB engine needs it.
    import aiomysql  # type: ignore[import-untyped]  # noqa: PLC0415

    given = kwargs.get("connect_timeout")
    bound = float(given) if given else _MYSQL_CONNECT_TIMEOUT
    kwargs["connect_timeout"] = bound

    async def connect() -> Any:
        conn = aiomysql.Connection(*args, **kwargs)
        try:
            await asyncio.wait_for(conn._connect(), bound)
        except asyncio.TimeoutError:
            conn.close()
            raise aiomysql.OperationalError(  # PyMySQL's, which aiomysql raises
                2013,
                f"Lost connection to MySQL server during the handshake (timed out after "
                f"{bound:g} s)",
            ) from None
        except BaseException:
            conn.close()
            raise
        return conn

    return connect()


class _AwaitingProducer:
    """The producer ``DualWriter``'s recipe calls, for the recipe running in a
    SQLAlchemy greenlet: each blocking call runs on the ``AsyncTransactionalProducer``'s
    worker thread, and the greenlet awaits it (``await_``), so that the event loop runs
    meanwhile. Only what the recipe uses is here."""

    def __init__(self, aio: AsyncTransactionalProducer) -> None:
        self._aio = aio
        self._sync = aio._sync
        self.transactional_id = aio.transactional_id
        # DualWriteTransaction's; the async body's differ
        self.produce = self._sync.produce
        self.produce_batch = self._sync.produce_batch
        self.send = self._sync.send

    @property
    def _life(self) -> Lifecycle:
        return self._sync._life

    @property
    def in_transaction(self) -> bool:
        return self._sync.in_transaction

    @property
    def state(self) -> str:
        return self._sync.state

    def _await(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        job = self._aio._call_blocking(functools.partial(fn, *args, **kwargs))
        return cast(T, await_(asyncio.wrap_future(job)))

    def init_transactions(
        self, timeout: float | None = None, *, keep_prepared_txn: bool = False
    ) -> None:
        self._await(self._sync.init_transactions, timeout, keep_prepared_txn=keep_prepared_txn)

    def begin_transaction(self) -> None:
        self._await(self._sync.begin_transaction)

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        return self._await(self._sync.prepare_transaction, timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._await(self._sync.commit_transaction, timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._await(self._sync.abort_transaction, timeout)

    def complete_transaction(
        self,
        state: PreparedTxnState | str,
        *,
        before_init: Callable[[TransactionOutcome], None] | None = None,
        timeout: float | None = None,
    ) -> TransactionOutcome:
        """``before_init`` writes the database (recovery's settle): the worker runs it on
        the event loop, in a greenlet of its own, and waits for it. The connection it
        uses is idle meanwhile: its greenlet awaits this call."""
        hook = None
        if before_init is not None:
            loop = self._aio._calls.loop
            settle = before_init

            def hook(outcome: TransactionOutcome) -> None:
                asyncio.run_coroutine_threadsafe(greenlet_spawn(settle, outcome), loop).result()

        return self._await(
            self._sync.complete_transaction, state, before_init=hook, timeout=timeout
        )

    def _close(self, timeout: float = 10.0, *, abort_open: bool = True) -> None:
        self._await(self._aio._close, timeout, abort_open=abort_open)


class _GreenletDualWriter(DualWriter):
    """``DualWriter`` whose producer is an ``_AwaitingProducer``: its methods are called
    in a greenlet (``greenlet_spawn``), on an async engine's ``sync_engine``."""

    _api_name = "AsyncDualWriter"
    aio_producer: AsyncTransactionalProducer

    def _new_producer(self, conf: dict[str, Any], **kwargs: Any) -> TransactionalProducer:
        kwargs.pop("sleep", None)  # the worker waits in librdkafka; nothing sleeps here
        self.aio_producer = AsyncTransactionalProducer(conf, **kwargs)
        return cast(TransactionalProducer, _AwaitingProducer(self.aio_producer))

    @contextmanager
    def _exclusive(self, call: str) -> Iterator[None]:
        """``DualWriter._exclusive`` without its wait: ``AsyncDualWriter``'s turn already
        runs one call at a time, and a ``threading.Lock`` waited for here would stop the
        event loop (this runs on its thread), the very loop that the holder, ``close()``
        awaiting in its own greenlet, needs to finish. A call that meets it refuses."""
        if not self._serial.acquire(blocking=False):
            raise IllegalStateError(
                f"{call} of the AsyncDualWriter for {self.transactional_id!r} while it "
                "closes: create a new writer"
            )
        try:
            yield
        finally:
            self._serial.release()


class AsyncDualWriteTransaction:
    """What the body of ``writer.transaction()`` gets: ``connection``, an
    ``AsyncConnection`` in the open database transaction (it holds the state-row lock),
    and ``send``/``produce``/``send_and_wait``, the ``AsyncTransactionalProducer``'s own
    methods (same signatures and errors), as ``DualWriteTransaction`` hands out the sync
    producer's."""

    def __init__(self, connection: AsyncConnection, producer: AsyncTransactionalProducer) -> None:
        self.connection = connection
        self.send = producer.send
        self.send_and_wait = producer.send_and_wait
        self.produce = producer.produce


class AsyncDualWriter:
    """Writes to a SQL database and Kafka in one atomic step, for asyncio: ``DualWriter``
    (the same arguments, state row and guarantees) over an async SQLAlchemy engine.

    ``database`` is a JDBC URL (``jdbc:postgresql://``, ``jdbc:mysql://``,
    ``jdbc:mariadb://``, ``jdbc:sqlite:``), a SQLAlchemy URL (a sync driver is replaced by
    its async counterpart: psycopg's async mode, aiomysql, aiosqlite) or an
    ``AsyncEngine``. Create it inside a running event loop::

        async with AsyncDualWriter(config, "jdbc:postgresql://db/shop", user="app") as writer:
            async with writer.transaction() as tx:
                await tx.connection.execute(orders.insert().values(id=7))
                await tx.produce("orders", b"order 7")

    Its producer is error-only by default, as ``DualWriter``'s: ``tx.send()`` and
    ``tx.send_and_wait()`` need ``"delivery.report.only.error": False`` in ``config``.
    Tasks share a writer by taking turns: one ``start()`` or ``transaction()`` at a time,
    in the order they came (each waits up to ``lock_timeout``). What cancellation does
    is in the module docstring and docs/guarantees.md.
    """

    def __init__(
        self,
        producer_config: Mapping[str, Any] | ProducerSettings,
        database: str | URL | AsyncEngine,
        *,
        user: str | None = None,
        password: str | None = None,
        state_table: str = "kafka_transaction_state",
        id_column: str = "transactional_id",
        state_column: str = "prepared_txn_state",
        updated_column: str = "updated_at",
        owner_column: str = "owner",
        create_state_table: bool = True,
        lock_timeout: float | None = 30.0,
        mark_completed_after: float | None = 1.0,
        on_step: Callable[[str], None] | None = None,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
        operation_timeout: float | None = None,
        queue_full_timeout: float = 60.0,
        prepare_min_time_left: float | None = None,
        metrics: MetricsHook | None = None,
        tracing: Tracing | TracerProvider | None = None,
    ) -> None:
        self._loop = running_loop("AsyncDualWriter")
        arguments.optional_text(user, "AsyncDualWriter", "user")
        arguments.optional_text(password, "AsyncDualWriter", "password", secret=True)
        mark_after = validate_seconds(mark_completed_after, "mark_completed_after")
        self.engine = async_engine_for(database, user, password)
        """The ``AsyncEngine`` the writer and its bodies use."""
        try:
            self._writer = _GreenletDualWriter(  # turns two-phase commit on, as DualWriter
                producer_config,
                self.engine.sync_engine,
                state_table=state_table,
                id_column=id_column,
                state_column=state_column,
                updated_column=updated_column,
                owner_column=owner_column,
                create_state_table=create_state_table,
                lock_timeout=lock_timeout,
                mark_completed_after=None,  # the loop schedules the marks (_mark_later)
                on_step=on_step,
                key_serializer=key_serializer,
                value_serializer=value_serializer,
                operation_timeout=operation_timeout,
                queue_full_timeout=queue_full_timeout,
                prepare_min_time_left=prepare_min_time_left,
                metrics=metrics,
                tracing=tracing,
            )
        except BaseException:
            self._dispose_soon()
            raise
        self.producer = self._writer.aio_producer
        """The writer's ``AsyncTransactionalProducer``."""
        self.transactional_id = self._writer.transactional_id
        self.owner = self._writer.owner
        """This instance's owner token, written to the state row by ``start()``."""
        self.state_table = self._writer.state_table
        self._mark_after = mark_after
        self._turn = asyncio.Lock()
        """One start(), transaction() or mark write of this writer at a time."""
        self._holder: asyncio.Task[Any] | None = None
        self._body: asyncio.Task[Any] | None = None
        """The task running a transaction()'s body: transaction() called from it again
        would wait for itself. (Not the turn's holder: a task whose call was cancelled
        while a step runs on may call again, and waits its turn.)"""
        self._steps: set[asyncio.Task[Any]] = set()
        self._mark_timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._closing: asyncio.Task[None] | None = None
        self._marking: asyncio.Task[None] | None = None
        """The task storing the completion mark, if one was started."""
        self._mark_writing = False
        self._mark_failures = 0

    def _dispose_soon(self) -> None:
        engine = self.engine
        task = self._loop.create_task(engine.dispose())
        task.add_done_callback(lambda done: done.cancelled() or done.exception())

    @property
    def lock_timeout(self) -> float | None:
        """The bound on every wait for the state-row lock, in seconds."""
        return self._writer.lock_timeout

    def __repr__(self) -> str:
        return "Async" + repr(self._writer)

    # ------------------------------------------------------------------ turns and steps
    async def _take_turn(self, call: str) -> None:
        """Wait for this writer's other calls (up to ``lock_timeout``); a task calling in
        from its own transaction's body is refused (it would wait for itself)."""
        if self._body is not None and self._body is asyncio.current_task():
            raise IllegalStateError(
                f"{call} inside a transaction() of the same writer: finish that "
                "transaction first (one writer has one transaction at a time)"
            )
        self._refuse_if_closed(call)
        bound = self.lock_timeout
        # Not asyncio.wait_for: on Python 3.10 and 3.11 it returns the acquired lock to a
        # caller cancelled at that moment, swallowing the cancellation (CPython gh-86296).
        acquiring = self._loop.create_task(self._turn.acquire())
        try:
            await asyncio.wait({acquiring}, timeout=bound)
        except asyncio.CancelledError:
            acquiring.cancel()
            if acquiring.done() and not acquiring.cancelled():
                self._turn.release()  # acquired as the caller was cancelled: not its turn
            raise
        if not acquiring.done():
            acquiring.cancel()
        if acquiring.cancelled() or not acquiring.done():
            raise TransactionAbortableError(
                f"{call} of the AsyncDualWriter for {self.transactional_id!r} waited "
                f"lock_timeout={bound:g}s for another task's transaction of the same "
                "writer; nothing was written: retry, or give each task a writer (and a "
                "transactional id) of its own"
            ) from None
        if self._closed:  # close() began while this call waited for its turn
            self._turn.release()
            self._refuse_if_closed(call)
        self._holder = asyncio.current_task()

    def _refuse_if_closed(self, call: str) -> None:
        if self._closed:
            raise IllegalStateError(
                f"{call} of the AsyncDualWriter for {self.transactional_id!r} after "
                "close(): create a new writer"
            )

    def _hand_back(self) -> None:
        self._holder = None
        self._turn.release()

    async def _step(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a greenlet, in a task of its own: it runs to its end even if
        the caller is cancelled. The turn is then handed back only when it ended."""
        task = self._loop.create_task(cast(Coroutine[Any, Any, T], greenlet_spawn(fn, *args)))
        self._steps.add(task)
        task.add_done_callback(self._steps.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the step itself was cancelled (the loop shuts down)
                raise
            # The caller was cancelled while the step ran, or as it ended (its result
            # not yet delivered): either way the step's end, not the caller, decides
            # what follows. A transaction entered must be rolled back, not dropped with
            # its connection, row lock and Kafka transaction still open.
            task.add_done_callback(log_outcome(name, self.transactional_id))
            raise _UnfinishedStepError(task) from None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> TransactionOutcome:
        """``DualWriter.start``: recover what a predecessor left, take ownership, fence."""
        return await self._exclusive("start()", self._writer.start)

    async def resolve(self, stored_state: str | PreparedTxnState) -> None:
        """``DualWriter.resolve``."""
        await greenlet_spawn(self._writer.resolve, stored_state)

    async def store_completed(self) -> bool:
        """``DualWriter.store_completed``."""
        return await self._exclusive("store_completed()", self._writer.store_completed)

    async def _exclusive(self, call: str, fn: Callable[[], T]) -> T:
        """``fn`` in its turn, as a step (to its end even if the caller is cancelled)."""
        await self._take_turn(call)
        try:
            result = await self._step(call, fn)
        except _UnfinishedStepError as unfinished:
            unfinished.then(self._hand_back)
            raise asyncio.CancelledError from None
        except BaseException:
            self._hand_back()
            raise
        self._hand_back()
        return result

    async def close(self) -> None:
        """``DualWriter.close``, then the engine's pool. Steps that run on after their
        caller was cancelled are waited for first (each is bounded by ``lock_timeout``
        and ``operation_timeout``). Cancelled, it runs on, as the producer's
        ``close()``: a writer half closed would leave its producer's threads and the
        pool's connections behind. Safe to call more than once; every call returns when
        the writer is closed."""
        if self._closing is None:
            self._closed = True
            if self._mark_timer is not None:
                self._mark_timer.cancel()
            self._closing = self._loop.create_task(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if self._steps:
            await asyncio.wait(set(self._steps))
        await self._wait_for_the_mark()
        try:
            await greenlet_spawn(self._writer.close)
        finally:
            await self.engine.dispose()

    async def __aenter__(self) -> AsyncDualWriter:
        if not self._writer._started:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ the recipe
    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncDualWriteTransaction]:
        """One atomic write to both systems; an exception in the body, cancellation
        included, rolls both back. Tasks take turns (one transaction of a writer at a
        time, each waiting up to ``lock_timeout``); ``transaction()`` inside its own
        body raises ``IllegalStateError``."""
        await self._take_turn("transaction()")
        scope = self._writer.transaction()
        try:
            entered = await self._step("transaction", scope.__enter__)
        except _UnfinishedStepError as unfinished:
            # Cancelled while the writer locks the row and begins: once that ends, what
            # it began is rolled back, then the turn is handed back.
            entering = unfinished.task
            unfinished.then(lambda: self._unwind(scope, entering))
            raise asyncio.CancelledError from None
        except BaseException:
            self._hand_back()
            raise
        tx = AsyncDualWriteTransaction(
            AsyncConnection(self.engine, entered.connection), self.producer
        )
        self._body = asyncio.current_task()
        try:
            yield tx
        except BaseException as exc:
            self._body = None
            await self._end(scope, exc)
            raise
        self._body = None
        await self._end(scope, None)

    async def _end(self, scope: Any, exc: BaseException | None) -> None:
        """The writer's part after the body: commit both (``exc`` None) or roll both
        back, to its end even if the caller is cancelled; then the turn is handed back."""
        args = (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)
        try:
            await self._step("transaction", scope.__exit__, *args)
        except _UnfinishedStepError as unfinished:
            unfinished.then(self._after_transaction)
            raise asyncio.CancelledError from None
        except BaseException:
            self._after_transaction()
            raise
        self._after_transaction()

    def _unwind(self, scope: Any, entered: asyncio.Task[Any]) -> None:
        if entered.cancelled() or entered.exception() is not None:
            self._hand_back()
            return
        cancelled = asyncio.CancelledError()
        task = self._loop.create_task(
            greenlet_spawn(scope.__exit__, asyncio.CancelledError, cancelled, None)
        )
        self._steps.add(task)
        task.add_done_callback(self._steps.discard)
        task.add_done_callback(lambda _: self._after_transaction())
        task.add_done_callback(log_outcome("transaction (rolled back)", self.transactional_id))

    def _after_transaction(self) -> None:
        """The turn handed back; a committed state due to be stored marked completed
        (``mark_completed_after``) gets its timer."""
        self._hand_back()
        if self._mark_after is not None:
            self._mark_later(self._mark_after)

    def _mark_later(self, delay: float) -> None:
        """Store the pending completion mark in ``delay`` seconds (a timer on the loop,
        where ``DualWriter`` has a thread): replaces an earlier timer."""
        if self._closed or self._writer._marks.pending is None:
            return
        if self._mark_timer is not None:
            self._mark_timer.cancel()
        self._mark_timer = self._loop.call_later(delay, self._mark_due)

    def _mark_due(self) -> None:
        self._mark_timer = None
        if self._closed or (self._marking is not None and not self._marking.done()):
            return
        self._marking = self._loop.create_task(self._store_mark())

    async def _store_mark(self) -> None:
        """The mark, written in the writer's turn (never through a transaction's
        connection). A write the database refused is tried again after a back-off
        (``mark_completed_after`` doubled per failure, up to 60 s), as ``DualWriter``'s
        thread does, and at the next transaction, abort or ``close()``."""
        async with self._turn:
            if self._closed:
                return
            self._mark_writing = True
            try:
                stored = await greenlet_spawn(self._writer.store_completed)
            except Exception:
                stored = False
                log.warning(
                    "storing the completion mark of %r failed", self.transactional_id,
                    exc_info=True,
                )  # fmt: skip
            finally:
                self._mark_writing = False
            if stored:
                self._mark_failures = 0
            elif self._mark_after is not None:
                self._mark_failures += 1
                backoff = self._mark_after * 2 ** min(self._mark_failures, 16)
                self._mark_later(min(60.0, backoff))

    async def _wait_for_the_mark(self) -> None:
        """close(): a mark being written is waited for; one still waiting for its turn
        is dropped (the sync close stores it), never waited for: the turn may be held by
        the body of a transaction that close() was called from."""
        marking = self._marking
        if marking is None or marking.done():
            return
        if self._mark_writing:
            await asyncio.wait({marking})
        else:
            marking.cancel()


class _UnfinishedStepError(Exception):
    """A step whose caller was cancelled while it ran: ``then(fn)`` runs ``fn`` when it
    ends (the turn is handed back only then)."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        super().__init__(task)
        self.task = task

    def then(self, fn: Callable[[], None]) -> None:
        self.task.add_done_callback(lambda _: fn())
