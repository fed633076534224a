"""This writer's row of the state table and every statement on it: the lock (SELECT ...
FOR UPDATE, on SQLite a write; its wait bounded by ``lock_timeout``), the reads, the
state write that is a transaction's decision (guarded, on PostgreSQL, to run in the
transaction that took the lock), ``start()``'s settle, and the completion mark's
compare-and-set. The schema checks at ``start()`` are in ``state_table``.
"""

from __future__ import annotations

import logging
import math
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
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from kafka_txn.dualwrite.engine import _in_transaction, _is_cancelled, _is_lock_timeout
from kafka_txn.dualwrite.exact_ids import exact_string
from kafka_txn.dualwrite.pg_pipeline import Decision, DriverStatements, pipelining
from kafka_txn.dualwrite.state_table import _StateTableChecks
from kafka_txn.errors import ConfigurationError, TransactionAbortableError
from kafka_txn.state import MAX_SERIALIZED_LENGTH, PreparedTxnState

log = logging.getLogger("kafka_txn.dualwrite")

_OWNER_LENGTH = 255
"""The owner column's length: the owner token (``host:pid:uuid8``) is cut to fit it."""


class _Row(NamedTuple):
    state: str
    owner: str | None
    updated: Any
    xid: Any = None
    """PostgreSQL: the id of the transaction that took the lock (``txid_current()``)."""


_LOCK_LOST = "kafka-txn: the transaction that locked the state row ended, now in "
"""What the state write's guard on PostgreSQL makes the database say (an invalid integer,
SQLSTATE 22P02) when it runs in another transaction than the one that took the lock."""


class _StateRow(_StateTableChecks):
    """This writer's row of the state table, and every statement on it: the lock (with
    its bounded wait), the reads and writes, and (``_StateTableChecks``) the table's
    checks and the owner column's upgrade. The statements are built once, so SQLAlchemy
    reuses their compiled form. Table and column names come validated
    (``validate_identifier``) and are quoted by SQLAlchemy."""

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
        self.driver: DriverStatements | None = (
            DriverStatements(
                engine, self._lock_statement, self._lock_params(), self._write_statement
            )
            if pipelining(engine)
            else None
        )
        """The lock and the state write as the driver runs them: BEGIN goes with the
        lock, the state write with the COMMIT, one round trip each, on the driver
        connection (PostgreSQL with psycopg 3, ``kafka_txn.dualwrite.pg_pipeline``);
        None: through SQLAlchemy, one by one."""

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

    def settle(self, conn: Connection, state: PreparedTxnState) -> None:
        """start(): store the settled state and this writer as the row's owner."""
        conn.execute(
            self._settle_statement,
            {"tid": self.transactional_id, "state": str(state), "owner": self.owner},
        )

    def decision(self, conn: Connection) -> Decision:
        """The state write and COMMIT of a transaction on ``conn`` (one round trip on
        PostgreSQL with psycopg 3: ``kafka_txn.dualwrite.pg_pipeline``)."""
        return Decision(conn, self.driver)

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
