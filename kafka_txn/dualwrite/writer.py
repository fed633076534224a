"""Kafka and a SQL database, written atomically: KIP-939's dual-write recipe.

Each ``with writer.transaction() as tx:`` runs::

    DB: BEGIN; lock the state row, read its owner   Kafka: begin_transaction()
    caller: SQL on tx.connection, tx.produce()/tx.send() to Kafka
    Kafka: prepare_transaction() -> state
    DB: UPDATE state row = state; COMMIT            <- the decision
    Kafka: complete_transaction(state)              (commit)

and ``start()`` first recovers what a predecessor left: under the same row lock it reads
the stored state, lets ``complete_transaction`` commit the prepared transaction if the
database committed it (or abort it if not), stores the state marked completed together
with this writer's owner token, and then, holding the lock again, runs
``init_transactions()``, which fences the predecessor in Kafka.

Two writers with one transactional id: the state row is locked for the whole of each
transaction (SELECT ... FOR UPDATE on PostgreSQL and MariaDB, a write on SQLite, which
locks the database), and every transaction checks, under that lock, that the row's owner
is still this writer. Once a newer writer's ``start()`` has written its owner token, the
older one's next transaction fails with ``ProducerFencedError`` before it writes anything
to either side. Lock waits are bounded (``lock_timeout``).

A committed transaction's state is stored marked completed before anything can bump the
producer epoch (see ``DualWriter``), so that a later recovery never has to guess about it.

If the database COMMIT's outcome is unknown (the connection dropped during it), Kafka is
never aborted: ``DatabaseCommitUnknownError`` is raised and the next ``start()`` decides
from the database. If Kafka's commit fails after the database committed,
``TransactionInDoubtError`` is raised and the transaction stays prepared for the next
``start()``, which commits it.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

from confluent_kafka import KafkaError
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    case,
    cast,
    func,
    insert,
    inspect,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, Connection, Engine, Transaction, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.pool import SingletonThreadPool, StaticPool

from kafka_txn.config import TWO_PHASE_COMMIT_KEY, ProducerSettings
from kafka_txn.dualwrite.ddl import (
    add_column_if_missing,
    add_column_statement,
    create_table_if_missing,
)
from kafka_txn.dualwrite.exact_ids import exact_string, fix_statement, inexact, pads
from kafka_txn.dualwrite.jdbc.urls import bounded_engine, jdbc_to_sqlalchemy, redact_jdbc_url
from kafka_txn.dualwrite.pg_pipeline import Decision, pipelining
from kafka_txn.dualwrite.rollback_watch import RollbackWatch
from kafka_txn.errors import (
    ConfigurationError,
    DatabaseCommitUnknownError,
    FatalError,
    IllegalStateError,
    InvalidPreparedStateError,
    KafkaTxnError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionDivergedError,
    TransactionInDoubtError,
    TransactionOutcomeUnknowableError,
    root_exception,
)
from kafka_txn.metrics import MetricsHook
from kafka_txn.producer.delivery import _add_note
from kafka_txn.producer.transactional import Serializer, TransactionalProducer
from kafka_txn.state import MAX_SERIALIZED_LENGTH, PreparedTxnState
from kafka_txn.twophase.recovery import TransactionOutcome

__all__ = [
    "STEPS",
    "DualWriteTransaction",
    "DualWriter",
    "engine_for",
    "validate_identifier",
]

log = logging.getLogger("kafka_txn.dualwrite")

STEPS = (
    "after_begin",
    "after_send",
    "after_prepare",
    "after_state_write",
    "after_db_commit",
    "after_kafka_commit",
)
"""The steps ``on_step`` is called at, in order (for fault injection and tracing)."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_OWNER_LENGTH = 255


def validate_identifier(name: str, what: str) -> str:
    """A table or column name: letters, digits and ``_``, not starting with a digit, at
    most 63 characters. Names are also quoted by SQLAlchemy, never pasted into SQL."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ConfigurationError(
            f"{what} {name!r} is not a plain SQL identifier: use letters, digits and "
            "underscores, not starting with a digit, at most 63 characters"
        )
    return name


def _owner_token() -> str:
    """A token naming one DualWriter instance, ``host:pid:uuid8``: where to find the
    process, and which of its writers (a process may start several, one after another)."""
    suffix = f":{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return socket.gethostname()[: _OWNER_LENGTH - len(suffix)] + suffix


def database_url(database: str | URL, user: str | None, password: str | None) -> URL:
    """The SQLAlchemy URL for a JDBC URL (parameters mapped and checked, see
    ``kafka_txn.dualwrite.jdbc.urls``) or a SQLAlchemy URL. Errors show the URL redacted."""
    if isinstance(database, URL):
        return database
    if isinstance(database, str) and database.startswith("jdbc:"):
        return jdbc_to_sqlalchemy(database, user=user, password=password)
    if isinstance(database, str):
        try:
            url = make_url(database)
        except Exception as exc:
            # Neither the URL nor the parser's message (it may quote a part of the URL).
            raise ConfigurationError(
                f"database {redact_jdbc_url(database)!r} is neither a JDBC URL nor a "
                f"SQLAlchemy URL ({type(exc).__name__})"
            ) from None
        if user is not None or password is not None:
            url = url.set(username=user or url.username, password=password or url.password)
        return url
    raise ConfigurationError(
        f"database must be a JDBC URL, a SQLAlchemy URL or Engine, got {type(database)}"
    )


def engine_for(database: str | URL | Engine, user: str | None, password: str | None) -> Engine:
    """A SQLAlchemy Engine for a JDBC URL, a SQLAlchemy URL or an Engine (returned as is).
    Built by ``jdbc.bounded_engine``: a MySQL/MariaDB handshake cannot hang."""
    if isinstance(database, Engine):
        return database
    url = database_url(database, user, password)
    kwargs: dict[str, Any] = {}
    if url.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": 30}  # wait for the other writer's lock
    try:
        return bounded_engine(url, **kwargs)
    except NoSuchModuleError as exc:
        raise ConfigurationError(
            f"SQLAlchemy has no dialect/driver {url.drivername!r}: use a JDBC URL, or "
            "postgresql+psycopg://, mysql+pymysql://, sqlite:///"
        ) from exc
    except ImportError as exc:
        extra = {"postgresql": "postgres", "mysql": "mysql"}.get(url.get_backend_name(), "sql")
        raise ConfigurationError(
            f"the driver for {url.drivername} is not installed: "
            f"pip install 'kafka-txn[{extra}]' ({exc})"
        ) from exc


def validate_seconds(value: float | None, name: str) -> float | None:
    """A positive, finite number of seconds, or None; anything else is refused."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(f"{name}={value!r} must be a positive number of seconds or None")
    return float(value)


def _is_lock_timeout(exc: DBAPIError) -> bool:
    """The database gave up waiting for a lock: PostgreSQL's lock_not_available (55P03,
    from lock_timeout), MySQL/MariaDB's ER_LOCK_WAIT_TIMEOUT (1205, row and metadata
    locks), SQLite's SQLITE_BUSY once the busy timeout ran out."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == "55P03":
        return True
    if getattr(orig, "sqlite_errorcode", None) == 5 or "database is locked" in str(orig):
        return True
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return bool(args) and args[0] == 1205


def _is_cancelled(exc: DBAPIError) -> bool:
    """The database cancelled the statement: PostgreSQL's query_canceled (57014: the
    session's ``statement_timeout``, or ``pg_cancel_backend``), MariaDB's
    ER_STATEMENT_TIMEOUT (1969, ``max_statement_time``), MySQL's ER_QUERY_TIMEOUT (3024,
    ``max_execution_time``). On a lock statement that means the wait ended before the
    lock was taken: nothing was written."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == "57014":
        return True
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return bool(args) and args[0] in (1969, 3024)


