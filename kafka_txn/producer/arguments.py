"""The checks every public call makes on its arguments before anything changes: one
function per kind of argument, used by ``TransactionalProducer``, ``DualWriter`` and
``ExactlyOnceProcessor``.

A wrong type raises ``TypeError``, a value of the right type out of range ``ValueError``;
either message names the call, the argument, what is accepted and what was given, e.g.
``commit_transaction(timeout=...) must be a number of seconds > 0 or None, got '5' (str)``.
A number is an ``int`` or a ``float`` (any ``numbers.Real``), never a ``bool``, and
finite. Nothing is changed by a call whose arguments are refused: the checks run before
the state is read.

Topic names follow Kafka's own rule (``org.apache.kafka.common.internals.Topic.validate``):
1 to 249 characters of ``a-z A-Z 0-9 . _ -``, and neither ``.`` nor ``..``.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any, TypeVar

from confluent_kafka import TopicPartition

from kafka_txn.state import PreparedTxnState

__all__ = [
    "batch",
    "callback",
    "count",
    "flag",
    "group_metadata",
    "hook",
    "offsets",
    "optional_text",
    "partition",
    "prepared_state",
    "timeout",
    "topic",
    "topic_pattern",
    "topic_problem",
    "wait",
]

_T = TypeVar("_T")

MAX_TOPIC_LENGTH = 249
"""Kafka's limit on a topic name's length (``Topic.MAX_NAME_LENGTH``)."""

_TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]+")


def _shown(value: object) -> str:
    """``value`` as a message repeats it: its repr (cut short) and its type."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _refuse(call: str, name: str, accepted: str, value: object, *, wrong_type: bool) -> Exception:
    message = f"{call}({name}=...) must be {accepted}, got {_shown(value)}"
    return TypeError(message) if wrong_type else ValueError(message)


def _number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def timeout(value: float | None, call: str, name: str = "timeout") -> float | None:
    """A deadline in seconds: a finite number > 0, or None (the call's default)."""
    if value is None:
        return None
    accepted = "a number of seconds > 0 or None"
    if not _number(value):
        raise _refuse(call, name, accepted, value, wrong_type=True)
    if not (math.isfinite(value) and value > 0):
        raise _refuse(call, name, accepted, value, wrong_type=False)
    return float(value)


def wait(
    value: float | None, call: str, name: str = "timeout", *, none: str | None = None
) -> float | None:
    """How long a call may wait, in seconds: a finite number >= 0 (0: do not wait);
    None only where ``none`` says what it means there."""
    if value is None and none is not None:
        return None
    accepted = "a number of seconds >= 0" + (f" or None ({none})" if none is not None else "")
    if not _number(value):
        raise _refuse(call, name, accepted, value, wrong_type=True)
    assert value is not None
    if not (math.isfinite(value) and value >= 0):
        raise _refuse(call, name, accepted, value, wrong_type=False)
    return float(value)


def count(
    value: int | None, call: str, name: str, *, minimum: int = 1, none: str | None = None
) -> int | None:
    """A whole number >= ``minimum``; None only where ``none`` says what it means."""
    if value is None and none is not None:
        return None
    accepted = f"a whole number >= {minimum}" + (f" or None ({none})" if none is not None else "")
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise _refuse(call, name, accepted, value, wrong_type=True)
    if value < minimum:
        raise _refuse(call, name, accepted, value, wrong_type=False)
    return int(value)


def batch(values: Iterable[Any], keys: Iterable[Any] | None, call: str) -> Iterator[Any]:
    """The records of a batch: an iterator of its values, or of ``(value, key)`` pairs
    when ``keys`` is given. Either is any iterable but a single record's bytes or str
    (which would be sent a byte or a character at a time) or a mapping (whose keys alone
    it would iterate); two sized iterables of different lengths are refused here, before
    anything is queued, and two others when the shorter one ends (``zip(strict=True)``)."""
    for name, given in (("values", values), ("keys", keys)):
        if given is None and name == "keys":
            continue
        if isinstance(given, (str, bytes, bytearray, memoryview)):
            raise TypeError(
                f"{call}({name}=...) must be an iterable of record {name} (a list...), got "
                f"{_shown(given)}: to send one record, call produce()"
            )
        if isinstance(given, Mapping):
            raise TypeError(
                f"{call}({name}=...) must be an iterable of record {name}, got a mapping "
                f"{_shown(given)}: pass values=d.values(), keys=d.keys()"
            )
        if not isinstance(given, Iterable):
            raise _refuse(call, name, f"an iterable of record {name}", given, wrong_type=True)
    if keys is None:
        return iter(values)
    if isinstance(values, Sized) and isinstance(keys, Sized) and len(values) != len(keys):
        raise ValueError(
            f"{call}() got {len(values)} values and {len(keys)} keys: pass one key per "
            "value (None for a record without a key)"
        )
    return zip(values, keys, strict=True)


