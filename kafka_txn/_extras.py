"""The optional extras (``pip install 'kafka-txn[sql]'`` ...): which top-level packages
each one brings, whether they are installed, the ImportError that names the extra, and
the lazy re-exports of the capability packages.

The core package needs only confluent-kafka, pydantic and tenacity; the modules below
import an extra's package at their top, inside a ``try`` whose ``except`` raises
``missing_extra(...)``, so that a missing package is reported with the command that
installs it rather than as a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Final

__all__ = ["EXTRAS", "installed", "lazy_exports", "missing_extra"]

EXTRAS: Final[dict[str, tuple[str, ...]]] = {
    "sql": ("sqlalchemy",),
    "postgres": ("sqlalchemy", "psycopg"),
    "mysql": ("sqlalchemy", "pymysql"),
    "spark": ("sqlalchemy", "pyspark"),
    "prometheus": ("prometheus_client",),
    "otel": ("opentelemetry",),
    # AsyncDualWriter: SQLAlchemy's asyncio extension; the async driver of each database
    # (psycopg, aiomysql, aiosqlite) is imported when an engine for it is made.
    "asyncio": ("sqlalchemy", "greenlet"),
}
"""Each extra of pyproject.toml that code imports, and the top-level packages it needs."""


def installed(extra: str) -> bool:
    """True when every package of ``extra`` can be found, without importing any (a
    SparkSession's JVM, say, is not started by asking)."""
    for package in EXTRAS[extra]:
        try:
            if importlib.util.find_spec(package) is None:
                return False
        except (ImportError, ValueError):  # a finder refused it, or a broken __spec__
            return False
    return True


def missing_extra(feature: str, extra: str, exc: ImportError) -> ImportError:
    """The error for ``feature`` failing to import a package of ``extra``: the same
    class as ``exc`` (``ModuleNotFoundError`` when the package is missing) and the same
    ``name``, with the ``pip install`` command in the message. Raise it ``from exc``."""
    kind = ModuleNotFoundError if isinstance(exc, ModuleNotFoundError) else ImportError
    return kind(
        f"{feature} needs the [{extra}] extra: pip install 'kafka-txn[{extra}]' ({exc})",
        name=exc.name,
    )


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package`` that imports ``exports[name]`` (a module
    path) on first use of ``name`` and returns its attribute of that name.

    The capability packages re-export their public names this way: importing a package
    runs no module of it, so one of its modules may import another package's module
    without an import cycle through the packages' ``__init__``, and a package whose
    modules need an extra imports (and needs) it only when one of its names is used."""

    def exported(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return exported
