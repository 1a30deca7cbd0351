#!/usr/bin/env python3
"""Benchmark Pulse's process tree: restart latency, footprint, idle CPU, startup, pulsectl.

Runs a real `pulsed` (the console script next to this interpreter) on temporary homes and measures:

  1. per worker: SIGKILL → replacement ready (pulsed received the new worker's Ready), from the
     `worker-ready` event's `mono` minus time.monotonic() taken just before os.kill();
  2. pulsed RSS/USS, whole-tree PSS (pulsed + forkserver + workers, /proc/PID/smaps_rollup);
  3. idle CPU of pulsed and of the whole tree over a window (/proc/PID/task/*/schedstat);
  4. pulsed start → READY=1 on a real NOTIFY_SOCKET (fresh home each trial);
  5. `pulsectl status` wall time;
  6. with --peers: the same kill trial against supervisord and circus (installed into throwaway venvs);
  7. the common `pulsectl` commands' wall time, round-robin with `python -c pass` (the floor). Under an
     editable install (`pip install -e`) the floor includes setuptools' import finder (pathlib, re,
     fnmatch, importlib.util) that a regular install, as the README's first command makes, does not
     load; pulsectl imports most of it anyway, so the commands differ by ~1 ms and the floor by
     10-22 ms (17 ms against 39, median, on 2 cores). Run it with a regular install's python to
     compare with the target.

Every process it starts is tracked by pid (and create time) and stopped at the end, also on Ctrl-C,
SIGTERM or an error. Progress goes to stderr; the figures to stdout (plus one JSON document with --json).

    python scripts/bench_restart.py --quick            # smoke test, under a minute
    python scripts/bench_restart.py --peers --json     # the full run (≥ 300 s idle window)
    python scripts/bench_restart.py --skip ready --skip kills --skip idle   # the pulsectl commands alone
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tomllib
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psutil  # noqa: E402
from _benchlib import (  # noqa: E402
    MiB,
    Timeout,
    Tracker,
    describe,
    die_with_us,
    fmt,
    log,
    pip_venv,
    rss_by_mapping,
    schedstat,
    smaps_rollup,
    summary,
    table,
    wait_until,
)

WORKERS = ("watcher", "tick", "executor", "engine")
CORE = ("watcher", "tick", "executor")
IDLE_REQUIRED_S = 300

TARGETS = {
    "core_kill_ready_median_ms": 20.0,
    "core_kill_ready_p95_ms": 50.0,
    "pulsed_rss_mib": 22.0,
    "tree_pss_mib": 100.0,
    "pulsed_idle_cpu_pct": 0.05,
    "tree_idle_cpu_pct": 0.5,
    "start_to_ready_median_s": 1.0,
    "pulsectl_status_median_ms": 60.0,
    "pulsectl_command_median_ms": 50.0,
}

# The commands an operator runs most (7.): label → argv after `pulsectl --home H`.
CLI_COMMANDS = {
    "status": ["status"],
    "status --json": ["status", "--json"],
    "task add": ["task", "add", "--project", "bench", "--title", "a bench task", "--prompt", "nothing to do"],
    "task list": ["task", "list"],
    "task show": ["task", "show", "1"],          # task-1: the warm-up round's `task add` made it
    "events": ["events", "-n", "20"],
    "effects": ["effects"],
    "config --effective": ["config", "--effective"],
    "budget": ["budget"],
    "process list": ["process", "list"],
    "reload": ["reload"],
    "--version": ["--version"],
    "--help": ["--help"],
    "task add --help": ["task", "add", "--help"],
    "check-config": ["check-config"],
    "vitals": ["vitals"],
    "logs": ["logs", "-n", "20"],
    "instances": ["instances"],
    "schedule list": ["schedule", "list"],
    "engine log": ["engine", "log"],
    "store check": ["store", "check"],
    "gate sessions": ["gate", "sessions"],
    "fleet tasks": ["fleet", "tasks"],
}

# Reference figures for the peers, quoted from the issue (same kind of machine).
PEER_REFERENCE = {
    "supervisord": {"kill_to_ready_median_ms": 1012, "rss_mib": 24.8, "ctl_status_ms": 67.5},
    "circus": {"kill_to_ready_median_ms": 2502, "rss_mib": 30.9},
}
PEER_PINS = {"supervisord": "supervisor==4.3.0", "circus": "circus==0.19.0"}

CHILD_PROGRAM = """\
# A supervised child for the peer benchmark: say "ready" by appending "<pid> <monotonic>" to a file.
import os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()} {time.monotonic()!r}\\n")
while True:
    time.sleep(3600)
"""


def supervisord_conf(d: Path, programs: dict[str, str]) -> Path:
    """supervisord.conf in `d` for `programs` (name → its [program:] lines), each logging to d/NAME.log:
    the peer benchmark's and scripts/compare_supervisors.py's."""
    conf, sock = d / "supervisord.conf", d / "supervisor.sock"
    text = textwrap.dedent(f"""\
        [unix_http_server]
        file={sock}
        [supervisord]
        nodaemon=true
        logfile={d / 'supervisord.log'}
        pidfile={d / 'supervisord.pid'}
        childlogdir={d}
        [rpcinterface:supervisor]
        supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
        [supervisorctl]
        serverurl=unix://{sock}
        """)
    for name, body in programs.items():
        text += f"[program:{name}]\n{body}\nstdout_logfile={d / (name + '.log')}\nredirect_stderr=true\n"
    conf.write_text(text)
    return conf


class Interrupted(BaseException):
    """SIGTERM/SIGHUP: unwind like Ctrl-C so every process gets cleaned up."""


def on_signal(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def console_script(name: str) -> str:
    """The console script installed next to this interpreter (the same environment), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"bench_restart: cannot find `{name}` next to {sys.executable} or on PATH; "
                         f"install Pulse into this environment first (pip install -e .)")
    return found


