"""The driver's scan for unfinished transactions (``Ledger.unfinished``) proves the
completed state rows in the written form by a regex instead of parsing them
(``is_settled``): it must classify every row as parsing it would, as read back from
PostgreSQL, MariaDB and SQLite. A row that does not parse, however close to a completed
state it looks, is reported unfinished, so that recovery reports what is wrong with it."""

from __future__ import annotations

import random
import re
import uuid
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, create_engine, insert, select, text

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.errors import ConfigurationError, InvalidPreparedStateError
from kafka_txn.spark import ledger as _sink_ledger
from kafka_txn.spark.ledger import BATCH_JOB, Ledger, is_settled
from kafka_txn.state import MAX_SERIALIZED_LENGTH, PreparedTxnState

_DONE = PreparedTxnState(
    transactional_id="orders-7", producer_id=4001, producer_epoch=7,
    txn_start_ms=1732212345678, cluster_id="Hx2-_aZ09", timeout_ms=60000, completed=True,
)  # fmt: skip
_OPEN = _DONE.model_copy(update={"completed": False})
_WRITTEN = str(_DONE)

# Each stored state, and whether it is settled (parses as empty or completed).
_CASES: list[str | None] = [
    "",
    _WRITTEN,
    str(_OPEN),
    str(PreparedTxnState(producer_id=1, producer_epoch=0, completed=True)),  # minimal
    str(
        PreparedTxnState(transactional_id="a b/é", producer_id=1, producer_epoch=0, completed=True)
    ),  # percent-encoded id: parsed, still settled
    str(_DONE.model_copy(update={"producer_id": (1 << 63) - 1})),  # 19 digits: parsed
    str(_DONE.model_copy(update={"producer_epoch": 32767})),  # 5 digits: parsed
    "4001:7",  # the Java client's form: never completed
    None,  # a NULL a hand-made table allows
    " ",  # MariaDB's PAD SPACE collations compare it equal to ''
    "   ",
    _WRITTEN + "\n",  # a regex's $ matches before it
    _WRITTEN + " ",
    _WRITTEN.upper(),  # MariaDB's collations ignore case
    _WRITTEN.replace("done=1", "DONE=1"),
    _WRITTEN.replace("kafka-txn:1", "Kafka-Txn:1"),
    _WRITTEN.replace("done=1", "done=1;done=1"),
    _WRITTEN.replace("done=1", "done=0;done=1"),
    _WRITTEN.replace("done=1", "x=1;done=1"),  # a newer kafka-txn's key: parsed, settled
    _WRITTEN + ";x=1",
    _WRITTEN.replace("pid=4001", "pid=x"),
    _WRITTEN.replace("pid=4001;", ""),  # no pid
    _WRITTEN.replace("epoch=7", "epoch=99999"),  # out of range
    _WRITTEN.replace("epoch=7", "epoch=32768"),
    _WRITTEN.replace("pid=4001", "pid=99999999999999999999"),
    _WRITTEN.replace("pid=4001", "pid=-1"),
    _WRITTEN.replace("tid=orders-7", "tid="),  # empty id
    _WRITTEN.replace("tid=orders-7", "tid=%FF"),  # not UTF-8
    _WRITTEN.replace("tid=orders-7", "tid=%zz"),
    _WRITTEN.replace("kafka-txn:1", "kafka-txn:2"),
    _WRITTEN.replace(";done=1", ";;done=1"),
    "kafka-txn:1;done=1",
    "kafka-txn:1;pid=1;epoch=1;done=1",
    "kafka-txn:1;pid=1;epoch=1;start=-1;done=1",  # unknown start: parsed, settled
    "kafka-txn:1;pid=1;epoch=1;done=1;pid=2",
    "kafka-txn:1;pid=1;epoch=1;done=1\nkafka-txn:1;pid=1;epoch=1;done=1",
    "kafka-txn:1;pid=1;epoch=1;tid=orders-7;done=1",  # another order: parsed, settled
    "kafka-txn:1;tid=" + "a" * MAX_SERIALIZED_LENGTH + ";pid=1;epoch=1;done=1",  # too long
    "garbage;done=1",
    "kafka-txn:1;pid=1;epoch=1;done=1 ",
]


_SETTLED_FORM = _sink_ledger._SETTLED