def partition(value: int, call: str) -> int:
    """A partition number >= 0, or -1 (the partitioner chooses)."""
    accepted = "a partition number >= 0, or -1 (the partitioner chooses)"
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise _refuse(call, "partition", accepted, value, wrong_type=True)
    if value < -1:
        raise _refuse(call, "partition", accepted, value, wrong_type=False)
    return int(value)


def flag(value: bool, call: str, name: str) -> bool:
    """True or False, nothing else (not 0, 1 or "false")."""
    if not isinstance(value, bool):
        raise _refuse(call, name, "True or False", value, wrong_type=True)
    return value


def optional_text(value: str | None, call: str, name: str, *, secret: bool = False) -> str | None:
    """A str, or None. A ``secret`` (a password) refused is shown by its type alone,
    never its value."""
    if value is not None and not isinstance(value, str):
        if secret:
            raise TypeError(
                f"{call}({name}=...) must be a str or None, "
                f"got a value of type {type(value).__name__}"
            )
        raise _refuse(call, name, "a str or None", value, wrong_type=True)
    return value


def callback(value: _T | None, call: str, name: str, *, none: bool = True) -> _T | None:
    """A callable, or (where ``none``) None."""
    if (value is not None or not none) and not callable(value):
        accepted = "a callable or None" if none else "a callable"
        raise _refuse(call, name, accepted, value, wrong_type=True)
    return value


def hook(value: _T | None, call: str, name: str, methods: tuple[str, ...]) -> _T | None:
    """An object with the callable ``methods`` (a ``MetricsHook``...), or None."""
    if value is not None and not all(callable(getattr(value, m, None)) for m in methods):
        wanted = " and ".join(f"{m}()" for m in methods)
        raise _refuse(call, name, f"an object with {wanted}, or None", value, wrong_type=True)
    return value


def offsets(value: Sequence[TopicPartition], call: str) -> list[TopicPartition]:
    """A list or tuple of ``TopicPartition``s, each with a valid topic name, a partition
    >= 0 and an offset >= 0 (the next offset to consume, as ``Consumer.position()``
    gives it)."""
    accepted = "a list of TopicPartition(topic, partition, next offset to consume)"
    if not isinstance(value, (list, tuple)):
        raise _refuse(call, "offsets", accepted, value, wrong_type=True)
    for item in value:
        if not isinstance(item, TopicPartition):
            raise TypeError(f"{call}(offsets=...) must be {accepted}, got an item {_shown(item)}")
        if item.partition < 0 or item.offset < 0 or topic_problem(item.topic) is not None:
            raise ValueError(
                f"{call}(offsets=...) must be {accepted} with a valid topic name, a "
                f"partition >= 0 and an offset >= 0, got an item {_shown(item)}"
            )
    return list(value)


def prepared_state(
    value: PreparedTxnState | str, call: str, name: str = "state"
) -> PreparedTxnState | str:
    """A ``PreparedTxnState`` or its stored string form (parsed by the call)."""
    if not isinstance(value, (PreparedTxnState, str)):
        raise _refuse(
            call, name, "a PreparedTxnState or the str a database stored", value, wrong_type=True
        )
    return value


def topic_problem(topic: object) -> str | None:
    """What makes ``topic`` no valid Kafka topic name, or None if it is one."""
    if not isinstance(topic, str):
        return f"a topic name is a str, not {type(topic).__name__}"
    if not 1 <= len(topic) <= MAX_TOPIC_LENGTH:
        return f"a topic name has 1 to {MAX_TOPIC_LENGTH} characters, this one {len(topic)}"
    if topic in (".", ".."):
        return "a topic name cannot be '.' or '..'"
    if _TOPIC_CHARS.fullmatch(topic) is None:
        return "a topic name has only the characters a-z, A-Z, 0-9, '.', '_' and '-'"
    return None


def topic(value: str, call: str, name: str = "topic") -> str:
    """A valid Kafka topic name (``topic_problem``)."""
    problem = topic_problem(value)
    if problem is not None:
        raise _refuse(call, name, f"a valid Kafka topic name ({problem})", value,
                      wrong_type=not isinstance(value, str))  # fmt: skip
    return value


def topic_pattern(value: str, call: str, name: str = "topics") -> str:
    """A regex subscription, ``^`` and a pattern (librdkafka's form): it must compile as
    a regular expression (Python's ``re`` is the check), since librdkafka would refuse
    it only when the consumer subscribes ("Failed to set subscription")."""
    try:
        re.compile(value)
    except re.error as exc:
        raise _refuse(call, name, f"a valid '^' regular expression ({exc})", value,
                      wrong_type=False) from None  # fmt: skip
    return value


def group_metadata(value: object, call: str) -> object:
    """What ``Consumer.consumer_group_metadata()`` returned (confluent-kafka serializes
    librdkafka's group metadata to ``bytes``)."""
    if not isinstance(value, bytes) or not value:
        raise _refuse(
            call, "group_metadata", "what consumer.consumer_group_metadata() returned", value,
            wrong_type=not isinstance(value, bytes),
        )  # fmt: skip
    return value
