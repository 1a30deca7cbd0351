"""The web worker: a real pulsed with [web] enabled, its page in Debian's headless Chromium
(Playwright with executable_path, never a downloaded browser), its auth and /metrics over HTTP.

One pulsed serves the module's browser tests; each test says what it changes. A screenshot of
each page is saved in the test's temporary directory.
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.parse

import msgspec
import psutil
import pytest

from support import CHROMIUM, Pulsed, Tracker, browser_or_skip, init_home, kill_keepers, wait_for

PAGES = ("overview", "events", "vitals", "effects", "tasks", "engine", "gate", "log", "schedules", "budget")
WORKERS = ("watcher", "tick", "executor", "engine", "web")
NAP = "888.125"     # a critical process of the module's pulsed: a sleep no other test starts
LAUNCH = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
          "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A pulsed with the web worker on a free port: (pulsed, base URL, token)."""
    tracker = Tracker()
    home = tmp_path_factory.mktemp("web") / "home"
    pulsed = Pulsed(home, tracker)
    init_home(home)
    (home / "config.toml").write_text('[web]\nenabled = true\nlisten = "127.0.0.1:0"\n\n'
                                      f'[[process]]\nname = "napper"\nmatch = "^sleep {NAP}$"\n'
                                      f'restart = ["sleep", "{NAP}"]\nmemory = {{ max_mb = 512 }}\n\n'
                                      '[[schedule]]\nname = "hourly"\nevery = "1h"\neffect = { kind = "noop" }\n\n'
                                      f'[[watch.fresh]]\nname = "outputs"\npath = "{home.parent}"\nwithin_s = 3600\n\n'
                                      '[budget]\nusd_per_day = 5\n')
    napper = subprocess.Popen(["sleep", NAP], start_new_session=True)
    tracker.add(napper.pid)
    try:
        pulsed.start()
        pulsed.wait_running(WORKERS)
        url = wait_for(lambda: pulsed.ctl("web", "url").stdout.strip(), 10, what="pulsectl web url")
        base, _, token = url.partition("/?token=")
        yield pulsed, base, token
        pulsed.terminate()
    finally:
        tracker.kill_all()
        kill_keepers(home)      # the napper the page restarted runs under a keeper, which outlives pulsed


def call(base: str, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
    parts = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def browser(site):
    sync_playwright = browser_or_skip()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH)
        yield b
        b.close()


@pytest.fixture
def page(site, browser):
    """A page logged in through `pulsectl web url`, recording every request it makes."""
    pulsed, base, token = site
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    tab = context.new_page()
    tab.requests = []
    tab.on("request", lambda r: tab.requests.append(r.url))
    # the confirmations of restart, stop, start; a prompt (pause: for how long) takes its default
    tab.on("dialog", lambda d: d.accept(d.default_value) if d.type == "prompt" else d.accept())
    tab.goto(f"{base}/?token={token}")
    yield tab
    context.close()


def cell(page, worker: str, field: str) -> str:
    return page.locator(f'[data-worker="{worker}"] [data-field="{field}"]').inner_text()


# -- the page ------------------------------------------------------------------------------------------------

def test_the_overview_lists_every_worker_and_the_token_leaves_the_address_bar(site, page, tmp_path):
    pulsed, base, token = site
    page.wait_for_selector('[data-worker="web"]')
    assert page.url == f"{base}/" and token not in page.url
    status = pulsed.status()
    for w in status.workers:
        assert cell(page, w.name, "state") == "running" and cell(page, w.name, "pid") == str(w.pid)
        assert page.locator(f'[data-worker="{w.name}"] [data-action="restart"]').count() == 1
    assert {w.name for w in status.workers} == set(WORKERS)
    cookie = next(c for c in page.context.cookies() if c["name"] == "pulse_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)


def test_a_critical_process_is_paused_from_the_page(site, page):
    pulsed, base, token = site
    page.wait_for_selector('[data-process="napper"] [data-field="state"]')
    page.click('[data-process="napper"] [data-action="pause"]')          # the prompt's default: 30m
    page.wait_for_function("""() => document.querySelector('[data-process="napper"] [data-field="state"]')
                                       .textContent.startsWith('paused')""", timeout=10_000)
    pause = pulsed.events("pause", "napper")
    assert len(pause) == 1 and pause[0]["source"] == "web"
    page.click('[data-process="napper"] [data-action="resume"]')
    page.wait_for_function("""() => ['running', 'starting'].includes(document.querySelector(
                                       '[data-process="napper"] [data-field="state"]').textContent)""", timeout=10_000)


def test_a_killed_tick_shows_on_the_open_page_without_a_reload(site, page):
    pulsed, base, token = site
    page.wait_for_selector('[data-worker="tick"]')
    old = pulsed.worker("tick")
    navigations = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    os.kill(old.pid, signal.SIGKILL)
    new = pulsed.wait_replaced("tick", old.pid)
    # within 2 s of the replacement, the same page shows the new pid and the restart, counted as a crash
    page.wait_for_function(
        """([pid, crashes]) => {
             const row = document.querySelector('[data-worker="tick"]');
             return row && row.querySelector('[data-field="pid"]').textContent === String(pid)
                        && row.querySelector('[data-field="crashes"]').textContent === String(crashes);
           }""", arg=[new.pid, old.crashes + 1], timeout=2000)
    assert new.crashes == old.crashes + 1 and new.operator_restarts == old.operator_restarts
    assert navigations == []


def test_the_engines_restart_button_restarts_it(site, page):
    pulsed, base, token = site
    page.wait_for_selector('[data-worker="engine"]')
    old = pulsed.worker("engine")
    page.click('[data-worker="engine"] [data-action="restart"]')
    new = pulsed.wait_replaced("engine", old.pid)
    assert new.restarts == old.restarts + 1 and new.operator_restarts == old.operator_restarts + 1
    assert new.crashes == old.crashes     # the operator's restart is not a crash, on the page either
    page.wait_for_function("""(n) => document.querySelector('[data-worker="engine"] [data-field="restarted"]')
                                         ?.textContent === String(n)""", arg=new.operator_restarts, timeout=5000)
    operator = [e for e in pulsed.events("operator", "engine") if e["data"]["action"] == "restart"]
    assert operator, "the page's restart is an event like pulsectl's"


def test_no_page_makes_a_request_outside_pulse_and_each_one_renders(site, page, tmp_path):
    pulsed, base, token = site
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    for name in PAGES:
        page.goto(f"{base}/" if name == "overview" else f"{base}/{name}")
        page.wait_for_selector("main section")
        page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    assert errors == []
    outside = [u for u in page.requests if not u.startswith(base + "/")]
    assert outside == []


def test_the_events_page_finds_an_old_event_by_type(site, page):
    pulsed, base, token = site
    page.goto(f"{base}/events?type=supervisor-started")
    page.wait_for_selector("[data-event]")
    rows = page.locator("[data-event]")
    first = pulsed.events("supervisor-started")[0]
    assert rows.count() == 1 and rows.first.get_attribute("data-event") == str(first["id"])
    page.click(f'[data-event="{first["id"]}"] a')
    page.wait_for_selector(f'section[data-event="{first["id"]}"]')
    assert '"pid"' in page.inner_text("main")


# What runs off the screen: the page wider than the window, or a section scrolling sideways.
OVERFLOW = """() => [document.documentElement, ...document.querySelectorAll("main section")]
                 .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.id || e.tagName)"""


def test_dark_and_light_themes_and_a_phone_width(site, page, tmp_path):
    pulsed, base, token = site
    page.wait_for_selector('[data-worker="tick"]')
    page.wait_for_selector('[data-process="napper"] [data-field="memory"] polyline', state="attached")
    before = page.evaluate("document.documentElement.dataset.theme")
    page.click("#theme")
    assert page.evaluate("document.documentElement.dataset.theme") != before
    assert page.evaluate(OVERFLOW) == []
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=str(tmp_path / "overview-phone.png"), full_page=True)
    assert page.evaluate(OVERFLOW) == [], "the workers and the processes fit a 390-px phone"
    # each cell is still there, under its label
    memory = page.locator('[data-process="napper"] [data-field="memory"]')
    assert memory.is_visible() and page.evaluate("""() => getComputedStyle(document.querySelector(
        '[data-process="napper"] [data-field="memory"]'), '::before').content""") == '"memory"'
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.tagName") in ("A", "BUTTON")


