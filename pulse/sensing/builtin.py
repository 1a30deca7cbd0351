"""The built-in (P0) watchers: system-resource, process-alive, process-memory, health, config, network,
error-log, file, and fresh (pulse.sensing.freshness).

Each is a `pulse.core.plugins.Watcher` with one key. `collect()` runs in a pool thread
of the watcher process (it may block: DNS, a dead NFS mount, a slow /proc);
`should_wake()` runs on its main loop and is a pure function of the window.
Every `should_wake` here fires on an *edge*, not on a level: a host pinned at
96 % CPU, a process that stays dead, a target that stays down ring the tick
once when they change, not at every sample (the tick sees the level in its
snapshot anyway).
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterable

import psutil

from pulse.core import config as configmod
from pulse.core import dirscan, guarded, procs, rotation, safepath
from pulse.core.home import inside
from pulse.core.plugins import Watcher
from pulse.core.wire.enginerpc import Vital
from pulse.sensing.freshness import FreshWatch
from pulse.store import objects


def builtin_watchers(config: configmod.WatcherConfig, home: Path | None = None) -> list[Watcher]:
    """One watcher per key: the host, each configured process, network target, log file, [[watch.file]]
    and [[watch.fresh]] and [[watch.dir]]."""
    interval = config.timings.watcher_interval_ms
    alive = [ProcessAlive(p, interval, home) for p in config.process]
    return [
        SystemResource(config.watch, interval),
        *alive,
        *(ProcessMemory(a, interval) for a in alive),
        *(HealthProbe(p) for p in config.process if p.health is not None),
        *(ConfigFiles(p, interval) for p in config.process if p.config),
        *(Network(t, interval) for t in config.watch.network),
        *(ErrorLog(e, interval) for e in config.watch.error_log),
        *(WatchedFile(f, interval, home) for f in config.watch.file),
        *(FreshWatch(f, interval) for f in config.watch.fresh),
        *(WatchedDir(d, interval, home) for d in config.watch.dir),
    ]


def previous_and_latest(window: list[Vital]) -> tuple[dict | None, dict | None]:
    """The data of the last two samples in the window (oldest first); None where there is none."""
    latest = window[-1].data if window else None
    previous = window[-2].data if len(window) >= 2 else None
    return previous, latest


# -- system-resource -----------------------------------------------------------------------------------

CPU_FIRST_SAMPLE_S = 0.2   # cpu % is a rate: the first sample measures over this, in its thread


def cpu_busy_and_total(times: Any) -> tuple[float, float]:
    """psutil's own formula: guest time is already counted in user; idle and iowait are not busy."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


def cpu_pct(before: Any, after: Any) -> float:
    busy0, total0 = cpu_busy_and_total(before)
    busy1, total1 = cpu_busy_and_total(after)
    if total1 <= total0:
        return 0.0
    return round(min(100.0, max(0.0, (busy1 - busy0) / (total1 - total0) * 100)), 1)


def over(data: dict | None, field: str, limit: float) -> bool:
    value = None if data is None else data.get(field)
    return isinstance(value, (int, float)) and value > limit


def crossed(previous: dict | None, latest: dict | None, thresholds: dict[str, float]) -> list[str]:
    """Fields over their threshold now and not in the previous sample (none: a first sample counts)."""
    return [f for f, limit in thresholds.items() if over(latest, f, limit) and not over(previous, f, limit)]


