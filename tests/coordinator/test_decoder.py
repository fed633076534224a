"""The coordinator client's decoder (kafka_txn.coordinator.codec) against bytes no broker
should send: random, truncated and oversized bodies for every response the client reads,
and a DescribeTransactions answer truncated, changed or extended. Each is decoded or
refused with the decoder's documented error (a ValueError the connection turns into
ProtocolError), never another exception or a hang, and never decoded silently into
another transaction (guarantee 3.9). Hypothesis draws the bytes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_txn.coordinator import codec, messages

pytestmark = pytest.mark.adversary

_APIS = [
    (api, version)
    for api in (
        messages.API_VERSIONS,
        messages.FIND_COORDINATOR,
        messages.DESCRIBE_TRANSACTIONS,
        messages.END_TXN,
        messages.INIT_PRODUCER_ID,
        messages.SASL_HANDSHAKE,
        messages.SASL_AUTHENTICATE,
    )
    for version in api.responses
]

_DESCRIBED = {
    "throttle_time_ms": 0,
    "transaction_states": [
        {
            "error_code": 0,
            "transactional_id": "tx-é",
            "transaction_state": "Ongoing",
            "transaction_timeout_ms": 60000,
            "transaction_start_time_ms": 1_700_000_000_123,
            "producer_id": 1000,
            "producer_epoch": 3,
            "topics": [{"topic": "orders", "partitions": [0, 1, 2]}],
        }
    ],
}


def _decodes_or_refuses(api: Any, version: int, data: bytes) -> dict[str, Any] | None:
    """The coordinator client's decoder on ``data``: a value, or None for a refusal the
    connection turns into ProtocolError (DecodeError; UnicodeDecodeError, both
    ValueErrors). Anything else escapes the documented errors."""
    try:
        return codec.decode(api.responses[version], data, api.flexible(version))
    except ValueError:
        return None


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(_APIS), data=st.binary(max_size=300))
@pytest.mark.guarantee("3.9")
def test_the_decoder_refuses_arbitrary_bytes_with_its_documented_error(
    case: tuple[Any, int], data: bytes
) -> None:
    """Random, truncated and oversized bodies (lengths and counts up to 2**63) for every
    response this client reads: decoded or refused with DecodeError, never another
    exception, never a hang (arrays are bounded by the bytes left)."""
    api, version = case
    _decodes_or_refuses(api, version, data)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    cut=st.integers(min_value=0, max_value=200),
    flips=st.lists(st.tuples(st.integers(0, 199), st.integers(1, 255)), max_size=3),
    tail=st.binary(max_size=8),
)
@pytest.mark.guarantee("3.9")
def test_a_mangled_describe_answer_never_decodes_into_another_transaction_silently(
    cut: int, flips: list[tuple[int, int]], tail: bytes
) -> None:
    """A DescribeTransactions answer truncated, with bytes changed or with bytes
    appended: refused, or (bytes changed) decoded into values that encode back to
    exactly the bytes read - nothing is read past a field or skipped."""
    api = messages.DESCRIBE_TRANSACTIONS
    good = codec.encode(api.responses[0], _DESCRIBED, True)
    assert codec.decode(api.responses[0], good, True) == _DESCRIBED
    data = bytearray(good[:cut] if cut < len(good) else good)
    for at, xor in flips:
        if at < len(data):
            data[at] ^= xor
    data += tail
    if cut < len(good) and not flips and not tail:
        assert _decodes_or_refuses(api, 0, bytes(data)) is None  # truncated
        return
    if tail and not flips and cut >= len(good):
        assert _decodes_or_refuses(api, 0, bytes(data)) is None  # trailing bytes
        return
    decoded = _decodes_or_refuses(api, 0, bytes(data))
    if decoded is not None and all(xor for _, xor in flips):
        # Canonical forms only: BOOL is absent here; varints/tags re-encode minimal.
        again = codec.encode(api.responses[0], decoded, True)
        if again != bytes(data):
            # Only a non-minimal varint or a skipped tagged field may differ.
            assert len(again) < len(data)
