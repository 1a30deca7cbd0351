"""What bounds one agent run ([[agent]] limits): its cgroup where there is one (pulse.agents.runcgroup),
rlimits as the floor, and a watch that ends the run the moment it goes over one.

- memory_mb: the cgroup's memory limit (no swap past it); an OOM kill in it ends the run, reason
  `memory`. No memory cgroup: RLIMIT_DATA per process.
- pids: the cgroup's pids.max; a refused fork (pids.events) ends the run, reason `pids`. No pids
  cgroup: RLIMIT_NPROC (per account, so times the agent's concurrency), only under an own account.
- cpu_percent: a CFS quota (100 = one core); a quota slows the run, it never ends it.
- disk_mb: what the run may add to its work directory and scratch directory, watched (a walk of
  both, never following a link) and ended at once when over, reason `disk`; RLIMIT_FSIZE as the
  floor for any one file it writes anywhere (the write past it kills the writer by SIGXFSZ).
0 turns a limit off. The same watch ends a run that fell silent ([[agent]] stall_s, pulse.agents.runstall),
reason `stalled`, and one whose telemetry reports spend or a loop past its agent's bounds
(pulse.agents.runguards), reason `over-budget` or `loop`.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import stat
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger("pulse.executor")

MB = 1024 * 1024
WATCH_EVERY_S = 0.25          # how often the kernel's counters are read
WALK_SHARE = 10               # a disk walk runs at most every WALK_SHARE × its own duration


def rlimits(limits, enforced: set[str], account: tuple[int, int] | None, concurrency: int) -> list[tuple[int, int]]:
    """(resource, limit) for the run's processes: the floor under what the cgroup enforces."""
    out = []
    if limits.disk_mb:
        out.append((resource.RLIMIT_FSIZE, limits.disk_mb * MB))
    if limits.memory_mb and "memory" not in enforced:
        out.append((resource.RLIMIT_DATA, limits.memory_mb * MB))
    if limits.pids and "pids" not in enforced and account is not None and account[0] != 0:
        out.append((resource.RLIMIT_NPROC, limits.pids * concurrency))    # counted per account, not per run
    return out


def preexec(join: Callable[[], None] | None, floor: Sequence[tuple[int, int]]) -> Callable[[], None]:
    """Between fork and exec: into the run's cgroup, then the rlimits (never raised above a hard
    limit pulsed itself was given)."""
    def setup() -> None:
        if join is not None:
            join()
        for which, value in floor:
            soft, hard = resource.getrlimit(which)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))
    return setup


def disk_bytes(paths: Sequence[str]) -> int:
    """The space the files under `paths` take (blocks, so a sparse file counts what it holds; each
    inode once), walked without following a link."""
    total, seen, todo = 0, set(), list(paths)
    while todo:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        todo.append(entry.path)
        except OSError:
            continue
    return total


class Watch:
    """Watches a running run against its limits, in a thread of its own: the first limit it goes
    over is `hit` ("memory", "pids", "disk", with `detail`), and `end` is called at once (the run's
    processes killed). `kernel_hit`: the cgroup's counters (RunCgroup.hit), or None."""

    def __init__(self, limits, dirs: Sequence[str], end: Callable[[], None],
                 kernel_hit: Callable[[], str | None] | None, guards: Sequence = (), facts=None):
        # guards: each a check() that gives (reason, detail) once the run must end (pulse.agents.runstall,
        # pulse.agents.runguards); facts: the run's telemetry facts they read (closed by this thread)
        self.limits, self.dirs, self.end, self.kernel_hit = limits, list(dirs), end, kernel_hit
        self.guards, self.facts = list(guards), facts
        self.hit: str | None = None
        self.detail = ""
        self.baseline = disk_bytes(self.dirs) if limits.disk_mb else 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="run-limits", daemon=True)

    def start(self) -> "Watch":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(10)

    def _watch(self) -> None:
        try:
            self._watch_limits()
        finally:
            if self.facts is not None:
                self.facts.close()            # its connection belongs to this thread

    def _watch_limits(self) -> None:
        next_walk = time.monotonic()
        while not self.stopping.wait(WATCH_EVERY_S):
            for guard in self.guards:
                if (ended := guard.check()) is not None:
                    self._over(*ended)
                    return
            over = self.kernel_hit() if self.kernel_hit is not None else None
            if over is not None:
                self._over(over, f"the run went over its {over} limit ({self._limit_text(over)})")
                return
            if self.limits.disk_mb and time.monotonic() >= next_walk:
                began = time.monotonic()
                added = disk_bytes(self.dirs) - self.baseline
                next_walk = time.monotonic() + WALK_SHARE * (time.monotonic() - began)
                if added > self.limits.disk_mb * MB:
                    self._over("disk", f"the run added {added // MB} MiB to {', '.join(self.dirs)}, over its "
                                       f"disk limit ({self.limits.disk_mb} MiB)")
                    return

    def _over(self, what: str, detail: str) -> None:
        self.hit, self.detail = what, detail
        try:
            self.end()
        except Exception as err:      # the run's own end tries again, and fails the run if it must
            log.warning("ending a run over its %s limit: %s", what, err)

    def _limit_text(self, what: str) -> str:
        return {"memory": f"{self.limits.memory_mb} MiB", "pids": f"{self.limits.pids} processes"}.get(what, "")

    def verdict(self, code: int | None) -> tuple[str, str] | None:
        """(reason, error) when the run ended over a limit; the leader killed by SIGXFSZ went over
        RLIMIT_FSIZE (disk)."""
        if self.hit is None and self.kernel_hit is not None:
            over = self.kernel_hit()           # an OOM kill or a refused fork in its last moments
            if over is not None:
                self.hit, self.detail = over, f"the run went over its {over} limit ({self._limit_text(over)})"
        if self.hit is None and code == -signal.SIGXFSZ and self.limits.disk_mb:
            self.hit, self.detail = "disk", f"a file of the run reached its disk limit ({self.limits.disk_mb} MiB)"
        return (self.hit, self.detail) if self.hit is not None else None
