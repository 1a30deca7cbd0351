#!/usr/bin/env python3
"""Benchmark the pipeline: Percept → Understand → Execute, end to end, on a real pulsed.

  (a) a critical process dies → its restart command's new process exists: median/p95 over --trials,
      with the engine healthy, then again with the engine SIGSTOPped (target median ≤ 100 ms,
      p95 ≤ 250 ms both ways). The victim and its restart write "pid monotonic" to a marker file
      the moment they start (python -S, so interpreter start-up is counted but site's is not).
  (b) `pulsectl emit noop` → effect-acked: commit → acked from the events' own monotonic stamps,
      and the CLI's wall time with --wait.
  (c) sustained noop effects end to end (committed → all acked), at the executor's durability
      (events.db synchronous=FULL for claims): target ≥ 1,000/s.
  (d) events.db batched append (eventsdb.append_events, batches of 1,000): target ≥ 100,000 events/s.

Everything it starts is tracked by pid and stopped at the end.

    python scripts/bench_pipeline.py --quick
    python scripts/bench_pipeline.py --json
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
import textwrap
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import Timeout, Tracker, log, summary, table, wait_until  # noqa: E402

from pulse.core import wire  # noqa: E402
from pulse.core.home import Paths  # noqa: E402
from pulse.store import effectqueue, eventsdb  # noqa: E402

BIN = Path(sys.executable).parent
VICTIM_TAG = "pulse-bench-victim"
# Written at the very start of the victim (and of every restart of it): its pid and CLOCK_MONOTONIC.
VICTIM = textwrap.dedent("""
    import os, sys, time
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()} {time.monotonic()}\\n")
    while True:
        time.sleep(3600)
