"""Mutation testing of the modules that carry guarantees (``make mutants``; not part of
``make test``): mutmut changes one operator, constant or call at a time in one module and
runs the tests that reach the changed function; a mutant the tests do not fail on
"survived", and names a behaviour no test pins down. Results: docs/reference/proofs.md,
"Mutation testing".

    python -m tests.support.mutants                      # the fast targets (FAST below)
    python -m tests.support.mutants recovery twophase    # named targets
    python -m tests.support.mutants all                  # every target: hours (broker tests)

Each target runs in a copy of this checkout (``--workdir``, default build/mutants/<target>;
the checkout itself is never modified), with one local broker started for the whole run
and named by KAFKA_BOOTSTRAP_SERVERS (the rig's documented override), so that every
mutant's test session does not start its own. A target's tests are its feature's folder
(``tests/<feature>/``): a test in any file of it that reaches the changed function counts,
wherever the test was put. Its fastest files run first (pytest ``-x``: a mutant the pure
tests kill never reaches the broker tests). Each target writes ``summary.json`` and
``survivors.txt`` (the diff of every survivor) in its folder.

This module is also the pytest plugin (``-p tests.support.mutants``) that orders the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
ORDER_VARIABLE = "KAFKA_TXN_MUTANTS_ORDER"
"""Test files, ``:``-separated, whose tests run first, in this order (the plugin below)."""


@dataclass(frozen=True)
class Target:
    """One module and the tests that state its guarantees."""

    module: str
    tests: tuple[str, ...]
    """What pytest is given: the feature's test folder (every test of every file in it
    that reaches the changed function counts, whichever file it is in), or files."""
    first: tuple[str, ...] = ()
    """Test files run before the rest of ``tests``, fastest first."""
    timeout_s: int = 120
    """pytest-timeout per test: a mutant that loops is killed, not waited for."""


TARGETS: dict[str, Target] = {
    "decisions": Target(
        "kafka_txn/twophase/decisions.py",
        ("tests/twophase",),
        first=("tests/twophase/test_decisions.py",),
    ),
    "recovery": Target(
        "kafka_txn/twophase/recovery.py",
        ("tests/twophase",),
        first=("tests/twophase/test_decisions.py", "tests/twophase/test_recovery.py"),
    ),
    "lifecycle": Target(
        "kafka_txn/producer/lifecycle.py",
        ("tests/producer",),
        first=("tests/producer/test_lifecycle.py",),
        timeout_s=60,
    ),
    # tests/package is no feature's folder (it also builds the sdist and runs every
    # example): the error table's own files.
    "classification": Target(
        "kafka_txn/classification.py",
        ("tests/package/test_classification.py", "tests/package/test_errors.py"),
        first=("tests/package/test_classification.py", "tests/package/test_errors.py"),
        timeout_s=60,
    ),
    "twophase": Target(
        "kafka_txn/twophase/prepare.py",
        ("tests/twophase",),
        first=(
            "tests/twophase/test_prepare_overlap.py",
            "tests/twophase/test_prepare_adversaries.py",
            "tests/twophase/test_two_phase.py",
        ),
    ),
    "dualwrite": Target(
        "kafka_txn/dualwrite/writer.py",
        ("tests/dualwrite",),
        first=(
            "tests/dualwrite/test_writer.py",
            "tests/dualwrite/test_threads.py",
            "tests/dualwrite/test_zombie.py",
        ),
        timeout_s=300,
    ),
    "producer": Target(
        "kafka_txn/producer/transactional.py",
        ("tests/producer", "tests/broker/test_broker.py"),
        first=(
            "tests/producer/test_lifecycle.py",
            "tests/producer/test_producer.py",
            "tests/producer/test_fault_injection.py",
        ),
    ),
}
FAST = ("decisions", "recovery", "lifecycle", "classification")
"""What ``make mutants`` runs by default: about an hour on a 2-core machine."""

# mutmut's exit-code statuses that count as killed / not killed.
_KILLED = {"killed", "timeout", "segfault", "caught by type check"}
_RESULT_LINE = re.compile(r"^\s+(\S+): (.+)$")


def _copy_checkout(workdir: Path) -> None:
    """This checkout's files as git sees them (tracked, and untracked but not ignored)."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = workdir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _configure(workdir: Path, target: Target) -> None:
    """mutmut reads [tool.mutmut] from the working directory's pyproject.toml."""
    # Tests read the docs, examples... from the root mutmut runs them in (mutants/).
    also_copy = sorted(p.name for p in workdir.iterdir() if p.name not in ("kafka_txn", "tests"))
    with (workdir / "pyproject.toml").open("a") as out:
        out.write(
            "\n[tool.mutmut]\n"
            'source_paths = ["kafka_txn"]\n'
            f"also_copy = {json.dumps(also_copy)}\n"
            f"only_mutate = [{json.dumps(target.module)}]\n"
            f"pytest_add_cli_args_test_selection = {json.dumps(list(target.tests))}\n"
            f'pytest_add_cli_args = ["-p", "tests.support.mutants", "-p", "no:cacheprovider", '
            f'"--timeout={target.timeout_s}"]\n'
            # Each mutant's tests run in a child of a server that imported pytest and
            # collected the tests, not of the process that ran the broker tests for the
            # stats (librdkafka's threads do not survive a fork).
            'process_isolation = "forkserver"\n'
            "use_git_change_detection = false\n"  # each run starts from a fresh copy
        )


