"""The report: the deterministic analyst on a fixture history in a real events.db, an
agent as analyst played by a fake CLI (valid, dangling citation, garbage, silent past its timeout)
through a real pulsed's executor and through pulsectl alone, the daily report through [[notify]],
and the page in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import msgspec
import pytest

from pulse.report import analysis as analysismod
from pulse.report import analyst, render, reportrun
from pulse.rules import survival
from pulse.store import connection, errorruns, eventsdb
from reportfixture import fixture_history, write
from support import CHROMIUM, browser_or_skip, init_home, notifications, pulsectl, wait_for

PY = sys.executable
MARKUP = "<img src=x onerror=window.__pwned=1>"


def window_args(h) -> list[str]:
    iso = lambda ts: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))   # noqa: E731
    return ["--from", iso(h.events[0].ts - 1), "--to", iso(h.t + 1)]


@pytest.fixture
def history(tmp_path):
    """The fixture history in a real events.db under a home; (history, home, its events by id)."""
    home = tmp_path / "home"
    home.mkdir()
    h = fixture_history(MARKUP)
    write(home / "events.db", h.events)
    return h, home


def analyse_db(path: Path, h, **scope):
    conn = connection.open_readonly(path)
    try:
        events, tasks = reportrun.read(conn, h.events[0].ts - 1, h.t + 1, scope.get("project"), scope.get("task"),
                                       checkpoints=path.parent / "checkpoints")
    finally:
        conn.close()
    return analyst.analyse(events, h.events[0].ts - 1, h.t + 1, tasks=tasks, **scope), {e.id: e for e in events}


def ids_of(h, type: str, target: str | None = None, **data) -> list[int]:
    return [e.id for e in h.events if e.type == type and (target is None or e.target == target)
            and all(e.data.get(k) == v for k, v in data.items())]


# -- the deterministic analyst -------------------------------------------------------------------------

def test_the_analyst_judges_the_fixture_history(history):
    h, home = history
    result, events = analyse_db(home / "events.db", h)
    cards = {card.name: card for card in result.role_analysis}
    assert cards["good"].verdict == "pass" and cards["good"].figures["success_rate_pct"] == 100.0
    assert cards["bad"].verdict == "fail" and cards["bad"].figures["acked"] == 0
    assert cards["bad"].figures["given_up"] == 1
    assert cards["survival"].verdict == "warn" and cards["survival"].figures["repairs_failed"] == 1
    # 100 − 3 failed runs × 4 − 1 given up × 8 − 1 failed repair × 6 − 1 rollback × 10
    assert (result.score, result.verdict) == (64, "warn")

    issues = {f.text.split(":")[0]: f for f in result.issues}
    given_up = issues["task-3 “rotate keys” failed 3 times and was given up"]
    assert given_up.severity == "error"
    assert set(ids_of(h, "task-failed", "task-3")) | set(ids_of(h, "task-given-up", "task-3")) <= set(given_up.event_ids)
    repair = issues["survival repair restart-process gateway failed"]
    assert repair.event_ids == ids_of(h, "effect", "gateway") + ids_of(h, "effect-failed", "gateway")
    rollback = next(f for f in result.issues if f.text.startswith("engine rolled back"))
    assert rollback.event_ids == ids_of(h, "rollback")
    assert any(f.text.startswith("good 2 of 2 tasks done") for f in result.highlights)

    runs = [e for e in result.timeline if e.run is not None]
    assert sorted(e.run for e in runs) == ["run-b1", "run-b2", "run-b3", "run-g1", "run-g2"]
    assert {e.run: e.outcome for e in runs}["run-b3"] == "given_up"
    assert [e.outcome for e in result.timeline if e.lane == "engine"] == ["promote", "rollback"]

    # every citation names an event of the window, in the database
    assert analysismod.cited(result) and set(analysismod.cited(result)) <= set(events)
    analysismod.check(result, set(events))
    # and the analysis round-trips through its schema
    assert analysismod.decode(analysismod.encode(result)) == result


def test_a_memory_restart_is_a_survival_repair_and_its_reason_shows(tmp_path):
    from reportfixture import History
    h = History()
    reason = "memory: its tree's RSS 4210.5 MB was above max_mb 4096 for 3 samples in a row"
    h.effect("mem-1", "notify", "gateway", "survival", rule="process-memory", title="gateway's memory keeps growing",
             message="gateway's tree grew 640 MB/h")
    h.add("effect-acked", "executor", "gateway", effect_id="mem-1", kind="notify")
    h.effect("mem-2", "restart-process", "gateway", "survival", why="memory", rss_mb=4210.5, max_mb=4096, samples=3,
             pid=41, reason=reason)
    h.add("effect-executing", "executor", "gateway", effect_id="mem-2", kind="restart-process")
    h.add("process-exited", "keeper", "gateway", pid=41, code=None, signal="SIGTERM")
    h.add("effect-acked", "executor", "gateway", effect_id="mem-2", kind="restart-process")
    write(tmp_path / "events.db", h.events)
    result, _ = analyse_db(tmp_path / "events.db", h)
    card = next(c for c in result.role_analysis if c.name == "survival")
    assert card.figures["repairs_acked"] == 1 and card.figures["notifications"] == 1 and card.verdict == "pass"
    repaired = next(f for f in result.highlights if f.text.startswith("survival repaired"))
    assert f"restart-process gateway ({reason})" in repaired.text
    assert [e.label for e in result.timeline if e.lane == "survival"] == [
        "notify gateway (gateway's memory keeps growing)", f"restart-process gateway ({reason})"]
    assert reason in render.text(result)


def test_an_error_that_keeps_recurring_is_one_distinct_error_and_every_occurrence_counts(tmp_path):
    conn = eventsdb.open_events(tmp_path / "events.db")
    t0 = 1000.0
    for i in range(30):       # once a second: its first event, then one per repeat_s with the count since
        errorruns.record_error(conn, "engine", "engine", "rule raised KeyError: 'disk'", repeat_s=10, now=t0 + i)
    errorruns.record_error(conn, "tick", "engine", "engine did not answer", now=t0 + 30)
    errorruns.settle_error_runs(conn, repeat_s=10, now=t0 + 100)        # the last repeats, once the error stopped
    events = eventsdb.read_events(conn)
    conn.close()
    errors = [e for e in events if e.type == "error"]
    assert len(errors) == 5
    result = analyst.analyse(events, 0, time.time() + 1)
    finding = next(f for f in result.issues if "distinct error" in f.text)
    assert finding.text.startswith("2 distinct errors, 31 in all; the last: rule raised KeyError")
    assert finding.event_ids == [errors[3].id, errors[4].id]     # the latest event of each
    assert result.score == 100 - 2                               # one point per distinct error


def test_an_agent_that_keeps_failing_judges_worse_than_one_that_keeps_succeeding(history):
    h, home = history
    result, _ = analyse_db(home / "events.db", h)
    order = {"pass": 0, "warn": 1, "fail": 2}
    cards = {card.name: card for card in result.role_analysis}
    assert order[cards["bad"].verdict] > order[cards["good"].verdict]


def test_a_dangling_citation_makes_an_analysis_invalid(history):
    h, home = history
    result, events = analyse_db(home / "events.db", h)
    bad = msgspec.structs.replace(result, issues=[*result.issues, analysismod.Finding(
        text="made up", severity="warn", event_ids=[max(events) + 1000])])
    with pytest.raises(analysismod.InvalidAnalysis, match=f"#{max(events) + 1000}"):
        analysismod.check(bad, set(events))


def test_a_project_or_a_task_scopes_the_report(history):
    h, home = history
    ops, events = analyse_db(home / "events.db", h, project="ops")
    assert [c.name for c in ops.role_analysis if c.role == "agent"] == ["bad"]
    assert all(events[i].type.startswith(("task-", "effect")) for i in analysismod.cited(ops))
    assert ops.verdict == "warn"          # a failing role: never a pass, whatever the score
    one, _ = analyse_db(home / "events.db", h, task="task-1")
    assert [e.run for e in one.timeline] == ["run-g1"]


# -- pulsectl report, deterministic ------------------------------------------------------------------

def ctl(home: Path, *args: str, timeout: float = 60, env: dict | None = None):
    return pulsectl(["--home", str(home), *args], timeout=timeout, env=dict(os.environ, **(env or {})))


def test_pulsectl_report_prints_text_json_and_html(history, tmp_path):
    h, home = history
    out = ctl(home, "report", *window_args(h))
    assert out.returncode == 0, out.stderr
    assert "score 64/100, WARN" in out.stdout and "[fail] agent bad" in out.stdout
    out = ctl(home, "report", *window_args(h), "--json")
    assert out.returncode == 0, out.stderr
    result = analysismod.decode(out.stdout)
    assert result.version == 1 and result.score == 64
    page = tmp_path / "r.html"
    out = ctl(home, "report", *window_args(h), "--html", str(page))
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    assert MARKUP not in text and "&lt;img src=x onerror=window.__pwned=1&gt;" in text
    assert ctl(home, "report", "--since", "1h", "--from", "2026-01-01").returncode == 2
    assert "is neither" in ctl(home, "report", "--analyst", "nobody").stderr


# -- an agent as analyst --------------------------------------------------------------------------------

FAKE_ANALYST = r'''
import json, os, re, sys, time
mode = os.environ["FAKE_MODE"]
prompt = sys.argv[1]
if mode == "silent":
    time.sleep(120)
if mode == "garbage":
    print("I looked at the events and everything is { fine")
    sys.exit(0)
base = json.loads(prompt.split("The deterministic analysis, to check and improve: ", 1)[1].split("\n", 1)[0])
ids = [int(m) for m in re.findall(r"^#(\d+) ", prompt, flags=re.M)]
base["score"] = 42
base["verdict"] = "fail"
cite = [ids[0]] if mode == "valid" else [999999]
base["issues"].append({"text": "the model's own finding " + os.environ.get("FAKE_TEXT", ""), "severity": "warn",
                       "event_ids": cite})
print("some chatter first")
print(json.dumps({"type": "result", "is_error": False, "result": "```json\n" + json.dumps(base) + "\n```"}))
'''


def running(script: Path) -> list[int]:
    """Live processes whose command line names `script` (unique to the test's tmp_path)."""
    import psutil
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if str(script) in (proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(proc.pid)
    return out


def analyst_config(script: Path, timeout_s: float = 60) -> str:
    out = []
    for mode in ("valid", "dangling", "garbage", "silent"):
        out.append(f'[[agent]]\nname = "{mode}"\nadapter = "command"\n'
                   f'argv = [{json.dumps(PY)}, {json.dumps(str(script))}, "{{prompt}}"]\n'
                   f'env = {{FAKE_MODE = "{mode}", FAKE_TEXT = {json.dumps(MARKUP)}}}\ntimeout_s = {timeout_s}\n')
    return "\n".join(out) + "\n[report]\nanalyst_timeout_s = 2\n"


def check_answers(home: Path, h, results: dict) -> None:
    valid = results["valid"]
    assert valid.analyst == "valid" and valid.fallback is None and valid.score == 42
    assert any(f.text.startswith("the model's own finding") for f in valid.issues)
    assert results["dangling"].analyst == "deterministic" and "#999999" in results["dangling"].fallback
    assert results["dangling"].score == 64
    assert "no JSON analysis" in results["garbage"].fallback
    assert "timed out after 2s" in results["silent"].fallback


def report_as(home: Path, h, name: str, env: dict | None = None):
    out = ctl(home, "report", *window_args(h), "--json", "--analyst", name, env=env)
    assert out.returncode == 0, out.stderr
    return analysismod.decode(out.stdout), out.stderr


def test_an_agent_analyst_runs_as_an_effect_and_falls_back_when_its_answer_is_unusable(pulsed, history, tmp_path):
    h, home = history
    assert home == pulsed.home
    script = tmp_path / "fake_analyst.py"
    script.write_text(FAKE_ANALYST)
    (home / "config.toml").write_text(analyst_config(script))
    pulsed.start()
    results = {}
    for mode in ("valid", "dangling", "garbage", "silent"):
        started = time.monotonic()
        results[mode], stderr = report_as(home, h, mode)
        assert "runs from pulsectl" not in stderr
        if mode != "valid":
            assert "not used" in stderr
        assert time.monotonic() - started < 30
    check_answers(home, h, results)
    effects = [e for e in pulsed.events("effect") if e["data"]["kind"] == "report"]
    assert [e["data"]["params"]["analyst"] for e in effects] == ["valid", "dangling", "garbage", "silent"]
    acked = {e["data"]["effect_id"]: e["data"] for e in pulsed.events("effect-acked") if e["data"]["kind"] == "report"}
    assert len(acked) == 4 and all(Path(d["path"]).is_file() for d in acked.values())
    assert len({d["path"] for d in acked.values()}) == 4      # four reports within a second: four pages
    for data in acked.values():          # the model's words and the task's title, escaped on the page
        page = Path(data["path"]).read_text()
        assert MARKUP not in page and "&lt;img src=x onerror=window.__pwned=1&gt;" in page
    by_analyst = {d["analyst"] if d["fallback"] is None else d["fallback"].split(":")[0]: d for d in acked.values()}
    assert "the model&#x27;s own finding" in Path(by_analyst["valid"]["path"]).read_text()
    assert "was not used" in Path(by_analyst["agent silent"]["path"]).read_text()
    # the silent agent's process group was killed at its timeout
    wait_for(lambda: not running(script), 10, what="no fake analyst left running")


def test_without_pulsed_pulsectl_runs_the_agent_itself_and_says_so(history, tmp_path):
    h, home = history
    script = tmp_path / "fake_analyst.py"
    script.write_text(FAKE_ANALYST)
    (home / "config.toml").write_text(analyst_config(script))
    results = {}
    for mode in ("valid", "dangling", "garbage", "silent"):
        results[mode], stderr = report_as(home, h, mode)
        assert "pulsed is not running; the analyst agent runs from pulsectl" in stderr
    check_answers(home, h, results)
    assert running(script) == []


def test_an_answer_is_found_in_what_agents_print():
    body = {"score": 1, "verdict": "fail"}
    assert reportrun.answer(json.dumps(body).encode()) == body
    assert reportrun.answer(json.dumps({"structured_output": body, "result": ""}).encode()) == body
    assert reportrun.answer(b"noise\n" + json.dumps({"result": "Here:\n```json\n" + json.dumps(body) + "\n```"}).encode()) == body
    with pytest.raises(reportrun.AnalystFailed, match="no output"):
        reportrun.answer(b"")


# -- the daily report ------------------------------------------------------------------------------------

def test_last_daily_due_is_the_latest_past_occurrence(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        now = 1_790_000_000.0                              # 2026-09-21T14:13:20Z
        assert survival.last_daily_due(now, "08:00") == 1_789_977_600.0        # the same day, 08:00
        assert survival.last_daily_due(now, "15:00") == 1_789_977_600.0 - 17 * 3600   # the day before, 15:00
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_the_daily_report_goes_through_the_notify_channels_once(pulsed, tmp_path):
    init_home(pulsed.home)
    channel = tmp_path / "notes.jsonl"
    now = time.localtime()
    (pulsed.home / "config.toml").write_text(
        f'[report]\ndaily_at = "{now.tm_hour:02d}:{now.tm_min:02d}"\n\n'
        f'[[notify]]\nkind = "file"\npath = "{channel}"\n')
    pulsed.start(env={"PULSE_TICK_MS": "100"})
    sent = wait_for(lambda: notifications(channel, "daily-report"), 20, what="the daily report notification")
    note = sent[0]
    assert note["message"].startswith("Pulse report ") and f"Page: {note['path']}" in note["message"]
    page = Path(note["path"])
    assert page.is_file() and page.parent == pulsed.home / "reports" and page.read_text().startswith("<!doctype html>")
    pulsed.wait_ticks(10)
    assert len(notifications(channel, "daily-report")) == 1
    assert len([e for e in pulsed.events("effect") if e["data"]["kind"] == "report"]) == 1


def test_report_config_errors_name_the_key(tmp_path):
    from pulse.core import config
    path = tmp_path / "config.toml"
    path.write_text('[report]\ndaily_at = "8am"\n')
    with pytest.raises(config.ConfigError, match=r"\$\.report\.daily_at"):
        config.load(path, {})
    path.write_text('[report]\nanalyst = "ghost"\n')
    with pytest.raises(config.ConfigError, match=r"\$\.report\.analyst"):
        config.load(path, {})


# -- the page in a browser -------------------------------------------------------------------------------

def test_the_page_in_chromium_is_self_contained_and_inert(history, tmp_path):
    sync_playwright = browser_or_skip()
    h, home = history
    result, events = analyse_db(home / "events.db", h)
    page_path = tmp_path / "report.html"
    page_path.write_text(render.html(result, events))
    runs = [e.run for e in result.timeline if e.run is not None]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri())
            page.wait_for_load_state("load")
            assert requests == [page_path.as_uri()]           # no request leaves the file
            assert page.locator("[data-run]").count() == len(runs) == 5
            for run in runs:
                assert page.locator(f'[data-run="{run}"]').count() == 1
            assert page.locator("img").count() == 0 and page.locator("script").count() == 0
            assert page.evaluate("window.__pwned") is None
            assert MARKUP in page.inner_text("body")          # the title shows as text
            # each citation links to its event in the appendix
            for ref in page.locator("a.cite").evaluate_all("els => els.map(e => e.getAttribute('href'))"):
                assert page.locator(ref).count() == 1
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
            background = "getComputedStyle(document.body).backgroundColor"
            assert page.evaluate(background) == "rgb(13, 17, 23)"       # dark on screen
            page.emulate_media(media="print")
            assert page.evaluate(background) == "rgb(255, 255, 255)"    # light on paper
            page.emulate_media(media="screen")
            page.set_viewport_size({"width": 390, "height": 844})     # a phone: the timeline scrolls, readable
            assert page.locator(".gantt svg").bounding_box()["height"] >= 60
            keep = os.environ.get("PULSE_REPORT_SCREENSHOT")
            if keep:
                page.screenshot(path=keep, full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_the_daily_report_with_a_silent_agent_analyst_still_notifies_through_a_command(pulsed, tmp_path):
    """The agent uses up its time; the report falls back, and the command channel still gets its own."""
    init_home(pulsed.home)
    script = tmp_path / "fake_analyst.py"
    script.write_text(FAKE_ANALYST)
    received = tmp_path / "received.jsonl"
    sink = f"import sys; open({str(received)!r}, 'a').write(sys.stdin.read())"
    now = time.localtime()
    (pulsed.home / "config.toml").write_text(
        analyst_config(script).replace("[report]\n", f'[report]\nanalyst = "silent"\ndaily_at = '
                                                     f'"{now.tm_hour:02d}:{now.tm_min:02d}"\n')
        + f'\n[[notify]]\nkind = "command"\nargv = [{json.dumps(PY)}, "-c", {json.dumps(sink)}]\n')
    pulsed.start(env={"PULSE_TICK_MS": "100"})
    note = wait_for(lambda: received.exists() and received.read_text().strip()
                    and json.loads(received.read_text().splitlines()[0]), 30, what="the daily report through the command")
    assert note["rule"] == "daily-report"
    assert "the agent's analysis was not used: agent silent: timed out after 2s" in note["message"]


def test_the_web_page_of_a_window_is_the_rendered_deterministic_report(history):
    h, home = history
    conn = connection.open_readonly(home / "events.db")
    try:
        text = reportrun.page(conn, h.events[0].ts - 1, h.t + 1, checkpoints=home / "checkpoints")
    finally:
        conn.close()
    result, events = analyse_db(home / "events.db", h)
    assert text == render.html(result, events)


def test_the_agent_gets_at_most_analyst_max_events_the_cited_ones_first(history):
    h, home = history
    result, events = analyse_db(home / "events.db", h)
    text = reportrun.prompt(list(events.values()), result, 5)
    shown = [int(i) for i in re.findall(r"^#(\d+) ", text, flags=re.M)]
    assert len(shown) == 5 and set(shown) <= set(analysismod.cited(result))
    assert "Schema: " in text and len(text) <= reportrun.PROMPT_MAX_CHARS


def test_pulses_own_workers_dying_hanging_and_failing_are_in_the_verdict_and_the_survival_card(tmp_path):
    from reportfixture import History
    h = History()
    h.add("worker-hung", "pulsed", "watcher", pid=11, silent_ms=10500, before_ready=False)
    h.add("worker-exited", "pulsed", "watcher", pid=11, code=None, signal=6, state="hung", uptime_s=90.0)
    h.add("worker-exited", "pulsed", "tick", pid=12, code=None, signal=9, state="running", uptime_s=30.0)
    h.add("worker-exited", "pulsed", "executor", pid=13, code=0, signal=None, state="stopping", uptime_s=5.0)  # asked
    for pid in (14, 15, 16):
        h.add("worker-exited", "pulsed", "web", pid=pid, code=1, signal=None, state="starting", uptime_s=0.2)
    h.add("worker-failed", "pulsed", "web", reason="5 crashes in 60s")
    write(tmp_path / "events.db", h.events)
    result, _ = analyse_db(tmp_path / "events.db", h)
    card = next(c for c in result.role_analysis if c.name == "survival")
    assert card.verdict == "fail" and result.verdict != "pass"
    assert card.summary == "Pulse's own workers: tick crashed, web crashed 3 times, web failed, watcher hung"
    assert (card.figures["worker_crashes"], card.figures["worker_hangs"], card.figures["worker_failures"]) == (4, 1, 1)
    texts = [f.text for f in result.issues]
    assert "Pulse's own workers hung (silent past hung_after_ms; each replaced): watcher once" in texts
    assert "Pulse's own workers exited unasked (a crash or a kill; each restarted): tick once, web 3 times" in texts
    assert result.score == 100 - 10 - 5 - 3 * 4


def test_a_cited_event_in_the_html_shows_its_times_as_iso_as_pulsectl_does():
    from pulse.core.wire.eventmsgs import Event
    ev = Event(type="pause", source="pulsectl", target="svc", id=7, ts=1796292000.0,
               data={"until": 1796292125.51, "pid": 1796292125, "count": 3})
    line = render._event_line(ev)
    assert "&quot;until&quot;:&quot;2026-12-03T10:02:05.509Z&quot;" in line, line
    assert "&quot;pid&quot;:1796292125," in line          # an integer under no time key: a pid, not a time
    assert "1796292125.51" not in line


def test_watched_directories_trimmed_and_stale_proofs_of_work_are_judged_and_cited(tmp_path):
    """dirGuard's trims are a highlight per directory with what they took away; a [[watch.fresh]]
    gone stale is an issue citing freshWatch's notices and the restart it asked for: a warning once
    work is seen again, an error (and never a pass) while it stays stale."""
    from reportfixture import History
    h = History()
    out = "/srv/hermes/cron/output"
    for i, (removed, freed) in enumerate([(400, 1048576), (800, 3 * 1048576)]):
        h.effect(f"trim-{i}", "trim-dir", out, "survival", watch="cron-output", why="max_files", rule="dir-guard")
        h.add("effect-acked", "executor", out, effect_id=f"trim-{i}", kind="trim-dir", removed=removed, bytes_freed=freed)
    h.effect("stale-1", "notify", "heartbeat", "survival", rule="fresh-watch",
             title="heartbeat: no sign of work for 5 min", message="~/.openclaw/heartbeat did not change within 300 s",
             restart="openclaw-gateway")
    h.add("effect-acked", "executor", "heartbeat", effect_id="stale-1", kind="notify")
    h.effect("stale-r", "restart-process", "openclaw-gateway", "survival", why="stale", watch="heartbeat",
             reason="stale: no sign of work in ~/.openclaw/heartbeat for 5 min")
    h.add("effect-acked", "executor", "openclaw-gateway", effect_id="stale-r", kind="restart-process")
    h.effect("stale-2", "notify", "cron", "survival", rule="fresh-watch", title="cron: no sign of work for 2 h",
             message="~/.hermes/cron/output did not change within 3600 s")
    h.add("effect-acked", "executor", "cron", effect_id="stale-2", kind="notify")
    write(tmp_path / "events.db", h.events)
    result, _ = analyse_db(tmp_path / "events.db", h)

    trimmed = next(f for f in result.highlights if f.text.startswith("watched directories"))
    assert trimmed.text == (f"watched directories kept within bounds: {out} trimmed twice (over max_files): "
                            "1200 files, 4.0 MiB taken away")
    assert set(trimmed.event_ids) == set(ids_of(h, "effect", out) + ids_of(h, "effect-acked", out))
    heartbeat = next(f for f in result.issues if "proof of work heartbeat" in f.text)
    assert heartbeat.text == ("proof of work heartbeat went stale: heartbeat: no sign of work for 5 min; "
                              "1 restart of openclaw-gateway for it; still stale at the window's end")
    assert heartbeat.severity == "error"
    assert set(heartbeat.event_ids) == set(ids_of(h, "effect", "heartbeat") + ids_of(h, "effect-acked", "heartbeat")
                                           + ids_of(h, "effect", "openclaw-gateway")
                                           + ids_of(h, "effect-acked", "openclaw-gateway"))
    assert any(f.text.startswith("proof of work cron went stale") for f in result.issues)
    card = next(c for c in result.role_analysis if c.name == "survival")
    assert card.figures["proofs_stale"] == 2 and card.figures["dirs_trimmed"] == 2
    assert result.score == 100 - 2 * 5 and result.verdict == "warn"           # 90, yet nothing is happening
    assert "proof of work heartbeat went stale" in render.text(result)

    # Work seen again on both: warnings, and the window may pass.
    for watch in ("heartbeat", "cron"):
        h.effect(f"{watch}-back", "notify", f"{watch}:back", "survival", rule="fresh-watch",
                 title=f"{watch}: work seen again", message="changed, within its bound again")
        h.add("effect-acked", "executor", f"{watch}:back", effect_id=f"{watch}-back", kind="notify")
    write(tmp_path / "again.db", h.events)
    again, _ = analyse_db(tmp_path / "again.db", h)
    heartbeat = next(f for f in again.issues if "proof of work heartbeat" in f.text)
    assert heartbeat.severity == "warn" and heartbeat.text.endswith("; work seen again")
    assert set(ids_of(h, "effect", "heartbeat:back")) <= set(heartbeat.event_ids)
    assert again.score == 90 and again.verdict == "pass"
