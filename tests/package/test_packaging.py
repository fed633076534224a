"""The source distribution is complete: built the way a release is (``python -m build
--sdist``, offline: ``--no-isolation`` with the setuptools of this environment), it holds
the license, the docs, examples, benchmarks and the whole test suite with its rig, its
metadata names the license and the project's URLs, and the tests that need no server run
from the unpacked sdist against the kafka_txn inside it."""

from __future__ import annotations

import ast
import os
import shutil
import socket
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

# What a fresh clone does not have (.gitignore) is not copied into the build: a stale
# kafka_txn.egg-info/SOURCES.txt would otherwise add files that MANIFEST.in forgot.
_NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "__pycache__",
    "*.egg-info",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    "build",
    "dist",
    ".noida-db",
)

# Files outside the package that the sdist must carry, besides every file of these folders.
_TOP_FILES = ("LICENSE", "README.md", "CHANGELOG.md", "Makefile", "constraints.txt")
_FOLDERS = ("docs", "examples", "bench", "tests")

# Test files none of whose tests needs a broker, a database or a Spark session: they must
# pass from the sdist. (A broker test added to one of them fails this test, the broker
# being unreachable: move it, or take the file off this list.)
_PURE_TESTS = (
    "tests/twophase/test_state.py",
    "tests/package/test_classification.py",
    "tests/coordinator/test_protocol.py",
    "tests/twophase/test_decisions.py",
    "tests/package/test_guarantees_doc.py",  # every test docs/guarantees.md names is in the sdist
    "tests/package/test_logging.py",
)


def _clone_files(folder: Path) -> set[str]:
    return {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The sdist built from a copy of this checkout, unpacked; yields the unpacked folder."""
    work = tmp_path_factory.mktemp("sdist")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_IN_A_CLONE)
    built = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", "dist", "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (archive,) = (source / "dist").glob("kafka_txn-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")], names
        # The "data" filter (Python 3.10.12+, 3.11.4+) refuses links and paths out of the folder.
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(work / "unpacked", **safe)
    (unpacked,) = (work / "unpacked").iterdir()
    yield unpacked


def test_sdist_carries_license_docs_examples_bench_and_the_whole_test_suite(
    sdist: Path,
) -> None:
    have = _clone_files(sdist)
    missing = [name for name in _TOP_FILES if name not in have]
    for folder in _FOLDERS:
        missing += sorted(
            f"{folder}/{name}"
            for name in _clone_files(ROOT / folder)
            if f"{folder}/{name}" not in have and not name.endswith(".pyc")
        )
    assert not missing, f"not in the sdist: {missing}"
    assert (sdist / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert "Apache License" in (sdist / "LICENSE").read_text()


def test_every_module_a_test_imports_from_the_repository_is_in_the_sdist(sdist: Path) -> None:
    imported: set[str] = set()
    for test_file in (sdist / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(test_file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    ours = sorted(name for name in imported if name.split(".")[0] in ("tests", "examples", "bench"))
    assert "tests.support.rig" in ours and "tests.support.databases" in ours, ours
    missing = [
        name
        for name in ours
        if not (sdist / (name.replace(".", "/") + ".py")).is_file()
        and not (sdist / name.replace(".", "/") / "__init__.py").is_file()
    ]
    assert not missing, f"modules tests import but the sdist lacks: {missing}"


def test_sdist_metadata_names_the_license_and_the_project_urls(sdist: Path) -> None:
    info = Parser().parsestr((sdist / "PKG-INFO").read_text())
    assert info["License-Expression"] == "Apache-2.0"
    assert info.get_all("License-File") == ["LICENSE"]
    urls = dict(url.split(", ", 1) for url in info.get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Documentation", "Changelog", "Issues"}, urls
    assert all(url.startswith("https://") for url in urls.values()), urls


def _from_sdist(sdist: Path, *args: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    """Run Python in the unpacked sdist, importing kafka_txn and tests from it, with
    KAFKA_BOOTSTRAP_SERVERS at a port that refuses connections: no broker is started."""
    env = {**os.environ, "PYTHONPATH": str(sdist), "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    return subprocess.run(
        [sys.executable, *args],
        cwd=sdist,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_tests_that_need_no_server_pass_from_the_unpacked_sdist(sdist: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{closed.getsockname()[1]}"
        where = _from_sdist(
            sdist,
            "-c",
            "import kafka_txn, tests.support.rig; print(kafka_txn.__file__)",
            bootstrap=bootstrap,
        )
        assert where.returncode == 0, where.stderr
        assert Path(where.stdout.strip()).is_relative_to(sdist), where.stdout
        collected = _from_sdist(
            sdist, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
            bootstrap=bootstrap,
        )  # fmt: skip
        assert collected.returncode == 0, collected.stdout + collected.stderr
        ran = _from_sdist(
            sdist, "-m", "pytest", "-p", "no:cacheprovider", *_PURE_TESTS, bootstrap=bootstrap
        )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"rootdir: {sdist}" in ran.stdout
    assert " passed" in ran.stdout and " failed" not in ran.stdout
    assert "kafka broker: not started (no test needed one)" in ran.stdout
