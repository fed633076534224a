"""The state table a DualWriter is given, as made by hand, by another tool or by an older
deployment: a state column too short for the states (a MariaDB TINYTEXT, a VARCHAR
narrowed outside strict mode), a state column spelled in capitals, reserved words and
mixed case as column names, an id column that ignores case, and ids that such a column
would merge (guarantees 4.4 and 4.10). Each is refused at start() naming the fix, or
works; none may lose a committed transaction silently. Real broker, PostgreSQL, MariaDB
and SQLite; Kafka is read with a read_committed consumer, the database with SQL."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from kafka_txn.dualwrite.engine import database_url
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import ConfigurationError, KafkaTxnError
from kafka_txn.state import PreparedTxnState
from tests.support import adversaries as support
from tests.support.adversaries import (
    Interrupted,
    both_sides,
    committed_values,
    hand_made_state_table,
    jdbc_of,
    mariadb_non_strict,
    names_fixture,
    stop_after_db_commit,
)
from tests.support.databases import drop_tables as _drop
from tests.support.databases import id_value_table as _events
from tests.support.databases import unique_name
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary

names = names_fixture("st")
make_writer = support.make_writer


# ---------------------------------------------------------------------------------------
# 4.10: "A state column shorter than the writer's longest state (a table made by hand or
# by another tool; MySQL/MariaDB outside strict mode would cut states short) is refused
# by start() with ConfigurationError before anything is written". The check reads the
# reflected type's ``length``: a MariaDB TINYTEXT column (255 bytes) reflects with no
# length and must not be taken as unbounded.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.10")
def test_mariadb_tinytext_state_column_too_short_is_refused_at_start(
    broker: Broker, mariadb_jdbc: str, names: dict[str, str]
) -> None:
    """A TINYTEXT state column (255 bytes, reflected without a length) that a 205-character
    transactional id's states do not fit is refused by start()."""
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    mariadb_non_strict(engine)

    tid = "t" + uuid.uuid4().hex + "x" * 172  # 205 characters: the states pass 255 bytes
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid}
    try:
        hand_made_state_table(engine, state, "prepared_txn_state TINYTEXT NOT NULL")
        writer = DualWriter(conf, engine, state_table=state, create_state_table=False)
        try:
            longest = PreparedTxnState(
                transactional_id=tid, producer_id=1000, producer_epoch=0,
                txn_start_ms=1_700_000_000_000, cluster_id="c" * 22, timeout_ms=60000,
            ).mark_completed()  # fmt: skip
            assert len(str(longest)) > 255  # even an ordinary state does not fit
            with pytest.raises(ConfigurationError):
                writer.start()
        finally:
            writer.close()
    finally:
        _drop(engine, state)
        engine.dispose()


@pytest.mark.guarantee("4.10")
def test_mariadb_tinytext_state_column_never_loses_a_committed_transaction(
    broker: Broker, mariadb_jdbc: str, names: dict[str, str]
) -> None:
    """A writer on a TINYTEXT state column outside strict mode, stopped right after a
    database commit, then a successor's start(): either an error is raised, or the
    database and Kafka hold the same rows."""
    topic = broker.create_topic()
    events = _events(names["events"])
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    mariadb_non_strict(engine)

    tid = "t" + uuid.uuid4().hex + "x" * 172  # 205 characters
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid}
    interrupt: list[bool] = []
    outcome: Any = None
    try:
        events.metadata.create_all(engine)
        hand_made_state_table(engine, state, "prepared_txn_state TINYTEXT NOT NULL")
        try:
            first = DualWriter(
                conf, engine, state_table=state, create_state_table=False,
                on_step=stop_after_db_commit(interrupt), mark_completed_after=None,
            )  # fmt: skip
            try:
                first.start()
                with first.transaction() as tx:
                    tx.connection.execute(events.insert(), {"id": 1, "value": "one"})
                    tx.produce(topic, b"one")
                interrupt.append(True)
                with pytest.raises(Interrupted), first.transaction() as tx:
                    tx.connection.execute(events.insert(), {"id": 2, "value": "two"})
                    tx.produce(topic, b"two")
            finally:
                first.close()  # prepared, the database committed (4.13)
            second = DualWriter(conf, engine, state_table=state, create_state_table=False)
            try:
                outcome = second.start()
            finally:
                second.close()
        except (KafkaTxnError, DBAPIError) as exc:
            outcome = exc
        in_db, in_kafka = both_sides(broker, engine, events, topic, timeout=10.0)
        reported = isinstance(outcome, BaseException)
        assert reported or in_db == in_kafka, (outcome, in_db, in_kafka)
    finally:
        _drop(engine, names["events"], state)
        engine.dispose()


