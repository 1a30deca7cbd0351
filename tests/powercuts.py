"""Power cuts under a running pulsed, shared by tests/test_power_loss.py and scripts/power_cuts.py.

The home lives on powerfs (tests/powerfs.py), which keeps unsynced writes in memory. A cut: every
process of Pulse is frozen (SIGSTOP, so none forks or writes on), then SIGKILLed by pid, then powerfs
drops every write not synced. Then the checks, on what survived, and pulsed starts again on it."""

from __future__ import annotations

import collections
import itertools
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import psutil

from pulse.core import home as home_
from pulse.core.wire import enginerpc
from pulse.store import effectqueue, eventsdb, objects
from support import Pulsed, init_home, wait_for

POWERFS = Path(__file__).with_name("powerfs.py")
REFUSED = 78      # EX_CONFIG: pulsed refuses a store it cannot open, with one line saying which and why


@dataclass
class Outcome:
    """What one cut did: how pulsed came back, and what the checks found."""
    cut_after_s: float
    acked_before: int
    pulsed_was: str = ""            # pulsed, started on what the last cut left, when the power went (state_at_cut)
    problems: list[str] = field(default_factory=list)


def mount(disk: Path, track) -> subprocess.Popen:
    """powerfs on `disk`, in the foreground of its own process (tracked); returns once mounted."""
    disk.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(POWERFS), str(disk)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=open(disk.parent / "powerfs.err", "ab"))
    track(proc.pid)
    wait_for(lambda: os.path.ismount(disk) or proc.poll() is not None, 15, what="powerfs mounted")
    assert proc.poll() is None, (disk.parent / "powerfs.err").read_text()
    return proc


def unmount(disk: Path, proc: subprocess.Popen) -> None:
    subprocess.run(["umount", "-l", str(disk)], check=False)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def sync_tree(root: Path) -> None:
    """fsync every file and directory under root: what `pulsectl init` wrote is on disk, as after an install."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    fd = os.open(root.parent, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def make_home(disk: Path) -> Path:
    """The home is the mount itself: pulsed's own output (beside the home) stays off powerfs."""
    home = disk
    init_home(home)
    (home / "config.toml").write_text(textwrap.dedent("""
        [survival]
        ballast_mb = 1
    """))
    sync_tree(home)
    return home


def side_effect(effect_id: str, sides: Path) -> enginerpc.Effect:
    """A non-idempotent exec effect whose one real side effect is a line in `sides` (off powerfs)."""
    argv = ["/bin/sh", "-c", 'echo "$1" >> "$2"', "power-cut-side-effect", effect_id, str(sides)]
    return enginerpc.Effect(kind="exec", params={"argv": argv}, idempotent=False)


class Load(threading.Thread):
    """Commits a non-idempotent exec effect every 100 ms, as an operator would (about what the executor
    carries out on powerfs: more only piles up); stopped before a cut."""

    def __init__(self, db: Path, sides: Path, track):
        super().__init__(daemon=True)
        self.db, self.sides, self.track, self.stop = db, sides, track, threading.Event()
        self.committed: list[str] = []
        self.git: subprocess.Popen | None = None

    def commit_to_staging(self) -> None:
        """A commit in the engine's staging worktree, as the agent makes when it edits its rules: git
        writes the engine's repository (objects, index, refs) while the power may go."""
        if self.git is None or self.git.poll() is not None:
            staging = self.db.parent / "staging"
            script = 'date +%s%N > power-cut-note && git add power-cut-note && git commit -q -m "a note"'
            self.git = subprocess.Popen(["/bin/sh", "-c", script], cwd=staging, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL,
                                        env={**os.environ, "GIT_AUTHOR_NAME": "agent", "GIT_COMMITTER_NAME": "agent",
                                             "GIT_AUTHOR_EMAIL": "a@localhost", "GIT_COMMITTER_EMAIL": "a@localhost"})
            self.track(self.git.pid)

    def kill_git(self) -> None:
        """The git commit in flight, if any, dies with the power (killed with Pulse, by pid)."""
        if self.git is not None and self.git.poll() is None:
            self.git.kill()
        if self.git is not None:
            self.git.wait(10)

    def run(self):
        conn = None
        for turn in itertools.count():
            if self.stop.wait(0.1):
                break
            if turn % 5 == 0 and (self.db.parent / "staging").exists():
                self.commit_to_staging()     # every half second, or when the last one is done
            eff = effectqueue.new_effect(side_effect("", self.sides), "operator", 600)
            eff = msgspec.structs.replace(eff, params=side_effect(eff.id, self.sides).params)   # its own id
            try:
                conn = conn or eventsdb.open_events(self.db)
                effectqueue.commit_effects(conn, [eff], "power-cut-test")
                self.committed.append(eff.id)
            except sqlite3.Error:
                pass     # the home is still being made, or busy: the next one goes
        if conn is not None:
            conn.close()