def _in_transaction(conn: Connection) -> bool | None:
    """Whether ``conn``'s statements run in a transaction, as the driver last heard (no
    round trip), asked after a statement that takes a lock: psycopg's transaction
    status (a statement run in autocommit mode leaves it IDLE); PyMySQL's status flags:
    SERVER_STATUS_IN_TRANS (an explicit BEGIN; not reported after a locking read in an
    implicit transaction) or SERVER_STATUS_AUTOCOMMIT off; sqlite3's
    ``in_transaction``; None for a driver that does not say."""
    if conn.invalidated or conn.closed:
        return None  # a lost connection: no transaction to tell about
    try:
        driver = conn.connection.driver_connection
    except SQLAlchemyError:
        return None
    status = getattr(getattr(driver, "info", None), "transaction_status", None)
    if status is not None:  # psycopg 3 (an enum), psycopg2 (an int: 0 is IDLE)
        return int(status) != 0
    server_status = getattr(driver, "server_status", None)
    if isinstance(server_status, int):  # PyMySQL: the last OK/EOF packet's status flags
        return bool(server_status & 1) or not server_status & 2  # IN_TRANS, AUTOCOMMIT
    in_transaction = getattr(driver, "in_transaction", None)
    return in_transaction if isinstance(in_transaction, bool) else None


def _normalized(stored: str) -> str | None:
    """A stored state as kafka-txn writes it (how ``start()`` and recovery name it), or
    None if it does not parse."""
    try:
        return str(PreparedTxnState.parse(stored))
    except InvalidPreparedStateError:
        return None


_NOT_COMPLETE_ROLLBACK = 1196
"""MySQL/MariaDB's warning on a ROLLBACK that could not undo changes to non-transactional
tables: "Some non-transactional changed tables couldn't be rolled back"."""

_TEXT_LIMITS = {"TINYTEXT": 255, "TINYBLOB": 255}
"""Byte limits of MySQL/MariaDB text types that reflect without a length (the states are
ASCII: bytes are characters); the larger TEXT types hold any state."""


class _Row(NamedTuple):
    state: str
    owner: str | None
    updated: Any
    xid: Any = None
    """PostgreSQL: the id of the transaction that took the lock (``txid_current()``)."""


_LOCK_LOST = "kafka-txn: the transaction that locked the state row ended, now in "
"""What the state write's guard on PostgreSQL makes the database say (an invalid integer,
SQLSTATE 22P02) when it runs in another transaction than the one that took the lock."""

_BODY_RULE = (
    "The Kafka transaction is aborted, so nothing of it is visible. The body must "
    "leave the transaction to the writer: no COMMIT, ROLLBACK or autocommit switch in it"
)


class DualWriteTransaction:
    """What the body of ``writer.transaction()`` gets: ``connection``, the live database
    connection in its open transaction, and ``produce``/``send``, the producer's own
    methods (same signatures and errors as ``TransactionalProducer``)."""

    def __init__(self, connection: Connection, producer: TransactionalProducer) -> None:
        self.connection = connection
        self.produce = producer.produce
        self.send = producer.send