def clean_env(**extra: str) -> dict[str, str]:
    """Our environment without anything that would steer pulsed (PULSE_*, systemd's notify variables)."""
    drop = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_") and k not in drop}
    env.update(extra)
    return env


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def run_timed(argv: list[str], env: dict, timeout: float) -> tuple[int, float, float]:
    """(exit code, wall seconds, CPU seconds) of one run of `argv`, its output to /dev/null.

    Waited for by a blocking wait4, not subprocess.run(timeout=...): that polls with sleeps that
    double up to 50 ms, so a command's wall time read as 31.5, 63.5, 113.5 ms..., never between (a
    51 ms command showed 63.5). wait4 also gives this child's own CPU time. A timer kills a run
    that outlives `timeout`."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        killer.cancel()
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)     # reaped here: Popen must not wait again
    return proc.returncode, wall, usage.ru_utime + usage.ru_stime


# -- one pulsed ------------------------------------------------------------------------------------

class Pulsed:
    def __init__(self, bench: "Bench", name: str, overrides: dict[str, str] | None = None,
                 notify_socket: str | None = None):
        self.bench = bench
        self.dir = bench.root / name
        self.home = self.dir / "home"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.overrides = dict(overrides or {})
        self.env = clean_env(PULSE_RUNTIME_DIR=str(self.dir / "run"), **self.overrides)
        self.ctl_env = dict(self.env)
        if notify_socket:
            self.env["NOTIFY_SOCKET"] = notify_socket
        self.proc: subprocess.Popen | None = None
        self.t_popen = 0.0
        self._db: sqlite3.Connection | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self) -> None:
        stderr = open(self.dir / "pulsed.stderr", "ab")
        self.t_popen = time.monotonic()
        self.proc = subprocess.Popen([self.bench.pulsed, "--home", str(self.home), "--no-log-stderr"],
                                     env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=stderr, start_new_session=True, preexec_fn=die_with_us)
        stderr.close()
        self.bench.tracker.add_root(self.proc, grace=15)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = (self.dir / "pulsed.stderr").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pulsed exited with code {self.proc.returncode}:\n{tail}")

    def ctl(self, *args: str, timeout: float = 15) -> subprocess.CompletedProcess:
        return subprocess.run([self.bench.pulsectl, "--home", str(self.home), *args], env=self.ctl_env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)

    def status(self) -> dict | None:
        out = self.ctl("status", "--json")
        if out.returncode not in (0, 3):
            return None
        return json.loads(out.stdout)

    def wait_running(self, timeout: float = 30) -> dict:
        def probe():
            self.check_alive()
            st = self.status()
            if st and all(w["state"] == "running" and w["pid"] for w in st["workers"]):
                return st
            return None
        st = wait_until(probe, timeout, 0.05, "every worker running (pulsectl status --json)")
        self.bench.tracker.add_tree(self.pid)
        return st

    def effective_timings(self) -> dict:
        out = self.ctl("config", "--effective")
        if out.returncode != 0:
            return {"error": out.stderr.strip()}
        return tomllib.loads(out.stdout).get("timings", {})

    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = sqlite3.connect(f"file:{self.home / 'events.db'}?mode=ro", uri=True, isolation_level=None)
        return self._db

    def events(self, after_id: int = 0, target: str | None = None) -> list[dict]:
        sql = "SELECT id, mono, type, target, data FROM events WHERE id > ?"
        args: list = [after_id]
        if target is not None:
            sql += " AND target = ?"
            args.append(target)
        rows = self.db().execute(sql + " ORDER BY id", args).fetchall()
        return [{"id": r[0], "mono": r[1], "type": r[2], "target": r[3], "data": json.loads(r[4])} for r in rows]

    def max_id(self) -> int:
        return self.db().execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]

    def stop(self) -> tuple[int | None, float]:
        """SIGTERM and wait; returns (exit code, seconds from SIGTERM to exit)."""
        if self._db is not None:
            self._db.close()
            self._db = None
        t0 = time.monotonic()
        code = self.bench.tracker.stop_root(self.proc, grace=15)
        return code, time.monotonic() - t0


# The way from a kill to the replacement's Ready, in the order it is walked, each from the events one
# restart records: (key, column heading, what it is).
PHASES = (
    ("exit_known_ms", "exit known", "kill → worker-exited: the kernel's word (pidfd) and the exit status from "
                                    "the forkserver"),
    ("spawn_asked_ms", "spawn asked", "→ worker-restarted: pulsed's decision, the Spawn sent"),
    ("forked_ms", "forked", "→ the forkserver had its process, a spare or a fork (worker-started's fork_ms)"),
    ("ready_sent_ms", "Ready sent", "→ the worker sent Ready (worker-ready's start_to_ready_ms − fork_ms): its "
                                    "setup"),
    ("ready_taken_ms", "Ready taken", "→ pulsed took the Ready (worker-ready's mono)"),
)


def phases(t_kill: float, exited: dict | None, restarted: dict | None, started: dict | None,
           ready: dict) -> dict[str, float | None]:
    """One restart's PHASES in ms (None where an event or a field is missing)."""
    fork_ms = started["data"].get("fork_ms") if started else None
    start_to_ready = ready["data"].get("start_to_ready_ms")
    out = dict.fromkeys(k for k, _, _ in PHASES)
    if exited:
        out["exit_known_ms"] = ms(exited["mono"] - t_kill)
        if restarted:
            out["spawn_asked_ms"] = ms(restarted["mono"] - exited["mono"])
    out["forked_ms"] = fork_ms
    if fork_ms is not None and start_to_ready is not None:
        out["ready_sent_ms"] = round(start_to_ready - fork_ms, 3)
    if restarted and start_to_ready is not None:
        out["ready_taken_ms"] = round(ms(ready["mono"] - restarted["mono"]) - start_to_ready, 3)
    return out