@contextmanager
def _one_broker() -> Iterator[None]:
    """One local broker for every mutant's tests (KAFKA_BOOTSTRAP_SERVERS, see
    tests/support/rig.py), unless one is named already."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield
        return
    from kafka_txn.cli.local_broker import LocalBroker

    with LocalBroker() as broker:
        os.environ["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap_servers
        try:
            yield
        finally:
            del os.environ["KAFKA_BOOTSTRAP_SERVERS"]


def _mutmut(workdir: Path, *args: str) -> str:
    mutmut = Path(sys.executable).parent / "mutmut"
    env = {
        **os.environ,
        # Subprocesses the tests start (crash_app.py...) import the mutated package too.
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(workdir / "mutants"), os.environ.get("PYTHONPATH")])
        ),
    }
    log = workdir / f"mutmut-{args[0]}.log"
    with log.open("w") as out:  # streamed: `tail -f` it to follow a long run
        done = subprocess.run(
            [str(mutmut), *args], cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
            text=True, check=False,
        )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"mutmut {' '.join(args)} failed in {workdir}: see {log}")
    return log.read_text()


def run_target(name: str, workdir: Path, max_children: int) -> dict[str, Any]:
    """Mutate one target's module in a copy of the checkout; return its summary."""
    target = TARGETS[name]
    if workdir.exists():
        shutil.rmtree(workdir)
    _copy_checkout(workdir)
    _configure(workdir, target)
    # Made now, not by mutmut: a PYTHONPATH entry missing at interpreter start would stay
    # cached as unimportable (sys.path_importer_cache) when mutmut later adds it too.
    (workdir / "mutants").mkdir()
    os.environ[ORDER_VARIABLE] = ":".join(target.first)
    _mutmut(workdir, "run", f"--max-children={max_children}")
    statuses = {
        match[1]: match[2]
        for line in _mutmut(workdir, "results", "--all=true").splitlines()
        if (match := _RESULT_LINE.match(line))
    }
    survivors = sorted(key for key, status in statuses.items() if status not in _KILLED)
    with (workdir / "survivors.txt").open("w") as out:
        for key in survivors:
            out.write(_mutmut(workdir, "show", key) + "\n")
    counts = Counter(statuses.values())
    summary = {
        "target": name,
        "module": target.module,
        "tests": list(target.tests),
        "date": date.today().isoformat(),
        "mutants": len(statuses),
        "killed": sum(n for status, n in counts.items() if status in _KILLED),
        "survived": len(survivors),
        "by_status": dict(sorted(counts.items())),
        "survivors": survivors,
    }
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.mutants", description=__doc__)
    parser.add_argument("targets", nargs="*", help=f"{', '.join(TARGETS)} or all")
    parser.add_argument("--workdir", type=Path, default=ROOT / "build" / "mutants")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    names = list(TARGETS) if args.targets == ["all"] else args.targets or list(FAST)
    unknown = [name for name in names if name not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {unknown}: pick from {', '.join(TARGETS)} or all")
    with _one_broker():
        for name in names:
            s = run_target(name, args.workdir.resolve() / name, args.max_children)
            print(
                f"{s['module']}: {s['mutants']} mutants, {s['killed']} killed, "
                f"{s['survived']} survived {s['by_status']}",
                flush=True,
            )
            for key in s["survivors"]:
                print(f"    survived: {key}")
    return 0


# ---------------------------------------------------------------- pytest plugin
def pytest_collection_modifyitems(items: list[Any]) -> None:
    """Run the test files ORDER_VARIABLE lists first, in its order (fastest first), then
    the rest of the selection in pytest's order."""
    order = os.environ.get(ORDER_VARIABLE, "").split(":")

    def rank(item: Any) -> int:
        path = item.nodeid.split("::", 1)[0]
        return order.index(path) if path in order else len(order)

    items.sort(key=rank)  # stable: pytest's order within a file is kept


if __name__ == "__main__":
    sys.exit(main())
