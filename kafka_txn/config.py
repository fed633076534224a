"""Producer settings: a pydantic model, and the validation every librdkafka dict goes
through before a producer is built.

A transactional producer has a few settings that must hold for the guarantees of this
library to hold; breaking one is a ``ConfigurationError`` that names the key and the fix,
raised before anything connects. Properties librdkafka does not know are reported by
librdkafka itself when the producer is built, and translated to the same error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .errors import ConfigurationError

__all__ = ["ProducerSettings", "ValidatedConfig", "validate_config"]

DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
"""librdkafka's default transaction.timeout.ms."""

TWO_PHASE_COMMIT_KEY = "transaction.two.phase.commit.enable"
"""KIP-939's producer setting. kafka-txn reads it (librdkafka does not know it) and turns
on prepare_transaction(), init_transactions(keep_prepared_txn=True) and recovery."""

_CALLBACK_KEYS = ("on_delivery", "error_cb", "stats_cb")

# librdkafka reports a bad value under a property's canonical name; users often set the
# alias. Enough of them to point at the key the user actually wrote.
LIBRDKAFKA_ALIASES: dict[str, tuple[str, ...]] = {
    "queue.buffering.max.ms": ("linger.ms",),
    "message.send.max.retries": ("retries",),
    "request.required.acks": ("acks",),
    "compression.codec": ("compression.type",),
    "max.in.flight.requests.per.connection": ("max.in.flight",),
    "metadata.broker.list": ("bootstrap.servers",),
    "message.timeout.ms": ("delivery.timeout.ms",),
}


def user_key_for(canonical: str, config: Mapping[str, Any]) -> str:
    """The key in ``config`` that librdkafka's ``canonical`` property name refers to."""
    if canonical in config:
        return canonical
    for alias in LIBRDKAFKA_ALIASES.get(canonical, ()):
        if alias in config:
            return alias
    return canonical


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class ProducerSettings(BaseModel):
    """Typed producer settings. Field names are librdkafka's with ``_`` for ``.``; any
    other librdkafka property goes in ``extra`` under its librdkafka name."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    bootstrap_servers: str = Field(alias="bootstrap.servers", min_length=1)
    transactional_id: str = Field(alias="transactional.id", min_length=1, max_length=32767)
    transaction_timeout_ms: int = Field(
        DEFAULT_TRANSACTION_TIMEOUT_MS, alias="transaction.timeout.ms", ge=1000
    )
    two_phase_commit: bool = Field(False, alias="transaction.two.phase.commit.enable")
    """KIP-939's client setting: allow prepare_transaction() and recovery."""
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("extra")
    @classmethod
    def _extra_keys_are_strings(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not isinstance(key, str) or not key:
                raise ValueError(f"extra has a key {key!r} that is not a librdkafka name")
        return value

    def to_librdkafka(self) -> dict[str, Any]:
        """The librdkafka configuration dict these settings stand for."""
        conf = dict(self.extra)
        conf["bootstrap.servers"] = self.bootstrap_servers
        conf["transactional.id"] = self.transactional_id
        conf["transaction.timeout.ms"] = self.transaction_timeout_ms
        if self.two_phase_commit:
            conf[TWO_PHASE_COMMIT_KEY] = True
        return conf


@dataclass(frozen=True)
class ValidatedConfig:
    """A librdkafka dict that passed validation, with the user's callbacks split off
    (the producer chains them behind its own)."""

    librdkafka: dict[str, Any]
    transactional_id: str
    transaction_timeout_ms: int
    callbacks: Mapping[str, Callable[..., Any]]
    two_phase_commit: bool = False


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigurationError(f"{key}={value!r} is not a boolean: use true or false")


def validate_config(config: Mapping[str, Any] | ProducerSettings) -> ValidatedConfig:
    """Check a producer configuration and return it ready for confluent-kafka."""
    if isinstance(config, ProducerSettings):
        conf = config.to_librdkafka()
    elif isinstance(config, Mapping):
        conf = dict(config)
    else:
        raise ConfigurationError(
            f"config must be a dict of librdkafka properties or a ProducerSettings, "
            f"got {type(config).__name__}"
        )
    for key in conf:
        if not isinstance(key, str):
            raise ConfigurationError(f"config key {key!r} is not a string")

    txn_id = conf.get("transactional.id")
    if txn_id is None or (isinstance(txn_id, str) and not txn_id.strip()):
        raise ConfigurationError(
            "transactional.id is required: set it to a name that is stable across "
            "restarts of this producer (e.g. 'orders-writer-0'); it is what fences zombies"
        )
    if not isinstance(txn_id, str):
        raise ConfigurationError(f"transactional.id must be a string, got {txn_id!r}")
    if "bootstrap.servers" not in conf and "test.mock.num.brokers" not in conf:
        raise ConfigurationError(
            "bootstrap.servers is required: set it to 'host:port[,host:port...]'"
        )
    for key in ("enable.idempotence", "enable_idempotence"):
        if key in conf and not _as_bool(key, conf[key]):
            raise ConfigurationError(
                f"{key}=false cannot be used: transactions need the idempotent producer; "
                f"remove the key (kafka-txn turns idempotence on)"
            )
    if "delivery.report.only.error" in conf and _as_bool(
        "delivery.report.only.error", conf["delivery.report.only.error"]
    ):
        raise ConfigurationError(
            "delivery.report.only.error=true cannot be used: kafka-txn needs every "
            "delivery report to resolve send() futures and callbacks; remove the key"
        )
    timeout = conf.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
    try:
        timeout_ms = int(timeout)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"transaction.timeout.ms={timeout!r} is not a number of milliseconds"
        ) from None
    if timeout_ms < 1000:
        raise ConfigurationError(
            f"transaction.timeout.ms={timeout_ms} is too small: use at least 1000 ms, and "
            "more than your longest transaction"
        )

    callbacks: dict[str, Callable[..., Any]] = {}
    for key in _CALLBACK_KEYS:
        if key in conf:
            cb = conf.pop(key)
            if not callable(cb):
                raise ConfigurationError(f"{key} must be callable, got {type(cb).__name__}")
            callbacks[key] = cb
    two_phase = _as_bool(TWO_PHASE_COMMIT_KEY, conf.pop(TWO_PHASE_COMMIT_KEY, False))
    conf["enable.idempotence"] = True
    return ValidatedConfig(conf, txn_id, timeout_ms, callbacks, two_phase)
