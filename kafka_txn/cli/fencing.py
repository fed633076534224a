"""Before ``kafka-txn recover`` or ``force-terminate`` fences a transactional id: may a
writer still be live (then the operator is asked first: ``confirm_fencing``), and, once
asked, did anything change while the question was open (then the answer was about
something else: refused, ``refuse_if_changed``).

A writer may be live when (``reasons_to_ask``):

- the coordinator shows a transaction that started less than ``max(transaction timeout,
  60 s)`` ago, or (recover) the state row was written that recently, by the database's
  clock: recency, the only sign there is of a writer on another host;
- (recover) the state row's owner token (``host:pid:uuid8``, written by a DualWriter's
  ``start()``) names this host and that process runs, however old its last write: an idle
  writer between transactions writes nothing, yet it is live.

Whether a process runs is ``kill(pid, 0)`` (POSIX: signal 0 only checks that the process
exists and may be signalled; EPERM means it exists under another user), and on Linux a
zombie (``/proc/<pid>/stat`` state ``Z``: exited, not yet reaped) counts as gone. It sees
this host's PID namespace only: a writer in a container that shares the host name but not
the PID namespace looks not running, and recency alone then applies, as for another host.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_txn.cli.database import StoredRow
from kafka_txn.cli.exits import EXIT_REFUSED, CommandError
from kafka_txn.cli.terminal import NotConfirmedError, ask
from kafka_txn.coordinator.client import TransactionDescription

if TYPE_CHECKING:  # SQLAlchemy is an extra: dualwrite is imported by recover only
    from sqlalchemy.engine import Connection

    from kafka_txn.dualwrite.state_row import _Row
    from kafka_txn.dualwrite.writer import DualWriter

__all__ = [
    "OPEN_STATES",
    "RECENT_FLOOR_S",
    "OwnerProcess",
    "RowChangedError",
    "changes_since",
    "confirm_fencing",
    "guard_row",
    "owner_note",
    "owner_process",
    "reasons_to_ask",
    "refuse_if_changed",
    "window_s",
]

RECENT_FLOOR_S = 60.0
"""A transaction that started less than max(its timeout, this) seconds ago may belong to
a live writer: fencing its id needs a confirmation."""

OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")

_TOKEN_LENGTH = 255
"""The owner column's length: DualWriter cuts a long host name to fit the token in it."""


@dataclass(frozen=True)
class OwnerProcess:
    """What a state row's owner token (``host:pid:uuid8``) says about its process."""

    token: str
    host: str
    pid: int | None
    here: bool
    """The token names this host (``socket.gethostname()``)."""
    running: bool | None
    """Whether that process runs; None when it cannot be checked from here (another
    host, or a token without a pid)."""


def owner_process(token: str | None) -> OwnerProcess | None:
    """The owner token's host and process, and whether that process runs (checked only
    when the host is this one); None without a token (a table older than the owner
    column, or a row no DualWriter has started on)."""
    if not token:
        return None
    host, pid_text = ("", "")
    if token.count(":") >= 2:
        host, pid_text, _ = token.rsplit(":", 2)
    pid = int(pid_text) if pid_text.isdigit() and int(pid_text) > 0 else None
    this_host = socket.gethostname()
    # DualWriter cuts the host name so that the token fits the column (_owner_token).
    here = bool(host) and (
        host == this_host or (len(token) == _TOKEN_LENGTH and this_host.startswith(host))
    )
    running = _pid_running(pid) if here and pid is not None else None
    return OwnerProcess(token, host, pid, here, running)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    try:  # Linux: an exited process not yet reaped by its parent still "exists"
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def window_s(seen: TransactionDescription) -> float:
    """How recent a transaction or state-row write must be to suggest a live writer:
    ``max(the transaction timeout the coordinator reports, 60 s)``. An older transaction
    is past its timeout: no writer can still commit it."""
    return max(seen.timeout_ms / 1000, RECENT_FLOOR_S)