def _settled(state: str | None) -> bool:
    """What the scan did before the fast check: parse every row."""
    try:
        parsed = PreparedTxnState.parse(state)  # type: ignore[arg-type]
    except InvalidPreparedStateError:
        return False
    return parsed.completed or parsed.is_empty


@pytest.mark.guarantee("5.5")
def test_the_scan_reports_exactly_the_rows_that_do_not_parse_as_settled(jdbc_url: str) -> None:
    """Every case above, stored in a state table of each database and read back: the
    fast check never calls settled a row that parsing would not, it does prove the
    written completed state without parsing, and ``unfinished()`` reports exactly the
    rows that do not parse as settled (not another prefix's)."""
    assert _SETTLED_FORM.fullmatch(_WRITTEN)  # the fast path is taken for it
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    name = f"state_{uuid.uuid4().hex[:8]}"
    state = Table(
        name, MetaData(),
        Column("transactional_id", String(255), primary_key=True),
        Column("prepared_txn_state", String(2 * MAX_SERIALIZED_LENGTH)),
    )  # fmt: skip
    prefix = f"ledger-{uuid.uuid4().hex[:6]}"
    rows = [{"transactional_id": f"{prefix}-{i}", "prepared_txn_state": s}
            for i, s in enumerate(_CASES)]  # fmt: skip
    try:
        state.create(engine)
        with engine.begin() as conn:
            conn.execute(insert(state), rows)
            # another prefix that merely starts with this one, unfinished: not reported
            conn.execute(insert(state).values(transactional_id=f"{prefix}-x-1",
                                              prepared_txn_state=str(_OPEN)))  # fmt: skip
            # another sink's prefix differing only in case (MariaDB's LIKE ignores case),
            # and a partition number in non-ASCII digits: not this sink's, not reported
            conn.execute(insert(state).values(transactional_id=f"{prefix.upper()}-99",
                                              prepared_txn_state=str(_OPEN)))  # fmt: skip
            conn.execute(insert(state).values(transactional_id=f"{prefix}-\u0661",
                                              prepared_txn_state=str(_OPEN)))  # fmt: skip
            query = text(f"SELECT transactional_id, prepared_txn_state FROM {name}")
            stored = {t: v for t, v in conn.execute(query)}
        assert {t: v for t, v in stored.items() if is_settled(v) and not _settled(v)} == {}
        ledger = Ledger(engine, prefix, f"commits_{uuid.uuid4().hex[:8]}", state)
        expected = [r["transactional_id"] for r in rows if not _settled(r["prepared_txn_state"])]
        assert ledger.unfinished() == expected
        assert f"{prefix}-2" in expected and f"{prefix}-0" not in expected
        assert f"{prefix}-1" not in expected
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {name}"))
        engine.dispose()


@pytest.mark.guarantee("5.5")
def test_the_fast_check_agrees_with_parsing_on_mangled_states() -> None:
    """Random edits of written states (completed and not): whatever the fast check
    calls settled parses as settled, and it agrees with parsing on every one."""
    rng = random.Random(13)
    alphabet = "kafkatxn:1;=0123456789-_.~%ABCDEFdone \n\t\u00e9\u0663"
    originals = [_WRITTEN, str(_OPEN), "kafka-txn:1;pid=1;epoch=1;done=1", ""]
    for _ in range(20000):
        text_ = list(rng.choice(originals))
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(text_) + 1)
            action = rng.randrange(3)
            if action == 0 and at < len(text_):
                text_[at] = rng.choice(alphabet)
            elif action == 1:
                text_.insert(at, rng.choice(alphabet))
            elif at < len(text_):
                del text_[at]
        case = "".join(text_)
        assert is_settled(case) == _settled(case), case


def _drop(engine: Any, *names: str) -> None:
    with engine.begin() as conn:
        for name in names:
            conn.execute(text(f"DROP TABLE IF EXISTS {name}"))


def _ledgers(engine: Any, commits: str) -> tuple[Ledger, Ledger]:
    """The ledgers of two sinks whose prefixes differ only in case, on one commits table."""
    state = Table("unused_state", MetaData(), Column("transactional_id", String(255)))
    base = uuid.uuid4().hex[:8]
    return Ledger(engine, f"Orders-{base}", commits, state), Ledger(
        engine, f"orders-{base}", commits, state
    )


