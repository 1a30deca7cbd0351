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

With --max-mb (a small [store] max_mb, at least 16), the soak is of retention: events.db's live
history stays within that bound while the oldest events move to archive segments, and the event
writer (which runs the moves) is SIGKILLed in the middle of one every --move-kill-every-s: once it
has held the mover's lock for 20 ms, or once a segment's temporary file appears, after a random
delay, so the kill lands in the read of the rows, the segment's write, its sync, its read-back or the
transaction that records it (each kill is classed by what it left: see kill_moves). events.db is then judged by its size, not
its slope: its live pages (and the file) must stay under max_mb + 8 MiB (the pacer plans once a
minute, and a killed event writer plans again 5 s after its restart). At the end it audits the
whole history, read in one snapshot: every event id from 1 to the newest once, live or in a segment
the manifest names; the archive's files exactly the segments the manifest names, of the sizes it
records (it grew by what moved, nothing else); and `pulsectl report` over the whole soak cites only
events that exist, some of them in the archive.

    python scripts/soak.py --hours 1
    python scripts/soak.py --hours 0.02 --json      # about a minute: the tests' version
    python scripts/soak.py --hours 0.4 --max-mb 16 --pregrow-mb 15 --effects-per-s 40 --move-kill-every-s 60
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
from pulse.core.wire import codec, controlmsgs, doorbells, enginerpc, eventmsgs  # noqa: E402
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