# -- the bench -------------------------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.tracker = Tracker()
        self.root = Path(tempfile.mkdtemp(prefix="pulse-bench-"))
        self.pulsed = console_script("pulsed")
        self.pulsectl = console_script("pulsectl")
        self.results: dict = {"version": 1}
        self.anomalies: list[str] = []

    def note(self, text: str) -> None:
        log("NOTE: " + text)
        self.anomalies.append(text)

    # 1. SIGKILL → replacement ready ------------------------------------------------------------

    def kill_one(self, p: Pulsed, worker: str, pid: int, timeout: float = 10) -> dict:
        proc = psutil.Process(pid)
        title = " ".join(proc.cmdline())
        if f"pulse: {worker}" not in title:
            raise RuntimeError(f"pid {pid} is {title!r}, not pulse: {worker}")
        after = p.max_id()
        t_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)

        def probe():
            evs = p.events(after, worker)
            for ev in evs:
                if ev["type"] == "worker-failed":
                    raise RuntimeError(f"{worker} failed: {ev['data']}")
                if ev["type"] == "worker-ready" and ev["data"].get("pid") != pid:
                    return evs
            return None
        evs = wait_until(probe, timeout, 0.003, f"{worker}'s replacement to be ready")
        ready = next(e for e in evs if e["type"] == "worker-ready" and e["data"].get("pid") != pid)
        new_pid = ready["data"]["pid"]
        self.tracker.add(new_pid)
        exited = next((e for e in evs if e["type"] == "worker-exited" and e["data"].get("pid") == pid), None)
        started = next((e for e in evs if e["type"] == "worker-started" and e["data"].get("pid") == new_pid), None)
        restarted = next((e for e in evs if e["type"] == "worker-restarted"), None)
        return {
            "killed_pid": pid, "new_pid": new_pid, "pid_differs": new_pid != pid,
            "kill_to_ready_ms": ms(ready["mono"] - t_kill),
            **phases(t_kill, exited, restarted, started, ready),
            "exit_signal": exited["data"].get("signal") if exited else None,
            "restart_delay_ms": restarted["data"].get("delay_ms") if restarted else None,
            "streak": restarted["data"].get("streak") if restarted else None,
            "ready_mono": ready["mono"],
            "other_events": sorted({e["type"] for e in evs} - {"worker-exited", "worker-restarted",
                                                                  "worker-started", "worker-ready"}),
        }

    def bench_kills(self) -> None:
        a = self.args
        overrides = {"PULSE_HEALTHY_RESET_S": str(a.healthy_reset_s), "PULSE_INTENSITY_RESTARTS": "100000"}
        p = Pulsed(self, "kills", overrides)
        log(f"kill trials: starting pulsed with {overrides}")
        p.start()
        st = p.wait_running()
        timings = p.effective_timings()
        time.sleep(a.settle)
        mem_before = self.memory(p.pid)
        pids = {w["name"]: w["pid"] for w in st["workers"]}
        last_ready = {w: time.monotonic() for w in WORKERS}
        trials: dict[str, list[dict]] = {w: [] for w in WORKERS}
        failures: dict[str, list[str]] = {w: [] for w in WORKERS}
        gap = max(a.spacing, 0.0)
        reset_margin = max(0.1, a.healthy_reset_s * 0.5)
        log(f"kill trials: {a.trials} per worker, round-robin over {', '.join(WORKERS)}, "
            f"≥ {gap:g}s (+ 0…{a.jitter:g}s random) between kills and ≥ healthy_reset_s + {reset_margin:g}s after a "
            "worker's last ready")
        last_done = time.monotonic()
        t_begin = time.monotonic()
        for i in range(a.trials):
            for w in WORKERS:
                due = max(last_done + gap + random.uniform(0, a.jitter),
                          last_ready[w] + a.healthy_reset_s + reset_margin)
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    r = self.kill_one(p, w, pids[w])
                except (Timeout, RuntimeError, psutil.Error) as err:
                    failures[w].append(f"trial {i + 1}: {err}")
                    self.note(f"kill trial {i + 1} of {w} (pid {pids[w]}) did not complete: {err}")
                    p.check_alive()
                    st = p.wait_running(30)
                    pids = {x["name"]: x["pid"] for x in st["workers"]}
                    last_ready = {x: time.monotonic() for x in WORKERS}
                    last_done = time.monotonic()
                    continue
                trials[w].append(r)
                pids[w], last_ready[w] = r["new_pid"], r["ready_mono"]
                last_done = time.monotonic()
            if (i + 1) % 5 == 0 or i + 1 == a.trials:
                log(f"  trial {i + 1}/{a.trials} done; last: " +
                    ", ".join(f"{w} {trials[w][-1]['kill_to_ready_ms']:.1f} ms" for w in WORKERS if trials[w]))
        elapsed = time.monotonic() - t_begin
        time.sleep(a.settle)
        st_after = p.status() or {}
        mem_after = self.memory(p.pid)
        all_events = p.events(0)
        code, stop_s = p.stop()

        out: dict = {
            "method": ("time.monotonic() just before os.kill(pid, SIGKILL) in the bench → `mono` of the "
                       "`worker-ready` event pulsed recorded for the replacement (CLOCK_MONOTONIC is "
                       "system-wide on Linux); the event's data.pid must differ from the killed pid"),
            "spacing": (f"pulsed ran with PULSE_HEALTHY_RESET_S={a.healthy_reset_s} and "
                        f"PULSE_INTENSITY_RESTARTS=100000 (intensity_period_s left at its default); workers were "
                        f"killed round-robin, one at a time, each kill {gap:g}s + a random 0…{a.jitter:g}s after "
                        f"the previous replacement was ready and ≥ healthy_reset_s + {reset_margin:g}s after that "
                        "worker's own last ready, "
                        "so every kill starts a new crash streak (first restart immediate, no backoff) and the "
                        "intensity limit is never near; verified per trial from worker-restarted "
                        "(delay_ms = 0, streak = 1)"),
            "env_overrides": overrides, "effective_timings": timings, "trials_per_worker": a.trials,
            "elapsed_s": round(elapsed, 1), "workers": {}, "failures": failures,
            "memory_before": mem_before, "memory_after": mem_after,
            "pulsed_exit_code": code, "pulsed_stop_s": round(stop_s, 3),
        }
        for w in WORKERS:
            rs = trials[w]
            out["workers"][w] = {
                "kill_to_ready_ms": summary(r["kill_to_ready_ms"] for r in rs),
                "phases_median_ms": {
                    k: (statistics.median(v) if (v := [r[k] for r in rs if r[k] is not None]) else None)
                    for k, _, _ in PHASES},
                "samples_ms": [r["kill_to_ready_ms"] for r in rs],
                "backoff_engaged": sum(1 for r in rs if r["restart_delay_ms"] not in (0, None) or
                                       (r["streak"] or 1) > 1),
                "pid_unchanged": sum(1 for r in rs if not r["pid_differs"]),
                "exit_signal_not_9": sum(1 for r in rs if r["exit_signal"] != 9),
                "other_events": sorted({t for r in rs for t in r["other_events"]}),
            }
        core = [r["kill_to_ready_ms"] for w in CORE for r in trials[w]]
        out["core_pooled_ms"] = summary(core)
        out["status_after"] = {w["name"]: {"state": w["state"], "restarts": w["restarts"]}
                               for w in st_after.get("workers", [])}
        out["event_types"] = _count(e["type"] for e in all_events)
        self.results["kill_restart"] = out

        for w in WORKERS:
            d = out["workers"][w]
            if d["backoff_engaged"]:
                self.note(f"{w}: backoff engaged in {d['backoff_engaged']} trial(s) despite the spacing")
            if d["pid_unchanged"]:
                self.note(f"{w}: {d['pid_unchanged']} worker-ready event(s) carried the killed pid")
            if d["exit_signal_not_9"]:
                self.note(f"{w}: {d['exit_signal_not_9']} worker-exited event(s) without signal 9 "
                          f"(exit status not learnt from the forkserver in time?)")
            if d["other_events"]:
                self.note(f"{w}: unexpected events during kill trials: {d['other_events']}")
            s = d["kill_to_ready_ms"]
            if s["n"] and s["max"] > 10 * s["median"] and s["max"] > 50:
                self.note(f"{w}: slowest restart {s['max']:.1f} ms vs median {s['median']:.1f} ms "
                          f"(samples: {d['samples_ms']})")
        grow = mem_after["pulsed"]["rss"] - mem_before["pulsed"]["rss"]
        if grow > 1 * MiB:
            self.note(f"pulsed RSS grew by {grow / MiB:.2f} MiB over {sum(len(v) for v in trials.values())} "
                      f"restarts ({mem_before['pulsed']['rss'] / MiB:.2f} → {mem_after['pulsed']['rss'] / MiB:.2f} MiB)")
        if code != 0:
            self.note(f"pulsed (kill-trial instance) exited with {code} on SIGTERM")

    # 2. memory ---------------------------------------------------------------------------------

    def memory(self, root_pid: int) -> dict:
        pids = self.tracker.add_tree(root_pid)
        mfi = psutil.Process(root_pid).memory_full_info()
        procs = []
        for pid in pids:
            try:
                r = smaps_rollup(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue
            procs.append({"pid": pid, "cmd": describe(pid), "rss": r.get("Rss", 0), "pss": r.get("Pss", 0),
                          "uss": r.get("Private_Clean", 0) + r.get("Private_Dirty", 0) + r.get("Private_Hugetlb", 0)})
        return {"pulsed": {"rss": mfi.rss, "uss": mfi.uss, "pss": mfi.pss, "threads": psutil.Process(root_pid).num_threads(),
                           "rss_by_mapping": rss_by_mapping(root_pid)},
                "tree_pss": sum(p["pss"] for p in procs), "tree_uss": sum(p["uss"] for p in procs),
                "tree_rss_sum": sum(p["rss"] for p in procs), "processes": procs}

    # 3. idle CPU, memory, pulsectl status on a default-timings pulsed ------------------------------

    def bench_idle(self) -> None:
        a = self.args
        p = Pulsed(self, "idle")
        log("idle: starting pulsed with default timings (no PULSE_* overrides)")
        p.start()
        p.wait_running()
        timings = p.effective_timings()
        log(f"idle: all workers running; settling {a.settle:g}s")
        time.sleep(a.settle)
        mem = self.memory(p.pid)
        self.results["memory"] = mem
        log(f"memory: pulsed RSS {mem['pulsed']['rss'] / MiB:.2f} MiB, USS {mem['pulsed']['uss'] / MiB:.2f} MiB; "
            f"tree PSS {mem['tree_pss'] / MiB:.2f} MiB")

        pids0 = self.tracker.add_tree(p.pid)
        id0 = p.max_id()
        s0 = {pid: schedstat(pid) for pid in pids0}
        w0 = time.monotonic()
        log(f"idle: measuring CPU for {a.idle_seconds:g}s (processes: {len(pids0)})")
        marks = []
        step = 60.0 if a.idle_seconds >= 120 else a.idle_seconds
        end = w0 + a.idle_seconds
        while (now := time.monotonic()) < end:
            time.sleep(min(step - (now - w0) % step, end - now))
            marks.append((time.monotonic() - w0, schedstat(p.pid)["ns"]))
            if time.monotonic() < end - 1:
                log(f"  idle: {marks[-1][0]:.0f}s / {a.idle_seconds:g}s")
        s1 = {}
        for pid in pids0:
            try:
                s1[pid] = schedstat(pid)
            except (FileNotFoundError, ProcessLookupError):
                pass
        w1 = time.monotonic()
        wall_ns = (w1 - w0) * 1e9
        pids1 = self.tracker.add_tree(p.pid)
        events = p.events(id0)

        per = []
        for pid in pids0:
            if pid not in s1:
                continue
            d_ns = s1[pid]["ns"] - s0[pid]["ns"]
            per.append({"pid": pid, "cmd": describe(pid), "cpu_ms": round(d_ns / 1e6, 3),
                        "cpu_pct": round(d_ns / wall_ns * 100, 5),
                        "wakeups_per_s": round((s1[pid]["slices"] - s0[pid]["slices"]) / (w1 - w0), 2),
                        "main_thread_cpu_ms": round((s1[pid]["main_thread_ns"] - s0[pid]["main_thread_ns"]) / 1e6, 3),
                        "stat_cpu_ms": round((s1[pid]["stat_s"] - s0[pid]["stat_s"]) * 1000, 1)})
        threads = []
        t0s, t1s = s0[p.pid]["threads"], s1.get(p.pid, s0[p.pid])["threads"]
        for tid, t1 in t1s.items():
            t0 = t0s.get(tid, {"ns": 0, "slices": 0})
            threads.append({"tid": tid, "comm": t1["comm"], "cpu_ms": round((t1["ns"] - t0["ns"]) / 1e6, 3),
                            "wakeups_per_s": round((t1["slices"] - t0["slices"]) / (w1 - w0), 2)})
        pulsed_row = next(r for r in per if r["pid"] == p.pid)
        intervals = []
        prev_t, prev_ns = 0.0, s0[p.pid]["ns"]
        for t, ns in marks:
            if t > prev_t:
                intervals.append({"until_s": round(t, 1), "pulsed_cpu_pct": round((ns - prev_ns) / ((t - prev_t) * 1e9) * 100, 5)})
            prev_t, prev_ns = t, ns
        idle = {
            "window_s": round(w1 - w0, 1), "requested_s": a.idle_seconds,
            "source": "sum over live threads of /proc/PID/task/TID/schedstat field 1 (ns on CPU), end minus start",
            "timings_in_force": {k: timings.get(k) for k in ("heartbeat_ms", "hung_after_ms", "tick_ms",
                                                              "watcher_interval_ms", "executor_scan_interval_ms")},
            "env_overrides": {},
            "pulsed_cpu_pct": pulsed_row["cpu_pct"], "pulsed_wakeups_per_s": pulsed_row["wakeups_per_s"],
            "tree_cpu_pct": round(sum(r["cpu_pct"] for r in per), 5),
            "processes": per, "pulsed_threads": threads, "pulsed_intervals": intervals,
            "processes_changed": sorted(set(pids0) ^ set(pids1)),
            "events_during_window": _count(e["type"] for e in events),
        }
        self.results["idle_cpu"] = idle
        self.results["default_timings"] = timings
        if a.idle_seconds < IDLE_REQUIRED_S:
            self.note(f"idle window {a.idle_seconds:g}s is shorter than the {IDLE_REQUIRED_S}s the issue requires "
                      "(quick run): idle CPU figures are indicative only")
        if idle["processes_changed"]:
            self.note(f"the process tree changed during the idle window: pids {idle['processes_changed']} "
                      f"(events: {idle['events_during_window']})")
        lifecycle = {k: v for k, v in idle["events_during_window"].items() if k.startswith(("worker-", "error"))}
        if lifecycle:
            self.note(f"lifecycle events while idle: {lifecycle}")
        log(f"idle: pulsed {idle['pulsed_cpu_pct']:.4f} % of a core, tree {idle['tree_cpu_pct']:.4f} %")

        mem_end = self.memory(p.pid)
        self.results["memory_after_idle"] = {"pulsed": mem_end["pulsed"], "tree_pss": mem_end["tree_pss"]}
        grow = mem_end["pulsed"]["rss"] - mem["pulsed"]["rss"]
        if grow > 512 * 1024:
            self.note(f"pulsed RSS grew by {grow / MiB:.2f} MiB during the idle window")

        self.results["pulsectl_status"] = self.time_command(
            [self.pulsectl, "--home", str(p.home), "status"], p.ctl_env, a.status_runs, "pulsectl status")
        # The floor on this machine at this moment: interpreter start varies from run to run here.
        self.results["bare_interpreter"] = self.time_command([sys.executable, "-c", "pass"], p.ctl_env,
                                                             a.status_runs, "bare interpreter")
        code, stop_s = p.stop()
        self.results["idle_instance_stop"] = {"exit_code": code, "sigterm_to_exit_s": round(stop_s, 3)}
        if code != 0:
            self.note(f"pulsed (idle instance) exited with {code} on SIGTERM")

    def time_command(self, argv: list[str], env: dict | None, runs: int, label: str) -> dict:
        """Wall time of `argv` (Popen → exit), `runs` times after one unreported warm-up run."""
        log(f"{label}: {runs} runs (+1 warm-up)")
        times, codes = [], []
        for i in range(runs + 1):
            t0 = time.monotonic()
            out = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, timeout=30)
            dt = time.monotonic() - t0
            if i:
                times.append(ms(dt))
                codes.append(out.returncode)
        if any(codes):
            self.note(f"{label}: non-zero exit codes {sorted(set(codes))}")
        return {"argv": [Path(argv[0]).name] + argv[1:], "runs": runs, "ms": summary(times), "samples_ms": times,
                "exit_codes": sorted(set(codes))}

    # 7. pulsectl commands ------------------------------------------------------------------------

    def bench_cli(self) -> None:
        """Each common command against a running pulsed (default timings), round-robin with the
        floor, so that a burst of load on the machine weighs on every column alike."""
        a = self.args
        p = Pulsed(self, "cli")
        log("cli: starting pulsed with default timings")
        p.start()
        p.wait_running()
        # Without PYTHONDONTWRITEBYTECODE: an installed Pulse has its bytecode, and a module compiled
        # from source at every run is not what an operator waits on (the warm-up run writes it).
        env = {k: v for k, v in p.ctl_env.items() if k != "PYTHONDONTWRITEBYTECODE"}
        runs = {"python -c pass": [sys.executable, "-c", "pass"],
                **{label: [self.pulsectl, "--home", str(p.home), *argv] for label, argv in CLI_COMMANDS.items()}}
        times: dict[str, list[float]] = {label: [] for label in runs}
        cpu: dict[str, list[float]] = {label: [] for label in runs}
        codes: dict[str, set[int]] = {label: set() for label in runs}
        log(f"cli: {a.cli_runs} rounds (+1 warm-up) of {', '.join(runs)}")
        for i in range(a.cli_runs + 1):
            for label, argv in runs.items():
                code, wall, used = run_timed(argv, env, 60)
                if i:
                    times[label].append(ms(wall))
                    cpu[label].append(ms(used))
                    codes[label].add(code)
        instructions = self.cli_instructions(runs, env) if not a.no_instructions else {}
        code, _ = p.stop()
        bad = {label: sorted(c) for label, c in codes.items() if c - {0}}
        if bad:
            self.note(f"cli: non-zero exit codes {bad}")
        self.results["cli"] = {
            "method": "time.monotonic() around Popen → a blocking wait4, stdout/stderr to /dev/null; "
                      "CPU: user + system time of the child (wait4's rusage), which load "
                      "on the machine sways less; rounds of every command in turn, the first not counted",
            "rounds": a.cli_runs, "commands": {label: {"argv": argv[1:] if label != "python -c pass" else argv,
                                                       "ms": summary(times[label]), "samples_ms": times[label],
                                                       "cpu_ms": summary(cpu[label]),
                                                       "instructions_m": instructions.get(label)}
                                               for label, argv in runs.items()},
            "loadavg_after": [round(x, 2) for x in os.getloadavg()], "pulsed_exit_code": code}

    def cli_instructions(self, runs: dict[str, list[str]], env: dict) -> dict[str, float]:
        """Millions of instructions each command executes, one run each under valgrind (cachegrind,
        no cache simulation): a machine's speed swings by 2× within an hour here, its instruction
        counts do not, so old and new code compare on a busy host. {} without valgrind."""
        if shutil.which("valgrind") is None:
            self.note("cli: valgrind is not installed: no instruction counts")
            return {}
        log(f"cli: instruction counts under valgrind, {len(runs)} commands")
        env = {**env, "PYTHONHASHSEED": "0"}    # the same dict layouts each run
        counts = {}
        for label, argv in runs.items():
            out = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                                  *argv], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, timeout=300)
            found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
            if found:
                counts[label] = int(found.group(1).replace(",", "")) / 1e6
        return counts

    # 4. start → READY=1 --------------------------------------------------------------------------

    def bench_ready(self) -> None:
        n = self.args.ready_trials
        log(f"start → READY=1: {n} trials, fresh home each (then one restart on the same home)")
        fresh, warm, stops, codes = [], [], [], []
        for i in range(n):
            p = Pulsed(self, f"ready{i}")
            path = str(p.dir / "notify.sock")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            try:
                sock.bind(path)
                p.env["NOTIFY_SOCKET"] = path
                for bucket in (fresh, warm):
                    p.start()
                    bucket.append(ms(self.await_ready(p, sock)))
                    code, stop_s = p.stop()
                    stops.append(ms(stop_s))
                    codes.append(code)
            finally:
                sock.close()
            log(f"  trial {i + 1}: fresh home {fresh[-1]:.0f} ms, existing home {warm[-1]:.0f} ms")
        self.results["start_to_ready"] = {
            "method": "time.monotonic() before Popen(pulsed) → datagram with READY=1 on an AF_UNIX SOCK_DGRAM "
                      "socket passed as NOTIFY_SOCKET",
            "fresh_home_ms": summary(fresh), "fresh_samples_ms": fresh,
            "existing_home_ms": summary(warm), "existing_samples_ms": warm,
            "sigterm_to_exit_ms": summary(stops), "exit_codes": sorted(set(codes), key=str)}
        if any(c != 0 for c in codes):
            self.note(f"pulsed exit codes on SIGTERM after READY trials: {codes}")

    def await_ready(self, p: Pulsed, sock: socket.socket, timeout: float = 30) -> float:
        deadline = p.t_popen + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"no READY=1 within {timeout:g}s")
            sock.settimeout(min(left, 0.2))
            try:
                data = sock.recv(4096)
            except socket.timeout:
                p.check_alive()
                continue
            if "READY=1" in data.decode(errors="replace").split("\n"):
                return time.monotonic() - p.t_popen

    # 6. peers ----------------------------------------------------------------------------------

    def make_venv(self, name: str, requirement: str) -> Path:
        return pip_venv(self.root / f"venv-{name}", requirement, clean_env())

    def bench_peers(self) -> None:
        self.results["peers"] = {}
        d = self.root / "peers"
        d.mkdir()
        child = d / "child.py"
        child.write_text(CHILD_PROGRAM)
        for name, runner in (("supervisord", self.run_supervisord), ("circus", self.run_circus)):
            try:
                self.results["peers"][name] = runner(d, child)
            except (Timeout, RuntimeError, OSError, psutil.Error, subprocess.SubprocessError) as err:
                log(f"{name}: FAILED: {err}")
                self.results["peers"][name] = {"error": str(err)}

    def run_supervisord(self, d: Path, child: Path) -> dict:
        venv = self.make_venv("supervisor", PEER_PINS["supervisord"])
        marker = d / "supervisord.marker"
        conf = supervisord_conf(d, {"child": f"command={sys.executable} {child} {marker}\nautorestart=true\nstartsecs=0"})
        return self.measure_peer(d, "supervisord", [str(venv / "bin" / "supervisord"), "-n", "-c", str(conf)],
                                 [str(venv / "bin" / "supervisorctl"), "-c", str(conf), "status"], marker, child,
                                 "autorestart=true, startsecs=0, everything else default")

    def run_circus(self, d: Path, child: Path) -> dict:
        venv = self.make_venv("circus", PEER_PINS["circus"])
        marker = d / "circus.marker"
        ini = d / "circus.ini"
        endpoint = f"ipc://{d / 'circus-ctl.ipc'}"
        ini.write_text(textwrap.dedent(f"""\
            [circus]
            endpoint = {endpoint}
            pubsub_endpoint = ipc://{d / 'circus-pub.ipc'}
            stats_endpoint = ipc://{d / 'circus-stats.ipc'}
            [watcher:child]
            cmd = {sys.executable} {child} {marker}
            numprocesses = 1
            copy_env = True
            """))
        return self.measure_peer(d, "circus", [str(venv / "bin" / "circusd"), "--log-output",
                                               str(d / "circusd.log"), str(ini)],
                                 [str(venv / "bin" / "circusctl"), "--endpoint", endpoint, "status"], marker, child,
                                 "numprocesses=1, default check_delay, ipc endpoints, everything else default")

    def measure_peer(self, d: Path, name: str, daemon_argv: list[str], ctl_argv: list[str],
                     marker: Path, child: Path, config: str) -> dict:
        """Start a peer's daemon, run the kill trials and time its status command, stop it."""
        version = subprocess.run([daemon_argv[0], "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.strip()
        daemon = self.start_peer(d, Path(daemon_argv[0]).name, daemon_argv)
        try:
            out = self.peer_trials(name, daemon, marker, child)
            out["version"], out["config"] = version, config
            out["ctl_status"] = self.time_command(ctl_argv, None, self.args.status_runs,
                                                  f"{Path(ctl_argv[0]).name} status")
        finally:
            code = self.tracker.stop_root(daemon, 15)
            self.kill_marker_children(marker, child)
        out["exit_code"] = code
        return out

    def start_peer(self, d: Path, name: str, argv: list[str]) -> subprocess.Popen:
        with open(d / f"{name}.stderr", "wb") as err:
            proc = subprocess.Popen(argv, cwd=d, env=clean_env(), stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    start_new_session=True, preexec_fn=die_with_us)
        self.tracker.add_root(proc, grace=15)
        return proc

    @staticmethod
    def read_marker(marker: Path) -> list[tuple[int, float]]:
        try:
            text = marker.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines(keepends=True):
            if line.endswith("\n"):
                pid, mono = line.split()
                out.append((int(pid), float(mono)))
        return out

    def kill_marker_children(self, marker: Path, child: Path) -> None:
        for pid, _ in self.read_marker(marker):
            self.tracker.add(pid)
            proc = self.tracker.same(pid)
            if proc is not None and str(child) in " ".join(proc.cmdline()):
                log(f"killing leftover peer child {pid}")
                proc.kill()

    def peer_trials(self, name: str, daemon: subprocess.Popen, marker: Path, child: Path) -> dict:
        a = self.args

        def first():
            if daemon.poll() is not None:
                raise RuntimeError(f"{name} exited with {daemon.returncode}")
            return self.read_marker(marker)
        lines = wait_until(first, 60, 0.02, f"{name}'s first child")
        self.tracker.add_tree(daemon.pid)
        cur_pid, cur_mono = lines[-1]
        time.sleep(max(0.0, cur_mono + a.peer_spacing - time.monotonic()))
        rss_before = psutil.Process(daemon.pid).memory_full_info()
        samples, errors = [], []
        log(f"{name}: {a.peer_trials} kill trials, {a.peer_spacing:g}s + a random 0…{a.peer_jitter:g}s after each "
            "new child's marker")
        for i in range(a.peer_trials):
            # A random phase, so a peer's periodic loop cannot lock onto the kill schedule.
            time.sleep(max(0.0, cur_mono + a.peer_spacing + random.uniform(0, a.peer_jitter) - time.monotonic()))
            self.tracker.add(cur_pid)
            proc = self.tracker.same(cur_pid)
            if proc is None or str(child) not in " ".join(proc.cmdline()):
                raise RuntimeError(f"{name}'s child {cur_pid} is gone before trial {i + 1}")
            count = len(self.read_marker(marker))
            t_kill = time.monotonic()
            os.kill(cur_pid, signal.SIGKILL)

            def fresh():
                if daemon.poll() is not None:
                    raise RuntimeError(f"{name} exited with {daemon.returncode}")
                new = [x for x in self.read_marker(marker)[count:] if x[0] != cur_pid]
                return new[0] if new else None
            try:
                new_pid, new_mono = wait_until(fresh, 30, 0.005, f"{name}'s replacement child")
            except Timeout as err:
                errors.append(f"trial {i + 1}: {err}")
                self.note(f"{name}: trial {i + 1}: {err}")
                break
            self.tracker.add(new_pid)
            samples.append(ms(new_mono - t_kill))
            cur_pid, cur_mono = new_pid, new_mono
            if (i + 1) % 5 == 0:
                log(f"  {name}: trial {i + 1}/{a.peer_trials}: {samples[-1]:.0f} ms")
        mem = psutil.Process(daemon.pid).memory_full_info()
        return {"kill_to_ready_ms": summary(samples), "samples_ms": samples, "errors": errors,
                "method": "time.monotonic() before os.kill(child, SIGKILL) → time.monotonic() the replacement child "
                          "(a different pid) appended to its marker file right after interpreter start; each kill "
                          f"{a.peer_spacing:g}s + a random 0…{a.peer_jitter:g}s after the previous child's marker",
                "daemon_rss": mem.rss, "daemon_uss": mem.uss, "daemon_pss": mem.pss,
                "daemon_rss_before_trials": rss_before.rss}


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


# -- report ----------------------------------------------------------------------------------------

def verdict(value: float | None, target: float) -> str:
    if value is None:
        return "n/a"
    return "PASS" if value <= target else "FAIL"


def report(b: Bench) -> str:
    r = b.results
    lines = []
    host = r.get("host", {})
    lines.append(f"{host.get('pulsed_version', 'pulsed')} restart / footprint benchmark — "
                 f"{host.get('cpu', '?')}, {host.get('cpus', '?')} CPUs, "
                 f"Linux {host.get('kernel', '?')}, Python {host.get('python', '?')}")
    lines.append(f"loadavg before {host.get('loadavg_before')}, after {host.get('loadavg_after')}")
    checks: list[tuple[str, float | None, str, float]] = []

    k = r.get("kill_restart")
    if k:
        lines += ["", f"1. SIGKILL → replacement ready ({k['trials_per_worker']} trials per worker, ms)",
                  textwrap.fill("   measured: " + k["method"], 110, subsequent_indent="   "),
                  textwrap.fill("   spacing: " + k["spacing"], 110, subsequent_indent="   ")]
        rows = [("worker", "n", "min", "median", "p95", "max", *(head for _, head, _ in PHASES), "target")]
        for w in WORKERS:
            s, ph = k["workers"][w]["kill_to_ready_ms"], k["workers"][w]["phases_median_ms"]
            tgt = f"≤{TARGETS['core_kill_ready_median_ms']:g} / ≤{TARGETS['core_kill_ready_p95_ms']:g}" \
                if w in CORE else "-"
            rows.append((w, s["n"], fmt(s["min"]), fmt(s["median"]), fmt(s["p95"]), fmt(s["max"]),
                         *(fmt(ph.get(key)) for key, _, _ in PHASES), tgt))
            if w in CORE:
                checks.append((f"{w} kill→ready median (ms)", s["median"], "≤", TARGETS["core_kill_ready_median_ms"]))
                checks.append((f"{w} kill→ready p95 (ms)", s["p95"], "≤", TARGETS["core_kill_ready_p95_ms"]))
        s = k["core_pooled_ms"]
        rows.append(("core pooled", s["n"], fmt(s["min"]), fmt(s["median"]), fmt(s["p95"]), fmt(s["max"]),
                     *([""] * len(PHASES)), f"≤{TARGETS['core_kill_ready_median_ms']:g} / ≤{TARGETS['core_kill_ready_p95_ms']:g}"))
        checks.append(("core pooled kill→ready median (ms)", s["median"], "≤", TARGETS["core_kill_ready_median_ms"]))
        checks.append(("core pooled kill→ready p95 (ms)", s["p95"], "≤", TARGETS["core_kill_ready_p95_ms"]))
        lines.append(table(rows, "   "))
        lines.append("   phases, medians of each step from the events (they add up to kill→ready, medians aside):")
        lines += [f"     {head}: {what}" for _, head, what in PHASES]
        mb, ma = k["memory_before"]["pulsed"]["rss"], k["memory_after"]["pulsed"]["rss"]
        lines.append(f"   pulsed RSS before/after the trials: {mb / MiB:.2f} / {ma / MiB:.2f} MiB; "
                     f"tree PSS {k['memory_before']['tree_pss'] / MiB:.2f} / {k['memory_after']['tree_pss'] / MiB:.2f} MiB; "
                     f"trials took {k['elapsed_s']} s")

    m = r.get("memory")
    if m:
        lines += ["", "2. Memory (default timings, all workers running, after settling)"]
        rows = [("process", "pid", "RSS MiB", "PSS MiB", "USS MiB")]
        for p in m["processes"]:
            rows.append((p["cmd"][:48], p["pid"], fmt(p["rss"] / MiB, 2), fmt(p["pss"] / MiB, 2), fmt(p["uss"] / MiB, 2)))
        rows.append(("whole tree (sum)", "", fmt(m["tree_rss_sum"] / MiB, 2), fmt(m["tree_pss"] / MiB, 2),
                     fmt(m["tree_uss"] / MiB, 2)))
        lines.append(table(rows, "   "))
        pm = m["pulsed"]
        lines.append(f"   pulsed (psutil memory_full_info): RSS {pm['rss'] / MiB:.2f} MiB (target ≤ {TARGETS['pulsed_rss_mib']:g}), "
                     f"USS {pm['uss'] / MiB:.2f} MiB, PSS {pm['pss'] / MiB:.2f} MiB")
        lines.append("   pulsed RSS by mapping: " + ", ".join(f"{n} {v / MiB:.1f}" for n, v in pm["rss_by_mapping"]) +
                     f" MiB; {pm['threads']} threads")
        lines.append(f"   whole-tree PSS (smaps_rollup): {m['tree_pss'] / MiB:.2f} MiB (target ≤ {TARGETS['tree_pss_mib']:g})")
        checks.append(("pulsed RSS (MiB)", pm["rss"] / MiB, "≤", TARGETS["pulsed_rss_mib"]))
        checks.append(("whole-tree PSS (MiB)", m["tree_pss"] / MiB, "≤", TARGETS["tree_pss_mib"]))
        if r.get("memory_after_idle"):
            mi = r["memory_after_idle"]
            lines.append(f"   after the idle window: pulsed RSS {mi['pulsed']['rss'] / MiB:.2f} MiB, "
                         f"tree PSS {mi['tree_pss'] / MiB:.2f} MiB")

    i = r.get("idle_cpu")
    if i:
        lines += ["", f"3. Idle CPU over {i['window_s']} s ({i['source']})"]
        if i["requested_s"] < IDLE_REQUIRED_S:
            lines.append(f"   NOTE: window shorter than the {IDLE_REQUIRED_S} s the issue requires; indicative only")
        lines.append(f"   timings in force (defaults, no PULSE_* overrides): {i['timings_in_force']}")
        rows = [("process", "pid", "CPU ms", "% of a core", "wakeups/s", "main thread ms", "stat (all threads) ms")]
        for p in i["processes"]:
            rows.append((p["cmd"][:48], p["pid"], fmt(p["cpu_ms"], 1), fmt(p["cpu_pct"], 4), fmt(p["wakeups_per_s"], 2),
                         fmt(p["main_thread_cpu_ms"], 1), fmt(p["stat_cpu_ms"], 0)))
        rows.append(("whole tree", "", fmt(sum(p["cpu_ms"] for p in i["processes"]), 1), fmt(i["tree_cpu_pct"], 4),
                     fmt(sum(p["wakeups_per_s"] for p in i["processes"]), 2), "", ""))
        lines.append(table(rows, "   "))
        lines.append("   pulsed threads: " + ", ".join(f"{t['comm']} {t['cpu_ms']:.1f} ms ({t['wakeups_per_s']:.2f}/s)"
                                                       for t in i["pulsed_threads"]))
        if i["pulsed_intervals"] and len(i["pulsed_intervals"]) > 1:
            lines.append("   pulsed per interval: " + ", ".join(f"≤{x['until_s']:.0f}s {x['pulsed_cpu_pct']:.4f}%"
                                                              for x in i["pulsed_intervals"]))
        lines.append(f"   events written during the window: {i['events_during_window'] or 'none'}")
        lines.append(f"   targets: pulsed ≤ {TARGETS['pulsed_idle_cpu_pct']:g} %, whole tree ≤ {TARGETS['tree_idle_cpu_pct']:g} %")
        checks.append(("pulsed idle CPU (% of a core)", i["pulsed_cpu_pct"], "≤", TARGETS["pulsed_idle_cpu_pct"]))
        checks.append(("whole-tree idle CPU (% of a core)", i["tree_cpu_pct"], "≤", TARGETS["tree_idle_cpu_pct"]))

    s = r.get("start_to_ready")
    if s:
        f, w = s["fresh_home_ms"], s["existing_home_ms"]
        lines += ["", f"4. pulsed start → READY=1 ({f['n']} trials; {s['method']})",
                  f"   fresh home:    median {fmt(f['median'], 0)} ms (min {fmt(f['min'], 0)}, max {fmt(f['max'], 0)}) "
                  f"samples {s['fresh_samples_ms']}  target ≤ {TARGETS['start_to_ready_median_s'] * 1000:g} ms",
                  f"   existing home: median {fmt(w['median'], 0)} ms (min {fmt(w['min'], 0)}, max {fmt(w['max'], 0)}) "
                  f"samples {s['existing_samples_ms']}",
                  f"   SIGTERM → exit: median {fmt(s['sigterm_to_exit_ms']['median'], 0)} ms, "
                  f"max {fmt(s['sigterm_to_exit_ms']['max'], 0)} ms; exit codes {s['exit_codes']}"]
        checks.append(("start → READY=1, fresh home, median (s)", f["median"] / 1000 if f["median"] else None,
                       "≤", TARGETS["start_to_ready_median_s"]))

    st = r.get("pulsectl_status")
    if st:
        x = st["ms"]
        lines += ["", f"5. `pulsectl --home H status` wall time ({x['n']} runs after a warm-up, Popen → exit)",
                  f"   min {fmt(x['min'])}  median {fmt(x['median'])}  p95 {fmt(x['p95'])}  max {fmt(x['max'])} ms"
                  f"   target median ≤ {TARGETS['pulsectl_status_median_ms']:g} ms; exit codes {st['exit_codes']}"]
        bare = r.get("bare_interpreter")
        if bare:
            lines.append(f"   right after, `{Path(sys.executable).name} -c pass` (the floor): median {fmt(bare['ms']['median'])} ms")
        checks.append(("pulsectl status median (ms)", x["median"], "≤", TARGETS["pulsectl_status_median_ms"]))

    peers = r.get("peers")
    if peers is not None:
        pulse_median = (k or {}).get("core_pooled_ms", {}).get("median")
        lines += ["", "6. Peers: the same kill trial (SIGKILL child → a new child pid has written its ready marker)",
                  "   the peers' child is a bare `python child.py` (no zmq/msgspec/sqlite imports, no sockets): "
                  "cheaper to start than a Pulse worker"]
        rows = [("peer", "n", "min", "median", "p95", "max", "× pulse core median", "daemon RSS MiB", "ctl status median ms",
                 "issue's reference")]
        for name in ("supervisord", "circus"):
            p = peers.get(name)
            if p is None:
                continue
            if "error" in p:
                rows.append((name, "FAILED", "", "", "", "", "", "", "", ""))
                continue
            x = p["kill_to_ready_ms"]
            ratio = x["median"] / pulse_median if x["median"] and pulse_median else None
            p["ratio_to_pulse_core_median"] = ratio
            ref = PEER_REFERENCE[name]
            rows.append((name, x["n"], fmt(x["min"]), fmt(x["median"]), fmt(x["p95"]), fmt(x["max"]),
                         fmt(ratio, 0) if ratio else "-", fmt(p["daemon_rss"] / MiB, 1),
                         fmt(p["ctl_status"]["ms"]["median"], 1),
                         f"{ref['kill_to_ready_median_ms']} ms, {ref['rss_mib']} MiB" +
                         (f", ctl {ref['ctl_status_ms']} ms" if "ctl_status_ms" in ref else "")))
        if pulse_median:
            rows.append(("pulse (core pooled)", k["core_pooled_ms"]["n"], fmt(k["core_pooled_ms"]["min"]),
                         fmt(pulse_median), fmt(k["core_pooled_ms"]["p95"]), fmt(k["core_pooled_ms"]["max"]), "1",
                         fmt(r["memory"]["pulsed"]["rss"] / MiB, 1) if r.get("memory") else "-",
                         fmt(st["ms"]["median"], 1) if st else "-", ""))
        lines.append(table(rows, "   "))
        for name, p in peers.items():
            if "error" in p:
                lines.append(f"   {name} FAILED: " + p["error"].replace("\n", "\n      "))
            else:
                lines.append(f"   {name}: {p['version']}; {p['config']}; ctl: {' '.join(p['ctl_status']['argv'])}")

    c = r.get("cli")
    if c:
        cmds = c["commands"]
        floor = cmds["python -c pass"]["ms"]["median"]
        lines += ["", f"7. pulsectl commands, wall time ({c['rounds']} rounds, round-robin with the floor; "
                      f"loadavg after {c['loadavg_after']})"]
        floor_m = cmds["python -c pass"].get("instructions_m")
        rows = [("command", "n", "min", "median", "p95", "max", "median − floor", "CPU median", "M instr. (×floor)",
                 "target")]
        for label, x in cmds.items():
            s = x["ms"]
            is_floor = label == "python -c pass"
            m = x.get("instructions_m")
            rows.append((label, s["n"], fmt(s["min"]), fmt(s["median"]), fmt(s["p95"]), fmt(s["max"]),
                         "-" if is_floor else fmt(s["median"] - floor if s["median"] and floor else None),
                         fmt(x["cpu_ms"]["median"]), f"{m:.1f} ({m / floor_m:.2f})" if m and floor_m else "-",
                         "(floor)" if is_floor else f"≤{TARGETS['pulsectl_command_median_ms']:g}"))
            if not is_floor:
                checks.append((f"`pulsectl {label}` median (ms)", s["median"], "≤",
                               TARGETS["pulsectl_command_median_ms"]))
        lines.append(table(rows, "   "))

    lines += ["", "Targets"]
    rows = [("metric", "value", "target", "result")]
    for label, value, op, target in checks:
        rows.append((label, fmt(value, 4 if value is not None and value < 1 else 2), f"{op} {target:g}",
                     verdict(value, target)))
    lines.append(table(rows, "   "))
    r["targets"] = [{"metric": lbl, "value": v, "target": t, "pass": None if v is None else v <= t}
                    for lbl, v, _, t in checks]
    if b.anomalies:
        lines += ["", "Notes / anomalies"] + [f"   - {x}" for x in b.anomalies]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, help="kill trials per worker (default 30; --quick: 10)")
    ap.add_argument("--idle-seconds", type=float, help=f"idle CPU window (default {IDLE_REQUIRED_S}; --quick: 10)")
    ap.add_argument("--ready-trials", type=int, help="start → READY=1 trials, fresh home each (default 5; --quick: 3)")
    ap.add_argument("--status-runs", type=int, help="pulsectl status runs (default 30; --quick: 10)")
    ap.add_argument("--peers", action="store_true", help="also install and measure supervisord and circus")
    ap.add_argument("--peer-trials", type=int, help="kill trials per peer (default: --trials, at least 10)")
    ap.add_argument("--peer-spacing", type=float, default=1.5,
                    help="seconds after a peer's new child was ready before the next kill (default 1.5)")
    ap.add_argument("--peer-jitter", type=float, default=1.0,
                    help="random extra 0…N seconds before each peer kill, so a periodic loop cannot lock onto "
                         "the schedule (default 1.0)")
    ap.add_argument("--jitter", type=float, default=0.1,
                    help="random extra 0…N seconds before each pulse kill (default 0.1)")
    ap.add_argument("--spacing", type=float, default=0.3,
                    help="seconds between a replacement being ready and the next kill (default 0.3)")
    ap.add_argument("--healthy-reset-s", type=float, default=0.2,
                    help="PULSE_HEALTHY_RESET_S for the kill-trial pulsed (default 0.2)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds to let a fresh tree settle (default 5)")
    ap.add_argument("--cli-runs", type=int, help="rounds of the pulsectl commands (default 30; --quick: 10)")
    ap.add_argument("--no-instructions", action="store_true",
                    help="skip the commands' instruction counts (one valgrind run each, ~3 s a command)")
    ap.add_argument("--skip", action="append", default=[], choices=["kills", "idle", "ready", "cli"],
                    help="skip a part (repeatable)")
    ap.add_argument("--quick", action="store_true",
                    help="reduced smoke-test run: 10 trials, 10 s idle, 3 READY trials, 10 status runs, "
                         "10 rounds of pulsectl commands; "
                         "peers only with --peers")
    ap.add_argument("--json", action="store_true", help="end the output with one JSON document of every figure")
    a = ap.parse_args(argv)
    q = a.quick
    a.trials = a.trials if a.trials is not None else (10 if q else 30)
    a.idle_seconds = a.idle_seconds if a.idle_seconds is not None else (10.0 if q else float(IDLE_REQUIRED_S))
    a.ready_trials = a.ready_trials if a.ready_trials is not None else (3 if q else 5)
    a.status_runs = a.status_runs if a.status_runs is not None else (10 if q else 30)
    a.cli_runs = a.cli_runs if a.cli_runs is not None else (10 if q else 30)
    a.peer_trials = a.peer_trials if a.peer_trials is not None else max(a.trials, 10)
    if q:
        a.settle = min(a.settle, 2.0)
    if min(a.trials, a.ready_trials, a.status_runs, a.peer_trials, a.cli_runs) < 1 or a.idle_seconds <= 0:
        ap.error("counts and --idle-seconds must be positive")
    return a


def host_info() -> dict:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
            "monotonic": time.get_clock_info("monotonic").implementation,
            "loadavg_before": [round(x, 2) for x in os.getloadavg()]}