def test_the_overview_shows_each_critical_process_with_its_memory_health_restarts_and_last_action(site, page):
    pulsed, base, token = site
    page.wait_for_selector('[data-process="napper"] [data-field="memory"] polyline', state="attached")
    napper = next(p for p in pulsed.status().processes if p.name == "napper")
    figure = page.locator('[data-process="napper"] [data-field="memory"] .figure').inner_text()
    assert re.fullmatch(r"\d+ MB of 512", figure) and napper.max_mb == 512
    assert abs(int(figure.split()[0]) - napper.rss_mb) <= 2
    assert page.locator('[data-process="napper"] [data-field="health"]').inner_text() == "-"     # no probe configured
    assert page.locator('[data-process="napper"] [data-field="restarts"]').inner_text() == "0"
    # an operator's signal is its last action, with its outcome, on the open page
    assert pulsed.ctl("emit", "signal", "--target", "napper", "--param", "signal=SIGCONT", "--wait", "10").returncode == 0
    page.wait_for_function("""() => document.querySelector('[data-process="napper"] [data-field="last_action"]')
                                       .textContent.startsWith('signal acked')""", timeout=10_000)


def test_the_overview_shows_each_proof_of_work_fresh_or_stale_with_its_last_sign_of_work(site, page):
    pulsed, base, token = site
    row = page.locator('[data-fresh="outputs"]')
    page.wait_for_function("""() => /fresh/.test(document.querySelector('[data-fresh="outputs"] [data-label="state"]')
                                                  ?.textContent || '')""", timeout=10_000)
    assert row.locator('[data-label="looks at"]').inner_text().strip() == str(pulsed.home.parent)
    assert row.locator('[data-label="within"]').inner_text() == "1:00:00"
    assert row.locator('[data-label="last work"] time').count() == 1


# -- auth -------------------------------------------------------------------------------------------------------

def test_without_a_token_every_page_and_api_answers_401(site):
    pulsed, base, token = site
    for path in ("/", "/events", "/api/events", "/api/stream/overview", "/metrics", "/static/app.js"):
        assert call(base, "GET", path)[0] == 401, path
    assert call(base, "GET", "/?token=wrong")[0] == 401
    assert call(base, "GET", "/api/events", {"Authorization": f"Bearer {token}"})[0] == 200


def session_cookie(base: str, token: str) -> str:
    status, headers, _ = call(base, "GET", f"/?token={token}")
    assert status == 303 and headers["location"] == "/"
    return headers["set-cookie"].split(";", 1)[0]


def test_a_cross_origin_or_csrf_less_post_is_refused(site):
    pulsed, base, token = site
    cookie = session_cookie(base, token)
    status, _, page_html = call(base, "GET", "/", {"Cookie": cookie})
    csrf = page_html.decode().split('name="csrf" content="', 1)[1].split('"', 1)[0]
    body = json.dumps({"action": "restart", "worker": "engine"}).encode()
    evil = {"Cookie": cookie, "Origin": "http://evil.example", "X-CSRF-Token": csrf, "Content-Type": "application/json"}
    assert call(base, "POST", "/api/workers", evil, body)[0] == 403
    no_csrf = {"Cookie": cookie, "Origin": base, "Content-Type": "application/json"}
    assert call(base, "POST", "/api/workers", no_csrf, body)[0] == 403
    before = pulsed.worker("engine").restarts
    ok = {"Cookie": cookie, "Origin": base, "X-CSRF-Token": csrf, "Content-Type": "application/json"}
    status, _, answer = call(base, "POST", "/api/workers", ok, body)
    assert status == 200 and json.loads(answer)["ok"]
    wait_for(lambda: pulsed.worker("engine").restarts == before + 1 and pulsed.worker("engine").state == "running",
             10, what="the engine restarted by the POST")


def test_the_page_acts_on_the_config_pulsed_loaded_not_the_file_on_disk(site):
    """The web worker reads its slice: a config.toml broken after the start (not reloaded) changes
    nothing for the page, whose engine buttons still commit an effect with the loaded deadline."""
    pulsed, base, token = site
    cookie = session_cookie(base, token)
    csrf = call(base, "GET", "/", {"Cookie": cookie})[2].decode().split('name="csrf" content="', 1)[1].split('"', 1)[0]
    config = pulsed.home / "config.toml"
    kept = config.read_text()
    config.write_text("[timings\nthis is not TOML")
    try:
        headers = {"Cookie": cookie, "Origin": base, "X-CSRF-Token": csrf, "Content-Type": "application/json"}
        status, _, answer = call(base, "POST", "/api/engine", headers, json.dumps({"action": "promote"}).encode())
    finally:
        config.write_text(kept)
    assert status == 200 and json.loads(answer)["ok"], answer
    effect = wait_for(lambda: [e for e in pulsed.events("effect") if e["data"].get("kind") == "engine-promote"], 10,
                      what="the promote effect")[-1]
    assert effect["data"]["deadline"] - effect["ts"] == pytest.approx(60, abs=1)   # [timings] effect_deadline_s


