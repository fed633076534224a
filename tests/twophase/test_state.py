"""PreparedTxnState: exact round trips, the empty and Java forms, downgrade safety, and a
parser that raises nothing but its documented error."""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from kafka_txn import InvalidPreparedStateError, PreparedTxnState
from kafka_txn.state import MAX_SERIALIZED_LENGTH
from tests.support.fuzzing import assert_every_branch, reached_branches

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


# ---------------------------------------------------------------- fuzzing the parser
# Every example is a valid serialization (of a valid state) with one part mutated, so
# that each check of the parser is reached, and its success path too; the outcome each
# mutation should lead to is known when it is made. A refusal is the documented error
# saying what is wrong; an accepted text gives the state it stands for.
_INT_FIELDS = {
    "pid": "producer_id",
    "epoch": "producer_epoch",
    "start": "txn_start_ms",
    "timeout": "timeout_ms",
}
_REFUSALS = {
    "not a str": r"a serialized PreparedTxnState is a str, got ",
    "too long": rf"longer than {MAX_SERIALIZED_LENGTH} characters",
    "no known form": r"expected '' or 'pid:epoch' or a form starting with 'kafka-txn:1;'",
    "version not a number": r"format version ['\"].*['\"] is not a number",
    "newer version": r"format version \d+ is not readable by this kafka-txn .*: upgrade",
    "not key=value": r"field ['\"].*['\"] is not key=value",
    "field twice": r"field '(pid|epoch|tid|start|cluster|timeout|done)' appears twice",
    "field missing": r"field '(pid|epoch)' is missing",
    "not an integer": r"(pid|epoch|start|timeout)=['\"].*['\"] is not an integer",
    "out of range": r"(producer_id|producer_epoch|txn_start_ms|timeout_ms): Input should be",
    "bad percent-encoding": r"(tid|cluster) is not valid percent-encoded UTF-8",
    "done not 0 or 1": r"done=['\"].*['\"] must be 0 or 1",
}
STATE_BRANCHES = {"valid", *_REFUSALS}


@dataclass
class _StateCase:
    text: Any
    mutation: str
    expected: PreparedTxnState | None = None  # when valid
    refusal: str | None = None  # when refused; None for either: a splice of random text


def _items(state: PreparedTxnState) -> list[str]:
    return str(state).split(";")[1:]


def _with(items: list[str]) -> str:
    return ";".join(["kafka-txn:1", *items])


