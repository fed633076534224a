"""Fuzzing from valid bases: each example is a valid input with some of its parts mutated,
so that every check of a validator is reached, and its success path too, instead of the
first check refusing nearly every random input.

A fuzz test's check returns the name of the branch its example reached; the test labels
it with Hypothesis's ``event()`` (``pytest --hypothesis-show-statistics`` shows how often
each was reached), and a second test runs the same check over a fixed, derandomized
sequence of examples and asserts that every expected branch was reached
(``assert_every_branch``): a validator that grows a branch, or a strategy that stops
reaching one, fails it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from typing import TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

T = TypeVar("T")


def reached_branches(
    strategy: st.SearchStrategy[T], check: Callable[[T], str], *, examples: int = 400
) -> Counter[str]:
    """How many of ``examples`` derandomized examples reached each branch. The check's
    own assertions hold for every one of them (a failure is raised as usual)."""
    counts: Counter[str] = Counter()

    @settings(
        derandomize=True,
        database=None,
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(value: T) -> None:
        counts[check(value)] += 1

    run()
    return counts


def assert_every_branch(counts: Counter[str], expected: Collection[str]) -> None:
    """Every expected branch reached, and no other."""
    missing = sorted(set(expected) - set(counts))
    unexpected = sorted(set(counts) - set(expected))
    assert not missing and not unexpected, (
        f"branches never reached: {missing}; not expected: {unexpected}; reached: {counts}"
    )
