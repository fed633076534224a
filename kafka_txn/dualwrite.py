"""Kafka and a SQL database, written atomically: KIP-939's dual-write recipe.

Each ``with writer.transaction() as tx:`` runs::

    DB: BEGIN; lock the state row          Kafka: begin_transaction()
    caller: SQL on tx.connection, tx.produce()/tx.send() to Kafka
    Kafka: prepare_transaction() -> state
    DB: UPDATE state row = state; COMMIT   <- the decision
    Kafka: complete_transaction(state)     (commit)

and ``start()`` first recovers what a crashed predecessor left: it reads the state row
(under the same lock) and lets ``complete_transaction`` commit the prepared transaction
if the database committed it, or abort it if not, before ``init_transactions()`` fences
the predecessor. The state row is locked for the whole transaction (SELECT ... FOR UPDATE
on PostgreSQL and MariaDB, an immediate write lock on SQLite), so two writers with one
transactional id take turns, and the one fenced by the other's recovery fails before it
can write anything.

If the database COMMIT's outcome is unknown (the connection dropped during it), Kafka is
never aborted: ``DatabaseCommitUnknownError`` is raised and the next ``start()`` decides
from the database.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    Column,
    DateTime,
    MetaData,
    String,
    Table,
    bindparam,
    create_engine,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, NoSuchModuleError

from .config import TWO_PHASE_COMMIT_KEY, ProducerSettings
from .errors import ConfigurationError, DatabaseCommitUnknownError, FatalError, KafkaTxnError
from .jdbc import jdbc_to_sqlalchemy
from .producer import TransactionalProducer
from .recovery import TransactionOutcome
from .state import MAX_SERIALIZED_LENGTH, PreparedTxnState

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


def validate_identifier(name: str, what: str) -> str:
    """A table or column name: letters, digits and ``_``, not starting with a digit, at
    most 63 characters. Names are also quoted by SQLAlchemy, never pasted into SQL."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ConfigurationError(
            f"{what} {name!r} is not a plain SQL identifier: use letters, digits and "
            "underscores, not starting with a digit, at most 63 characters"
        )
    return name


def engine_for(database: str | URL | Engine, user: str | None, password: str | None) -> Engine:
    """A SQLAlchemy Engine for a JDBC URL, a SQLAlchemy URL or an Engine (returned as is)."""
    if isinstance(database, Engine):
        return database
    if isinstance(database, URL):
        url = database
    elif isinstance(database, str) and database.startswith("jdbc:"):
        url = jdbc_to_sqlalchemy(database, user=user, password=password)
    elif isinstance(database, str):
        try:
            url = make_url(database)
        except Exception as exc:
            raise ConfigurationError(
                f"database {database!r} is neither a JDBC URL nor a SQLAlchemy URL: {exc}"
            ) from None
        if user is not None or password is not None:
            url = url.set(username=user or url.username, password=password or url.password)
    else:
        raise ConfigurationError(
            f"database must be a JDBC URL, a SQLAlchemy URL or Engine, got {type(database)}"
        )
    kwargs: dict[str, Any] = {}
    if url.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": 30}  # wait for the other writer's lock
    try:
        return create_engine(url, **kwargs)
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


class DualWriteTransaction:
    """What the body of ``writer.transaction()`` gets: ``connection``, the live database
    connection in its open transaction, and ``produce``/``send``, the producer's own
    methods (same signatures and errors as ``TransactionalProducer``)."""

    def __init__(self, connection: Connection, producer: TransactionalProducer) -> None:
        self.connection = connection
        self.produce = producer.produce
        self.send = producer.send


