"""The list of proofs in docs/reference/proofs.md, generated from the suite: for each
numbered guarantee of docs/guarantees.md (its number and its one-line promise), the tests
that carry its ``@pytest.mark.guarantee`` marker, each with its docstring's summary.

The tests are read with ``ast``, never imported or collected by pytest, so the page can be
written without a broker, a database or Spark. A ``guarantee`` marker counts as a
decorator of a test function or method, of its ``Test*`` class, or in a module's or a
class's ``pytestmark``. Only the part of the page between its ``BEGIN GENERATED: proofs``
and ``END GENERATED`` markers is rewritten; the rest of it (how the proofs run, mutation
testing) is written by hand.

    python -m tests.support.proofs            # rewrite docs/reference/proofs.md
    python -m tests.support.proofs --check    # exit 1, naming the command, if it is stale

``make docs`` runs the first; tests/package/test_guarantees_doc.py fails on drift.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
GUARANTEES = ROOT / "docs" / "guarantees.md"
PAGE = ROOT / "docs" / "reference" / "proofs.md"
TESTS = ROOT / "tests"
BEGIN = "<!-- BEGIN GENERATED: proofs -->\n"
END = "<!-- END GENERATED -->"
COMMAND = "python -m tests.support.proofs"
SUMMARY_LENGTH = 160
"""Characters of a test's docstring shown at most: the test's name says the rest."""

_SECTION = re.compile(r"^## (\d+)\. (.+)$")
_ITEM = re.compile(
    r"^\*\*(?P<number>\d+\.\d+[a-z]?)\*\* (?P<promise>.+?)\s*\[[Dd]etails\]\((?P<link>[^)\s]+)\)$"
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\"'])")


@dataclass(frozen=True)
class Guarantee:
    """One numbered promise of docs/guarantees.md."""

    number: str
    """As the document and the markers write it: ``"1.1"``, ``"4.9a"``."""
    promise: str
    """Its one-sentence promise, as Markdown."""
    details: str
    """The link to its details, relative to docs/."""
    section: str
    """The heading of its section, without the ``## ``: ``"1. Transactions (...)"``."""


@dataclass(frozen=True)
class Proof:
    """A test that carries ``@pytest.mark.guarantee(...)``."""

    node_id: str
    """``tests/<path>.py::<name>`` (``::<Class>::<name>`` for a method)."""
    guarantees: tuple[str, ...]
    summary: str
    """The first sentence of its docstring, on one line; ``""`` without a docstring."""
    line: int


def guarantees(text: str) -> list[Guarantee]:
    """The guarantees listed in docs/guarantees.md's ``text``, in its order: each one a
    list item ``- **N.N** <promise> [Details](<link>)`` (continuation lines indented) under
    a heading ``## N. <section>``."""
    found: list[Guarantee] = []
    section = ""
    for block in _items(text):
        heading = _SECTION.match(block)
        if heading:
            section = f"{heading[1]}. {heading[2]}"
            continue
        item = _ITEM.match(block)
        if item and section:
            found.append(Guarantee(item["number"], item["promise"].strip(), item["link"], section))
    return found


def _items(text: str) -> Iterator[str]:
    """Headings and list items of a Markdown ``text``, each on one line (a list item's
    indented continuation lines joined to it, without its ``- ``)."""
    item: list[str] | None = None
    for line in text.splitlines():
        if item is not None and line.startswith("  ") and line.strip():
            item.append(line.strip())
            continue
        if item is not None:
            yield " ".join(item)
            item = None
        if line.startswith("- "):
            item = [line[2:].strip()]
        elif line.startswith("#"):
            yield line
    if item is not None:
        yield " ".join(item)


