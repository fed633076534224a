"""The Spark sink's settings: Spark-style names, case-insensitive; every option honoured
or refused by name, never ignored; bad values refused with the fix. No Spark needed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import create_engine

from kafka_txn import ConfigurationError
from kafka_txn._spark_options import SinkOptions, with_isolation
from kafka_txn.spark import KafkaJdbcSink
from tests import spark_hooks

BASE = {"kafka.bootstrap.servers": "h:1", "url": "jdbc:sqlite:x.db", "dbtable": "t",
        "transactionalIdPrefix": "p"}  # fmt: skip


def _sink(**options: Any) -> KafkaJdbcSink:
    return KafkaJdbcSink(options={**BASE, **options})


def test_option_names_are_case_insensitive_and_spark_spelled():
    sink = KafkaJdbcSink(
        options={"Kafka.Bootstrap.Servers": "h:1", "URL": "jdbc:sqlite:x.db",
                 "dbTable": "public.orders", "TransactionalIdPrefix": "orders",
                 "BatchSize": "250", "isolationlevel": "read_committed", "stateTable": "st",
                 "commitsTable": "ct", "startOver": "TRUE", "topic": "out",
                 "onStep": "tests.spark_hooks:RecordSteps"}
    )  # fmt: skip
    o = sink.options
    assert (o.kafka, o.url, o.dbtable, o.transactional_id_prefix) == (
        {"bootstrap.servers": "h:1"}, "jdbc:sqlite:x.db", "public.orders", "orders")  # fmt: skip
    assert (o.insert_batch_size, o.isolation_level, o.state_table, o.commits_table) == (
        250, "READ COMMITTED", "st", "ct")  # fmt: skip
    assert o.start_over is True and o.on_step is spark_hooks.RecordSteps


def test_keywords_win_over_options():
    sink = KafkaJdbcSink(transactional_id_prefix="kw", insert_batch_size=7,
                         options={**BASE, "batchsize": "3"})  # fmt: skip
    assert (sink.prefix, sink.options.insert_batch_size) == ("kw", 7)


@pytest.mark.parametrize(
    "name, reason",
    [("truncate", "only appends"), ("numPartitions", "repartition"),
     ("createTableColumnTypes", "maps column types"), ("fetchsize", "read option"),
     ("sessionInitStatement", "pooled"), ("driver", "follows from the URL"),
     ("kafka.transactional.id", "one id per partition")],
)  # fmt: skip
def test_spark_jdbc_options_that_do_not_apply_are_refused_by_name(name: str, reason: str):
    with pytest.raises(ConfigurationError, match=f"option '{name}' is not supported.*{reason}"):
        _sink(**{name: "x"})


def test_a_refusal_points_to_an_option_that_exists():
    with pytest.raises(ConfigurationError, match="lockTimeout") as refused:
        _sink(queryTimeout="5")
    assert "lockTimeout" in str(refused.value)
    assert _sink(lockTimeout="5").options.lock_timeout == 5.0
    assert _sink(lockTimeout="none").options.lock_timeout is None
    with pytest.raises(ConfigurationError, match="positive number of seconds"):
        _sink(lockTimeout="0")


def test_an_unknown_option_is_refused_with_the_known_ones():
    with pytest.raises(ConfigurationError, match=r"unknown option 'dbtabel'.*dbtable"):
        _sink(dbtabel="t2")


def test_the_same_option_twice_in_two_spellings_is_refused():
    with pytest.raises(ConfigurationError, match="'dbtable' and 'dbTable' are the same"):
        KafkaJdbcSink(options={**BASE, "dbTable": "t2"})


@pytest.mark.parametrize("level", ["NONE", "READ_UNCOMMITTED"])
def test_isolation_levels_that_allow_dirty_reads_are_refused(level: str):
    with pytest.raises(ConfigurationError, match="must not be read dirty"):
        _sink(isolationLevel=level)


def test_an_isolation_level_sqlite_lacks_is_refused_when_the_engine_is_made():
    o = _sink(isolationLevel="REPEATABLE_READ").options
    engine = create_engine("sqlite://")
    try:
        with pytest.raises(ConfigurationError, match="not available on SQLite"):
            with_isolation(engine, o.isolation_level)
        assert (
            with_isolation(engine, "SERIALIZABLE").get_execution_options()["isolation_level"]
            == "SERIALIZABLE"
        )
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "options, message",
    [({"batchsize": "0"}, "must be >= 1"), ({"batchsize": "many"}, "must be an integer"),
     ({"startOver": "yes"}, "must be true or false"),
     ({"onStep": "tests.spark_hooks:Nope"}, "cannot be imported"),
     ({"onStep": "not a hook"}, "module:attribute"),
     ({"dbtable": "a.b.c"}, "not a plain SQL identifier"),
     ({"dbtable": "x;drop"}, "not a plain SQL identifier"),
     ({"commitsTable": "c" * 60}, "commits_table \\+ '_queries'"),
     ({"transactionalIdPrefix": ""}, "1..200 characters")],
)  # fmt: skip
def test_bad_values_are_refused_with_the_fix(options: dict[str, str], message: str):
    with pytest.raises(ConfigurationError, match=message):
        _sink(**options)


_names = st.sampled_from(
    ["url", "dbtable", "DBTABLE", "topic", "batchsize", "isolationLevel", "startOver",
     "onStep", "truncate", "kafka.acks", "kafka.transactional.id", "stateTable", "bogus",
     "commitsTable", "transactionalIdPrefix", "user", "password"]
) | st.text(max_size=12)  # fmt: skip
_values = st.text(max_size=20) | st.integers().map(str) | st.sampled_from(
    ["true", "false", "SERIALIZABLE", "READ_UNCOMMITTED", "a.b", "tests.spark_hooks:X"]
)  # fmt: skip


@given(st.dictionaries(_names, _values, max_size=6))
def test_any_options_give_settings_or_a_configuration_error(options: dict[str, str]):
    """Fuzzed: the parser never fails any other way, and accepted settings are sane."""
    try:
        o = SinkOptions.build({}, {**BASE, **options})
    except ConfigurationError as exc:
        assert str(exc)
        return
    assert o.insert_batch_size >= 1 and o.transactional_id_prefix
    assert "transactional.id" not in o.kafka
