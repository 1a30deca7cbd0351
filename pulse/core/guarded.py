"""The processes Pulse guards ([[process]]): how each is found, by the watcher and the executor alike.

By `pidfile` (a plain pid, or the `key` of a JSON file such as OpenClaw's lock file), or by `match`,
a regex over the full command line. A match never counts Pulse's own processes (pulsed, its
workers and keepers, whose titles begin "pulse:", and a running pulsectl): a `pgrep -f` or a
script that carries the pattern in its argv still can, so the watcher reports how many matched.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

    from pulse.core.config import PidFile, Process

PULSE_TITLE = "pulse:"
PULSE_PROGRAMS = ("pulsed", "pulsectl")
KEEPER_MODULE = "pulse.effects.keeper"      # a keeper before it has set its title carries its argv


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
    if cmdline[0].startswith(PULSE_TITLE) or KEEPER_MODULE in cmdline[1:3]:
        return True
    return any(os.path.basename(arg) in PULSE_PROGRAMS for arg in cmdline[:2])


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


def matching(pattern: re.Pattern) -> list["psutil.Process"]:
    """Live processes whose command line matches, Pulse's own left out, oldest first (a server's
    forked workers match too, and it is their parent that is the process)."""
    import psutil
    me, found = os.getpid(), []
    for proc, info in scan(["cmdline", "create_time", "status"]):
        cmdline = info["cmdline"] or []
        if proc.pid == me or info["status"] == psutil.STATUS_ZOMBIE or not cmdline or is_pulses_own(cmdline):
            continue
        if pattern.search(" ".join(cmdline)):
            found.append((info["create_time"] or 0, proc))
    return [proc for _, proc in sorted(found, key=lambda pair: pair[0])]


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


def find(process: "Process") -> tuple[list["psutil.Process"], str]:
    """(the live processes of `process`, the oldest first; why none), by its pidfile or match."""
    if process.pidfile is not None:
        pid, why = read_pidfile(process.pidfile)
        if pid is None:
            return [], why
        proc = living(pid)
        return ([proc], "") if proc else ([], f"pid {pid} (from {getattr(process.pidfile, 'path', process.pidfile)}) is not running")
    found = matching(re.compile(process.match or ""))
    return found, "" if found else f"no process matches {process.match!r}"


def keeper_title(name: str, home: str | os.PathLike) -> str:
    """The title of the keeper of `name` (pulse.effects.keeper) for the Pulse at `home`."""
    return f"pulse: keep {name} ({home})"


def kept(name: str, home: str | os.PathLike) -> list["psutil.Process"]:
    """The processes a keeper of `name` (for this home) is keeping: what Pulse last started."""
    import psutil
    title, out = keeper_title(name, home), []
    for proc, info in scan(["cmdline"]):
        if " ".join(info["cmdline"] or []).strip() == title:
            try:
                out += [c for c in proc.children() if living(c.pid)]
            except psutil.Error:
                pass
    return out
