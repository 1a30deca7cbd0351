"""A run's own cgroup: what makes an agent run one thing to the kernel, whatever its processes do.

A run's processes share a uid with the account's other runs, and can drop any mark Pulse gives them
(setsid, a cleared environment, a new name). The cgroup they were started in they cannot leave:
only root writes another cgroup's `cgroup.procs`, and every child is born in its parent's. So the
gate honours a run's token only from a process inside that run's cgroup (`holds`), and the run's
end freezes the cgroup and kills everything in it (`freeze_and_kill`), whatever it calls itself.

Where: beneath pulsed's own cgroup in each hierarchy (as /proc/self/cgroup names it), in
`pulse/<run id>`: inside whatever slice, scope or container limits pulsed, never beside it.
- cgroup v2 (/sys/fs/cgroup is cgroup2): one directory; memory, pids and cpu limits where those
  controllers can be enabled for it (a delegated subtree, or the root's), freezing and killing by
  cgroup.freeze / cgroup.kill, which need no controller.
- cgroup v1: one directory in each of the freezer, pids, memory and cpu hierarchies mounted here.
- Neither writable (not root, a read-only /sys/fs/cgroup): `create` returns None, the log says so
  once, and the caller falls back to rlimits and the environment mark (pulse.agents.runlimits).

A child joins before it execs (`joiner`: it writes "0", itself, into descriptors opened by the
parent), so nothing the run starts is ever outside it.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("pulse.executor")

ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("freezer", "pids", "memory", "cpu")
NAME = "pulse"                   # the runs' parent, beneath pulsed's own cgroup
CPU_PERIOD_US = 100_000
_told_none = False               # "no cgroup here" is logged once per process


# -- where the hierarchies are ------------------------------------------------------------------------------

def parse_membership(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup → {controller: path}; the v2 line (0::/path) under "", a named v1
    hierarchy (name=systemd) under its name."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in (parts[1].split(",") if parts[1] else [""]):
            out[controller] = parts[2]
    return out


def membership_of(pid: int | str) -> dict[str, str]:
    """The cgroups process `pid` is in ({} when it is gone)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return parse_membership(f.read())
    except OSError:
        return {}


def mounts(text: str | None = None) -> dict[str, Path]:
    """{controller: its v1 mount point} of the controllers Pulse uses, or {"": ROOT} when ROOT is
    the unified (v2) hierarchy. From /proc/self/mounts."""
    if text is None:
        with open("/proc/self/mounts") as f:
            text = f.read()
    found: dict[str, Path] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        where, fstype, options = Path(fields[1]), fields[2], fields[3].split(",")
        if fstype == "cgroup2" and where == ROOT:
            return {"": ROOT}
        if fstype == "cgroup":
            for controller in V1_CONTROLLERS:
                if controller in options:
                    found.setdefault(controller, where)
    return found


# -- one run's cgroup ----------------------------------------------------------------------------------------

