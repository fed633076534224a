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
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import SingletonThreadPool, StaticPool

from kafka_txn.config import TWO_PHASE_COMMIT_KEY, ProducerSettings, error_reports_by_default
from kafka_txn.dualwrite.body_guard import _BodyGuard
from kafka_txn.dualwrite.engine import engine_for, validate_identifier, validate_seconds
from kafka_txn.dualwrite.failures import _FailurePaths
from kafka_txn.dualwrite.jdbc.urls import redact_jdbc_url
from kafka_txn.dualwrite.marks import _CompletionMarks
from kafka_txn.dualwrite.rollback_watch import RollbackWatch
from kafka_txn.dualwrite.startup import _owner_token, _Startup
from kafka_txn.dualwrite.state_row import _StateRow
from kafka_txn.errors import (
    ConfigurationError,
    IllegalStateError,
    InvalidPreparedStateError,
    KafkaTxnError,
    TransactionAbortableError,
    root_exception,
)
from kafka_txn.metrics import MetricsHook
from kafka_txn.producer import arguments
from kafka_txn.producer.delivery import _add_note
from kafka_txn.producer.transactional import Serializer, TransactionalProducer
from kafka_txn.producer.watch import counts_deliveries
from kafka_txn.state import PreparedTxnState
from kafka_txn.tracing import Tracing, as_tracing
from kafka_txn.twophase.recovery import TransactionOutcome

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["STEPS", "DualWriteTransaction", "DualWriter"]

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


def _normalized(stored: str) -> str | None:
    """A stored state as kafka-txn writes it (how ``start()`` and recovery name it), or
    None if it does not parse."""
    try:
        return str(PreparedTxnState.parse(stored))
    except InvalidPreparedStateError:
        return None


class DualWriteTransaction:
    """What the body of ``writer.transaction()`` gets: ``connection``, the live database
    connection in its open transaction, and ``produce``/``produce_batch``/``send``, the
    producer's own methods (same signatures and errors as ``TransactionalProducer``)."""

    def __init__(self, connection: Connection, producer: TransactionalProducer) -> None:
        self.connection = connection
        self.produce = producer.produce
        self.produce_batch = producer.produce_batch
        self.send = producer.send


class DualWriter(_Startup, _FailurePaths):
    """Writes to a SQL database and Kafka in one atomic step (see the module docstring).

    ``database`` is a JDBC URL (``jdbc:postgresql://...``, ``jdbc:mysql://...``,
    ``jdbc:mariadb://...``, ``jdbc:sqlite:path``), a SQLAlchemy URL, or an Engine.
    ``producer_config`` and the producer's keyword arguments (``key_serializer`` to
    ``sleep``, ``tracing`` included) as for ``TransactionalProducer``; two-phase commit
    is turned on.
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
        tracing: Tracing | TracerProvider | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        conf = (
            producer_config.to_librdkafka()
            if isinstance(producer_config, ProducerSettings)
            else dict(producer_config)
        )
        conf[TWO_PHASE_COMMIT_KEY] = True
        error_reports_by_default(conf, counted=counts_deliveries(metrics, tracing))
        arguments.flag(create_state_table, self._api_name, "create_state_table")
        arguments.callback(on_step, self._api_name, "on_step")
        arguments.optional_text(user, self._api_name, "user")
        arguments.optional_text(password, self._api_name, "password", secret=True)
        tracing = as_tracing(tracing, self._api_name)
        lock_timeout = validate_seconds(lock_timeout, "lock_timeout")
        delay = validate_seconds(mark_completed_after, "mark_completed_after")
        self.engine = engine_for(database, user, password, refuse_sqlite_login=True)
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
        self.producer = self._new_producer(  # validates conf
            conf,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
            operation_timeout=operation_timeout,
            queue_full_timeout=queue_full_timeout,
            prepare_min_time_left=prepare_min_time_left,
            metrics=metrics,
            tracing=tracing,
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
        self._guard = _BodyGuard(self.transactional_id, dialect, self._watch)
        self._marks = _CompletionMarks(
            self._row.store_completed,
            None if single_connection else delay,  # no second connection for a thread
            self.transactional_id,
        )
        self._started = False
        self._start_outcome: TransactionOutcome | None = None
        self._fenced: TransactionOutcome | None = None
        """start() initialised transactions, then failed releasing the lock."""
        self._broken: KafkaTxnError | None = None
        self._serial = threading.Lock()
        """One start() or transaction() of this writer at a time: it has one producer,
        which has one transaction (other threads wait their turn)."""
        self._serial_thread: int | None = None
        self._unresolved: str | None = None
        """The stored state the last start() could not settle (diverged, unknowable)."""
        self._resolved: str | None = None
        """The unresolved state resolve() accepted: start() leaves it in the row, for the
        first transaction that commits to replace, with the re-sent records."""
        self._after_settle: Callable[[], None] | None = None
        """Test hook: called in start() between the settle commit and the fence."""

    def _new_producer(self, conf: dict[str, Any], **kwargs: Any) -> TransactionalProducer:
        """The writer's producer, from its config and ``TransactionalProducer``'s keyword
        arguments (``kafka_txn.aio.dualwrite`` gives its writer an awaiting one)."""
        return TransactionalProducer(conf, **kwargs)

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
        initialise transactions (fencing the predecessor in Kafka); returns what recovery
        did with the predecessor's last transaction.

        ``with DualWriter(...)`` and the first ``transaction()`` call it when it has not
        run. Once the writer has started, it returns that start's outcome and does
        nothing more. May be called again after it raised
        (``TransactionOutcomeUnknownError``: the coordinator did not answer; a lock
        timeout): it then starts over."""
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
        arguments.prepared_state(stored_state, "resolve", "stored_state")
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
                        self._guard.check_kept_transaction(conn, root)
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
                    decision.release()
                committed = True
        except BaseException as exc:
            if db_committed and self._broken is None:
                # Interrupted after the database COMMIT (giving the connection back to
                # the pool): in doubt, as anything between the two commits.
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
