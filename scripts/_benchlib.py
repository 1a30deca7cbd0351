"""Small helpers for the benchmark scripts: process bookkeeping, /proc readers, statistics.

Nothing here imports Pulse: the benchmarks treat pulsed, supervisord and circusd
as black boxes started from their console scripts.
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Callable, Iterable, Sequence, TypeVar

import psutil

T = TypeVar("T")
MiB = 1024 * 1024


def log(message: str) -> None:
    """Progress goes to stderr, so stdout carries only the figures."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- waiting ---------------------------------------------------------------------------------------

class Timeout(Exception):
    pass


def wait_until(probe: Callable[[], T | None], timeout: float, interval: float = 0.01, what: str = "condition") -> T:
    """Call `probe` until it returns something truthy; raise Timeout after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Timeout(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# -- processes: everything we start is tracked, and killed by pid at the end -----------------------

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def die_with_us() -> None:
    """preexec_fn: the child gets SIGKILL if this (main) thread dies, so nothing outlives a killed bench."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Tracker:
    """Remembers (pid, create_time) of every process the bench started or saw being started for it.

    `cleanup()` stops the Popen roots gracefully (SIGTERM, bounded wait, SIGKILL), then SIGKILLs any
    tracked pid that still belongs to the same process (create_time matches: pid reuse is ruled out).
    """

    def __init__(self) -> None:
        self.procs: dict[int, float] = {}
        self.roots: list[tuple[subprocess.Popen, float]] = []   # (popen, grace seconds)

    def add_root(self, proc: subprocess.Popen, grace: float = 10.0) -> subprocess.Popen:
        self.roots.append((proc, grace))
        self.add(proc.pid)
        return proc

    def add(self, pid: int) -> None:
        if pid in self.procs:
            return
        try:
            self.procs[pid] = psutil.Process(pid).create_time()
        except psutil.Error:
            pass

    def add_tree(self, pid: int) -> list[int]:
        """Track `pid` and all its descendants; returns their pids (root first)."""
        pids = [pid]
        try:
            pids += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            pass
        for p in pids:
            self.add(p)
        return pids

    def same(self, pid: int) -> psutil.Process | None:
        """The tracked process `pid` if it still exists (same create_time), else None."""
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - self.procs[pid]) < 0.02 and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
        except (psutil.Error, KeyError):
            pass
        return None

    def stop_root(self, proc: subprocess.Popen, grace: float = 10.0) -> int | None:
        """SIGTERM, wait up to `grace`, SIGKILL; returns the exit code (None if it had to be killed)."""
        if proc.poll() is None:
            self.add_tree(proc.pid)
            try:
                proc.send_signal(signal.SIGTERM)
                return proc.wait(grace)
            except subprocess.TimeoutExpired:
                log(f"pid {proc.pid} did not stop within {grace:g}s of SIGTERM: SIGKILL")
                proc.kill()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                return None
        return proc.returncode

    def cleanup(self) -> list[int]:
        """Stop every root, then SIGKILL every tracked process still alive; returns the pids killed."""
        for proc, grace in reversed(self.roots):
            try:
                self.stop_root(proc, grace)
            except Exception as err:   # keep cleaning up
                log(f"stopping pid {proc.pid}: {err}")
        killed = []
        for pid in list(self.procs):
            proc = self.same(pid)
            if proc is None:
                continue
            try:
                proc.kill()
                killed.append(pid)
            except psutil.Error:
                pass
        for proc, _ in self.roots:
            if proc.returncode is None:
                try:
                    proc.wait(2)
                except subprocess.TimeoutExpired:
                    pass
        if killed:
            psutil.wait_procs([p for p in (self.same(pid) for pid in killed) if p], timeout=3)
        return killed


# -- throwaway installs of the peers ----------------------------------------------------------------

def run_install(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> None:
    """Run an installer (venv, pip, npm); RuntimeError with its last lines if it fails or overruns."""
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"`{' '.join(argv[-3:])}` took longer than {timeout}s") from None
    if out.returncode != 0:
        tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-8:])
        raise RuntimeError(f"`{' '.join(argv[-3:])}` failed (exit {out.returncode}):\n{tail}")


def pip_venv(venv, requirement: str, env: dict[str, str] | None = None):
    """A fresh venv at `venv` with `requirement` (pinned) installed by pip; returns its path."""
    log(f"python -m venv {venv} + pip install {requirement}")
    run_install([sys.executable, "-m", "venv", str(venv)], 180, env)
    run_install([os.path.join(str(venv), "bin", "python"), "-m", "pip", "install", "-q",
                 "--disable-pip-version-check", requirement], 900, env)
    return venv


# -- /proc readers ---------------------------------------------------------------------------------

def schedstat(pid: int) -> dict:
    """CPU time of every live thread of `pid` from /proc/PID/task/TID/schedstat (ns on CPU, timeslices).

    /proc/PID/schedstat alone is the main thread only; threads (zmq I/O, event writer) are summed here.
    Also returns utime+stime from /proc/PID/stat (all threads, dead ones included; clock-tick resolution).
    """
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns, _wait, slices = (int(x) for x in f.read().split())
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        threads[int(tid)] = {"comm": comm, "ns": ns, "slices": slices}
    with open(f"/proc/{pid}/schedstat") as f:
        main_ns = int(f.read().split()[0])
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])   # utime, stime (fields 14, 15 of stat)
    return {"ns": sum(t["ns"] for t in threads.values()), "slices": sum(t["slices"] for t in threads.values()),
            "main_thread_ns": main_ns, "stat_s": ticks / os.sysconf("SC_CLK_TCK"), "threads": threads}


def smaps_rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup in bytes (Rss, Pss, Private_Dirty, ...)."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def rss_by_mapping(pid: int, top: int = 10) -> list[tuple[str, int]]:
    """Where a process's RSS lives: /proc/PID/smaps Rss summed per file name ([heap], [anon], libzmq...)."""
    totals: dict[str, int] = {}
    name = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and "-" in parts[0] and not parts[0].endswith(":"):
                name = os.path.basename(parts[5]) if len(parts) > 5 else "[anon]"
            elif parts and parts[0] == "Rss:" and name is not None:
                totals[name] = totals.get(name, 0) + int(parts[1]) * 1024
    return sorted(totals.items(), key=lambda kv: -kv[1])[:top]


def describe(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()) or psutil.Process(pid).name()
    except psutil.Error:
        return "?"


# -- statistics ------------------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    data = sorted(values)
    if not data:
        return math.nan
    pos = (len(data) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summary(values: Iterable[float]) -> dict:
    data = list(values)
    if not data:
        return {"n": 0, "min": None, "median": None, "p95": None, "max": None, "mean": None}
    return {"n": len(data), "min": min(data), "median": statistics.median(data), "p95": percentile(data, 0.95),
            "max": max(data), "mean": statistics.fmean(data)}


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def table(rows: Sequence[Sequence[str]], indent: str = "  ") -> str:
    widths = [max(len(str(r[i])) for r in rows if i < len(r)) for i in range(max(len(r) for r in rows))]
    lines = []
    for row in rows:
        cells = [str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines)
