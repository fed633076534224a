"""What the code says about itself, read for the generated API reference
(``kafka_txn._api_reference``): signatures with their annotations and defaults as a person
writes them, and the descriptions the docstrings give.

Annotations come back as source text: ``Annotated[...]`` reduced to its base type (its
bounds told apart, in words), string annotations unquoted, ``ForwardRef`` unwrapped.
Defaults too: a callable as ``time.sleep``, an enum member as ``ErrorCategory.ABORTABLE``,
a default factory as what it makes (``{}``, ``Counter()``).

Descriptions are never written here, only found. The docstrings document a parameter in
prose, in a clause that starts with its name in double backquotes (``config`` is a dict
...), so a parameter's description is that clause, else the first later clause that names
it (unless that clause is a list naming more than three parameters; one that starts with
another parameter is pointed to, "see `other`"), else the docstring under the field of a
dataclass, named tuple or pydantic model.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import enum
import importlib
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, Final

_FACTORIES: Final = (dict, list, set, tuple, collections.Counter, collections.OrderedDict)
"""Default factories shown as what they make."""

_NOT_A_SENTENCE_END: Final = ("e.g", "i.e", "etc", "vs", "cf")
_LIST_OF_NAMES: Final = 3
"""A clause naming more parameters than this lists them; it describes none of them."""


# --- annotations and defaults ---------------------------------------------------------------


def type_text(annotation: object) -> str:
    """An annotation as source text: ``Mapping[str, Any] | None``, never
    ``typing.Annotated[...]``, ``ForwardRef(...)`` or a quoted string."""
    if isinstance(annotation, str):
        text = annotation.strip()
        return text[len("Final[") : -1] if text.startswith("Final[") else text
    if isinstance(annotation, typing.ForwardRef):
        return annotation.__forward_arg__
    if annotation is None or annotation is type(None):
        return "None"
    if annotation is Any:
        return "Any"
    if annotation is Ellipsis:
        return "..."
    if isinstance(annotation, list):  # Callable's parameter list
        return "[" + ", ".join(type_text(arg) for arg in annotation) + "]"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(arg) for arg in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(arg) for arg in args)}]"
    if origin is not None:
        name = getattr(origin, "__qualname__", None) or type_text(origin)
        return f"{name}[{', '.join(type_text(arg) for arg in args)}]"
    if isinstance(annotation, type):
        return annotation.__qualname__
    if isinstance(annotation, typing.TypeVar):
        return annotation.__name__
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])", "", repr(annotation))


def _number(value: object) -> str:
    """``2**63 - 1`` for the largest signed integers, the digits otherwise."""
    if isinstance(value, int) and value >= (1 << 31) - 1 and (value + 1).bit_count() == 1:
        return f"2**{(value + 1).bit_length() - 1} - 1"
    return str(value)


def constraints(metadata: Iterable[object], base: str) -> str:
    """The bounds in ``Annotated`` metadata or a pydantic field (``Ge``, ``Le``, ``MinLen``
    ...) in words: ``0 to 32767``, ``at least 1 character``."""
    bound = {
        attr: getattr(item, attr)
        for item in metadata
        for attr in ("ge", "gt", "le", "lt", "min_length", "max_length")
        if getattr(item, attr, None) is not None
    }
    unit = "character" if base.split(" | ", maxsplit=1)[0] in ("str", "bytes") else "item"
    words = []
    low, high = bound.get("ge"), bound.get("le")
    if low is not None and high is not None:
        words.append(f"{_number(low)} to {_number(high)}")
    elif low is not None:
        words.append(f"at least {_number(low)}")
    elif high is not None:
        words.append(f"at most {_number(high)}")
    if "gt" in bound:
        words.append(f"more than {_number(bound['gt'])}")
    if "lt" in bound:
        words.append(f"less than {_number(bound['lt'])}")
    shortest, longest = bound.get("min_length"), bound.get("max_length")
    if shortest is not None and longest is not None:
        words.append(f"{shortest} to {_number(longest)} {unit}s")
    elif shortest is not None:
        words.append(f"at least {shortest} {unit}{'' if shortest == 1 else 's'}")
    elif longest is not None:
        words.append(f"at most {_number(longest)} {unit}s")
    return ", ".join(words)


def literal(value: object) -> str:
    """``repr(value)``, a string in double quotes as the formatter writes it."""
    text = repr(value)
    if isinstance(value, str) and text.startswith("'") and '"' not in value:
        return '"' + text[1:-1] + '"'
    return text


def default_text(value: object, factory: Callable[[], object] | None = None) -> str:
    """A default as a person writes it: ``time.sleep``, ``ErrorCategory.ABORTABLE``,
    ``{}`` for a ``dict`` factory, ``a new X`` for another factory."""
    if factory is not None:
        return repr(factory()) if factory in _FACTORIES else f"a new {type_text(factory)}"
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if callable(value) and hasattr(value, "__qualname__"):
        module = getattr(value, "__module__", None) or "builtins"
        if module == "builtins" or module.startswith("kafka_txn"):
            return str(value.__qualname__)
        return f"{module}.{value.__qualname__}"
    return literal(value)


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One parameter as the reference shows it."""

    name: str
    kind: inspect._ParameterKind
    type: str = ""
    default: str | None = None
    """The default as written; None when the parameter is required."""
    bounds: str = ""
    alias: str = ""
    """Another name the parameter is accepted under (a pydantic validation alias)."""

    def code(self) -> str:
        """The parameter as it reads in a signature."""
        stars = "*" if self.kind is inspect.Parameter.VAR_POSITIONAL else ""
        stars = "**" if self.kind is inspect.Parameter.VAR_KEYWORD else stars
        text = stars + self.name + (f": {self.type}" if self.type else "")
        if self.default is not None:
            text += f" = {self.default}" if self.type else f"={self.default}"
        return text


