#!/usr/bin/env python3
"""Soak: run a real pulsed for hours under a steady load and fail if anything grows.

pulsed runs with the web worker, the overview's and the events page's streams held open (as a
page open in a browser holds them), noop effects committed at --effects-per-s, a task created and
closed every --task-every-s, and one worker SIGKILLed every --kill-every-s (each in turn, the web
worker included). Every --sample-every-s it samples every process of the tree (RSS, open file
descriptors, by name: a killed worker's replacement continues its series) and the size of each
store and of the log.

Growth is judged by the least-squares slope per hour over the run after its warm-up (the first
--warmup fraction: caches and SQLite's page cache fill once), never by the last value. A process's
series is cut where it was replaced (one slope, an intercept per life: a replacement starting lower
or higher is not growth), each life without its first --process-warmup-s.
A process replaced at least once also has a series "<name> rss across lives" (and fds): every sample of
all its lives (each without its warm-up) fitted with one intercept, so a replacement that starts
where the last one ended (a level that follows the history's size) is growth; a life that rises and
falls back in each life is not. Its bound is the same as the process's.
It also has "<name> rss at same age" (and fds): one point per life, its mean over the same ages in
every life (from --process-warmup-s to the age the shortest replaced life reached), fitted across
the lives' starts: a worker killed every few minutes is compared with its predecessors at the same
age, so neither its warm-up nor a one-off step in each life reads as growth, and a level that
rises with the history does.
A process whose lives are shorter than --min-life-s (a worker killed every few minutes) has its
slope within a life reported but not judged: over a 5-minute life that slope is the life's warm-up
(caches filling, a one-off allocation) multiplied by 12, not a leak; its lives are judged across
lives and at the same age. --kill-every-s 0 kills nothing, so every life is long and judged.
A series fails when even the low end of its slope's 95 % interval is above its bound, so a short
run's noise cannot fail it, and a steady leak fails a long one. The bounds (per hour):

  RSS of any process             4 MiB/h   (a leak of 100 MiB a day)
  open fds of any process        2 /h      (no fd is held per effect, kill or stream reconnect)
  events.db                      grows by design (append-only history): 2 KiB per effect,
                                 so the bound is effects_per_s * 3600 * 2 KiB per hour
  events.db-wal, vitals.db-wal   judged by size, not slope: a WAL fills to SQLite's checkpoint
                                 (1,000 pages, about 4 MiB) and is then reused, never shrunk, so
                                 its slope is steep until it is full and zero after; it fails
                                 above 16 MiB (a checkpoint that never completes)
  vitals.db                      20 MiB/h  (samples kept vitals_retention_h, 24 h: flat after a day)
  objects/                       1 MiB/h   (noop effects store no objects)
  logs/                          judged by size like a WAL: it grows until rotation caps it at
                                 [log] max_bytes x (backups + 1), 60 MiB by default; fails above that

    python scripts/soak.py --hours 1
    python scripts/soak.py --hours 0.02 --json      # about a minute: the tests' version
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import Tracker, die_with_us, log, wait_until  # noqa: E402

from pulse.core import client
from pulse.core.home import Paths  # noqa: E402
from pulse.core.wire import codec, controlmsgs, doorbells, enginerpc  # noqa: E402
from pulse.store import effectqueue, eventsdb  # noqa: E402

BIN = Path(sys.executable).parent
MiB = 1024 * 1024
KILLED = ("watcher", "tick", "executor", "engine", "web")
BOUNDS = {"rss": 4 * MiB, "fds": 2.0, "vitals.db": 20 * MiB, "objects": MiB}
WAL_CAP = 16 * MiB                # see the docstring: a WAL is judged by its size
LOGS_CAP = 10 * MiB * (5 + 1)     # the defaults of [log] max_bytes and backups: rotation's cap
CAPPED = {"events.db-wal": WAL_CAP, "vitals.db-wal": WAL_CAP, "logs": LOGS_CAP}
EVENTS_BYTES_PER_EFFECT = 2048    # an effect's events (committed, executing, acked) with their indexes
T95 = 1.96


# -- the run ---------------------------------------------------------------------------------------

def start(home: Path, tracker: Tracker) -> subprocess.Popen:
    subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "init"], check=True, capture_output=True)
    (home / "config.toml").write_text('[web]\nenabled = true\nlisten = "127.0.0.1:0"\n')
    env = {**os.environ, "PULSE_INTENSITY_RESTARTS": "100000", "PULSE_HEALTHY_RESET_S": "1"}
    proc = subprocess.Popen([str(BIN / "pulsed"), "--home", str(home), "--no-log-stderr"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_us)      # a killed soak leaves no pulsed behind
    tracker.add_root(proc, grace=30)
    wait_until(lambda: all(w.state == "running" for w in status(home).workers) if reachable(home) else None,
               60, 0.1, "every worker running")
    return proc


def reachable(home: Path) -> bool:
    try:
        status(home)
        return True
    except client.Unreachable:
        return False


def status(home: Path) -> controlmsgs.Status:
    return client.request(Paths.for_client(home), controlmsgs.GetStatus(), 3.0).status


def web_address(home: Path) -> tuple[str, int, str]:
    def ask():
        out = subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "web", "url"], capture_output=True,
                             text=True)
        return out.stdout.strip() if out.returncode == 0 else None
    url = wait_until(ask, 30, 0.1, "pulsectl web url")
    base, _, token = url.partition("/?token=")
    host, _, port = base.removeprefix("http://").partition(":")
    return host, int(port), token


def hold_stream(home: Path, path: str, stop: threading.Event, counts: dict) -> None:
    """Read an SSE stream as a page does, reconnecting (like EventSource) when the web worker is killed."""
    while not stop.is_set():
        try:
            host, port, token = web_address(home)
            conn = http.client.HTTPConnection(host, port, timeout=30)
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"})
            response = conn.getresponse()
            while not stop.is_set():
                line = response.fp.readline()
                if not line:
                    break
                counts[path] = counts.get(path, 0) + 1
        except Exception:
            counts[f"{path} reconnects"] = counts.get(f"{path} reconnects", 0) + 1
        stop.wait(1.0)


def commit_noops(home: Path, n: int) -> None:
    conn = eventsdb.open_events(home / "events.db")
    try:
        effects = [effectqueue.new_effect(enginerpc.Effect(kind="noop", idempotent=True), "operator", 600) for _ in range(n)]
        effectqueue.commit_effects(conn, effects, "soak")
    finally:
        conn.close()


def task_round(home: Path, n: int) -> None:
    from pulse.agents import tasks
    conn = eventsdb.open_events(home / "events.db")
    try:
        task = tasks.create(conn, "soak", f"soak task {n}", "nothing to do", source="soak")
        tasks.record(conn, task.id, "task-closed", "soak")
    finally:
        conn.close()


def ring(home: Path) -> None:
    import zmq
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 200)
    push.connect(Paths.for_client(home).endpoint("doorbell"))
    try:
        push.send(codec.encode(doorbells.Doorbell("soak")), zmq.NOBLOCK)
    except zmq.Again:
        pass
    push.close()


# -- sampling --------------------------------------------------------------------------------------

def process_name(proc) -> str:
    title = (proc.cmdline() or [""])[0]
    if title.startswith("pulse: "):   # "pulse: tick [instance]": the worker alone
        return title.removeprefix("pulse: ").split(" [")[0]
    return "forkserver" if "forkserver" in " ".join(proc.cmdline()) else "pulsed"


def sample_processes(root_pid: int, tracker: Tracker) -> dict[str, tuple[int, int, int]]:
    import psutil
    out = {}
    try:
        procs = [psutil.Process(root_pid), *psutil.Process(root_pid).children(recursive=True)]
    except psutil.Error:
        return out
    for proc in procs:
        try:
            tracker.add(proc.pid)
            name = process_name(proc)
            if name in out:          # an effect's or agent's child: not one of Pulse's processes
                continue
            out[name] = (proc.memory_info().rss, proc.num_fds(), proc.pid)
        except psutil.Error:
            continue
    return out


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def sample_stores(home: Path) -> dict[str, int]:
    names = ("events.db", "events.db-wal", "vitals.db", "vitals.db-wal", "objects", "logs")
    return {name: tree_size(home / name) for name in names}


# -- judging ---------------------------------------------------------------------------------------

def slope(segments: list[list[tuple[float, float]]]) -> tuple[float, float]:
    """The least-squares slope per hour common to `segments` of (t seconds, y), each with an intercept
    of its own (a killed worker's replacement starts at its own level: the step is not growth), and
    its standard error per hour."""
    segments = [seg for seg in segments if len(seg) >= 2]
    n = sum(len(seg) for seg in segments)
    dof = n - 1 - len(segments)
    if dof < 1:
        return 0.0, math.inf
    sxx = sxy = 0.0
    centred = []
    for seg in segments:
        mt, my = sum(t for t, _ in seg) / len(seg), sum(y for _, y in seg) / len(seg)
        centred += [(t - mt, y - my) for t, y in seg]
    sxx = sum(t * t for t, _ in centred)
    sxy = sum(t * y for t, y in centred)
    if sxx == 0:
        return 0.0, math.inf
    b = sxy / sxx
    residual = sum((y - b * t) ** 2 for t, y in centred)
    return b * 3600, math.sqrt(residual / dof / sxx) * 3600


ACROSS = " across lives"
SAME_AGE = " at same age"
MIN_LIFE_S = 600.0                # a life shorter than this has its slope reported, not judged (see above)


def base_series(name: str) -> str:
    """The sampled series a derived one is fitted from: 'web rss at same age' → 'web rss'."""
    return name.removesuffix(ACROSS).removesuffix(SAME_AGE)


def bound_of(series: str, effects_per_s: float, bounds: dict) -> float:
    kind = base_series(series).rsplit(" ", 1)[-1]
    if series in CAPPED:
        return CAPPED[series]
    if kind in ("rss", "fds"):
        return bounds[kind]
    if series == "events.db":
        return effects_per_s * 3600 * EVENTS_BYTES_PER_EFFECT
    return bounds[series]


def segments_of(samples: list[dict], name: str, process_warmup_s: float) -> list[list[tuple[float, float]]]:
    """A series cut where its process was replaced (a new pid), each piece without its process's
    first `process_warmup_s` (imports, first connections)."""
    process = name.rsplit(" ", 1)[0]
    pieces: dict = {}
    for s in samples:
        if name in s["values"]:
            pieces.setdefault(s.get("pids", {}).get(process), []).append((s["t"], s["values"][name]))
    return [[(t, y) for t, y in piece if t - piece[0][0] >= process_warmup_s] for piece in pieces.values()]


def across_lives(samples: list[dict], name: str, process_warmup_s: float) -> list[list[tuple[float, float]]]:
    """The samples of every life of `name`'s process, each without its warm-up, as one segment (one
    intercept); no segment when the process had a single life (its own series says it all)."""
    pieces = segments_of(samples, name, process_warmup_s)
    return [[point for piece in pieces for point in piece]] if len(pieces) > 1 else []


def lives_of(samples: list[dict], name: str) -> list[list[tuple[float, float]]]:
    """Every life of `name`'s process (one per pid), its samples in order, the lives by their start."""
    process = name.rsplit(" ", 1)[0]
    lives: dict = {}
    for s in samples:
        if name in s["values"]:
            lives.setdefault(s.get("pids", {}).get(process), []).append((s["t"], s["values"][name]))
    return sorted(lives.values(), key=lambda life: life[0][0])


