"""PreparedTxnState: exact round trips, the empty and Java forms, downgrade safety, and a
parser that raises nothing but its documented error."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_txn import InvalidPreparedStateError, PreparedTxnState
from kafka_txn.state import MAX_SERIALIZED_LENGTH

_ids = st.text(min_size=1, max_size=60)
states = st.builds(
    PreparedTxnState,
    transactional_id=st.none() | _ids,
    producer_id=st.integers(0, 2**63 - 1),
    producer_epoch=st.integers(0, 32767),
    txn_start_ms=st.none() | st.integers(0, 2**63 - 1),
    cluster_id=st.none() | _ids,
    timeout_ms=st.none() | st.integers(0, 2**31 - 1),
    completed=st.booleans(),
)


@given(states)
def test_every_valid_state_round_trips_exactly(state):
    text = str(state)
    assert len(text) <= MAX_SERIALIZED_LENGTH
    assert PreparedTxnState(text) == state
    assert PreparedTxnState.parse(text) == state
    assert str(PreparedTxnState(text)) == text


@given(st.text(max_size=200))
def test_arbitrary_strings_raise_only_the_documented_error(text):
    try:
        state = PreparedTxnState(text)
    except InvalidPreparedStateError as exc:
        assert "invalid PreparedTxnState" in str(exc)
    else:
        assert PreparedTxnState(str(state)) == state


_PIECES = ["pid=1", "epoch=2", "tid=x", "start=5", "x=y", "=", ";", "kafka-txn:1"]


@given(st.lists(st.sampled_from(_PIECES), max_size=8))
def test_near_miss_strings_raise_only_the_documented_error(parts):
    text = ";".join(parts)
    try:
        state = PreparedTxnState(text)
    except InvalidPreparedStateError:
        return
    assert PreparedTxnState(str(state)) == state


def test_empty_string_is_no_transaction():
    assert PreparedTxnState("") == PreparedTxnState.EMPTY
    assert PreparedTxnState.EMPTY.is_empty
    assert str(PreparedTxnState.EMPTY) == ""
    assert PreparedTxnState.EMPTY.mark_completed() == PreparedTxnState.EMPTY


def test_java_form_parses():
    state = PreparedTxnState("4001:7")
    assert (state.producer_id, state.producer_epoch) == (4001, 7)
    assert state.transactional_id is None and state.txn_start_ms is None


def test_unknown_fields_from_a_newer_writer_are_ignored():
    state = PreparedTxnState("kafka-txn:1;tid=t;pid=1;epoch=2;start=3;zone=eu-west;x2=%41")
    assert state == PreparedTxnState(
        transactional_id="t", producer_id=1, producer_epoch=2, txn_start_ms=3
    )


def test_start_minus_one_means_unknown():
    assert PreparedTxnState("kafka-txn:1;pid=1;epoch=2;start=-1").txn_start_ms is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("kafka-txn:2;pid=1;epoch=1", "format version 2"),
        ("kafka-txn:x;pid=1", "not a number"),
        ("kafka-txn:1;pid=1", "'epoch' is missing"),
        ("kafka-txn:1;pid=1;epoch=1;pid=1", "appears twice"),
        ("kafka-txn:1;pid=one;epoch=1", "pid='one' is not an integer"),
        ("kafka-txn:1;pid=1;epoch=40000", "producer_epoch"),
        ("kafka-txn:1;pid=1;epoch=1;tid=%C3%28", "percent-encoded UTF-8"),
        ("kafka-txn:1;pid=1;epoch=1;done=yes", "done='yes'"),
        ("kafka-txn:1;pid=1;epoch=1;novalue", "not key=value"),
        ("12:", "expected ''"),
        ("x" * (MAX_SERIALIZED_LENGTH + 1), f"longer than {MAX_SERIALIZED_LENGTH}"),
    ],
)
def test_malformed_states_say_what_is_wrong(text, needle):
    with pytest.raises(InvalidPreparedStateError) as info:
        PreparedTxnState(text)
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


def test_non_string_is_refused_clearly():
    with pytest.raises(InvalidPreparedStateError, match="is a str, got int"):
        PreparedTxnState(42)  # type: ignore[arg-type]


def test_state_is_immutable_and_field_wise_equal():
    a = PreparedTxnState(transactional_id="t", producer_id=1, producer_epoch=2, txn_start_ms=3)
    b = PreparedTxnState(str(a))
    assert a == b and a is not b
    assert a != a.mark_completed()
    with pytest.raises(ValueError):
        a.producer_id = 5  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(a)) == a


def test_fields_and_text_are_exclusive():
    with pytest.raises(TypeError):
        PreparedTxnState("1:2", producer_id=1)