def parameters(obj: Any) -> list[Parameter]:
    """The parameters of a function, or of a class's constructor; ``self`` left out."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    fields = getattr(obj, "model_fields", {}) if isinstance(obj, type) else {}
    factories = {}
    if isinstance(obj, type) and dataclasses.is_dataclass(obj):
        factories = {f.name: f.default_factory for f in dataclasses.fields(obj)}
    out = []
    for p in signature.parameters.values():
        if p.name in ("self", "cls"):
            continue
        field = fields.get(p.name)
        metadata = list(getattr(field, "metadata", ()))
        if typing.get_origin(p.annotation) is typing.Annotated:
            metadata += list(p.annotation.__metadata__)
        factory = getattr(field, "default_factory", None) or factories.get(p.name)
        shown = "" if p.annotation is p.empty else type_text(p.annotation)
        alias = getattr(field, "validation_alias", None)
        default = None
        if p.default is not p.empty:
            default = default_text(p.default, factory if callable(factory) else None)
        out.append(
            Parameter(
                p.name,
                p.kind,
                shown,
                default,
                constraints(metadata, shown),
                alias if isinstance(alias, str) else "",
            )
        )
    return out


def returns(obj: Any) -> str:
    """The return annotation as written; empty when there is none."""
    try:
        annotation = inspect.signature(obj).return_annotation
    except (TypeError, ValueError):
        return ""
    return "" if annotation is inspect.Signature.empty else type_text(annotation)


# --- docstrings -------------------------------------------------------------------------------


def own_doc(obj: object) -> str:
    """``obj``'s own docstring, cleaned (not one inherited from ``object``)."""
    doc = inspect.getdoc(obj) if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def paragraphs(doc: str) -> list[str]:
    """A docstring's paragraphs, each on one line; a literal block (after ``::``) fenced,
    as it is written (no language: a formatter must not rewrap it)."""
    out: list[str] = []
    for block in re.split(r"\n\s*\n", doc.strip()):
        if out and out[-1].endswith("::"):
            out[-1] = out[-1][:-1]
            out.append("```\n" + textwrap.dedent(block).strip("\n") + "\n```")
        elif block.strip():
            out.append(" ".join(block.split()))
    return out


def clauses(paragraph: str) -> list[str]:
    """A paragraph cut into its sentences, and a sentence at each ``;`` that a name in
    double backquotes follows, outside brackets and literals."""
    out, start, depth, literal, i = [], 0, 0, False, 0
    while i < len(paragraph):
        if paragraph.startswith("``", i):
            literal, i = not literal, i + 2
            continue
        char, after = paragraph[i], paragraph[i + 1 : i + 4]
        if not literal:
            depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        word = paragraph[start:i].rsplit(" ", 1)[-1]
        sentence_end = char == "." and after[:1] in (" ", "") and word not in _NOT_A_SENTENCE_END
        if not literal and depth <= 0 and (sentence_end or (char == ";" and after == " ``")):
            out.append(paragraph[start : i + 1].strip())
            start = i + 1
        i += 1
    if paragraph[start:].strip():
        out.append(paragraph[start:].strip())
    return out


