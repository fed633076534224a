"""docs/reference/api.md, the API reference, rendered from the public names themselves.

Each public name of ``API_MODULES`` gets a heading (its name), a signature block with the
annotations as a person writes them, its docstring, and one entry per parameter: type,
default or bounds, and the description the docstrings give (``kafka_txn._docstrings``
finds it; nothing is written here). Enums list their members; exceptions their base,
category and attributes; classes their public methods and properties.

``python -m kafka_txn._docs`` writes the page; a test fails when it drifts from the code.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import re
import types
import typing
from collections.abc import Iterator
from typing import Any, Final

from kafka_txn import _OPTIONAL
from kafka_txn._docstrings import (
    Parameter,
    alias_source,
    attribute_docs,
    describe_parameters,
    literal,
    origin_module,
    own_doc,
    paragraphs,
    parameters,
    returns,
    type_text,
)

API_MODULES: Final = (
    "kafka_txn",
    "kafka_txn.dualwrite",
    "kafka_txn.spark",
    "kafka_txn.eos",
    "kafka_txn.metrics",
    "kafka_txn.tracing",
    "kafka_txn.testing",
)
"""The documented modules, in page order; a re-exported name is documented under
``kafka_txn`` only."""

_WIDTH: Final = 88
"""Longest signature on one line; a longer one gets one parameter a line."""


def signature_block(name: str, params: list[Parameter], result: str = "") -> list[str]:
    """A ``python`` block calling ``name``: on one line, or one parameter a line."""
    parts, kinds = [], {p.kind for p in params}
    for i, p in enumerate(params):
        previous = params[i - 1].kind if i else None
        starts_keywords = p.kind is inspect.Parameter.KEYWORD_ONLY and previous is not p.kind
        if starts_keywords and inspect.Parameter.VAR_POSITIONAL not in kinds:
            parts.append("*")
        parts.append(p.code())
        following = params[i + 1].kind if i + 1 < len(params) else None
        if p.kind is inspect.Parameter.POSITIONAL_ONLY and following is not p.kind:
            parts.append("/")
    tail = f" -> {result}" if result else ""
    line = f"{name}({', '.join(parts)}){tail}"
    if len(line) > _WIDTH:
        line = f"{name}(\n" + "".join(f"    {part},\n" for part in parts) + f"){tail}"
    return ["```python", line, "```", ""]


def parameter_entries(params: list[Parameter], described: dict[str, str]) -> list[str]:
    """One list item per parameter: name, type, default or bounds, and its description."""
    out = []
    for p in params:
        facts = [f"`{p.type}`"] if p.type else []
        facts.append(f"default `{p.default}`" if p.default is not None else "required")
        facts += [p.bounds] if p.bounds else []
        facts += [f"also given as `{p.alias}`"] if p.alias else []
        about = described.get(p.name)
        out.append(f"- `{p.name}` ({', '.join(facts)})" + (f": {about}" if about else ""))
    return out


def _listing(title: str, entries: list[str]) -> list[str]:
    return [f"{title}:", "", *entries, ""] if entries else []


def _heading(level: int, name: str) -> str:
    return f"{'#' * level} " + (f"`{name}`" if "__" in name else name)


def _summary(obj: object) -> str:
    return (paragraphs(own_doc(obj)) or ["(no docstring)"])[0]


def _public_bases(cls: type) -> list[type]:
    """``cls``'s bases, a private one replaced by its own public bases."""
    bases = []
    for base in cls.__bases__:
        bases += _public_bases(base) if base.__name__.startswith("_") else [base]
    return bases


def _methods(cls: type) -> Iterator[tuple[str, Any]]:
    """The public methods ``cls`` defines itself, and its ``__call__``."""
    for name, value in vars(cls).items():
        is_method = isinstance(value, classmethod | staticmethod) or inspect.isfunction(value)
        if is_method and (not name.startswith("_") or name == "__call__"):
            yield name, getattr(cls, name)


def _attributes(cls: type, extra: list[str]) -> list[str]:
    """``extra`` then one entry per public property ``cls`` defines."""
    out = list(extra)
    for name, value in vars(cls).items():
        if isinstance(value, property) and not name.startswith("_") and value.fget:
            kind = returns(value.fget)
            about = " ".join(paragraphs(own_doc(value.fget)))
            entry = f"- `{name}`" + (f" (`{kind}`)" if kind else "")
            out.append(entry + (f": {about}" if about else ""))
    return out


def render_method(owner: type, name: str, method: Any) -> list[str]:
    out = [_heading(4, f"{owner.__name__}.{name}"), ""]
    out += signature_block(name, parameters(method), returns(method))
    return out + [line for paragraph in paragraphs(own_doc(method)) for line in (paragraph, "")]


def render_members(cls: type[enum.Enum]) -> list[str]:
    docs = attribute_docs(cls)
    entries = []
    for member in cls:
        about = docs.get(member.name, ("", ""))[1]
        entry = f"- `{member.name}` = `{literal(member.value)}`"
        entries.append(entry + (f": {about}" if about else ""))
    return _listing("Members", entries)


