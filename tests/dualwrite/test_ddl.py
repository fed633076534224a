"""DDL run by many at once: threads and processes creating one fresh
table, DualWriters starting together on one fresh state table, writers adding the owner
column together, on PostgreSQL, MariaDB and SQLite. Each creator succeeds and exactly one
of them created the table. With a plain ``table.create(engine, checkfirst=True)`` the
creators race: PostgreSQL raises DuplicateTable or UniqueViolation on
pg_type_typname_nsp_index, MariaDB "Table ... already exists", SQLite "table ... already
exists"."""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, inspect, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from kafka_txn.dualwrite import ddl as _ddl
from kafka_txn.dualwrite.ddl import add_column_if_missing, create_table_if_missing
from kafka_txn.dualwrite.engine import engine_for
from kafka_txn.dualwrite.writer import DualWriter

pytestmark = pytest.mark.adversary

THREADS = 16
PROCESSES = 4
THREADS_PER_PROCESS = 4
WRITERS = 16


def _table(name: str, schema: str | None = None, *, with_note: bool = True) -> Table:
    columns = [Column("id", Integer, primary_key=True), Column("value", String(100))]
    if with_note:
        columns.append(Column("note", String(255)))
    return Table(name, MetaData(), *columns, schema=schema)


def _in_threads(
    jdbc_url: str, count: int, barrier: Any, work: Any
) -> tuple[list[bool | None], list[str]]:
    """``work(engine)`` in ``count`` threads, each with its own engine (its own database
    session, as separate Spark tasks have), all released by ``barrier`` at once."""
    results: list[bool | None] = [None] * count
    errors: list[str] = []
    engines = [engine_for(jdbc_url, None, None) for _ in range(count)]

    def run(i: int) -> None:
        barrier.wait(60)
        try:
            results[i] = work(engines[i])
        except BaseException as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for engine in engines:
        engine.dispose()
    return results, errors


def _create_in_threads(
    jdbc_url: str, name: str, schema: str | None, count: int, barrier: Any
) -> tuple[list[bool | None], list[str]]:
    return _in_threads(
        jdbc_url,
        count,
        barrier,
        lambda engine: create_table_if_missing(engine, _table(name, schema)),
    )


def _process_main(
    jdbc_url: str, name: str, schema: str | None, barrier: Any, queue: Any
) -> None:  # pragma: no cover - runs in a child process
    queue.put(_create_in_threads(jdbc_url, name, schema, THREADS_PER_PROCESS, barrier))


def _default_schema(jdbc_url: str) -> str:
    engine = engine_for(jdbc_url, None, None)
    try:
        schema = inspect(engine).default_schema_name
    finally:
        engine.dispose()
    assert schema
    return schema


def _assert_created_once(
    jdbc_url: str, name: str, schema: str | None, results: list[bool | None], errors: list[str]
) -> None:
    assert errors == [], f"{len(errors)} creators failed: {errors[:3]}"
    assert results.count(True) == 1, f"creators that created the table: {results}"
    assert results.count(False) == len(results) - 1, results
    engine = engine_for(jdbc_url, None, None)
    try:
        assert inspect(engine).get_table_names(schema=schema).count(name) == 1
        table = _table(name, schema)
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"id": 1, "value": "v"}])
            assert conn.execute(select(table.c.value)).scalars().all() == ["v"]
    finally:
        engine.dispose()


@pytest.mark.parametrize("qualified", [False, True], ids=["plain", "schema-qualified"])
@pytest.mark.guarantee("4.9a")
def test_threads_create_one_fresh_table_at_once(jdbc_url, qualified):
    """Sixteen threads, each with its own session, create one fresh table at the same
    moment (also as ``schema.table``): every call succeeds, exactly one created it."""
    name = f"ddl_{uuid.uuid4().hex[:10]}"
    schema = _default_schema(jdbc_url) if qualified else None
    results, errors = _create_in_threads(
        jdbc_url, name, schema, THREADS, threading.Barrier(THREADS)
    )
    _assert_created_once(jdbc_url, name, schema, results, errors)