class SystemResource(Watcher):
    """cpu, memory, swap and disk use, and the load average.

    Wakes the tick when cpu_pct, memory_pct or disk_pct goes over its threshold
    (`[watch]`) between the previous sample and the latest: an edge, so a host
    that stays over rings once, not every interval."""

    name = key = "system-resource"

    def __init__(self, watch: configmod.Watch, interval_ms: int):
        self.interval_ms = interval_ms
        self.disk_path = watch.disk_path
        self.thresholds = {"cpu_pct": watch.cpu_pct, "memory_pct": watch.memory_pct, "disk_pct": watch.disk_pct}
        self._cpu_times: Any = None   # only the (one) collect thread of this watcher touches it

    def collect(self) -> dict[str, Any]:
        before = self._cpu_times
        if before is None:
            before = psutil.cpu_times()
            time.sleep(CPU_FIRST_SAMPLE_S)
        self._cpu_times = psutil.cpu_times()
        data: dict[str, Any] = {
            "cpu_pct": cpu_pct(before, self._cpu_times),
            "cpus": psutil.cpu_count(),
            "load": [round(x, 2) for x in os.getloadavg()],
            "memory_pct": psutil.virtual_memory().percent,
            "swap_pct": psutil.swap_memory().percent,
            "disk_path": self.disk_path,
        }
        try:   # a missing or broken disk_path costs the disk figure, not the whole sample
            data["disk_pct"] = psutil.disk_usage(self.disk_path).percent
        except OSError as err:
            data["disk_pct"], data["disk_error"] = None, f"{type(err).__name__}: {err}"
        return data

    def should_wake(self, window: list[Vital]) -> bool:
        return bool(crossed(*previous_and_latest(window), self.thresholds))


# -- process-alive ---------------------------------------------------------------------------------------

RECHECK_INTERVAL_MS = 100   # after a death, sample this often ...
RECHECK_FOR_S = 10          # ... for this long


