"""Producer settings: a pydantic model, and the validation every librdkafka dict goes
through before a producer is built.

A transactional producer has a few settings that must hold for the guarantees of this
library to hold; breaking one is a ``ConfigurationError`` that names the key and the fix,
raised before anything connects. Properties librdkafka does not know are reported by
librdkafka itself when the producer is built, and translated to the same error.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kafka_txn.errors import ConfigurationError

__all__ = [
    "ERROR_REPORTS_ONLY_KEY",
    "ProducerSettings",
    "ValidatedConfig",
    "error_reports_by_default",
    "validate_config",
]

DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
"""librdkafka's default transaction.timeout.ms."""

TWO_PHASE_COMMIT_KEY = "transaction.two.phase.commit.enable"
"""KIP-939's producer setting. kafka-txn reads it (librdkafka does not know it) and turns
on prepare_transaction(), init_transactions(keep_prepared_txn=True) and recovery."""

ERROR_REPORTS_ONLY_KEY = "delivery.report.only.error"
"""librdkafka's setting for delivery reports of failed records only. confluent-kafka
applies it itself (its ``dr_msg_cb`` drops a success report in C, before it builds a
``Message``, and frees the record's callback state there), so a delivered record costs
no Python work at all; a ``TransactionalProducer`` with it set is *error-only*: every
failure is still classified and refuses the commit, but ``send()`` (whose futures need
the success reports) is refused."""

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


_KEYWORD_ARGUMENTS = {
    "operation_timeout": "operation_timeout",
    "queue_full_timeout": "queue_full_timeout",
    "prepare_min_time_left": "prepare_min_time_left",
    "key_serializer": "key_serializer",
    "value_serializer": "value_serializer",
    # confluent-kafka's SerializingProducer takes its serializers in the config dict.
    "key.serializer": "key_serializer",
    "value.serializer": "value_serializer",
    "metrics": "metrics",
    "tracing": "tracing",
    "sleep": "sleep",
}
"""Config keys that are TransactionalProducer keyword arguments, not librdkafka
properties (librdkafka would call them unknown), and the argument each one is."""

_OBJECT_KEYS = frozenset({"logger"})
"""confluent-kafka properties whose value is an object (a ``logging.Logger``)."""


