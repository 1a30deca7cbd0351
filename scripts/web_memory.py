#!/usr/bin/env python3
"""What the web worker's memory depends on: one home whose events.db is grown to each of --sizes-mib
(noop effects committed and acked, a task created and closed every 100 effects, as the soak writes),
and at each size a real pulsed with the web worker started on it. The web worker's memory is read
from /proc/<pid>/smaps_rollup and smaps at four moments: ready; its start-up fold done; after
--load-s seconds of a page's two streams held open and /metrics, /api/tasks, /api/gate and
/api/effects asked in turn; and --rest-s seconds later (the streams still open). Rss is split into
anonymous memory (the heap, thread stacks: what could leak) and file-backed pages (the interpreter's
and libraries' code, an mmap of a database: shared with the page cache, never a leak).

    python scripts/web_memory.py                         # 5, 20 and 80 MiB
    python scripts/web_memory.py --sizes-mib 5 20 --json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
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
from pulse.core.wire import controlmsgs, enginerpc  # noqa: E402
from pulse.store import effectqueue, eventsdb  # noqa: E402

BIN = Path(sys.executable).parent
MiB = 1024 * 1024
BATCH = 500                        # effects committed per transaction while the history is grown


def grow_history(home: Path, size_mib: float) -> int:
    """Commit and ack noop effects (and a task per 100) until events.db holds `size_mib`; effects added."""
    from pulse.agents import tasks
    conn = eventsdb.open_events(home / "events.db")
    added = 0
    try:
        while db_size(home) < size_mib * MiB:
            effects = [effectqueue.new_effect(enginerpc.Effect(kind="noop", target=f"t{i % 13}", idempotent=True),
                                              "operator", 600) for i in range(BATCH)]
            effectqueue.commit_effects(conn, effects, "bench")
            for effect in effects:
                effectqueue.finish_effect(conn, effect.id, "acked", "bench", from_states=("pending",),
                                          duration_s=0.01)
            for _ in range(BATCH // 100):
                task = tasks.create(conn, "bench", "a task", "nothing to do", source="bench")
                tasks.record(conn, task.id, "task-closed", "bench")
            added += BATCH
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")     # the history's size is the main file's
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return added


def db_size(home: Path) -> int:
    return (home / "events.db").stat().st_size


def memory_of(pid: int, db: Path) -> dict[str, float]:
    """The process's Rss, its anonymous and file-backed parts, Private_Dirty, and the resident pages of
    any mapping of `db` (SQLite's mmap), in MiB."""
    rollup = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        rollup[key] = int(value.split()[0]) * 1024
    db_rss, mapping = 0, ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            mapping = head[-1] if len(head) >= 6 else ""
        elif head and head[0] == "Rss:" and mapping.startswith(str(db)):
            db_rss += int(head[1]) * 1024
    out = {"rss": rollup["Rss"], "anon": rollup["Anonymous"], "file": rollup["Rss"] - rollup["Anonymous"],
           "private_dirty": rollup["Private_Dirty"], "db_mapped": db_rss,
           "threads": len(os.listdir(f"/proc/{pid}/task"))}
    return {k: (v / MiB if k != "threads" else v) for k, v in out.items()}


def status(home: Path) -> controlmsgs.Status:
    return client.request(Paths.for_client(home), controlmsgs.GetStatus(), 3.0).status


def web_pid(home: Path) -> int | None:
    try:
        return next((w.pid for w in status(home).workers if w.name == "web" and w.state == "running"), None)
    except client.Unreachable:
        return None


def web_address(home: Path) -> tuple[str, int, str]:
    def ask():
        out = subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "web", "url"], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else None
    url = wait_until(ask, 30, 0.1, "pulsectl web url")
    base, _, token = url.partition("/?token=")
    host, _, port = base.removeprefix("http://").partition(":")
    return host, int(port), token


def get(address: tuple[str, int, str], path: str) -> int:
    host, port, token = address
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def hold_stream(address: tuple[str, int, str], path: str, stop: threading.Event, lines: dict) -> None:
    host, port, token = address
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"})
        response = conn.getresponse()
        while not stop.is_set() and response.fp.readline():
            lines[path] = lines.get(path, 0) + 1
    except OSError:
        pass
    finally:
        conn.close()