@pytest.mark.guarantee("4.10")
def test_mariadb_state_column_spelled_in_capitals_is_checked_at_start(
    broker: Broker, mariadb_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    """The width check finds the state column whatever the case of its name: a
    PREPARED_TXN_STATE VARCHAR(64) is refused."""
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    mariadb_non_strict(engine)

    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    try:
        hand_made_state_table(engine, state, "PREPARED_TXN_STATE VARCHAR(64) NOT NULL")
        writer = DualWriter(conf, engine, state_table=state, create_state_table=False)
        try:
            with pytest.raises(ConfigurationError):
                writer.start()
        finally:
            writer.close()
    finally:
        _drop(engine, state)
        engine.dispose()


# ---------------------------------------------------------------------------------------
# A state table managed by hand (create_state_table=False, or narrowed since) whose state
# column is shorter than the states the writer stores, on a MySQL/MariaDB server that is
# not in strict mode (sql_mode='', the default before MySQL 5.7 and common on old
# installs): the server would truncate the state with a warning, and a crash before the
# Kafka commit would leave a state whose start time lost its last digits. Recovery would
# read it as "a later transaction ran" (row 8: ALREADY_COMMITTED), commit nothing, and
# the init would abort the prepared transaction: the row in the database, its record
# nowhere, no error (4.1 broken). The writer must refuse the column or report the state.
# ---------------------------------------------------------------------------------------


@pytest.mark.guarantee("4.10")
def test_mariadb_non_strict_state_column_too_short_never_loses_a_committed_transaction(
    broker: Broker, mariadb_jdbc: str, names: dict[str, str], txn_id: str
) -> None:
    """The state column narrowed after a first commit, outside strict mode, then a
    writer stopped right after its database commit: the successor's start() raises,
    or the database and Kafka hold the same rows."""
    topic = broker.create_topic()
    events = _events(names["events"])
    state = names["state"]
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    mariadb_non_strict(engine)

    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    interrupt: list[bool] = []
    try:
        events.metadata.create_all(engine)
        first = DualWriter(
            conf, engine, state_table=state, on_step=stop_after_db_commit(interrupt),
            mark_completed_after=None,
        )  # fmt: skip
        first.start()
        with first.transaction() as tx:  # a first transaction: its state shows the layout
            tx.connection.execute(events.insert(), {"id": 1, "value": "one"})
            tx.produce(topic, b"one")
        with engine.connect() as conn:
            stored = conn.execute(text(f"SELECT prepared_txn_state FROM {state}")).scalar_one()
            # Narrowed (by hand, or created so by another tool): the start time's last
            # three digits no longer fit.
            width = stored.index(";start=") + len(";start=") + 10
            conn.execute(text(f"ALTER TABLE {state} MODIFY prepared_txn_state VARCHAR({width})"))
            conn.commit()
        interrupt.append(True)
        outcome: Any = None
        try:  # a writer that refuses the narrow column, or the truncated state, says so
            with pytest.raises(Interrupted), first.transaction() as tx:
                tx.connection.execute(events.insert(), {"id": 2, "value": "two"})
                tx.produce(topic, b"two")
            first.close()  # prepared, the database committed (4.13)
            second = DualWriter(conf, engine, state_table=state, create_state_table=False)
            try:
                outcome = second.start()
            finally:
                second.close()
        except (KafkaTxnError, DBAPIError) as exc:
            outcome = exc
        in_db, in_kafka = both_sides(broker, engine, events, topic, expected=2, timeout=10.0)
        reported = isinstance(outcome, BaseException)
        assert reported or in_db == in_kafka, (outcome, in_db, in_kafka)
    finally:
        _drop(engine, names["events"], state)
        engine.dispose()


# ---------------------------------------------------------------------------------------
# Column names: validate_identifier accepts reserved words and mixed case.
# ---------------------------------------------------------------------------------------


def test_mariadb_lock_with_reserved_and_mixed_case_identifiers(
    broker: Broker, mariadb_jdbc: str
) -> None:
    """validate_identifier accepts reserved words and mixed case; the MariaDB SET
    STATEMENT lock (4.8/4.9) quotes them itself (identifier_preparer.quote): a commit and
    a body failure both work, and the state row under those names holds the committed
    state."""
    topic = broker.create_topic()
    suffix = uuid.uuid4().hex[:8]
    table = f"Select_{suffix}"
    columns = dict(
        state_table=table,
        id_column="key",
        state_column="Order",
        updated_column="select",
        owner_column="Group",
    )
    engine = create_engine(database_url(mariadb_jdbc, None, None))
    tid = f"state-table-{uuid.uuid4().hex[:10]}"
    try:
        with DualWriter(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid},
            engine,
            lock_timeout=2.0,
            mark_completed_after=None,
            **columns,
        ) as writer:
            with writer.transaction() as tx:
                tx.produce(topic, b"one", key=b"1")
            with pytest.raises(RuntimeError), writer.transaction() as tx:
                tx.produce(topic, b"aborted", key=b"2")
                raise RuntimeError("body fails")
            with writer.transaction() as tx:
                tx.produce(topic, b"two", key=b"3")
        assert [v for _, v in broker.read_committed(topic, 2)] == [b"one", b"two"]
        assert broker.open_partitions(topic) == {}
        with engine.connect() as conn:
            state = conn.execute(
                text(f"SELECT `Order` FROM `{table}` WHERE `key` = :t"), {"t": tid}
            ).scalar_one()
        assert state
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS `{table}`"))
        engine.dispose()


