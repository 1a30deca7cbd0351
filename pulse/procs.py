"""Small process primitives shared by pulsed, its forkserver and the workers."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from typing import Sequence

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl


def die_with_parent(expected_parent: int) -> None:
    """SIGKILL this process when its parent dies; exit now if it already has.

    PR_SET_PDEATHSIG fires when the parent *thread* exits, so parents fork from
    their main thread only.
    """
    if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != expected_parent:
        os._exit(1)


def set_title(title: str) -> None:
    """`title` in ps and, cut to 15 bytes, in /proc/PID/comm."""
    import setproctitle
    setproctitle.setproctitle(title)
    setproctitle.setthreadtitle(title)


def _child_dies_with_parent() -> None:   # runs between fork and exec
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start_child(argv: Sequence[str], **popen) -> subprocess.Popen:
    """Start a grandchild (from a worker) that dies with the worker: no orphans.

    argv is a list, never a shell string. It runs in its own process group so the
    caller can signal it and everything it starts as one.
    """
    return subprocess.Popen(list(argv), preexec_fn=_child_dies_with_parent, process_group=0,
                            stdin=subprocess.DEVNULL, close_fds=True, **popen)


def signal_pidfd(pidfd: int, sig: int) -> bool:
    """Signal through a pidfd, immune to pid reuse; False if the process is gone."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
