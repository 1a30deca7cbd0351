#!/usr/bin/env python3
"""Take docs/web.md's screenshots of the web page from a real pulsed, in Debian's headless Chromium
(Playwright with executable_path, never a downloaded browser).

A temporary home with [web] enabled and one critical process, `gateway`, that holds about 130 MB
against a ceiling of 120 MB: survival restarts it over and over, so the overview shows a memory
sparkline in red, restarts, and the last action with its reason. Once pulsed has run --settle-s
seconds (the host charts fill) the overview is shot at 1100 × 1040 (the desktop image), and at a
390-px phone's width, full page, if --phone is given.

    python scripts/web_screenshots.py docs/web-overview.png
    python scripts/web_screenshots.py /tmp/overview.png --phone /tmp/overview-phone.png --settle-s 20
    python scripts/web_screenshots.py /tmp/o.png --every /tmp/pages --settle-s 20   # every page, both widths

With --every DIR, every page of the site (pulse.web.pages.page_paths(), and one task's page) is also shot,
full page, at both widths, as DIR/<page>-desktop.png and DIR/<page>-phone.png, each once nothing on
it says "loading" any more, to be looked at.

Prints where each image went and what the page showed (the gateway's restarts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import Tracker, log, wait_until  # noqa: E402
from bench_pipeline import start_pulsed  # noqa: E402

BIN = Path(sys.executable).parent
CHROMIUM = "/usr/bin/chromium"
LAUNCH = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
          "--disable-sync", "--no-first-run"]
DESKTOP = {"width": 1100, "height": 1040}   # docs/web.md's image: the overview down to the host charts
PHONE = {"width": 390, "height": 844}
GATEWAY_MB = 130                            # held by the gateway, over its ceiling
CEILING_MB = 120


def gateway_argv(marker: str) -> list[str]:
    """The gateway: a process holding GATEWAY_MB, its command line ending in `marker`."""
    return [sys.executable, "-c", f"import time; held = b'g' * ({GATEWAY_MB} << 20); time.sleep(86400)", marker]


def config_text(marker: str) -> str:
    """[web] on a free port, and the gateway under a memory ceiling it is over."""
    return ('[web]\nenabled = true\nlisten = "127.0.0.1:0"\n\n'
            f'[[process]]\nname = "gateway"\nmatch = "{marker}"\nrestart = {json.dumps(gateway_argv(marker))}\n'
            f'memory = {{ max_mb = {CEILING_MB} }}\n')


def gateway_restarts(home: Path) -> int:
    """restart-process effects acked for the gateway so far (events.db, read-only)."""
    import sqlite3
    path = home / "events.db"
    if not path.exists():
        return 0
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute("SELECT data FROM events WHERE type = 'effect-acked' AND target = 'gateway'").fetchall()
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()
    return sum(1 for (data,) in rows if json.loads(data).get("kind") == "restart-process")


def keepers_of(home: Path) -> list[int]:
    """The keepers restart-process started for this home, and their processes (they outlive pulsed by
    design): by pid, found by the keeper's title, which names the home."""
    pids = []
    for p in psutil.process_iter(["cmdline"]):
        title = (p.info["cmdline"] or [""])[0]
        if title.startswith("pulse: keep ") and f"({home})" in title:
            try:
                pids += [c.pid for c in p.children(recursive=True)] + [p.pid]
            except psutil.Error:
                pass
    return pids


def shoot(url: str, desktop: Path, phone: Path | None) -> None:
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH)
        try:
            for size, out, full in ((DESKTOP, desktop, False), (PHONE, phone, True)):
                if out is None:
                    continue
                context = browser.new_context(viewport=size)
                page = context.new_page()
                page.goto(url)
                page.wait_for_selector('[data-process="gateway"] [data-field="memory"] polyline', state="attached")
                page.wait_for_selector('[data-worker="web"]')
                out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out), full_page=full)
                log(f"wrote {out} ({size['width']} px wide{', full page' if full else ''})")
                context.close()
        finally:
            browser.close()


def shoot_every(url: str, home: Path, out: Path) -> list[Path]:
    """Every page at both widths, full page, once it has drawn (no "loading…" left on it)."""
    from playwright.sync_api import sync_playwright

    from pulse.web.pages import page_paths
    base, _, token = url.partition("/?token=")
    subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "task", "add", "--project", "docs",
                    "--title", "a task nobody takes", "--prompt", "x"], check=True, capture_output=True)
    pages = {**page_paths(), "task": "/tasks/task-1"}
    shots = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH)
        try:
            for width, size in (("desktop", DESKTOP), ("phone", PHONE)):
                context = browser.new_context(viewport=size)
                page = context.new_page()
                for name, path in pages.items():
                    page.goto(f"{base}{path}?token={token}")
                    page.wait_for_load_state("networkidle", timeout=15000) if name not in ("overview", "events") \
                        else page.wait_for_timeout(1500)    # those two stream: never idle
                    page.wait_for_function("!/loading/i.test(document.body.innerText)", timeout=15000)
                    shot = out / f"{name}-{width}.png"
                    page.screenshot(path=str(shot), full_page=True)
                    shots.append(shot)
                context.close()
        finally:
            browser.close()
    return shots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("desktop", type=Path, help="where the desktop image goes (docs/web-overview.png)")
    parser.add_argument("--phone", type=Path, help="also a full-page phone image, here")
    parser.add_argument("--settle-s", type=float, default=80.0, help="run this long before the shot (default 80)")
    parser.add_argument("--every", type=Path, help="also every page at both widths, full page, into this directory")
    args = parser.parse_args()
    if not os.path.exists(CHROMIUM):
        sys.exit(f"no Chromium at {CHROMIUM}")
    tracker = Tracker()
    base = Path(tempfile.mkdtemp(prefix="pulse-shots-"))
    home = base / "home"
    marker = f"pulse-docs-gateway-{base.name}"      # a command line no other process has
    try:
        subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "init"], check=True, capture_output=True)
        (home / "config.toml").write_text(config_text(marker))
        tracker.add_root(subprocess.Popen(gateway_argv(marker), start_new_session=True), grace=1.0)
        started = time.monotonic()
        proc = start_pulsed(home, tracker, {"PULSE_WATCHER_INTERVAL_MS": "2000"})
        url = wait_until(lambda: subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "web", "url"],
                                                capture_output=True, text=True).stdout.strip(), 30, 0.2, "the web url")
        wait_until(lambda: gateway_restarts(home) >= 2, 120, 0.5, "the gateway restarted twice")
        while time.monotonic() - started < args.settle_s:
            time.sleep(min(1.0, args.settle_s - (time.monotonic() - started)))   # the host charts fill
        shoot(url, args.desktop, args.phone)
        if args.every:
            args.every.mkdir(parents=True, exist_ok=True)
            for shot in shoot_every(url, home, args.every):
                log(f"wrote {shot}")
        print(json.dumps({"desktop": str(args.desktop), "phone": str(args.phone) if args.phone else None,
                          "gateway_restarts": gateway_restarts(home),
                          "uptime_s": round(time.monotonic() - started, 1)}))
        proc.terminate()
        proc.wait(15)
    finally:
        for pid in keepers_of(home):
            tracker.add(pid)
        tracker.cleanup()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
