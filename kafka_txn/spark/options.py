"""The Spark sink's settings: Spark-style option names, case-insensitive as Spark's own
(``dbTable`` is ``dbtable``), merged under the keyword arguments. Every option is either
honoured or refused by name; none is silently ignored."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import Engine

from kafka_txn.config import TWO_PHASE_COMMIT_KEY, validate_config
from kafka_txn.coordinator.security import check_security_keys
from kafka_txn.dualwrite.engine import database_url, validate_seconds
from kafka_txn.dualwrite.jdbc.urls import redact_jdbc_url, redact_settings
from kafka_txn.errors import ConfigurationError
from kafka_txn.producer.handle import probe_settings

StepHook = Callable[[str, int, int, int], None]
"""``hook(step, batch_id, partition, attempt)``, called after each DualWriter step in the
executor (fault injection, tracing). Must be picklable: a module-level function or an
instance of a module-level class."""

# Option name (lower case) -> the keyword argument it sets.
_NAMES: Final = {
    "transactionalidprefix": "transactional_id_prefix",
    "url": "url",
    "dbtable": "dbtable",
    "topic": "topic",
    "user": "user",
    "password": "password",
    "batchsize": "insert_batch_size",
    "isolationlevel": "isolation_level",
    "commitstable": "commits_table",
    "statetable": "state_table",
    "onstep": "on_step",
    "startover": "start_over",
    "locktimeout": "lock_timeout",
}

# Spark's JDBC data source options that mean nothing for an exactly-once append, each
# with the reason it is refused (https://spark.apache.org/docs/latest/sql-data-sources-jdbc.html).
_REFUSED: Final = {
    "driver": "the driver class follows from the URL here (SQLAlchemy dialects)",
    "truncate": "the sink only appends; truncating would break exactly-once replays",
    "cascadetruncate": "the sink only appends",
    "createtableoptions": "the sink creates the table from the schema as is",
    "createtablecolumntypes": "the sink maps column types itself (see docs/guide/spark.md)",
    "numpartitions": "repartition the DataFrame instead: one transaction per partition",
    "querytimeout": "lock waits are bounded by lockTimeout (seconds); other statements by "
    "the database's own settings",
    "sessioninitstatement": "the sink's connections are pooled and reused across batches",
    "query": "the sink writes to a table: use dbtable",
    "customschema": "a read option",
    "fetchsize": "a read option",
    "partitioncolumn": "a read option",
    "lowerbound": "a read option",
    "upperbound": "a read option",
    "preparequery": "a read option",
    "pushdownpredicate": "a read option",
    "pushdownaggregate": "a read option",
    "pushdownlimit": "a read option",
    "pushdownoffset": "a read option",
    "pushdowntablesample": "a read option",
    "prefertimestampntz": "a read option",
    "keytab": "Kerberos is not supported by the SQLAlchemy drivers used here",
    "principal": "Kerberos is not supported by the SQLAlchemy drivers used here",
    "refreshkrb5config": "Kerberos is not supported by the SQLAlchemy drivers used here",
    "connectionprovider": "connections are made by SQLAlchemy from the URL",
    "kafka.transactional.id": "the sink sets one id per partition from transactionalIdPrefix",
    "kafka.transaction.two.phase.commit.enable": "the sink always uses two-phase commit",
}

# Spark's isolationLevel names -> SQLAlchemy's. NONE and READ_UNCOMMITTED are refused: the
# sink reads its commit markers to decide whether a partition was written, and a dirty
# read of another attempt's uncommitted marker would skip rows that then roll back.
_ISOLATION: Final = {
    "READ_COMMITTED": "READ COMMITTED",
    "REPEATABLE_READ": "REPEATABLE READ",
    "SERIALIZABLE": "SERIALIZABLE",
}
_SQLITE_ISOLATION: Final = ("SERIALIZABLE",)


@dataclass(frozen=True, repr=False)
class SinkOptions:
    """The sink's settings, validated (the URL's parameters and the Kafka settings too:
    on the driver, before a task runs)."""

    transactional_id_prefix: str
    url: str
    dbtable: str
    topic: str | None
    kafka: dict[str, Any]
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    insert_batch_size: int = 1000
    isolation_level: str | None = None
    commits_table: str = "kafka_txn_sink_commits"
    state_table: str = "kafka_transaction_state"
    on_step: StepHook | None = None
    start_over: bool = False
    lock_timeout: float | None = 30.0

    def __repr__(self) -> str:
        # No secret in a repr: the URL through redact_jdbc_url, Kafka's password-like
        # settings (sasl.password, ...) masked, the database password shown as ***.
        shown = {
            name: redact_jdbc_url(value) if name == "url"
            else redact_settings(value) if name == "kafka"
            else "***" if name == "password" and value is not None
            else value
            for name, value in vars(self).items()
        }  # fmt: skip
        return f"SinkOptions({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @classmethod
    def build(cls, keywords: Mapping[str, Any], options: Mapping[str, Any] | None) -> SinkOptions:
        """Merge Spark-style ``options`` under ``keywords`` (non-None keywords win)."""
        kafka: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        seen: dict[str, str] = {}
        for key, value in (options or {}).items():
            if not isinstance(key, str):
                raise ConfigurationError(f"option names are strings, not {key!r}")
            lower = key.lower()
            if lower in seen:
                raise ConfigurationError(
                    f"options {seen[lower]!r} and {key!r} are the same option (names are "
                    "case-insensitive, as in Spark): keep one"
                )
            seen[lower] = key
            if lower in _REFUSED:
                raise ConfigurationError(
                    f"option {key!r} is not supported by the sink: {_REFUSED[lower]}"
                )
            if lower.startswith("kafka."):
                kafka[lower[len("kafka.") :]] = value  # librdkafka names are lower case
            elif lower in _NAMES:
                merged[_NAMES[lower]] = value
            else:
                raise ConfigurationError(
                    f"unknown option {key!r}: the sink takes kafka.* (librdkafka settings), "
                    f"{', '.join(sorted(_spark_spelling()))}"
                )
        kafka_keywords = keywords.get("kafka") or {}
        kafka.update(kafka_keywords)
        for key in ("transactional.id", "transaction.two.phase.commit.enable"):
            if key in kafka:
                raise ConfigurationError(
                    f"{key} is set by the sink (one id per partition from "
                    "transactional_id_prefix): remove it from the Kafka settings"
                )
        if "bootstrap.servers" not in kafka:
            raise ConfigurationError(
                "Kafka bootstrap servers missing: pass kafka={'bootstrap.servers': ...} "
                "or the option kafka.bootstrap.servers"
            )
        for name, value in keywords.items():
            if name != "kafka" and value is not None:
                merged[name] = value
        return cls._validated(kafka, merged)

    @classmethod
    def _validated(cls, kafka: dict[str, Any], given: dict[str, Any]) -> SinkOptions:
        prefix = given.get("transactional_id_prefix")
        if not isinstance(prefix, str) or not prefix or len(prefix) > 200:
            raise ConfigurationError(
                "transactional_id_prefix (option transactionalIdPrefix) must be 1..200 "
                "characters and stable across restarts of the query: it names each "
                "partition's transactional id"
            )
        _check_kafka(kafka, prefix)
        url, dbtable = given.get("url"), given.get("dbtable")
        if not url or not dbtable:
            raise ConfigurationError("the sink needs url= (a JDBC URL) and dbtable=")
        # Parsed now, on the driver: an unsupported or malformed parameter fails here,
        # not inside every task. Each executor parses the same URL again.
        database_url(str(url), given.get("user"), given.get("password"))
        url = _shared_sqlite(str(url))
        size = _integer(given.get("insert_batch_size", 1000), "insert_batch_size (batchsize)")
        if size < 1:
            raise ConfigurationError(f"insert_batch_size (batchsize) must be >= 1, not {size}")
        return cls(
            transactional_id_prefix=prefix,
            url=str(url),
            dbtable=str(dbtable),
            topic=given.get("topic"),
            kafka=kafka,
            user=given.get("user"),
            password=given.get("password"),
            insert_batch_size=size,
            isolation_level=_isolation(given.get("isolation_level")),
            commits_table=given.get("commits_table", cls.commits_table),
            state_table=given.get("state_table", cls.state_table),
            on_step=_hook(given.get("on_step")),
            start_over=_flag(given.get("start_over", False), "start_over (startOver)"),
            lock_timeout=_seconds(given.get("lock_timeout", cls.lock_timeout)),
        )


def _check_kafka(kafka: Mapping[str, Any], prefix: str) -> None:
    """The Kafka settings checked on the driver as each task's DualWriter checks them
    (``TransactionalProducer``: ``validate_config``, librdkafka's own checks when the
    producer is built, then, two-phase commit being on, the coordinator client's
    ``check_security_keys``): a setting a task would refuse (``acks=1``, a value out of
    range, ``ssl.keystore.location``, ``sasl.kerberos.*``...) fails when the sink is
    built, not in every task. The files the settings name (``ssl.ca.location``...) are
    left to the executors, where they may be the only copies: librdkafka's checks run
    without them."""
    conf = {**kafka, "transactional.id": f"{prefix}-0", TWO_PHASE_COMMIT_KEY: True}
    librdkafka = validate_config(conf).librdkafka
    check_security_keys(librdkafka)
    # librdkafka's refusals (acks other than all, max.in.flight above 5, a value out of
    # range) come when a producer is built; the probe builds one without connecting, and
    # without the settings that name files (librdkafka opens them right then).
    probe_settings({k: v for k, v in librdkafka.items() if not _names_a_file(k)})


def _names_a_file(key: str) -> bool:
    return key.endswith((".location", ".keytab", "plugin.library.paths"))


def with_isolation(engine: Engine, level: str | None) -> Engine:
    """``engine`` running its transactions at ``level`` (None: the database's default)."""
    if level is None:
        return engine
    if engine.dialect.name == "sqlite" and level not in _SQLITE_ISOLATION:
        raise ConfigurationError(
            f"isolationLevel {level.replace(' ', '_')} is not available on SQLite, whose "
            "transactions are SERIALIZABLE: drop the option or set SERIALIZABLE"
        )
    return engine.execution_options(isolation_level=level)


def _spark_spelling() -> set[str]:
    return {"transactionalIdPrefix", "url", "dbtable", "topic", "user", "password",
            "batchsize", "isolationLevel", "commitsTable", "stateTable", "onStep",
            "startOver", "lockTimeout"}  # fmt: skip


def _shared_sqlite(given: str) -> str:
    """``given``, with a relative SQLite path made absolute against the driver's working
    directory. The batch's tasks run in other processes (Spark's Python workers,
    executors elsewhere): an in-memory database would be a different, empty one in each
    of them, so it is refused; a relative path would name a file relative to each
    worker's directory."""
    parsed = database_url(given, None, None)
    if parsed.get_backend_name() != "sqlite":
        return given
    path = parsed.database or ""
    if path in ("", ":memory:") or path.startswith("file:"):
        raise ConfigurationError(
            f"url {redact_jdbc_url(given)!r}: the sink cannot write to an in-memory "
            "SQLite database (each Spark task runs in a process of its own, which would "
            "see an empty database of its own): name a file every task can reach, "
            "jdbc:sqlite:/abs/path.db"
        )
    if os.path.isabs(path):
        return given
    absolute = os.path.abspath(path)
    if given.startswith("jdbc:"):
        return f"jdbc:sqlite:{absolute}"
    return parsed.set(database=absolute).render_as_string(hide_password=False)


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be an integer, not {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise ConfigurationError(f"{what} must be an integer, not {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigurationError(f"{what} must be an integer, not {value!r}") from None


def _seconds(value: Any) -> float | None:
    """Seconds from a keyword or a Spark option string (``"none"``: unbounded)."""
    if isinstance(value, str):
        text = value.strip().lower()
        with contextlib.suppress(ValueError):  # not a number: refused below, by its text
            value = None if text == "none" else float(text)
    return validate_seconds(value, "lock_timeout (lockTimeout)")


def _flag(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigurationError(f"{what} must be true or false, not {value!r}")


def _isolation(value: Any) -> str | None:
    if value is None:
        return None
    name = str(value).upper().replace(" ", "_")
    if name in _ISOLATION:
        return _ISOLATION[name]
    if name in ("NONE", "READ_UNCOMMITTED"):
        raise ConfigurationError(
            f"isolationLevel {name} is refused: the sink decides whether a partition was "
            "already written from its commit markers, which must not be read dirty; use "
            "READ_COMMITTED (or leave the database default)"
        )
    raise ConfigurationError(
        f"isolationLevel {value!r} is not one of READ_COMMITTED, REPEATABLE_READ, SERIALIZABLE"
    )


def _hook(value: Any) -> StepHook | None:
    """A callable, or ``"module:attribute"`` naming one (options are strings in Spark)."""
    if value is None or callable(value):
        return value  # type: ignore[no-any-return]
    if isinstance(value, str) and ":" in value:
        module, _, attribute = value.partition(":")
        try:
            found = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as exc:
            raise ConfigurationError(f"onStep {value!r} cannot be imported: {exc}") from exc
        if callable(found):
            return found  # type: ignore[no-any-return]
    raise ConfigurationError(
        f"onStep must be a callable or 'module:attribute' naming one, not {value!r}"
    )
