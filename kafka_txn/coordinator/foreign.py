"""What a peer that is not a Kafka listener answered, in words an operator recognises.

A Kafka response starts with its size (int32, big-endian). A peer speaking another
protocol answers with bytes that, read as that size, are absurd: ``HTTP`` is 0x48545450,
1,213,486,160 bytes. The connection layer reads a little more of such an answer and asks
``describe_answer`` what it looks like.
"""

from __future__ import annotations

import struct

__all__ = ["describe_answer"]


def _line(data: bytes, limit: int = 80) -> str:
    text = data.split(b"\r\n", 1)[0].split(b"\n", 1)[0]
    return text[:limit].decode("ascii", "replace")


def _postgres(head: bytes) -> str | None:
    # ErrorResponse: 'E', int32 length, then fields "<code><text>\0"... (S=severity,
    # M=message); PostgreSQL answers a Kafka request with "unsupported frontend protocol".
    if len(head) < 6 or head[:1] != b"E" or head[5:6] != b"S":
        return None
    fields = {f[:1]: f[1:] for f in head[5:].split(b"\0") if f}
    message = fields.get(b"M", b"").decode("utf-8", "replace")
    severity = fields.get(b"S", b"").decode("ascii", "replace")
    return f"answered like PostgreSQL: {severity}: {message}".rstrip(": ")


def _mysql(head: bytes) -> str | None:
    # Initial handshake packet: 3-byte length, sequence 0, protocol version 10, then the
    # server version as a NUL-terminated string. MySQL/MariaDB speak first.
    if len(head) < 6 or head[3] != 0 or head[4] != 10:
        return None
    version = head[5:].split(b"\0", 1)[0].decode("ascii", "replace")
    return f"answered like MySQL/MariaDB, server version {version}"


def describe_answer(head: bytes) -> str:
    """A short description of ``head``, the first bytes a non-Kafka peer sent."""
    if head.startswith(b"HTTP/"):
        return f"answered like {_line(head)}"
    if len(head) >= 3 and head[0] in (0x15, 0x16) and head[1] == 3:
        return "answered with TLS: it is a TLS listener; set security.protocol=SSL or SASL_SSL"
    for recognise in (_postgres, _mysql):
        described = recognise(head)
        if described is not None:
            return described
    if head[:1] in (b"-", b"+"):
        return f"answered like Redis: {_line(head)}"
    if head and all(32 <= b < 127 or b in (9, 10, 13) for b in head[:16]):
        return f"answered {_line(head)!r}"
    size = struct.unpack(">i", head[:4])[0] if len(head) >= 4 else None
    shown = head[:16].hex(" ")
    return f"answered bytes {shown}" + (f" (read as a Kafka size: {size})" if size else "")