def test_prefixes_differing_in_case_keep_their_own_markers(jdbc_url: str) -> None:
    """The commits tables compare prefixes exactly (utf8mb4_bin on MariaDB, whose default
    collation ignores case): a batch job on ``orders-…`` does not see the batch shape and
    commit markers of ``Orders-…``'s batch 0, so it is not refused as a replay."""
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    commits = f"commits_{uuid.uuid4().hex[:8]}"
    upper, lower = _ledgers(engine, commits)
    try:
        upper.create_tables()
        lower.create_tables()
        upper.record_batch(BATCH_JOB, 0, 2, None)
        with engine.begin() as conn:
            conn.execute(
                insert(upper.commits).values(
                    sink=upper.prefix, query_id=BATCH_JOB, batch_id=0, partition_id=0
                )
            )
        lower.record_batch(BATCH_JOB, 0, 3, None)  # before: ReplayMismatchError
        with engine.connect() as conn:
            assert sorted(
                conn.execute(select(upper.batches.c.sink, upper.batches.c.partitions))
            ) == [
                (upper.prefix, 2),
                (lower.prefix, 3),
            ]
    finally:
        _drop(engine, commits, f"{commits}_queries", f"{commits}_batches")
        engine.dispose()


def test_commits_tables_that_ignore_case_are_refused_naming_the_fix(mariadb_jdbc: str) -> None:
    """Commits tables whose id columns have MariaDB's default collation (which ignores
    case), as made by hand or by another tool, are refused with the statements that fix
    them; after those ran, the sink goes on."""
    engine = create_engine(jdbc_to_sqlalchemy(mariadb_jdbc))
    commits = f"commits_{uuid.uuid4().hex[:8]}"
    upper, _ = _ledgers(engine, commits)
    old = MetaData()
    for table in (upper.commits, upper.queries, upper.batches):
        copy = table.to_metadata(old)
        for col in copy.c:
            if isinstance(col.type, String):
                col.type = String(col.type.length)  # the default collation: no COLLATE
        copy.create(engine)
    try:
        with pytest.raises(ConfigurationError, match="case") as refused:
            upper.create_tables()
        fixes = re.findall(r"`(ALTER TABLE [^`]*)`", str(refused.value))
        assert fixes == [
            f"ALTER TABLE {name} MODIFY sink VARCHAR(200) CHARACTER SET utf8mb4 "
            "COLLATE utf8mb4_bin NOT NULL"
            for name in (commits, f"{commits}_queries", f"{commits}_batches")
        ]
        with engine.begin() as conn:
            for fix in fixes:
                conn.execute(text(fix))
        upper.create_tables()
    finally:
        _drop(engine, commits, f"{commits}_queries", f"{commits}_batches")
        engine.dispose()


@pytest.mark.guarantee("5.5")
def test_the_ids_above_a_smaller_batch_are_named_once_per_shrink(jdbc_url: str) -> None:
    """``Ledger.beyond``: after a batch with 4 partitions, a batch with 2 names ids 2
    and 3 (a task killed before its database commit may have left them open), once; a
    new driver (a fresh Ledger) names them again from the batches table (the highest
    count recorded for the prefix, whatever the query); other prefixes' counts do not
    count."""
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    commits = f"commits_{uuid.uuid4().hex[:8]}"
    upper, lower = _ledgers(engine, commits)
    p = lower.prefix
    try:
        upper.create_tables()
        upper.record_batch(BATCH_JOB, 0, 9, None)  # another prefix
        assert lower.beyond(2) == []
        lower.record_batch("q1", 0, 4, None)
        assert lower.beyond(4) == []
        assert lower.beyond(2) == [f"{p}-2", f"{p}-3"]
        restarted = Ledger(engine, p, commits, lower.state)
        assert restarted.beyond(1) == [f"{p}-1", f"{p}-2", f"{p}-3"]
        lower.settled_beyond(2)
        assert lower.beyond(2) == []
        lower.record_batch("q1", 1, 3, None)
        assert lower.beyond(2) == [f"{p}-2"]
    finally:
        _drop(engine, commits, f"{commits}_queries", f"{commits}_batches")
        engine.dispose()
