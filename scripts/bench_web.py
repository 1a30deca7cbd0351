#!/usr/bin/env python3
"""Benchmark the web worker on a real pulsed, in Debian's headless Chromium (Playwright):

  1. the web worker's RSS, with the overview open;
  2. overview load: navigation → every worker row rendered (median of --loads);
  3. event committed → shown on the open events page (median of --events; target ≤ 500 ms), and
     → read off the events stream (/api/stream/events) by a plain HTTP client (target ≤ 10 ms);
  4. GET /metrics with 1,000,000 events in events.db: the first scrape (which folds the history
     once) and the median of later ones, each after 100 new events (target ≤ 200 ms);
  5. the tick's SIGKILL → replacement ready (bench_restart's measure: the worker-ready event's mono
     minus the time taken just before the kill), without the web worker, then with it running
     and the overview open.

    python scripts/bench_web.py
    python scripts/bench_web.py --quick --json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import Tracker, log, summary, wait_until  # noqa: E402
from bench_pipeline import start_pulsed  # noqa: E402

from pulse.core.wire import controlmsgs, eventmsgs  # noqa: E402
from pulse.store import connection, eventsdb  # noqa: E402

BIN = Path(sys.executable).parent
CHROMIUM = "/usr/bin/chromium"
LAUNCH = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
          "--disable-sync", "--no-first-run"]
FAST_RESTARTS = {"PULSE_HEALTHY_RESET_S": "0.2", "PULSE_INTENSITY_RESTARTS": "10000"}
TARGETS = {"event_to_page_median_ms": 500, "event_to_stream_median_ms": 10, "metrics_median_ms": 200}


def make_home(root: Path, name: str, web: bool) -> Path:
    import subprocess
    home = root / name
    subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "init"], check=True, capture_output=True)
    (home / "config.toml").write_text('[web]\nenabled = true\nlisten = "127.0.0.1:0"\n' if web else "")
    return home


def web_url(home: Path) -> tuple[str, str]:
    import subprocess

    def ask():
        out = subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "web", "url"], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else None
    url = wait_until(ask, 20, 0.05, "pulsectl web url")
    base, _, token = url.partition("/?token=")
    return base, token


def status(home: Path) -> controlmsgs.Status:
    from pulse.core import client
    from pulse.core.home import Paths
    return client.request(Paths.for_client(home), controlmsgs.GetStatus(), 3.0).status


def kill_to_ready(home: Path, n: int, tracker: Tracker) -> list[float]:
    """SIGKILL the tick `n` times; each time, its replacement's worker-ready mono minus the kill's."""
    conn = connection.open_readonly(home / "events.db")
    out = []
    try:
        for _ in range(n):
            pid = next(w.pid for w in status(home).workers if w.name == "tick")
            after = eventsdb.last_event_id(conn)
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)

            def ready():
                return next((e for e in eventsdb.read_events(conn, after_id=after, types=("worker-ready",))
                             if e.target == "tick" and e.data.get("pid") != pid), None)
            ev = wait_until(ready, 10, 0.002, "the tick's replacement")
            tracker.add(ev.data["pid"])
            out.append((ev.mono - t_kill) * 1000)
            time.sleep(0.3)                  # past healthy_reset_s: every restart is a first one
    finally:
        conn.close()
    return out


def synthetic_history(home: Path, n: int) -> None:
    """`n` events of the kinds a busy host writes, appended before pulsed starts."""
    conn = eventsdb.open_events(home / "events.db")
    kinds = ("tick", "effect-acked", "wake", "collect", "error", "gate-call", "effect")
    start = time.time() - 7 * 86400
    batch = []
    for i in range(n):
        t = kinds[i % len(kinds)]
        data = {"kind": "noop", "effect_id": f"e{i}", "duration_s": 0.01} if t == "effect-acked" else \
            {"id": f"e{i}", "kind": "noop", "origin": "survival", "params": {"rule": "bench"}} if t == "effect" else {"n": i}
        batch.append(eventmsgs.Event(type=t, source="bench", target="x", data=data, ts=start + i * 0.5, mono=0.0, seq=i))
        if len(batch) == 100_000:
            eventsdb.append_events(conn, batch)
            batch = []
    if batch:
        eventsdb.append_events(conn, batch)
    conn.close()


def stream_latency(base: str, token: str, home: Path, n: int) -> list[float]:
    """Event committed (appended here) → its line read off /api/stream/events, ms, one at a time."""
    import http.client
    from urllib.parse import urlsplit
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request("GET", "/api/stream/events", headers={"Authorization": f"Bearer {token}"})
    reply = conn.getresponse()
    events = eventsdb.open_events(home / "events.db")
    times = []
    try:
        for i in range(n):
            time.sleep(0.05)
            began = time.perf_counter()
            ev, = eventsdb.append_events(events, [eventmsgs.now_event("wake", "bench", "stream", n=i)])
            while True:
                line = reply.readline()
                if line.startswith(b"data:") and f'"id": {ev.id},'.encode() in line:
                    break
            times.append((time.perf_counter() - began) * 1000)
    finally:
        events.close()
        conn.close()
    return times


def get_metrics(base: str, token: str) -> float:
    request = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"})
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    return (time.perf_counter() - began) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials and 100,000 events")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    loads, events, kills, history = (5, 10, 10, 100_000) if args.quick else (20, 40, 30, 1_000_000)
    import psutil
    from playwright.sync_api import sync_playwright
    tracker = Tracker()
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="pulse-bench-web-") as tmp:
        root = Path(tmp)
        try:
            plain = make_home(root, "plain", web=False)
            start_pulsed(plain, tracker, FAST_RESTARTS)
            log(f"{kills} tick kills without the web worker")
            figures["kill_to_ready_ms_without_web"] = summary(kill_to_ready(plain, kills, tracker))
            tracker.cleanup()

            home = make_home(root, "web", web=True)
            start_pulsed(home, tracker, FAST_RESTARTS)
            base, token = web_url(home)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH)
                page = browser.new_page()
                page.goto(f"{base}/?token={token}")
                page.wait_for_selector('[data-worker="tick"] [data-field="pid"]')
                log(f"{loads} overview loads")
                times = []
                for _ in range(loads):
                    began = time.perf_counter()
                    page.goto(f"{base}/")
                    page.wait_for_selector('[data-worker="web"] [data-field="pid"]')
                    times.append((time.perf_counter() - began) * 1000)
                figures["overview_load_ms"] = summary(times)
                web_pid = next(w.pid for w in status(home).workers if w.name == "web")
                time.sleep(2)
                figures["web_rss_mib"] = psutil.Process(web_pid).memory_info().rss / 2**20
                log(f"{kills} tick kills with the web worker and the overview open")
                figures["kill_to_ready_ms_with_web_and_page"] = summary(kill_to_ready(home, kills, tracker))
                page.goto(f"{base}/events")
                page.wait_for_selector("[data-event]")
                log(f"{events} events committed and watched for on the events page")
                conn = eventsdb.open_events(home / "events.db")
                shown = []
                for i in range(events):
                    began = time.perf_counter()
                    ev, = eventsdb.append_events(conn, [eventmsgs.now_event("wake", "bench", "page", n=i)])
                    page.wait_for_selector(f'[data-event="{ev.id}"]', timeout=10_000)
                    shown.append((time.perf_counter() - began) * 1000)
                conn.close()
                figures["event_to_page_ms"] = summary(shown)
                browser.close()
            log(f"{events} events committed and read off the events stream")
            figures["event_to_stream_ms"] = summary(stream_latency(base, token, home, events))
            tracker.cleanup()

            big = make_home(root, "big", web=True)
            log(f"writing {history:,} events")
            synthetic_history(big, history)
            start_pulsed(big, tracker, {})
            base, token = web_url(big)
            figures["metrics_first_ms"] = get_metrics(base, token)
            conn = eventsdb.open_events(big / "events.db")
            scrapes = []
            for _ in range(20):
                eventsdb.append_events(conn, [eventmsgs.now_event("wake", "bench", "m", n=j) for j in range(100)])
                scrapes.append(get_metrics(base, token))
            conn.close()
            figures["metrics_ms"] = summary(scrapes)
            figures["metrics_events"] = history
        finally:
            tracker.cleanup()
    if args.json:
        print(json.dumps(figures))
        return
    med = lambda key: figures[key]["median"]  # noqa: E731
    print(f"web worker RSS                         {figures['web_rss_mib']:.1f} MiB")
    print(f"overview load (median)                 {med('overview_load_ms'):.1f} ms")
    print(f"event committed → on the page (median) {med('event_to_page_ms'):.1f} ms "
          f"(p95 {figures['event_to_page_ms']['p95']:.1f}; target ≤ {TARGETS['event_to_page_median_ms']})")
    print(f"event committed → on the stream        {med('event_to_stream_ms'):.1f} ms "
          f"(p95 {figures['event_to_stream_ms']['p95']:.1f}; target ≤ {TARGETS['event_to_stream_median_ms']})")
    print(f"/metrics, {history:,} events: first    {figures['metrics_first_ms']:.1f} ms (folds the history once)")
    print(f"/metrics, then (median of 20)          {med('metrics_ms'):.1f} ms (target ≤ {TARGETS['metrics_median_ms']})")
    print(f"tick kill → ready, no web (median)     {med('kill_to_ready_ms_without_web'):.2f} ms "
          f"(p95 {figures['kill_to_ready_ms_without_web']['p95']:.2f})")
    print(f"tick kill → ready, web + page (median) {med('kill_to_ready_ms_with_web_and_page'):.2f} ms "
          f"(p95 {figures['kill_to_ready_ms_with_web_and_page']['p95']:.2f})")



if __name__ == "__main__":
    main()
