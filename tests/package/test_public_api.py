"""The package's public surface as users meet it: a star import without any extra, an
ImportError naming the extra for every optional module, and the types mypy sees (the real
classes behind the lazily imported names, keyword arguments checked, Mapping configs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kafka_txn

ROOT = Path(__file__).resolve().parent.parent.parent

# Runs in a fresh interpreter whose imports of the extras' packages fail, as they do
# where only `pip install kafka-txn` ran; prints what each statement did, as JSON.
_NO_EXTRAS = textwrap.dedent(
    """
    import json, sys

    BLOCKED = {"sqlalchemy", "psycopg", "pymysql", "pyspark", "prometheus_client", "greenlet"}

    class NoExtras:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoExtras())
    report = {}
    namespace = {}
    exec("from kafka_txn import *", namespace)
    report["star"] = sorted(k for k in namespace if not k.startswith("__"))
    import kafka_txn
    report["all"] = kafka_txn.__all__
    report["loaded"] = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
    statements = {
        "DualWriter": "from kafka_txn import DualWriter",
        "AsyncDualWriter": "from kafka_txn import AsyncDualWriter",
        "aio": "from kafka_txn.aio import AsyncDualWriter",
        "AsyncTransactionalProducer": "from kafka_txn.aio import AsyncTransactionalProducer",
        "DualWriteTransaction": "from kafka_txn import DualWriteTransaction",
        "jdbc_to_sqlalchemy": "from kafka_txn import jdbc_to_sqlalchemy",
        "KafkaJdbcSink": "from kafka_txn import KafkaJdbcSink",
        "dualwrite": "from kafka_txn.dualwrite import DualWriter",
        "jdbc": "import kafka_txn.dualwrite.jdbc",
        "spark": "import kafka_txn.spark",
        "prometheus": "from kafka_txn.metrics import PrometheusMetrics; PrometheusMetrics()",
        "core": (
            "import kafka_txn.eos, kafka_txn.twophase.recovery, kafka_txn.state, kafka_txn.metrics"
        ),
    }
    for key, statement in statements.items():
        try:
            exec(statement, {})
        except ImportError as exc:
            report[key] = [type(exc).__name__, exc.name, str(exc)]
        else:
            report[key] = None
    print(json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def no_extras() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _NO_EXTRAS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


_OPTIONAL = (
    "AsyncDualWriter",
    "AsyncDualWriteTransaction",
    "DualWriter",
    "DualWriteTransaction",
    "jdbc_to_sqlalchemy",
    "KafkaJdbcSink",
)


def test_star_import_works_without_extras(no_extras):
    assert no_extras["loaded"] == []  # nothing of an extra was imported
    core = [name for name in kafka_txn.__all__ if name not in _OPTIONAL]
    assert no_extras["all"] == core
    assert set(core) - {"__version__"} <= set(no_extras["star"])
    assert not set(_OPTIONAL) & set(no_extras["star"])
    assert no_extras["core"] is None
    assert no_extras["AsyncTransactionalProducer"] is None  # asyncio needs no extra


@pytest.mark.parametrize(
    ("key", "extra", "package"),
    [
        ("DualWriter", "sql", "sqlalchemy"),
        ("AsyncDualWriter", "asyncio", "sqlalchemy"),
        ("aio", "asyncio", "sqlalchemy"),
        ("DualWriteTransaction", "sql", "sqlalchemy"),
        ("jdbc_to_sqlalchemy", "sql", "sqlalchemy"),
        ("dualwrite", "sql", "sqlalchemy"),
        ("jdbc", "sql", "sqlalchemy"),
        ("KafkaJdbcSink", "spark", "pyspark"),
        ("spark", "spark", "pyspark"),
    ],
)
def test_optional_import_failures_name_the_extra(no_extras, key, extra, package):
    kind, name, message = no_extras[key]
    assert kind == "ModuleNotFoundError"  # still caught by `except ModuleNotFoundError`
    assert name == package
    assert f"pip install 'kafka-txn[{extra}]'" in message
    assert message.count("pip install") == 1


def test_prometheus_metrics_name_their_extra(no_extras):
    kind, _, message = no_extras["prometheus"]
    assert kind == "ImportError"
    assert "pip install 'kafka-txn[prometheus]'" in message


def test_star_import_with_extras_has_the_real_classes():
    from kafka_txn import dualwrite, spark
    from kafka_txn.dualwrite import jdbc

    namespace: dict = {}
    exec("from kafka_txn import *", namespace)
    assert namespace["DualWriter"] is dualwrite.DualWriter
    assert namespace["DualWriteTransaction"] is dualwrite.DualWriteTransaction
    assert namespace["jdbc_to_sqlalchemy"] is jdbc.jdbc_to_sqlalchemy
    assert namespace["KafkaJdbcSink"] is spark.KafkaJdbcSink
    for name in kafka_txn.__all__:
        assert getattr(kafka_txn, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'DualWritr'"):
        kafka_txn.DualWritr  # noqa: B018


_SNIPPET = textwrap.dedent(
    """
    from collections.abc import Mapping
    from types import MappingProxyType
    from typing import Any

    from confluent_kafka import Message

    from kafka_txn import (
        DualWriter,
        KafkaJdbcSink,
        ProducerSettings,
        TransactionalProducer,
        jdbc_to_sqlalchemy,
    )
    from kafka_txn.eos import ExactlyOnceProcessor

    reveal_type(DualWriter)
    reveal_type(KafkaJdbcSink)
    reveal_type(jdbc_to_sqlalchemy)

    conf: Mapping[str, Any] = MappingProxyType({"bootstrap.servers": "b", "transactional.id": "t"})


    def process(record: Message) -> list[tuple[bytes, bytes]]:
        return []


    TransactionalProducer(conf, operation_timeout=3)
    DualWriter(conf, "jdbc:sqlite:x.db", operation_timeout=3, lock_timeout=5)
    ExactlyOnceProcessor(conf, conf, ["t"], process)
    KafkaJdbcSink(kafka=conf, options=conf)
    ProducerSettings(bootstrap_servers="b", transactional_id="t", extra=conf)
    TransactionalProducer(conf, operation_timout=3)  # line MISSPELLED_PRODUCER
    DualWriter(conf, "jdbc:sqlite:x.db", lock_timout=5)  # line MISSPELLED_WRITER
    ProducerSettings(bootstrap_server="b", transactional_id="t")  # line MISSPELLED_SETTINGS
    """
)


def test_mypy_sees_real_types_checked_keywords_and_mapping_configs(tmp_path):
    from mypy import api

    snippet = tmp_path / "snippet.py"
    snippet.write_text(_SNIPPET)
    lines = _SNIPPET.splitlines()

    def line_of(marker: str) -> int:
        return next(i for i, text in enumerate(lines, 1) if marker in text)

    stdout, stderr, _ = api.run(
        ["--strict", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", str(snippet)]
    )
    # Only the snippet's own lines: the package is type-checked by the lint job.
    mine = [line for line in stdout.splitlines() if line.startswith(str(snippet))]
    notes = [line for line in mine if ": note: Revealed type is" in line]
    errors = [line for line in mine if ": error:" in line]
    assert len(notes) == 3, stdout + stderr
    assert notes[0].endswith('-> kafka_txn.dualwrite.writer.DualWriter"'), notes[0]
    assert notes[1].endswith('-> kafka_txn.spark.sink.KafkaJdbcSink"'), notes[1]
    assert "def (url: str" in notes[2], notes[2]
    expected = {
        line_of("MISSPELLED_PRODUCER"): '"operation_timout" for "TransactionalProducer"',
        line_of("MISSPELLED_WRITER"): '"lock_timout" for "DualWriter"',
        line_of("MISSPELLED_SETTINGS"): '"bootstrap_server" for "ProducerSettings"',
    }
    assert len(errors) == len(expected), "\n".join(errors)
    for number, needle in expected.items():
        assert any(f"{snippet}:{number}: error: Unexpected keyword argument {needle}" in e
                   for e in errors), (number, errors)  # fmt: skip


_NO_DRIVERS = textwrap.dedent(
    """
    import json, sys

    class NoDrivers:  # [sql] installed, neither [postgres] nor [mysql]
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {"psycopg", "pymysql"}:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoDrivers())
    from kafka_txn import ConfigurationError, DualWriter

    report = {}
    for url in ("jdbc:postgresql://127.0.0.1:1/db", "jdbc:mysql://127.0.0.1:1/db",
                "jdbc:mariadb://127.0.0.1:1/db"):
        try:
            DualWriter({"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t"}, url)
        except ConfigurationError as exc:
            report[url] = str(exc)
    print(json.dumps(report))
    """
)


def test_a_missing_database_driver_names_its_extra():
    done = subprocess.run(
        [sys.executable, "-c", _NO_DRIVERS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "pip install 'kafka-txn[postgres]'" in report["jdbc:postgresql://127.0.0.1:1/db"]
    assert "pip install 'kafka-txn[mysql]'" in report["jdbc:mysql://127.0.0.1:1/db"]
    assert "pip install 'kafka-txn[mysql]'" in report["jdbc:mariadb://127.0.0.1:1/db"]