def same_age(samples: list[dict], name: str, process_warmup_s: float, t_from: float) -> list[list[tuple[float, float]]]:
    """One point per life that started at or after `t_from`: (its start, its mean from age
    `process_warmup_s` to the age every replaced life reached); one segment, or none with fewer than 3."""
    lives = lives_of(samples, name)
    if len(lives) < 2:
        return []
    age_limit = min(life[-1][0] - life[0][0] for life in lives[:-1])    # the last life may be cut by the end
    points = []
    for life in lives:
        start = life[0][0]
        window = [y for t, y in life if process_warmup_s <= t - start <= age_limit]
        if start >= t_from and life[-1][0] - start >= age_limit and window:
            points.append((start, sum(window) / len(window)))
    return [points] if len(points) >= 3 else []


def short_lived(samples: list[dict], name: str, min_life_s: float) -> bool:
    """Whether `name`'s process lived less than `min_life_s` (its median life): its slope within a life
    is its warm-up, not a leak (see the docstring)."""
    ages = sorted(life[-1][0] - life[0][0] for life in lives_of(samples, name))
    return len(ages) > 1 and ages[len(ages) // 2] < min_life_s


def judge(samples: list[dict], warmup: float, effects_per_s: float, bounds: dict = BOUNDS,
          process_warmup_s: float = 30.0, min_life_s: float = MIN_LIFE_S) -> dict[str, dict]:
    """Every series' slope per hour after the warm-up, its bound, and whether it grew beyond it."""
    t_end = samples[-1]["t"]
    kept = [s for s in samples if s["t"] >= warmup * t_end]
    per_process = sorted({k for s in kept for k in s["values"] if k.endswith(("rss", "fds"))})
    names = sorted({k for s in kept for k in s["values"]} | {k + ACROSS for k in per_process}
                   | {k + SAME_AGE for k in per_process})
    out = {}
    for name in names:
        series = base_series(name)
        points = [(s["t"], s["values"][series]) for s in kept if series in s["values"]]
        judged = True
        if name.endswith(ACROSS):
            segments = across_lives(kept, series, process_warmup_s)
        elif name.endswith(SAME_AGE):
            segments = same_age(samples, series, process_warmup_s, warmup * t_end)
        else:
            segments = segments_of(kept, name, process_warmup_s if name.endswith(("rss", "fds")) else 0)
            judged = not (name in per_process and short_lived(samples, name, min_life_s))
        if not segments:
            continue
        per_h, se = slope(segments)
        bound = bound_of(name, effects_per_s, bounds)
        peak = max(y for _, y in points)
        grows = peak > CAPPED[name] if name in CAPPED else judged and per_h - T95 * se > bound
        out[name] = {"slope_per_h": per_h, "stderr_per_h": se, "bound_per_h": bound, "samples": len(points),
                     "first": points[0][1] if points else None, "last": points[-1][1] if points else None,
                     "peak": peak, "grows": grows, "judged": judged}
    return out


def flatten(procs: dict[str, tuple[int, int, int]], stores: dict[str, int]) -> dict[str, float]:
    values = {}
    for name, (rss, fds, _pid) in procs.items():
        values[f"{name} rss"] = rss
        values[f"{name} fds"] = fds
    values.update(stores)
    return values


def human(name: str, value: float) -> str:
    return f"{value:.1f}" if base_series(name).endswith("fds") else f"{value / MiB:.2f} MiB"


# -- main ------------------------------------------------------------------------------------------

def run(args, tracker: Tracker, tmp: Path) -> dict:
    home = tmp / "home"
    proc = start(home, tracker)
    stop = threading.Event()
    counts: dict = {}
    for path in ("/api/stream/overview", "/api/stream/events"):
        threading.Thread(target=hold_stream, args=(home, path, stop, counts), daemon=True).start()
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    duration = args.hours * 3600
    samples, kills, effects, task_n = [], 0, 0, 0
    next_sample = next_kill = next_task = t0
    next_kill += args.kill_every_s
    try:
        while (now := time.monotonic()) - t0 < duration:
            if proc.poll() is not None:
                raise SystemExit(f"pulsed exited with {proc.returncode} during the soak")
            n = max(1, round(args.effects_per_s * 0.2))
            commit_noops(home, n)
            effects += n
            ring(home)
            if now >= next_task:
                task_n += 1
                task_round(home, task_n)
                next_task += args.task_every_s
            if args.kill_every_s > 0 and now >= next_kill:
                victim = KILLED[kills % len(KILLED)]
                pid = next((w.pid for w in status(home).workers if w.name == victim and w.pid), None)
                if pid:
                    tracker.add(pid)
                    os.kill(pid, signal.SIGKILL)
                    kills += 1
                next_kill += args.kill_every_s * rng.uniform(0.8, 1.2)
            if now >= next_sample:
                procs = sample_processes(proc.pid, tracker)
                samples.append({"t": now - t0, "values": flatten(procs, sample_stores(home)),
                                "pids": {name: pid for name, (_, _, pid) in procs.items()}})
                next_sample += args.sample_every_s
            time.sleep(0.2)
        wait_until(lambda: not open_effects(home), 120, 0.5, "every effect ended")
    finally:
        stop.set()
        (home / "ballast").unlink(missing_ok=True)   # a kept home is to look at; its 32 MiB of ballast need not be
    bounds = {**BOUNDS, "rss": args.rss_bound_mib_h * MiB, "fds": args.fds_bound_h}
    verdict = judge(samples, args.warmup, args.effects_per_s, bounds, args.process_warmup_s, args.min_life_s)
    if args.samples:
        Path(args.samples).write_text(json.dumps(samples))
    return {"home": str(home), "seconds": round(time.monotonic() - t0, 1), "effects": effects, "tasks": task_n,
            "kills": kills, "stream_lines": counts, "series": verdict,
            "grew": sorted(name for name, v in verdict.items() if v["grows"])}


def open_effects(home: Path) -> list:
    conn = eventsdb.open_events(home / "events.db")
    try:
        return effectqueue.open_effects(conn, limit=10)
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, required=True)
    parser.add_argument("--effects-per-s", type=float, default=5.0)
    parser.add_argument("--task-every-s", type=float, default=10.0)
    parser.add_argument("--kill-every-s", type=float, default=60.0, help="0: kill nothing (default 60)")
    parser.add_argument("--sample-every-s", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the run not judged (default 0.2)")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--rss-bound-mib-h", type=float, default=BOUNDS["rss"] / MiB,
                        help="RSS growth allowed per process, MiB/h (default 4)")
    parser.add_argument("--fds-bound-h", type=float, default=BOUNDS["fds"],
                        help="open-fd growth allowed per process, per hour (default 2)")
    parser.add_argument("--process-warmup-s", type=float, default=30.0,
                        help="seconds of each process's life (a replacement's too) not judged (default 30)")
    parser.add_argument("--min-life-s", type=float, default=MIN_LIFE_S,
                        help="a process whose lives are shorter has its slope within a life reported, not judged "
                             "(default 600)")
    parser.add_argument("--samples", help="also write every sample to this JSON file")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--keep-home", action="store_true",
                        help="keep the soak's home (events.db, vitals.db, the log) to look at; by default it is "
                             "removed once pulsed has stopped")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # a stopped soak still stops its pulsed
    tracker = Tracker()
    tmp = Path(tempfile.mkdtemp(prefix="pulse-soak-"))
    try:
        result = run(args, tracker, tmp)
    finally:
        tracker.cleanup()
        if not args.keep_home:     # pulsed has stopped: nothing writes the home any more
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"soak: {result['seconds']} s, {result['effects']} effects, {result['tasks']} tasks, "
              f"{result['kills']} worker kills, stream lines {result['stream_lines']}")
        print(f"{'series':34} {'slope/h':>14} {'± 95%':>12} {'bound/h':>12}  first → last")
        for name, v in result["series"].items():
            print(f"{name:34} {human(name, v['slope_per_h']):>14} {human(name, T95 * v['stderr_per_h']):>12} "
                  f"{human(name, v['bound_per_h']):>12}  {human(name, v['first'])} → {human(name, v['last'])}"
                  f" (peak {human(name, v['peak'])})"
                  f"{'  GROWS' if v['grows'] else ''}{'' if v['judged'] else '  (short lives: not judged)'}")
    if result["grew"]:
        log(f"grew beyond its bound: {', '.join(result['grew'])}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