class DualWriter:
    """Writes to a SQL database and Kafka in one atomic step (see the module docstring).

    ``database`` is a JDBC URL (``jdbc:postgresql://...``, ``jdbc:mysql://...``,
    ``jdbc:mariadb://...``, ``jdbc:sqlite:path``), a SQLAlchemy URL, or an Engine.
    Producer settings as for ``TransactionalProducer``; two-phase commit is turned on.
    ``on_step(step)`` is called after each step of ``STEPS``.
    """

    def __init__(
        self,
        producer_config: dict[str, Any] | ProducerSettings,
        database: str | URL | Engine,
        *,
        user: str | None = None,
        password: str | None = None,
        state_table: str = "kafka_transaction_state",
        id_column: str = "transactional_id",
        state_column: str = "prepared_txn_state",
        updated_column: str = "updated_at",
        create_state_table: bool = True,
        on_step: Callable[[str], None] | None = None,
        **producer_options: Any,
    ) -> None:
        conf = (
            producer_config.to_librdkafka()
            if isinstance(producer_config, ProducerSettings)
            else dict(producer_config)
        )
        conf[TWO_PHASE_COMMIT_KEY] = True
        self.engine = engine_for(database, user, password)
        self._dialect = self.engine.dialect.name
        if self._dialect not in ("postgresql", "mysql", "mariadb", "sqlite"):
            raise ConfigurationError(
                f"database dialect {self._dialect!r} is not supported: use PostgreSQL, "
                "MySQL/MariaDB or SQLite"
            )
        metadata = MetaData()
        self.state_table = Table(
            validate_identifier(state_table, "state_table"),
            metadata,
            Column(validate_identifier(id_column, "id_column"), String(255), primary_key=True),
            Column(
                validate_identifier(state_column, "state_column"),
                String(MAX_SERIALIZED_LENGTH),
                nullable=False,
            ),
            Column(validate_identifier(updated_column, "updated_column"), DateTime),
        )
        self._id, self._state, self._updated = (
            self.state_table.c[id_column],
            self.state_table.c[state_column],
            self.state_table.c[updated_column],
        )
        # Statements built once: SQLAlchemy then reuses their compiled form.
        where = self._id == bindparam("tid")
        self._select_state = select(self._state).where(where)
        self._lock_statement = (
            update(self.state_table).where(where).values({self._updated: self._updated})
            if self._dialect == "sqlite"  # a write takes SQLite's lock at once
            else self._select_state.with_for_update()
        )
        self._write_statement = (
            update(self.state_table)
            .where(where)
            .values({self._state: bindparam("state"), self._updated: func.now()})
        )
        self._create = create_state_table
        self._on_step = on_step
        self.producer = TransactionalProducer(conf, **producer_options)  # validates conf
        self.transactional_id = self.producer.transactional_id
        self._started = False
        self._broken: KafkaTxnError | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> TransactionOutcome:
        """Recover what a crashed predecessor left, then initialise transactions."""
        if self._started:
            raise ConfigurationError("start() was already called")
        if self._create:
            self.state_table.create(self.engine, checkfirst=True)
        self._ensure_row()
        self.producer.init_transactions(keep_prepared_txn=True)
        with self.engine.connect() as conn:
            conn.begin()
            stored = PreparedTxnState(self._lock_and_read(conn))

            def settle(outcome: TransactionOutcome) -> None:
                # Commit the "completed" marker before init_transactions() bumps the
                # epoch, so that a crash from here on cannot make recovery guess.
                if not stored.is_empty and not stored.completed:
                    self._write_state(conn, stored.mark_completed())
                conn.commit()

            outcome = self.producer.complete_transaction(stored, before_init=settle)
        log.info(
            "dual writer %r started: %s", self.transactional_id, outcome.value,
            extra={"transactional_id": self.transactional_id, "outcome": outcome.value},
        )  # fmt: skip
        self._started = True
        return outcome

    def close(self) -> None:
        """Close the producer and the engine's pool; a transaction in flight aborts."""
        self.producer.close()
        self.engine.dispose()

    def __enter__(self) -> DualWriter:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the recipe
    @contextmanager
    def transaction(self) -> Iterator[DualWriteTransaction]:
        """One atomic write to both systems; an exception in the body rolls both back."""
        if self._broken is not None:
            raise self._broken.with_traceback(None)
        if not self._started:
            self.start()
        producer = self.producer
        with self.engine.connect() as conn:
            conn.begin()
            try:
                self._lock_and_read(conn)
                producer.begin_transaction()
                self._step("after_begin")
                yield DualWriteTransaction(conn, producer)
                self._step("after_send")
                state = producer.prepare_transaction()
                self._step("after_prepare")
                self._write_state(conn, state)
                self._step("after_state_write")
            except BaseException:
                self._roll_back(conn)
                raise
            self._commit_database(conn)
        self._step("after_db_commit")
        try:
            producer.complete_transaction(state)
        except KafkaTxnError as exc:
            # The database decided "commit"; Kafka holds the prepared transaction until
            # a restart's start() commits it. This writer must not go on.
            self._broken = FatalError(
                f"Kafka commit after the database commit failed ({exc}); the transaction "
                "stays prepared: restart the writer, whose start() will commit it",
                kafka_error=exc.kafka_error,
            )
            raise self._broken from exc
        self._step("after_kafka_commit")

    # ------------------------------------------------------------------ internals
    def _step(self, step: str) -> None:
        if self._on_step is not None:
            self._on_step(step)

    def _ensure_row(self) -> None:
        with self.engine.begin() as conn:
            exists = conn.execute(select(self._id).where(self._id == self.transactional_id)).first()
            if exists:
                return
            try:
                with conn.begin_nested():
                    conn.execute(
                        insert(self.state_table).values(
                            {self._id: self.transactional_id, self._state: "",
                             self._updated: func.now()}
                        )
                    )  # fmt: skip
            except IntegrityError:
                pass  # another instance inserted it first

    def _lock_and_read(self, conn: Connection) -> str:
        """Lock this writer's state row for the rest of the DB transaction (SELECT ...
        FOR UPDATE; on SQLite a write, which takes its RESERVED lock at once), read it."""
        params = {"tid": self.transactional_id}
        if self._dialect == "sqlite":
            conn.execute(self._lock_statement, params)
            row = conn.execute(self._select_state, params).first()
        else:
            row = conn.execute(self._lock_statement, params).first()
        if row is None:
            raise ConfigurationError(
                f"state row for {self.transactional_id!r} is missing from "
                f"{self.state_table.name}: call start() (or create it) first"
            )
        return str(row[0])

    def _write_state(self, conn: Connection, state: PreparedTxnState) -> None:
        conn.execute(self._write_statement, {"tid": self.transactional_id, "state": str(state)})

    def _roll_back(self, conn: Connection) -> None:
        try:
            conn.rollback()
        except DBAPIError as exc:
            log.warning("database rollback failed: %s", exc)
        if self.producer.in_transaction:
            try:
                self.producer.abort_transaction()
            except KafkaTxnError as exc:
                log.warning("Kafka abort after a failed dual write failed: %s", exc)

    def _commit_database(self, conn: Connection) -> None:
        try:
            conn.commit()
        except DBAPIError as exc:
            if exc.connection_invalidated:
                # The COMMIT may or may not have happened: only the database knows.
                self._broken = DatabaseCommitUnknownError(
                    f"the database connection dropped during COMMIT ({exc.orig}); the "
                    "Kafka transaction stays prepared: restart the writer, whose start() "
                    "commits or aborts it to match the database"
                )
                raise self._broken from exc
            self._roll_back(conn)  # the database refused: nothing was committed
            raise
