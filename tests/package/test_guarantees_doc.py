"""The guarantees cannot drift from the suite: every numbered guarantee of
docs/guarantees.md has a test that carries its ``@pytest.mark.guarantee`` marker, every
marker names a guarantee that exists, docs/reference/proofs.md is what its generator
(tests/support/proofs.py) writes from those markers, every test node id a doc names
exists, and every link between the guarantees, the guide and the proofs leads to a file
and a heading that exist."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from tests.support import proofs

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs"
NODE = re.compile(r"`(tests/[\w/]+\.py)((?:::\w+)+)(?:\[[^\]`]*\])?`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINKED_DOCS = [
    DOCS / "guarantees.md",
    DOCS / "reference" / "proofs.md",
    *sorted((DOCS / "guide").glob("*.md")),
]
"""The pages whose links are checked: the guarantees, their details and their proofs."""


def _listed() -> list[proofs.Guarantee]:
    return proofs.guarantees((DOCS / "guarantees.md").read_text(encoding="utf-8"))


def test_proofs_page_is_what_the_generator_writes() -> None:
    page = DOCS / "reference" / "proofs.md"
    assert proofs.regenerated() == page.read_text(encoding="utf-8"), (
        "docs/reference/proofs.md is stale (a guarantee marker, a test's docstring or a "
        f"guarantee's line changed): run `{proofs.COMMAND}` (or `make docs`)"
    )


def test_the_guarantees_are_listed_once_each() -> None:
    numbers = [g.number for g in _listed()]
    assert len(numbers) >= 70, "docs/guarantees.md lists too few guarantees: the pattern broke?"
    assert {"1.1", "4.9a", "7.2"} <= set(numbers)
    twice = [number for number, count in Counter(numbers).items() if count > 1]
    assert not twice, f"docs/guarantees.md lists these numbers twice: {twice}"


def test_every_guarantee_has_a_test_with_its_marker() -> None:
    marked = {number for proof in proofs.collect() for number in proof.guarantees}
    unproved = [g.number for g in _listed() if g.number not in marked]
    assert not unproved, f"guarantees no test carries @pytest.mark.guarantee(...) for: {unproved}"


def test_every_marker_names_a_guarantee_that_exists() -> None:
    listed = {g.number for g in _listed()}
    unknown = [
        f"{proof.node_id}: {number}"
        for proof in proofs.collect()
        for number in proof.guarantees
        if number not in listed
    ]
    assert not unknown, f"markers naming no guarantee of docs/guarantees.md: {unknown}"


def _defined(path: Path) -> set[str]:
    """The node id tails (``::test_x``, ``::TestY::test_z``) of the tests in ``path``."""
    found: set[str] = set()

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.add(f"{prefix}::{node.name}")
            elif isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}::{node.name}")

    walk(ast.parse(path.read_text(encoding="utf-8")).body, "")
    return found


def test_every_test_a_doc_names_exists() -> None:
    named = 0
    missing = []
    for doc in sorted(DOCS.rglob("*.md")):
        for file, tail in NODE.findall(doc.read_text(encoding="utf-8")):
            named += 1
            path = ROOT / file
            if not path.is_file() or tail not in _defined(path):
                missing.append(f"{doc.relative_to(ROOT)}: {file}{tail}")
    assert named >= 100, "the docs name too few tests: the pattern broke?"
    assert not missing, f"docs name tests that do not exist: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces made ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings (a repeated one gets ``-1``, ``-2``...)."""
    seen: Counter[str] = Counter()
    anchors = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        heading = re.match(r"#{1,6} (.+)$", line)
        if heading:
            slug = _slug(heading[1])
            anchors.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
            seen[slug] += 1
    return anchors


def test_every_link_of_the_guarantees_guide_and_proofs_leads_somewhere() -> None:
    broken = []
    for doc in LINKED_DOCS:
        for link in LINK.findall(FENCE.sub("", doc.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", link):
                continue  # https://, mailto:
            target, _, anchor = link.partition("#")
            path = (doc.parent / target).resolve() if target else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{doc.relative_to(ROOT)}: {link} (no such heading)")
    assert not broken, f"links that lead nowhere: {broken}"


def test_every_guarantee_links_to_its_details() -> None:
    for guarantee in _listed():
        target, _, anchor = guarantee.details.partition("#")
        assert target.startswith("guide/") and anchor, (
            f"{guarantee.number}'s details link should name a heading of a guide page: "
            f"{guarantee.details}"
        )