@st.composite
def state_cases(draw: st.DrawFn, mutations: st.SearchStrategy[str] | None = None) -> _StateCase:
    """A valid state's serialization with one of ``mutations`` (default: any) made."""
    state = draw(states)
    text, items = str(state), _items(state)
    mutation = draw(mutations if mutations is not None else st.sampled_from(_MUTATIONS))
    if mutation == "none":
        return _StateCase(text, mutation, expected=state)
    if mutation == "fields reordered":
        return _StateCase(_with(draw(st.permutations(items))), mutation, expected=state)
    if mutation == "unknown field added":  # written by a newer kafka-txn: ignored (KIP-915)
        key = draw(
            st.text(alphabet="abcxyz_-", min_size=1, max_size=6).filter(
                lambda k: k not in (*_INT_FIELDS, "tid", "cluster", "done")
            )
        )
        value = draw(st.text(alphabet="abc123%=-", max_size=6))
        at = draw(st.integers(0, len(items)))
        return _StateCase(
            _with([*items[:at], f"{key}={value}", *items[at:]]), mutation, expected=state
        )
    if mutation == "start unknown":
        kept = [i for i in items if not i.startswith("start=")]
        return _StateCase(
            _with([*kept, "start=-1"]),
            mutation,
            expected=state.model_copy(update={"txn_start_ms": None}),
        )
    if mutation == "Java form":
        return _StateCase(
            f"{state.producer_id}:{state.producer_epoch}",
            mutation,
            expected=PreparedTxnState(
                producer_id=state.producer_id, producer_epoch=state.producer_epoch
            ),
        )
    if mutation == "empty":
        return _StateCase("", mutation, expected=PreparedTxnState.EMPTY)
    if mutation == "not a str":
        return _StateCase(
            draw(st.sampled_from([text.encode(), 5, [text], {"pid": 1}])),
            mutation,
            refusal="not a str",
        )
    if mutation == "too long":
        padding = "x=" + "y" * (MAX_SERIALIZED_LENGTH - len(text))  # a field it would ignore
        return _StateCase(_with([*items, padding]), mutation, refusal="too long")
    if mutation == "prefix changed":
        head = draw(st.sampled_from(["kafka_txn:1", "kafka-txn1", "Kafka-txn:1", "", "k:1"]))
        return _StateCase(";".join([head, *items]), mutation, refusal="no known form")
    if mutation == "version changed":
        version = draw(
            st.one_of(
                st.integers(0, 10**6).filter(lambda v: v != 1).map(str),
                st.sampled_from(["", "x", "1.0", "\uff11", "²"]),
            )
        )
        refusal = (
            "newer version" if version.isascii() and version.isdigit() else ("version not a number")
        )
        return _StateCase(";".join([f"kafka-txn:{version}", *items]), mutation, refusal=refusal)
    if mutation == "field without =":
        bad = draw(st.sampled_from(["", "pid", "=1", "=", "done"]))
        at = draw(st.integers(0, len(items)))
        return _StateCase(_with([*items[:at], bad, *items[at:]]), mutation, refusal="not key=value")
    if mutation == "field twice":
        item = draw(st.sampled_from(items))
        return _StateCase(_with([*items, item]), mutation, refusal="field twice")
    if mutation == "field dropped":
        key = draw(st.sampled_from(["pid", "epoch"]))
        kept = [i for i in items if not i.startswith(f"{key}=")]
        return _StateCase(_with(kept), mutation, refusal="field missing")
    if mutation == "integer garbled":
        key = draw(st.sampled_from(sorted(_INT_FIELDS)))
        value = draw(st.sampled_from(["", "one", "1.5", "0x10", "+5", " 5", "1" * 20, "--1"]))
        kept = [i for i in items if not i.startswith(f"{key}=")]
        return _StateCase(_with([*kept, f"{key}={value}"]), mutation, refusal="not an integer")
    if mutation == "integer out of range":
        key, value = draw(
            st.sampled_from(
                [
                    ("pid", -1),
                    ("pid", 2**63),
                    ("epoch", -1),
                    ("epoch", 32768),
                    ("start", -2),
                    ("start", 2**63),
                    ("timeout", -1),
                    ("timeout", 2**31),
                ]
            )
        )
        kept = [i for i in items if not i.startswith(f"{key}=")]
        return _StateCase(_with([*kept, f"{key}={value}"]), mutation, refusal="out of range")
    if mutation == "percent-encoding broken":
        key = draw(st.sampled_from(["tid", "cluster"]))
        value = draw(st.sampled_from(["%C3%28", "%FF", "a%E2%82", "%80"]))
        kept = [i for i in items if not i.startswith(f"{key}=")]
        return _StateCase(
            _with([*kept, f"{key}={value}"]), mutation, refusal="bad percent-encoding"
        )
    if mutation == "done garbled":
        kept = [i for i in items if not i.startswith("done=")]
        value = draw(st.sampled_from(["", "2", "yes", "true", "01", "1 "]))
        return _StateCase(_with([*kept, f"done={value}"]), mutation, refusal="done not 0 or 1")
    assert mutation == "random text spliced in"
    at = draw(st.integers(0, len(text)))
    return _StateCase(text[:at] + draw(st.text(max_size=20)) + text[at:], mutation)


_MUTATIONS = [
    "none",
    "fields reordered",
    "unknown field added",
    "start unknown",
    "Java form",
    "empty",
    "not a str",
    "too long",
    "prefix changed",
    "version changed",
    "field without =",
    "field twice",
    "field dropped",
    "integer garbled",
    "integer out of range",
    "percent-encoding broken",
    "done garbled",
    "random text spliced in",
]


def _check_state(case: _StateCase) -> str:
    """Parse one case; assert the outcome it must have; return its branch."""
    try:
        state = PreparedTxnState(case.text)
    except InvalidPreparedStateError as exc:
        message = str(exc)
        assert isinstance(exc, ValueError)
        reached = [name for name, pattern in _REFUSALS.items() if re.search(pattern, message)]
        assert len(reached) == 1, f"{message!r} matches {reached}"
        if case.refusal is None:
            assert case.expected is None, f"{case.text!r} refused: {message}"
        else:
            assert reached == [case.refusal], f"{case.text!r}: {message}"
        if reached != ["not a str"]:  # the text it is about, cut to 80 characters
            shown = case.text if len(case.text) <= 80 else case.text[:77] + "..."
            assert message.startswith(f"invalid PreparedTxnState {shown!r}: "), message
        return reached[0]
    assert case.refusal is None, f"{case.text!r} parsed, expected a refusal: {case.refusal}"
    if case.expected is not None:
        assert state == case.expected
    assert PreparedTxnState.parse(str(state)) == state  # what was accepted round-trips
    return "valid"


@given(state_cases())
def test_fuzz_parse_refuses_with_the_reason_or_gives_the_state(case: _StateCase):
    event(_check_state(case))
    event(f"mutation: {case.mutation}")


def test_fuzz_parse_reaches_every_branch():
    counts = reached_branches(state_cases(), _check_state, examples=300)
    for mutation in _MUTATIONS:  # each mutation for sure, whatever the draw favours
        counts += reached_branches(state_cases(st.just(mutation)), _check_state, examples=10)
    assert_every_branch(counts, STATE_BRANCHES)


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