# ---------------------------------------------------------------------------------------
# 4.4: transactional ids are compared exactly, so ids differing in case have a row each.
# ---------------------------------------------------------------------------------------


def _ids_differing_in_case_work_independently(
    make_writer: Callable[..., DualWriter], broker: Broker, topic: str, jdbc: str, table: str
) -> None:
    """Writers of ``Orders-…`` and ``orders-…`` on one state table: both start, then
    each commits a transaction; neither fences the other."""
    base = uuid.uuid4().hex[:10]
    upper = make_writer(f"Orders-{base}", jdbc, state_table=table, tables=[])
    lower = make_writer(f"orders-{base}", jdbc, state_table=table, tables=[])
    upper.start()
    lower.start()
    committed: list[str] = []
    failed: list[str] = []
    for writer, value in ((lower, "lower"), (upper, "upper")):
        try:
            with writer.transaction() as tx:
                tx.produce(topic, value.encode())
            committed.append(value)
        except Exception as exc:  # a row shared by both ids: ProducerFencedError
            failed.append(f"{value}: {exc!r}")
    assert failed == [], failed
    assert committed_values(broker, topic, expected=2, timeout=5) == ["lower", "upper"]
    with upper.engine.connect() as conn:
        rows = conn.execute(text(f"SELECT transactional_id FROM {table}")).scalars()
        assert sorted(rows) == [f"Orders-{base}", f"orders-{base}"]


