"""``PreparedTxnState``: the identity of one prepared Kafka transaction, as a value that any
database column can hold (KIP-939).

Serialized form (version 1), human-readable, one ``key=value`` per field, values
percent-encoded so that every transactional id round-trips::

    kafka-txn:1;tid=orders-writer-0;pid=4001;epoch=7;start=1732212345678;cluster=Hx2...;timeout=60000

- ``""`` is "no transaction" (KIP-939), and the Java client's ``"pid:epoch"`` form parses.
- ``start`` is the transaction start time the coordinator reported (DescribeTransactions).
  librdkafka keeps one producer id and epoch for every transaction of a session, so
  pid/epoch alone cannot tell transaction N from N+1; the start time can.
- Downgrade-safe in the spirit of KIP-915: a reader ignores keys it does not know, and a
  newer writer of format 1 only adds optional keys. A new major format would change the
  ``kafka-txn:1`` prefix, which older readers refuse with a clear error.
- ``done=1`` marks a state whose transaction was settled, so that recovery from it is a
  no-op (see ``TransactionalProducer.complete_transaction``).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar
from urllib.parse import quote, unquote

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kafka_txn.errors import InvalidPreparedStateError

__all__ = ["MAX_SERIALIZED_LENGTH", "PreparedTxnState"]

MAX_SERIALIZED_LENGTH = 4096
"""Longest serialized state accepted, in characters: fits any VARCHAR(4096) column."""

_PREFIX = "kafka-txn:"
_FORMAT = 1
_JAVA_FORM = re.compile(r"(-?\d{1,19}):(-?\d{1,5})")
_INT_KEYS = {"pid": "producer_id", "epoch": "producer_epoch", "start": "txn_start_ms",
             "timeout": "timeout_ms"}  # fmt: skip
_STR_KEYS = {"tid": "transactional_id", "cluster": "cluster_id"}
_MAX_INT64 = (1 << 63) - 1


class PreparedTxnState(BaseModel):
    """One prepared transaction: ``str(state)`` serializes it, ``PreparedTxnState(text)``
    or ``PreparedTxnState.parse(text)`` reads it back. Immutable; equality is field-wise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    transactional_id: str | None = Field(None, min_length=1)
    producer_id: int | None = Field(None, ge=0, le=_MAX_INT64)
    producer_epoch: int | None = Field(None, ge=0, le=32767)
    txn_start_ms: int | None = Field(None, ge=0, le=_MAX_INT64)
    """Coordinator's transaction start time (ms since the epoch); None if unknown."""
    cluster_id: str | None = Field(None, min_length=1)
    timeout_ms: int | None = Field(None, ge=0, le=(1 << 31) - 1)
    completed: bool = False

    EMPTY: ClassVar[PreparedTxnState]

    def __init__(self, serialized: str | None = None, /, **data: Any) -> None:
        if serialized is not None:
            if data:
                raise TypeError("pass either a serialized state or fields, not both")
            data = _parse(serialized)
        super().__init__(**data)

    @model_validator(mode="after")
    def _consistent(self) -> PreparedTxnState:
        if (self.producer_id is None) != (self.producer_epoch is None):
            raise ValueError("producer_id and producer_epoch go together")
        if self.producer_id is None and (
            self.transactional_id or self.txn_start_ms is not None or self.completed
        ):
            raise ValueError("a state without producer_id must be empty")
        return self

    @classmethod
    def parse(cls, serialized: str) -> PreparedTxnState:
        """Read a serialized state; raises ``InvalidPreparedStateError`` saying what is
        wrong with it."""
        return cls(serialized)

    @property
    def is_empty(self) -> bool:
        """True for "no transaction" (serialized as the empty string)."""
        return self.producer_id is None

    def mark_completed(self) -> PreparedTxnState:
        """This state with its transaction marked settled: recovery from it does nothing."""
        if self.is_empty:
            return self
        return self.model_copy(update={"completed": True})

    def __str__(self) -> str:
        if self.producer_id is None:
            return ""
        parts = [f"{_PREFIX}{_FORMAT}"]
        if self.transactional_id is not None:
            parts.append(f"tid={quote(self.transactional_id, safe='')}")
        parts.append(f"pid={self.producer_id}")
        parts.append(f"epoch={self.producer_epoch}")
        if self.txn_start_ms is not None:
            parts.append(f"start={self.txn_start_ms}")
        if self.cluster_id is not None:
            parts.append(f"cluster={quote(self.cluster_id, safe='')}")
        if self.timeout_ms is not None:
            parts.append(f"timeout={self.timeout_ms}")
        if self.completed:
            parts.append("done=1")
        return ";".join(parts)

    def __repr__(self) -> str:
        return f"PreparedTxnState({str(self)!r})"


def _fail(text: str, problem: str) -> InvalidPreparedStateError:
    shown = text if len(text) <= 80 else text[:77] + "..."
    return InvalidPreparedStateError(f"invalid PreparedTxnState {shown!r}: {problem}")


def _int(text: str, key: str, value: str) -> int:
    if not re.fullmatch(r"-?\d{1,19}", value):
        raise _fail(text, f"{key}={value!r} is not an integer")
    return int(value)


def _parse(text: str) -> dict[str, Any]:
    if not isinstance(text, str):
        raise InvalidPreparedStateError(
            f"a serialized PreparedTxnState is a str, got {type(text).__name__}"
        )
    if len(text) > MAX_SERIALIZED_LENGTH:
        raise _fail(text, f"longer than {MAX_SERIALIZED_LENGTH} characters")
    if text == "":
        return {}
    java = _JAVA_FORM.fullmatch(text)
    if java:  # the Java client's "producerId:epoch"
        return _validated(text, {"producer_id": int(java[1]), "producer_epoch": int(java[2])})
    if not text.startswith(_PREFIX):
        raise _fail(
            text, f"expected '' or 'pid:epoch' or a form starting with '{_PREFIX}{_FORMAT};'"
        )
    head, _, rest = text.partition(";")
    version = head[len(_PREFIX) :]
    if not version.isdigit() or not version.isascii():
        raise _fail(text, f"format version {version!r} is not a number")
    if int(version) != _FORMAT:
        raise _fail(
            text,
            f"format version {version} is not readable by this kafka-txn (reads "
            f"{_FORMAT}): upgrade kafka-txn",
        )
    data: dict[str, Any] = {}
    seen: set[str] = set()
    for item in rest.split(";") if rest else ():
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise _fail(text, f"field {item!r} is not key=value")
        if key in seen:
            raise _fail(text, f"field {key!r} appears twice")
        seen.add(key)
        if key in _INT_KEYS:
            number = _int(text, key, value)
            data[_INT_KEYS[key]] = None if key == "start" and number == -1 else number
        elif key in _STR_KEYS:
            try:
                data[_STR_KEYS[key]] = unquote(value, errors="strict")
            except UnicodeDecodeError:
                raise _fail(text, f"{key} is not valid percent-encoded UTF-8") from None
        elif key == "done":
            if value not in ("0", "1"):
                raise _fail(text, f"done={value!r} must be 0 or 1")
            data["completed"] = value == "1"
        # Any other key: written by a newer kafka-txn; ignored (KIP-915).
    for key in ("pid", "epoch"):
        if key not in seen:
            raise _fail(text, f"field {key!r} is missing")
    return _validated(text, data)


def _validated(text: str, data: dict[str, Any]) -> dict[str, Any]:
    try:
        PreparedTxnState.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'state'}: {err['msg']}"
            for err in exc.errors()
        )
        raise _fail(text, problems) from None
    return data


PreparedTxnState.EMPTY = PreparedTxnState()
