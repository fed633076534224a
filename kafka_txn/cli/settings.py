"""The settings a ``kafka-txn`` command connects with: the librdkafka settings of ``-X``,
``--bootstrap-servers`` and ``--transactional-id``, checked before anything connects (a
bad one exits with 2); the coordinator client's settings, bounded by ``--timeout``; and
the database password of ``recover``, from an option, a named environment variable, the
terminal, or ``KAFKA_TXN_DB_PASSWORD``.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import logging
import os
import sys
from typing import Any

from kafka_txn.cli.exits import UsageError
from kafka_txn.cli.terminal import Deadline
from kafka_txn.config import validate_config
from kafka_txn.coordinator import ConnectionSettings
from kafka_txn.errors import ConfigurationError

__all__ = ["PASSWORD_ENV", "coordinator_settings", "database_password", "kafka_settings"]

PASSWORD_ENV = "KAFKA_TXN_DB_PASSWORD"
"""Read for the database password when no --password option is given."""

_PYTHON_OBJECT_KEYS = ("error_cb", "throttle_cb", "stats_cb", "oauth_cb", "on_delivery", "logger")
"""confluent-kafka settings whose value is a Python object (a function; a Logger): a
command line only has strings."""

_PROBE_LOG = logging.Logger("kafka_txn.cli.settings_probe", logging.CRITICAL + 1)
"""Where the settings probe's librdkafka log lines go: nowhere. A Logger outside the
logging tree, above every level (``debug`` raises librdkafka's log_level to 7, so
log_level alone does not silence it)."""
_PROBE_LOG.disabled = True


def kafka_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The librdkafka settings of ``-X``, ``--bootstrap-servers`` and
    ``--transactional-id``, checked the same way for every command before anything
    connects: key=value syntax, no Python-object settings (callbacks, a logger), what the
    coordinator client supports, what a transactional producer requires
    (``validate_config``), and what librdkafka accepts for one (``acks``, ``retries``,
    ``max.in.flight``, ``message.timeout.ms`` against ``transaction.timeout.ms``...): a
    throwaway transactional producer without brokers, which connects nowhere and logs
    nowhere. Any failure is a UsageError (exit 2)."""
    from confluent_kafka import KafkaException, Producer  # noqa: PLC0415

    conf: dict[str, Any] = {}
    for item in args.X or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"-X {item!r} is not key=value")
        if key in _PYTHON_OBJECT_KEYS:
            what = "a logging.Logger" if key == "logger" else "a Python function"
            raise UsageError(
                f"-X {key}: confluent-kafka takes {what} there, which cannot come from a "
                "command line; leave it out"
            )
        conf[key] = value
    conf["bootstrap.servers"] = args.bootstrap_servers
    conf["transactional.id"] = args.transactional_id
    try:
        ConnectionSettings.from_librdkafka(conf)
        validated = validate_config(conf)  # what a transactional producer requires
        probe_conf = {k: v for k, v in validated.librdkafka.items() if k != "bootstrap.servers"}
        probe = Producer({**probe_conf, "logger": _PROBE_LOG})
        del probe
    except ConfigurationError as exc:
        raise UsageError(f"-X: {exc.message}") from exc
    except KafkaException as exc:
        reason = exc.args[0].str().removeprefix("Failed to create producer: ")
        raise UsageError(
            f"-X: librdkafka refuses these settings for a transactional producer: {reason}"
        ) from exc
    except (TypeError, ValueError) as exc:  # confluent-kafka's own checks of a value
        raise UsageError(f"-X: confluent-kafka refuses these settings: {exc}") from exc
    if not args.verbose:
        conf.setdefault("log_level", 0)  # and kafka_txn.librdkafka is quiet anyway
    return conf


def coordinator_settings(conf: dict[str, Any], deadline: Deadline) -> ConnectionSettings:
    """The coordinator client's settings, each connection attempt and request bounded by
    what is left of ``--timeout`` (the client's own per-socket default is 10 s)."""
    settings = ConnectionSettings.from_librdkafka(conf)
    return dataclasses.replace(settings, timeout_s=min(settings.timeout_s, deadline.left()))


def database_password(args: argparse.Namespace) -> str | None:
    """--password, --password-env NAME, --password-prompt, else $KAFKA_TXN_DB_PASSWORD,
    else None (the URL's own password= or none)."""
    if args.password is not None:
        return str(args.password)
    if args.password_env is not None:
        value = os.environ.get(args.password_env)
        if value is None:
            raise UsageError(f"--password-env {args.password_env}: that variable is not set")
        return value
    if args.password_prompt:
        if not sys.stdin.isatty():
            raise UsageError("--password-prompt needs a terminal: use --password-env NAME")
        return getpass.getpass(f"password for {args.user or 'the database user'}: ")
    return os.environ.get(PASSWORD_ENV)