def pulse_version(pulsed: str) -> str:
    try:
        return subprocess.run([pulsed, "--version"], capture_output=True, text=True, timeout=30,
                              env=clean_env()).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        return f"? ({err})"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    bench = Bench(args)
    bench.results["host"] = host_info()
    bench.results["host"]["pulsed_version"] = pulse_version(bench.pulsed)
    bench.results["args"] = {k: v for k, v in vars(args).items()}
    log(f"pulsed: {bench.pulsed}; pulsectl: {bench.pulsectl}; scratch: {bench.root}")
    status = 0
    try:
        parts = [("ready", bench.bench_ready), ("kills", bench.bench_kills), ("idle", bench.bench_idle),
                 ("cli", bench.bench_cli)]
        if args.peers:
            parts.append(("peers", bench.bench_peers))
        for name, part in parts:
            if name in args.skip:
                continue
            try:
                part()
            except (Timeout, RuntimeError, OSError, psutil.Error, subprocess.SubprocessError, sqlite3.Error) as err:
                status = 1
                bench.note(f"part `{name}` aborted: {type(err).__name__}: {err}")
    except (KeyboardInterrupt, Interrupted) as err:
        status = 130
        bench.note(f"interrupted ({type(err).__name__} {err}): figures are partial")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)   # cleanup is bounded; let it finish
        log("cleaning up (stopping every process the bench started; further Ctrl-C is ignored)")
        killed = bench.tracker.cleanup()
        if killed:
            bench.note(f"cleanup had to SIGKILL leftover processes: {killed}")
        alive = [pid for pid in bench.tracker.procs if bench.tracker.same(pid)]
        bench.results["cleanup"] = {"tracked_pids": len(bench.tracker.procs), "sigkilled": killed,
                                    "still_alive": alive}
        if alive:
            bench.note(f"processes still alive after cleanup: {alive}")
        shutil.rmtree(bench.root, ignore_errors=True)
    bench.results["host"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(report(bench))
    bench.results["anomalies"] = bench.anomalies
    if args.json:
        print(json.dumps(bench.results, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())
