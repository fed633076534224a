"""Regenerates the parts of docs/errors.md that come from the code: the exception tree
(errors.py's docstring) and the error table (classification.py).

``python -m kafka_txn._docs [docs/errors.md]``
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

from . import errors
from .classification import render_markdown

DEFAULT_TARGET = Path(__file__).resolve().parent.parent / "docs" / "errors.md"


def _tree() -> str:
    doc = errors.__doc__ or ""
    start = doc.index("    KafkaException")
    end = doc.index("\n\n", start)
    return "```\n" + "\n".join(line[4:] for line in doc[start:end].splitlines()) + "\n```\n"


GENERATED: Final = {"error table": render_markdown, "exception tree": _tree}
"""Sections of docs/errors.md that are generated from the code, by marker name."""


def update_docs(text: str) -> str:
    """``text`` with every generated section rewritten from the code."""
    for name, render in GENERATED.items():
        begin = f"<!-- BEGIN GENERATED: {name} -->\n"
        head, found, rest = text.partition(begin)
        if not found:
            raise ValueError(f"marker {begin.strip()!r} not found")
        _, found, tail = rest.partition("<!-- END GENERATED -->")
        if not found:
            raise ValueError(f"no END marker after {begin.strip()!r}")
        text = head + begin + render() + "<!-- END GENERATED -->" + tail
    return text


if __name__ == "__main__":  # pragma: no cover
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_TARGET
    target.write_text(update_docs(target.read_text()))
