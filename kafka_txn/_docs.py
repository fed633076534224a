"""Regenerates the docs that come from the code: in docs/reference/errors.md the exception tree
(errors.py's docstring) and the error table (classification.py); in docs/guide/producer.md the
producer's lifecycle diagram and its state x call table (lifecycle.py); in
docs/guide/two-phase-commit.md the coordinator client's security settings
(coordinator/security.py); docs/reference/api.md, the API reference, from the public names'
signatures and docstrings (``kafka_txn._api_reference``). Tests fail on drift.

``python -m kafka_txn._docs [docs directory]``
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from kafka_txn import errors
from kafka_txn._api_reference import render_api
from kafka_txn.classification import render_markdown
from kafka_txn.coordinator.security import render_markdown as render_security_table
from kafka_txn.producer.lifecycle import ALLOWED, State, render_mermaid

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _tree() -> str:
    doc = errors.__doc__ or ""
    start = doc.index("    KafkaException")
    end = doc.index("\n\n", start)
    return "```\n" + "\n".join(line[4:] for line in doc[start:end].splitlines()) + "\n```\n"


def render_lifecycle_table() -> str:
    """Which call each state allows, from ``lifecycle.ALLOWED``: one row per call, one
    column per state."""
    states = list(State)
    out = [
        "| call | " + " | ".join(f"`{s.value}`" for s in states) + " |",
        "|---|" + "---|" * len(states),
    ]
    for operation, allowed in ALLOWED.items():
        marks = " | ".join("✓" if s in allowed else "·" for s in states)
        out.append(f"| `{operation}` | {marks} |")
    return "\n".join(out) + "\n"


GENERATED: Final = {"error table": render_markdown, "exception tree": _tree}
"""Sections of docs/reference/errors.md that are generated from the code, by marker name."""

INDEX_GENERATED: Final = {
    "lifecycle diagram": render_mermaid,
    "lifecycle table": render_lifecycle_table,
}
"""Sections of docs/guide/producer.md that are generated from the code, by marker name."""

TWO_PHASE_GENERATED: Final = {"coordinator security settings": render_security_table}
"""Sections of docs/guide/two-phase-commit.md that are generated from the code."""

GENERATED_FILES: Final = {
    "reference/errors.md": GENERATED,
    "guide/producer.md": INDEX_GENERATED,
    "guide/two-phase-commit.md": TWO_PHASE_GENERATED,
}
"""Each file under docs/ with generated sections, and its sections."""


def update_docs(text: str, sections: Mapping[str, Callable[[], str]] = GENERATED) -> str:
    """``text`` with every generated section (by default, docs/reference/errors.md's) rewritten
    from the code."""
    for name, render in sections.items():
        begin = f"<!-- BEGIN GENERATED: {name} -->\n"
        head, found, rest = text.partition(begin)
        if not found:
            raise ValueError(f"marker {begin.strip()!r} not found")
        _, found, tail = rest.partition("<!-- END GENERATED -->")
        if not found:
            raise ValueError(f"no END marker after {begin.strip()!r}")
        text = head + begin + render() + "<!-- END GENERATED -->" + tail
    return text


def regenerate(docs: Path = DOCS) -> None:
    """Rewrite every generated doc under ``docs``."""
    for name, sections in GENERATED_FILES.items():
        target = docs / name
        target.write_text(update_docs(target.read_text(), sections))
    (docs / "reference" / "api.md").write_text(render_api())


if __name__ == "__main__":  # pragma: no cover
    regenerate(Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS)
