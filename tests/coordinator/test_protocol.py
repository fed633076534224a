"""The coordinator client's wire format, cross-checked byte for byte against kafka-python's
encoder (generated from Apache Kafka's JSON message specs), and SCRAM against RFC 7677."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event, given
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
from tests.support.fuzzing import assert_every_branch, reached_branches

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


# ---------------------------------------------------------------- fuzzing the decoder
# Every example is a valid response body (random values for one version of one API the
# client reads, encoded by the codec) with one part damaged the way a wrong version or a
# broken peer would: cut short, bytes left over, a null in a non-nullable string, invalid
# UTF-8, an array longer than the body, a varint of more than 64 bits; or unknown tagged
# fields added, which a reader skips (KIP-482). The outcome of each is known when it is
# made; decoding raises only DecodeError or UnicodeDecodeError (both ValueError, which
# connection.py reports as a bad answer), and an undamaged body decodes to its values.
_APIS = [
    API_VERSIONS,
    FIND_COORDINATOR,
    DESCRIBE_TRANSACTIONS,
    END_TXN,
    INIT_PRODUCER_ID,
    SASL_HANDSHAKE,
    SASL_AUTHENTICATE,
]
_RESPONSES = [(api, version) for api in _APIS for version in sorted(api.responses)]
_FIXED_RANGES = {">b": 7, ">h": 15, ">i": 31, ">q": 63}
_DECODE_REFUSALS = {
    "truncated": r"^truncated: wanted -?\d+ bytes at offset \d+ of \d+$",
    "bytes left over": r"^\d+ bytes left over after the message$",
    "null in a non-nullable string": r"^null in a non-nullable string field$",
    "array longer than the body": r"^array of \d+ items cannot fit in \d+ bytes$",
    "varint of more than 64 bits": r"^unsigned varint longer than 64 bits$",
}
CODEC_BRANCHES = {"valid", "invalid UTF-8", *_DECODE_REFUSALS}


def _values(kind: codec.FieldType) -> st.SearchStrategy[Any]:
    """Values the codec can encode as ``kind``."""
    if isinstance(kind, codec.Struct):
        return st.fixed_dictionaries({name: _values(k) for name, k in kind.fields})
    if isinstance(kind, codec.Array):
        return st.none() | st.lists(_values(kind.item), max_size=3)
    if kind is codec.BOOL:
        return st.booleans()
    if kind in (codec.INT8, codec.INT16, codec.INT32, codec.INT64):
        bits = _FIXED_RANGES[kind.fmt]
        return st.integers(-(2**bits), 2**bits - 1)
    if kind is codec.STRING:
        return st.text(max_size=10)
    if kind is codec.NULLABLE_STRING:
        return st.none() | st.text(max_size=10)
    assert kind is codec.BYTES, kind
    return st.none() | st.binary(max_size=10)


class _Saboteur(codec.FieldType):
    """Writes damaged bytes where a field of the schema goes; counts how often it did."""

    def __init__(self, damage: str, original: codec.FieldType) -> None:
        self.damage, self.original, self.written = damage, original, 0

    def encode(self, w: codec.Writer, value: Any, flexible: bool) -> None:
        self.written += 1
        if self.damage == "null in a non-nullable string":
            codec.NULLABLE_STRING.encode(w, None, flexible)
        elif self.damage == "invalid UTF-8":  # a string's length, then bytes no UTF-8
            codec._length(w, 3, flexible, ">h")
            w.raw(b"ok\xff")
        elif self.damage == "array longer than the body":
            if flexible:
                w.uvarint(2**31)
            else:
                w.raw(struct.pack(">i", 2**31 - 1))
        elif self.damage == "varint of more than 64 bits":
            w.raw(b"\xff" * 10)
        else:
            assert self.damage == "tagged fields", self.damage
            assert isinstance(self.original, codec.Struct)
            for name, kind in self.original.fields:
                kind.encode(w, value[name], flexible)
            w.uvarint(2)  # two tags this reader does not know (KIP-482: skipped)
            for tag, data in ((0, b"\x01\x02"), (7, b"")):
                w.uvarint(tag)
                w.uvarint(len(data))
                w.raw(data)


def _fields(schema: codec.Schema, prefix: tuple[str, ...] = ()) -> list[Any]:
    """(path, kind) of every field, nested ones included (through arrays' items)."""
    out: list[Any] = []
    for name, kind in schema:
        out.append(((*prefix, name), kind))
        inner = kind.item if isinstance(kind, codec.Array) else kind
        if isinstance(inner, codec.Struct):
            out += _fields(inner.fields, (*prefix, name))
    return out


def _replaced(schema: codec.Schema, path: tuple[str, ...], new: codec.FieldType) -> codec.Schema:
    out = []
    for name, kind in schema:
        changed = kind
        if name == path[0]:
            if len(path) == 1:
                changed = new
            elif isinstance(kind, codec.Array):
                assert isinstance(kind.item, codec.Struct)
                changed = codec.Array(codec.Struct(_replaced(kind.item.fields, path[1:], new)))
            else:
                assert isinstance(kind, codec.Struct)
                changed = codec.Struct(_replaced(kind.fields, path[1:], new))
        out.append((name, changed))
    return tuple(out)


def _can_damage(damage: str, kind: codec.FieldType, flexible: bool) -> bool:
    if damage == "null in a non-nullable string":
        return kind is codec.STRING
    if damage == "invalid UTF-8":
        return kind in (codec.STRING, codec.NULLABLE_STRING)
    if damage == "array longer than the body":
        return isinstance(kind, codec.Array)
    if damage == "varint of more than 64 bits":  # a compact length (KIP-482)
        return flexible and isinstance(kind, (codec.Array, codec._String))
    return flexible and isinstance(kind, codec.Array) and isinstance(kind.item, codec.Struct)


_DAMAGES = [
    "none",
    "truncated",
    "bytes left over",
    "null in a non-nullable string",
    "invalid UTF-8",
    "array longer than the body",
    "varint of more than 64 bits",
    "tagged fields",
    "random bytes spliced in",
]


@dataclass
class _Body:
    api: Api
    version: int
    damage: str
    data: bytes
    value: dict[str, Any]
    expected: str | None  # the branch; None: a random splice, any outcome but a crash

    @property
    def flexible(self) -> bool:
        return self.api.flexible(self.version)


@st.composite
def bodies(draw: st.DrawFn, damages: st.SearchStrategy[str] | None = None) -> _Body:
    api, version = draw(st.sampled_from(_RESPONSES))
    schema, flexible = api.responses[version], api.flexible(version)
    damage = draw(damages if damages is not None else st.sampled_from(_DAMAGES))
    value = draw(_values(codec.Struct(schema)))
    data = codec.encode(schema, value, flexible)
    body = _Body(api, version, damage, data, value, "valid" if damage == "none" else damage)
    if damage == "truncated":
        body.data = data[: draw(st.integers(0, len(data) - 1))]
    elif damage == "bytes left over":
        body.data = data + draw(st.binary(min_size=1, max_size=5))
    elif damage == "random bytes spliced in":
        at = draw(st.integers(0, len(data)))
        body.data, body.expected = data[:at] + draw(st.binary(max_size=8)) + data[at:], None
    elif damage != "none":
        candidates = [
            (path, kind) for path, kind in _fields(schema) if _can_damage(damage, kind, flexible)
        ]
        if damage == "tagged fields" and flexible:  # the top-level struct too
            candidates.append(((), codec.Struct(schema)))
        if not candidates:  # this body has no such field: left undamaged
            body.damage, body.expected = "none", "valid"
            return body
        path, kind = draw(st.sampled_from(candidates))
        if damage == "tagged fields" and path:  # in each item of an array of structs
            saboteur = _Saboteur(damage, kind.item)
            replacement: codec.FieldType = codec.Array(saboteur)
        else:
            saboteur = replacement = _Saboteur(damage, kind)
        if path:
            body.data = codec.encode(_replaced(schema, path, replacement), value, flexible)
        else:  # the top-level struct's tagged fields close the body
            w = codec.Writer()
            saboteur.encode(w, value, flexible)
            body.data = w.getvalue()
        if not saboteur.written:  # the field is in an array this value left empty or null
            body.damage, body.expected = "none", "valid"
        elif damage == "tagged fields":
            body.expected = "valid"
    return body


def _check_body(body: _Body) -> str:
    """Decode one body; assert the outcome it must have; return its branch."""
    try:
        decoded = codec.decode(body.api.responses[body.version], body.data, body.flexible)
    except codec.DecodeError as exc:
        reached = [n for n, pattern in _DECODE_REFUSALS.items() if re.match(pattern, str(exc))]
        assert len(reached) == 1, f"{exc} matches {reached}"
        branch = reached[0]
    except UnicodeDecodeError:
        branch = "invalid UTF-8"
    else:
        branch = "valid"
        if body.damage in ("none", "tagged fields"):
            assert decoded == body.value
    if body.expected is not None:
        # A body cut inside an array's count may read as a count too large for the rest.
        allowed = {body.expected}
        if body.expected == "truncated":
            allowed.add("array longer than the body")
        assert branch in allowed, f"{body.api.name} v{body.version} {body.damage}: {branch}"
    return branch


@given(bodies())
def test_decoding_a_damaged_body_raises_only_decode_errors(body: _Body):
    event(_check_body(body))
    event(f"damage: {body.damage}")


def test_decoding_fuzz_reaches_every_branch():
    counts = reached_branches(bodies(), _check_body, examples=200)
    for damage in _DAMAGES:
        counts += reached_branches(bodies(st.just(damage)), _check_body, examples=30)
    assert_every_branch(counts, CODEC_BRANCHES)
    assert counts["valid"] >= 50, counts


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