def acked(db: Path) -> set[str]:
    """The effects events.db says are acked, read from outside Pulse."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM effects WHERE state = 'acked'")}
    finally:
        conn.close()


def acked_if_any(db: Path) -> set[str]:
    """The acked effects, or none while the first start has not made events.db yet."""
    try:
        return acked(db)
    except sqlite3.Error:
        return set()


def freeze_and_kill(pulsed: Pulsed, track) -> None:
    """Every process of Pulse stopped at once, then killed, by pid: a power cut gives none a last word."""
    frozen: dict[int, psutil.Process] = {}
    while True:
        try:
            procs = pulsed.tree()
        except psutil.NoSuchProcess:
            procs = []
        fresh = [p for p in procs if p.pid not in frozen]
        if not fresh:
            break
        for proc in fresh:
            track(proc.pid)
            try:
                proc.send_signal(signal.SIGSTOP)
            except psutil.NoSuchProcess:
                pass
            frozen[proc.pid] = proc
    for proc in frozen.values():
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    if pulsed.proc.poll() is None:
        pulsed.proc.kill()
    pulsed.proc.wait(10)
    # gone, or a zombie (its files closed): either way it writes nothing more
    wait_for(lambda: all(gone(p) for p in frozen.values()), 10, what="every process of Pulse gone")


def gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def power_cut(disk: Path) -> None:
    with open(disk / ".powercut", "w") as control:
        control.write("cut")


def check_survivors(home: Path, acked_before: set[str], sides: Path, fsck: bool = True) -> list[str]:
    """What must hold on what a cut left: the stores open, nothing acked lost, nothing run twice,
    every object an event names exists, workers.json reads, the engine's git reads (its last commit, or with `fsck`
    every object and ref: slower, so not after every cut)."""
    problems = []
    for db in (home / "events.db", home / "vitals.db"):
        try:
            conn = sqlite3.connect(db, timeout=5)
            verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
            conn.close()
            if verdict != "ok":
                problems.append(f"{db.name}: quick_check says {verdict}")
        except sqlite3.Error as err:
            problems.append(f"{db.name} does not open: {err}")
    try:
        lost = acked_before - acked(home / "events.db")
        if lost:
            problems.append(f"{len(lost)} effects acked before the cut are not acked after it: {sorted(lost)[:3]}")
        conn = sqlite3.connect(home / "events.db", timeout=5)
        missing = [d for d in eventsdb.referenced_objects(conn) if not objects._path(home / "objects", d).exists()]
        conn.close()
        if missing:
            problems.append(f"{len(missing)} objects named by events are missing: {missing[:3]}")
    except sqlite3.Error as err:
        problems.append(f"events.db does not read: {err}")
    try:
        home_.load_stopped(home / "workers.json")
    except home_.HomeError as err:
        problems.append(str(err))
    twice = runs_twice(sides)
    if twice:
        problems.append(f"non-idempotent effects ran more than once: {twice[:3]}")
    engine_check = ("fsck", "--no-progress") if fsck else ("log", "-1", "--format=%H")
    for repo, args in ((home / "engine", engine_check), (home / "staging", ("log", "-1", "--format=%H"))):
        if not repo.exists():
            continue      # staging is made again at the next start, if the cut took it
        git = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        if git.returncode != 0:
            problems.append(f"git {args[0]} in {repo.name}/ fails: {(git.stderr or git.stdout).strip()[:300]}")
    return problems


def runs_twice(sides: Path) -> list[str]:
    lines = sides.read_text().split() if sides.exists() else []
    return [eid for eid, n in collections.Counter(lines).items() if n > 1]


def launch(pulsed: Pulsed, env: dict) -> None:
    pulsed.start(env=env, wait=False)


def state_at_cut(pulsed: Pulsed) -> str:
    """What pulsed was doing when the power went: "running" (its tick, executor and event writer up),
    "starting", or "exit N: <its last line>" (78: it refused what it found, one line saying so)."""
    if pulsed.proc.poll() is not None:
        out = (pulsed.home.parent / "pulsed.out").read_text(errors="replace").strip().splitlines()
        return f"exit {pulsed.proc.returncode}: {out[-1] if out else '(nothing said)'}"
    status = pulsed.try_status()
    # late (a heartbeat overdue, as on a loaded machine over powerfs) is still running
    up = status is not None and all(w.state in ("running", "late") for w in status.workers
                                    if w.name in ("tick", "executor", "eventlog"))
    return "running" if up else "starting"


def toggle_watcher(pulsed: Pulsed) -> None:
    """An operator stops the watcher and starts it again: pulsed writes workers.json each time."""
    for verb in ("stop", "start"):
        try:
            pulsed.ctl(verb, "watcher", timeout=30)
        except subprocess.TimeoutExpired:
            return


def wait_for_acks(pulsed: Pulsed, timeout: float = 20) -> None:
    """Until pulsed runs and its executor has acked an effect since: the cut then falls under load."""
    wait_for(lambda: state_at_cut(pulsed) != "starting", timeout, interval=0.05, what="pulsed running")
    if pulsed.proc.poll() is None:
        start = len(acked_if_any(pulsed.home / "events.db"))
        wait_for(lambda: len(acked_if_any(pulsed.home / "events.db")) > start, timeout, interval=0.05,
                 what="an effect acked")


def run_cuts(n: int, work: Path, pulsed: Pulsed, track, rng: random.Random, *, max_up_s: float = 1.2,
             load_every: int = 5, report=lambda outcome: None) -> list[Outcome]:
    """n power cuts on what the last one left. Most fall at a random moment up to max_up_s after pulsed
    was started (while it opens its stores, starts its workers and takes up the backlog); every
    load_every-th falls up to half a second after its executor acked an effect (under load, on any
    machine, however slow its start)."""
    disk = work / "disk"
    sides = work / "side-effects.log"
    fs = mount(disk, track)
    outcomes: list[Outcome] = []
    # powerfs is slow: a worker must not be taken for hung for it; effects are scanned for often
    env = {"PULSE_READY_TIMEOUT_MS": "20000", "PULSE_HUNG_AFTER_MS": "10000", "PULSE_EXECUTOR_SCAN_INTERVAL_MS": "100"}
    try:
        pulsed.home = make_home(disk)
        for i in range(n):
            launch(pulsed, env)
            load = Load(pulsed.home / "events.db", sides, track)
            load.start()
            started = time.monotonic()
            steering = None
            if i % load_every == load_every - 1:
                wait_for_acks(pulsed)
                steering = threading.Thread(target=toggle_watcher, args=(pulsed,), daemon=True)
                steering.start()      # workers.json is written while the power may go
                time.sleep(rng.uniform(0, 0.5))
            else:
                time.sleep(rng.uniform(0.05, max_up_s))
            up = time.monotonic() - started     # the random moment of the cut: what is in flight then is the test
            load.stop.set()
            load.join(10)
            outcome = Outcome(cut_after_s=round(up, 2), acked_before=0, pulsed_was=state_at_cut(pulsed))
            before = acked_if_any(pulsed.home / "events.db")
            outcome.acked_before = len(before)
            load.kill_git()
            freeze_and_kill(pulsed, track)
            power_cut(disk)
            if steering is not None:
                steering.join(40)     # its pulsectl gets no answer from a dead pulsed, and ends
            outcome.problems = check_survivors(pulsed.home, before, sides, fsck=i % 10 == 9)
            if outcome.pulsed_was not in ("running", "starting") and not outcome.pulsed_was.startswith(f"exit {REFUSED}:"):
                outcome.problems.append(f"pulsed did not come back: {outcome.pulsed_was}")
            outcomes.append(outcome)
            report(outcome)
            if outcome.pulsed_was.startswith("exit"):
                break     # a refused home waits for its operator: the cuts end there
    finally:
        if pulsed.proc is not None and pulsed.proc.poll() is None:
            freeze_and_kill(pulsed, track)
        unmount(disk, fs)
    return outcomes
