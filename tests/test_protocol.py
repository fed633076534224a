"""The coordinator client's wire format, cross-checked byte for byte against kafka-python's
encoder (generated from Apache Kafka's JSON message specs), and SCRAM against RFC 7677."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.admin.transactions import (
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
)
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
)
from kafka.protocol.producer.transaction import (
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from kafka_txn import ConfigurationError
from kafka_txn.coordinator import ConnectionSettings, codec
from kafka_txn.coordinator.messages import (
    API_VERSIONS,
    DESCRIBE_TRANSACTIONS,
    END_TXN,
    FIND_COORDINATOR,
    INIT_PRODUCER_ID,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    Api,
)
from kafka_txn.coordinator.scram import ScramClient, ScramError

REQUESTS: list[tuple[Api, Any, dict[str, Any]]] = [
    (API_VERSIONS, ApiVersionsRequest, {}),
    (FIND_COORDINATOR, FindCoordinatorRequest, {"key": "tx-é", "key_type": 1}),
    (DESCRIBE_TRANSACTIONS, DescribeTransactionsRequest, {"transactional_ids": ["a", "bc"]}),
    (
        END_TXN,
        EndTxnRequest,
        {"transactional_id": "tx", "producer_id": 2**40, "producer_epoch": 7, "committed": True},
    ),
    (
        INIT_PRODUCER_ID,
        InitProducerIdRequest,
        {
            "transactional_id": "tx",
            "transaction_timeout_ms": 60000,
            "producer_id": -1,
            "producer_epoch": -1,
            "enable_2pc": True,
            "keep_prepared_txn": True,
        },
    ),
    (SASL_HANDSHAKE, SaslHandshakeRequest, {"mechanism": "SCRAM-SHA-512"}),
    (SASL_AUTHENTICATE, SaslAuthenticateRequest, {"auth_bytes": b"\x00user\x00pw"}),
]


def _cases():
    for api, theirs, values in REQUESTS:
        for version in api.requests:
            if api is FIND_COORDINATOR and version >= 4:
                fields = {"key_type": 1, "coordinator_keys": ["tx-é", "other"]}
            else:
                names = {name for name, _ in api.requests[version]}
                fields = {k: v for k, v in values.items() if k in names}
            yield pytest.param(api, theirs, version, fields, id=f"{api.name}-v{version}")


# kafka-python's snake_case of a few spec names differs from ours.
THEIR_NAMES = {"enable_2pc": "enable2_pc"}


@pytest.mark.parametrize(("api", "theirs", "version", "fields"), list(_cases()))
def test_request_bytes_match_kafka_python(api, theirs, version, fields):
    ours = codec.encode(api.requests[version], fields, api.flexible(version))
    named = {THEIR_NAMES.get(k, k): v for k, v in fields.items()}
    assert ours == bytes(theirs[version](**named).encode())


def _describe_response() -> tuple[Any, dict[str, Any]]:
    state = DescribeTransactionsResponse.TransactionState
    theirs = DescribeTransactionsResponse[0](
        throttle_time_ms=3,
        transaction_states=[
            state(
                error_code=0,
                transactional_id="tx",
                transaction_state="Ongoing",
                transaction_timeout_ms=60000,
                transaction_start_time_ms=1732212345678,
                producer_id=4001,
                producer_epoch=7,
                topics=[state.TopicData(topic="orders", partitions=[0, 2])],
            )
        ],
    )
    return theirs, {
        "throttle_time_ms": 3,
        "transaction_states": [
            {
                "error_code": 0,
                "transactional_id": "tx",
                "transaction_state": "Ongoing",
                "transaction_timeout_ms": 60000,
                "transaction_start_time_ms": 1732212345678,
                "producer_id": 4001,
                "producer_epoch": 7,
                "topics": [{"topic": "orders", "partitions": [0, 2]}],
            }
        ],
    }


def test_describe_transactions_response_decodes():
    theirs, expected = _describe_response()
    assert codec.decode(DESCRIBE_TRANSACTIONS.responses[0], bytes(theirs.encode()), True) == (
        expected
    )


@pytest.mark.parametrize("version", list(END_TXN.responses))
def test_end_txn_response_decodes(version):
    data = bytes(EndTxnResponse[version](throttle_time_ms=1, error_code=90).encode())
    got = codec.decode(END_TXN.responses[version], data, END_TXN.flexible(version))
    assert got == {"throttle_time_ms": 1, "error_code": 90}


@pytest.mark.parametrize("version", [1, 2, 3])
def test_find_coordinator_response_decodes(version):
    data = bytes(
        FindCoordinatorResponse[version](
            throttle_time_ms=0, error_code=0, error_message=None, node_id=2, host="h", port=9
        ).encode()
    )
    got = codec.decode(
        FIND_COORDINATOR.responses[version], data, FIND_COORDINATOR.flexible(version)
    )
    assert (got["node_id"], got["host"], got["port"]) == (2, "h", 9)


def test_init_producer_id_v6_response_decodes():
    data = bytes(
        InitProducerIdResponse[6](
            throttle_time_ms=0,
            error_code=0,
            producer_id=5,
            producer_epoch=1,
            ongoing_txn_producer_id=5,
            ongoing_txn_producer_epoch=0,
        ).encode()
    )
    got = codec.decode(INIT_PRODUCER_ID.responses[6], data, True)
    assert (got["ongoing_txn_producer_id"], got["ongoing_txn_producer_epoch"]) == (5, 0)


def test_api_versions_and_sasl_responses_decode():
    av = ApiVersionsResponse[0](
        error_code=0,
        api_keys=[ApiVersionsResponse.ApiVersion(api_key=65, min_version=0, max_version=0)],
    )
    got = codec.decode(API_VERSIONS.responses[0], bytes(av.encode()), False)
    assert got["api_keys"] == [{"api_key": 65, "min_version": 0, "max_version": 0}]
    hs = SaslHandshakeResponse[1](error_code=0, mechanisms=["PLAIN", "SCRAM-SHA-256"])
    assert codec.decode(SASL_HANDSHAKE.responses[1], bytes(hs.encode()), False)["mechanisms"] == [
        "PLAIN",
        "SCRAM-SHA-256",
    ]
    auth = SaslAuthenticateResponse[1](
        error_code=0, error_message=None, auth_bytes=b"v=x", session_lifetime_ms=0
    )
    assert (
        codec.decode(SASL_AUTHENTICATE.responses[1], bytes(auth.encode()), False)["auth_bytes"]
        == b"v=x"
    )


@given(st.binary(max_size=300))
def test_decoding_garbage_raises_only_decode_error(data):
    for flexible in (False, True):
        try:
            codec.decode(DESCRIBE_TRANSACTIONS.responses[0], data, flexible)
        except codec.DecodeError:
            pass
        except UnicodeDecodeError:  # a string field with invalid UTF-8
            pass


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_uvarint_round_trip(n):
    w = codec.Writer()
    w.uvarint(n)
    assert codec.Reader(w.getvalue()).uvarint() == n


def test_scram_sha256_rfc7677_vector():
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = client.final(
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert final == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    client.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(ScramError, match="does not verify"):
        client.verify(b"v=AAAA")


def test_scram_refuses_a_server_that_ignores_our_nonce():
    client = ScramClient("SCRAM-SHA-512", "u", "p", nonce="abc")
    with pytest.raises(ScramError, match="nonce"):
        client.final(b"r=zzz,s=AAAA,i=4096")


@pytest.mark.parametrize(
    ("conf", "needle"),
    [
        ({"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL",
          "sasl.mechanism": "GSSAPI"}, "sasl.mechanism='GSSAPI'"),
        ({"bootstrap.servers": "h:1", "security.protocol": "SASL_PLAINTEXT",
          "sasl.mechanism": "OAUTHBEARER"}, "OAUTHBEARER"),
        ({"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL",
          "sasl.mechanism": "PLAIN"}, "sasl.username is required"),
        ({"bootstrap.servers": "h:1", "security.protocol": "TLS"}, "security.protocol='tls'"),
        ({"bootstrap.servers": "nohostport"}, "not host:port"),
    ],
)  # fmt: skip
def test_connection_settings_refuse_what_they_cannot_do(conf, needle):
    with pytest.raises(ConfigurationError) as info:
        ConnectionSettings.from_librdkafka(conf)
    assert needle in str(info.value)


def test_connection_settings_read_librdkafka_names():
    s = ConnectionSettings.from_librdkafka(
        {
            "bootstrap.servers": "SASL_SSL://a:1, b:2",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "scram-sha-512",
            "sasl.username": "u",
            "sasl.password": "s3cr3t-pw",
            "enable.ssl.certificate.verification": "false",
        }
    )
    assert s.bootstrap == (("a", 1), ("b", 2))
    assert (s.sasl_mechanism, s.ssl_verify) == ("SCRAM-SHA-512", False)
    assert "s3cr3t-pw" not in repr(s)  # secrets stay out of logs