def start(home: Path, tracker: Tracker, store: str = "", pregrow_mb: float = 0) -> subprocess.Popen:
    subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "init"], check=True, capture_output=True)
    (home / "config.toml").write_text('[web]\nenabled = true\nlisten = "127.0.0.1:0"\n' + store)
    if pregrow_mb:
        pregrow(home, pregrow_mb)
    env = {**os.environ, "PULSE_INTENSITY_RESTARTS": "100000", "PULSE_HEALTHY_RESET_S": "1"}
    proc = subprocess.Popen([str(BIN / "pulsed"), "--home", str(home), "--no-log-stderr"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_us)      # a killed soak leaves no pulsed behind
    tracker.add_root(proc, grace=30)
    wait_until(lambda: all(w.state == "running" for w in status(home).workers) if reachable(home) else None,
               60, 0.1, "every worker running")
    return proc


def pregrow(home: Path, mb: float) -> None:
    """A history of `mb` MiB before pulsed starts (as a host that ran before): retention has work from the
    first minute, not only once the soak's own events reach the bound."""
    from pulse.store import retention
    conn = eventsdb.open_events(home / "events.db")
    try:
        n = 0
        while retention.live_bytes(conn) < mb * MiB:
            eventsdb.append_events(conn, [eventmsgs.now_event("soak-history", "soak", None, {"i": n + i, "pad": "x" * 400})
                                          for i in range(2_000)])
            n += 2_000
    finally:
        conn.close()


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


# -- retention: a small [store] max_mb, the event writer killed in the middle of moves -------------

HISTORY_SLACK_MIB = 8     # over max_mb: what a minute between plans adds at the soak's rates, and a kill's delay


def kill_moves(home: Path, stop: threading.Event, every_s: float, rng: random.Random, tracker: Tracker,
               kills: list[dict]) -> None:
    """SIGKILL the event writer (it runs retention) in the middle of a move, about every `every_s`, at one of
    two moments drawn in turn: once it has held the mover's lock (archive/.lock, seen in /proc/locks: the
    soak takes no lock, so it never holds a move back) for 20 ms, which a plan with nothing to move rarely
    does, after 0-300 ms more (its plan, the read of the rows, the compression); or once a segment's
    temporary file appears, after 0-100 ms (its write, sync, read-back, or the transaction that records
    it). Each kill is classed by what it left: an unnamed segment file (cut between the write and the
    record), a move recorded (cut after it), or neither (cut before the write)."""
    lock = home / "archive" / ".lock"
    armed_at = time.monotonic()           # the first moves (of a --pregrow-mb history) are the first to be cut
    by_file = False
    while not stop.is_set():
        now = time.monotonic()
        if now < armed_at:
            stop.wait(min(1.0, armed_at - now))
            continue
        holder = lock_holder(lock)
        if holder is None:
            time.sleep(0.003)
            continue
        if by_file:
            if not any(n.startswith(".tmp-") for n in archive_files(home)):
                time.sleep(0.001)
                continue
            delay = rng.uniform(0.0, 0.1)
        else:
            time.sleep(0.02)
            if lock_holder(lock) != holder:
                continue                      # a plan that moved nothing, done already
            delay = 0.02 + rng.uniform(0.0, 0.3)
        moved_before = manifest(home)
        time.sleep(delay - (0.0 if by_file else 0.02))
        try:
            tracker.add(holder)
            os.kill(holder, signal.SIGKILL)
        except ProcessLookupError:
            continue
        time.sleep(0.05)
        named = manifest(home)
        left = [n for n in archive_files(home) if n.startswith(".tmp-") or (n.startswith("events-") and n not in named)]
        kills.append({"t": round(time.time(), 3), "pid": holder, "trigger": "file" if by_file else "lock",
                      "after_ms": round(delay * 1000),
                      "cut": "after the record" if len(named) > len(moved_before) else
                             "between write and record" if left else "before the write"})
        by_file = not by_file
        armed_at = time.monotonic() + every_s * rng.uniform(0.8, 1.2)


def archive_files(home: Path) -> list[str]:
    try:
        return os.listdir(home / "archive")
    except FileNotFoundError:
        return []


def manifest(home: Path) -> set[str]:
    """The segment files events.db's manifest names (a read-only look: no lock that a move would wait on)."""
    import sqlite3
    conn = sqlite3.connect(f"file:{home / 'events.db'}?mode=ro", uri=True, timeout=5)
    try:
        return {r[0] for r in conn.execute("SELECT segment FROM history_moves WHERE segment IS NOT NULL")}
    except sqlite3.Error:
        return set()
    finally:
        conn.close()


def lock_holder(lock: Path) -> int | None:
    """The pid holding an flock on `lock`, from /proc/locks (by the file's inode), or None."""
    try:
        inode = lock.stat().st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and int(fields[5].rsplit(":", 1)[-1]) == inode:
            return int(fields[4])
    return None


def sample_history(home: Path) -> dict[str, int]:
    """The live history's pages in use (what [store] max_mb bounds) and the archive's size."""
    import sqlite3

    from pulse.store import retention
    conn = sqlite3.connect(f"file:{home / 'events.db'}?mode=ro", uri=True, timeout=5)
    try:
        return {"events.db live": retention.live_bytes(conn), "archive": tree_size(home / "archive")}
    finally:
        conn.close()


def audit_history(home: Path, started: float, move_kills: list[dict]) -> dict:
    """The whole history, live and archived, read in one snapshot: each id once; the archive's files the
    segments the manifest names, at the sizes it records; the report over the soak citing real events."""
    import sqlite3

    from pulse.store import archive
    conn = sqlite3.connect(f"file:{home / 'events.db'}?mode=ro", uri=True, timeout=10)
    try:
        conn.execute("BEGIN")
        segments = archive.archived(conn)
        moves = archive.moves(conn)
        live = [r[0] for r in conn.execute("SELECT id FROM events ORDER BY id")]
        moved_events = conn.execute("SELECT COUNT(*) FROM events WHERE type = 'history-moved'").fetchone()[0]
        conn.execute("COMMIT")
    finally:
        conn.close()
    archived_ids: list[int] = []
    problems: list[str] = []
    for seg in segments:
        try:
            events = archive.read_segment(home / archive.DIRECTORY, seg)
        except archive.SegmentError as err:
            problems.append(str(err))
            continue
        archived_ids += [e.id for e in events]
        moved_events += sum(1 for e in events if e.type == "history-moved")     # the records of moves moved too
    ids = archived_ids + live
    doubled = len(ids) - len(set(ids))
    missing = sorted(set(range(1, max(ids) + 1)) - set(ids)) if ids else []
    files = {n: (home / archive.DIRECTORY / n).stat().st_size for n in os.listdir(home / archive.DIRECTORY)
             if n != ".lock"} if (home / archive.DIRECTORY).exists() else {}
    named = {seg.segment: seg.bytes for seg in segments}
    if {n: files.get(n) for n in named} != named:
        problems.append(f"segments the manifest names are missing or of another size: "
                        f"{sorted(n for n in named if files.get(n) != named[n])}")
    # A file no move names is an interrupted move's (the next removes it) or one recorded after the snapshot:
    # its events were live in the snapshot. Any other is a segment the archive grew by that nothing moved.
    first_live = min(live, default=max(ids, default=0) + 1)
    leftovers = sorted(set(files) - set(named))
    stray = [n for n in leftovers if not n.startswith(".tmp-") and int(n.split("-")[1]) < first_live]
    if stray:
        problems.append(f"archive files no move recorded, of events not live: {stray}")
    if doubled or missing:
        problems.append(f"{doubled} events held twice, {len(missing)} missing (first {missing[:5]})")
    if len(moves) != moved_events:
        problems.append(f"{len(moves)} moves in the manifest, {moved_events} history-moved events")
    interrupted = sum(line.count("left by an interrupted move") for line in read_logs(home))
    report = report_citations(home, started, set(archived_ids), set(live))
    if report.get("problem"):
        problems.append(report["problem"])
    return {"events": len(ids), "archived_events": len(archived_ids), "live_events": len(live),
            "moves": len(moves), "segments": len(segments), "archive_bytes": sum(named.values()),
            "leftover_files": len(leftovers),
            "move_kills": len(move_kills),
            "kills_cut": {cut: sum(1 for k in move_kills if k["cut"] == cut) for cut in
                          ("before the write", "between write and record", "after the record")},
            "interrupted_moves_undone": interrupted, "report": report, "problems": problems}


def read_logs(home: Path) -> list[str]:
    logs = home / "logs"
    return [p.read_text(errors="replace") for p in sorted(logs.glob("pulse.log*"))] if logs.exists() else []


def report_citations(home: Path, started: float, archived: set[int], live: set[int]) -> dict:
    """`pulsectl report --json` over the whole soak: how many events it cites, and how many of them are
    in the archive; a problem if one does not exist."""
    from pulse.core import clock
    out = subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "report", "--json", "--from",
                          clock.iso(started - 60), "--to", clock.iso(time.time() + 60)],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return {"problem": f"pulsectl report exited {out.returncode}: {out.stderr[-500:]}"}
    analysis = json.loads(out.stdout)
    cited = {i for part in ("highlights", "issues", "role_analysis", "timeline")
             for claim in analysis.get(part, []) for i in claim.get("event_ids", [])}
    unknown = sorted(cited - archived - live)
    return {"cited": len(cited), "cited_archived": len(cited & archived), "cited_live": len(cited & live),
            **({"problem": f"the report cites events that do not exist: {unknown[:10]}"} if unknown else {})}


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