def close_match(key: str, names: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The one of ``names`` that ``key`` most likely misspells, if any (difflib's
    similarity ratio at least ``cutoff``)."""
    close = difflib.get_close_matches(key, list(names), n=1, cutoff=cutoff)
    return close[0] if close else None


def _misspelt(required: str, conf: Mapping[str, Any]) -> str:
    """For a missing required key: the key of ``conf`` that looks like a misspelling of
    it, as a question to append to the error ("" if none)."""
    # 0.75: "transaction.timeout.ms" (0.68 to "transactional.id") is no misspelling.
    given = close_match(required, [key for key in conf if key != required], cutoff=0.75)
    return "" if given is None else f"; did you mean it instead of {given!r}?"


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class ProducerSettings(BaseModel):
    """Typed producer settings. Field names are librdkafka's with ``_`` for ``.`` (the
    librdkafka names are accepted too); any other librdkafka property goes in ``extra``
    under its librdkafka name. Bad input raises ``ConfigurationError`` naming the field
    and the fix, from the constructor and from ``model_validate``/``model_validate_json``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    # validation_alias, not alias: type checkers name __init__'s parameters after a
    # field's ``alias`` (PEP 681), and "bootstrap.servers" is no keyword argument.
    bootstrap_servers: str = Field(
        validation_alias="bootstrap.servers",
        serialization_alias="bootstrap.servers",
        min_length=1,
    )
    transactional_id: str = Field(
        validation_alias="transactional.id",
        serialization_alias="transactional.id",
        min_length=1,
        max_length=32767,
    )
    transaction_timeout_ms: int = Field(
        default=DEFAULT_TRANSACTION_TIMEOUT_MS,
        validation_alias="transaction.timeout.ms",
        serialization_alias="transaction.timeout.ms",
        ge=1000,
    )
    two_phase_commit: bool = Field(
        default=False,
        validation_alias=TWO_PHASE_COMMIT_KEY,
        serialization_alias=TWO_PHASE_COMMIT_KEY,
    )
    """KIP-939's client setting: allow prepare_transaction() and recovery."""
    extra: Mapping[str, Any] = Field(default_factory=dict)

    @field_validator("transactional_id", "bootstrap_servers")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        # validate_config refuses a blank id or servers too: settings that build must
        # validate.
        if not value.strip():
            raise ValueError("is blank")
        return value

    @field_validator("extra")
    @classmethod
    def _extra_keys_are_strings(cls, value: Mapping[str, Any]) -> Mapping[str, Any]:
        for key in value:
            if not isinstance(key, str) or not key:
                raise ValueError(f"extra has a key {key!r} that is not a librdkafka name")
        return value

    if not TYPE_CHECKING:  # type checkers keep the field-by-field __init__ (PEP 681)

        def __init__(self, /, **data: Any) -> None:
            try:
                super().__init__(**data)
            except ValidationError as exc:
                raise _settings_error(exc) from None

        @classmethod
        def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> ProducerSettings:
            """pydantic's ``model_validate``, raising ``ConfigurationError`` instead of
            pydantic's ``ValidationError``."""
            try:
                return super().model_validate(obj, *args, **kwargs)
            except ValidationError as exc:
                raise _settings_error(exc) from None

        @classmethod
        def model_validate_json(cls, data: Any, *args: Any, **kwargs: Any) -> ProducerSettings:
            """pydantic's ``model_validate_json``, raising ``ConfigurationError`` instead of
            pydantic's ``ValidationError``."""
            try:
                return super().model_validate_json(data, *args, **kwargs)
            except ValidationError as exc:
                raise _settings_error(exc) from None

        @classmethod
        def model_validate_strings(cls, obj: Any, *args: Any, **kwargs: Any) -> ProducerSettings:
            """pydantic's ``model_validate_strings``, raising ``ConfigurationError`` instead of
            pydantic's ``ValidationError``."""
            try:
                return super().model_validate_strings(obj, *args, **kwargs)
            except ValidationError as exc:
                raise _settings_error(exc) from None

    def to_librdkafka(self) -> dict[str, Any]:
        """The librdkafka configuration dict these settings stand for."""
        conf = dict(self.extra)
        conf["bootstrap.servers"] = self.bootstrap_servers
        conf["transactional.id"] = self.transactional_id
        conf["transaction.timeout.ms"] = self.transaction_timeout_ms
        if self.two_phase_commit:
            conf[TWO_PHASE_COMMIT_KEY] = True
        return conf


_SETTINGS_FIXES: dict[str, str] = {
    "bootstrap_servers": "set it to 'host:port[,host:port...]'",
    "transactional_id": (
        "set it to a name of 1 to 32767 characters that is stable across restarts of "
        "this producer (e.g. 'orders-writer-0'); it is what fences zombies"
    ),
    "transaction_timeout_ms": (
        "use a whole number of milliseconds, at least 1000, and more than your longest transaction"
    ),
    "two_phase_commit": "use True or False",
    "extra": (
        "pass the other librdkafka properties as a dict keyed by their librdkafka "
        "names, e.g. extra={'linger.ms': 5}"
    ),
}
"""What to do about a bad value of each ProducerSettings field."""

_SHOWN_VALUES = frozenset({"bootstrap_servers", "transaction_timeout_ms", "two_phase_commit"})
"""Fields whose bad value an error may repeat (never ``extra``: it may hold secrets)."""


def _field_of(key: object) -> str | None:
    """The ProducerSettings field that ``key`` (a field name or librdkafka name) names."""
    for name, info in ProducerSettings.model_fields.items():
        if key in (name, info.validation_alias):
            return name
    return None


