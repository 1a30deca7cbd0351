"""Small process primitives shared by pulsed, its forkserver and the workers."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import subprocess

PR_SET_PDEATHSIG = 1


def _prctl(*args: int) -> int:
    import ctypes   # here, not at the top: pulsed itself never calls prctl, and ctypes is big
    return ctypes.CDLL(None, use_errno=True).prctl(*args)


def die_with_parent(expected_parent: int) -> None:
    """SIGKILL this process when its parent dies; exit now if it already has.

    PR_SET_PDEATHSIG fires when the parent *thread* exits, so parents fork from
    their main thread only.
    """
    if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        import ctypes
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != expected_parent:
        os._exit(1)


def set_title(title: str) -> None:
    """`title` in ps and, cut to 15 bytes, in /proc/PID/comm."""
    import setproctitle
    setproctitle.setproctitle(title)
    setproctitle.setthreadtitle(title)


def _child_dies_with_parent() -> None:   # runs between fork and exec (ctypes is loaded by then)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for signum in (signal.SIGINT, signal.SIGHUP):   # the worker ignores them; ignored survives exec
        signal.signal(signum, signal.SIG_DFL)


def start_child(argv: Sequence[str], **popen) -> "subprocess.Popen":
    """Start a grandchild (from a worker) that dies with the worker: no orphans.

    argv is a list, never a shell string. It runs in its own process group so the
    caller can signal it and everything it starts as one.
    """
    import ctypes  # noqa: F401  (loaded before the fork: the child must not import between fork and exec)
    import subprocess   # workers only: pulsed never starts a grandchild
    return subprocess.Popen(list(argv), preexec_fn=_child_dies_with_parent, process_group=0,
                            stdin=subprocess.DEVNULL, close_fds=True, **popen)


def signal_pidfd(pidfd: int, sig: int) -> bool:
    """Signal through a pidfd, immune to pid reuse; False if the process is gone."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