def open_pidfd(pid: int, since: float | None) -> int | None:
    """A pidfd for `pid`, if it is still the process that started at `since` (pids are reused)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:   # gone already (ProcessLookupError), or no pidfd here: the interval and rechecks remain
        return None
    try:
        if since is not None and psutil.Process(pid).create_time() != since:
            os.close(fd)
            return None
    except psutil.NoSuchProcess:
        pass   # it died after the pidfd was opened: the pidfd is readable, which is what we want
    return fd


def precise_start(create_time: float) -> float:
    """A process's start as a wall time to the clock tick: psutil's create_time counts from /proc/stat's
    btime, whole seconds, so it may read up to a second early; /proc/uptime has centiseconds."""
    try:
        with open("/proc/uptime") as f:
            booted = time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return create_time
    return round(create_time - psutil.boot_time() + booted, 3)


def died(window: list[Vital]) -> bool:
    """The latest sample is dead and the previous one (if the window has one) was alive."""
    previous, latest = previous_and_latest(window)
    return latest is not None and not latest.get("alive") and (previous is None or bool(previous.get("alive")))


class ProcessAlive(Watcher):
    """A critical process from `[[process]]`, found by pidfile or by a regex over its command line.

    Its death is learned from the kernel: while it lives, the watcher holds a pidfd
    (its `event_fd`), which the runner polls; the pidfd turns readable the moment
    the process exits, and the runner samples at once and rings the tick.

    After a death the watcher samples every RECHECK_INTERVAL_MS for RECHECK_FOR_S:
    whoever restarts the process (an executor, systemd, an operator) usually does
    so within seconds, and the new process's pidfd should be armed then, not at
    the next interval (a minute, on a quiet host), or a second quick death would
    again be learned late."""

    def __init__(self, process: configmod.Process, interval_ms: int, home: Path | None = None):
        self.process = process
        self.home = home
        self.name = self.key = f"process-alive:{process.name}"
        self._interval_ms = interval_ms
        self._last_pid: int | None = None      # the pid last seen alive: its death's recorded exit names it
        self._recheck_until = 0.0
        self._was_alive: bool | None = None
        self._dead_since: float | None = None  # first sample that found it gone (collect's thread only)
        self.event_fd: int | None = None       # a pidfd of the live process; main thread only
        self._pidfd_pid: int | None = None
        self.seen: dict[str, Any] | None = None   # the last sample: alive, pid (for pulsectl status)
        self.sighting: tuple[int, float | None] | None = None   # (pid, start time) of the live process, if any

    @property
    def interval_ms(self) -> int:
        return RECHECK_INTERVAL_MS if time.monotonic() < self._recheck_until else self._interval_ms

    def collect(self) -> dict[str, Any]:
        # "Not found" is true as of when the look began: the sample's ts is stamped when the collect
        # returns, and two scans of every process can take seconds on a loaded host, long enough for a
        # restart to start the process and be acked meanwhile (processWatchdog compares `looked_at`).
        looked = time.time()
        table = list(guarded.cmdlines())    # one look at every process serves both questions
        found, why = guarded.find(self.process, self.home, table)
        if not found and self.home is not None:
            # What Pulse last started, while its pidfile is not written yet (OpenClaw writes its lock
            # 5-9 s after the start, Hermes its pid 1-2 s after) or its title is changing: alive.
            found = guarded.kept(self.process.name, self.home, table)
        if not found:
            self._dead_since = self._dead_since or looked
            return {"alive": False, "pid": None, "reason": why, "dead_since": self._dead_since,
                    "last_pid": self._last_pid, "looked_at": looked}
        proc = found[0]
        try:
            since = proc.create_time()
        except psutil.Error:            # gone since it was found: the next sample says so
            since = None
        self._dead_since, self._last_pid = None, proc.pid
        data = {"alive": True, "pid": proc.pid, "since": since}
        if since is not None:   # `since` names the process (its pidfd is checked against it); this says when
            data["started"] = precise_start(since)
        if self.process.match is not None:
            data["matches"] = len(found)     # more than one: the pattern may be taking another process for it
        return data

    def after_sample(self, data: dict[str, Any]) -> None:
        """On the main thread: hold a pidfd on the live process, drop it when it is gone or replaced."""
        alive, pid = bool(data.get("alive")), data.get("pid")
        self.seen = {"alive": alive, "pid": pid, **({"matches": data["matches"]} if "matches" in data else {})}
        self.sighting = (pid, data.get("since")) if alive else None
        if self.event_fd is not None and (not alive or pid != self._pidfd_pid):
            self._close_pidfd()
        if alive and self.event_fd is None:
            self.event_fd = open_pidfd(pid, data.get("since"))
            self._pidfd_pid = pid if self.event_fd is not None else None
            if self.event_fd is None:   # it died (or was replaced) between collect and now: look again soon
                self._recheck_until = time.monotonic() + RECHECK_FOR_S
        if self._was_alive and not alive:
            self._recheck_until = time.monotonic() + RECHECK_FOR_S
        self._was_alive = alive

    def should_wake(self, window: list[Vital]) -> bool:
        return died(window)

    def _close_pidfd(self) -> None:
        fd, self.event_fd, self._pidfd_pid = self.event_fd, None, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self._close_pidfd()


# -- process-memory --------------------------------------------------------------------------------------

MB = 1024 * 1024      # rss_mb and max_mb are mebibytes, as ps, top and psutil's users count them


def tree_rss(proc: psutil.Process) -> tuple[int, int]:
    """(bytes, processes): the summed RSS of `proc` and every descendant. Shared pages count once per
    process that maps them, as PM2's and monit's totals do (PSS would need smaps: too slow to read
    every interval). A descendant that exits while we look is left out."""
    total = proc.memory_info().rss
    try:
        children = proc.children(recursive=True)
    except psutil.Error:
        children = []
    counted = 1
    for child in children:
        try:
            total += child.memory_info().rss
            counted += 1
        except psutil.Error:
            pass
    return total, counted


def measure_tree(pid: int, since: float | None) -> dict[str, Any]:
    """The memory sample of the process `pid` that started at `since` (pids are reused)."""
    try:
        proc = psutil.Process(pid)
        if since is not None and proc.create_time() != since:
            return {"pid": pid, "rss_mb": None, "reason": "replaced by another process"}
        rss, processes = tree_rss(proc)
    except psutil.NoSuchProcess:
        return {"pid": pid, "rss_mb": None, "reason": "gone"}
    except psutil.AccessDenied as err:
        return {"pid": pid, "rss_mb": None, "reason": f"access denied: {err}"}
    return {"pid": pid, "since": since, "rss_mb": round(rss / MB, 1), "processes": processes}


def over_in_a_row(window: list[Vital], max_mb: float) -> int:
    """Trailing samples of the latest sample's pid whose rss_mb is above `max_mb`."""
    n, pid = 0, window[-1].data.get("pid") if window else None
    for sample in reversed(window):
        rss = sample.data.get("rss_mb")
        if sample.data.get("pid") != pid or not isinstance(rss, (int, float)) or rss <= max_mb:
            break
        n += 1
    return n