def _describe_setting_error(error: Mapping[str, Any]) -> str:
    """One line about one pydantic error: the field, what is wrong, and the fix."""
    loc = tuple(error.get("loc", ()))
    kind = error.get("type", "")
    if not loc:
        return (
            "ProducerSettings takes keyword arguments, or a dict of them, not "
            f"{type(error.get('input')).__name__}"
        )
    if kind == "extra_forbidden":
        key = str(loc[0])
        close = close_match(key, [*ProducerSettings.model_fields, *_ALIASES])
        hint = (
            f"did you mean {close!r}?"
            if close is not None
            else f"a librdkafka property goes in extra={{{key!r}: ...}}"
        )
        return f"{key!r} is not a ProducerSettings field: {hint}"
    field = _field_of(loc[0])
    if field is None:  # pragma: no cover - every located error names a field
        return f"{loc[0]}: {error.get('msg', 'invalid')}"
    alias = ProducerSettings.model_fields[field].validation_alias
    where = f"{field} ({alias})" if alias else field
    if kind == "missing":
        return f"{where} is required: {_SETTINGS_FIXES[field]}"
    if field == "extra":
        what = f"{error.get('msg', 'invalid')} (at {'.'.join(map(str, loc[1:])) or 'extra'})"
        if kind == "value_error":
            what = str(error.get("ctx", {}).get("error", what))
        return f"extra: {what}: {_SETTINGS_FIXES[field]}"
    value = f"={error.get('input')!r}" if field in _SHOWN_VALUES else ""
    what = error.get("msg", "invalid")
    if kind == "value_error":  # our own validators: their words, not "Value error, ..."
        what = str(error.get("ctx", {}).get("error", what))
    return f"{where}{value}: {what}: {_SETTINGS_FIXES[field]}"


def _settings_error(exc: ValidationError) -> ConfigurationError:
    """pydantic's ValidationError as the one error type this library raises for bad
    settings, naming each bad field and its fix. pydantic runs ``model_validate`` through
    a custom ``__init__``, wrapping the ConfigurationError that raised in a
    ValidationError: that one is returned as it is, so it is never wrapped twice."""
    errors = exc.errors()
    for error in errors:
        inner = error.get("ctx", {}).get("error")
        if isinstance(inner, ConfigurationError):
            return inner
    lines = [_describe_setting_error(error) for error in errors]
    return ConfigurationError("bad ProducerSettings: " + "; ".join(lines))


_ALIASES = tuple(
    str(info.validation_alias)
    for info in ProducerSettings.model_fields.values()
    if info.validation_alias is not None
)


@dataclass(frozen=True)
class ValidatedConfig:
    """A librdkafka dict that passed validation, with the user's callbacks split off
    (the producer chains them behind its own)."""

    librdkafka: dict[str, Any]
    transactional_id: str
    transaction_timeout_ms: int
    callbacks: Mapping[str, Callable[..., Any]]
    two_phase_commit: bool = False
    error_reports_only: bool = False
    """``delivery.report.only.error`` is true: success reports never reach Python."""


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigurationError(f"{key}={value!r} is not a boolean: use true or false")


