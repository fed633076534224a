"""The Spark sink's settings: Spark-style names, case-insensitive; every option honoured
or refused by name, never ignored; bad values refused with the fix. No Spark needed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from sqlalchemy import create_engine

from kafka_txn import ConfigurationError, TransactionalProducer
from kafka_txn.config import TWO_PHASE_COMMIT_KEY
from kafka_txn.spark.options import _REFUSED, _spark_spelling, with_isolation
from kafka_txn.spark.sink import KafkaJdbcSink
from tests.support import spark_hooks
from tests.support.fuzzing import assert_every_branch, reached_branches

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
                 "onStep": "tests.support.spark_hooks:RecordSteps"}
    )  # fmt: skip
    o = sink.options
    assert (o.kafka, o.url, o.dbtable, o.transactional_id_prefix) == (
        {"bootstrap.servers": "h:1"}, f"jdbc:sqlite:{os.path.abspath('x.db')}",
        "public.orders", "orders")  # fmt: skip
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
@pytest.mark.guarantee("5.9")
def test_spark_jdbc_options_that_do_not_apply_are_refused_by_name(name: str, reason: str):
    with pytest.raises(ConfigurationError, match=f"option '{name}' is not supported.*{reason}"):
        _sink(**{name: "x"})


@pytest.mark.guarantee("5.9")
def test_a_refusal_points_to_an_option_that_exists():
    with pytest.raises(ConfigurationError, match="lockTimeout") as refused:
        _sink(queryTimeout="5")
    assert "lockTimeout" in str(refused.value)
    assert _sink(lockTimeout="5").options.lock_timeout == 5.0
    assert _sink(lockTimeout="none").options.lock_timeout is None
    with pytest.raises(ConfigurationError, match="positive number of seconds"):
        _sink(lockTimeout="0")


@pytest.mark.guarantee("5.9")
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
     ({"onStep": "tests.support.spark_hooks:Nope"}, "cannot be imported"),
     ({"onStep": "not a hook"}, "module:attribute"),
     ({"dbtable": "a.b.c"}, "not a plain SQL identifier"),
     ({"dbtable": "x;drop"}, "not a plain SQL identifier"),
     ({"commitsTable": "c" * 60}, "commits_table \\+ '_queries'"),
     ({"transactionalIdPrefix": ""}, "1..200 characters")],
)  # fmt: skip
def test_bad_values_are_refused_with_the_fix(options: dict[str, str], message: str):
    with pytest.raises(ConfigurationError, match=message):
        _sink(**options)


# ---------------------------------------------------------------- fuzzing the options
# Every example is a valid set of options (each name in a random letter case: Spark's
# names are case-insensitive; the batch size sometimes given as a keyword, which wins)
# with zero, one or two parts broken. Each break's refusal (its text and the option it
# names) or the settings the options give are known when the example is made; nothing
# else is ever raised.
_IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
# Each URL given, and the one the sink keeps: a relative SQLite path made absolute on the
# driver (the tasks run in other processes, perhaps in other directories).
_URLS = [
    ("jdbc:sqlite:x.db", f"jdbc:sqlite:{os.path.abspath('x.db')}"),
    ("jdbc:sqlite:/srv/data/x.db", "jdbc:sqlite:/srv/data/x.db"),
    ("jdbc:postgresql://127.0.0.1:5432/test", "jdbc:postgresql://127.0.0.1:5432/test"),
    ("jdbc:mysql://127.0.0.1:3306/test", "jdbc:mysql://127.0.0.1:3306/test"),
    ("sqlite:///x.db", f"sqlite:///{os.path.abspath('x.db')}"),
]
_ISOLATION_SPELLINGS = [
    ("READ_COMMITTED", "READ COMMITTED"),
    ("read committed", "READ COMMITTED"),
    ("Repeatable_Read", "REPEATABLE READ"),
    ("serializable", "SERIALIZABLE"),
]
_OPTIONAL: dict[str, tuple[str, st.SearchStrategy[tuple[str, Any]]]] = {
    "topic": ("topic", st.text(min_size=1, max_size=10).map(lambda t: (t, t))),
    "user": ("user", st.text(max_size=5).map(lambda t: (t, t))),
    "password": ("password", st.text(max_size=5).map(lambda t: (t, t))),
    "batchSize": ("insert_batch_size", st.integers(1, 10**6).map(lambda n: (str(n), n))),
    "isolationLevel": ("isolation_level", st.sampled_from(_ISOLATION_SPELLINGS)),
    "startOver": ("start_over", st.sampled_from([("true", True), ("FALSE", False)])),
    "lockTimeout": (
        "lock_timeout",
        st.just(("none", None)) | st.floats(0.001, 1e6).map(lambda x: (repr(x), x)),
    ),
    "stateTable": ("state_table", _IDENT.map(lambda t: (t, t))),
    "commitsTable": ("commits_table", _IDENT.map(lambda t: (t, t))),
    "onStep": (
        "on_step",
        st.just(("tests.support.spark_hooks:RecordSteps", spark_hooks.RecordSteps)),
    ),
}


@dataclass
class _SinkCase:
    options: dict[Any, Any]
    keywords: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, Any] = field(default_factory=dict)
    refusals: list[tuple[str, str]] = field(default_factory=list)  # (branch, text it names)


def _cased(draw: st.DrawFn, name: str) -> str:
    return "".join(c.upper() if draw(st.booleans()) else c.lower() for c in name)


@st.composite
def _valid_sinks(draw: st.DrawFn) -> _SinkCase:
    prefix = draw(st.text(min_size=1, max_size=30) | st.just("p" * 200))
    expected: dict[str, Any] = {
        "transactional_id_prefix": prefix,
        "url": (url := draw(st.sampled_from(_URLS)))[1],
        "dbtable": draw(_IDENT | st.tuples(_IDENT, _IDENT).map(".".join)),
        "kafka": {"bootstrap.servers": "127.0.0.1:9092"},
        "topic": None,
        "user": None,
        "password": None,
        "insert_batch_size": 1000,
        "isolation_level": None,
        "state_table": "kafka_transaction_state",
        "commits_table": "kafka_txn_sink_commits",
        "on_step": None,
        "start_over": False,
        "lock_timeout": 30.0,
    }
    options: dict[str, Any] = {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "url": url[0],
        "dbtable": expected["dbtable"],
        "transactionalIdPrefix": prefix,
    }
    # Kafka settings librdkafka accepts (the sink probes them as a producer would).
    kafka_values = {
        "linger.ms": st.integers(0, 900_000).map(str),
        "client.id": st.text(st.characters(codec="ascii", min_codepoint=33), max_size=5),
        "compression.type": st.sampled_from(["none", "gzip", "snappy", "lz4", "zstd"]),
    }
    for name in sorted(draw(st.sets(st.sampled_from(sorted(kafka_values))))):
        options[f"kafka.{name}"] = expected["kafka"][name] = draw(kafka_values[name])
    for name in sorted(draw(st.sets(st.sampled_from(sorted(_OPTIONAL))))):
        field_name, values = _OPTIONAL[name]
        options[name], expected[field_name] = draw(values)
    case = _SinkCase({_cased(draw, name): value for name, value in options.items()})
    if draw(st.booleans()):  # a keyword wins over its option
        case.keywords["insert_batch_size"] = draw(st.integers(1, 100))
        expected["insert_batch_size"] = case.keywords["insert_batch_size"]
    case.expected = expected
    return case


def _key(case: _SinkCase, name: str) -> str | None:
    """How option ``name`` is spelled in the case, if it is there."""
    return next((k for k in case.options if isinstance(k, str) and k.lower() == name.lower()), None)


def _set(case: _SinkCase, name: str, value: Any) -> str:
    key = _key(case, name) or name
    case.options[key] = value
    return key


def _drop(case: _SinkCase, name: str) -> None:
    case.options.pop(_key(case, name), None)


def _name_not_a_string(draw: st.DrawFn, case: _SinkCase) -> None:
    key = draw(st.sampled_from([5, None, b"url", ("url",)]))
    case.options[key] = "x"
    case.refusals.append(("name not a string", f"option names are strings, not {key!r}"))


def _same_option_twice(draw: st.DrawFn, case: _SinkCase) -> None:
    key = _key(case, draw(st.sampled_from(["url", "dbtable", "transactionalIdPrefix"])))
    if key is None:  # dropped by another break
        return
    other = key.lower() if key.lower() != key else key.upper()
    case.options[other] = case.options[key]
    case.refusals.append(("same option twice", "are the same option (names are case-insensitive"))


def _refused_option(draw: st.DrawFn, case: _SinkCase) -> None:
    name = draw(st.sampled_from(sorted(_REFUSED)))
    key = _cased(draw, name)
    if _key(case, key) is None:
        case.options[key] = "x"
        case.refusals.append(
            ("refused option", f"option {key!r} is not supported by the sink: {_REFUSED[name]}")
        )


def _unknown_option(draw: st.DrawFn, case: _SinkCase) -> None:
    key = draw(
        st.text(alphabet="abcdefkxyz.Q", min_size=1, max_size=10).filter(
            lambda k: k.lower() not in _KNOWN and not k.lower().startswith("kafka.")
        )
    )
    case.options[key] = "x"
    case.refusals.append(("unknown option", f"unknown option {key!r}: the sink takes kafka.*"))


def _kafka_id_by_keyword(draw: st.DrawFn, case: _SinkCase) -> None:
    key = draw(st.sampled_from(["transactional.id", TWO_PHASE_COMMIT_KEY]))
    case.keywords["kafka"] = {key: "x"}
    case.refusals.append(("set by the sink", f"{key} is set by the sink"))


def _no_servers(draw: st.DrawFn, case: _SinkCase) -> None:
    _drop(case, "kafka.bootstrap.servers")
    case.refusals.append(("no bootstrap servers", "Kafka bootstrap servers missing: pass kafka="))


def _bad_prefix(draw: st.DrawFn, case: _SinkCase) -> None:
    value = draw(st.sampled_from(["", "p" * 201, None]))
    if value is None:
        _drop(case, "transactionalIdPrefix")
    else:
        _set(case, "transactionalIdPrefix", value)
    case.refusals.append(("bad prefix", "(option transactionalIdPrefix) must be 1..200 characters"))


def _kafka_setting_refused(draw: st.DrawFn, case: _SinkCase) -> None:
    name, value, text = draw(
        st.sampled_from(
            [
                ("enable.idempotence", "false", "enable.idempotence=false cannot be used"),
                # librdkafka's own refusals, which each task's producer would meet
                ("acks", "1", "`acks` must be set to `all` when `enable.idempotence`"),
                ("linger.ms", "", 'property "queue.buffering.max.ms" cannot be set to empty'),
                ("message.max.bytes", "100", '"message.max.bytes" value 100 is outside'),
                ("transaction.timeout.ms", "10", "transaction.timeout.ms=10 is too small"),
                (
                    "ssl.keystore.location",
                    "/k.jks",
                    "ssl.keystore.location is not supported by kafka-txn",
                ),
                (
                    "sasl.nosuch",
                    "x",
                    "sasl.nosuch is not a setting kafka-txn's coordinator client knows",
                ),
            ]
        )
    )
    _set(case, f"kafka.{name}", value)
    case.refusals.append(("Kafka setting refused", text))


def _no_url_or_table(draw: st.DrawFn, case: _SinkCase) -> None:
    _drop(case, draw(st.sampled_from(["url", "dbtable"])))
    case.refusals.append(("no url or dbtable", "the sink needs url= (a JDBC URL) and dbtable="))


def _bad_url(draw: st.DrawFn, case: _SinkCase) -> None:
    url, text = draw(
        st.sampled_from(
            [
                ("jdbc:nosuch://h/db", "unsupported subprotocol 'nosuch'"),
                ("jdbc:postgresql://h:0/db", "port 0 is not a port"),
                ("jdbc:postgresql://h/db?bogusParam=1", "unsupported parameter(s) 'bogusParam'"),
                ("not a url", "is neither a JDBC URL nor a SQLAlchemy URL"),
                ("jdbc:sqlite::memory:", "cannot write to an in-memory SQLite database"),
                ("sqlite://", "cannot write to an in-memory SQLite database"),
            ]
        )
    )
    _set(case, "url", url)
    case.refusals.append(("bad url", text))


def _option_value(branch: str, name: str, values: list[str], text: str) -> Any:
    def brk(draw: st.DrawFn, case: _SinkCase) -> None:
        value = draw(st.sampled_from(values))
        _set(case, name, value)
        if name == "batchSize":  # or the keyword would win over it
            case.keywords.pop("insert_batch_size", None)
        case.refusals.append((branch, text.format(value=value)))

    return brk


_KNOWN = {*(n.lower() for n in _spark_spelling()), *_REFUSED}
_SINK_BREAKS = [
    _name_not_a_string,
    _same_option_twice,
    _refused_option,
    _unknown_option,
    _kafka_id_by_keyword,
    _no_servers,
    _bad_prefix,
    _kafka_setting_refused,
    _no_url_or_table,
    _bad_url,
    _option_value(
        "batch size not an integer",
        "batchSize",
        ["many", "1.5", "", 1.5, float("nan")],
        "insert_batch_size (batchsize) must be an integer, not {value!r}",
    ),
    _option_value(
        "batch size below 1", "batchSize", ["0", "-3"], "insert_batch_size (batchsize) must be >= 1"
    ),
    _option_value(
        "dirty isolation level",
        "isolationLevel",
        ["NONE", "read_uncommitted", "Read Uncommitted"],
        "must not be read dirty",
    ),
    _option_value(
        "unknown isolation level",
        "isolationLevel",
        ["SNAPSHOT", "chaos", ""],
        "isolationLevel {value!r} is not one of READ_COMMITTED, REPEATABLE_READ",
    ),
    _option_value(
        "onStep cannot be imported",
        "onStep",
        ["tests.support.spark_hooks:Nope", "no_such_module_kt:f"],
        "onStep {value!r} cannot be imported",
    ),
    _option_value(
        "onStep not a hook",
        "onStep",
        ["not a hook", "tests.support.spark_hooks", "tests.support.spark_hooks:os"],
        "onStep must be a callable or 'module:attribute' naming one, not {value!r}",
    ),
    _option_value(
        "startOver not a flag",
        "startOver",
        ["yes", "1", ""],
        "start_over (startOver) must be true or false, not {value!r}",
    ),
    _option_value(
        "bad lock timeout",
        "lockTimeout",
        ["0", "-1", "soon", "inf", "nan"],
        "lock_timeout (lockTimeout)=",
    ),
    _option_value(
        "bad table name", "dbtable", ["a.b.c", "x;drop", "1x"], "is not a plain SQL identifier"
    ),
    _option_value("bad table name", "stateTable", ["1abc", "s-t"], "state_table '"),
    _option_value("bad table name", "commitsTable", ["c" * 60], "commits_table + '_queries'"),
]
SINK_BRANCHES = {
    "valid",
    "name not a string",
    "same option twice",
    "refused option",
    "unknown option",
    "set by the sink",
    "no bootstrap servers",
    "bad prefix",
    "Kafka setting refused",
    "no url or dbtable",
    "bad url",
    "batch size not an integer",
    "batch size below 1",
    "dirty isolation level",
    "unknown isolation level",
    "onStep cannot be imported",
    "onStep not a hook",
    "startOver not a flag",
    "bad lock timeout",
    "bad table name",
}


@st.composite
def sink_cases(draw: st.DrawFn, breaks: st.SearchStrategy[list[Any]] | None = None) -> _SinkCase:
    """Valid options with the ``breaks`` drawn (by default: none, one or two of any)."""
    case = draw(_valid_sinks())
    any_two = st.lists(st.sampled_from(_SINK_BREAKS), max_size=2)
    for brk in draw(breaks if breaks is not None else any_two):
        brk(draw, case)
    return case


def _check_sink(case: _SinkCase) -> str:
    """Build a sink from one case; assert the outcome it must have; return its branch."""
    try:
        sink = KafkaJdbcSink(options=case.options, **case.keywords)
    except ConfigurationError as exc:
        message = str(exc)
        reached = [branch for branch, text in case.refusals if text in message]
        assert reached, f"{message!r} is none of the refusals expected: {case.refusals}"
        return reached[0]
    assert not case.refusals, f"{case.options!r} accepted, expected {case.refusals}"
    o = sink.options
    for name, value in case.expected.items():
        assert getattr(o, name) == value, name
    assert "transactional.id" not in o.kafka and sink.prefix == o.transactional_id_prefix
    if o.password is not None:
        assert "password='***'" in repr(o)  # never shown
    return "valid"


@given(sink_cases())
@pytest.mark.guarantee("5.9")
def test_any_options_give_settings_or_a_configuration_error(case: _SinkCase):
    """Fuzzed from valid options: the parser never fails any other way, refuses naming
    the option and the fix, and accepted options give the settings they say."""
    event(_check_sink(case))


def test_fuzzing_the_options_reaches_every_branch():
    counts = reached_branches(sink_cases(), _check_sink, examples=200)
    for brk in _SINK_BREAKS:  # each break alone, then with another
        counts += reached_branches(sink_cases(st.just([brk])), _check_sink, examples=10)
        counts += reached_branches(
            sink_cases(st.tuples(st.just(brk), st.sampled_from(_SINK_BREAKS)).map(list)),
            _check_sink,
            examples=5,
        )
    assert_every_branch(counts, SINK_BRANCHES)
    assert counts["valid"] >= 50, counts


@pytest.mark.adversary
@pytest.mark.parametrize(
    "setting",
    [
        {"acks": "1"},
        {"max.in.flight.requests.per.connection": 10},
        {"retries": 0},
        {"message.max.bytes": 100},
    ],
    ids=["acks=1", "max.in.flight=10", "retries=0", "message.max.bytes=100"],
)
def test_kafka_settings_a_task_producer_refuses_are_refused_when_the_sink_is_built(
    tmp_path: Path, setting: dict[str, Any]
) -> None:
    """docs/guide/spark.md, 5.9: "The Kafka settings are checked on the driver too, when
    the sink is built, the way each task's TransactionalProducer checks them": a setting
    every task's producer refuses is refused by KafkaJdbcSink(...), not inside every task
    of the first batch."""
    conf = {"bootstrap.servers": "127.0.0.1:9", "transactional.id": "sink-0", **setting}
    with pytest.raises(ConfigurationError):  # what each task's producer does
        TransactionalProducer(conf).close()
    with pytest.raises(ConfigurationError):
        KafkaJdbcSink(
            transactional_id_prefix="sink",
            kafka={"bootstrap.servers": "127.0.0.1:9", **setting},
            topic="t",
            url=f"jdbc:sqlite:{tmp_path / 'db.sqlite'}",
            dbtable="t",
        )