class ProcessMemory(Watcher):
    """The memory of a critical process's tree (the process and all its descendants: a gateway's
    workers and the tools it spawned), key `process-memory:<process>`: rss_mb, the pid, how many
    processes were counted. It measures the process its `ProcessAlive` sibling last found (its pid
    and start time), so a `match` costs no second scan of every command line on the host.

    With a `[[process]] memory` ceiling, it wakes the tick on the sample that makes `for_samples`
    in a row above `max_mb` (an edge: once), so the restart does not wait for the tick's period."""

    def __init__(self, alive: ProcessAlive, interval_ms: int):
        self.alive = alive
        self.memory = alive.process.memory
        self.name = self.key = f"process-memory:{alive.process.name}"
        self.interval_ms = interval_ms
        self.rss_mb: float | None = None      # the last sample's (for pulsectl status); main thread only

    def collect(self) -> dict[str, Any]:
        sighting = self.alive.sighting        # replaced whole by the main thread: read once
        if sighting is None:
            return {"pid": None, "rss_mb": None, "reason": "not running"}
        return measure_tree(*sighting)

    def after_sample(self, data: dict[str, Any]) -> None:
        self.rss_mb = data.get("rss_mb")

    def should_wake(self, window: list[Vital]) -> bool:
        return self.memory is not None and over_in_a_row(window, self.memory.max_mb) == self.memory.for_samples


# -- health ----------------------------------------------------------------------------------------------

HEALTH_OUTPUT_CHARS = 300       # of a probe argv's output, kept in the vital


