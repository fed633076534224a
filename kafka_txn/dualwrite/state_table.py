"""The state table's checks at ``start()``: the table exists (created if asked), it has the
owner column (added to a table made before it), this writer's row exists, and its columns
hold this writer's ids and states exactly: an id column that tells ``Orders-1`` from
``orders-1`` (Kafka transactional ids are case-sensitive), a state column long enough for
the longest state. Part of ``_StateRow`` (``state_row``): these statements share its
bounded lock waits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Column, Table, func, insert, inspect, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from kafka_txn.dualwrite.ddl import (
    add_column_if_missing,
    add_column_statement,
    create_table_if_missing,
)
from kafka_txn.dualwrite.exact_ids import fix_statement, inexact, pads
from kafka_txn.errors import ConfigurationError, TransactionAbortableError
from kafka_txn.state import MAX_SERIALIZED_LENGTH, PreparedTxnState

_TEXT_LIMITS = {"TINYTEXT": 255, "TINYBLOB": 255}
"""Byte limits of MySQL/MariaDB text types that reflect without a length (the states are
ASCII: bytes are characters); the larger TEXT types hold any state."""


class _StateTableChecks:
    """The schema checks of ``_StateRow``, which defines the table, its columns and the
    lock-wait bounds used here."""

    engine: Engine
    dialect: str
    transactional_id: str
    table: Table
    _id: Column[Any]
    _state: Column[Any]
    _updated: Column[Any]
    _owner: Column[Any]

    if TYPE_CHECKING:  # defined by _StateRow

        def _bound_lock_wait(self, conn: Connection, *, fresh: bool = False) -> None: ...

        def _lock_wait_ended(
            self, exc: DBAPIError, waiting_for: str, conn: Connection | None = None
        ) -> TransactionAbortableError | None: ...

        def _require_transaction(self, conn: Connection) -> None: ...

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

    def _ensure_owner_column(self, create: bool, columns: set[str]) -> None:
        """Add the owner column to a state table created before it existed. Safe when
        several writers start at once (``ddl.add_column_if_missing``)."""
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
