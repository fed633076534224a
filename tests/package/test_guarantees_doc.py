"""docs/guarantees.md names the tests that prove each promise: every one must exist, and
every guarantee must name at least one, so the document cannot drift from the suite."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DOC = ROOT / "docs" / "guarantees.md"
NODE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)(?:\[[^\]`]*\])?`")


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_named_test_exists() -> None:
    text = DOC.read_text()
    named = NODE.findall(text)
    assert len(named) >= 20, "guarantees.md names too few tests: the pattern broke?"
    missing = []
    for file, func in named:
        path = ROOT / file
        if not path.exists() or func not in _test_functions(path):
            missing.append(f"{file}::{func}")
    assert not missing, f"docs/guarantees.md names tests that do not exist: {missing}"


def test_every_guarantee_names_its_proof() -> None:
    """Each numbered guarantee (a paragraph starting **N.N) carries a 'Proof:' line
    with at least one test node id."""
    paragraphs = re.split(r"\n\s*\n", DOC.read_text())
    guarantees = [p for p in paragraphs if re.match(r"\*\*\d+\.\d+ ", p)]
    assert len(guarantees) >= 10
    unproved = [p.splitlines()[0] for p in guarantees if "Proof:" not in p or not NODE.search(p)]
    assert not unproved, f"guarantees without a test: {unproved}"
