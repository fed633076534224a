"""Server processes a command starts and must not leave behind: each runs in its own
process group (``start_new_session``, so that a Ctrl-C at the terminal reaches the command,
which stops the server in order, and not the server first), and on Linux it is signalled
SIGTERM by the kernel when the command's process dies, however it dies (SIGKILL
included): ``prctl(PR_SET_PDEATHSIG, SIGTERM)``, set in the child between fork and exec.

The kernel sends that signal when the *thread* that forked the child exits, so a server
asked to die with its parent must be started from a thread that lives as long as the
command: the command starts its broker from the main thread. Elsewhere than Linux there is
no such call; the command's own SIGINT/SIGTERM handling still stops the server.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["PR_SET_PDEATHSIG", "die_with_parent"]

PR_SET_PDEATHSIG = 1
"""linux/prctl.h: the signal the calling process gets when its parent thread dies."""


def die_with_parent() -> Callable[[], None] | None:
    """The ``preexec_fn`` for ``subprocess.Popen`` that has the child signalled SIGTERM
    when the thread starting it dies (Linux); None where the kernel has no such call."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the prctl: no signal will come
            raise OSError("the command ended while its server was starting")

    return set_parent_death_signal