def test_metrics_parse_and_the_restart_counter_matches_status(site):
    from prometheus_client.parser import text_string_to_metric_families
    pulsed, base, token = site
    pulsed.events_written()                  # pulsed writes its lifecycle events a moment after they happen
    # run first (alone, or first of the module), the napper's memory may not be sampled yet
    wait_for(lambda: any(p.name == "napper" and p.rss_mb for p in pulsed.status().processes), 15,
             what="the napper's memory sampled")
    status, headers, body = call(base, "GET", "/metrics", {"Authorization": f"Bearer {token}"})
    assert status == 200 and headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    restarts = {s.labels["worker"]: s.value for s in families["pulse_worker_restarts"].samples
                if s.name == "pulse_worker_restarts_total"}
    shown = json.loads(pulsed.ctl("status", "--json").stdout)
    assert restarts == {w["name"]: w["restarts"] for w in shown["workers"]}
    up = {s.labels["worker"]: s.value for s in families["pulse_worker_up"].samples}
    assert up == {w: 1.0 for w in WORKERS}
    types = {s.labels["type"]: s.value for s in families["pulse_events"].samples if s.name == "pulse_events_total"}
    assert types["worker-started"] == len(pulsed.events("worker-started"))
    for name in ("pulse_build_info", "pulse_engine_info", "pulse_tick_duration_seconds", "pulse_effects",
                 "pulse_gate_blocked", "pulse_rule_errors"):
        assert name in families, name
    memory = {s.labels["process"]: s.value for s in families["pulse_process_memory_bytes"].samples}
    ceiling = {s.labels["process"]: s.value for s in families["pulse_process_memory_max_bytes"].samples}
    napper = next(p for p in shown["processes"] if p["name"] == "napper")
    assert memory["napper"] == pytest.approx(napper["rss_mb"] * 2**20, rel=0.5) and memory["napper"] > 0
    assert ceiling == {"napper": 512 * 2**20}


def test_rotating_the_token_ends_every_session(site):
    pulsed, base, token = site
    cookie = session_cookie(base, token)
    assert call(base, "GET", "/api/events", {"Cookie": cookie})[0] == 200
    out = pulsed.ctl("web", "rotate-token")
    assert out.returncode == 0
    assert call(base, "GET", "/api/events", {"Cookie": cookie})[0] == 401
    fresh = pulsed.ctl("web", "url").stdout.strip()
    assert fresh.partition("/?token=")[2] != token
    assert oct(pulsed.home.joinpath("web.token").stat().st_mode & 0o777) == "0o600"
    session_cookie(base, fresh.partition("/?token=")[2])
    # the module's other tests log in with the token they were given: put it back
    pulsed.home.joinpath("web.token").write_text(token + "\n")


# -- the worker in the tree ---------------------------------------------------------------------------------------

def test_the_web_worker_is_off_by_default_and_its_crash_never_escalates(pulsed):
    init_home(pulsed.home)
    pulsed.start()
    assert [w.name for w in pulsed.status().workers] == list(WORKERS[:-1])
    off = pulsed.ctl("web", "url")
    assert off.returncode == 3 and "[web] enabled = true" in off.stderr
    refused = pulsed.ctl("restart", "web")
    assert refused.returncode == 1 and "[web] enabled = true" in refused.stderr and "Traceback" not in refused.stderr
    (pulsed.home / "config.toml").write_text('[web]\nenabled = true\nlisten = "127.0.0.1:0"\n')
    assert "web: started (pid " in pulsed.ctl("reload").stdout
    web = pulsed.wait_state("web", "running")
    for _ in range(3):                                   # crashes: restarted, pulsed untouched
        os.kill(web.pid, signal.SIGKILL)
        web = pulsed.wait_replaced("web", web.pid)
    assert pulsed.proc.poll() is None and all(w.state == "running" for w in pulsed.status().workers)
    (pulsed.home / "config.toml").write_text("")
    assert "web: stopped" in pulsed.ctl("reload").stdout
    wait_for(lambda: "web" not in [w.name for w in pulsed.status().workers], 10, what="the web worker gone")


@pytest.mark.parametrize("table, says", [
    ('listen = "0.0.0.0:8370"', "0.0.0.0 is not a loopback address; set allow_remote = true"),
    ('listen = "0.0.0.0:8370"\nallow_remote = true', "needs tls_cert and tls_key"),
    ('listen = "localhost"', "is not host:port"),
    ('tls_cert = "/x.pem"', "set both tls_cert and tls_key"),
])
def test_web_config_errors_name_the_key(tmp_path, table, says):
    from pulse.core import config
    path = tmp_path / "config.toml"
    path.write_text("[web]\nenabled = true\n" + table + "\n")
    with pytest.raises(config.ConfigError, match=r"\$\.web") as err:
        config.load(path, {})
    assert says in str(err.value)


def test_status_json_carries_the_web_address(site):
    pulsed, base, token = site
    shown = json.loads(pulsed.ctl("status", "--json").stdout)
    assert shown.get("web_url") == base or msgspec.to_builtins(pulsed.status()).get("web_url") == base


def test_the_engine_page_shows_a_promote_with_its_diff_and_checks(site, page, tmp_path):
    pulsed, base, token = site
    staging = pulsed.home / "staging"
    (staging / "rules" / "quiet.py").write_text("RULES = []\n")
    for argv in (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "quiet"]):
        subprocess.run(["git", "-C", str(staging), *argv], check=True, capture_output=True)
    promoted = pulsed.ctl("promote")
    assert promoted.returncode == 0, promoted.stderr
    pulsed.wait_running(WORKERS)
    page.goto(f"{base}/engine")
    page.wait_for_selector("tr[data-event]")
    text = page.inner_text("main")
    assert "1 file changed" in text and "compile, import, tests" in text
    page.screenshot(path=str(tmp_path / "engine.png"), full_page=True)


