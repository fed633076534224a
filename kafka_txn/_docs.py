"""Regenerates the docs that come from the code: in docs/errors.md the exception tree
(errors.py's docstring) and the error table (classification.py); docs/api.md, the API
reference, from the public names' signatures and docstrings. Tests fail on drift.

``python -m kafka_txn._docs``
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Final

from . import errors
from .classification import render_markdown

DOCS = Path(__file__).resolve().parent.parent / "docs"
DEFAULT_TARGET = DOCS / "errors.md"

API_MODULES = (
    "kafka_txn",
    "kafka_txn.dualwrite",
    "kafka_txn.spark",
    "kafka_txn.eos",
    "kafka_txn.metrics",
    "kafka_txn.testing",
)


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


def _summary(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.split("\n\n")[0].replace("\n", " ")


def _signature(obj: object) -> str:
    try:
        return str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""


def render_api() -> str:
    """docs/api.md: every public name with its signature and the first paragraph of its
    docstring; classes with their public methods."""
    out = [
        "# API reference",
        "",
        "Generated from the docstrings by `python -m kafka_txn._docs`; a test fails when it",
        "drifts. The guides are [index.md](index.md) and the pages it links.",
        "",
    ]
    for name in API_MODULES:
        module = importlib.import_module(name)
        out += [f"## `{name}`", "", _summary(module), ""]
        for public in getattr(module, "__all__", ()):
            obj = getattr(module, public)
            if name != "kafka_txn" and getattr(obj, "__module__", name) != name:
                continue  # documented where it is defined
            if inspect.isclass(obj) or inspect.isfunction(obj):
                out.append(f"### `{public}{_signature(obj)}`")
                out += ["", _summary(obj) or "(no docstring)", ""]
                if inspect.isclass(obj) and not issubclass(obj, BaseException):
                    for meth_name, meth in inspect.getmembers(obj):
                        if meth_name.startswith("_") or not callable(meth):
                            continue
                        if meth_name in vars(obj):
                            out.append(f"- `{meth_name}{_signature(meth)}`: {_summary(meth)}")
                    out.append("")
            else:
                shown = repr(obj) if hasattr(obj, "__origin__") else type(obj).__name__
                out += [f"### `{public}`", "", f"`{shown}`", ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":  # pragma: no cover
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_TARGET
    target.write_text(update_docs(target.read_text()))
    (DOCS / "api.md").write_text(render_api())