def _check_value_type(key: str, value: Any) -> None:
    """librdkafka properties are strings; confluent-kafka passes every other value as
    its ``str()``, so a list of servers would become "['a:9092']", which librdkafka
    tries to resolve until the first call times out. A number or boolean is fine (its
    str() is what librdkafka parses), and so is a callable or a ``logger``."""
    if isinstance(value, (str, int, float)) or callable(value) or key in _OBJECT_KEYS:
        return
    servers = key in ("bootstrap.servers", "metadata.broker.list")
    if servers and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        raise ConfigurationError(
            f"{key} must be one string, got a {type(value).__name__}: join the "
            f"addresses with commas, {key!r}: {','.join(value)!r}"
        )
    raise ConfigurationError(
        f"{key} is set to a {type(value).__name__}: librdkafka properties take a string, "
        "a number or a boolean; "
        + ("remove the key to use the default" if value is None else "give it as a string")
    )


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
            raise ConfigurationError(
                f"config key {key!r} is not a string: librdkafka properties are named by "
                "strings, e.g. 'linger.ms'"
            )
        if key in _KEYWORD_ARGUMENTS:
            argument = _KEYWORD_ARGUMENTS[key]
            raise ConfigurationError(
                f"{key!r} is not a librdkafka property but a keyword argument: pass "
                f"{argument}=... to TransactionalProducer (or DualWriter), not in the config"
            )

    txn_id = conf.get("transactional.id")
    if txn_id is None or (isinstance(txn_id, str) and not txn_id.strip()):
        raise ConfigurationError(
            "transactional.id is required: set it to a name that is stable across "
            "restarts of this producer (e.g. 'orders-writer-0'); it is what fences zombies"
            + _misspelt("transactional.id", conf)
        )
    if not isinstance(txn_id, str):
        raise ConfigurationError(
            f"transactional.id must be a string, got {txn_id!r}: set it to a name that is "
            "stable across restarts of this producer (e.g. 'orders-writer-0')"
        )
    servers = conf.get("bootstrap.servers")
    # An empty (or blank) list of servers is no list: librdkafka would accept it and
    # wait out init_transactions()'s whole timeout for a broker it was never told of.
    blank = servers is None or (isinstance(servers, str) and not servers.strip())
    if blank and ("bootstrap.servers" in conf or "test.mock.num.brokers" not in conf):
        raise ConfigurationError(
            "bootstrap.servers is required: set it to 'host:port[,host:port...]'"
            + ("" if "bootstrap.servers" in conf else _misspelt("bootstrap.servers", conf))
        )
    if servers is not None and not isinstance(servers, (str, list, tuple)):
        # A list or tuple is named by _check_value_type, with the joined string.
        raise ConfigurationError(
            f"bootstrap.servers must be a string 'host:port[,host:port...]', got "
            f"{servers!r} ({type(servers).__name__}): e.g. 'localhost:9092'"
        )
    for key in ("enable.idempotence", "enable_idempotence"):
        if key in conf and not _as_bool(key, conf[key]):
            raise ConfigurationError(
                f"{key}=false cannot be used: transactions need the idempotent producer; "
                f"remove the key (kafka-txn turns idempotence on)"
            )
    errors_only = ERROR_REPORTS_ONLY_KEY in conf and _as_bool(
        ERROR_REPORTS_ONLY_KEY, conf[ERROR_REPORTS_ONLY_KEY]
    )
    if ERROR_REPORTS_ONLY_KEY in conf:
        conf[ERROR_REPORTS_ONLY_KEY] = errors_only  # "true"/"1"/... as confluent-kafka reads
    timeout = conf.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
    try:
        timeout_ms = int(timeout)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(float("inf"))
        raise ConfigurationError(
            f"transaction.timeout.ms={timeout!r} is not a number of milliseconds: use a "
            "whole number, at least 1000, and more than your longest transaction"
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
                raise ConfigurationError(
                    f"{key} must be callable, got {type(cb).__name__}: pass a function, "
                    "or remove the key"
                )
            callbacks[key] = cb
    two_phase = _as_bool(TWO_PHASE_COMMIT_KEY, conf.pop(TWO_PHASE_COMMIT_KEY, False))
    for key, value in conf.items():
        _check_value_type(key, value)
    conf["enable.idempotence"] = True
    return ValidatedConfig(conf, txn_id, timeout_ms, callbacks, two_phase, errors_only)


def error_reports_by_default(conf: dict[str, Any], *, counted: bool) -> dict[str, Any]:
    """``conf`` for a producer that never hands out ``send()`` futures of its own
    (``DualWriter``, ``ExactlyOnceProcessor``, the Spark sink's writers): error-only
    (``delivery.report.only.error`` true) unless the user set the key, either way, gave
    an ``on_delivery`` callback (which would otherwise stop hearing of deliveries), or
    ``counted`` (tracing, or a metrics hook counting each transaction's delivered
    records, which needs every success report)."""
    if ERROR_REPORTS_ONLY_KEY not in conf and "on_delivery" not in conf and not counted:
        conf[ERROR_REPORTS_ONLY_KEY] = True
    return conf