@pytest.mark.guarantee("4.4")
def test_mariadb_transactional_ids_differing_in_case_are_independent(
    make_writer: Callable[..., DualWriter], broker: Broker, topic: str, mariadb_jdbc: str
) -> None:
    """4.4: the state table the writer creates on MariaDB compares ids exactly
    (utf8mb4_bin); with MariaDB's default collation, which ignores case, the second
    writer's start() would take the first's row over and fence it for good."""
    state_table = unique_name("st")
    _ids_differing_in_case_work_independently(make_writer, broker, topic, mariadb_jdbc, state_table)


# A state table made with MariaDB's default collation or by hand, whose id column ignores
# case; and the statement the refusal must name (None: SQLite cannot alter a column, the
# message says to copy the table).
_INEXACT_ID_COLUMNS = {
    "mariadb": (
        "VARCHAR(255)",
        "ALTER TABLE {t} MODIFY transactional_id VARCHAR(255) CHARACTER SET utf8mb4 "
        "COLLATE utf8mb4_bin NOT NULL",
    ),
    "postgresql": (
        "VARCHAR(255) COLLATE kafka_txn_test_ci",
        'ALTER TABLE {t} ALTER COLUMN transactional_id TYPE varchar(255) COLLATE "default"',
    ),
    "sqlite": ("VARCHAR(255) COLLATE NOCASE", None),
}


@pytest.mark.parametrize("db", sorted(_INEXACT_ID_COLUMNS))
@pytest.mark.guarantee("4.4")
def test_a_state_table_whose_id_column_ignores_case_is_refused_naming_the_fix(
    make_writer: Callable[..., DualWriter],
    broker: Broker,
    topic: str,
    db: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """4.4: an existing state table whose id column ignores case (MariaDB's default
    collation, a PostgreSQL nondeterministic collation, SQLite NOCASE) is refused at
    start() with the statement that fixes it; once it ran, ids differing in case are
    independent."""
    jdbc = jdbc_of(db, request, tmp_path)
    state_table = unique_name("st")
    column, fix = _INEXACT_ID_COLUMNS[db]
    writer = make_writer(f"Orders-{uuid.uuid4().hex[:10]}", jdbc, state_table=state_table,
                         tables=[])  # fmt: skip
    with writer.engine.begin() as conn:
        if db == "postgresql":
            conn.execute(text(
                "CREATE COLLATION IF NOT EXISTS kafka_txn_test_ci (provider = icu, "
                "locale = 'und-u-ks-level2', deterministic = false)"
            ))  # fmt: skip
        conn.execute(text(
            f"CREATE TABLE {state_table} (transactional_id {column} PRIMARY KEY, "
            "prepared_txn_state VARCHAR(4096) NOT NULL, updated_at TIMESTAMP NULL, "
            "owner VARCHAR(255))"
        ))  # fmt: skip
    with pytest.raises(ConfigurationError, match="case-sensitive") as refused:
        writer.start()
    if fix is None:
        assert "has no COLLATE clause" in str(refused.value)
        return
    statement = fix.format(t=state_table)
    assert f"`{statement}`" in str(refused.value)
    with writer.engine.begin() as conn:
        conn.execute(text(statement))
    _ids_differing_in_case_work_independently(make_writer, broker, topic, jdbc, state_table)


def test_mariadb_transactional_id_ending_in_a_space_is_refused(
    make_writer: Callable[..., DualWriter], mariadb_jdbc: str
) -> None:
    """utf8mb4_bin is PAD SPACE: ``orders-x `` and ``orders-x`` would share a row, so an
    id ending in a space is refused at start(), before anything is written."""
    state_table = unique_name("st")
    writer = make_writer(f"orders-{uuid.uuid4().hex[:10]} ", mariadb_jdbc,
                         state_table=state_table, tables=[])  # fmt: skip
    with pytest.raises(ConfigurationError, match="ends in a space"):
        writer.start()
    with writer.engine.connect() as conn:
        assert conn.execute(text(f"SELECT COUNT(*) FROM {state_table}")).scalar() == 0
