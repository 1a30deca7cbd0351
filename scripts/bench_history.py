#!/usr/bin/env python3
"""Benchmark how Pulse's reaction times follow the age of its history (events.db's size).

For each size (default: empty, 200 MiB, 1 GiB) a home is grown once, the way a busy host writes its
history (noop effects committed, claimed and acked; a task per 100 effects, some failing once before
they are acked and closed; gate facts for each task's session), and kept under --cache; every trial
runs on a fresh copy of it. On a real pulsed with the web worker and one critical process it measures:

  start       pulsed started → every worker running (watcher, tick, executor, engine, web)
  tick+proc   the tick and the critical process SIGKILLed together → its restart-process effect committed
              (the effect event's mono minus CLOCK_MONOTONIC just before the kills)
  web         the web worker SIGKILLed → the first 200 from /metrics
  tasks page  then the first /api/tasks of that new web worker (the task board's first fold)
  executor    the executor SIGKILLed, then `pulsectl emit noop` → that effect acked
  task list   `pulsectl task list` wall time
  effects     `pulsectl effects` wall time (the newest 50 effects, every state)

Progress goes to stderr; the table (medians, and the spread) to stdout; --json adds one JSON document.
Everything it starts is killed by pid at the end.

    python scripts/bench_history.py                         # empty, 200 MiB, 1 GiB; 5 trials each
    python scripts/bench_history.py --sizes 0,20 --trials 3 # a quick look
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import MiB, Timeout, log, wait_until  # noqa: E402

BIN = Path(sys.executable).parent
WORKERS = ("watcher", "tick", "executor", "engine", "web")
CRITICAL = ["sleep", "3600.3434"]
ENV = {"PULSE_TICK_MS": "1000", "PULSE_WATCHER_INTERVAL_MS": "1000"}


# -- growing a history ----------------------------------------------------------------------------------

def grow(home: Path, size_mib: float) -> None:
    """Append to home/events.db, in the real schema, until it holds `size_mib`: per round (one
    transaction) 1,000 noop effects committed through Pulse's effect queue, claimed and acked, and 10
    tasks, every third failing once before it is run again, acked and closed, each with its gate
    session's facts. The task events are appended as the task table allows them, without the
    per-task check-and-append transaction (which reads each task's history: slow on a long one)."""
    from pulse.core.wire import enginerpc, eventmsgs
    from pulse.store import effectqueue, eventsdb
    from pulse.store.connection import Transaction
    conn = eventsdb.open_events(home / "events.db")
    n = conn.execute("SELECT COUNT(*) FROM events WHERE type = 'task-created'").fetchone()[0]
    try:
        while (home / "events.db").stat().st_size < size_mib * MiB:
            effects = [effectqueue.new_effect(enginerpc.Effect(kind="noop", target=f"t{i % 13}", idempotent=True),
                                              "operator", 600) for i in range(1_000)]
            with Transaction(conn):
                for eff in effects:
                    effectqueue.insert_effect(conn, eff, "bench")
                    eventsdb.insert_event(conn, eventmsgs.now_event("effect-executing", "executor", eff.target,
                                                               effect_id=eff.id, kind=eff.kind, claimer="executor"))
                    eventsdb.insert_event(conn, eventmsgs.now_event("effect-acked", "executor", eff.target,
                                                               effect_id=eff.id, kind=eff.kind, duration_s=0.002))
                conn.execute("UPDATE effects SET state = 'acked' WHERE state = 'pending'")
                for k in range(10):
                    n += 1
                    for ev in task_life(n, attempts=2 if k % 3 == 0 else 1):
                        eventsdb.insert_event(conn, ev)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")     # the history's size is the main file's
    finally:
        conn.close()


def task_life(n: int, attempts: int) -> list:
    """The events of task n from created to closed, its runs by agent claude, all but the last failing,
    and its gate session's facts."""
    from pulse.core.wire import eventmsgs
    task, session = f"task-{n}", f"s{n}"
    out = [eventmsgs.now_event("task-created", "bench", task, project="bench", title=f"task {n}", prompt="nothing",
                          priority=0)]
    for attempt in range(attempts):
        run = f"r{n}-{attempt}"
        out += [eventmsgs.now_event("task-assigned", "executor", task, agent="claude", run=run),
                eventmsgs.now_event("task-executing", "executor", task, agent="claude", run=run)]
        if attempt < attempts - 1:
            out.append(eventmsgs.now_event("task-failed", "executor", task, run=run, error="exit 1"))
    call = f"c{n}"
    out += [eventmsgs.now_event("gate-call", "gate", session, phase="open", session=session, task=task, agent="claude"),
            eventmsgs.now_event("gate-call", "gate", session, phase="begin", session=session, call=call, kind="read",
                           tool="read_file", touches=[f"/srv/f{n % 50}"]),
            eventmsgs.now_event("gate-call", "gate", session, phase="end", session=session, call=call, ok=True),
            eventmsgs.now_event("task-acked", "executor", task, run=run, result={"ok": True}),
            eventmsgs.now_event("task-closed", "bench", task)]
    return out


def config_text(pidfile: Path) -> str:
    return textwrap.dedent(f"""
        [web]
        enabled = true
        listen = "127.0.0.1:0"

        # the history as grown, whatever its size: the figures are of reads over it, not of retention
        [store]
        max_mb = 0

        [[process]]
        name = "crit"
        match = "^{' '.join(CRITICAL).replace('.', '[.]')}$"
        restart = ["sh", "-c", "{' '.join(CRITICAL)} </dev/null >/dev/null 2>&1 & echo $! > {pidfile}"]
    """)


def template(cache: Path, size_mib: int) -> Path:
    """The grown home for `size_mib`, built once into the cache."""
    home = cache / f"home-{size_mib}"
    if (home / "grown").exists():
        return home
    shutil.rmtree(home, ignore_errors=True)
    subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "init"], check=True, capture_output=True)
    started = time.monotonic()
    if size_mib:
        log(f"growing a {size_mib} MiB history (once; kept in {cache})")
        grow(home, size_mib)
    (home / "grown").write_text(f"{time.monotonic() - started:.1f}\n")
    return home