class _CompletionMarks:
    """Stores ``state.mark_completed()`` for the last transaction committed to Kafka.

    Until then the state row holds that transaction's plain state, which recovery can
    settle only while Kafka still remembers it: an epoch bump (librdkafka's KIP-360 abort,
    a later transaction timing out) or the transactional id expiring
    (``transactional.id.expiration.ms``) would leave it unprovable. The next transaction's
    state write replaces the row anyway (``superseded``, no extra round trip); otherwise
    ``write`` runs ``delay`` seconds after the commit in a background thread, and
    ``flush()`` runs it at once (before an abort, at close). ``write`` is a compare-and-set,
    so it never overwrites a newer state, and running it twice is harmless."""

    def __init__(
        self,
        write: Callable[[PreparedTxnState, Connection | None], object],
        delay: float | None,
        name: str,
    ) -> None:
        self._write = write
        self._delay = delay
        self._name = name
        self._cond = threading.Condition()
        self._pending: PreparedTxnState | None = None
        self._due = 0.0
        self._held = False
        self._idle = False
        self._closed = False
        self._failures = 0
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> PreparedTxnState | None:
        """The committed state not yet stored marked completed, if any."""
        return self._pending

    def committed(self, state: PreparedTxnState) -> None:
        """``state``'s transaction is committed in Kafka: mark it completed soon."""
        with self._cond:
            self._pending = state
            self._failures = 0
            if self._delay is None or self._closed:
                return
            self._due = time.monotonic() + self._delay
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"kafka-txn-mark-completed-{self._name}", daemon=True
                )
                self._thread.start()
            elif self._idle:
                self._cond.notify()

    def hold(self) -> None:
        """A transaction of this writer is under way: it carries the duty (its state
        write supersedes the mark; its rollback flushes it before aborting Kafka)."""
        with self._cond:
            self._held = True

    def release(self, superseded: bool) -> None:
        """The transaction ended; ``superseded`` if its database commit replaced the
        state row (then the pending mark is moot)."""
        with self._cond:
            self._held = False
            if superseded:
                self._pending = None
            elif self._pending is not None and self._idle:
                self._cond.notify()

    def flush(self, conn: Connection | None = None) -> bool:
        """Store the pending mark now (through ``conn``, idle, if given: a rollback
        must not wait for a second connection from a pool of one); False if that failed
        (logged)."""
        with self._cond:
            state = self._pending
        return state is None or self._store(state, conn)

    def close(self) -> bool:
        """Stop the background thread, then flush; False if the mark could not be
        stored."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        return self.flush()

    def _store(self, state: PreparedTxnState, conn: Connection | None = None) -> bool:
        try:
            self._write(state, conn)
        except (SQLAlchemyError, KafkaTxnError) as exc:
            with self._cond:
                self._failures += 1
            log.warning(
                "could not store the completed state of %r's last transaction (%s); it is "
                "tried again later, at the next abort, and at close()", self._name, exc,
                extra={"transactional_id": self._name, "operation": "mark_completed"},
            )  # fmt: skip
            return False
        with self._cond:
            if self._pending is state:
                self._pending = None
        return True

    def _run(self) -> None:
        cond = self._cond
        with cond:
            while not self._closed:
                if self._pending is None or self._held:
                    self._idle = True
                    cond.wait()
                    self._idle = False
                    continue
                wait = self._due - time.monotonic()
                if wait > 0:
                    cond.wait(wait)
                    continue
                state = self._pending
                cond.release()
                try:
                    stored = self._store(state)
                finally:
                    cond.acquire()
                if not stored and self._pending is state and self._delay is not None:
                    # Back off while the database is unreachable: delay * 2^n, up to 60 s.
                    backoff = min(60.0, self._delay * 2 ** min(self._failures, 16))
                    self._due = time.monotonic() + backoff


class _StateRow:
    """This writer's row of the state table, and every statement on it: the lock (with
    its bounded wait), the reads and writes, and the owner column's upgrade. The
    statements are built once, so SQLAlchemy reuses their compiled form. Table and column
    names come validated (``validate_identifier``) and are quoted by SQLAlchemy."""

    def __init__(
        self,
        engine: Engine,
        transactional_id: str,
        owner: str,
        *,
        state_table: str,
        id_column: str,
        state_column: str,
        updated_column: str,
        owner_column: str,
        lock_timeout: float | None,
    ) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.pipelined = pipelining(engine)
        """BEGIN goes with the lock, the state write with the COMMIT: one round trip
        each (PostgreSQL with psycopg 3, ``kafka_txn.dualwrite.pg_pipeline``)."""
        self.transactional_id = transactional_id
        self.owner = owner
        self.lock_timeout = lock_timeout
        self.table = Table(
            state_table,
            MetaData(),
            Column(id_column, exact_string(255), primary_key=True),  # ids are case-sensitive
            Column(state_column, String(MAX_SERIALIZED_LENGTH), nullable=False),
            Column(updated_column, DateTime),
            Column(owner_column, String(_OWNER_LENGTH)),
        )
        c = self.table.c
        self._id, self._state = c[id_column], c[state_column]
        self._updated, self._owner = c[updated_column], c[owner_column]
        self._mariadb_lock: Any = None
        """The lock statement on MariaDB, with its own lock waits (``_lock_mysql``)."""
        self._build_statements()

    def ensure(self, create: bool) -> None:
        """The table (if ``create``), its owner column, and this writer's row exist, and
        its state column can hold this writer's states."""
        if create:
            create_table_if_missing(self.engine, self.table)  # safe against racing writers
        columns = inspect(self.engine).get_columns(self.table.name)
        self._check_state_column(columns)
        self._check_id_column()
        self._ensure_owner_column(create, {col["name"] for col in columns})
        self._ensure_row()

    def _check_id_column(self) -> None:
        """Refuse an id column that compares ids inexactly (a table made by hand, or by
        an earlier kafka-txn on MySQL/MariaDB, whose default collations ignore case):
        ``Orders-1`` and ``orders-1`` would share one row and fence each other."""
        with self.engine.connect() as conn:
            why = inexact(conn, self.table, self._id.name)
            fix = None if why is None else fix_statement(conn, self.table, self._id.name)
            padded = self.transactional_id.endswith(" ") and pads(conn, self.table, self._id.name)
        if fix is not None:
            raise ConfigurationError(
                f"the id column {self._id.name!r} of the state table {self.table.name} does "
                f"not compare transactional ids exactly: {why}, so {self.transactional_id!r} "
                "would share its row with the ids the column does not tell apart from it "
                "(Orders-1 and orders-1), and the writers of both would fence each other. "
                f"Kafka transactional ids are case-sensitive: run `{fix}` (it fails while "
                "two rows differ only that way), or give the writer another state_table"
            )
        if padded:
            raise ConfigurationError(
                f"transactional id {self.transactional_id!r} ends in a space, which the "
                f"collation of {self.table.name}.{self._id.name} ignores (PAD SPACE): it "
                "would share its row with the id without it. Use an id without trailing "
                "spaces"
            )

    def _check_state_column(self, columns: list[Any]) -> None:
        """Refuse a state column too short for the longest state this writer can store
        (a table made by hand or by another tool): MySQL/MariaDB outside strict mode
        truncate a longer value with a mere warning, and a state cut short can make
        recovery read a committed transaction as a later one and abort it."""
        longest = PreparedTxnState(
            transactional_id=self.transactional_id, producer_id=(1 << 63) - 1,
            producer_epoch=(1 << 15) - 1, txn_start_ms=(1 << 63) - 1, cluster_id="c" * 64,
            timeout_ms=(1 << 31) - 1,
        ).mark_completed()  # fmt: skip
        for col in columns:
            length = getattr(col["type"], "length", None)
            if length is None:  # MySQL/MariaDB's TINYTEXT: 255 bytes, no declared length
                length = _TEXT_LIMITS.get(type(col["type"]).__name__.upper())
            # MySQL/MariaDB column names ignore case: the writer's statements use this one.
            same = col["name"].lower() == self._state.name.lower()
            if not same or length is None or self.dialect == "sqlite":
                continue  # SQLite does not enforce a declared length
            need = len(str(longest))
            if length < need:
                raise ConfigurationError(
                    f"the state column {self._state.name!r} of {self.table.name} holds at "
                    f"most {length} characters, and the states of {self.transactional_id!r} "
                    f"take up to {need}: a state cut short (MySQL/MariaDB outside strict "
                    "mode truncate it with a warning) could make recovery abort a "
                    "transaction the database committed. Widen it to "
                    f"VARCHAR({MAX_SERIALIZED_LENGTH}) (the size the writer creates); a state "
                    "stored while it was narrower may be cut short: check the row before "
                    "starting a writer"
                )

    def _build_statements(self) -> None:
        """Statements built once: SQLAlchemy then reuses their compiled form."""
        row = (self._state, self._owner, self._updated)
        where = self._id == bindparam("tid")
        self._select_row = select(*row).where(where)
        if self.dialect == "sqlite":
            # A write takes SQLite's RESERVED lock at once; the read follows.
            self._lock_statement: Any = (
                update(self.table).where(where).values({self._updated: self._updated})
            )
        elif self.dialect == "postgresql":
            # The lock also reads the id of the transaction that takes it (a row lock
            # assigns one anyway), for the state write's guard (below).
            filters: list[Any] = [where]
            if self.lock_timeout is not None:
                # set_config(..., true) is SET LOCAL lock_timeout, in the same round trip:
                # the filter runs on the row before LockRows waits for its lock, and
                # PostgreSQL reads lock_timeout when a wait begins (ProcSleep,
                # src/backend/storage/lmgr/proc.c). A volatile function is never folded
                # or skipped.
                bound = func.set_config("lock_timeout", bindparam("lock_ms"), True)
                filters.append(bound.is_not(None))
            self._lock_statement = (
                select(*row, func.txid_current()).where(*filters).with_for_update()
            )
        else:
            self._lock_statement = self._select_row.with_for_update()
        self._write_statement = (
            update(self.table)
            .where(where, *self._same_transaction())
            .values({self._state: bindparam("state"), self._updated: func.now()})
        )
        self._settle_statement = (
            update(self.table)
            .where(where)
            .values(
                {
                    self._state: bindparam("state"),
                    self._owner: bindparam("owner"),
                    self._updated: func.now(),
                }
            )
        )
        self._mark_statement = (
            update(self.table)
            .where(where, self._state == bindparam("committed"))
            .values({self._state: bindparam("completed"), self._updated: func.now()})
        )

    def _same_transaction(self) -> list[Any]:
        """PostgreSQL: the state write's guard that it runs in the transaction that took
        the lock. A body that sent ROLLBACK (or COMMIT) then BEGIN as SQL leaves the
        session in a transaction again, without the lock and without what it wrote
        before; the guard then fails the UPDATE with an error (``_LOCK_LOST``), which
        also keeps the COMMIT pipelined after it from running: a row count of 0 would
        come too late for that. No round trip of its own; the failing branch calls
        ``txid_current()`` so that the planner cannot evaluate it ahead of the test."""
        if self.dialect != "postgresql":
            return []
        now = func.txid_current()
        lost: Any = literal_column(f"'{_LOCK_LOST}'") + cast(now, String)
        ok = case((now == bindparam("xid", type_=BigInteger), literal_column("'1'")), else_=lost)
        return [cast(ok, Integer) == literal_column("1")]

    def lock_lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the state write's guard failing (``_same_transaction``)."""
        return isinstance(exc, DBAPIError) and _LOCK_LOST in str(exc.orig)

    def _ensure_owner_column(self, create: bool, columns: set[str]) -> None:
        """Add the owner column to a state table created before it existed. Safe when
        several writers start at once (``_ddl.add_column_if_missing``)."""
        if self._owner.name in columns:
            return
        ddl = add_column_statement(self.engine, self.table, self._owner)
        if not create:
            raise ConfigurationError(
                f"the state table {self.table.name} has no owner column "
                f"{self._owner.name!r}, which fences a writer replaced by a newer one: run "
                f"`{ddl}` (or pass create_state_table=True to let the writer add it)"
            )

        @contextmanager
        def bounded(conn: Connection) -> Iterator[None]:
            self._bound_lock_wait(conn)  # also bounds metadata-lock waits on MySQL/MariaDB
            yield

        try:
            add_column_if_missing(self.engine, self.table, self._owner, session=bounded)
        except DBAPIError as exc:
            ended = self._lock_wait_ended(exc, "start() adding the owner column")
            if ended is None:
                raise
            raise ended from exc

    def _ensure_row(self) -> None:
        try:
            with self.engine.begin() as conn:
                row = conn.execute(select(self._id).where(self._id == self.transactional_id))
                if self.dialect != "sqlite":  # sqlite3 begins only before a write
                    self._require_transaction(conn)
                if row.first():
                    return
                self._bound_lock_wait(conn, fresh=True)
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(self.table).values(
                                {self._id: self.transactional_id, self._state: "",
                                 self._updated: func.now()}
                            )
                        )  # fmt: skip
                except IntegrityError:
                    pass  # another instance inserted it first
        except DBAPIError as exc:
            ended = self._lock_wait_ended(exc, "start() creating the state row")
            if ended is None:
                raise
            raise ended from exc

    def lock(self, conn: Connection, decision: Decision | None = None) -> _Row:
        """Lock this writer's state row for the rest of the DB transaction (SELECT ...
        FOR UPDATE; on SQLite a write, which takes its RESERVED lock at once) and read
        it, waiting at most ``lock_timeout``. With the transaction's ``decision``, the
        lock goes with the BEGIN (one round trip on PostgreSQL with psycopg 3)."""
        params = self._lock_params()
        try:
            if self.dialect == "sqlite":
                self._bound_lock_wait(conn)
                conn.execute(self._lock_statement, params)
                row = conn.execute(self._select_row, params).first()
            elif self.dialect != "postgresql":
                row = self._lock_mysql(conn, params)
            elif decision is not None:
                row = decision.lock(self._lock_statement, params)
            else:
                row = conn.execute(self._lock_statement, params).first()
        except DBAPIError as exc:
            ended = self._lock_wait_ended(exc, "the state-row lock", conn=conn)
            if ended is None:
                raise
            raise ended from exc
        self._require_transaction(conn)
        if row is None:
            raise ConfigurationError(
                f"state row for {self.transactional_id!r} is missing from "
                f"{self.table.name}: call start() (or create it) first"
            )
        xid = tuple(row)[3] if len(row) > 3 else None  # PostgreSQL's lock reads it
        return _Row(str(row[0]), row[1], row[2], xid)

    def _lock_mysql(self, conn: Connection, params: dict[str, Any]) -> Any:
        """The lock on MySQL/MariaDB, its wait bounded by ``lock_timeout`` whatever the
        session's own setting: the transaction's SQL (the body's included) by the session
        setting, once per pooled connection, and the lock statement by its own: on
        MariaDB ``SET STATEMENT ... FOR`` (no round trip), on MySQL, which cannot set
        ``innodb_lock_wait_timeout`` for one statement (SET_VAR does not take it), the
        session setting again. A body may have changed the session's setting, which
        stays on the pooled connection."""
        if self.lock_timeout is None:
            self._bound_lock_wait(conn)  # undoes another writer's bound on this connection
            return conn.execute(self._lock_statement, params).first()
        if not conn.dialect.is_mariadb:  # type: ignore[attr-defined]
            self._bound_lock_wait(conn, fresh=True)
            return conn.execute(self._lock_statement, params).first()
        self._bound_lock_wait(conn)
        if self._mariadb_lock is None:
            seconds = max(1, math.ceil(self.lock_timeout))
            q = conn.dialect.identifier_preparer.quote  # names validated at construction
            self._mariadb_lock = text(
                f"SET STATEMENT innodb_lock_wait_timeout={seconds}, "
                f"lock_wait_timeout={seconds} FOR SELECT {q(self._state.name)}, "
                f"{q(self._owner.name)}, {q(self._updated.name)} FROM {q(self.table.name)} "
                f"WHERE {q(self._id.name)} = :tid FOR UPDATE"
            )
        return conn.execute(self._mariadb_lock, params).first()

    def _require_transaction(self, conn: Connection) -> None:
        """Refuse a connection in autocommit mode: each statement would commit on its
        own, so the state-row lock would not be held and the body's rows would stay
        committed when Kafka aborts."""
        if _in_transaction(conn) is False:
            raise ConfigurationError(
                f"the database connection of the DualWriter for {self.transactional_id!r} "
                "is in autocommit mode (isolation_level='AUTOCOMMIT' on the engine or "
                "connection, or the driver's autocommit switched on): every statement "
                "would commit on its own, so the state row would not stay locked and your "
                "rows would stay in the database if Kafka aborts. Nothing was written. "
                "Pass an engine with transactions, e.g. "
                "engine.execution_options(isolation_level='READ COMMITTED')"
            )

    def body_ended_transaction(self, conn: Connection) -> ConfigurationError | None:
        """The error for a body that ended the database transaction itself (a COMMIT,
        ``SET autocommit = 1``, which commits on MySQL/MariaDB), seen after it ran: its
        statements so far are committed, and the rest would not be atomic with Kafka."""
        if _in_transaction(conn) is not False:
            return None
        return ConfigurationError(
            f"the database transaction of the DualWriter for {self.transactional_id!r} "
            "was no longer open after its body ran: the body ended it (a COMMIT, SET "
            "autocommit = 1, or the driver's autocommit switched on), so what it wrote "
            "until then may be committed and stay in the database, and the rest ran "
            "statement by statement; or the database rolled it back after an error. "
            f"{_BODY_RULE}"
        )

    def body_began_another(self, how: str) -> ConfigurationError:
        """The error for a body that ended the database transaction holding the
        state-row lock and went on in a new one (``how``): what it wrote before may be
        committed, what it wrote after is rolled back, the lock was released between."""
        return ConfigurationError(
            f"the body of a transaction of the DualWriter for {self.transactional_id!r} "
            f"ended the database transaction that held the state-row lock ({how}): what "
            "it wrote before may be committed and stay in the database (a COMMIT), or is "
            "undone (a ROLLBACK), and the lock was released; what it wrote after ran in a "
            "new transaction, which the writer rolled back. " + _BODY_RULE
        )

    def kept_non_transactional(self, conn: Connection) -> bool:
        """MySQL/MariaDB, right after the writer's ROLLBACK: whether it warned that
        rows of non-transactional tables (MyISAM, Aria, MEMORY) could not be rolled back
        (ER_WARNING_NOT_COMPLETE_ROLLBACK, 1196). A round trip on the failure path only,
        on the DBAPI connection (SQLAlchemy would begin a transaction for it)."""
        if self.dialect not in ("mysql", "mariadb") or conn.invalidated or conn.closed:
            return False
        try:
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cursor.execute("SHOW WARNINGS")
                codes = {row[1] for row in cursor.fetchall()}
            finally:
                cursor.close()
        except Exception as exc:
            log.warning("could not read the warnings of the database rollback: %s", exc)
            return False
        return _NOT_COMPLETE_ROLLBACK in codes

    def settle(self, conn: Connection, state: PreparedTxnState) -> None:
        """start(): store the settled state and this writer as the row's owner."""
        conn.execute(
            self._settle_statement,
            {"tid": self.transactional_id, "state": str(state), "owner": self.owner},
        )

    def decision(self, conn: Connection) -> Decision:
        """The state write and COMMIT of a transaction on ``conn`` (one round trip on
        PostgreSQL with psycopg 3: ``kafka_txn.dualwrite.pg_pipeline``)."""
        return Decision(conn, self.pipelined)

    def write(self, decision: Decision, state: PreparedTxnState, locked: _Row) -> None:
        """A transaction's decision: its prepared state, in its database transaction
        (queued, on PostgreSQL, to go with the COMMIT), which must still be the one that
        took the lock (``locked``; checked on PostgreSQL, ``_same_transaction``)."""
        params: dict[str, Any] = {"tid": self.transactional_id, "state": str(state)}
        if self.dialect == "postgresql":
            params["xid"] = locked.xid
        decision.execute(self._write_statement, params)

    def store_completed(self, state: PreparedTxnState, conn: Connection | None = None) -> bool:
        """``UPDATE ... SET state = state.mark_completed() WHERE state = state``: a
        compare-and-set that never overwrites a newer state, in a transaction of its own
        on ``conn`` (idle) or on a connection of the pool. True if it wrote."""
        if conn is None:
            with self.engine.connect() as own:
                return self.store_completed(state, own)
        conn.begin()
        try:
            self._bound_lock_wait(conn, fresh=True)
            result = conn.execute(
                self._mark_statement,
                {"tid": self.transactional_id, "committed": str(state),
                 "completed": str(state.mark_completed())},
            )  # fmt: skip
            conn.commit()
        except DBAPIError:
            conn.rollback()
            raise
        return result.rowcount == 1

    def read_unlocked(self, conn: Connection | None = None) -> _Row | None:
        """The state row as last committed, read without waiting for its lock (MVCC on
        PostgreSQL and MariaDB; SQLite readers share the file with a RESERVED lock), on
        ``conn`` (whose transaction this rolls back) or on a connection of the pool."""
        try:
            if conn is None:
                with self.engine.connect() as own:
                    return self.read_unlocked(own)
            conn.rollback()
            row = conn.execute(self._select_row, {"tid": self.transactional_id}).first()
            conn.rollback()
        except SQLAlchemyError as exc:
            log.debug("could not read the state row without its lock: %s", exc)
            return None
        return None if row is None else _Row(str(row[0]), row[1], row[2])

    def _lock_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"tid": self.transactional_id}
        if self.dialect == "postgresql" and self.lock_timeout is not None:
            params["lock_ms"] = str(max(1, math.ceil(self.lock_timeout * 1000)))
        return params

    def _bound_lock_wait(self, conn: Connection, *, fresh: bool = False) -> None:
        """Bound the lock waits of ``conn``'s transaction by ``lock_timeout``, where the
        lock statement does not do it itself: PostgreSQL ``SET LOCAL lock_timeout``;
        MySQL/MariaDB ``SET SESSION`` both ``innodb_lock_wait_timeout`` (row locks) and
        ``lock_wait_timeout`` (metadata locks: a table locked by ``LOCK TABLES`` or an
        ``ALTER TABLE``, whose default wait is a year on MySQL, a day on MariaDB), whole
        seconds, at least 1, once per pooled connection unless ``fresh`` (a body may
        have set its own since); SQLite's busy timeout, every time (in-process)."""
        timeout = self.lock_timeout
        if timeout is None:
            if conn.info.pop("kafka_txn.lock_timeout", None) is not None:
                # Another writer on this engine bounded this pooled connection's session:
                # back to the database's own setting, as lock_timeout=None promises.
                conn.execute(
                    text("SET SESSION innodb_lock_wait_timeout = DEFAULT, "
                         "lock_wait_timeout = DEFAULT")
                )  # fmt: skip
            return
        ms = max(1, math.ceil(timeout * 1000))
        if self.dialect == "postgresql":
            conn.execute(text("SELECT set_config('lock_timeout', :ms, true)"), {"ms": str(ms)})
            return
        if self.dialect == "sqlite":  # in-process, no round trip: every time
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(ms)}")
            return
        if conn.info.get("kafka_txn.lock_timeout") == ms and not fresh:
            return
        conn.execute(
            text("SET SESSION innodb_lock_wait_timeout = :s, lock_wait_timeout = :s"),
            {"s": max(1, math.ceil(timeout))},
        )
        conn.info["kafka_txn.lock_timeout"] = ms

    def _lock_wait_ended(
        self, exc: DBAPIError, waiting_for: str, conn: Connection | None = None
    ) -> TransactionAbortableError | None:
        """The lock-timeout error for ``exc`` from a statement that waits for a lock, if
        the wait ran out or the database cancelled it; None for any other error."""
        timed_out = _is_lock_timeout(exc)
        if not (timed_out or _is_cancelled(exc)):
            return None
        return self._lock_timed_out(waiting_for, cancelled=not timed_out, conn=conn)

    def _lock_timed_out(
        self, waiting_for: str, *, cancelled: bool = False, conn: Connection | None = None
    ) -> TransactionAbortableError:
        """The error for a lock wait that outlasted ``lock_timeout`` (or that the
        database ``cancelled`` first: the session's statement timeout, a cancel request):
        the writer stays usable and nothing was written, so the caller may retry once the
        holder is gone. The owner is read on ``conn``, the waiting transaction's own
        connection (rolled back), if given: a pool of one has no second one."""
        tid = self.transactional_id
        row = self.read_unlocked(conn)
        if row is None:
            holder = "the row's owner could not be read (no row yet, or the read failed)"
        elif row.owner == self.owner:
            holder = (
                f"the row's owner is this writer ({self.owner!r}), so the holder is a "
                "session that is not a DualWriter of this id, or one that never wrote "
                f"its owner; state row last written at {row.updated}"
            )
        else:
            holder = (
                f"the row's owner is {row.owner!r} (host:pid:instance), state row last "
                f"written at {row.updated}"
            )
        where = (
            "SQLite locks the whole database file, so the holder may be any writer of it"
            if self.dialect == "sqlite"
            else "another database session holds it"
        )
        waited = (
            "until the database cancelled the statement (the session's statement "
            "timeout, or a cancel request)"
            if cancelled
            else "the database's own lock timeout"
            if self.lock_timeout is None
            else f"lock_timeout={self.lock_timeout:g}s"
        )
        message = (
            f"waited {waited} for {waiting_for} of transactional "
            f"id {tid!r} in {self.table.name} ({where}); {holder}. Nothing was written. "
            "If that writer is hung, stop its process (or end its database session), then "
            "retry; two live DualWriters with one transactional id cannot both work: the "
            "newer start() fences the older"
        )
        return TransactionAbortableError(message, kafka_error=KafkaError(KafkaError._TIMED_OUT))