def test_a_memory_restart_shows_on_the_phone_overview_with_its_reason(pulsed, browser, tmp_path, tracker):
    """A real leaking tree restarted at its ceiling (tests/test_memory.py's leaker): the overview on a
    390-px phone shows its memory, its restarts and the restart with its reason, and nothing runs off."""
    from test_memory import LEAKER, MAX_MB, memory_restarts
    script = tmp_path / "leaker.py"
    script.write_text(LEAKER)
    init_home(pulsed.home)
    argv = [sys.executable, str(script), str(tmp_path), "parent"]
    (pulsed.home / "config.toml").write_text(
        '[web]\nenabled = true\nlisten = "127.0.0.1:0"\n\n[[process]]\nname = "leaky"\n'
        f'match = {json.dumps(re.escape(f"{script} {tmp_path} parent"))}\nrestart = {json.dumps(argv)}\n'
        f'memory = {{ max_mb = {MAX_MB}, for_samples = 3, growth_window_s = 2 }}\n')
    pulsed.start(env={"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "250"})
    pulsed.wait_running(WORKERS)
    url = wait_for(lambda: pulsed.ctl("web", "url").stdout.strip(), 10, what="pulsectl web url")
    restart = wait_for(lambda: memory_restarts(pulsed), 30, what="a restart at the ceiling")[0]
    context = browser.new_context(viewport={"width": 390, "height": 844})
    try:
        tab = context.new_page()
        tab.goto(url)
        row = '[data-process="leaky"]'
        tab.wait_for_function(f"""() => /restart-process \\(memory\\) acked/.test(
            document.querySelector('{row} [data-field="last_action"]')?.textContent || '')""", timeout=20_000)
        last = tab.locator(f'{row} [data-field="last_action"]').inner_text()
        assert "above max_mb 60 for 3 samples in a row" in last, last
        # why dead (the first start), memory: the count is the tick's, which may be a tick behind the action
        tab.wait_for_function(f"""() => Number(document.querySelector('{row} [data-field="restarts"]')
                                                  ?.textContent) >= 2""", timeout=20_000)
        assert re.search(rf"\d+ MB of {MAX_MB}", tab.locator(f'{row} [data-field="memory"]').inner_text())
        # the sparkline needs two samples of the new copy: wait for it, as the napper's tests do
        tab.wait_for_selector(f'{row} [data-field="memory"] polyline', state="attached", timeout=20_000)
        assert tab.locator(f'{row} [data-field="memory"] polyline').count() == 1
        # the last survival actions say why the restart was made (the column was "-" for every restart)
        tab.wait_for_selector('#survival td[data-label="why"]', timeout=20_000)
        whys = tab.locator('#survival td[data-label="why"]').all_inner_texts()
        assert "memory" in whys and "-" not in whys, whys
        assert tab.evaluate(OVERFLOW) == []
        tab.screenshot(path=str(tmp_path / "overview-phone-memory.png"), full_page=True)
    finally:
        context.close()
    assert restart["data"]["params"]["reason"].startswith("memory: its tree's RSS")


def test_the_overview_shows_each_config_against_its_known_good_and_each_watched_file(pulsed, browser, tmp_path, tracker):
    """A process whose config was kept known good, and a watched log over its max_mb (action notify:
    only said), and a watched directory: on a 390-px phone the process's card says "known good", the
    files section shows the log, its size and that it is over, the directories section the
    directory's files and bounds, and nothing runs off the screen."""
    conf, logs = tmp_path / "app.json", tmp_path / "logs"
    conf.write_text('{"port": 1}\n')
    logs.mkdir()
    (logs / "trace.jsonl").write_bytes(b"x" * (3 * 1024 * 1024))
    (tmp_path / "sessions").mkdir()
    for name in ("a.json", "b.json", "c.json"):
        (tmp_path / "sessions" / name).write_bytes(b"s" * 2048)
    argv = ["sleep", "888.375"]
    child = subprocess.Popen(argv)
    tracker.add(child.pid)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(
        '[web]\nenabled = true\nlisten = "127.0.0.1:0"\n\n[[process]]\nname = "app"\n'
        f'pidfile = "{tmp_path}/app.pid"\nrestart = {json.dumps(argv)}\nconfig = ["{conf}"]\nconfig_good_after_s = 0.5\n\n'
        f'[[watch.file]]\nname = "traces"\npath = "{logs}/*.jsonl"\nmax_mb = 1\naction = "notify"\n\n'
        f'[[watch.dir]]\nname = "sessions"\npath = "{tmp_path}/sessions"\nmax_files = 10\nmax_age = "7d"\n')
    (tmp_path / "app.pid").write_text(str(child.pid))
    pulsed.start(env={"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "100"})
    pulsed.wait_running(WORKERS)
    url = wait_for(lambda: pulsed.ctl("web", "url").stdout.strip(), 10, what="pulsectl web url")
    context = browser.new_context(viewport={"width": 390, "height": 844})
    try:
        tab = context.new_page()
        tab.goto(url)
        tab.wait_for_function("""() => /known good/.test(
            document.querySelector('[data-process="app"] [data-field="config"]')?.textContent || '')""", timeout=20_000)
        row = tab.locator('[data-watch="traces"]')
        row.wait_for(timeout=10_000)
        text = row.inner_text()
        assert "1 (3.0 MB)" in text and "1 over" in text and f"{logs}/trace.jsonl" in text and "notify" in text, text
        shown = tab.locator('#dirs [data-watch="sessions"]')
        shown.wait_for(timeout=10_000)
        text = shown.inner_text()
        assert "3 (6 KB)" in text and "10 files, 7d" in text and "delete" in text and "over" not in text, text
        assert tab.evaluate(OVERFLOW) == []
        tab.screenshot(path=str(tmp_path / "overview-phone-guards.png"), full_page=True)
    finally:
        context.close()
# -- the page an operator keeps open ----------------------------------------------------------------
# A task seeded through the same checked paths the executor and `pulsectl mcp` write by (tasks.start_run
# and tasks.record; a real gate session over events.db): two runs, the first failed with the CLI's own
# reason, the second acked with its cost, tokens and an output that would be markup if not escaped.

OUTPUT = "done <script>window.pwned = 1</script> & <b>not bold</b>\nsecond line\n"
PHONE, DESKTOP = {"width": 390, "height": 844}, {"width": 1400, "height": 900}


@pytest.fixture(scope="module")
def seeded(site):
    from pulse.agents import tasks
    from pulse.core.wire import enginerpc, eventmsgs
    from pulse.gate import catalogue, policy
    from pulse.gate.durable import DurableStore
    from pulse.store import effectqueue, eventsdb, objects
    pulsed, base, token = site
    conn = eventsdb.open_events(pulsed.home / "events.db")
    try:
        task = tasks.create(conn, "website", "Fix the login page's redirect loop", "Find why /login loops.\n<i>as text</i>",
                            source="pulsectl").id
        tasks.start_run(conn, task, "claude", "run-1", "executor")
        tasks.record(conn, task, eventmsgs.TaskEvent.FAILED, "executor", run="run-1", reason="rate-limit",
                     error="claude: API rate limit reached, retry after 60 s", agent="claude",
                     result={"code": 1, "cost_usd": 0.0123, "tokens": {"input": 1200, "output": 40}})
        session = policy.GateSession(f"sess-{task}", catalogue.TOOLS, agent="claude", task=task,
                               store=DurableStore(conn, "mcp"))
        session.open(pid=os.getpid())
        admitted = session.begin("list_workers", {})
        session.end(admitted, True, {"workers": [{"name": "tick"}]})
        tasks.start_run(conn, task, "claude", "run-2", "executor")
        ref = objects.put(pulsed.home / "objects", OUTPUT.encode())
        tasks.record(conn, task, eventmsgs.TaskEvent.ACKED, "executor", run="run-2", agent="claude", output=ref, code=0,
                     run_ms=4200.0, result={"code": 0, "cost_usd": 0.5, "tokens": {"input": 9000, "output": 700},
                                            "result": "fixed"})
        # an agent-run effect about the task (refused at once: the task is acked, nothing runs)
        effect = effectqueue.new_effect(enginerpc.Effect(kind="agent-run", target=task, params={"task_id": task}),
                                        "operator", 60)
        effectqueue.commit_effects(conn, [effect], "test")
    finally:
        conn.close()
    wait_for(lambda: [e for e in pulsed.events("effect-failed") if e["data"].get("effect_id") == effect.id]
             or [e for e in pulsed.events("effect-acked") if e["data"].get("effect_id") == effect.id], 15,
             what="the agent-run effect ended")
    return task


# Anything laid out beyond the window's right edge (a button, a cell, a label off-screen with no hint),
# and any table cell narrower than the longest word it holds (letter-by-letter wrapping). A word longer
# than 60 % of the window, or than 40 characters (a hash, a path, key=hash in event data), may break.
LAYOUT = """() => {
  const vw = document.documentElement.clientWidth, wide = [], narrow = [];
  const ctx = document.createElement("canvas").getContext("2d");
  const name = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") +
        (e.dataset.field ? `[${e.dataset.field}]` : "") + (e.dataset.label ? `[${e.dataset.label}]` : "");
  for (const e of document.body.querySelectorAll("*")) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || getComputedStyle(e).visibility === "hidden") continue;
    if (r.right > vw + 1 || r.left < -1) wide.push(`${name(e)} ${Math.round(r.left)}..${Math.round(r.right)}`);
  }
  for (const c of document.querySelectorAll("td, th")) {
    const style = getComputedStyle(c);
    if (!c.getClientRects().length || !c.textContent.trim()) continue;     // not shown (a phone's table head)
    ctx.font = style.font;
    const text = [...c.childNodes].map(n => n.textContent).join(" ");
    const longest = Math.max(0, ...text.split(/\\s+/).filter(w => w.length <= 40).map(w => ctx.measureText(w).width));
    const room = c.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    if (room + 1 < Math.min(longest, 0.6 * vw))
      narrow.push(`${name(c)} "${text.trim().slice(0, 30)}" ${Math.round(room)}px < ${Math.round(longest)}px`);
    const label = getComputedStyle(c, "::before");        // a phone card's label: its words whole too
    if (c.dataset.label && label.content !== "none" && label.display !== "none") {
      ctx.font = label.font;
      const word = Math.max(...c.dataset.label.split(/\\s+/).map(w => ctx.measureText(w).width));
      const squeezed = label.whiteSpace !== "nowrap" && parseFloat(label.flexBasis) + 1 < word;   // auto: NaN, never
      if (squeezed || room + 1 < word) narrow.push(`${name(c)} label "${c.dataset.label}" narrower than ${Math.round(word)}px`);
    }
  }
  return {wide: wide.slice(0, 10), narrow: narrow.slice(0, 10)};
}"""


def every_page(base: str, task: str) -> list[tuple[str, str]]:
    return [(name, f"{base}/" if name == "overview" else f"{base}/{name}") for name in PAGES] + \
        [("task", f"{base}/tasks/{task}"), ("event", f"{base}/events/1")]


def shots_dir(tmp_path):
    """Where the screenshots go: PULSE_SCREENSHOTS (to look at them), else the test's directory."""
    where = os.environ.get("PULSE_SCREENSHOTS")
    return pathlib.Path(where) if where else tmp_path


def test_every_page_fits_a_phone_and_a_desktop_with_no_cell_narrower_than_a_word(site, seeded, page, tmp_path):
    pulsed, base, token = site
    out = shots_dir(tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    found = {}
    for size, label in ((PHONE, "phone"), (DESKTOP, "desktop")):
        page.set_viewport_size(size)
        for name, url in every_page(base, seeded):
            page.goto(url)
            page.wait_for_selector("main section")
            if name == "overview":
                page.wait_for_selector('[data-process="napper"] [data-field="memory"] polyline', state="attached")
            page.screenshot(path=str(out / f"{name}-{label}.png"), full_page=True)
            layout = page.evaluate(LAYOUT)
            if layout["wide"] or layout["narrow"]:
                found[f"{name} at {size['width']}"] = layout
    assert found == {}, json.dumps(found, indent=1)


def test_the_task_page_shows_every_attempt_its_reason_cost_output_as_text_and_gate_calls(site, seeded, page):
    pulsed, base, token = site
    page.goto(f"{base}/tasks/{seeded}")
    page.wait_for_selector('[data-attempt="2"]')
    facts = page.inner_text(f'dl[data-task="{seeded}"]')
    assert "Fix the login page's redirect loop" in facts and "website" in facts and "claude" in facts
    assert "$0.5123" in facts and "10200 input, 740 output" in facts
    first, second = page.inner_text('[data-attempt="1"]'), page.inner_text('[data-attempt="2"]')
    assert "failed" in first and "rate-limit: claude: API rate limit reached, retry after 60 s" in first
    assert "$0.0123" in first and "acked" in second and "$0.5000" in second and "4.2 s" in second
    # the prompt and the output are text: markup in them is shown, never run or rendered
    assert page.inner_text('[data-field="prompt"]') == "Find why /login loops.\n<i>as text</i>"
    assert page.inner_text('[data-field="output"]').strip() == OUTPUT.strip()
    assert page.evaluate("window.pwned") is None and page.locator("main b, main i, main script").count() == 0
    calls = page.inner_text("section:has-text('Gate calls')")
    assert "Gate calls (3)" in calls and calls.count("list_workers") == 2
    # the board's history says why a run failed, in the CLI's words
    page.goto(f"{base}/tasks")
    page.wait_for_selector("main section:has-text('History') tbody tr")
    assert "rate-limit: claude: API rate limit reached" in page.inner_text("section:has-text('History')")
    # linked from the board, the events and the effects
    for where in ("/tasks", f"/events?target={seeded}", "/effects"):
        page.goto(base + where)
        page.wait_for_selector(f'main a[href="/tasks/{seeded}"]')
    page.click(f'main a[href="/tasks/{seeded}"] >> nth=0')
    page.wait_for_selector(f'dl[data-task="{seeded}"]')


def test_task_show_and_output_tell_the_task_as_its_page_does(site, seeded):
    pulsed, base, token = site
    shown = pulsed.ctl("task", "show", seeded)
    assert shown.returncode == 0, shown.stderr
    assert "#1 claude: failed (rate-limit: claude: API rate limit reached, retry after 60 s)" in shown.stdout
    assert "cost:        $0.5123" in shown.stdout and "gate calls: 3" in shown.stdout
    assert f"pulsectl task output {seeded} --attempt 2" in shown.stdout
    view = json.loads(pulsed.ctl("task", "show", seeded, "--json").stdout)
    status, _, body = call(base, "GET", f"/api/tasks/{seeded}", {"Authorization": f"Bearer {token}"})
    page_view = json.loads(body)
    assert status == 200 and page_view.pop("output_text") == OUTPUT and page_view == view
    iso = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
    times = [view["created"], view["updated"], *[r[k] for r in view["runs"] for k in ("assigned", "started", "ended")],
             *[g["ts"] for g in view["gate_calls"]], *[e["ts"] for e in view["events"]]]
    assert all(isinstance(t, str) and iso.fullmatch(t) for t in times), times
    assert [r["outcome"] for r in view["runs"]] == ["failed", "acked"] and view["attempts"] == 2
    output = pulsed.ctl("task", "output", seeded)
    assert output.returncode == 0 and output.stdout == OUTPUT
    none = pulsed.ctl("task", "output", seeded, "--attempt", "1")
    assert none.returncode == 1 and "no output kept for attempt 1" in none.stderr


# The page's one time format: the viewer's local time (the time alone, today), or "… ago"; a chart's
# time axis, hours and minutes (or the day, over days), the full time on hover as everywhere.
SHOWN_TIME = re.compile(r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d|(in )?\d+(\.\d)? (s|min|h|days) ago|\d\d[:-]\d\d")
EPOCH = re.compile(r"\b1[6-9]\d{8}(\.\d+)?\b")     # a raw epoch time, 2020 … 2033


def test_every_page_shows_times_one_way_with_the_zone_on_hover_and_no_raw_epoch(site, seeded, page):
    pulsed, base, token = site
    for name, url in every_page(base, seeded):
        page.goto(url)
        page.wait_for_selector("main section")
        page.wait_for_load_state("networkidle") if name != "overview" else page.wait_for_selector("#workers table")
        times = page.evaluate("() => [...document.querySelectorAll('main time')].map(t => [t.textContent, t.title])")
        bad = [t for t in times if not SHOWN_TIME.fullmatch(t[0]) or not re.search(r"\(UTC[+-]\d\d:\d\d\)", t[1])]
        assert bad == [], (name, bad)
        assert not EPOCH.search(page.inner_text("main")), (name, EPOCH.search(page.inner_text("main"))[0])


def test_vitals_charts_have_time_axes_units_gaps_and_no_cpus(site, page):
    from pulse.core.wire.enginerpc import Vital
    from pulse.store import vitalsdb
    pulsed, base, token = site
    # samples from before this pulsed started: the minutes between are no one's, a gap on the chart
    conn = vitalsdb.open_vitals(pulsed.home / "vitals.db")
    try:
        old = time.time() - 3000
        vitalsdb.append_vitals(conn, [Vital("system-resource", old + 15 * i, {"cpu_pct": 50.0, "memory_pct": 40.0,
                                                                              "disk_pct": 30.0, "swap_pct": 0.0, "cpus": 2})
                                      for i in range(20)])
    finally:
        conn.close()
    page.goto(f"{base}/vitals?window=1h")
    cpu = page.locator('[data-vital="system-resource cpu_pct"]')
    cpu.wait_for()
    assert cpu.locator("polyline").count() >= 2, "one line drawn across the minutes nobody sampled"
    assert cpu.locator(".xaxis time").count() == 3 and cpu.locator(".yaxis").inner_text().startswith("100%")
    assert cpu.locator("strong").inner_text().endswith("%")
    memory = page.locator('[data-vital="process-memory:napper rss_mb"] strong').inner_text()
    assert memory.endswith(" MB"), memory
    charted = page.evaluate("() => [...document.querySelectorAll('[data-vital]')].map(c => c.dataset.vital)")
    assert not [k for k in charted if k.split()[-1] in ("cpus", "pid", "since", "started")], charted


def test_the_log_is_newest_first_with_errors_marked(site, page):
    pulsed, base, token = site
    # an error as a worker writes it (pulse.core.logs' format, to the millisecond: a stamp cut to
    # the second sorts before the lines written earlier in that second), then the page's own newer lines
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    with open(pulsed.home / "logs" / "pulse.log", "a") as log:
        log.write(f"{stamp} tick[1] ERROR pulse.tick: could not commit tick 7 (2 effects): disk I/O error\n"
                  f'{stamp} tick[1]   File "/srv/rules/seven.py", line 7 in decide\n')   # a hung worker's dump
    page.goto(f"{base}/log")
    page.wait_for_selector(".log .line")
    lines = page.locator(".log .line")
    errors = page.locator(".log .line.error")
    mine = errors.filter(has_text="could not commit tick 7")
    assert mine.count() == 1 and mine.locator("strong.bad").count() == 1
    assert errors.filter(has_text="seven.py").count() == 1
    stamps = page.evaluate("() => [...document.querySelectorAll('.log .line time')].map(t => t.dateTime)")
    assert len(stamps) == lines.count() and stamps == sorted(stamps, reverse=True)


def test_buttons_apply_only_where_their_action_can_and_the_page_never_stops_its_own_web_worker(site, page):
    pulsed, base, token = site
    page.wait_for_selector('[data-worker="web"] [data-action="stop"]')
    page.wait_for_selector('[data-process="napper"] [data-action="resume"]')
    stop_web = page.locator('[data-worker="web"] [data-action="stop"]')
    assert stop_web.is_disabled() and "pulsectl stop web" in stop_web.get_attribute("title")
    for w in WORKERS:
        row = f'[data-worker="{w}"]'
        assert page.locator(f'{row} [data-action="start"]').is_disabled(), f"{w} is running: start cannot apply"
        assert page.locator(f'{row} [data-action="restart"]').is_enabled()
    assert page.locator('[data-process="napper"] [data-action="resume"]').is_disabled()
    assert page.locator('[data-process="napper"] [data-action="pause"]').is_enabled()
    # the server refuses it too, with the command to use
    cookie = session_cookie(base, token)
    csrf = call(base, "GET", "/", {"Cookie": cookie})[2].decode().split('name="csrf" content="', 1)[1].split('"', 1)[0]
    before = pulsed.worker("web")
    headers = {"Cookie": cookie, "Origin": base, "X-CSRF-Token": csrf, "Content-Type": "application/json"}
    status, _, answer = call(base, "POST", "/api/workers", headers, json.dumps({"action": "stop", "worker": "web"}).encode())
    assert status == 409 and "pulsectl stop web" in json.loads(answer)["error"]
    assert pulsed.worker("web").pid == before.pid and pulsed.worker("web").state == "running"


def test_pause_with_an_empty_answer_takes_the_default(site, browser):
    pulsed, base, token = site
    context = browser.new_context(viewport=DESKTOP)
    try:
        tab = context.new_page()
        tab.on("dialog", lambda d: d.accept("") if d.type == "prompt" else d.accept())
        tab.goto(f"{base}/?token={token}")
        tab.wait_for_selector('[data-process="napper"] [data-action="pause"]:enabled')
        seen = len(pulsed.events("pause", "napper"))
        tab.click('[data-process="napper"] [data-action="pause"]')
        pause = wait_for(lambda: pulsed.events("pause", "napper")[seen:], 10, what="the pause an empty answer asked for")
        assert pause[0]["data"]["until"] - pause[0]["ts"] == pytest.approx(30 * 60, abs=5)     # the default: 30m
        tab.wait_for_selector('[data-process="napper"] [data-action="resume"]:enabled', timeout=10_000)
        tab.click('[data-process="napper"] [data-action="resume"]')
        tab.wait_for_selector('[data-process="napper"] [data-action="pause"]:enabled', timeout=10_000)
    finally:
        context.close()


def test_after_a_rollback_the_engine_page_says_staging_still_holds_it(site, page):
    pulsed, base, token = site
    staging = pulsed.home / "staging"
    (staging / "rules" / "loud.py").write_text("RULES = []\n")
    for argv in (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "loud"]):
        subprocess.run(["git", "-C", str(staging), *argv], check=True, capture_output=True)
    page.goto(f"{base}/engine")
    page.wait_for_selector('[data-field="staging"]')
    assert "rules/loud.py" in page.inner_text('[data-field="staging"]')
    assert page.locator('[data-action="promote"]').is_enabled()
    assert pulsed.ctl("promote").returncode == 0
    pulsed.wait_running(WORKERS)
    page.goto(f"{base}/engine")
    page.wait_for_selector('[data-field="staging"]')
    assert page.locator('[data-action="promote"]').is_disabled(), "staging is main: nothing to promote"
    assert page.locator('[data-action="rollback"]').is_enabled()
    rolled = pulsed.ctl("rollback")
    assert rolled.returncode == 0, rolled.stderr
    pulsed.wait_running(WORKERS)
    page.goto(f"{base}/engine")
    note = page.locator('[data-field="staging"]')
    note.wait_for()
    assert "staging still holds what was rolled back" in note.inner_text() and "rules/loud.py" in note.inner_text()
    assert "bad" in note.get_attribute("class")


def test_the_overview_and_the_events_page_draw_their_first_state_from_the_page_itself(site, page):
    """No stream and no API answer: what the server put in the page is drawn at once (a one-shot
    screenshot showed "loading…"), the critical processes first, on a phone's first screen."""
    pulsed, base, token = site
    page.route("**/api/**", lambda route: route.abort())
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{base}/")
    page.wait_for_selector('[data-worker="tick"]', timeout=5_000)
    assert page.evaluate("document.querySelector('main > section').id") == "processes"
    assert page.locator('[data-process="napper"]').bounding_box()["y"] < 844
    page.goto(f"{base}/events")
    page.wait_for_selector("[data-event]", timeout=5_000)
    assert "loading" not in page.inner_text("main")


def test_a_page_is_its_route_declared_where_it_is_defined_and_nothing_in_pages_py(tmp_path):
    """A page declared at its JSON route (`@page`, as pulse.web.reads declares each) is in the nav at
    its place, and has its page route and its /api/<name>, with no line of pulse.web.pages naming it."""
    import asyncio
    import concurrent.futures

    from starlette.requests import Request

    from pulse.core.home import Paths
    from pulse.web import pages, site

    @site.page("probe", order=55)
    async def api_probe(request):
        return None
    try:
        assert list(pages.page_paths())[5:8] == ["engine", "probe", "gate"]
        guard, _ = pages.make_app(Paths(tmp_path, tmp_path), tmp_path / "token", 10.0)
        routes = {r.path: r.endpoint for r in guard.app.routes}
        assert routes["/api/probe"] is api_probe and "/probe" in routes
        request = Request({"type": "http", "app": guard.app, "state": {}, "headers": []})
        with concurrent.futures.ThreadPoolExecutor(1) as thread:     # a loop of its own, beside the browser's
            drawn = thread.submit(asyncio.run, routes["/probe"](request)).result(timeout=30)
        assert 'data-page="probe"' in drawn.body.decode() and '<a href="/probe" aria-current=page>probe</a>' \
            in drawn.body.decode()
        with pytest.raises(ValueError, match="'probe2' .*clashes with page 'probe'"):
            site.page("probe2", order=55)(api_probe)
    finally:
        del site.PAGES["probe"]


def test_repeated_survival_actions_are_one_row_with_their_count():
    from pulse.web.reads import grouped
    trim = {"why": None, "kind": "rotate-file", "target": "app.log", "outcome": "acked"}
    rows = grouped([{**trim, "ts": 10.0 - i} for i in range(10)] + [{**trim, "outcome": "failed", "ts": 0.0}, {**trim, "ts": -1.0}])
    assert [(r["kind"], r["outcome"], r["count"], r["ts"]) for r in rows] == [
        ("rotate-file", "acked", 10, 10.0), ("rotate-file", "failed", 1, 0.0), ("rotate-file", "acked", 1, -1.0)]


def test_the_events_page_shows_a_hundred_at_a_time_and_pages_back_with_its_filters_folded(site, page):
    from pulse.store import eventsdb
    pulsed, base, token = site
    conn = eventsdb.open_events(pulsed.home / "events.db")
    eventsdb.append_events(conn, [eventsdb.now_event("test-paging", "test", str(i)) for i in range(150)])
    conn.close()
    page.goto(f"{base}/events")
    page.wait_for_selector("[data-event]")
    assert page.evaluate("document.querySelector('details.filters-box').open") is False   # folded: no filter set
    page.goto(f"{base}/events?type=test-paging")
    page.wait_for_selector("[data-event]")
    assert page.locator("[data-event]").count() == 100
    assert page.evaluate("document.querySelector('details.filters-box').open") is True
    assert page.inner_text("details.filters-box summary") == "filtered by type"
    page.click("text=older events")
    page.wait_for_selector("h2:has-text('Events before #')")
    targets = page.locator("[data-event] td:nth-child(5)").all_inner_texts()
    assert len(targets) == 50 and targets[0] == "49" and targets[-1] == "0"
    assert page.locator("text=older events").count() == 0 and "type=test-paging" in page.url


def test_a_vital_is_charted_only_as_a_measure_a_verdict_as_one_or_zero_never_a_time_or_a_status_code():
    from pulse.web.reads import chart_point
    assert chart_point("dead_since", 1796445584) is None and chart_point("looked_at", 1796445584.2) is None
    assert chart_point("code", 200) is None and chart_point("http_status", 503) is None
    assert chart_point("ok", False) == 0.0 and chart_point("dns_ok", True) == 1.0 and chart_point("alive", True) is None
    assert chart_point("latency_ms", 12.5) == 12.5 and chart_point("rss_mb", 0) == 0 and chart_point("error", "x") is None


def test_the_schedules_and_budget_pages_say_what_schedule_list_and_budget_say(site, page):
    pulsed, base, token = site
    page.goto(f"{base}/schedules")
    row = page.locator('[data-schedule="hourly"]')
    row.wait_for()
    assert "every 1h" in row.inner_text() and "effect noop" in row.inner_text()
    listed = json.loads(pulsed.ctl("schedule", "list", "--json").stdout.splitlines()[0])
    assert listed["name"] == "hourly" and page.locator('[data-schedule="hourly"] [data-label="runs"]').inner_text() == str(
        listed["runs"] + listed["manual_runs"])
    # and /metrics says it the same way
    status, _, body = call(base, "GET", "/metrics", {"Authorization": f"Bearer {token}"})
    text = body.decode()
    assert status == 200 and f'pulse_schedule_runs_total{{schedule="hourly"}} {float(listed["runs"] + listed["manual_runs"])}' in text
    assert 'pulse_schedule_run_open{schedule="hourly"}' in text and "pulse_schedule_next_run_timestamp_seconds" in text
    page.goto(f"{base}/budget")
    host = page.locator('[data-agent="*"]')
    host.wait_for()
    assert "$0.00 of $5.00" in host.inner_text() and "host (all agents)" in host.inner_text()
    # a session Pulse did not start, as the telemetry receiver records it: its own table, counted
    from pulse.agents import spend
    from pulse.core.config import SpendLimits
    from pulse.store import eventsdb
    conn = eventsdb.open_events(pulsed.home / "events.db")
    try:
        spend.observe(conn, [("session:op-9", {"usd": 0.25, "counted": True, "session": "op-9",
                                               "service": "claude-code"})], SpendLimits(), "telemetry")
    finally:
        conn.close()
    page.goto(f"{base}/budget")
    row = page.locator('[data-session="op-9"]')
    row.wait_for()
    assert "claude-code op-9" in row.inner_text() and "$0.25" in row.inner_text() and "against the host" in row.inner_text()
    assert "$0.25 of $5.00" in page.locator('[data-agent="*"]').inner_text()


def test_a_critical_process_is_stopped_and_started_from_the_page(site, page):
    """Stop and start act as `pulsectl process stop|start` do: operator events, the tree stopped,
    held down until started."""
    pulsed, base, token = site
    before = next(p for p in pulsed.status().processes if p.name == "napper")
    page.wait_for_selector('[data-process="napper"] [data-action="stop"]:not([disabled])')
    page.click('[data-process="napper"] [data-action="stop"]')
    page.wait_for_function("""() => document.querySelector('[data-process="napper"] [data-field="state"]')
                                       .textContent === 'stopped'""", timeout=15_000)
    wait_for(lambda: not psutil.pid_exists(before.pid) or psutil.Process(before.pid).status() == psutil.STATUS_ZOMBIE,
             10, what="napper stopped")
    page.click('[data-process="napper"] [data-action="start"]')
    page.wait_for_function("""() => ['starting', 'running'].includes(document.querySelector(
                                       '[data-process="napper"] [data-field="state"]').textContent)""", timeout=15_000)
    # the page says starting as soon as the start is asked for; status has the new pid once the
    # watcher has seen the new process (until then it may still show none, or the old one's)
    started = wait_for(lambda: next((p for p in pulsed.status().processes
                                     if p.name == "napper" and p.pid not in (None, before.pid)), None),
                       15, 0.05, what="napper's new pid in status")
    pulsed.tracker.add(started.pid)
    actions = [(e["source"], e["data"]["action"]) for e in pulsed.events("operator", "napper")]
    assert actions == [("web", "process-stop"), ("web", "process-start")]
