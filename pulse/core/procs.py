"""Small process primitives shared by pulsed, its forkserver and the workers."""

from __future__ import annotations

import errno
import os
import signal
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import subprocess

# Imports inside functions: pulsed imports this module; ctypes (~2 ms) for prctl, setproctitle (~5 ms)
# and subprocess (~3 ms) are loaded by the processes that use them.

PR_SET_PDEATHSIG = 1


def proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None
    when there is no such process or it has exited (a zombie): with the pid, it names one process
    across pid reuse."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    return None if fields[0] in (b"Z", b"X") else fields[19].decode()


_libc = None


def libc():
    """The C library, loaded once. ctypes is imported here, not at the top: pulsed itself never
    calls prctl, and ctypes is big. Load it before forking a child whose pre-exec uses it."""
    global _libc
    if _libc is None:
        import ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _prctl(*args: int) -> int:
    return libc().prctl(*args)


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


def set_title(title: str, comm: str | None = None) -> None:
    """`title` in ps and, cut to 15 bytes, `comm` (default: the title) in /proc/PID/comm."""
    import setproctitle
    setproctitle.setproctitle(title)
    setproctitle.setthreadtitle(comm or title)


def child_signal_defaults() -> None:
    """Pre-exec: SIGINT and SIGHUP back to their defaults (a worker ignores both, and an ignored
    signal survives exec). Plain libc calls, nothing of Python's, between fork and exec."""
    _libc.signal(signal.SIGINT, 0)   # SIG_DFL
    _libc.signal(signal.SIGHUP, 0)


def child_dies_with_parent() -> None:
    """Pre-exec: as child_signal_defaults, and SIGKILL the child when the thread that started it
    exits (PR_SET_PDEATHSIG): no orphans."""
    child_signal_defaults()
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start_child(argv: Sequence[str], **popen) -> "subprocess.Popen":
    """Start a grandchild (from a worker) that dies with the worker: no orphans.

    argv is a list, never a shell string. It runs in its own process group so the
    caller can signal it and everything it starts as one.
    """
    import subprocess  # workers only: pulsed never starts a grandchild
    libc()              # loaded before the fork: the child must not import between fork and exec
    return subprocess.Popen(list(argv), preexec_fn=child_dies_with_parent, process_group=0,
                            stdin=subprocess.DEVNULL, close_fds=True, **popen)


# linux/pidfd.h (Linux 6.9): the signal goes to the thread the pidfd names, not to the whole process.
PIDFD_SIGNAL_THREAD = 1


def signal_pidfd(pidfd: int, sig: int, main_thread: bool = False) -> bool:
    """Signal through a pidfd, immune to pid reuse; False if the process is gone. `main_thread`: to
    the process's main thread alone (where the kernel has it; else to the process, as without it)."""
    try:
        if main_thread:
            try:
                signal.pidfd_send_signal(pidfd, sig, None, PIDFD_SIGNAL_THREAD)
                return True
            except OSError as err:
                if err.errno != errno.EINVAL:       # EINVAL: a kernel before 6.9
                    raise
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False


# -- git ---------------------------------------------------------------------------------------------

# The daemon's user may have no git identity: every commit Pulse makes names itself.
GIT_IDENTITY = ("-c", "user.name=Pulse", "-c", "user.email=pulse@localhost")


class GitError(Exception):
    """git failed; the message names the command and what git said."""


def run_git(repo, *args: str, text: bool = True, timeout: float = 60) -> "subprocess.CompletedProcess":
    """git ARGS in `repo`, with Pulse's identity, output captured; never raises on its exit code."""
    import subprocess
    try:
        return subprocess.run(["git", *GIT_IDENTITY, *args], cwd=repo, capture_output=True, text=text,
                              timeout=timeout)
    except FileNotFoundError:
        raise GitError("git is required for the engine directory, and is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {' '.join(args)} in {repo}: no answer within {timeout:g}s") from None


def git(repo, *args: str, timeout: float = 60) -> str:
    """git ARGS in `repo`: its output, stripped; GitError if it fails."""
    proc = run_git(repo, *args, timeout=timeout)
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()
