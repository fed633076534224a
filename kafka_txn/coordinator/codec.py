"""The Kafka wire format, as small typed field codecs (aiokafka/kafka-python style).

A message schema is a tuple of ``(name, FieldType)``; ``encode``/``decode`` walk it. The
same schema serves classic and flexible versions: in a flexible version (KIP-482) strings,
bytes and arrays use compact (unsigned-varint length + 1) forms and every struct ends with
tagged fields, which this codec writes empty and skips when reading (KIP-482: a reader
ignores tags it does not know).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "BOOL",
    "BYTES",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "NULLABLE_STRING",
    "STRING",
    "Array",
    "DecodeError",
    "FieldType",
    "Reader",
    "Schema",
    "Struct",
    "Writer",
    "decode",
    "encode",
]


class DecodeError(ValueError):
    """A response did not match the schema it was read with."""


class Writer:
    """An append-only byte buffer."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def raw(self, data: bytes) -> None:
        self.parts.append(data)

    def uvarint(self, value: int) -> None:
        out = bytearray()
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
        self.parts.append(bytes(out))

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class Reader:
    """A cursor over a response body."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.size = len(self.data)
        self.pos = 0

    def take(self, size: int) -> bytes:
        pos = self.pos
        if size < 0 or pos + size > self.size:
            raise self.truncated(size)
        self.pos = pos + size
        return bytes(self.data[pos : pos + size])

    def truncated(self, size: int) -> DecodeError:
        return DecodeError(f"truncated: wanted {size} bytes at offset {self.pos} of {self.size}")

    def uvarint(self) -> int:
        data, size = self.data, self.size
        shift = result = 0
        while True:
            if self.pos >= size:
                raise self.truncated(1)
            byte = data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise DecodeError("unsigned varint longer than 64 bits")

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())

    def remaining(self) -> int:
        return self.size - self.pos


class FieldType:
    """One wire type."""

    def encode(self, w: Writer, value: Any, flexible: bool) -> None:
        raise NotImplementedError

    def decode(self, r: Reader, flexible: bool) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class _Fixed(FieldType):
    fmt: str
    _struct: struct.Struct = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_struct", struct.Struct(self.fmt))

    def encode(self, w: Writer, value: Any, flexible: bool) -> None:
        w.raw(self._struct.pack(value))

    def decode(self, r: Reader, flexible: bool) -> Any:
        size, pos = self._struct.size, r.pos
        if pos + size > r.size:
            raise r.truncated(size)
        r.pos = pos + size
        return self._struct.unpack_from(r.data, pos)[0]


INT8 = _Fixed(">b")
INT16 = _Fixed(">h")
INT32 = _Fixed(">i")
INT64 = _Fixed(">q")
BOOL = _Fixed(">?")


def _length(w: Writer, size: int | None, flexible: bool, classic: str) -> None:
    """Length prefix: -1/0 means null; compact forms store length + 1 as uvarint."""
    if flexible:
        w.uvarint(0 if size is None else size + 1)
    else:
        w.raw(struct.pack(classic, -1 if size is None else size))


def _read_length(r: Reader, flexible: bool, classic: str) -> int | None:
    n = r.uvarint() - 1 if flexible else _classic_int(r, classic)
    return None if n < 0 else n


def _classic_int(r: Reader, fmt: str) -> int:
    kind = INT16 if fmt == ">h" else INT32
    value: int = kind.decode(r, False)
    return value


@dataclass(frozen=True)
class _String(FieldType):
    nullable: bool

    def encode(self, w: Writer, value: Any, flexible: bool) -> None:
        if value is None:
            if not self.nullable:
                raise ValueError("a non-nullable string field got None")
            _length(w, None, flexible, ">h")
            return
        data = value.encode("utf-8")
        _length(w, len(data), flexible, ">h")
        w.raw(data)

    def decode(self, r: Reader, flexible: bool) -> Any:
        n = _read_length(r, flexible, ">h")
        if n is None:
            if not self.nullable:
                raise DecodeError("null in a non-nullable string field")
            return None
        return r.take(n).decode("utf-8")


STRING = _String(nullable=False)
NULLABLE_STRING = _String(nullable=True)


class _Bytes(FieldType):
    def encode(self, w: Writer, value: Any, flexible: bool) -> None:
        _length(w, None if value is None else len(value), flexible, ">i")
        if value is not None:
            w.raw(bytes(value))

    def decode(self, r: Reader, flexible: bool) -> Any:
        n = _read_length(r, flexible, ">i")
        return None if n is None else r.take(n)


BYTES = _Bytes()


class _Uuid(FieldType):
    def encode(self, w: Writer, value: Any, flexible: bool) -> None:
        w.raw(value.bytes)

    def decode(self, r: Reader, flexible: bool) -> Any:
        return uuid.UUID(bytes=r.take(16))


UUID = _Uuid()

Schema = Sequence[tuple[str, FieldType]]


@dataclass(frozen=True)
class Struct(FieldType):
    """A nested structure; a flexible version ends it with (empty) tagged fields."""

    fields: Schema

    def encode(self, w: Writer, value: Any, flexible: bool) -> None:
        for name, kind in self.fields:
            if name not in value:
                raise ValueError(f"missing field {name!r}")
            kind.encode(w, value[name], flexible)
        if flexible:
            w.uvarint(0)

    def decode(self, r: Reader, flexible: bool) -> Any:
        out = {name: kind.decode(r, flexible) for name, kind in self.fields}
        if flexible:
            r.skip_tagged_fields()
        return out


@dataclass(frozen=True)
class Array(FieldType):
    """An array of one element type (None encodes a null array)."""

    item: FieldType
    MAX_ITEMS: ClassVar[int] = 1_000_000

    def encode(self, w: Writer, value: Any, flexible: bool) -> None:
        _length(w, None if value is None else len(value), flexible, ">i")
        for item in value or ():
            self.item.encode(w, item, flexible)

    def decode(self, r: Reader, flexible: bool) -> Any:
        n = _read_length(r, flexible, ">i")
        if n is None:
            return None
        if n > self.MAX_ITEMS or n > r.remaining():
            raise DecodeError(f"array of {n} items cannot fit in {r.remaining()} bytes")
        return [self.item.decode(r, flexible) for _ in range(n)]


def encode(schema: Schema, value: dict[str, Any], flexible: bool) -> bytes:
    """Encode one message body."""
    w = Writer()
    Struct(schema).encode(w, value, flexible)
    return w.getvalue()


def decode(schema: Schema, data: bytes, flexible: bool) -> dict[str, Any]:
    """Decode one message body; trailing bytes are an error (a wrong version)."""
    r = Reader(data)
    out: dict[str, Any] = Struct(schema).decode(r, flexible)
    if r.remaining():
        raise DecodeError(f"{r.remaining()} bytes left over after the message")
    return out
