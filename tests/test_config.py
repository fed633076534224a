"""Bad input is refused before anything connects, with a message naming key and fix."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_txn import ConfigurationError, ProducerSettings, TransactionalProducer
from kafka_txn.config import validate_config

BASE = {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t"}


@pytest.mark.parametrize(
    ("conf", "needle"),
    [
        ({"bootstrap.servers": "127.0.0.1:1"}, "transactional.id is required"),
        ({**BASE, "transactional.id": "  "}, "transactional.id is required"),
        ({**BASE, "transactional.id": 7}, "transactional.id must be a string"),
        ({"transactional.id": "t"}, "bootstrap.servers is required"),
        ({**BASE, "enable.idempotence": False}, "enable.idempotence=false"),
        ({**BASE, "enable.idempotence": "false"}, "enable.idempotence=false"),
        ({**BASE, "enable.idempotence": "maybe"}, "not a boolean"),
        ({**BASE, "delivery.report.only.error": True}, "delivery.report.only.error"),
        ({**BASE, "transaction.timeout.ms": 10}, "too small"),
        ({**BASE, "transaction.timeout.ms": "soon"}, "not a number"),
        ({**BASE, "on_delivery": "not callable"}, "on_delivery must be callable"),
        ({**BASE, "no.such.property": 1}, "no.such.property"),
        ({**BASE, "linger.ms": "not-a-number"}, "linger.ms"),
    ],
)
def test_bad_config_names_the_key(conf, needle):
    with pytest.raises(ConfigurationError) as info:
        TransactionalProducer(conf)
    assert needle in str(info.value)


def test_non_bytes_value_without_serializer_is_a_clear_type_error(producer_config, topic):
    with TransactionalProducer(producer_config) as p:
        p.init_transactions()
        p.begin_transaction()
        with pytest.raises(
            TypeError, match=r"value must be bytes, str or None, got dict.*value_serializer"
        ):
            p.produce(topic, {"a": 1})
        with pytest.raises(
            TypeError, match=r"key must be bytes, str or None, got int.*key_serializer"
        ):
            p.produce(topic, b"v", key=5)
        p.abort_transaction()


def test_serializers_are_applied_and_their_failures_reject_the_record(
    broker, producer_config, topic
):
    from kafka_txn import FailureType, ProduceFailedException

    def encode(obj, ctx):
        if obj == "bad":
            raise ValueError("cannot encode")
        return repr(obj).encode()

    with TransactionalProducer(producer_config, value_serializer=encode) as p:
        p.init_transactions()
        with p.transaction():
            p.produce(topic, {"a": 1})
        p.begin_transaction()
        with pytest.raises(ProduceFailedException) as info:
            p.produce(topic, "bad")
        assert info.value.failure_type is FailureType.MESSAGE_REJECTED
        p.abort_transaction()
    assert broker.read_committed(topic, expected=1) == [(None, b"{'a': 1}")]


def test_settings_model_builds_the_same_dict():
    settings = ProducerSettings(
        bootstrap_servers="127.0.0.1:1", transactional_id="t", extra={"linger.ms": 5}
    )
    by_alias = ProducerSettings.model_validate(
        {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t", "extra": {"linger.ms": 5}}
    )
    assert settings == by_alias
    validated = validate_config(settings)
    assert validated.librdkafka["linger.ms"] == 5
    assert validated.librdkafka["enable.idempotence"] is True
    assert validated.transaction_timeout_ms == 60_000


_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=20), st.floats(allow_nan=True)
)


@given(st.dictionaries(st.one_of(st.text(max_size=30), st.integers()), _values, max_size=6))
def test_fuzz_validate_config_raises_only_configuration_error(conf):
    try:
        validated = validate_config(conf)
    except ConfigurationError as exc:
        assert str(exc)
    else:
        assert validated.transactional_id.strip()
        assert validated.librdkafka["enable.idempotence"] is True


# ---------------------------------------------------------------- ProducerSettings errors
@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({}, ["bootstrap_servers (bootstrap.servers) is required", "host:port"]),
        (
            {"bootstrap_servers": "", "transactional_id": "t"},
            ["bootstrap_servers (bootstrap.servers)=''", "host:port"],
        ),
        (
            {"bootstrap_servers": "b", "transactional_id": ""},
            ["transactional_id (transactional.id)", "stable across restarts"],
        ),
        (
            {"bootstrap_servers": "b", "transactional_id": "t", "transaction_timeout_ms": 10},
            ["transaction_timeout_ms (transaction.timeout.ms)=10", "at least 1000"],
        ),
        (
            {"bootstrap_servers": "b", "transactional_id": "t", "two_phase_commit": "maybe"},
            ["two_phase_commit (transaction.two.phase.commit.enable)", "True or False"],
        ),
        (
            {"bootstrap_servers": "b", "transactional_id": "t", "extra": {"": 1}},
            ["extra", "not a librdkafka name"],
        ),
        (
            {"bootstrap_servers": "b", "transactional_id": "t", "extra": 5},
            ["extra", "dict keyed by their librdkafka names"],
        ),
        (
            {"bootstrap_server": "b", "transactional_id": "t"},
            ["'bootstrap_server' is not a ProducerSettings field", "'bootstrap_servers'"],
        ),
        (
            {"bootstrap.servers": "b", "transactional.id": "t", "linger.ms": 5},
            ["'linger.ms' is not a ProducerSettings field", "extra={'linger.ms': ...}"],
        ),
    ],
)
def test_settings_errors_are_configuration_errors_naming_field_and_fix(kwargs, needles):
    from pydantic import ValidationError

    with pytest.raises(ConfigurationError) as info:
        ProducerSettings(**kwargs)
    exc = info.value
    assert not isinstance(exc, ValidationError)
    for needle in needles:
        assert needle in str(exc)
    assert exc.__cause__ is None and exc.__suppress_context__  # wrapped once, no chain


_EMPTY_SERVERS = {"bootstrap.servers": "", "transactional.id": "t"}


@pytest.mark.parametrize(
    "validate",
    [
        lambda: ProducerSettings.model_validate(_EMPTY_SERVERS),
        lambda: ProducerSettings.model_validate_json(json.dumps(_EMPTY_SERVERS)),
        lambda: ProducerSettings.model_validate_strings(_EMPTY_SERVERS),
    ],
    ids=["model_validate", "model_validate_json", "model_validate_strings"],
)
def test_settings_validation_raises_one_configuration_error(validate):
    with pytest.raises(ConfigurationError) as info:
        validate()
    text = str(info.value)
    # pydantic runs validation through __init__: the error is not wrapped a second time.
    assert text.count("bad ProducerSettings") == 1 and "Value error" not in text
    assert "bootstrap_servers (bootstrap.servers)=''" in text
    assert info.value.__cause__ is None


def test_settings_errors_do_not_repeat_secrets():
    with pytest.raises(ConfigurationError) as info:
        ProducerSettings(bootstrap_servers=1, transactional_id="t", **{"sasl.password": "hunter2"})
    assert "'sasl.password' is not a ProducerSettings field" in str(info.value)
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        ProducerSettings(bootstrap_servers="b", transactional_id="t", extra={5: "hunter2"})
    assert "extra" in str(info.value) and "hunter2" not in str(info.value)


def test_settings_accept_any_mapping_and_librdkafka_names():
    from types import MappingProxyType

    settings = ProducerSettings(
        bootstrap_servers="b", transactional_id="t", extra=MappingProxyType({"linger.ms": 5})
    )
    assert settings.to_librdkafka()["linger.ms"] == 5
    by_name = ProducerSettings(**{"bootstrap.servers": "b", "transactional.id": "t"})
    assert by_name.bootstrap_servers == "b"
    assert settings.model_dump(by_alias=True)["bootstrap.servers"] == "b"


# ---------------------------------------------------------------- Mapping configs
class _ReadOnlyConfig(Mapping):
    """A Mapping that is not a dict (as a config loaded by a settings library may be)."""

    def __init__(self, data: dict) -> None:
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def test_producer_takes_a_mapping_config(broker, producer_config, topic):
    with TransactionalProducer(_ReadOnlyConfig(producer_config)) as p:
        p.init_transactions()
        with p.transaction():
            p.produce(topic, b"from a mapping")
    assert broker.read_committed(topic, expected=1) == [(None, b"from a mapping")]


def test_dual_writer_takes_a_mapping_config_and_the_producer_keywords(
    broker, producer_config, topic, tmp_path
):
    from kafka_txn import DualWriter
    from kafka_txn.metrics import InMemoryMetrics

    url = f"jdbc:sqlite:{tmp_path / 'w.db'}"
    with pytest.raises(ConfigurationError, match="operation_timeout=0"):
        DualWriter(MappingProxyType(producer_config), url, operation_timeout=0)
    with pytest.raises(TypeError, match="operation_timout"):
        DualWriter(producer_config, url, operation_timout=1)  # a typo is refused
    metrics = InMemoryMetrics()
    conf = _ReadOnlyConfig(producer_config)
    # DualWriter.__enter__ runs start(), before the transaction begins.
    with (
        DualWriter(conf, url, metrics=metrics, value_serializer=_upper) as writer,
        writer.transaction() as tx,
    ):
        tx.produce(topic, "mapped")
    assert broker.read_committed(topic, expected=1) == [(None, b"MAPPED")]
    assert metrics.calls[("commit_transaction", True)] >= 1, metrics.calls


def _upper(value, ctx):
    return value.upper().encode()


def test_exactly_once_processor_takes_mapping_configs(broker, producer_config, topic):
    from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord

    out = broker.create_topic()
    with TransactionalProducer({**producer_config, "transactional.id": f"in-{topic}"}) as p:
        p.init_transactions()
        with p.transaction():
            p.produce(topic, b"in", partition=0)
    consumer = MappingProxyType(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": f"g-{topic}"}
    )
    processor = ExactlyOnceProcessor(
        consumer,
        _ReadOnlyConfig(producer_config),
        [topic],
        lambda record: [OutputRecord(out, record.value() + b"-out")],
    )
    processor.run(max_batches=1, idle_timeout=60)
    assert broker.read_committed(out, expected=1) == [(None, b"in-out")]


def test_spark_sink_takes_mapping_options():
    from kafka_txn import KafkaJdbcSink

    sink = KafkaJdbcSink(
        transactional_id_prefix="p",
        url="jdbc:sqlite:/tmp/never-opened.db",
        dbtable="t",
        kafka=MappingProxyType({"bootstrap.servers": "127.0.0.1:1"}),
        options=_ReadOnlyConfig({"topic": "out"}),
    )
    assert sink.kafka == {"bootstrap.servers": "127.0.0.1:1"}
    assert sink.topic == "out"
