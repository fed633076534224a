"""Recovery's decision table (kafka_txn/twophase/decisions.py ``decide``), as a pure
function: every row, its boundaries, and properties over arbitrary coordinator answers;
the errors and log records of the verdicts (kafka_txn/twophase/recovery.py). No broker."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from hypothesis import event, given
from hypothesis import strategies as st

from kafka_txn import (
    InvalidPreparedStateError,
    PreparedTxnState,
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
)
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient, TransactionDescription
from kafka_txn.twophase import decisions, recovery
from kafka_txn.twophase.decisions import (
    ABORT_STATES,
    COMMIT_STATES,
    RULES,
    Verdict,
    commit_confirmed,
    decide,
)
from tests.support.fuzzing import assert_every_branch, reached_branches

ROOT = Path(__file__).resolve().parent.parent.parent
P, E, S = 4001, 7, 1_732_212_345_678
STORED = PreparedTxnState(
    transactional_id="orders-0", producer_id=P, producer_epoch=E, txn_start_ms=S,
    cluster_id="c1", timeout_ms=60_000,
)  # fmt: skip
NOT_FOUND = TransactionDescription("orders-0", "Empty", -1, -1, 0, -1)

COMMIT, ALREADY, DIVERGED, UNKNOWABLE = (
    Verdict.COMMIT,
    Verdict.ALREADY_COMMITTED,
    Verdict.DIVERGED,
    Verdict.UNKNOWABLE,
)


def seen(state: str, epoch: int = E, start: int = S, pid: int = P) -> TransactionDescription:
    return TransactionDescription("orders-0", state, pid, epoch, 60_000, start)


# (what the coordinator reports, verdict, table row)
CASES = [
    # 1: Kafka forgot the id (Apache: TRANSACTIONAL_ID_NOT_FOUND; noida-db: Empty, pid -1)
    (NOT_FOUND, UNKNOWABLE, 1),
    # 2: another producer id
    (seen("Ongoing", pid=P + 1), UNKNOWABLE, 2),
    (seen("CompleteCommit", pid=P - 1), UNKNOWABLE, 2),
    (seen("Empty", epoch=0, start=-1, pid=P + 1), UNKNOWABLE, 2),
    # 3: an older epoch, whatever else
    (seen("Ongoing", epoch=E - 1), UNKNOWABLE, 3),
    (seen("CompleteCommit", epoch=0, start=S + 1), UNKNOWABLE, 3),
    # 4: same epoch, an older transaction
    (seen("Ongoing", start=S - 1), UNKNOWABLE, 4),
    (seen("Empty", start=-1), UNKNOWABLE, 4),
    # 5-7: the stored transaction itself
    (seen("Ongoing"), COMMIT, 5),
    (seen("PrepareCommit"), ALREADY, 6),
    (seen("CompleteCommit"), ALREADY, 6),
    (seen("PrepareAbort"), DIVERGED, 7),
    (seen("CompleteAbort"), DIVERGED, 7),
    # 8: a later transaction under the same epoch, whatever its state
    (seen("Ongoing", start=S + 1), ALREADY, 8),
    (seen("CompleteCommit", start=S + 1), ALREADY, 8),
    (seen("CompleteAbort", start=S + 60_000), ALREADY, 8),
    (seen("PrepareAbort", start=S + 1), ALREADY, 8),
    # 9: the stored transaction committed, under a later epoch
    (seen("CompleteCommit", epoch=E + 1), ALREADY, 9),
    (seen("PrepareCommit", epoch=E + 5), ALREADY, 9),
    # 10: the stored transaction timed out or was fenced (start kept): epoch e + 1
    # (transaction.version 0/1, and Apache Kafka >= 4.1 at version 2), e + 2 (Apache
    # Kafka 4.0 at version 2), Ongoing under e + 1 while the abort is being written
    (seen("CompleteAbort", epoch=E + 1), DIVERGED, 10),
    (seen("PrepareAbort", epoch=E + 1), DIVERGED, 10),
    (seen("Ongoing", epoch=E + 1), DIVERGED, 10),
    (seen("PrepareAbort", epoch=E + 2), DIVERGED, 10),
    (seen("CompleteAbort", epoch=E + 2), DIVERGED, 10),
    (seen("CompleteAbort", epoch=E + 7), DIVERGED, 10),  # the start time names it
    # 11: a later transaction, then one epoch bump (its timeout, or KIP-360)
    (seen("CompleteAbort", epoch=E + 1, start=S + 1), ALREADY, 11),
    (seen("Ongoing", epoch=E + 1, start=S + 1), ALREADY, 11),
    (seen("CompleteCommit", epoch=E + 1, start=S + 1), ALREADY, 11),
    # 12: everything else
    (seen("Empty"), UNKNOWABLE, 12),  # the stored start time in Empty: not Kafka's
    (seen("Dead"), UNKNOWABLE, 12),
    (seen("SomeFutureState"), UNKNOWABLE, 12),
    (seen("Empty", epoch=E + 1, start=-1), UNKNOWABLE, 12),  # noida-db after a fence
    (seen("Empty", epoch=E + 2, start=-1), UNKNOWABLE, 12),  # Apache after fence + init
    (seen("Empty", epoch=E + 1), UNKNOWABLE, 12),  # boundary of row 10's states
    # Boundary of row 11. Also Apache Kafka 4.0 at transaction.version 2 after the next
    # transaction timed out: any cluster shows this too when the stored one timed out,
    # an init bumped the epoch and a later transaction was aborted by its producer.
    (seen("CompleteAbort", epoch=E + 2, start=S + 1), UNKNOWABLE, 12),
    (seen("CompleteAbort", epoch=E + 1, start=S - 1), UNKNOWABLE, 12),
    (seen("Ongoing", epoch=E + 3, start=S + 1), UNKNOWABLE, 12),
]


@pytest.mark.parametrize(("observed", "verdict", "row"), CASES)
@pytest.mark.guarantee("3.3")
def test_every_row_of_the_table(observed: TransactionDescription, verdict: Verdict, row: int):
    decision = decide(STORED, observed)
    assert (decision.verdict, decision.row) == (verdict, row), decision.reason


def test_every_rule_is_exercised_and_numbered_in_order():
    assert [rule.row for rule in RULES] == list(range(1, len(RULES) + 1))
    assert {row for _, _, row in CASES} == {rule.row for rule in RULES}


def _table_lines(text: str) -> dict[int, str]:
    """Row number -> verdict, from the table lines that start with a row number and
    name one verdict (the module docstring's table and the docs' table)."""
    rows = {}
    for line in text.splitlines():
        number = re.match(r"\|?\s*(\d+)[\s|]", line)
        verdicts = re.findall(r"\b(ALREADY_COMMITTED|COMMIT|DIVERGED|UNKNOWABLE)\b", line)
        if number and len(verdicts) == 1:
            rows[int(number[1])] = verdicts[0]
    return rows


@pytest.mark.parametrize(
    "text",
    [decisions.__doc__ or "", (ROOT / "docs" / "guide" / "two-phase-commit.md").read_text()],
    ids=["decisions.py docstring", "docs/guide/two-phase-commit.md"],
)
@pytest.mark.guarantee("3.3")
def test_the_documented_tables_match_the_rules(text: str):
    assert _table_lines(text) == {rule.row: rule.verdict.name for rule in RULES}


def test_a_state_without_identity_is_refused():
    with pytest.raises(ValueError, match="producer id, epoch and start time"):
        decide(PreparedTxnState(f"{P}:{E}"), seen("Ongoing"))


# ---------------------------------------------------------------- properties
# Each property is checked over every combination of producer id, epoch and start time
# around the stored ones (the boundaries), then by Hypothesis over arbitrary answers.
STATE_NAMES = ["Empty", "Ongoing", "PrepareCommit", "CompleteCommit", "PrepareAbort",
               "CompleteAbort", "PrepareEpochFence", "Dead", "Unknown"]  # fmt: skip
GRID = [
    (STORED, seen(state, epoch=epoch, start=start, pid=pid))
    for state in STATE_NAMES
    for pid in (P - 1, P, P + 1, -1)
    for epoch in range(E - 2, E + 4)
    for start in (-1, 0, S - 1, S, S + 1, S + 10_000)
]


def _near(value: int) -> st.SearchStrategy[int]:
    """The stored value (most often), its neighbours, or anything: every row's boundary
    gets hit often."""
    return st.sampled_from([0, 0, 1, 1, -1, 2, 3, None]).flatmap(
        lambda step: (
            st.integers(min_value=-1, max_value=value * 2 + 2)
            if step is None
            else st.just(value + step)
        )
    )


@st.composite
def answers(draw: st.DrawFn) -> tuple[PreparedTxnState, TransactionDescription]:
    pid = draw(st.integers(min_value=0, max_value=1 << 40))
    epoch = draw(st.integers(min_value=0, max_value=32_000))
    start = draw(st.integers(min_value=0, max_value=1 << 42))
    stored = PreparedTxnState(
        transactional_id="t", producer_id=pid, producer_epoch=epoch, txn_start_ms=start
    )
    described = TransactionDescription(
        "t",
        draw(
            st.sampled_from(
                [*STATE_NAMES, *sorted(COMMIT_STATES), *sorted(ABORT_STATES), "Ongoing"]
            )
        ),
        draw(st.sampled_from([pid, pid, pid, pid, pid, -1, pid + 1, pid - 1])),
        draw(_near(epoch)),
        60_000,
        draw(_near(start) | st.just(-1)),
    )
    return stored, described


def _row(case: tuple[PreparedTxnState, TransactionDescription]) -> str:
    decision = decide(*case)
    return f"row {decision.row:2d}: {decision.verdict.name}"


def _everywhere(check: Callable[[PreparedTxnState, TransactionDescription], None]) -> None:
    for case in GRID:
        check(*case)

    def fuzzed(case: tuple[PreparedTxnState, TransactionDescription]) -> None:
        event(_row(case))  # which row of the table each example reached
        check(*case)

    given(answers())(fuzzed)()


def test_the_fuzzed_answers_reach_every_row():
    counts = reached_branches(answers(), _row, examples=1500)
    assert_every_branch(counts, {f"row {r.row:2d}: {r.verdict.name}" for r in RULES})


def _same_transaction(stored: PreparedTxnState, described: TransactionDescription) -> bool:
    return (
        described.found
        and described.producer_id == stored.producer_id
        and described.start_time_ms == stored.txn_start_ms
    )


@pytest.mark.guarantee("3.3")
def test_commit_only_for_the_stored_transaction_still_open():
    def check(stored: PreparedTxnState, described: TransactionDescription) -> None:
        if decide(stored, described).verdict is Verdict.COMMIT:
            assert _same_transaction(stored, described) and described.state == "Ongoing"
            assert described.producer_epoch == stored.producer_epoch

    _everywhere(check)


@pytest.mark.guarantee("3.3")
def test_diverged_only_when_kafka_shows_the_stored_transaction_aborted():
    """DIVERGED advises re-sending: only where nothing of it can be visible: the stored
    transaction in an abort state, or still Ongoing under an epoch the coordinator
    fenced to abort it (EndTxn with the stored epoch is refused from then on)."""

    def check(stored: PreparedTxnState, described: TransactionDescription) -> None:
        if decide(stored, described).verdict is Verdict.DIVERGED:
            bumped = described.producer_epoch - (stored.producer_epoch or 0)
            assert _same_transaction(stored, described) and bumped >= 0
            assert described.state in ABORT_STATES or (described.state == "Ongoing" and bumped >= 1)

    _everywhere(check)


@pytest.mark.guarantee("3.3")
def test_already_committed_never_when_the_stored_transaction_shows_aborted():
    def check(stored: PreparedTxnState, described: TransactionDescription) -> None:
        if decide(stored, described).verdict is Verdict.ALREADY_COMMITTED:
            assert not (_same_transaction(stored, described) and described.state in ABORT_STATES)
            assert described.producer_id == stored.producer_id
            assert described.producer_epoch >= (stored.producer_epoch or 0)

    _everywhere(check)


@pytest.mark.guarantee("3.4")
def test_an_unknown_id_is_always_unknowable():
    def check(stored: PreparedTxnState, described: TransactionDescription) -> None:
        if not described.found or described.producer_id != stored.producer_id:
            assert decide(stored, described).verdict is Verdict.UNKNOWABLE

    _everywhere(check)


# ---------------------------------------------------------------- after EndTxn(commit)
@pytest.mark.parametrize(
    ("after", "confirmed"),
    [
        (seen("PrepareCommit"), True),
        (seen("CompleteCommit"), True),
        (seen("CompleteCommit", epoch=E + 1), True),
        # Scenario 8: a zombie committed the stored one and began the next, and EndTxn
        # committed that next one.
        (seen("CompleteCommit", start=S + 1), False),
        (seen("PrepareCommit", start=S + 1), False),
        (seen("Ongoing", start=S + 1), False),  # ... or the zombie began yet another
        (seen("Ongoing"), False),
        (seen("CompleteAbort"), False),
        (seen("CompleteCommit", pid=P + 1), False),
        (seen("CompleteCommit", epoch=E - 1), False),
        (NOT_FOUND, False),
    ],
)
@pytest.mark.guarantee("3.5")
def test_a_commit_is_confirmed_only_by_the_stored_transaction_committed(after, confirmed):
    assert commit_confirmed(STORED, after) is confirmed


def test_the_state_groups_are_disjoint():
    assert not COMMIT_STATES & ABORT_STATES
    assert "Ongoing" not in COMMIT_STATES | ABORT_STATES


# ---------------------------------------------------------------- outcomes, errors, logs
# What recovery says and logs about each verdict, which the decision table tests above do
# not pin down (mutation testing, make mutants, shows it): the fix each error tells the
# operator, the fields it carries, and the structured log fields (docs/guide/operations.md).
_TID = "orders-0"
_DIVERGED_FIX = (
    "Nothing of it was committed and none of its records are visible to read_committed "
    "consumers: re-send them from the database in a new transaction whose prepared state "
    "replaces the stored one in the database commit that decides it (DualWriter: "
    "resolve(), start(), then the re-send in the first transaction); storing "
    "state.mark_completed() after a plain re-send sends them twice if a crash comes in "
    "between. Then fix the cause (a transaction.timeout.ms shorter than crash, restart and "
    "recovery take, or two instances sharing the transactional id)"
)
_UNKNOWABLE_FIX = (
    "Do not re-send its records blindly (that may duplicate them) nor drop them (that may "
    "lose them): check with a read_committed consumer which of them are in the topic, "
    "re-send only those that are missing, then store state.mark_completed() in place of "
    "the stored state (DualWriter.resolve()) so that recovery can go on"
)


def _logged(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, str, str]]:
    return [
        (
            r.levelno,
            r.getMessage(),
            getattr(r, "transactional_id", None),
            getattr(r, "outcome", None),
        )
        for r in caplog.records
        if r.name == "kafka_txn.recovery"
    ]


def test_already_committed_is_logged_with_its_fields(caplog: pytest.LogCaptureFixture):
    observed = seen("CompleteCommit")
    decision = decide(STORED, observed)
    with caplog.at_level(logging.INFO, logger="kafka_txn.recovery"):
        outcome = recovery._settle(_TID, STORED, observed, decision)
    assert outcome is recovery.TransactionOutcome.ALREADY_COMMITTED
    assert _logged(caplog) == [(
        logging.INFO, f"recovery of {_TID!r}: {STORED} was committed ({decision.reason})",
        _TID, "already_committed",
    )]  # fmt: skip


@pytest.mark.parametrize("code", [None, KafkaError.PRODUCER_FENCED])
def test_diverged_says_what_happened_and_the_fix(caplog: pytest.LogCaptureFixture, code):
    observed = seen("CompleteAbort")
    decision = decide(STORED, observed)
    with (
        caplog.at_level(logging.INFO, logger="kafka_txn.recovery"),
        pytest.raises(TransactionDivergedError) as diverged,
    ):
        recovery._settle(_TID, STORED, observed, decision, code)
    exc = diverged.value
    assert str(exc) == (
        f"Kafka aborted the transaction of {_TID!r} that the database committed: "
        f"{decision.reason}. Stored: {STORED}; coordinator: state CompleteAbort, producer id "
        f"{P}, epoch {E}, started at {S} ms. {_DIVERGED_FIX}"
    )
    assert (exc.transactional_id, exc.stored_state, exc.observed) == (
        _TID, str(STORED), observed.as_dict())  # fmt: skip
    # The error code EndTxn(commit) was refused with, else INVALID_TXN_STATE (errors.py).
    assert exc.code == (KafkaError.INVALID_TXN_STATE if code is None else code)
    assert _logged(caplog) == [(logging.WARNING, f"recovery of {_TID!r}: {exc}", _TID, "diverged")]


def test_unknowable_says_recovery_committed_nothing_and_the_fix(caplog: pytest.LogCaptureFixture):
    decision = decide(STORED, NOT_FOUND)
    with (
        caplog.at_level(logging.INFO, logger="kafka_txn.recovery"),
        pytest.raises(TransactionOutcomeUnknowableError) as unknowable,
    ):
        recovery._settle(_TID, STORED, NOT_FOUND, decision)
    exc = unknowable.value
    assert str(exc) == (
        f"the outcome in Kafka of the transaction of {_TID!r} that the database committed "
        f"cannot be known: {decision.reason}. Stored: {STORED}; coordinator: transactional "
        f"id not found. Recovery committed nothing. {_UNKNOWABLE_FIX}"
    )
    assert (exc.transactional_id, exc.stored_state, exc.observed) == (
        _TID, str(STORED), NOT_FOUND.as_dict())  # fmt: skip
    assert _logged(caplog) == [
        (logging.WARNING, f"recovery of {_TID!r}: {exc}", _TID, "unknowable")
    ]


def test_unknowable_after_a_commit_does_not_say_nothing_was_committed():
    # recover()'s zombie case: EndTxn(commit) was sent, so something may have committed.
    exc = recovery._unknowable(_TID, STORED, seen("Ongoing"), "why", committed_nothing=False)
    assert "committed nothing" not in str(exc)
    assert f"started at {S} ms. {_UNKNOWABLE_FIX}" in str(exc)


@pytest.mark.parametrize("stored", [PreparedTxnState.EMPTY, STORED.mark_completed()],
                         ids=["empty", "completed"])  # fmt: skip
def test_nothing_to_commit_is_logged_without_asking_the_coordinator(
    caplog: pytest.LogCaptureFixture, stored: PreparedTxnState
):
    # A real client, never connected: the stored state alone settles it.
    client = CoordinatorClient(ConnectionSettings(bootstrap=(("127.0.0.1", 1),)), _TID)
    with caplog.at_level(logging.INFO, logger="kafka_txn.recovery"):
        outcome = recovery.recover(client, stored, None)
    assert outcome is recovery.TransactionOutcome.NOTHING_TO_COMMIT
    assert _logged(caplog) == [(
        logging.INFO, f"recovery of {_TID!r}: stored state {str(stored)!r} needs no commit",
        _TID, "nothing_to_commit",
    )]  # fmt: skip


def test_a_state_without_a_start_time_is_refused_before_asking_the_coordinator():
    client = CoordinatorClient(ConnectionSettings(bootstrap=(("127.0.0.1", 1),)), _TID)
    java = PreparedTxnState(f"{P}:{E}")  # the Java client's form: no start time
    with pytest.raises(InvalidPreparedStateError) as refused:
        recovery.recover(client, java, None)
    assert str(refused.value) == (
        f"the stored state {str(java)!r} has no transaction start time, so it cannot be told "
        "apart from a later transaction under the same producer id and epoch (librdkafka "
        "reuses them): recover from the state prepare_transaction() returned"
    )
