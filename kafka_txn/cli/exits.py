"""How a ``kafka-txn`` command ends: its exit code (0 done, 1 failed, 2 bad arguments,
3 refused, 4 unknown transactional id), the exceptions a command raises to end otherwise
than done, and the one line on stderr that says why.

An operator reads that one line, not a traceback: the text of a library error is trimmed
to what librdkafka (or the coordinator client) said, and a broker's refusal of the
transaction timeout is named as the setting it is.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from kafka_txn.config import DEFAULT_TRANSACTION_TIMEOUT_MS
from kafka_txn.errors import KafkaTxnError

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNKNOWN_ID",
    "EXIT_USAGE",
    "CommandError",
    "UsageError",
    "fail",
    "failure_reason",
    "format_seconds",
    "one_line",
    "raise_if_timeout_refused",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNKNOWN_ID = 4


class CommandError(Exception):
    """A command's end other than success: the exit code and one line for stderr."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class UsageError(Exception):
    """Bad arguments found after argparse (``-X`` values, a missing environment
    variable): exit 2."""


def one_line(text: str) -> str:
    """``text`` on one line: a failure is one line on stderr."""
    return re.sub(r"\s*\n\s*", " ", text).strip()


def format_seconds(value: float) -> str:
    """4.98 -> "5", 2.25 -> "2.2": what an operator reads as "the timeout I gave"."""
    return f"{value:.1f}".removesuffix(".0")


def failure_reason(exc: KafkaTxnError) -> str:
    """What librdkafka (or the coordinator client) said, without the library's advice to
    a program ("call init_transactions() again"), which is not the operator's."""
    return exc.kafka_error.str() if exc.kafka_error is not None else exc.message


def raise_if_timeout_refused(exc: KafkaTxnError, conf: dict[str, Any], more: str) -> None:
    """The broker refused the init because transaction.timeout.ms exceeds its
    transaction.max.timeout.ms (INVALID_TRANSACTION_TIMEOUT, from InitProducerId): a
    setting only the broker can judge, named as such; the init failed, so nothing was
    fenced."""
    from confluent_kafka import KafkaError  # noqa: PLC0415

    if exc.kafka_error is None or exc.kafka_error.code() != KafkaError.INVALID_TRANSACTION_TIMEOUT:
        return
    timeout = conf.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
    raise CommandError(
        EXIT_FAILED,
        f"the broker refuses transaction.timeout.ms={timeout} (more than its "
        "transaction.max.timeout.ms): pass a smaller -X transaction.timeout.ms, or none; "
        f"nothing was fenced{more}",
    ) from exc


def fail(code: int, message: str) -> int:
    """Say ``message`` on stderr, on one line after ``kafka-txn:``; the exit code."""
    print(f"kafka-txn: {one_line(message)}", file=sys.stderr)
    return code