def reasons_to_ask(
    seen: TransactionDescription, row: StoredRow | None, now: float | None = None
) -> list[str]:
    """Why fencing the id may hit a live writer (empty: no reason to ask), each a phrase
    following "transactional id 'x' ...":

    - the coordinator shows a transaction that started within the window (``window_s``),
      in any state: open (Ongoing, PrepareCommit, PrepareAbort), its writer may be
      mid-transaction; just completed (the coordinator keeps the last start time), its
      writer likely still runs;
    - the state row was written within it (by the database's clock): a DualWriter writes
      it at start() and at every commit, so a live writer between transactions shows;
    - the state row's owner is a running process of this host, however old the row."""
    window = window_s(seen)
    recent = []
    if seen.start_time_ms >= 0:
        age = (time.time() if now is None else now) - seen.start_time_ms / 1000
        if age < window:
            what = "is still open" if seen.state in OPEN_STATES else "has ended"
            recent.append(
                f"has a transaction that started {age:.1f}s ago and {what} (state "
                f"{seen.state}, producer id {seen.producer_id}, epoch {seen.producer_epoch})"
            )
    if row is not None and row.age_s is not None and row.age_s < window:
        recent.append(f"has a state row last written {row.age_s:.1f}s ago")
    reasons = []
    if recent:
        reasons.append(
            f"{', and '.join(recent)} (less than {window:g}s: the transaction timeout, "
            "at least 60s)"
        )
    owner = owner_process(row.owner if row is not None else None)
    if owner is not None and owner.running:
        reasons.append(
            f"has a state row owned by process {owner.pid} of this host, which is running "
            "(a writer between transactions writes nothing, however long it is idle)"
        )
    return reasons


def owner_note(row: StoredRow | None) -> str:
    """What the state row says about the writer that last took the id over: its owner
    token, its last write, and whether its process is gone (this host; a running one is
    a reason to ask, said there) or cannot be checked (another host)."""
    owner = owner_process(row.owner if row is not None else None)
    if row is None or owner is None:
        return ""
    note = f"; the state row's owner is {owner.token} (last written {row.updated})"
    if owner.running is True:
        return note  # reasons_to_ask said so already
    if owner.running is False:
        return note + f", and process {owner.pid} on this host is not running"
    if owner.host and not owner.here:
        return note + f", on host {owner.host}: whether it still runs cannot be checked from here"
    return note


def _transaction(seen: TransactionDescription) -> str:
    if seen.start_time_ms >= 0:
        start = datetime.fromtimestamp(seen.start_time_ms / 1000, tz=timezone.utc)
        started = f"transaction started {start.isoformat(timespec='milliseconds')}"
    else:
        started = "no transaction started"
    return (
        f"state {seen.state}, producer id {seen.producer_id}, epoch {seen.producer_epoch}, "
        f"{started}"
    )


def changes_since(
    seen: TransactionDescription,
    row: StoredRow | None,
    seen_now: TransactionDescription,
    row_now: StoredRow | None,
    *,
    with_row: bool,
) -> list[str]:
    """What changed between the view the operator was asked about and the view read
    after the answer: the coordinator's (state, producer id and epoch, transaction start)
    and, ``with_row`` (recover), the state row's (owner, stored state, last write).
    Empty: nothing changed."""
    changed = []
    key = (seen.state, seen.producer_id, seen.producer_epoch, seen.start_time_ms)
    if key != (seen_now.state, seen_now.producer_id, seen_now.producer_epoch,
               seen_now.start_time_ms):  # fmt: skip
        changed.append(
            f"the coordinator now shows {_transaction(seen_now)} (it showed {_transaction(seen)})"
        )
    if with_row:
        changed.extend(_row_changes(row, row_now))
    return changed


