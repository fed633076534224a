"""Bad input is refused before anything connects, with a message naming key and fix."""

from __future__ import annotations

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