@dataclass
class RunCgroup:
    """One run's cgroup. `dirs`: {controller ("" for v2): its directory}; `paths`: {controller: the
    path /proc/<pid>/cgroup shows for it}; `enforced`: the limits the kernel holds it to here
    (memory, pids, cpu), the others being the rlimits' (pulse.agents.runlimits)."""
    run: str
    dirs: dict[str, Path]
    paths: dict[str, str]
    enforced: set[str] = field(default_factory=set)

    @property
    def unified(self) -> bool:
        return "" in self.dirs

    @property
    def membership(self) -> tuple[tuple[str, str], ...]:
        """What the gate checks a peer against (RunIdentity.cgroup)."""
        return tuple(sorted(self.paths.items()))

    def add(self, pid: int) -> None:
        for d in self.dirs.values():
            (d / "cgroup.procs").write_text(str(pid))

    def joiner(self):
        """(a pre-exec function that puts the child in this cgroup, the descriptors to close after
        the fork). Opened here, written there: between fork and exec only os.write runs."""
        fds = [os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for d in self.dirs.values()]

        def join() -> None:
            for fd in fds:
                os.write(fd, b"0")          # "0": the writer itself
        return join, fds

    def members(self) -> set[int]:
        """The processes in it now (any hierarchy: they are the same processes)."""
        out: set[int] = set()
        for d in self.dirs.values():
            try:
                out.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return out

    def holds(self, pid: int) -> bool:
        return holds(self.membership, pid)

    def freeze_and_kill(self, timeout_s: float = 5.0) -> int:
        """Kill every process in it and wait until it is empty: frozen first (they cannot fork or
        flee while the kill goes round), then SIGKILL, then thawed so the kill lands. How many
        processes there were. Raises TimeoutError if any is still there at the timeout."""
        deadline = time.monotonic() + timeout_s
        killed: set[int] = set()
        if self.unified and (self.dirs[""] / "cgroup.kill").exists():
            killed |= self.members()
            _write(self.dirs[""] / "cgroup.kill", "1")
        else:
            freeze, thaw = self._freezer()
            if freeze is not None:
                freeze()
            while True:
                victims = self.members() - killed
                for pid in victims:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                killed |= victims
                # without a freezer a process may fork between reading the list and the kill: again
                if freeze is not None or not victims or time.monotonic() >= deadline:
                    break
            if thaw is not None:
                thaw()
        while self.members():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run {self.run}: processes {sorted(self.members())} outlived SIGKILL")
            for pid in self.members() - killed:      # forked before the freeze took: killed as well
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                killed.add(pid)
            time.sleep(0.01)
        return len(killed)

    def _freezer(self):
        """(freeze, thaw) of this host's freezer, or (None, None)."""
        if self.unified:
            state = self.dirs[""] / "cgroup.freeze"
            if not state.exists():
                return None, None
            return (lambda: _write(state, "1") and _await(self.dirs[""] / "cgroup.events", "frozen 1"),
                    lambda: _write(state, "0"))
        if "freezer" not in self.dirs:
            return None, None
        state = self.dirs["freezer"] / "freezer.state"
        return (lambda: _write(state, "FROZEN") and _await(state, "FROZEN"), lambda: _write(state, "THAWED"))

    def hit(self) -> str | None:
        """The limit the kernel enforced on it, if any: "memory" (the OOM killer killed in it),
        "pids" (a fork was refused at pids.max)."""
        memory = self.dirs.get("" if self.unified else "memory")
        if memory is not None and _counter(memory / ("memory.events" if self.unified else "memory.oom_control"),
                                           "oom_kill"):
            return "memory"
        pids = self.dirs.get("" if self.unified else "pids")
        if pids is not None and _counter(pids / "pids.events", "max"):
            return "pids"
        return None

    def remove(self, timeout_s: float = 2.0) -> None:
        """Its directories gone, and their `pulse` parent when no other run is in it. An rmdir may
        answer EBUSY a moment after the last process died: retried until the timeout."""
        deadline = time.monotonic() + timeout_s
        for d in self.dirs.values():
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or time.monotonic() >= deadline:
                        log.warning("run %s: its cgroup %s stays: %s", self.run, d, err.strerror)
                        break
                    time.sleep(0.02)
            try:
                os.rmdir(d.parent)       # the `pulse` parent, once its last run is gone
            except OSError:
                pass


def holds(membership: tuple[tuple[str, str], ...], pid: int | None) -> bool:
    """Whether process `pid` is inside the cgroup `membership` names, in every hierarchy of it."""
    if pid is None or not membership:
        return False
    now = membership_of(pid)
    return all(now.get(c) == path or (now.get(c) or "").startswith(path + "/") for c, path in membership)


def run_of(pid: int | None) -> str | None:
    """The id of the run whose cgroup (made by this process's kind: beneath its own cgroup) holds
    process `pid`, or None."""
    if pid is None:
        return None
    own, theirs = membership_of("self"), membership_of(pid)
    for controller in _mounts_once():
        base = f"{own.get(controller, '/').rstrip('/')}/{NAME}/"
        path = theirs.get(controller, "")
        if path.startswith(base) and path[len(base):]:
            return path[len(base):].split("/")[0]
    return None


_MOUNTS: dict[str, Path] | None = None


def _mounts_once() -> dict[str, Path]:
    global _MOUNTS
    if _MOUNTS is None:
        _MOUNTS = mounts()
    return _MOUNTS


def _write(path: Path, text: str) -> bool:
    try:
        path.write_text(text)
        return True
    except OSError as err:
        log.warning("%s: cannot write %r: %s", path, text, err.strerror)
        return False


def _await(path: Path, wanted: str, timeout_s: float = 2.0) -> bool:
    """Wait until `path` reads (or, for a keyed file, has the line) `wanted`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            text = path.read_text()
        except OSError:
            return False
        if text.strip() == wanted or wanted in text.splitlines():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _counter(path: Path, key: str) -> int:
    """The value of `key` in a flat keyed file (memory.oom_control, pids.events); 0 if absent."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


# -- making and finding one ----------------------------------------------------------------------------------

def run_dirs(run: str, where: dict[str, Path] | None = None) -> tuple[dict[str, Path], dict[str, str]]:
    """({controller: directory}, {controller: /proc path}) run `run`'s cgroup has, or would have:
    beneath this process's own cgroup, in `pulse/<run>`."""
    where = mounts() if where is None else where
    own = membership_of("self")
    dirs, paths = {}, {}
    for controller, mount in where.items():
        base = own.get(controller, "/")
        path = f"{base.rstrip('/')}/{NAME}/{run}"
        dirs[controller], paths[controller] = mount / path.lstrip("/"), path
    return dirs, paths