@pytest.mark.guarantee("4.9a")
def test_processes_create_one_fresh_table_at_once(jdbc_url):
    """Four processes of four threads each create one fresh table at the same moment."""
    name = f"ddl_{uuid.uuid4().hex[:10]}"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES * THREADS_PER_PROCESS)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_process_main, args=(jdbc_url, name, None, barrier, queue))
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    try:
        reports = [queue.get(timeout=180) for _ in procs]
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    results = [r for rs, _ in reports for r in rs]
    errors = [e for _, es in reports for e in es]
    _assert_created_once(jdbc_url, name, None, results, errors)


@pytest.mark.guarantee("4.9a")
def test_threads_add_one_column_at_once(jdbc_url):
    """Sixteen sessions add one missing column at the same moment (the owner column's
    upgrade of an older state table): every call succeeds, exactly one added it."""
    name = f"ddl_{uuid.uuid4().hex[:10]}"
    engine = engine_for(jdbc_url, None, None)
    try:
        _table(name, with_note=False).create(engine)
    finally:
        engine.dispose()
    table = _table(name)
    results, errors = _in_threads(
        jdbc_url,
        THREADS,
        threading.Barrier(THREADS),
        lambda engine: add_column_if_missing(engine, table, table.c.note),
    )
    assert errors == [], f"{len(errors)} callers failed: {errors[:3]}"
    assert results.count(True) == 1, results
    engine = engine_for(jdbc_url, None, None)
    try:
        assert [c["name"] for c in inspect(engine).get_columns(name)] == ["id", "value", "note"]
    finally:
        engine.dispose()


@pytest.mark.guarantee("4.9a")
def test_lost_race_is_success_only_if_the_table_now_exists(jdbc_url, monkeypatch):
    """The losers' path, made certain: both looks said "missing", the CREATE TABLE fails
    because the table exists, and a fresh look makes that success. An error that is not
    a lost race (here: a schema that does not exist) is raised."""
    name = f"ddl_{uuid.uuid4().hex[:10]}"
    engine = engine_for(jdbc_url, None, None)
    try:
        assert create_table_if_missing(engine, _table(name)) is True
        real_inspect = _ddl.inspect
        looks: list[str] = []

        class Stale:
            def __init__(self, conn: Any) -> None:
                self._real = real_inspect(conn)

            def has_table(self, table: str, schema: str | None = None) -> bool:
                looks.append("under the lock")
                return False

            def get_columns(self, table: str, schema: str | None = None) -> Any:
                return self._real.get_columns(table, schema=schema)

        def stale_first(engine: Engine, table: Table) -> bool:
            looks.append("fresh" if looks else "first")
            if len(looks) == 1:
                return False
            with engine.connect() as conn:
                return bool(real_inspect(conn).has_table(table.name, schema=table.schema))

        monkeypatch.setattr(_ddl, "inspect", Stale)
        monkeypatch.setattr(_ddl, "_has_table", stale_first)
        assert create_table_if_missing(engine, _table(name)) is False
        assert looks == ["first", "under the lock", "fresh"]
        monkeypatch.undo()
        with pytest.raises(DBAPIError):
            create_table_if_missing(engine, _table(name, "no_such_schema_kafka_txn"))
    finally:
        engine.dispose()


@pytest.mark.broker
@pytest.mark.guarantee("4.9a")
def test_dual_writers_start_at_once_on_a_fresh_state_table(broker, jdbc_url):
    """Sixteen DualWriters with distinct transactional ids start at the same moment on one
    fresh state table (a Spark batch 0 on a fresh database): every start() succeeds, and
    the table holds each writer's row with its owner."""
    state_table = f"state_{uuid.uuid4().hex[:10]}"
    prefix = f"ddl-{uuid.uuid4().hex[:8]}"
    writers = [
        DualWriter(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{prefix}-{i}"},
            jdbc_url,
            state_table=state_table,
        )
        for i in range(WRITERS)
    ]
    for w in writers:  # connected already, so that the starts meet at the DDL
        with w.engine.connect():
            pass
    barrier = threading.Barrier(WRITERS)
    errors: list[str] = []

    def start(writer: DualWriter) -> None:
        barrier.wait(60)
        try:
            writer.start()
        except BaseException as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=start, args=(w,)) for w in writers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [], f"{len(errors)} of {WRITERS} start() failed: {errors[:3]}"
        with writers[0].engine.connect() as conn:
            table = writers[0].state_table
            rows = dict(conn.execute(select(table.c.transactional_id, table.c.owner)).all())
        assert rows == {w.transactional_id: w.owner for w in writers}
    finally:
        for w in writers:
            w.close()