def _row_changes(row: StoredRow | None, row_now: StoredRow | None) -> list[str]:
    if row_now is None:
        return ["the state row is gone"] if row is not None else []
    if row is None:
        return [f"a state row appeared (owner {row_now.owner})"]
    if row.owner != row_now.owner:
        return [
            f"the state row's owner is now {row_now.owner} (last written {row_now.updated}; "
            f"it was {row.owner})"
        ]
    if (row.state, row.updated) != (row_now.state, row_now.updated):
        return [f"the state row was written again (at {row_now.updated}) by its owner {row.owner}"]
    return []


class RowChangedError(Exception):
    """Under the state-row lock, the row is no longer the one recover checked: a writer
    took the id over (or wrote) since. Nothing was written, nothing fenced."""

    def __init__(self, owner: str | None, updated: object) -> None:
        super().__init__(f"owner {owner}, last written {updated}")
        self.owner = owner
        self.updated = updated


def guard_row(writer: DualWriter, expected: StoredRow) -> None:
    """Make ``writer.start()`` check, under the state-row lock it takes first (SELECT ...
    FOR UPDATE; on SQLite a write), that the row still has the owner, stored state and
    last write that recover checked, and raise RowChangedError otherwise, before anything
    is settled, written or fenced. A DualWriter takes an id over only by writing its owner
    token under that lock (its start()), so no DualWriter can take the id between this
    check and recover's own settle; one that takes it right after loses nothing: start()
    checks the owner again under the lock before its init_transactions() (the fence), and
    stops if the row has a new owner. The hook wraps the writer's first lock() only (its
    second, before the fence, must see recover's own token)."""
    row = writer._row
    lock = row.lock
    first = [True]

    def checked_lock(conn: Connection, *more: Any, **options: Any) -> _Row:
        found = lock(conn, *more, **options)
        if first[0]:
            first[0] = False
            if (found.owner, found.state, found.updated) != (
                expected.owner, expected.state, expected.updated
            ):  # fmt: skip
                raise RowChangedError(found.owner, found.updated)
        return found

    setattr(row, "lock", checked_lock)  # noqa: B010 - an instance attribute over the method


def confirm_fencing(
    command: str, transactional_id: str, seen: TransactionDescription, row: StoredRow | None,
    yes: bool,
) -> bool:  # fmt: skip
    """Ask before fencing an id a live writer may hold (``reasons_to_ask``); True if a
    question was asked (the wait for the answer does not count against --timeout, and
    the caller must then look again: ``refuse_if_changed``). Raises
    CommandError(EXIT_REFUSED) when not confirmed."""
    reasons = reasons_to_ask(seen, row)
    if not reasons or yes:
        return False
    owner = owner_process(row.owner if row is not None else None)
    who = (
        # The state row's owner is gone, yet the id was used recently (the reasons).
        "so it is not that process, but another writer (on another host, or one that "
        "took the id over since) may be using it"
        if owner is not None and owner.running is False
        else "a writer may still be using it"
    )
    situation = (
        f"transactional id {transactional_id!r} {'; and it '.join(reasons)}"
        f"{owner_note(row)}: {who}, and {command} would fence it"
    )
    try:
        ask(f"kafka-txn: {situation}.\nProceed with {command}?")
    except NotConfirmedError as exc:
        raise CommandError(
            EXIT_REFUSED,
            f"{situation}. {exc}; nothing was done. Stop that writer first, or run again "
            "with --yes if it is gone",
        ) from None
    return True


def refuse_if_changed(
    command: str, transactional_id: str, seen: TransactionDescription, row: StoredRow | None,
    seen_now: TransactionDescription, row_now: StoredRow | None,
) -> None:  # fmt: skip
    """After the operator's "yes": refuse (exit 3, nothing done) if the coordinator's view
    or (recover) the state row changed while the question was open: the answer was about
    a writer that may not be the one holding the id now."""
    changed = changes_since(seen, row, seen_now, row_now, with_row=command == "recover")
    if changed:
        raise CommandError(
            EXIT_REFUSED,
            f"transactional id {transactional_id!r} changed while you were asked: "
            f"{'; '.join(changed)}. Your answer was about what was there before, so "
            f"nothing was done: run {command} again to see who holds it now",
        )
