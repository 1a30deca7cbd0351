"""The processes Pulse guards ([[process]]): how each is found, by the watcher and the executor alike.

By `pidfile` (a plain pid, or the `key` of a JSON file such as OpenClaw's lock file), or by `match`,
a regex over the full command line. A match never counts Pulse's own processes (pulsed, its
workers and keepers, whose titles begin "pulse:", and a running pulsectl): a `pgrep -f` or a
script that carries the pattern in its argv still can, so the watcher reports how many matched.

Another account cannot pass for it: a process counts only if it runs as the process's `user` (unset:
Pulse's own account, the one Pulse starts it as), and while the keeper of what Pulse started lives,
only that keeper's descendants count. A process of an agent's account with the same command line
is not the gateway, however alive it is.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import psutil

    from pulse.core.config import PidFile, Process

# Imports inside functions: psutil (~14 ms, python -X importtime) only where processes are scanned:
# pulsed imports this module (its names and titles) and never scans (docs/architecture.md: the supervisor
# stays tiny); so do pulsectl's commands that only name a guarded process.

PULSE_TITLE = "pulse:"
PULSE_PROGRAMS = ("pulsed", "pulsectl")
KEEPER_MODULE = "pulse.effects.keeper"      # a keeper before it has set its title carries its argv
KEEPERS_MODULE = "pulse.effects.keepers"    # ... and so does the keepers' server


def read_pidfile(spec: "str | PidFile") -> tuple[int | None, str]:
    """(the pid the file names, or None; why not)."""
    path, key = (spec, None) if isinstance(spec, str) else (spec.path, spec.key)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None, f"no pidfile {path}"
    except OSError as err:
        return None, f"pidfile {path} unreadable: {err}"
    try:
        pid = int(json.loads(text)[key]) if key else int(text.split()[0])
    except (ValueError, IndexError, KeyError, TypeError) as err:
        what = f"no integer at key {key!r}" if key else "no pid on its first line"
        return None, f"pidfile {path} holds {what} ({type(err).__name__})"
    if pid <= 0:
        return None, f"pidfile {path} holds no valid pid ({pid})"
    return pid, ""


def is_pulses_own(cmdline: list[str]) -> bool:
    """A process of Pulse itself: a worker or keeper (titled "pulse: ..."), pulsed or pulsectl."""
    if not cmdline:
        return False
    if cmdline[0].startswith(PULSE_TITLE) or {KEEPER_MODULE, KEEPERS_MODULE} & set(cmdline[1:3]):
        return True
    return any(os.path.basename(arg) in PULSE_PROGRAMS for arg in cmdline[:2])


def expected_uid(process: "Process") -> int | None:
    """The uid the process must run as: its `user`'s, else Pulse's own; None for a user with no account."""
    if process.user is None:
        return os.getuid()
    try:
        return pwd.getpwnam(process.user).pw_uid
    except KeyError:
        return None


def scan(attrs: list[str]) -> list[tuple["psutil.Process", dict]]:
    """Every process there is, with `attrs` read into a dict of its own (None where access is denied).

    Not psutil.process_iter(attrs): it caches its Process objects for every thread of the process
    and sets `.info` on them as it goes, so one watcher's scan of ["cmdline"] replaced what another
    thread's scan had just read (its `create_time` gone: a sample lost to a KeyError)."""
    import psutil
    out = []
    for pid in psutil.pids():
        try:
            proc = psutil.Process(pid)
            out.append((proc, proc.as_dict(attrs, ad_value=None)))
        except psutil.NoSuchProcess:        # gone meanwhile (a zombie's attrs are ad_value)
            continue
    return out


def cmdlines() -> Iterator[tuple[int, list[str]]]:
    """(pid, command line) of every process, read from /proc and split as psutil splits it, without a
    psutil.Process for each: a look at a few hundred processes costs a millisecond or two instead of
    tens on a busy host, and it is on the path of every restart and of each look of the watcher. What
    it finds is read again through psutil before anything is done with it."""
    encoding = sys.getfilesystemencoding()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{entry.name}/cmdline", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:                     # gone meanwhile
            continue
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        except OSError:
            continue
        finally:
            os.close(fd)
        yield int(entry.name), split_cmdline(b"".join(chunks).decode(encoding, "surrogateescape"))


def split_cmdline(data: str) -> list[str]:
    """/proc/PID/cmdline as a list, as psutil's Process.cmdline() splits it (a process that rewrote its
    title may separate its words with spaces instead of NULs)."""
    if not data:
        return []                           # a zombie's, or a kernel thread's
    sep = "\0" if data.endswith("\0") else " "
    if data.endswith(sep):
        data = data[:-1]
    words = data.split(sep)
    if sep == "\0" and len(words) == 1 and " " in data:
        words = data.split(" ")
    return words


Table = list[tuple[int, list[str]]]     # cmdlines() read once, for several looks at the same moment