def settle(home: Path) -> None:
    """Run pulsed on the grown home once, as the host had run before: its workers fold the history,
    /metrics and the tasks page are read and the tasks listed once (writing their checkpoints, where
    the code has them), then it stops cleanly."""
    log("a first run over it, as the host had before")
    run = Run(home)
    original = (home / "config.toml").read_text()
    (home / "config.toml").write_text(original + config_text(home / "crit.pid"))
    try:
        run.start(timeout=3600)            # the first folds, from the first event: minutes on a loaded host
        run.ticked_since(timeout=3600)
        wait_until(lambda: scrape(metrics_url(run)), 600, interval=0.2, what="/metrics served")
        wait_until(lambda: scrape(metrics_url(run), "/api/tasks"), 600, interval=0.2, what="the tasks page served")
        run.ctl("task", "list", timeout=600)       # an operator had listed the tasks before
    finally:
        run.stop()
        (home / "config.toml").write_text(original)


# -- one pulsed on a copy -------------------------------------------------------------------------------

class Run:
    """One pulsed on a home; asks it over its control socket and reads its stores directly (read-only),
    so polling costs the figures nothing like a pulsectl start each time."""

    def __init__(self, home: Path):
        self.home = home
        self.proc: subprocess.Popen | None = None
        self.started: list[int] = []      # pids of the critical processes started here or by Pulse

    @property
    def paths(self):
        """Read anew each time: pulsed records its runtime directory (a random name) when it starts."""
        from pulse.core.home import Paths
        return Paths.for_client(self.home)

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "pulsectl"), "--home", str(self.home), *args], capture_output=True,
                              text=True, timeout=timeout)

    def status(self):
        from pulse.core import client
        from pulse.core.wire import controlmsgs
        try:
            return client.request(self.paths, controlmsgs.GetStatus(), 2.0).status
        except client.Unreachable:
            return None

    def workers(self) -> dict:
        s = self.status()
        return {w.name: w for w in s.workers} if s else {}

    def all_running(self) -> bool:
        w = self.workers()
        return all(n in w and w[n].state == "running" for n in WORKERS)

    def start(self, timeout: float = 120) -> float:
        critical = subprocess.Popen(CRITICAL, start_new_session=True, stdin=subprocess.DEVNULL)
        self.started.append(critical.pid)
        t0 = time.monotonic()
        self.proc = subprocess.Popen([str(BIN / "pulsed"), "--home", str(self.home)], env={**os.environ, **ENV},
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_until(self.all_running, timeout, interval=0.01, what="every worker running")
        return time.monotonic() - t0

    def pid(self, worker: str) -> int:
        return self.workers()[worker].pid

    def critical_pid(self) -> int | None:
        s = self.status()
        for p in (s.processes if s else ()):
            if p.name == "crit" and p.alive:
                return p.pid
        return None

    def query(self, db: str, sql: str, args: tuple = ()) -> list:
        conn = sqlite3.connect(f"file:{self.home / db}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def last_event(self) -> int:
        return self.query("events.db", "SELECT COALESCE(MAX(id), 0) FROM events")[0][0]

    def effect_event(self, type_: str, after: int, kind: str, target: str) -> float | None:
        """The mono of the first `type_` event after id `after` for an effect of `kind` on `target`."""
        rows = self.query("events.db", "SELECT mono FROM events WHERE id > ? AND type = ? AND target = ? "
                          "AND json_extract(data, '$.kind') = ? ORDER BY id LIMIT 1", (after, type_, target, kind))
        return rows[0][0] if rows else None

    def ticks(self) -> int:
        return self.query("vitals.db", "SELECT COUNT(*) FROM vitals WHERE key = 'tick'")[0][0]

    def ticked_since(self, pid: int | None = None, timeout: float = 300) -> None:
        """Wait until the tick (a new one, if it was `pid`) has ticked twice: its first fold is done."""
        if pid is not None:
            wait_until(lambda: self.workers().get("tick") and self.pid("tick") not in (None, pid), 120,
                       what="a new tick")
        n = self.ticks()
        wait_until(lambda: self.ticks() >= n + 2, timeout, interval=0.05, what="two ticks")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        pidfile = self.home / "crit.pid"
        if pidfile.exists():
            self.started.append(int(pidfile.read_text().strip() or 0))
        for pid in self.started:
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def tick_and_process(run: Run) -> float:
    """Kill the tick and the critical process together; seconds until its restart is committed."""
    victim = wait_until(run.critical_pid, 60, interval=0.05, what="the critical process seen alive")
    run.ticked_since()
    tick = run.pid("tick")
    after = run.last_event()
    t0 = time.monotonic()          # CLOCK_MONOTONIC is the machine's: comparable with an event's mono
    os.kill(tick, signal.SIGKILL)
    os.kill(victim, signal.SIGKILL)
    run.started.append(victim)
    committed = wait_until(lambda: run.effect_event("effect", after, "restart-process", "crit"), 300,
                           interval=0.01, what="the restart committed")
    wait_until(lambda: run.critical_pid() not in (None, victim) and run.all_running(), 60, interval=0.05,
               what="the critical process back")
    run.started.append(run.critical_pid() or 0)
    return committed - t0


def metrics_url(run: Run) -> tuple[str, int, str]:
    url = wait_until(lambda: run.ctl("web", "url").stdout.strip(), 60, what="the web url")
    base, _, token = url.partition("/?token=")
    parts = urllib.parse.urlsplit(base)
    return parts.hostname, parts.port, token


def scrape(address: tuple[str, int, str], path: str = "/metrics") -> bool:
    host, port, token = address
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False
    finally:
        conn.close()


def web_restart(run: Run) -> float:
    wait_until(lambda: scrape(metrics_url(run)), 300, interval=0.05, what="/metrics served")
    pid = run.pid("web")
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    def served() -> bool:
        w = run.workers().get("web")
        if w is None or w.pid in (None, pid) or w.state != "running":
            return False
        return scrape(metrics_url(run))
    wait_until(served, 120, interval=0.02, what="the first /metrics")
    return time.monotonic() - t0


def tasks_page(run: Run) -> float:
    """The tasks page's data (/api/tasks), first asked of the web worker web_restart just restarted."""
    address = metrics_url(run)
    t0 = time.monotonic()
    if not scrape(address, "/api/tasks"):
        raise RuntimeError("/api/tasks did not answer 200")
    return time.monotonic() - t0


def executor_restart(run: Run) -> float:
    pid = run.pid("executor")
    after = run.last_event()
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    out = run.ctl("emit", "noop", "--target", "bench", "--idempotent")
    if out.returncode != 0:
        raise RuntimeError(f"emit failed: {out.stdout} {out.stderr}")
    acked = wait_until(lambda: run.effect_event("effect-acked", after, "noop", "bench"), 300, interval=0.01,
                       what="the effect acked")
    wait_until(run.all_running, 60, what="every worker running")
    return acked - t0


def wall_time(run: Run, *args: str) -> float:
    t0 = time.monotonic()
    out = run.ctl(*args)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return time.monotonic() - t0


def task_list(run: Run) -> float:
    return wall_time(run, "task", "list")


def effects_list(run: Run) -> float:
    return wall_time(run, "effects")


MEASURES = {"start": None, "tick+proc": tick_and_process, "web": web_restart, "tasks page": tasks_page,
            "executor": executor_restart, "task list": task_list, "effects": effects_list}


COPY_IGNORES = shutil.ignore_patterns("runtime-dir", "pulsed.lock", "grown")


def measure(grown: Path, work: Path, trials: int) -> dict[str, list[float]]:
    """Settle a copy of the grown home once (with the code under test), then run each trial on a copy of that."""
    base = work / "settled"
    shutil.rmtree(base, ignore_errors=True)
    shutil.copytree(grown, base, symlinks=True, ignore=COPY_IGNORES)
    settle(base)
    figures: dict[str, list[float]] = {name: [] for name in MEASURES}
    for trial in range(trials):
        home = work / f"run-{trial}"
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(base, home, symlinks=True, ignore=COPY_IGNORES)
        (home / "config.toml").write_text((home / "config.toml").read_text() + config_text(home / "crit.pid"))
        os.sync()     # the copy's writeback (a GiB) is this script's, not pulsed's: done before the clock starts
        run = Run(home)
        try:
            figures["start"].append(run.start())
            for name, fn in MEASURES.items():
                if fn is not None:
                    figures[name].append(fn(run))
            log(f"  trial {trial + 1}: " + ", ".join(f"{n} {v[-1]:.3f}s" for n, v in figures.items()))
        finally:
            run.stop()
            shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0,200,1024", help="MiB of history, comma-separated (0: empty)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "pulse-bench-history",
                        help="where grown homes are kept between runs (default %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the grown homes (else removed at the end)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    args.cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pulse-bench-history-"))
    results: dict[int, dict[str, list[float]]] = {}
    try:
        for size in sizes:
            base = template(args.cache, size)
            actual = (base / "events.db").stat().st_size / MiB
            log(f"{size} MiB (events.db {actual:.0f} MiB): {args.trials} trials")
            results[size] = measure(base, work, args.trials)
    except Timeout as err:
        log(f"gave up: {err}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(args.cache, ignore_errors=True)
    print(f"{'events.db':>10} | " + " | ".join(f"{n:>18}" for n in MEASURES))
    for size, figures in results.items():
        cells = [f"{statistics.median(v):6.3f} s ({min(v):.2f}–{max(v):.2f})" for v in figures.values()]
        print(f"{('empty' if not size else f'{size} MiB'):>10} | " + " | ".join(f"{c:>18}" for c in cells))
    if args.json:
        print(json.dumps({str(size): figures for size, figures in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
