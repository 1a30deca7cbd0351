#!/usr/bin/env python3
"""Measure routing: four tasks added at once, on one agent and on two of different speeds.

Runs a real `pulsed` (the console script next to this interpreter) on a temporary home with the
engine template's assignment rule and fake agent CLIs that answer like `claude -p --output-format
json` after sleeping (the fast one --fast-s, the slow one --slow-s). For each setup it prints the
wall time from the first task-assigned to the last task-acked (the tasks are
added before pulsed starts, so they are there at once), which agent ran what, and the ratio
of the two-agent time to the one-agent time (about half is the point).

    python scripts/bench_routing.py
    python scripts/bench_routing.py --tasks 8 --fast-s 1 --slow-s 1.3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import log, wait_until  # noqa: E402

BIN = Path(sys.executable).parent
FAKE_AGENT = r'''
import json, os, sys, time
time.sleep(float(os.environ["FAKE_RUN_S"]))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "done",
                  "session_id": "s", "num_turns": 1, "duration_ms": 5, "total_cost_usd": 0.0}))
'''


def agent_toml(script: Path, name: str, run_s: float) -> str:
    return (f'[[agent]]\nname = "{name}"\nadapter = "claude-code"\nmcp = false\n'
            f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, "-p", "{{prompt}}"]\n'
            f'env = {{ FAKE_RUN_S = "{run_s}" }}\n')


def task_events(home: Path, type_: str) -> list[tuple[float, str, dict]]:
    if not (home / "events.db").exists():
        return []
    conn = sqlite3.connect(home / "events.db", timeout=5)
    try:
        rows = conn.execute("SELECT ts, target, data FROM events WHERE type = ? ORDER BY id", (type_,)).fetchall()
    finally:
        conn.close()
    return [(ts, target, json.loads(data)) for ts, target, data in rows]


def run_setup(root: Path, label: str, agents: list[tuple[str, float]], n_tasks: int) -> dict:
    home = root / label / "home"
    home.parent.mkdir(parents=True)
    ctl = [str(BIN / "pulsectl"), "--home", str(home)]
    subprocess.run([*ctl, "init"], check=True, capture_output=True, timeout=60)
    script = root / "fake_agent.py"
    script.write_text(FAKE_AGENT)
    (home / "config.toml").write_text("".join(agent_toml(script, name, s) for name, s in agents))
    for n in range(n_tasks):                 # all there when pulsed starts: "at once", whatever pulsectl's start-up
        subprocess.run([*ctl, "task", "add", "--project", "p", "--title", f"t{n}", "--prompt", "go"],
                       check=True, capture_output=True, timeout=30)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_") and k not in ("NOTIFY_SOCKET",)}
    out = open(home.parent / "pulsed.out", "ab")
    proc = subprocess.Popen([str(BIN / "pulsed"), "--home", str(home)], env={**env, "PULSE_TICK_MS": "200"},
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: subprocess.run([*ctl, "status"], capture_output=True).returncode == 0, 30,
                   interval=0.2, what="pulsed up")
        wait_until(lambda: len(task_events(home, "task-acked")) >= n_tasks, 30 + 5 * n_tasks, interval=0.1,
                   what="every task acked")
        started = task_events(home, "task-assigned")
        acked = task_events(home, "task-acked")
        by_agent: dict[str, int] = {}
        for _, _, data in acked:
            by_agent[data["agent"]] = by_agent.get(data["agent"], 0) + 1
        return {"setup": label, "wall_s": round(max(t for t, *_ in acked) - min(t for t, *_ in started), 2),
                "by_agent": by_agent}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--fast-s", type=float, default=1.0)
    parser.add_argument("--slow-s", type=float, default=1.3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pulse-bench-routing-") as tmp:
        root = Path(tmp)
        log("one agent")
        one = run_setup(root, "one", [("fast", args.fast_s)], args.tasks)
        log("two agents")
        two = run_setup(root, "two", [("fast", args.fast_s), ("slow", args.slow_s)], args.tasks)
    ratio = round(two["wall_s"] / one["wall_s"], 2)
    if args.json:
        print(json.dumps({"one": one, "two": two, "ratio": ratio}))
        return
    print(f"{args.tasks} tasks, fast agent {args.fast_s} s a run, slow agent {args.slow_s} s a run")
    print(f"  one agent:  {one['wall_s']:.2f} s  {one['by_agent']}")
    print(f"  two agents: {two['wall_s']:.2f} s  {two['by_agent']}")
    print(f"  two / one:  {ratio:.2f}")


if __name__ == "__main__":
    main()