def _leading_names(clause: str) -> list[str]:
    """The names in double backquotes a clause starts with: ``a``, ``b`` and ``c(x)``."""
    names, end = [], 0
    for match in re.finditer(r"``(\w+)(?:\([^`]*\))?``(?:,? and |, |/|\s|$)", clause):
        if match.start() != end:
            break
        names.append(match.group(1))
        end = match.end()
    return names


def _sentence(text: str) -> str:
    return text[:-1] + "." if text.endswith(";") else text


def describe_parameters(doc: str, names: Iterable[str]) -> tuple[dict[str, str], str]:
    """Each parameter of ``names`` that ``doc`` (past its first paragraph) describes, with
    its description; and the rest of ``doc`` past the first paragraph, without the
    clauses that went to parameters."""
    cut = [[p] if p.startswith("```") else clauses(p) for p in paragraphs(doc)[1:]]
    wanted = list(names)
    found: dict[str, list[str]] = {}
    owner: dict[tuple[int, int], str] = {}  # a clause -> the parameter it starts with
    for p, parts in enumerate(cut):
        for c, clause in enumerate(parts):
            for name in _leading_names(clause):
                if name in wanted:
                    found.setdefault(name, []).append(_sentence(clause))
                    owner.setdefault((p, c), name)
    used = set(owner)
    for name in wanted:
        for p, parts in enumerate(cut):
            if name in found:
                break
            for c, clause in enumerate(parts):
                named = sum(f"``{other}``" in clause for other in wanted)
                if f"``{name}``" in clause and named <= _LIST_OF_NAMES:
                    # Another parameter's clause is pointed to, not repeated.
                    first = owner.get((p, c))
                    found[name] = [f"see `{first}`." if first else _sentence(clause)]
                    used.add((p, c))
                    break
    rest = []
    for p, parts in enumerate(cut):
        kept = [clause for c, clause in enumerate(parts) if (p, c) not in used]
        if kept:
            rest.append(_sentence(" ".join(kept)))
    return {name: " ".join(found[name]) for name in found}, "\n\n".join(rest)


def attribute_docs(owner: object) -> dict[str, tuple[str, str]]:
    """``{name: (annotation as written, docstring)}`` for the names of a class body or a
    module that a string literal follows; in a class, also ``self.name: T`` annotations
    of its ``__init__`` (docstring empty)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(owner)))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body
    if isinstance(owner, type):
        if not (body and isinstance(body[0], ast.ClassDef)):
            return {}
        body = body[0].body
    docs: dict[str, tuple[str, str]] = {}
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            for node in ast.walk(stmt):
                target = getattr(node, "target", None)
                if isinstance(node, ast.AnnAssign) and isinstance(target, ast.Attribute):
                    docs.setdefault(target.attr, (ast.unparse(node.annotation), ""))
    for stmt, after in itertools.pairwise(body):
        if not (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)):
            continue
        if not isinstance(after.value.value, str):
            continue
        doc = " ".join(inspect.cleandoc(after.value.value).split())
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            docs[stmt.target.id] = (ast.unparse(stmt.annotation), doc)
        elif isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            docs[stmt.targets[0].id] = ("", doc)
    return docs


def origin_module(module: types.ModuleType, name: str) -> types.ModuleType:
    """The module whose source defines ``name``, following ``from x import name``."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return module
    for stmt in ast.walk(tree):
        if not (isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0):
            continue
        if any(alias.name == name and alias.asname is None for alias in stmt.names):
            return origin_module(importlib.import_module(stmt.module), name)
    return module


def alias_source(module: types.ModuleType, name: str) -> str:
    """The right-hand side of ``name = ...`` in ``module``'s source, as written."""
    for stmt in ast.parse(inspect.getsource(module)).body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in stmt.targets
        ):
            return ast.unparse(stmt.value)
    return ""