class DualWriter:
    """Writes to a SQL database and Kafka in one atomic step (see the module docstring).

    ``database`` is a JDBC URL (``jdbc:postgresql://...``, ``jdbc:mysql://...``,
    ``jdbc:mariadb://...``, ``jdbc:sqlite:path``), a SQLAlchemy URL, or an Engine.
    ``producer_config`` and the producer's keyword arguments (``key_serializer`` to
    ``sleep``) as for ``TransactionalProducer``; two-phase commit is turned on.
    ``on_step(step)`` is called after each step of ``STEPS``.

    ``lock_timeout`` (seconds, default 30; None: the database's own setting) bounds every
    wait for the state-row lock; when it runs out, ``TransactionAbortableError`` names the
    transactional id and the row's owner, and nothing has been written.
    ``mark_completed_after`` (seconds, default 1; None: only at the next transaction, an
    abort, or ``close()``) is how soon after a commit its state is stored marked completed.
    ``owner`` is this instance's token (``host:pid:uuid8``), stored in ``owner_column``.
    """

    def __init__(
        self,
        producer_config: Mapping[str, Any] | ProducerSettings,
        database: str | URL | Engine,
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
        # TransactionalProducer's keyword arguments, passed on as they are:
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
        operation_timeout: float | None = None,
        queue_full_timeout: float = 60.0,
        prepare_min_time_left: float | None = None,
        metrics: MetricsHook | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        conf = (
            producer_config.to_librdkafka()
            if isinstance(producer_config, ProducerSettings)
            else dict(producer_config)
        )
        conf[TWO_PHASE_COMMIT_KEY] = True
        lock_timeout = validate_seconds(lock_timeout, "lock_timeout")
        delay = validate_seconds(mark_completed_after, "mark_completed_after")
        self.engine = engine_for(database, user, password)
        dialect = self.engine.dialect.name
        if dialect not in ("postgresql", "mysql", "mariadb", "sqlite"):
            raise ConfigurationError(
                f"database dialect {dialect!r} is not supported: use PostgreSQL, "
                "MySQL/MariaDB or SQLite"
            )
        names = {"state_table": state_table, "id_column": id_column,
                 "state_column": state_column, "updated_column": updated_column,
                 "owner_column": owner_column}  # fmt: skip
        for what, name in names.items():  # before the producer exists
            validate_identifier(name, what)
        self._create = create_state_table
        self._on_step = on_step
        self.producer = TransactionalProducer(  # validates conf
            conf,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
            operation_timeout=operation_timeout,
            queue_full_timeout=queue_full_timeout,
            prepare_min_time_left=prepare_min_time_left,
            metrics=metrics,
            sleep=sleep,
        )
        self.transactional_id = self.producer.transactional_id
        self.owner = _owner_token()
        """This instance's owner token, written to the state row by ``start()``."""
        self._row = _StateRow(
            self.engine, self.transactional_id, self.owner, lock_timeout=lock_timeout, **names
        )
        self.state_table = self._row.table
        single_connection = isinstance(self.engine.pool, (SingletonThreadPool, StaticPool))
        self._single_connection = single_connection
        self._watch = RollbackWatch(self.engine)
        self._marks = _CompletionMarks(
            self._row.store_completed,
            None if single_connection else delay,  # no second connection for a thread
            self.transactional_id,
        )
        self._started = False
        self._fenced: TransactionOutcome | None = None
        """start() initialised transactions, then failed releasing the lock."""
        self._broken: KafkaTxnError | None = None
        self._serial = threading.Lock()
        """One start() or transaction() of this writer at a time: it has one producer,
        which has one transaction (other threads wait their turn)."""
        self._serial_thread: int | None = None
        self._unresolved: str | None = None
        self._resolved: str | None = None
        """The unresolved state resolve() accepted: start() leaves it in the row, for the
        first transaction that commits to replace, with the re-sent records."""
        """The stored state the last start() could not settle (diverged, unknowable)."""
        self._after_settle: Callable[[], None] | None = None
        """Test hook: called in start() between the settle commit and the fence."""

    @property
    def lock_timeout(self) -> float | None:
        """The bound on every wait for the state-row lock, in seconds (None: unbounded
        here, the database's own setting)."""
        return self._row.lock_timeout

    def __repr__(self) -> str:
        # The URL through redact_jdbc_url: Engine.url hides its password, not a
        # password-like query parameter (libpq's sslpassword, say). No producer settings.
        engine = getattr(self, "engine", None)
        url = None if engine is None else engine.url.render_as_string(hide_password=True)
        state = (
            "broken" if getattr(self, "_broken", None) is not None
            else "started" if getattr(self, "_started", False)
            else "not started"
        )  # fmt: skip
        return (
            f"DualWriter(transactional_id={getattr(self, 'transactional_id', None)!r}, "
            f"database={redact_jdbc_url(url)!r}, owner={getattr(self, 'owner', None)!r}, "
            f"{state})"
        )

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> TransactionOutcome:
        """Recover what a predecessor left, take ownership of the transactional id, then
        initialise transactions (fencing the predecessor in Kafka).

        May be called again after it raised (``TransactionOutcomeUnknownError``: the
        coordinator did not answer; a lock timeout): it then starts over."""
        with self._exclusive("start()"):
            return self._start()

    @contextmanager
    def _exclusive(self, call: str) -> Iterator[None]:
        """Run ``call`` alone among this writer's start() and transaction() calls;
        other threads wait. The same thread calling in again would deadlock: refused."""
        me = threading.get_ident()
        if self._serial_thread == me:
            raise IllegalStateError(
                f"{call} inside a transaction() of the same writer: finish that "
                "transaction first (one writer has one transaction at a time)"
            )
        bound = self.lock_timeout
        if not self._serial.acquire(timeout=-1 if bound is None else bound):
            raise TransactionAbortableError(
                f"{call} of the DualWriter for {self.transactional_id!r} waited "
                f"lock_timeout={bound:g}s for another thread's transaction of the same "
                "writer; nothing was written: retry, or give each thread a writer (and a "
                "transactional id) of its own"
            )
        try:
            self._serial_thread = me
            yield
        finally:
            self._serial_thread = None
            self._serial.release()

    def _start(self) -> TransactionOutcome:
        self._raise_if_broken()
        if self._started:
            raise ConfigurationError("start() was already called")
        if self._fenced is not None:
            return self._finish_start(self._fenced)
        self._row.ensure(self._create)
        self.producer.init_transactions(keep_prepared_txn=True)  # repeatable until settled
        with self.engine.connect() as conn:
            conn.begin()
            stored = PreparedTxnState(self._row.lock(conn).state)
            # A state resolve() accepted is not recovered again, nor stored completed: it
            # stays in the row until the first transaction that commits (the re-send of
            # its records) replaces it in the same database transaction, so a crash
            # before that leaves it unresolved, never resolved without its records.
            resolved = self._resolved == str(stored)
            if self._resolved is not None and not resolved:
                # Another writer moved the row on since resolve() (its own resolution and
                # re-send may have committed): re-sending here could duplicate records.
                accepted, self._resolved = self._resolved, None
                raise InvalidPreparedStateError(
                    f"start(): the state resolve() accepted ({accepted!r}) is no longer in "
                    f"the state row of {self.transactional_id!r}, which holds {str(stored)!r}: "
                    "another writer moved on since (it may have re-sent the records). Do not "
                    "re-send them: call start() again and handle what it reports"
                )
            kept = stored if resolved else stored.mark_completed()

            def settle(outcome: TransactionOutcome) -> None:
                # Recovery settled `stored`. Store it completed, and this writer as the
                # owner, before init_transactions() bumps the epoch: a crash from here on
                # cannot make recovery guess, and from this commit on the previous owner's
                # transactions fail their owner check.
                self._row.settle(conn, kept)
                conn.commit()
                if self._after_settle is not None:
                    self._after_settle()
                # Hold the lock again until the fence is in place, so that init runs only
                # if no other start() took the id over since (the last owner is the one
                # whose init ran last).
                conn.begin()
                self._check_owner(
                    self._row.lock(conn),
                    "start(): recovery is done, but this writer did not initialise transactions",
                )

            try:
                outcome = self.producer.complete_transaction(
                    PreparedTxnState("") if resolved else stored, before_init=settle
                )
            except (TransactionDivergedError, TransactionOutcomeUnknowableError):
                self._unresolved = str(stored)  # what resolve() may then be given
                raise
            # Recovered, settled and fenced: what is left (this COMMIT) only releases the
            # lock. If it fails (the session ended while init ran), start() again only
            # checks the ownership (_finish_start).
            self._fenced = outcome
            conn.commit()
        return self._started_as(outcome)

    def _finish_start(self, outcome: TransactionOutcome) -> TransactionOutcome:
        """start() again after one that initialised transactions (recovered, settled,
        fenced) and then failed at its last COMMIT, which only releases the lock: the
        row's owner must still be this writer. Its lock may have gone with its session
        before init returned, so another writer's start() may have taken the id over
        since: then this one is fenced (ProducerFencedError), and the other's own init,
        which ran after its owner commit, fences this producer in Kafka too."""
        with self.engine.connect() as conn:
            conn.begin()
            self._check_owner(
                self._row.lock(conn),
                "start(): this writer initialised transactions, but another took the id "
                "over before its start() completed",
            )
            conn.commit()
        return self._started_as(outcome)

    def _started_as(self, outcome: TransactionOutcome) -> TransactionOutcome:
        log.info(
            "dual writer %r started as %s: %s", self.transactional_id, self.owner,
            outcome.value,
            extra={"transactional_id": self.transactional_id, "outcome": outcome.value},
        )  # fmt: skip
        self._started = True
        self._fenced = None
        return outcome

    def resolve(self, stored_state: str | PreparedTxnState) -> None:
        """Accept a transaction recovery could not settle, for its records to be re-sent.

        After ``start()`` raised ``TransactionDivergedError`` or
        ``TransactionOutcomeUnknowableError``, find the rows of that transaction that a
        read_committed consumer does not show, call this with the error's
        ``stored_state``, call ``start()``, and re-send those records in the first
        transaction, which must commit before any other: its database commit replaces
        the stored state, so the state is settled together with the re-sent records. A
        crash before that commit leaves the state unresolved, and the next ``start()``
        reports it again (nothing is lost). Refused with ``InvalidPreparedStateError``
        if the state row holds another state (a newer writer moved on). Calling it again
        is harmless."""
        state = (
            stored_state
            if isinstance(stored_state, PreparedTxnState)
            else PreparedTxnState(stored_state)
        )
        if self._started:
            raise IllegalStateError(
                "resolve() is for a start() that raised; this writer has started"
            )
        if state.is_empty or state.completed:
            return
        if str(state) != self._unresolved:
            # Only a state recovery gave up on: any other (say, a TransactionInDoubtError's
            # prepared_state) may still be committed by recovery, and settling it by hand
            # would drop it.
            raise InvalidPreparedStateError(
                f"resolve() takes the stored_state of the TransactionDivergedError or "
                f"TransactionOutcomeUnknowableError that this writer's start() raised; "
                f"{str(state)!r} is not it: call start() first"
            )
        row = self._row.read_unlocked()
        if row is None or _normalized(row.state) != str(state):
            raise InvalidPreparedStateError(
                f"resolve(): the state row of {self.transactional_id!r} holds "
                f"{None if row is None else row.state!r}, not {str(state)!r}: another "
                "writer has moved on since; call start() and handle what it reports"
            )
        self._resolved = str(state)
        log.warning(
            "dual writer %r: %s resolved by hand; the first transaction that commits "
            "replaces it (re-send its records there)", self.transactional_id, state,
            extra={"transactional_id": self.transactional_id, "outcome": "resolved"},
        )  # fmt: skip

    def store_completed(self) -> bool:
        """Store the last commit's state marked completed now rather than within
        ``mark_completed_after`` (a compare-and-set, as always). False if the database
        refused (logged; the mark stays due). For callers that hand the transactional id
        to someone else next, such as a sink's driver checking what is unfinished. Also
        False, without a write, while a transaction of this writer runs on a
        one-connection pool (the write's COMMIT would commit that transaction's rows)."""
        if not self._single_connection:
            return self._marks.flush()
        if not self._serial.acquire(blocking=False):
            return False
        try:
            return self._marks.flush()
        finally:
            self._serial.release()

    def close(self) -> None:
        """Store the last commit's state marked completed, close the producer and the
        engine's pool. A transaction in flight aborts; a prepared or in-doubt one (the
        database may have committed it) is left for the next ``start()``. On a
        one-connection pool, a transaction in flight (another thread's) is rolled back by
        closing that connection, its Kafka transaction left for the next ``start()`` to
        abort, and the mark stays due: written through that connection, it would commit
        the transaction's rows."""
        # Before the producer's close, which aborts a transaction in flight and may bump
        # the epoch: if the mark cannot be stored, that transaction is left open instead
        # (the next start() settles the mark, then aborts it).
        idle = self._serial.acquire(blocking=False)  # no start()/transaction() under way
        try:
            if idle or not self._single_connection:
                marked = self._marks.close()
            else:
                # A transaction is under way on the pool's one connection (another thread,
                # or this one's body): a mark written through it would COMMIT that
                # transaction's rows. Leave both: disposing the pool closes the connection,
                # which rolls the database back, and the Kafka transaction is left to the
                # next start() (or transaction.timeout.ms), which aborts it.
                marked = False
                log.warning(
                    "close() of the DualWriter for %r during its transaction on a "
                    "one-connection pool: the open Kafka transaction is left to the next "
                    "start(), the last commit's completion mark stays due",
                    self.transactional_id,
                )
            try:
                self.producer._close(abort_open=marked)
            finally:
                # Also when close() raises a callback's exception: the pool and the
                # watch go all the same.
                self._watch.close()
                self.engine.dispose()
        finally:
            if idle:
                self._serial.release()

    def __enter__(self) -> DualWriter:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the recipe
    @contextmanager
    def transaction(self) -> Iterator[DualWriteTransaction]:
        """One atomic write to both systems; an exception in the body rolls both back.

        A writer runs one ``start()`` or ``transaction()`` at a time: other threads wait
        their turn (up to ``lock_timeout``), and ``transaction()`` inside its own body
        raises ``IllegalStateError``."""
        with self._exclusive("transaction()"):
            self._raise_if_broken()
            if not self._started:
                self._start()
            yield from self._transaction()

    def _transaction(self) -> Iterator[DualWriteTransaction]:
        producer = self.producer
        marks = self._marks
        marks.hold()
        committed = False
        began = False
        db_committed = False
        try:
            with self.engine.connect() as conn:
                # The transaction SQLAlchemy knows this one by: a body that commits or
                # rolls back through tx.connection ends it (a later statement autobegins
                # another), which the writer checks without a round trip.
                root = conn.begin()
                decision = self._row.decision(conn)
                try:
                    try:
                        locked = self._row.lock(conn, decision)
                        self._check_owner(locked, "nothing of this transaction was written")
                        producer.begin_transaction()
                        began = True
                        self._step("after_begin")
                        self._watch.watch(conn)
                        yield DualWriteTransaction(conn, producer)
                        self._step("after_send")
                        self._check_body_kept_transaction(conn, root)
                        state = producer.prepare_transaction()
                        self._step("after_prepare")
                        self._row.write(decision, state, locked)
                        self._step("after_state_write")
                    except BaseException as exc:
                        self._failed(conn, began, decision, exc, root)
                        raise
                    self._commit_database(conn, decision)
                    db_committed = True
                finally:
                    decision.finish()
                committed = True
        except BaseException as exc:
            if db_committed and self._broken is None:
                # Interrupted after the database COMMIT (restoring the connection's
                # autocommit): in doubt, as anything between the two commits.
                self._broken = self._in_doubt(state, exc)
            raise
        finally:
            marks.release(superseded=committed)
        self._commit_kafka(state)

    def _commit_kafka(self, state: PreparedTxnState) -> None:
        """The second commit, once the database committed."""
        try:
            # From here on the database may have decided: whatever goes wrong (an
            # exception from the hook, a KeyboardInterrupt, the Kafka commit) leaves the
            # transaction prepared for recovery and stops this writer, never aborts.
            self._step("after_db_commit")
            self.producer.complete_transaction(state)
        except BaseException as exc:
            self._broken = self._in_doubt(state, exc)
            if not isinstance(exc, Exception):
                raise
            cause = root_exception(exc) if isinstance(exc, KafkaTxnError) else exc
            raise self._broken from cause
        if not state.is_empty:
            self._marks.committed(state)
        try:
            self._step("after_kafka_commit")
        except BaseException as exc:
            # Both sides committed: nothing is in doubt and the writer goes on, but the
            # caller must not take the hook's exception for a failed transaction.
            _add_note(
                exc,
                f"kafka-txn: raised by the on_step hook at 'after_kafka_commit': the dual "
                f"write of {self.transactional_id!r} is committed in the database and in "
                "Kafka; do not retry it",
            )
            raise

    # ------------------------------------------------------------------ internals
    def _step(self, step: str) -> None:
        if self._on_step is not None:
            self._on_step(step)

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise self._broken.with_traceback(None)

    def _in_doubt(self, state: PreparedTxnState, exc: BaseException) -> TransactionInDoubtError:
        tid = self.transactional_id
        reason = exc.message if isinstance(exc, KafkaTxnError) else repr(exc)
        return TransactionInDoubtError(
            f"the dual write of {tid!r} is committed in the database, but its Kafka "
            f"commit did not complete ({reason}). The Kafka transaction is left prepared, "
            f"never aborted: close this writer; the next start() for {tid!r} commits it "
            "(a start() by another writer since then already did), or raises "
            "TransactionDivergedError if Kafka aborted it first (transaction.timeout.ms)",
            kafka_error=exc.kafka_error if isinstance(exc, KafkaTxnError) else None,
            prepared_state=str(state),
        )

    def _check_owner(self, row: _Row, consequence: str) -> None:
        """Under the row lock: the row's owner must be this writer. Otherwise a newer
        writer's start() took the id over, and this one is fenced for good."""
        if row.owner == self.owner:
            return
        tid = self.transactional_id
        self._broken = ProducerFencedError(
            f"another DualWriter for transactional id {tid!r} (owner {row.owner!r}) took "
            f"it over (state row last written at {row.updated}); this writer "
            f"({self.owner!r}) is fenced and must be closed; {consequence}",
            kafka_error=KafkaError(KafkaError.PRODUCER_FENCED),
        )
        raise self._broken

    def _failed(
        self,
        conn: Connection,
        began: bool,
        decision: Decision,
        exc: BaseException,
        root: Transaction,
    ) -> None:
        """The transaction failed before its database commit: roll both back. If the
        body had ended the database transaction itself, say so (chaining its error):
        the database keeps part of what it wrote; so if the rollback left rows of
        non-transactional tables (MySQL/MariaDB)."""
        self._watch.stop()
        ended: ConfigurationError | None = None
        if began and isinstance(exc, Exception) and type(exc) is not ConfigurationError:
            if self._row.lock_lost(exc):  # the state write's guard (PostgreSQL)
                ended = self._row.body_began_another("a ROLLBACK or COMMIT sent as SQL")
            else:
                ended = self._began_another(conn, root)
            # SQLite rolls a transaction back by itself after some errors (SQLITE_FULL,
            # SQLITE_IOERR), which SQLAlchemy's transaction does not show: there the
            # body's own error says more than the session's state.
            if ended is None and self._row.dialect != "sqlite":
                ended = self._row.body_ended_transaction(conn)
        decision.discard()
        kept = self._roll_back(conn, began, decision)
        if ended is not None:
            raise ended from exc
        if kept is not None and isinstance(exc, Exception):  # an interruption goes on
            raise kept from exc
        fatal = self.producer._life.fatal
        if self._broken is None and fatal is not None and isinstance(exc, Exception):
            # The writer cannot go on (its producer died with this transaction, or
            # before it): what to do now is the broken writer's error, not the advice
            # of the error that failed the transaction (kept as the context).
            self._broken = self._unusable(fatal)
            raise self._broken from root_exception(fatal)

    def _unusable(self, fatal: FatalError) -> FatalError:
        """The writer's error once its producer is unusable (fenced, not authorized, an
        abort the coordinator refused): a new writer is needed."""
        tid = self.transactional_id
        cls = ProducerFencedError if isinstance(fatal, ProducerFencedError) else FatalError
        return cls(
            f"the Kafka producer of the DualWriter for {tid!r} is unusable: "
            f"{fatal.message}. The database rolled this transaction back, and nothing of "
            f"its Kafka transaction is visible. Close this writer; unless another writer "
            f"now runs for {tid!r}, start a new one: its start() settles the last commit, "
            "then initialises the transactional id again",
            kafka_error=fatal.kafka_error,
        )

    def _began_another(self, conn: Connection, root: Transaction) -> ConfigurationError | None:
        """The error for a body that committed or rolled back through SQLAlchemy
        (``tx.connection.commit()``, ``.rollback()``): the connection's transaction is
        no longer ``root``, the one the writer began (none, or one begun since)."""
        if conn.get_transaction() is root:
            return None
        return self._row.body_began_another("tx.connection.commit() or .rollback()")

    def _check_body_kept_transaction(self, conn: Connection, root: Transaction) -> None:
        """After the body: its database transaction must still be the one that holds
        the state-row lock, neither rolled back by the database after an error the body
        caught, nor ended by the body itself (through SQLAlchemy: the connection's
        transaction is no longer ``root``; on PostgreSQL as SQL: the state write's guard
        fails). No round trip."""
        lost = self._watch.rolled_back()
        if lost is not None:
            raise TransactionAbortableError(
                f"the database rolled back the whole transaction of the DualWriter for "
                f"{self.transactional_id!r} after an error that the body caught ({lost}): "
                "what the body wrote before it is undone, and the state-row lock with it. "
                "Nothing of this transaction commits (the Kafka transaction is aborted, "
                "the database rolled back), so it may be retried as a whole. To skip a "
                "failing statement, run it in a savepoint "
                "(with tx.connection.begin_nested(): ...)"
            )
        ended = self._began_another(conn, root) or self._row.body_ended_transaction(conn)
        if ended is not None:
            raise ended

    def _roll_back(
        self, conn: Connection, began: bool, decision: Decision
    ) -> ConfigurationError | None:
        """The database did not commit: roll it back and abort the Kafka transaction
        this attempt began (never one it did not begin). Returns the error to raise if
        the rollback left the body's rows in non-transactional tables (MySQL/MariaDB)."""
        kept: ConfigurationError | None = None
        try:
            conn.rollback()
        except DBAPIError as exc:
            log.warning("database rollback failed: %s", exc)
        else:
            if began and self._row.kept_non_transactional(conn):
                kept = ConfigurationError(
                    f"the dual write of {self.transactional_id!r} failed and was rolled "
                    "back, but the database warned that changes to non-transactional "
                    "tables (MyISAM, Aria, MEMORY: warning 1196) could not be rolled back: "
                    "what the body wrote to them stays in the database, while nothing of "
                    "the Kafka transaction becomes visible. Write only to transactional "
                    "tables (ENGINE=InnoDB) in the body"
                )
        decision.finish()  # autocommit off again before the mark's transaction
        if began and self.producer.in_transaction:
            # The abort may bump the epoch (librdkafka's KIP-360 abort), after which the
            # coordinator no longer shows how the last commit ended: its state must be
            # stored completed first, or a later recovery could not tell it was settled.
            # Through this transaction's own connection, now idle: on a pool of one a
            # second connection would never come.
            if not self._marks.flush(conn):
                self._leave_open()
                return kept
            try:
                self.producer.abort_transaction()
            except FatalError as exc:  # _failed() raises the writer's error for it
                log.warning("Kafka abort after a failed dual write failed: %s", exc)
            except KafkaTxnError as exc:
                # Ran out of time (a broker away): the producer stays 'aborting', and the
                # next transaction's begin_transaction() finishes the abort first.
                log.warning(
                    "Kafka abort after a failed dual write did not complete (%s): the "
                    "next transaction finishes it first", exc,
                )  # fmt: skip
        return kept

    def _leave_open(self) -> None:
        """The last commit could not be stored completed: rather than abort (which may
        bump the epoch and make that commit unprovable), leave this transaction open and
        stop the writer. The next ``start()`` stores the mark, then fences, which aborts
        it; until then, or ``transaction.timeout.ms``, it holds back read_committed
        readers of its partitions."""
        tid = self.transactional_id
        self._broken = FatalError(
            f"the dual write of {tid!r} failed before its database commit, and the state "
            "of the last committed transaction could not be stored marked completed (the "
            "database refused or was unreachable; see the warning logged), so the open "
            "Kafka transaction was NOT aborted: an abort may bump the producer epoch, "
            "after which recovery could no longer prove that commit. Nothing of this "
            "transaction is visible, but until it ends read_committed consumers of the "
            "partitions it wrote to stop at its first record: it ends when the next "
            "start() aborts it, or when the coordinator does after transaction.timeout.ms. "
            f"Once the database answers, close this writer and start a new one for {tid!r}: "
            "its start() settles the last commit, then aborts this transaction"
        )

    def _commit_database(self, conn: Connection, decision: Decision) -> None:
        try:
            decision.commit()
        except DBAPIError as exc:
            if exc.connection_invalidated:
                # The COMMIT may or may not have happened: only the database knows.
                self._broken = DatabaseCommitUnknownError(
                    f"the database connection dropped during COMMIT ({exc.orig}); the "
                    "Kafka transaction stays prepared: restart the writer, whose start() "
                    "commits or aborts it to match the database"
                )
                raise self._broken from exc
            # The database refused: nothing committed (but rows of non-transactional
            # tables; on PostgreSQL the state write's guard may be what refused).
            kept = self._roll_back(conn, True, decision)
            if self._row.lock_lost(exc):
                raise self._row.body_began_another("a ROLLBACK or COMMIT sent as SQL") from exc
            if kept is not None:
                raise kept from exc
            raise
        except BaseException as exc:
            # Interrupted (KeyboardInterrupt, a timeout signal) while the COMMIT was under
            # way: whether it happened is unknown, so Kafka stays prepared and the writer
            # stops; the interruption itself goes on up.
            self._broken = DatabaseCommitUnknownError(
                f"interrupted during the database COMMIT ({exc!r}); the Kafka transaction "
                "stays prepared: restart the writer, whose start() commits or aborts it "
                "to match the database"
            )
            raise
