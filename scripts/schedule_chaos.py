#!/usr/bin/env python3
"""Schedules under kills: a [[schedule]] every 2 s while the tick, the executor and pulsed itself
are SIGKILLed at random, then what events.db says ran.

Runs a real `pulsed` (the console script next to this interpreter) on a temporary home for
--seconds (60 by default; tests/test_schedules.py runs 20), then checks, from the events alone:

  - no slot ran twice, and each run's task-created is in the transaction of its schedule-run;
  - every run was of the latest slot due when it ran (so a gap is caught up by one run, not one a slot);
  - every slot that did not run fell within a downtime (from a kill until the victim was back);

and prints the scheduling error, slot time → task-created, for runs on time and for catch-ups.
Exit 0 when every check holds, 1 otherwise. Progress goes to stderr, the figures to stdout.

    python scripts/schedule_chaos.py                 # 60 s
    python scripts/schedule_chaos.py --seconds 20 --seed 7 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import Tracker, fmt, log, summary, wait_until  # noqa: E402

from pulse.core import client
from pulse.core.home import Paths  # noqa: E402
from pulse.core.wire import controlmsgs  # noqa: E402

PERIOD_S = 2
FAST = {"PULSE_HEARTBEAT_MS": "100", "PULSE_HUNG_AFTER_MS": "1500", "PULSE_SQLITE_BUSY_TIMEOUT_MS": "1000",
        "PULSE_STOP_GRACE_MS": "1000", "PULSE_RESTART_BACKOFF_BASE_MS": "50",
        "PULSE_RESTART_BACKOFF_MAX_MS": "400"}
CONFIG = f"""
[[schedule]]
name = "chaos"
every = "{PERIOD_S}s"
task = {{ project = "chaos", title = "a slot", prompt = "nothing to do" }}
overlap = true     # no agent runs these tasks: each slot must still make its own
"""


class Rig:
    def __init__(self, home: Path, tracker: Tracker):
        self.home, self.tracker = home, tracker
        self.pulsed_bin = str(Path(sys.executable).parent / "pulsed")
        self.proc: subprocess.Popen | None = None

    @property
    def paths(self) -> Paths:
        """Read anew each time: pulsed records its runtime directory (a random name) when it starts."""
        return Paths.for_client(self.home)

    def workers(self) -> dict[str, controlmsgs.WorkerStatus] | None:
        try:
            status = client.request(self.paths, controlmsgs.GetStatus(), 1.0).status
        except client.Unreachable:
            return None
        return {w.name: w for w in status.workers}

    def running(self) -> dict[str, controlmsgs.WorkerStatus] | None:
        workers = self.workers()
        wanted = ("tick", "executor", "watcher")
        return workers if workers and all(workers[n].state == "running" for n in wanted) else None

    def start(self) -> None:
        out = open(self.home.parent / "pulsed.out", "ab")
        self.proc = self.tracker.add_root(subprocess.Popen(
            [self.pulsed_bin, "--home", str(self.home)], env={**os.environ, **FAST}, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True), grace=10)
        wait_until(self.running, 20, what="pulsed's workers running")
        self.tracker.add_tree(self.proc.pid)

    def kill(self, victim: str) -> None:
        if victim == "pulsed":
            tree = self.tracker.add_tree(self.proc.pid)
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            wait_until(lambda: not any(self.tracker.same(pid) for pid in tree), 10, what="its workers gone")
            self.start()
            return
        old = self.workers()[victim].pid
        self.tracker.add(old)
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: (w := self.running()) and w[victim].pid != old and w, 20, what=f"{victim} replaced")
        self.tracker.add_tree(self.proc.pid)

    def events(self) -> list[dict]:
        conn = sqlite3.connect(self.home / "events.db", timeout=5)
        try:
            rows = conn.execute("SELECT id, ts, type, target, data FROM events WHERE type IN "
                                "('schedule-run', 'schedule-armed', 'task-created') ORDER BY id").fetchall()
        finally:
            conn.close()
        return [{"id": r[0], "ts": r[1], "type": r[2], "target": r[3], "data": json.loads(r[4])} for r in rows]

    def runs(self) -> list[dict]:
        return [e for e in self.events() if e["type"] == "schedule-run" and not e["data"].get("manual")]


def chaos(rig: Rig, seconds: float, rng: random.Random) -> list[tuple[str, float, float]]:
    """(victim, killed, back) of each kill, for `seconds`."""
    kills = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pause = time.monotonic() + rng.uniform(0.5, 3.0)
        wait_until(lambda: time.monotonic() >= pause, 5, what="the next kill")
        victim = rng.choice(["tick", "tick", "executor", "pulsed"])
        killed = time.time()
        rig.kill(victim)
        kills.append((victim, killed, time.time()))
        log(f"killed {victim}; back after {kills[-1][2] - killed:.2f} s")
    return kills


def check(events: list[dict], kills: list[tuple[str, float, float]]) -> dict:
    runs = [e for e in events if e["type"] == "schedule-run" and not e["data"].get("manual")]
    armed = next(e for e in events if e["type"] == "schedule-armed")
    created = {e["target"]: e for e in events if e["type"] == "task-created"}
    slots = [e["data"]["slot"] for e in runs]
    problems = []
    if len(slots) != len(set(slots)):
        problems.append("a slot ran twice")
    for e in runs:
        task = created.get(e["data"]["task"])
        if task is None or task["id"] != e["id"] - 1 or task["data"].get("slot") != e["data"]["slot"]:
            problems.append(f"slot {e['data']['slot']}: its task is not in its transaction")
        if not 0 <= e["data"]["late_s"] < PERIOD_S:
            problems.append(f"slot {e['data']['slot']} ran {e['data']['late_s']} s late: a later slot was due")
    expected = range(int(armed["data"]["slot"]) + PERIOD_S, int(max(slots)) + 1, PERIOD_S)
    missed = sorted(set(expected) - set(slots))
    for slot in missed:
        if not any(down - PERIOD_S <= slot <= up for _, down, up in kills):
            problems.append(f"slot {slot} was missed while everything was up")
    error = {e["data"]["slot"]: created[e["data"]["task"]]["ts"] - e["data"]["slot"] for e in runs
             if e["data"]["task"] in created}
    after_gap = {s for s in slots if s - PERIOD_S in missed}
    return {"runs": len(runs), "slots_expected": len(expected), "missed_while_down": len(missed),
            "catch_ups": len(after_gap), "problems": problems,
            "error_on_time_ms": summary(v * 1000 for s, v in error.items() if s not in after_gap),
            "error_catch_up_ms": summary(v * 1000 for s, v in error.items() if s in after_gap)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON document")
    args = parser.parse_args()
    tracker = Tracker()
    with tempfile.TemporaryDirectory(prefix="pulse-schedule-chaos-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        (home / "config.toml").write_text(CONFIG)
        rig = Rig(home, tracker)
        try:
            rig.start()
            wait_until(lambda: rig.runs(), 10, what="the first run")
            kills = chaos(rig, args.seconds, random.Random(args.seed))
            count = len(rig.runs())
            wait_until(lambda: len(rig.runs()) >= count + 2, 15, what="two runs after the last kill")
            figures = check(rig.events(), kills)
        finally:
            tracker.cleanup()
    by_victim = {v: sum(1 for k in kills if k[0] == v) for v in ("tick", "executor", "pulsed")}
    on, up = figures["error_on_time_ms"], figures["error_catch_up_ms"]
    print(f"schedule every {PERIOD_S} s, {args.seconds:g} s of kills (seed {args.seed}): "
          f"{len(kills)} kills ({', '.join(f'{n} {v}' for v, n in by_victim.items())})")
    print(f"  runs {figures['runs']} of {figures['slots_expected']} slots; {figures['missed_while_down']} missed "
          f"while down, covered by {figures['catch_ups']} catch-up runs; no slot twice: "
          f"{'yes' if not any('twice' in p for p in figures['problems']) else 'NO'}")
    print(f"  slot → task-created, on time (n={on['n']}): median {fmt(on['median'])} ms, "
          f"p95 {fmt(on['p95'])} ms, max {fmt(on['max'])} ms")
    print(f"  slot → task-created, catch-ups (n={up['n']}): median {fmt(up['median'])} ms, max {fmt(up['max'])} ms")
    for problem in figures["problems"]:
        print(f"  PROBLEM: {problem}")
    if args.json:
        print(json.dumps({"seed": args.seed, "seconds": args.seconds, "kills": by_victim, **figures}))
    return 1 if figures["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