def settled(pid: int, db: Path, quiet_s: float = 2.0, timeout: float = 120) -> dict[str, float]:
    """The memory once Rss has stopped moving for `quiet_s` (the start-up fold runs in a thread)."""
    last, since, deadline = None, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = memory_of(pid, db)
        if last is None or abs(now["rss"] - last["rss"]) > 0.1:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
        time.sleep(0.25)
    return last


ASKED = ("/metrics", "/api/tasks", "/api/gate", "/api/effects")


def measure(home: Path, tracker: Tracker, load_s: float, asked: tuple[str, ...] = ASKED,
            streams_open: bool = True, rest_s: float = 0.0) -> dict:
    env = {**os.environ, "PULSE_INTENSITY_RESTARTS": "100000"}
    proc = subprocess.Popen([str(BIN / "pulsed"), "--home", str(home), "--no-log-stderr"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_us)
    tracker.add_root(proc, grace=30)
    try:
        pid = wait_until(lambda: web_pid(home), 120, 0.1, "the web worker running")
        tracker.add(pid)
        db = home / "events.db"
        started = settled(pid, db)
        address = web_address(home)
        get(address, "/metrics")                    # waits for the start-up fold, if it still runs
        folded = settled(pid, db)
        stop, lines = threading.Event(), {}
        streams = [threading.Thread(target=hold_stream, args=(address, path, stop, lines), daemon=True)
                   for path in ("/api/stream/overview", "/api/stream/events") if streams_open]
        for thread in streams:
            thread.start()
        end = time.monotonic() + load_s
        while time.monotonic() < end:
            for path in asked:
                get(address, path)
            if not asked:
                time.sleep(0.5)
        loaded = memory_of(pid, db)
        time.sleep(rest_s)                          # streams still open, as a page left open holds them
        rested = memory_of(pid, db)
        stop.set()
        return {"events_db_mib": db.stat().st_size / MiB, "ready": started, "folded": folded, "loaded": loaded,
                "rested": rested, "stream_lines": lines}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[5, 20, 80])
    parser.add_argument("--load-s", type=float, default=15.0, help="seconds of streams and requests (default 15)")
    parser.add_argument("--ask", nargs="*", default=list(ASKED), help=f"the pages asked in turn (default {ASKED})")
    parser.add_argument("--rest-s", type=float, default=65.0,
                        help="seconds after the requests, streams open, before 'rested' (default 65: a trim's period)")
    parser.add_argument("--no-streams", action="store_true", help="hold no stream open")
    parser.add_argument("--home", help="grow and measure this home (made if missing) rather than a temporary one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="pulse-webmem-")) / "home"
    if not (home / "config.toml").exists():
        subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "init"], check=True, capture_output=True)
        (home / "config.toml").write_text('[web]\nenabled = true\nlisten = "127.0.0.1:0"\n')
    tracker, rows = Tracker(), []
    try:
        for size in sorted(args.sizes_mib):
            t0 = time.monotonic()
            added = grow_history(home, size)
            log(f"events.db at {db_size(home) / MiB:.1f} MiB (+{added} effects in {time.monotonic() - t0:.0f} s)")
            rows.append(measure(home, tracker, args.load_s, tuple(args.ask), not args.no_streams, args.rest_s))
    finally:
        tracker.cleanup()
        (home / "ballast").unlink(missing_ok=True)
    if args.json:
        print(json.dumps({"home": str(home), "rows": rows}, indent=1))
        return 0
    print(f"{'events.db':>10} {'moment':>7} {'rss':>7} {'anon':>7} {'file':>7} {'dirty':>7} {'db map':>7} {'thr':>4}")
    for row in rows:
        for moment in ("ready", "folded", "loaded", "rested"):
            m = row[moment]
            print(f"{row['events_db_mib']:>7.1f} MiB {moment:>7} {m['rss']:>7.1f} {m['anon']:>7.1f} {m['file']:>7.1f} "
                  f"{m['private_dirty']:>7.1f} {m['db_mapped']:>7.1f} {m['threads']:>4}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
