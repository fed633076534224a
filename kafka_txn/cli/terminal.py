"""What ``kafka-txn`` shows an operator while it works: logging (quiet unless ``-v``),
a progress line for waits longer than a couple of seconds, the deadline behind
``--timeout``, and the confirmation asked before fencing a transactional id that may be
in use."""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = [
    "PROGRESS_AFTER_S",
    "Deadline",
    "NotConfirmedError",
    "ask",
    "configure_logging",
    "waiting",
]

PROGRESS_AFTER_S = 2.0
"""A wait shows a progress line once it has lasted this long."""

log = logging.getLogger("kafka_txn.cli")


class NotConfirmedError(Exception):
    """The operator did not confirm (or could not be asked): nothing was done."""


class Deadline:
    """The time ``--timeout`` leaves: every step of a command gets what remains (at least
    ``floor`` seconds, so that a step that starts late still gets one real try)."""

    def __init__(self, seconds: float, floor: float = 1.0) -> None:
        self.seconds = seconds
        self._floor = floor
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        return max(self._floor, self._end - time.monotonic())


@contextmanager
def configure_logging(verbosity: int) -> Iterator[None]:
    """Quiet by default: without ``-v`` no log record of the library reaches stderr (the
    command's own one line says what failed), and librdkafka's own log lines (they arrive
    through the producer's ``logger`` setting as ``kafka_txn.librdkafka``) are dropped
    even when ``-X debug=...`` asks librdkafka for them. ``-v`` shows kafka-txn's progress
    and librdkafka's lines on stderr; ``-vv`` debug detail.
    Python warnings are hidden unless ``-v``: confluent-kafka warns from ``close()`` after
    a timed-out call (its abort "failed during close"), noise after the one error line.
    The previous levels, handlers and warning filters are restored at the end (``main()``
    may run in-process)."""
    package = logging.getLogger("kafka_txn")
    librdkafka = logging.getLogger("kafka_txn.librdkafka")
    saved = (package.level, librdkafka.level)
    handler: logging.Handler | None = None
    if verbosity:
        level = logging.INFO if verbosity == 1 else logging.DEBUG
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        package.addHandler(handler)
        package.setLevel(level)
        librdkafka.setLevel(level)
    else:
        # Nothing here writes to stderr (the package's NullHandler keeps Python's
        # last-resort handler away); librdkafka's lines are not even formatted.
        librdkafka.setLevel(logging.CRITICAL + 1)
    try:
        with warnings.catch_warnings():
            if not verbosity:
                warnings.simplefilter("ignore")
            yield
    finally:
        if handler is not None:
            package.removeHandler(handler)
        package.setLevel(saved[0])
        librdkafka.setLevel(saved[1])


def _is_tty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):  # closed, or a stand-in without a descriptor
        return False


@contextmanager
def waiting(what: str, deadline: Deadline) -> Iterator[None]:
    """Around a step that may wait: after ``PROGRESS_AFTER_S`` seconds, a line on stderr
    saying what we wait for, for how long so far, and until when, redrawn every second
    and erased at the end. Only when stderr is a terminal: in a pipe or a log, stderr
    stays one line per failure (``-v`` logs each wait instead)."""
    log.info("waiting for %s (up to %.0fs)", what, deadline.left())
    stream = sys.stderr
    if not _is_tty(stream):
        yield
        return
    start = time.monotonic()
    done = threading.Event()
    drawn = threading.Event()
    budget = deadline.left()

    def draw() -> None:
        if done.wait(PROGRESS_AFTER_S):
            return
        while not done.is_set():
            elapsed = time.monotonic() - start
            stream.write(f"\rkafka-txn: waiting for {what}: {elapsed:.0f}s of {budget:.0f}s ")
            stream.flush()
            drawn.set()
            done.wait(1.0)

    thread = threading.Thread(target=draw, name="kafka-txn-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if drawn.is_set():
            stream.write("\r\x1b[K")  # erase the progress line: the result follows
            stream.flush()


def ask(question: str) -> None:
    """Ask a yes/no question on the terminal (stderr, answer on stdin); NotConfirmedError unless
    the answer is yes. NotConfirmedError at once when stdin is not a terminal: nobody can answer
    (``--yes`` is the way to proceed from a script)."""
    if not _is_tty(sys.stdin):
        raise NotConfirmedError("stdin is not a terminal, so nobody can confirm")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if answer.strip().lower() not in ("y", "yes"):
        raise NotConfirmedError("not confirmed")
