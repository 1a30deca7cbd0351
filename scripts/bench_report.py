#!/usr/bin/env python3
"""Benchmark the report: `pulsectl report`'s work over a day of 100,000 events (target ≤ 2 s).

Writes a synthetic day into a temporary events.db (agent runs of four agents, one of which fails
a third of its runs, survival repairs and notifications, ticks, gate calls, errors), then times,
in this process, what pulsectl report --html does after parsing its options: read the window
(eventsdb.events_between, task titles), the deterministic analysis, the citation check, the text
summary and the HTML page. Prints the median of --trials and each part's share, then the wall
time of the command itself (`pulsectl report --since 25h --html FILE`, interpreter start included).

    python scripts/bench_report.py
    python scripts/bench_report.py --events 100000 --trials 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import log  # noqa: E402

from pulse.core.wire.eventmsgs import Event  # noqa: E402
from pulse.report import analysis, render, reportrun  # noqa: E402
from pulse.store import connection, eventsdb  # noqa: E402

DAY = 86_400.0


def synthetic_day(n: int, end: float) -> list[Event]:
    """About `n` events spread over the day before `end`."""
    out: list[Event] = []
    t = end - DAY
    step = DAY / n

    def add(type_: str, source: str, about: str | None, **data) -> None:
        nonlocal t
        t += step
        out.append(Event(type=type_, source=source, target=about, data=data, ts=t, mono=t))

    agents = ["claude", "codex", "hermes", "flaky"]
    task = run = 0
    while len(out) < n:
        k = len(out) % 100
        if k < 45:                                   # an agent run: 8 events
            task += 1
            run += 1
            name, tid, rid = agents[run % 4], f"task-{task}", f"run-{run}"
            add("task-created", "pulsectl", tid, project=f"p{task % 5}", title=f"job <{task}>", prompt="x" * 200)
            add("effect", "tick", tid, id=rid, kind="agent-run", target=tid, origin="engine", params={"task_id": tid})
            add("effect-executing", "executor", tid, effect_id=rid, kind="agent-run")
            add("task-assigned", "executor", tid, agent=name, run=rid)
            add("task-executing", "executor", tid, agent=name, run=rid)
            if name == "flaky" and run % 3 == 0:
                add("task-failed", "executor", tid, agent=name, run=rid, reason="agent", error="exit code 1")
                add("effect-failed", "executor", tid, effect_id=rid, kind="agent-run", error="exit code 1")
            else:
                add("task-acked", "executor", tid, agent=name, run=rid, result={"code": 0, "total_cost_usd": 0.01})
                add("effect-acked", "executor", tid, effect_id=rid, kind="agent-run", run_ms=1000)
            add("task-closed", "pulsectl", tid, by="operator")
        elif k < 55:                                 # a survival repair: 3 events
            eid = f"s{len(out)}"
            add("effect", "tick", "gateway", id=eid, kind="restart-process", target="gateway", origin="survival",
                params={})
            add("effect-executing", "executor", "gateway", effect_id=eid, kind="restart-process")
            ok = len(out) % 7 != 0
            add("effect-acked" if ok else "effect-failed", "executor", "gateway", effect_id=eid,
                kind="restart-process", **({} if ok else {"error": "exit code 1"}))
        elif k < 60:
            add("gate-call", "mcp", "sess-1", tool="read_file", kind="read", ok=True)
        elif k == 60:
            add("gate-blocked", "mcp", "sess-1", tool="write_file", code="FSM_BLOCKED", reason="verify first")
        elif k == 61:
            add("error", "engine", "engine:rules", message=f"boom {len(out) % 13}", count=1)
        else:
            add("tick", "tick", None, n=len(out), effects=1, tick_ms=5000, inner="ok", duration_ms=1.2)
    return out[:n]


def one_report(path: Path, start: float, end: float) -> dict[str, float]:
    parts: dict[str, float] = {}
    t0 = time.perf_counter()
    conn = connection.open_readonly(path)
    events, tasks = reportrun.read(conn, start, end)
    conn.close()
    parts["read_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = reportrun.deterministic(events, tasks, start, end)
    by_id = {ev.id: ev for ev in events}
    analysis.check(result, set(by_id))
    parts["analyse_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    page = render.html(result, by_id)
    render.text(result, "/dev/null")
    parts["render_s"] = time.perf_counter() - t2
    parts["total_s"] = time.perf_counter() - t0
    parts["events"] = len(events)
    parts["runs"] = sum(1 for e in result.timeline if e.run is not None)
    parts["page_bytes"] = len(page)
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    end = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        path = Path(tmp) / "events.db"
        log(f"writing {args.events} events")
        events = synthetic_day(args.events, end)
        conn = eventsdb.open_events(path)
        for i in range(0, len(events), 10_000):
            eventsdb.append_events(conn, events[i:i + 10_000])
        conn.close()
        runs = [one_report(path, end - DAY - 1, end + 1) for _ in range(args.trials)]
        pulsectl = str(Path(sys.executable).parent / "pulsectl")
        walls = []
        for _ in range(args.trials):
            t0 = time.perf_counter()
            subprocess.run([pulsectl, "--home", tmp, "report", "--since", "25h", "--html", str(Path(tmp) / "r.html")],
                           check=True, capture_output=True, timeout=60)
            walls.append(time.perf_counter() - t0)
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    figures = {"events": int(median["events"]), "runs": int(median["runs"]), "page_bytes": int(median["page_bytes"]),
               "total_s_median": round(median["total_s"], 3), "total_s_max": round(max(r["total_s"] for r in runs), 3),
               "read_s": round(median["read_s"], 3), "analyse_s": round(median["analyse_s"], 3),
               "render_s": round(median["render_s"], 3), "target_s": 2.0,
               "pulsectl_wall_s_median": round(statistics.median(walls), 3)}
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"report over {figures['events']:,} events ({figures['runs']:,} runs, page {figures['page_bytes']:,} B): "
              f"median {figures['total_s_median']:.3f} s, max {figures['total_s_max']:.3f} s over {args.trials} trials "
              f"(read {figures['read_s']:.3f} s, analyse {figures['analyse_s']:.3f} s, render {figures['render_s']:.3f} s); "
              f"target ≤ 2 s: {'met' if figures['total_s_median'] <= 2.0 else 'NOT met'}")
        print(f"pulsectl report --html over the same day: median wall {figures['pulsectl_wall_s_median']:.3f} s "
              f"(interpreter start and imports included)")
    return 0 if figures["total_s_median"] <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
