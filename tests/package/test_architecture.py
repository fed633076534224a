"""docs/architecture.md stays true: it names every package of kafka_txn/ and every test
folder, it names no path that does not exist, and the imports follow the layers it draws.

The layers are read from the page's diagram (a number, then the paths of that layer), so
the page and this check cannot disagree: a module may import from its own layer and the
layers below, never above. The modules beside the stack (the package's ``__init__``, the
private helpers, the doc generators) are placed here, in ``_BESIDE``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "kafka_txn"

_LAYER_LINE = re.compile(r"^(\d+)?\s+(kafka_txn/\S+)")
_PATH = re.compile(r"\b(?:kafka_txn|tests)/[\w/.]*")

_TOP = 99
_BESIDE = {
    "kafka_txn/__init__.py": _TOP,  # re-exports every layer
    "kafka_txn/_docs.py": _TOP,  # renders every layer's docs
    "kafka_txn/_api_reference.py": _TOP,
    "kafka_txn/_docstrings.py": _TOP,
    "kafka_txn/_extras.py": 0,  # used by every layer, imports none
    "kafka_txn/_logging.py": 0,
}
"""The layer of each module beside the stack (not in the page's diagram)."""


def _page() -> str:
    return PAGE.read_text()


def _diagram_layers() -> dict[str, int]:
    """``{path: layer}`` from the page's diagram: its first fenced block."""
    block = _page().split("```", 2)[1]
    layers, current = {}, None
    for line in block.splitlines():
        match = _LAYER_LINE.match(line)
        if match:
            current = int(match.group(1)) if match.group(1) else current
            assert current is not None, f"a diagram line without a layer: {line!r}"
            layers[match.group(2)] = current
    return layers


def _layer_of(relative: str, layers: dict[str, int]) -> int | None:
    """The layer of a module (a path under the repository): its own entry, else its
    package's (the longest matching ``kafka_txn/x/`` prefix)."""
    if relative in _BESIDE:
        return _BESIDE[relative]
    if relative in layers:
        return layers[relative]
    packages = [p for p in layers if p.endswith("/") and relative.startswith(p)]
    return layers[max(packages, key=len)] if packages else None


def _module_path(name: str) -> str | None:
    """The path of module ``kafka_txn.x.y`` (a package's ``__init__`` for a package)."""
    base = ROOT / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate.relative_to(ROOT).as_posix()
    return None


def _imports(path: Path) -> Iterator[str]:
    """The ``kafka_txn`` modules ``path`` imports (``from a import b``: ``a.b`` when it is
    a module, else ``a``), at any depth of the file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "kafka_txn")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "kafka_txn":
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield submodule if _module_path(submodule) else node.module


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_package_is_named() -> None:
    text = _page()
    packages = sorted(
        p.parent.relative_to(ROOT).as_posix() + "/"
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE
    )
    assert packages, "no package found under kafka_txn/"
    missing = [p for p in packages if p not in text]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_every_test_folder_is_named() -> None:
    text = _page()
    folders = sorted(
        f"tests/{p.name}/"
        for p in (ROOT / "tests").iterdir()
        if p.is_dir() and not p.name.startswith((".", "__"))
    )
    missing = [f for f in folders if f not in text]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_every_named_path_exists() -> None:
    named = set(_PATH.findall(_page()))
    assert len(named) >= 20, "the page names too few paths: the pattern broke?"
    missing = sorted(p for p in named if not (ROOT / p.rstrip(".")).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_module_has_a_layer() -> None:
    layers = _diagram_layers()
    assert "kafka_txn/errors.py" in layers and "kafka_txn/cli/" in layers, layers
    unplaced = [
        p.relative_to(ROOT).as_posix()
        for p in _modules()
        if _layer_of(p.relative_to(ROOT).as_posix(), layers) is None
    ]
    assert not unplaced, f"modules in no layer of docs/architecture.md: {unplaced}"


def _target_layer(target: str, layers: dict[str, int]) -> int | None:
    """The layer a module counts as when imported: its own, except the package root,
    which counts as the highest layer it imports (it re-exports them)."""
    if target != "kafka_txn/__init__.py":
        return _layer_of(target, layers)
    below = (_module_path(name) for name in _imports(ROOT / target))
    found = [_layer_of(path, layers) for path in below if path and path != target]
    return max(layer for layer in found if layer is not None)


def _upward_imports() -> Iterator[str]:
    layers = _diagram_layers()
    for path in _modules():
        relative = path.relative_to(ROOT).as_posix()
        own = _layer_of(relative, layers)
        for name in _imports(path):
            target = _module_path(name)
            if target is None or own is None or target == relative:
                continue
            theirs = _target_layer(target, layers)
            if theirs is not None and theirs > own:
                yield f"{relative} (layer {own}) imports {name} (layer {theirs})"


def test_imports_follow_the_layers() -> None:
    upward = list(_upward_imports())
    assert not upward, "imports against docs/architecture.md's layers:\n" + "\n".join(upward)


def test_errors_and_classification_stand_on_nothing_above_them() -> None:
    for module in ("errors", "classification"):
        imported = set(_imports(PACKAGE / f"{module}.py"))
        assert imported <= {"kafka_txn.errors"}, f"kafka_txn/{module}.py imports {imported}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_only_the_cli_imports_the_cli(path: Path) -> None:
    if "cli" in path.relative_to(PACKAGE).parts[:1]:
        return
    imported = [name for name in _imports(path) if name.split(".")[:2] == ["kafka_txn", "cli"]]
    assert not imported, f"{path.relative_to(ROOT)} imports {imported}"