def matching(pattern: re.Pattern, uid: int | None = None, table: Table | None = None) -> list["psutil.Process"]:
    """Live processes whose command line matches (and that run as `uid`, when given), Pulse's own
    left out, oldest first (a server's forked workers match too, and it is their parent that is the
    process)."""
    import psutil
    me, found = os.getpid(), []
    for pid, cmdline in cmdlines() if table is None else table:
        if pid == me or not cmdline or is_pulses_own(cmdline) or not pattern.search(" ".join(cmdline)):
            continue
        try:        # read again through psutil, as one process: its pid may have been taken meanwhile
            proc = psutil.Process(pid)
            info = proc.as_dict(["cmdline", "create_time", "status", "uids"], ad_value=None)
        except psutil.NoSuchProcess:
            continue
        cmdline = info["cmdline"] or []
        if info["status"] == psutil.STATUS_ZOMBIE or not cmdline or is_pulses_own(cmdline):
            continue
        if uid is not None and (info["uids"] is None or info["uids"].real != uid):
            continue
        if pattern.search(" ".join(cmdline)):
            found.append((info["create_time"] or 0, proc))
    return [proc for _, proc in sorted(found, key=lambda pair: pair[0])]


def runs_as(proc: "psutil.Process", uid: int) -> bool:
    import psutil
    try:
        return proc.uids().real == uid
    except psutil.Error:
        return False


def living(pid: int) -> "psutil.Process | None":
    """The process `pid` if it runs; a zombie has died (its parent has not reaped it yet)."""
    import psutil
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except (psutil.NoSuchProcess, ValueError):   # ZombieProcess is a NoSuchProcess
        return None
    except psutil.AccessDenied:    # another user's process: it exists, so it lives
        return proc


def find(process: "Process", home: str | os.PathLike | None = None,
         table: Table | None = None) -> tuple[list["psutil.Process"], str]:
    """(the live processes of `process`, the oldest first; why none), by its pidfile or match: only
    those that run as its user, and (with the home) only the keeper's while its keeper lives."""
    uid = expected_uid(process)
    if uid is None:
        return [], f"no account {process.user!r} (its `user`) on this host"
    if process.pidfile is not None:
        pid, why = read_pidfile(process.pidfile)
        if pid is None:
            return [], why
        proc = living(pid)
        if proc is None:
            return [], f"pid {pid} (from {getattr(process.pidfile, 'path', process.pidfile)}) is not running"
        if not runs_as(proc, uid):
            return [], f"pid {pid} (from {getattr(process.pidfile, 'path', process.pidfile)}) runs as another account"
        found = [proc]
    else:
        found = matching(re.compile(process.match or ""), uid, table)
    # Only a keeper that keeps something narrows the match: one whose child has died (it is recording
    # the exit) keeps nothing, and while a new keeper is forked and not yet titled it would otherwise
    # hide the copy that was just started (a restart read as a death).
    theirs = {p.pid for keeper in (keepers_of(process.name, home, table) if home is not None and found else [])
              for p in _descendants(keeper)}
    if theirs:
        found = [p for p in found if p.pid in theirs]
    if found:
        return found, ""
    return [], (f"no process of uid {uid} matches {process.match!r}" if process.pidfile is None
                else f"the pid in {getattr(process.pidfile, 'path', process.pidfile)} is not the one its keeper keeps")


def _descendants(proc: "psutil.Process") -> list["psutil.Process"]:
    import psutil
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def keeper_title(name: str, home: str | os.PathLike) -> str:
    """The title of the keeper of `name` (pulse.effects.keeper) for the Pulse at `home`."""
    return f"pulse: keep {name} ({home})"


def keepers_of(name: str, home: str | os.PathLike, table: Table | None = None) -> list["psutil.Process"]:
    """The live keepers of `name` for this home: Pulse's own account's, titled as keeper_title says
    (another account's process with that title keeps nothing of Pulse's)."""
    import psutil
    title, me, out = keeper_title(name, home), os.getuid(), []
    for pid, cmdline in cmdlines() if table is None else table:
        if " ".join(cmdline).strip() != title:
            continue
        try:        # read again through psutil, as one process: its pid may have been taken meanwhile
            proc = psutil.Process(pid)
            info = proc.as_dict(["cmdline", "uids"], ad_value=None)
        except psutil.NoSuchProcess:
            continue
        if " ".join(info["cmdline"] or []).strip() == title and info["uids"] is not None and info["uids"].real == me:
            out.append(proc)
    return out


def kept(name: str, home: str | os.PathLike, table: Table | None = None) -> list["psutil.Process"]:
    """The processes a keeper of `name` (for this home) is keeping: what Pulse last started."""
    import psutil
    out = []
    for proc in keepers_of(name, home, table):
        try:
            out += [c for c in children(proc) if living(c.pid)]
        except psutil.Error:
            pass
    return out


def children(proc: "psutil.Process") -> list["psutil.Process"]:
    """The children of `proc`, from the kernel's list of each of its threads (/proc/PID/task/TID/children)
    rather than psutil's read of every process's stat: a keeper is asked at each restart and at each
    look of the watcher at a dead process. psutil's own way where the kernel keeps no such list."""
    import psutil
    if not _kernel_lists_children():
        return proc.children()
    pids: set[int] = set()
    try:
        threads = os.listdir(f"/proc/{proc.pid}/task")
    except OSError:
        return []                       # gone
    for tid in threads:
        try:
            with open(f"/proc/{proc.pid}/task/{tid}/children", "rb") as f:
                pids.update(int(pid) for pid in f.read().split())
        except OSError:                 # that thread ended meanwhile
            continue
    if not proc.is_running():           # its pid now names another process: what was read is not its
        return []
    out = []
    for pid in sorted(pids):
        try:
            child = psutil.Process(pid)
            if child.ppid() == proc.pid:    # not a pid taken by another process since the read
                out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


_children_lists: bool | None = None


def _kernel_lists_children() -> bool:
    global _children_lists
    if _children_lists is None:
        _children_lists = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    return _children_lists