def bound_of(series: str, effects_per_s: float, bounds: dict, caps: dict = CAPPED) -> float:
    kind = base_series(series).rsplit(" ", 1)[-1]
    if series in caps:
        return caps[series]
    if kind in ("rss", "fds"):
        return bounds[kind]
    if series in ("events.db", "archive"):     # the archive grows by what moved (the audit checks it is only that)
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
          process_warmup_s: float = 30.0, min_life_s: float = MIN_LIFE_S, caps: dict = CAPPED) -> dict[str, dict]:
    """Every series' slope per hour after the warm-up, its bound, and whether it grew beyond it
    (`caps`: the series judged by their peak instead)."""
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
        bound = bound_of(name, effects_per_s, bounds, caps)
        peak = max(y for _, y in points)
        grows = peak > caps[name] if name in caps else judged and per_h - T95 * se > bound
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
    proc = start(home, tracker, f"[store]\nmax_mb = {args.max_mb:g}\nkeep_days = 0\n" if args.max_mb else "",
                 args.pregrow_mb)
    stop = threading.Event()
    counts: dict = {}
    for path in ("/api/stream/overview", "/api/stream/events"):
        threading.Thread(target=hold_stream, args=(home, path, stop, counts), daemon=True).start()
    rng = random.Random(args.seed)
    move_kills: list[dict] = []
    if args.max_mb and args.move_kill_every_s > 0:
        threading.Thread(target=kill_moves, args=(home, stop, args.move_kill_every_s, random.Random(args.seed + 1),
                                                  tracker, move_kills), daemon=True).start()
    started_wall = time.time()
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
                stores = sample_stores(home) | (sample_history(home) if args.max_mb else {})
                samples.append({"t": now - t0, "values": flatten(procs, stores),
                                "pids": {name: pid for name, (_, _, pid) in procs.items()}})
                next_sample += args.sample_every_s
            time.sleep(0.2)
        wait_until(lambda: not open_effects(home), 120, 0.5, "every effect ended")
    finally:
        stop.set()
        (home / "ballast").unlink(missing_ok=True)   # a kept home is to look at; its 32 MiB of ballast need not be
    bounds = {**BOUNDS, "rss": args.rss_bound_mib_h * MiB, "fds": args.fds_bound_h}
    caps = CAPPED
    if args.max_mb:     # a bounded history: judged by its size
        caps = {**CAPPED, "events.db live": (args.max_mb + HISTORY_SLACK_MIB) * MiB,
                # the file does not shrink below what a --pregrow-mb history made it (freed pages are reused)
                "events.db": (max(args.max_mb, args.pregrow_mb) + HISTORY_SLACK_MIB) * MiB}
    verdict = judge(samples, args.warmup, args.effects_per_s, bounds, args.process_warmup_s, args.min_life_s, caps)
    if args.samples:
        Path(args.samples).write_text(json.dumps(samples))
    result = {"home": str(home), "seconds": round(time.monotonic() - t0, 1), "effects": effects, "tasks": task_n,
              "kills": kills, "stream_lines": counts, "series": verdict,
              "grew": sorted(name for name, v in verdict.items() if v["grows"])}
    if args.max_mb:
        result["retention"] = audit_history(home, started_wall, move_kills)
        # from when the live history first came within its bound (a --pregrow-mb history starts over it)
        within = next((i for i, s in enumerate(samples) if s["values"].get("events.db live", 0) <= args.max_mb * MiB),
                      0)
        bounded = [s["values"] for s in samples[within:]] or [{}]
        result["retention"]["peak_live_bytes"] = max(v.get("events.db live", 0) for v in bounded)
        result["retention"]["peak_file_bytes"] = max(v.get("events.db", 0) for v in bounded)
        result["retention"]["max_mb"] = args.max_mb
    return result


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
    parser.add_argument("--max-mb", type=float, default=0,
                        help="[store] max_mb (at least 16): a soak of retention, audited at the end (default 0: off)")
    parser.add_argument("--move-kill-every-s", type=float, default=60.0,
                        help="with --max-mb: SIGKILL the event writer in the middle of a move about this often "
                             "(default 60; 0: never)")
    parser.add_argument("--pregrow-mb", type=float, default=0,
                        help="grow events.db to this many MiB before pulsed starts, so retention moves from the "
                             "first minute (default 0)")
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
        if "retention" in result:
            r = result["retention"]
            print(f"history: {r['events']} events ({r['archived_events']} archived in {r['segments']} segments, "
                  f"{r['archive_bytes'] / MiB:.2f} MiB; {r['live_events']} live, peak {r['peak_live_bytes'] / MiB:.2f} "
                  f"MiB of pages, file {r['peak_file_bytes'] / MiB:.2f} MiB); {r['moves']} moves; {r['move_kills']} "
                  f"event writer kills in moves {r['kills_cut']}, {r['interrupted_moves_undone']} interrupted moves undone; "
                  f"report "
                  f"cites {r['report'].get('cited')} events, {r['report'].get('cited_archived')} archived; "
                  f"problems: {r['problems'] or 'none'}")
    if result["grew"]:
        log(f"grew beyond its bound: {', '.join(result['grew'])}")
        return 1
    if result.get("retention", {}).get("problems"):
        log(f"history: {'; '.join(result['retention']['problems'])}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