def probe_url(url: str, timeout_s: float) -> dict[str, Any]:
    """GET `url` (loopback, usually): healthy when it answers below 400."""
    t0 = time.monotonic()
    data: dict[str, Any] = {"ok": False, "status": None, "error": None}
    request = urllib.request.Request(url, method="GET", headers={"User-Agent": "pulse-health"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data["status"] = response.status
    except urllib.error.HTTPError as err:
        data.update(status=err.code, error=f"http {err.code} {err.reason}")
    except (OSError, http.client.HTTPException, ValueError) as err:   # refused, timeout, garbage
        data["error"] = f"{getattr(err, 'reason', err)}"
    data["ok"] = data["status"] is not None and data["status"] < 400
    data["latency_ms"] = elapsed_ms(t0)
    return data


def probe_argv(argv: list[str], timeout_s: float) -> dict[str, Any]:
    """Run `argv` (its own process group, dying with the watcher): healthy when it exits 0."""
    t0 = time.monotonic()
    try:
        proc = procs.start_child(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as err:
        return {"ok": False, "code": None, "error": f"cannot start {argv[0]!r}: {err.strerror or err}",
                "latency_ms": elapsed_ms(t0)}
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        error = None if proc.returncode == 0 else f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        output, error = b"", f"no verdict within {timeout_s:g} s"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)    # leftovers, or the whole probe at the timeout
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    code = proc.returncode if error is None or error.startswith("exit") else None
    return {"ok": error is None, "code": code, "error": error, "latency_ms": elapsed_ms(t0),
            "output": output.decode("utf-8", "replace")[-HEALTH_OUTPUT_CHARS:]}


def too_slow(data: dict[str, Any], max_latency_ms: float | None) -> dict[str, Any]:
    """A probe that passed, but slower than max_latency_ms, failed: a gateway whose event loop is
    saturated still answers /health, in seconds, long before it stops answering at all."""
    latency = data.get("latency_ms")
    if max_latency_ms is not None and data.get("ok") and isinstance(latency, (int, float)) and latency > max_latency_ms:
        data.update(ok=False, slow=True, error=f"answered in {latency:.0f} ms, over max_latency_ms {max_latency_ms:g}")
    return data


class HealthProbe(Watcher):
    """`[[process]] health`: is the process any use, not only alive (OpenClaw's /readyz, an LLM
    proxy's health URL, `openclaw health --json`). Key `health:<process>`, one probe every
    `every_s`. Wakes the tick when a probe flips ok and at every failed probe (so at most once
    per every_s): processWatchdog counts the failures in a row and must not wait for the tick's
    period to see the one that reaches `failures`."""

    def __init__(self, process: configmod.Process):
        self.health = process.health
        self.name = self.key = f"health:{process.name}"
        self.interval_ms = int(self.health.every_s * 1000)
        self.timeout_s = self.health.timeout_s + 2     # the probe's own timeout, then the runner calls it hung

    def collect(self) -> dict[str, Any]:
        if self.health.url is not None:
            data = probe_url(self.health.url, self.health.timeout_s)
        else:
            data = probe_argv(list(self.health.argv), self.health.timeout_s)
        return too_slow(data, self.health.max_latency_ms)

    def should_wake(self, window: list[Vital]) -> bool:
        return ok_changed(window) or (bool(window) and not window[-1].data.get("ok", True))


# -- config ----------------------------------------------------------------------------------------------

def config_digests(data: dict | None) -> dict[str, str | None] | None:
    """path → sha256 of each file of a config sample (None: missing or unreadable)."""
    if data is None:
        return None
    return {path: state.get("sha256") for path, state in (data.get("files") or {}).items()}


class ConfigFiles(Watcher):
    """`[[process]] config`: each file's sha256, size and ctime, key `config:<process>`. processWatchdog
    compares them with the known-good copies it kept. A missing file has `missing_since`: the first
    sample of this watcher that found it gone (a deleted file has no ctime to say when). Wakes the tick
    when any file's content changes."""

    def __init__(self, process: configmod.Process, interval_ms: int):
        self.paths = list(process.config)
        self.name = self.key = f"config:{process.name}"
        self.interval_ms = interval_ms
        self._missing_since: dict[str, float] = {}   # only the (one) collect thread of this watcher touches it

    def collect(self) -> dict[str, Any]:
        files = {}
        for path in self.paths:
            state = objects.file_state(path)
            if state.get("missing"):
                state["missing_since"] = self._missing_since.setdefault(path, time.time())
            else:
                self._missing_since.pop(path, None)
            files[path] = state
        return {"files": files}

    def should_wake(self, window: list[Vital]) -> bool:
        previous, latest = previous_and_latest(window)
        return previous is not None and config_digests(previous) != config_digests(latest)


# -- network ---------------------------------------------------------------------------------------------

def check_target(target: configmod.NetworkTarget) -> dict[str, Any]:
    """DNS resolution of the host (the url's host if no host is set), then an HTTP GET of the url.

    ok: the name resolves and, if a url is set, it answers below 400 (redirects followed).
    getaddrinfo has no timeout of its own: the runner's timeout_s reports it hung."""
    host = target.host or urllib.parse.urlsplit(target.url).hostname
    data: dict[str, Any] = {"ok": False, "dns_ok": None, "http_status": None, "latency_ms": None, "error": None}
    t0 = time.monotonic()
    if host:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            data["dns_ok"] = True
        except (OSError, UnicodeError) as err:   # socket.gaierror is an OSError; an unencodable name a UnicodeError
            data.update(dns_ok=False, error=f"dns: {err}", latency_ms=elapsed_ms(t0))
            return data
    if target.url:
        request = urllib.request.Request(target.url, method="GET", headers={"User-Agent": "pulse-watcher"})
        try:
            with urllib.request.urlopen(request, timeout=target.timeout_s) as response:
                data["http_status"] = response.status
        except urllib.error.HTTPError as err:
            data.update(http_status=err.code, error=f"http: {err.code} {err.reason}")
        except (OSError, http.client.HTTPException, ValueError) as err:   # refused, timeout, TLS, garbage, bad url
            data["error"] = f"http: {getattr(err, 'reason', err)}"
    data["latency_ms"] = elapsed_ms(t0)
    data["ok"] = data["dns_ok"] is not False and (not target.url or (data["http_status"] or 999) < 400)
    return data


def elapsed_ms(t0: float) -> float:
    return round((time.monotonic() - t0) * 1000, 1)


def ok_changed(window: list[Vital]) -> bool:
    """ok flipped between the previous and the latest sample; with no previous one, up is assumed."""
    previous, latest = previous_and_latest(window)
    if latest is None:
        return False
    return bool(latest.get("ok")) != (True if previous is None else bool(previous.get("ok")))


class Network(Watcher):
    """An outbound target from `[[watch.network]]`. A fresh install configures none.
    Wakes the tick when the target goes down or comes back."""

    def __init__(self, target: configmod.NetworkTarget, interval_ms: int):
        self.target = target
        self.name = self.key = f"network:{target.name}"
        self.interval_ms = interval_ms
        self.timeout_s = 2 * target.timeout_s + 1   # DNS and HTTP may each take up to the target's timeout

    def collect(self) -> dict[str, Any]:
        return check_target(self.target)

    def should_wake(self, window: list[Vital]) -> bool:
        return ok_changed(window)


# -- error-log -------------------------------------------------------------------------------------------

MAX_READ_BYTES = 8 * 1024 * 1024   # per sample; the rest is read at the next one
KEPT_LINES = 5                     # matched lines a vital carries, the newest ...
KEPT_LINE_CHARS = 300              # ... each cut to this


class Tail:
    """Lines appended to a file, followed by path across rotation and truncation.

    The first read starts at the end of the file: history is not news. A file that
    appears later (or replaces a rotated one) is read from its start. On rotation
    (the path now names another inode) the old file is read to its end first, so
    lines written just before the rename are not lost. Truncation is seen as a size
    below our offset; a file truncated and then refilled past our offset between
    two reads cannot be told from one that grew (as with `tail -F`). A last line
    without its newline waits for it (or for a rotation)."""

    def __init__(self, path: Path):
        self.path = path
        self.file = None
        self.identity: tuple[int, int] | None = None
        self.partial = b""
        self.started = False

    def read_lines(self) -> list[bytes]:
        lines = self._read_more() if self.file is not None else []
        try:
            # never through a link another account placed (pulse.core.safepath): an agent's log
            # directory swapped for a link to root's must not feed root's lines into the vitals
            fd = safepath.open_readable(str(self.path))
        except (FileNotFoundError, safepath.Refused):
            self.started = True   # rotated away and not yet recreated: keep the old file until it is
            return lines
        st = os.fstat(fd)
        if self.identity != (st.st_dev, st.st_ino):
            at_end = not self.started
            lines += self._finish_partial()
            self._reopen(fd, at_end)
            lines += self._read_more()
        else:
            os.close(fd)
            if st.st_size < self.file.tell():
                self.file.seek(0)
                self.partial = b""
                lines += self._read_more()
        self.started = True
        return lines

    def _reopen(self, fd: int, at_end: bool) -> None:
        self.close()
        self.file = os.fdopen(fd, "rb")
        st = os.fstat(self.file.fileno())
        self.identity = (st.st_dev, st.st_ino)
        if at_end:
            self.file.seek(0, os.SEEK_END)

    def _read_more(self) -> list[bytes]:
        chunk = self.file.read(MAX_READ_BYTES)
        if not chunk:
            return []
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        return lines

    def _finish_partial(self) -> list[bytes]:
        line, self.partial = self.partial, b""
        return [line] if line else []

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def count_keywords(lines: Iterable[bytes], keywords: list[str]) -> dict[str, Any]:
    """matches: lines with at least one keyword; by_keyword: lines containing each keyword
    (case-sensitive); lines: the last few matched lines, cut."""
    needles = [(k, k.encode()) for k in keywords]
    by_keyword = {k: 0 for k in keywords}
    matched: list[bytes] = []
    read = 0
    for line in lines:
        read += 1
        hits = [k for k, needle in needles if needle in line]
        for k in hits:
            by_keyword[k] += 1
        if hits:
            matched.append(line)
    kept = [line.decode("utf-8", "replace").rstrip("\r")[:KEPT_LINE_CHARS] for line in matched[-KEPT_LINES:]]
    return {"matches": len(matched), "by_keyword": by_keyword, "lines": kept, "lines_read": read}


class ErrorLog(Watcher):
    """A log file from `[[watch.error_log]]`: keyword matches since the previous sample.
    Wakes the tick whenever the newest sample has matches."""

    def __init__(self, log: configmod.ErrorLogWatch, interval_ms: int):
        self.name = self.key = f"error-log:{log.name}"
        self.path = Path(log.path)
        self.keywords = list(log.keywords)
        self.interval_ms = interval_ms
        self.tail = Tail(self.path)   # only the (one) collect thread of this watcher touches it

    def collect(self) -> dict[str, Any]:
        data = count_keywords(self.tail.read_lines(), self.keywords)
        data["path"] = str(self.path)
        data["exists"] = self.path.exists()
        return data

    def should_wake(self, window: list[Vital]) -> bool:
        return bool(window) and window[-1].data.get("matches", 0) > 0

    def close(self) -> None:
        self.tail.close()


# -- file ------------------------------------------------------------------------------------------------

MB = 1024 * 1024
LISTED_FILES = 50                  # a sample lists this many matching files at most, the largest first
NOT_PULSES_TO_TRIM = "inside the Pulse home"   # why a matching file is never rotated or truncated


def regular_files(pattern: str) -> list[tuple[str, int]]:
    """(path, size) of each regular file the glob matches: not a symlink (never followed, nor a
    directory that is one: pulse.core.safepath), a directory or a device, nor a copy a rotation
    keeps. A file gone between the glob and its lstat is simply not there."""
    return [(path, st.st_size) for path, st, _ in safepath.regular_files(pattern) if not rotation.is_copy(path)]


def over_max(data: dict | None) -> set[str]:
    """The files of a file sample that are over its max_bytes."""
    if data is None:
        return set()
    limit = data.get("max_bytes", 0)
    return {f["path"] for f in data.get("files", []) if f.get("bytes", 0) > limit}


class WatchedFile(Watcher):
    """A `[[watch.file]]` glob: the size of every regular file it matches (key `file:<name>`),
    the largest first, so fileGuard sees which are over max_mb and resourceGuard which to trim
    first when the disk is high. A file inside the Pulse home is marked `refused`: Pulse never
    trims its own stores or logs. Wakes the tick when a file goes over max_mb (an edge: a file that
    stays over rings once, and again only after it was trimmed and grew back)."""

    def __init__(self, watch: configmod.FileWatch, interval_ms: int, home: Path | None = None):
        self.watch, self.home = watch, home
        self.name = self.key = f"file:{watch.name}"
        self.interval_ms = interval_ms
        self.max_bytes = int(watch.max_mb * MB)

    def collect(self) -> dict[str, Any]:
        found = sorted(regular_files(self.watch.path), key=lambda f: (-f[1], f[0]))
        files = []
        for path, size in found[:LISTED_FILES]:
            entry: dict[str, Any] = {"path": path, "bytes": size}
            if self.home is not None and inside(path, self.home):
                entry["refused"] = NOT_PULSES_TO_TRIM
            files.append(entry)
        return {"pattern": self.watch.path, "max_bytes": self.max_bytes, "action": self.watch.action,
                "matched": len(found), "total_bytes": sum(size for _, size in found), "files": files,
                "over": sum(1 for _, size in found if size > self.max_bytes)}

    def should_wake(self, window: list[Vital]) -> bool:
        previous, latest = previous_and_latest(window)
        return bool(over_max(latest) - over_max(previous))


# -- dir -------------------------------------------------------------------------------------------------

LISTED_DIRS = 50                   # a sample lists every directory over a bound, and this many others at most
NOT_PULSES_DIR = "the Pulse home, inside it, or holding it"


def dir_sample(path: str, bounds: dirscan.Bounds, home: Path | None, now: float) -> dict[str, Any]:
    """One directory: its files, their bytes, the oldest mtime, the bounds they break; or why not read."""
    if dirscan.touches_home(path, home):
        return {"path": path, "refused": NOT_PULSES_DIR}
    try:
        top = safepath.open_dir(path)
    except safepath.Refused as err:
        return {"path": path, "refused": str(err)}
    except OSError as err:
        return {"path": path, "error": err.strerror or str(err)}
    try:
        found = dirscan.files(top)
    finally:
        os.close(top.fd)
    return {"path": path, "files": len(found), "bytes": sum(e.size for e in found),
            "oldest": min((e.mtime for e in found), default=None), "over": dirscan.over(found, bounds, now)}


class WatchedDir(Watcher):
    """A `[[watch.dir]]` glob of directories: for each, its regular files however deep (never
    through a link), their total size and the oldest mtime, and which bounds they break (key
    `dir:<name>`), so dirGuard trims the oldest of one over a bound. A directory that is the Pulse
    home, inside it, or holds it is marked `refused`. Wakes the tick when a directory goes over a
    bound (an edge, as for a watched file)."""

    def __init__(self, watch: configmod.DirWatch, interval_ms: int, home: Path | None = None):
        self.watch, self.home = watch, home
        self.name = self.key = f"dir:{watch.name}"
        self.interval_ms = interval_ms
        self.bounds = dirscan.bounds_of(watch)

    def collect(self) -> dict[str, Any]:
        now = time.time()
        found = dirscan.matched_dirs(self.watch.path)
        every = [dir_sample(path, self.bounds, self.home, now) for path in found]
        acted_on = [d for d in every if d.get("over") or d.get("refused")]
        rest = [d for d in every if not (d.get("over") or d.get("refused"))]
        read = [d for d in every if "files" in d]
        return {"pattern": self.watch.path, "max_bytes": self.bounds.max_bytes, "max_files": self.bounds.max_files,
                "max_age_s": self.bounds.max_age_s, "oldest": self.watch.oldest, "matched": len(found),
                "files": sum(d["files"] for d in read), "bytes": sum(d["bytes"] for d in read),
                "oldest_mtime": min((d["oldest"] for d in read if d["oldest"] is not None), default=None),
                "over": len([d for d in every if d.get("over")]), "refused": len([d for d in every if d.get("refused")]),
                "dirs": acted_on + rest[:LISTED_DIRS]}

    def should_wake(self, window: list[Vital]) -> bool:
        previous, latest = previous_and_latest(window)
        return bool(dirs_over(latest) - dirs_over(previous))


def dirs_over(data: dict | None) -> set[str]:
    """The directories of a dir sample that break a bound."""
    return {d["path"] for d in (data or {}).get("dirs", []) if d.get("over")}