def collect(tests: Path = TESTS, root: Path = ROOT) -> list[Proof]:
    """Every marked test under ``tests``, in file order, then source order."""
    proofs: list[Proof] = []
    for path in sorted(tests.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        prefix = path.relative_to(root).as_posix()
        proofs += _marked(tree.body, prefix, _pytestmark(tree.body, prefix))
    return proofs


def _marked(body: Sequence[ast.stmt], prefix: str, inherited: tuple[str, ...]) -> list[Proof]:
    """The marked tests among ``body``'s functions and ``Test*`` classes (recursively),
    each with the guarantees of its own decorators and ``inherited`` ones."""
    proofs: list[Proof] = []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            numbers = _unique([*inherited, *_markers(node.decorator_list, prefix)])
            if numbers and node.name.startswith("test"):
                proofs.append(Proof(f"{prefix}::{node.name}", numbers, _summary(node), node.lineno))
            elif numbers:
                raise ValueError(
                    f"{prefix}::{node.name} (line {node.lineno}) is marked with "
                    "pytest.mark.guarantee but pytest does not collect it as a test"
                )
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            here = f"{prefix}::{node.name}"
            numbers = (
                *inherited,
                *_markers(node.decorator_list, here),
                *_pytestmark(node.body, here),
            )
            proofs += _marked(node.body, here, _unique(numbers))
    return proofs


def _pytestmark(body: Sequence[ast.stmt], where: str) -> tuple[str, ...]:
    """The guarantees of a ``pytestmark = ...`` assignment among ``body``'s statements."""
    numbers: list[str] = []
    for node in body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and any(
            isinstance(target, ast.Name) and target.id == "pytestmark"
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        ):
            value = node.value
            marks = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
            numbers += _markers([mark for mark in marks if mark is not None], where)
    return tuple(numbers)


def _markers(expressions: Iterable[ast.expr], where: str) -> list[str]:
    """The guarantee numbers of the ``pytest.mark.guarantee(...)`` calls among
    ``expressions``; an argument that is not a string literal is an error."""
    numbers: list[str] = []
    for expression in expressions:
        if not (
            isinstance(expression, ast.Call)
            and ast.unparse(expression.func) in {"pytest.mark.guarantee", "mark.guarantee"}
        ):
            continue
        for argument in expression.args:
            if not (isinstance(argument, ast.Constant) and isinstance(argument.value, str)):
                raise ValueError(
                    f"{where}: pytest.mark.guarantee takes guarantee numbers as string "
                    f"literals, not {ast.unparse(argument)}"
                )
            numbers.append(argument.value)
    return numbers


def _unique(numbers: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(numbers))


def _summary(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The first sentence of the docstring's first paragraph, on one line (a docstring's
    first line is often cut mid-sentence by the line length), at most ``SUMMARY_LENGTH``
    characters: a longer one is cut at a word and ends with "…"."""
    doc = ast.get_docstring(node) or ""
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    sentence = _SENTENCE_END.split(paragraph, maxsplit=1)[0]
    if len(sentence) <= SUMMARY_LENGTH:
        return sentence
    return sentence[: SUMMARY_LENGTH + 1].rsplit(" ", 1)[0].rstrip(",;:") + " …"


def render(listed: Sequence[Guarantee], proofs: Sequence[Proof]) -> str:
    """The generated part of docs/reference/proofs.md: per section and per guarantee,
    its promise, the link to its details, and the tests that carry its marker."""
    by_number: dict[str, list[Proof]] = {g.number: [] for g in listed}
    for proof in proofs:
        for number in proof.guarantees:
            if number in by_number:
                by_number[number].append(proof)
    out: list[str] = []
    section = ""
    for guarantee in listed:
        if guarantee.section != section:
            section = guarantee.section
            out += [f"## {section}", ""]
        out += [
            f"### {guarantee.number} {guarantee.promise.rstrip('.')}",
            "",
            f"Details: [{_label(guarantee.details)}]({_from_reference(guarantee.details)}).",
            "",
        ]
        tests = sorted(by_number[guarantee.number], key=lambda p: (_file(p), p.line))
        for proof in tests:
            line = f"- `{proof.node_id}`"
            out.append(f"{line}: {proof.summary}" if proof.summary else line)
        out.append("" if tests else "(no test carries this marker)\n")
    return "\n".join(out).rstrip() + "\n"


def _file(proof: Proof) -> str:
    return proof.node_id.split("::", 1)[0]


def _label(link: str) -> str:
    """``guide/producer.md#11-x`` → ``guide/producer.md``."""
    return link.split("#", 1)[0] or "guarantees.md"


def _from_reference(link: str) -> str:
    """A link relative to docs/, made relative to docs/reference/."""
    if "://" in link:
        return link
    if link.startswith("#"):
        return f"../guarantees.md{link}"
    return f"../{link}"


def update(page: str, generated: str) -> str:
    """``page`` with the part between its ``proofs`` markers replaced by ``generated``."""
    head, found, rest = page.partition(BEGIN)
    if not found:
        raise ValueError(f"marker {BEGIN.strip()!r} not found in {PAGE}")
    _, found, tail = rest.partition(END)
    if not found:
        raise ValueError(f"no {END!r} after {BEGIN.strip()!r} in {PAGE}")
    return head + BEGIN + generated + END + tail


def regenerated(page: Path = PAGE, doc: Path = GUARANTEES, tests: Path = TESTS) -> str:
    """What ``page`` holds once regenerated from ``doc`` and the markers under ``tests``."""
    listed = guarantees(doc.read_text(encoding="utf-8"))
    return update(page.read_text(encoding="utf-8"), render(listed, collect(tests)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="only say whether the page is up to date"
    )
    args = parser.parse_args(argv)
    text = regenerated()
    if args.check:
        if text != PAGE.read_text(encoding="utf-8"):
            print(f"{PAGE.relative_to(ROOT)} is stale: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