""")
TARGETS = {"restart_median_ms": 100, "restart_p95_ms": 250, "sustained_per_s": 1000, "append_per_s": 100_000}


def start_pulsed(home: Path, tracker: Tracker, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([str(BIN / "pulsed"), "--home", str(home), "--no-log-stderr"],
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    tracker.add_root(proc)
    from pulse.core import client

    def running():
        try:   # the runtime directory is known once pulsed has recorded it (its name is random)
            status = client.request(Paths.for_client(home), wire.GetStatus(), 1.0).status
        except client.Unreachable:
            return None
        return status if all(w.state == "running" for w in status.workers) else None
    status = wait_until(running, 30, what="pulsed running")
    for w in status.workers:
        tracker.add(w.pid)
    return proc


def markers(path: Path) -> list[tuple[int, float]]:
    if not path.exists():
        return []
    return [(int(p), float(t)) for p, t in (line.split() for line in path.read_text().splitlines() if line.strip())]


def vital_pid(vitals_db: Path, name: str = VICTIM_TAG) -> int | None:
    try:
        conn = sqlite3.connect(f"file:{vitals_db}?mode=ro", uri=True)
        row = conn.execute("SELECT data FROM vitals WHERE key = ? ORDER BY ts DESC LIMIT 1",
                           (f"process-alive:{name}",)).fetchone()
        conn.close()
    except sqlite3.Error:
        return None
    data = json.loads(row[0]) if row else {}
    return data.get("pid") if data.get("alive") else None


def restart_settled(events_db: Path) -> bool:
    """No restart-process effect still open: the last restart was acked (a restart of a long-running
    process is acked after a 1 s grace; killing it inside the grace would fail the restart and make
    processWatchdog back off, which this benchmark must not measure)."""
    conn = sqlite3.connect(f"file:{events_db}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT COUNT(*) FROM effects WHERE kind = 'restart-process' "
                           "AND state IN ('pending', 'executing')").fetchone()
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()
    return row[0] == 0


def restart_trials(home: Path, marker: Path, tracker: Tracker, trials: int, label: str) -> list[float]:
    """Kill the victim, time until its replacement starts; wait until the watcher watches the new one
    and the restart that made it has ended, so no backoff is ever in play."""
    out = []
    for i in range(trials):
        pid, _ = markers(marker)[-1]
        wait_until(lambda: vital_pid(home / "vitals.db") == pid and restart_settled(home / "events.db"), 15,
                   what="the watcher watching the victim, its restart settled")
        before = len(markers(marker))
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        new_pid, started = wait_until(lambda: markers(marker)[before:] and markers(marker)[before], 10,
                                      what=f"the victim's restart ({label}, trial {i + 1})")
        tracker.add(new_pid)
        out.append((started - killed_at) * 1000)
    return out


def bench_restart(tmp: Path, tracker: Tracker, trials: int) -> dict:
    home = tmp / "restart-home"
    home.mkdir()
    marker = tmp / "victim.markers"
    argv = [sys.executable, "-S", "-c", VICTIM, str(marker), VICTIM_TAG]
    (home / "config.toml").write_text(textwrap.dedent(f"""
        [[process]]
        name = "{VICTIM_TAG}"
        match = "{VICTIM_TAG}"
        restart = {json.dumps(argv)}
        min_uptime_s = 0                  # killed seconds after each start: no crash loop, which is not measured here
    """))
    victim = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL)
    tracker.add(victim.pid)
    # The engine stays frozen for the second half: pulsed must not replace it meanwhile.
    start_pulsed(home, tracker, {"PULSE_HUNG_AFTER_MS": "600000"})
    wait_until(lambda: markers(marker), 10, what="the victim's first marker")
    healthy = restart_trials(home, marker, tracker, trials, "engine healthy")
    from pulse.core import client
    status = client.request(Paths.for_client(home), wire.GetStatus()).status
    engine = next(w.pid for w in status.workers if w.name == "engine")
    os.kill(engine, signal.SIGSTOP)
    try:
        frozen = restart_trials(home, marker, tracker, trials, "engine SIGSTOPped")
    finally:
        os.kill(engine, signal.SIGCONT)
    return {"engine_healthy_ms": summary(healthy), "engine_stopped_ms": summary(frozen)}


def bench_effects(tmp: Path, tracker: Tracker, emits: int, sustained: int) -> dict:
    home = tmp / "effects-home"
    start_pulsed(home, tracker, {})
    paths = Paths.for_client(home)
    conn = eventsdb.open_events(paths.events_db)
    import zmq
    bell = zmq.Context.instance().socket(zmq.PUSH)
    bell.setsockopt(zmq.LINGER, 0)
    bell.connect(paths.endpoint("doorbell"))

    def ring():
        try:
            bell.send(wire.encode(wire.Doorbell("bench")), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def acked_mono(effect_id: str) -> float | None:
        row = conn.execute("SELECT mono FROM events WHERE type = 'effect-acked' AND "
                           "json_extract(data, '$.effect_id') = ?", (effect_id,)).fetchone()
        return row[0] if row else None

    latencies = []
    for _ in range(emits):
        effect = effectqueue.new_effect(wire.Effect(kind="noop"), "operator", 60)
        committed = time.monotonic()
        effectqueue.commit_effects(conn, [effect], "bench")
        ring()
        acked = wait_until(lambda: acked_mono(effect.id), 10, interval=0.001, what="effect-acked")
        latencies.append((acked - committed) * 1000)

    cli = []
    for _ in range(min(emits, 10)):
        started = time.monotonic()
        subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "emit", "noop", "--wait", "10"],
                       check=True, capture_output=True, timeout=30)
        cli.append((time.monotonic() - started) * 1000)

    effects = [effectqueue.new_effect(wire.Effect(kind="noop", idempotent=True), "operator", 600) for _ in range(sustained)]
    started = time.monotonic()
    for i in range(0, sustained, 100):
        effectqueue.commit_effects(conn, effects[i:i + 100], "bench")
        ring()
    committed_s = time.monotonic() - started

    def all_done():
        row = conn.execute("SELECT COUNT(*) FROM effects WHERE state IN ('pending', 'executing')").fetchone()
        return row[0] == 0
    wait_until(all_done, 600, interval=0.05, what="all sustained effects ended")
    elapsed = time.monotonic() - started
    states = dict(conn.execute("SELECT state, COUNT(*) FROM effects GROUP BY state").fetchall())
    return {"emit_to_acked_ms": summary(latencies), "pulsectl_emit_wait_ms": summary(cli),
            "sustained": {"effects": sustained, "seconds": round(elapsed, 3), "per_s": round(sustained / elapsed),
                          "commit_seconds": round(committed_s, 3), "states": states}}


def bench_append(tmp: Path, total: int) -> dict:
    conn = eventsdb.open_events(tmp / "append.db")
    batch = [wire.now_event("collect", "bench", "x", n=i) for i in range(1000)]
    started = time.monotonic()
    for _ in range(total // 1000):
        for ev in batch:
            ev.id = None
        eventsdb.append_events(conn, batch)
    elapsed = time.monotonic() - started
    return {"events": total, "seconds": round(elapsed, 3), "per_s": round(total / elapsed), "synchronous": "NORMAL"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--emits", type=int, default=50)
    parser.add_argument("--sustained", type=int, default=5000)
    parser.add_argument("--append", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="10 trials, fewer effects")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.emits, args.sustained, args.append = 10, 10, 1000, 50_000
    tracker = Tracker()
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    try:
        with tempfile.TemporaryDirectory(prefix="pulse-bench-") as tmp:
            tmp = Path(tmp)
            log("(a) critical process restart")
            results["restart"] = bench_restart(tmp, tracker, args.trials)
            tracker.cleanup()
            log("(b, c) effects")
            results["effects"] = bench_effects(tmp, tracker, args.emits, args.sustained)
            tracker.cleanup()
            log("(d) events.db append")
            results["append"] = bench_append(tmp, args.append)
    except Timeout as err:
        log(f"FAILED: {err}")
        return 1
    finally:
        tracker.cleanup()
    r, e = results["restart"], results["effects"]
    rows = [("figure", "n", "min", "median", "p95", "max", "target")]
    for label, s, target in (("(a) restart, engine healthy (ms)", r["engine_healthy_ms"], "≤100 / ≤250"),
                             ("(a) restart, engine SIGSTOPped (ms)", r["engine_stopped_ms"], "≤100 / ≤250"),
                             ("(b) emit → acked (ms)", e["emit_to_acked_ms"], ""),
                             ("(b) pulsectl emit --wait, wall (ms)", e["pulsectl_emit_wait_ms"], "")):
        rows.append((label, str(s["n"]), *(f"{s[k]:.1f}" for k in ("min", "median", "p95", "max")), target))
    print(table(rows))
    print(f"  (c) sustained noop end to end: {e['sustained']['per_s']}/s "
          f"({e['sustained']['effects']} effects in {e['sustained']['seconds']} s; target ≥ 1000/s)")
    print(f"  (d) events.db batched append: {results['append']['per_s']}/s (target ≥ 100000/s)")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