def create(run: str, limits, where: dict[str, Path] | None = None) -> RunCgroup | None:
    """A new cgroup for `run` with `limits` (memory_mb, pids, cpu_percent; 0: none), or None when
    this host lets Pulse make none (said once in the log). A limit the kernel cannot hold it to
    here is left out of `enforced`. `where`: the hierarchies (mounts()) to make it in."""
    global _told_none
    if not run or "/" in run or run.startswith("."):
        raise ValueError(f"{run!r} cannot name a cgroup")
    try:
        dirs, paths = run_dirs(run, where)
        made: dict[str, Path] = {}
        for controller, d in dirs.items():
            try:
                _mkdir(d)
            except OSError as err:
                log.debug("run %s: no %s cgroup: %s", run, controller or "v2", err)
                continue
            made[controller] = d
    except OSError as err:
        made, paths = {}, {}
        log.debug("run %s: no cgroup: %s", run, err)
    if not made:
        if not _told_none:
            _told_none = True
            log.warning("no cgroup can be made for agent runs here (cgroup v2 or v1 freezer/pids/memory/cpu, "
                        "writable): each run is bounded by rlimits and ended by its environment mark alone")
        return None
    group = RunCgroup(run, made, {c: paths[c] for c in made})
    try:
        group.enforced = _limit(group, limits)
    except BaseException:
        group.remove()
        raise
    return group


def find(run: str, where: dict[str, Path] | None = None) -> RunCgroup | None:
    """The cgroup run `run` left (its executor died while it ran), or None."""
    try:
        dirs, paths = run_dirs(run, where)
    except OSError:
        return None
    there = {c: d for c, d in dirs.items() if d.is_dir()}
    return RunCgroup(run, there, {c: paths[c] for c in there}) if there else None


def _mkdir(d: Path) -> None:
    """d, made by this process (an existing one is refused: it may hold another's processes);
    its `pulse` parent made if need be (and made again if a run's removal took it meanwhile)."""
    for _ in range(3):
        try:
            os.mkdir(d.parent, 0o755)
        except FileExistsError:
            pass
        try:
            os.mkdir(d, 0o755)
            return
        except FileNotFoundError:
            continue
    os.mkdir(d, 0o755)


def _limit(group: RunCgroup, limits) -> set[str]:
    enforced = set()
    if group.unified:
        d = group.dirs[""]
        _enable_controllers(d)
        wanted = {"memory": [("memory.max", limits.memory_mb * 1024 * 1024), ("memory.swap.max", 0)],
                  "pids": [("pids.max", limits.pids)],
                  "cpu": [("cpu.max", f"{limits.cpu_percent * CPU_PERIOD_US // 100} {CPU_PERIOD_US}")]}
        dirs = {name: d for name in wanted}
    else:
        wanted = {"memory": [("memory.limit_in_bytes", limits.memory_mb * 1024 * 1024),
                             ("memory.memsw.limit_in_bytes", limits.memory_mb * 1024 * 1024)],
                  "pids": [("pids.max", limits.pids)],
                  "cpu": [("cpu.cfs_period_us", CPU_PERIOD_US),
                          ("cpu.cfs_quota_us", limits.cpu_percent * CPU_PERIOD_US // 100)]}
        dirs = {name: group.dirs[name] for name in wanted if name in group.dirs}
    setting = {"memory": limits.memory_mb, "pids": limits.pids, "cpu": limits.cpu_percent}
    for name, d in dirs.items():
        if not setting[name]:
            continue                              # 0: no limit
        files = wanted[name]
        if not (d / files[0][0]).exists():
            continue                              # the controller is not there for it
        try:
            for i, (file, value) in enumerate(files):
                if i and not (d / file).exists():
                    continue                      # memsw, swap.max: only where swap is accounted
                (d / file).write_text(str(value))
        except OSError as err:                    # left to the rlimits' floor
            log.warning("run %s: its %s limit cannot be set in %s: %s", group.run, name, d, err.strerror)
            continue
        enforced.add(name)
    return enforced


def _enable_controllers(d: Path) -> None:
    """v2: memory, pids and cpu for the runs' cgroups, where the parents allow (a cgroup with
    processes of its own cannot pass controllers down, unless it is the root)."""
    for parent in (d.parent.parent, d.parent):
        available = set((parent / "cgroup.controllers").read_text().split()) if (parent / "cgroup.controllers").exists() else set()
        for name in ("memory", "pids", "cpu"):
            if name in available:
                try:
                    (parent / "cgroup.subtree_control").write_text(f"+{name}")
                except OSError:
                    pass