def render_exception(cls: type[BaseException]) -> list[str]:
    bases = _public_bases(cls)
    category = getattr(cls, "category", None)
    out = [", ".join(f"`{base.__name__}`" for base in bases), ""]
    out[0] = f"Subclass of {out[0]}." + (f" Category: `{category.value}`." if category else "")
    inherited = {
        p.name
        for base in bases
        if base.__module__.startswith("kafka_txn")
        for p in parameters(base)
    }
    own = [p for p in parameters(cls) if p.name not in inherited]
    described, rest = describe_parameters(own_doc(cls), [p.name for p in own])
    annotated = attribute_docs(cls)
    for name, (_, doc) in annotated.items():
        described[name] = doc or described.get(name, "")
    entries = []
    for p in own:
        kind = annotated.get(p.name, ("", ""))[0] or p.type
        about = described.get(p.name)
        entries.append(f"- `{p.name}` (`{type_text(kind)}`)" + (f": {about}" if about else ""))
    out += [rest, ""] if rest else []
    out += _listing("Attributes", _attributes(cls, entries))
    for name, method in _methods(cls):
        out += render_method(cls, name, method)
    return out


def render_class(cls: type) -> list[str]:
    if issubclass(cls, enum.Enum):
        more = [line for paragraph in paragraphs(own_doc(cls))[1:] for line in (paragraph, "")]
        return more + render_members(cls)
    if issubclass(cls, BaseException):
        return render_exception(cls)
    out: list[str] = []
    if getattr(cls, "_is_protocol", False):
        params: list[Parameter] = []
        only_called = [name for name, _ in _methods(cls)] == ["__call__"]
        shape = "any callable of this signature" if only_called else "any object with these methods"
        out += [f"A protocol: {shape} will do.", ""]
    else:
        params = parameters(cls)
        out += signature_block(cls.__name__, params)
    described, rest = describe_parameters(own_doc(cls), [p.name for p in params])
    for name, (_, doc) in attribute_docs(cls).items():
        if doc:
            described.setdefault(name, doc)
    out += [rest, ""] if rest else []
    out += _listing("Parameters", parameter_entries(params, described))
    out += _listing("Attributes", _attributes(cls, []))
    for name, method in _methods(cls):
        out += render_method(cls, name, method)
    return out


def render_function(name: str, func: Any) -> list[str]:
    params = parameters(func)
    described, rest = describe_parameters(own_doc(func), [p.name for p in params])
    out = [*signature_block(name, params, returns(func)), _summary(func), ""]
    out += [rest, ""] if rest else []
    return out + _listing("Parameters", parameter_entries(params, described))


def render_value(module: types.ModuleType, name: str, value: object) -> list[str]:
    """A constant or a type alias: its definition or type, and its docstring."""
    origin = origin_module(module, name)
    annotation, doc = attribute_docs(origin).get(name, ("", ""))
    if typing.get_origin(value) is not None:  # a type alias
        line = f"{name} = {alias_source(origin, name)}"
    elif isinstance(value, tuple) and all(isinstance(item, str) for item in value):
        line = f"{name} = (\n" + "".join(f"    {literal(item)},\n" for item in value) + ")"
    else:
        line = f"{name}: {type_text(annotation) if annotation else type(value).__name__}"
        line += f" = {literal(value)}" if isinstance(value, str) else ""
    return ["```python", line, "```", ""] + ([doc, ""] if doc else [])


def render_name(module: types.ModuleType, name: str, obj: Any) -> list[str]:
    out = [_heading(3, name), ""]
    if inspect.isclass(obj):
        return [*out, _summary(obj), "", *render_class(obj)]
    if inspect.isfunction(obj):
        return out + render_function(name, obj)
    return out + render_value(module, name, obj)


def _optional_names() -> str:
    """The paragraph on the names of ``kafka_txn`` that need an extra, from its table."""
    by_extra: dict[str, list[str]] = {}
    for public, (_, extra) in _OPTIONAL.items():
        by_extra.setdefault(extra, []).append(f"`{public}`")
    listed = "; ".join(f"{', '.join(names)}: `[{extra}]`" for extra, names in by_extra.items())
    return (
        f"Names that need an optional extra ({listed}) are imported on first use. Without "
        "their extra, using one raises an ImportError naming the `pip install` command, "
        "and `from kafka_txn import *` leaves them out (everything else works)."
    )


def _documented(module: types.ModuleType) -> list[tuple[str, Any]]:
    """The public names documented under ``module``: all of ``kafka_txn``'s; of the
    others, those they define (a re-export is documented under ``kafka_txn``)."""
    names = []
    for public in getattr(module, "__all__", ()):
        obj = getattr(module, public)
        defined_here = getattr(obj, "__module__", module.__name__) == module.__name__
        if module.__name__ == "kafka_txn" or defined_here:  # a constant has no __module__
            names.append((public, obj))
    return names


def _anchor(name: str) -> str:
    """The anchor GitHub gives the heading ``name``."""
    return "#" + re.sub(r"[^\w\- ]", "", name.lower()).replace(" ", "-")


def render_api() -> str:
    """docs/reference/api.md: every public name of ``API_MODULES``."""
    out = [
        "# API reference",
        "",
        "Generated from the code and its docstrings by `python -m kafka_txn._docs`; a test",
        "fails when it drifts. The guides are linked from [the landing page](../index.md).",
        "",
    ]
    modules = [importlib.import_module(name) for name in API_MODULES]
    contents = {module: _documented(module) for module in modules}
    for module, members in contents.items():
        links = ", ".join(f"[{public}]({_anchor(public)})" for public, _ in members)
        out.append(
            f"- [{module.__name__}]({_anchor(module.__name__)})" + (f": {links}" if links else "")
        )
    out.append("")
    for module, members in contents.items():
        out += [f"## {module.__name__}", "", _summary(module), ""]
        if module.__name__ == "kafka_txn":
            out += [_optional_names(), ""]
        for public, obj in members:
            out += render_name(module, public, obj)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip() + "\n"
