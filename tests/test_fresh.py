"""Proof that work happens ([[watch.fresh]], freshWatch, processWatchdog's stale restarts).

The pure half: the config, the watcher's sample of real files, directories and a loopback URL,
the rules over snapshots. The other half runs a real pulsed beside a real worker process that
stays alive and healthy while its heartbeat file stops changing, and a status URL whose JSON
counter stops counting.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pulse.core import config as configmod
from pulse.core.wire.enginerpc import Outcome, ProcessRuns, ProcessStart, Snapshot, Vital
from pulse.rules import onion, survival
from pulse.sensing.freshness import FreshWatch, look_at_path
from support import init_home, notifications, scrape, wait_for


def config(text: str) -> configmod.Config:
    return configmod.validate(configmod.decode(textwrap.dedent(text).encode(), "test"), "test")


def fresh_toml(name="beat", **keys) -> str:
    return f'[[watch.fresh]]\nname = "{name}"\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())


# -- config ---------------------------------------------------------------------------------------------

def test_every_key_has_its_default():
    watch = config(fresh_toml(path="/var/lib/agent/heartbeat")).watch.fresh[0]
    assert (watch.within_s, watch.recursive, watch.restart, watch.url, watch.field) == (3600, False, None, None, None)
    assert configmod.Config().watch.fresh == [] and configmod.Health().max_latency_ms is None
    assert "# [[watch.fresh]]" in configmod.default_toml() and "max_latency_ms" in configmod.default_toml()


@pytest.mark.parametrize("keys, named", [
    ({}, "$.watch.fresh[0]: set exactly one of path or url"),
    ({"path": "/a", "url": "http://127.0.0.1/"}, "$.watch.fresh[0]: set exactly one of path or url"),
    ({"path": "beat"}, "$.watch.fresh[0].path must be an absolute path"),
    ({"path": "/a/../etc"}, "$.watch.fresh[0].path must be an absolute path without '..'"),
    ({"url": "http://10.1.2.3:80/status"}, "$.watch.fresh[0].url: only a loopback address"),
    ({"url": "http://example.com/"}, "$.watch.fresh[0].url: only a loopback address"),
    ({"url": "ftp://127.0.0.1/"}, "$.watch.fresh[0].url: not an http"),
    ({"path": "/a", "field": "runs"}, "$.watch.fresh[0].field"),
    ({"url": "http://127.0.0.1/", "field": "a..b"}, "$.watch.fresh[0].field"),
    ({"url": "http://localhost/", "recursive": True}, "$.watch.fresh[0].recursive: only with path"),
    ({"path": "/a", "within_s": 0}, "$.watch.fresh[0].within_s must be greater than 0"),
    ({"path": "/a", "restart": "gw"}, "$.watch.fresh[0].restart: no [[process]] named 'gw'"),
    ({"path": "/a", "every": 1}, "unknown key $.watch.fresh[0].every"),
])
def test_bad_keys_are_named(keys, named):
    with pytest.raises(configmod.ConfigError) as err:
        config(fresh_toml(**keys))
    assert named in str(err.value)


def test_names_are_unique_a_restart_names_a_restartable_process_and_max_latency_is_below_the_timeout():
    with pytest.raises(configmod.ConfigError, match=r"\$\.watch\.fresh: names must be unique"):
        config(fresh_toml(path="/a") + fresh_toml(path="/b"))
    ok = config('[[process]]\nname = "gw"\nmatch = "gw"\nrestart = ["gw"]\n' + fresh_toml(path="/a", restart="gw"))
    assert ok.watch.fresh[0].restart == "gw"
    assert config(fresh_toml(url="http://[::1]:8080/status", field="cron.runs")).watch.fresh[0].field == "cron.runs"
    with pytest.raises(configmod.ConfigError, match=r"\$\.watch\.fresh\[0\]\.restart"):   # found, not restartable
        config('[[process]]\nname = "gw"\nmatch = "gw"\n' + fresh_toml(path="/a", restart="gw"))
    with pytest.raises(configmod.ConfigError, match=r"\$\.process\[0\]\.health\.max_latency_ms must be greater than 0 "
                                                    r"and below timeout_s \(3 s"):
        config('[[process]]\nname = "gw"\nmatch = "gw"\nhealth = { url = "http://127.0.0.1:1/", max_latency_ms = 3000 }\n')


# -- the watcher's sample ---------------------------------------------------------------------------------

def test_a_file_is_its_mtime_a_directory_its_newest_entry_and_a_link_is_never_followed_out(tmp_path):
    out, beat = tmp_path / "out", tmp_path / "beat"
    (out / "2026" / "12").mkdir(parents=True)
    beat.write_text("x")
    os.utime(beat, (1000, 1000))
    (out / "run-1.txt").write_text("x")
    os.utime(out / "run-1.txt", (2000, 2000))
    (out / "2026" / "12" / "run-2.txt").write_text("x")
    os.utime(out / "2026" / "12" / "run-2.txt", (3000, 3000))
    for d in (out / "2026" / "12", out / "2026"):
        os.utime(d, (1500, 1500))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "new.txt").write_text("x")
    os.utime(elsewhere / "new.txt", (9000, 9000))
    os.symlink(elsewhere, out / "linked")              # its own mtime counts, never what it points at
    os.utime(out / "linked", (1200, 1200), follow_symlinks=False)
    assert look_at_path(str(beat), False) == {"kind": "file", "changed_at": 1000, "error": None}
    flat = look_at_path(str(out), False)
    assert (flat["changed_at"], flat["newest"], flat["entries"]) == (2000, "run-1.txt", 3)
    deep = look_at_path(str(out), True)
    assert (deep["changed_at"], deep["newest"], deep["entries"]) == (3000, "2026/12/run-2.txt", 5)
    empty = tmp_path / "empty"
    empty.mkdir()
    os.utime(empty, (4000, 4000))
    assert look_at_path(str(empty), True)["changed_at"] == 4000
    missing = look_at_path(str(tmp_path / "nothing"), False)
    assert missing["changed_at"] is None and "does not exist" in missing["error"]


class Status:
    """A loopback status URL whose JSON counter counts at each request while `counting`."""

    def __init__(self):
        status = self
        self.counting, self.runs, self.delay = True, 0, 0.0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/moved":
                    self.send_response(302)
                    self.send_header("Location", "http://127.0.0.2:1/elsewhere")
                    self.end_headers()
                    return
                time.sleep(status.delay)
                status.runs += status.counting
                body = json.dumps({"cron": {"runs": status.runs, "jobs": [status.runs]}, "now": time.time()}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/status"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def status_url():
    s = Status()
    yield s
    s.close()


def test_a_url_changes_when_its_field_does_not_when_the_rest_of_the_answer_does(status_url):
    watch = FreshWatch(configmod.FreshWatch(name="cron", url=status_url.url, field="cron.runs", within_s=60), 100)
    first = watch.collect()
    assert first["value"] == "1" and first["changed_at"] is not None and not first["stale"] and first["error"] is None
    second = watch.collect()
    assert second["value"] == "2" and second["changed_at"] > first["changed_at"]
    status_url.counting = False
    third, fourth = watch.collect(), watch.collect()      # "now" changes each time: the field does not
    assert third["value"] == fourth["value"] == "2" and third["changed_at"] == fourth["changed_at"] == second["changed_at"]
    # a restarted watcher carries on: the same answer is no news
    again = FreshWatch(watch.watch, 100)
    again.resume(fourth)
    assert again.collect()["changed_at"] == second["changed_at"]
    # without a field, the whole answer is compared ("now" changes it each time), never kept
    whole = FreshWatch(configmod.FreshWatch(name="all", url=status_url.url), 100)
    one, two = whole.collect(), whole.collect()
    assert two["changed_at"] > one["changed_at"] and two["value"] is None and two["bytes"] > 0
    # a JSON path into a list, a field that is not there, and a redirect that is an answer, not a way out
    listed = FreshWatch(configmod.FreshWatch(name="c", url=status_url.url, field="cron.jobs.0"), 100).collect()
    assert listed["value"] == "2"
    gone = FreshWatch(configmod.FreshWatch(name="c", url=status_url.url, field="cron.skipped"), 100).collect()
    assert gone["changed_at"] is None and "no 'skipped'" in gone["error"]
    moved = FreshWatch(configmod.FreshWatch(name="c", url=status_url.url.replace("/status", "/moved")), 100).collect()
    assert moved["status"] == 302 and moved["changed_at"] is None


def test_a_watch_is_stale_from_its_last_sign_of_work_and_rings_the_tick_once(tmp_path):
    beat = tmp_path / "beat"
    beat.write_text("x")
    watch = FreshWatch(configmod.FreshWatch(name="beat", path=str(beat), within_s=30), 100)
    assert not watch.collect()["stale"]
    os.utime(beat, (time.time() - 31, time.time() - 31))
    stale = watch.collect()
    assert stale["stale"] and stale["age_s"] >= 31
    fresh = {"stale": False}
    assert watch.should_wake([Vital("fresh:beat", 1, fresh), Vital("fresh:beat", 2, stale)])
    assert not watch.should_wake([Vital("fresh:beat", 1, stale), Vital("fresh:beat", 2, stale)])


def test_a_probe_that_answers_slower_than_max_latency_ms_failed_and_says_both_figures():
    from pulse.sensing.builtin import too_slow
    assert too_slow({"ok": True, "latency_ms": 812.4, "error": None}, 300) == {
        "ok": False, "latency_ms": 812.4, "slow": True, "error": "answered in 812 ms, over max_latency_ms 300"}
    assert too_slow({"ok": True, "latency_ms": 120.0, "error": None}, 300)["ok"]
    assert too_slow({"ok": True, "latency_ms": 812.4, "error": None}, None)["ok"]


# -- the rules ------------------------------------------------------------------------------------------

RULES = config("""
    [[process]]
    name = "worker"
    match = "worker"
    restart = ["worker"]

    [[watch.fresh]]
    name = "beat"
    path = "/srv/agent/heartbeat"
    within_s = 60
    restart = "worker"

    [[watch.fresh]]
    name = "cron"
    url = "http://127.0.0.1:9/status"
    field = "cron.runs"
    within_s = 60
""")


def run(rule, curr: Snapshot):
    tick = configmod.slice_of(RULES, "tick")
    return asyncio.run(onion.compose([rule(tick)], onion.nothing)(None, curr))


def sample(name: str, ts: float, changed_at: float | None, since: float = 0.0) -> list[Vital]:
    return [Vital(f"fresh:{name}", ts, {"changed_at": changed_at, "watching_since": since})]


ALIVE = {"process-alive:worker": Vital("process-alive:worker", 999, {"alive": True, "pid": 7, "since": 100.0})}


def test_fresh_watch_notifies_once_per_staleness():
    fresh = Snapshot(tick=1, ts=1000, history={"fresh:beat": sample("beat", 999, 950)})
    assert run(survival.fresh_watch, fresh)[0] == []
    curr = Snapshot(tick=1, ts=1000, history={"fresh:beat": sample("beat", 999, 900),
                                               "fresh:cron": sample("cron", 999, None, since=500)})
    effects, _ = run(survival.fresh_watch, curr)
    assert [(e.kind, e.target, e.params["rule"]) for e in effects] == [("notify", "beat", "fresh-watch"),
                                                                       ("notify", "cron", "fresh-watch")]
    assert "/srv/agent/heartbeat did not change within 60 s" in effects[0].params["message"]
    assert effects[0].params["message"].endswith("; restarting worker")
    assert "no sign of work since watching began" in effects[1].params["message"]
    # said: not again for this staleness; work seen and stopped again is a new one
    told = {"fresh-watch:beat": 1000.0, "fresh-watch:cron": 1000.0}
    assert run(survival.fresh_watch, Snapshot(tick=2, ts=1100, history=curr.history, notified=told))[0] == []
    later = {"fresh:beat": sample("beat", 1200, 1050)}
    assert [e.target for e in run(survival.fresh_watch, Snapshot(tick=3, ts=1200, history=later, notified=told))[0]] == ["beat"]
    # work seen again after a staleness was said: said once, and never for a watch that was never stale
    back = {"fresh:beat": sample("beat", 1100, 1090), "fresh:cron": sample("cron", 1100, 1095)}
    effects, _ = run(survival.fresh_watch, Snapshot(tick=4, ts=1100, history=back, notified={"fresh-watch:beat": 1000.0}))
    assert [(e.target, e.params["title"]) for e in effects] == [("beat:back", "beat: work seen again")]
    again = {"fresh-watch:beat": 1000.0, "fresh-watch:beat:back": 1100.0}
    assert run(survival.fresh_watch, Snapshot(tick=5, ts=1101, history=back, notified=again))[0] == []


def test_process_watchdog_restarts_a_live_process_whose_proof_is_stale_and_gives_the_new_copy_within_s():
    stale = Snapshot(tick=1, ts=1000, vitals=ALIVE, history={"fresh:beat": sample("beat", 999, 900)})
    effects, _ = run(survival.process_watchdog, stale)
    assert [(e.kind, e.target) for e in effects] == [("restart-process", "worker")]
    assert effects[0].params == {"why": "stale", "attempt": 1, "watch": "beat",
                                 "reason": "stale: no sign of work in /srv/agent/heartbeat for 99 s (within_s 60)"}
    # restarted at 1001: the new copy has until 1061 to show work, and the sample must be newer than the restart
    restarted = {"worker": [Outcome("x", "restart-process", "acked", 1001.0)]}
    runs = {"worker": ProcessRuns(starts=[ProcessStart(1001.0, True, "survival", "stale", 1, pid=8)])}
    for ts in (1000.5, 1030.0):
        quiet = Snapshot(tick=2, ts=ts + 1, vitals=ALIVE, outcomes=restarted, runs=runs,
                         history={"fresh:beat": sample("beat", ts, 900)})
        assert run(survival.process_watchdog, quiet)[0] == []
    again = Snapshot(tick=3, ts=1064, vitals=ALIVE, outcomes=restarted, runs=runs,
                     history={"fresh:beat": sample("beat", 1063, 900)})
    effects, _ = run(survival.process_watchdog, again)
    assert effects[0].params["attempt"] == 2 and effects[0].params["why"] == "stale"
    # a process that started recently (not by Pulse) is given within_s from its start too
    young = {"process-alive:worker": Vital("process-alive:worker", 999, {"alive": True, "pid": 9, "since": 980.0})}
    assert run(survival.process_watchdog, Snapshot(tick=1, ts=1000, vitals=young, history=stale.history))[0] == []


# -- a real pulsed -----------------------------------------------------------------------------------------

WORKER = r'''
import os, sys, time
beat, idle = sys.argv[1], sys.argv[2]
if os.path.exists(idle):
    os.unlink(idle)                     # a new copy works again
while True:
    if not os.path.exists(idle):        # told to idle: alive, healthy, and doing nothing
        with open(beat, "a"):
            os.utime(beat)
    time.sleep(0.05)
'''
WITHIN_S, INTERVAL_S = 1.5, 0.1
FAST = {"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": str(int(INTERVAL_S * 1000)),
        "PULSE_EXECUTOR_SCAN_INTERVAL_MS": "100"}


def test_a_heartbeat_that_stops_and_a_counter_that_stops_are_noticed_and_the_worker_restarted(
        pulsed, status_url, tmp_path, tracker):
    """A worker that stays alive (and its health probe passing) while its heartbeat file stops
    changing: noticed within within_s plus one watcher interval, notified once, the worker restarted
    (why stale) and the new copy's heartbeat fresh again, said once; a status URL whose JSON counter stops:
    noticed and notified, nothing restarted for it. Status, status --json and /metrics say so."""
    script, beat, idle = tmp_path / "worker.py", tmp_path / "heartbeat", tmp_path / "idle"
    script.write_text(WORKER)
    sent = tmp_path / "notified.jsonl"
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [[process]]
        name = "worker"
        match = "worker.py {beat}"
        restart = [{json.dumps(sys.executable)}, "{script}", "{beat}", "{idle}"]
        health = {{ url = "{status_url.url}", every_s = 0.2, timeout_s = 1 }}

        [[watch.fresh]]
        name = "heartbeat"
        path = "{beat}"
        within_s = {WITHIN_S}
        restart = "worker"

        [[watch.fresh]]
        name = "cron"
        url = "{status_url.url}"
        field = "cron.runs"
        within_s = {WITHIN_S}

        [[notify]]
        kind = "file"
        path = "{sent}"
    """))
    # Working before Pulse watches: a start slower than within_s must not be the staleness this test is about.
    worker = subprocess.Popen([sys.executable, str(script), str(beat), str(idle)], start_new_session=True)
    tracker.add(worker.pid)
    wait_for(beat.exists, 10, what="the first beat")
    pulsed.start(env=FAST)
    first = wait_for(lambda: pulsed.vital("process-alive:worker", lambda d: d["alive"]), 20, what="the worker")["pid"]
    assert first == worker.pid
    wait_for(lambda: {f.name: (f.stale, f.changed_at is not None) for f in pulsed.status().fresh}
             == {"heartbeat": (False, True), "cron": (False, True)}, 20, what="both watches fresh, with work seen")

    idle.write_text("")                         # the worker stays alive; its heartbeat stops
    wait_for(lambda: time.time() - beat.stat().st_mtime > 0.2, 5, what="the heartbeat to stop")
    stopped = beat.stat().st_mtime
    told = wait_for(lambda: notifications(sent, "fresh-watch"), 20, what="the stale heartbeat notified")
    heartbeat = [n for n in told if n["target"] == "heartbeat"]
    assert heartbeat and heartbeat[0]["message"].endswith("; restarting worker"), told
    noticed = min(e["ts"] for e in pulsed.events("effect") if e["data"]["kind"] == "notify" and e["target"] == "heartbeat")
    assert noticed > stopped
    # Within within_s + one watcher interval: the first sample that found it stale is the first one
    # taken after the deadline (none was missed), and its wake made the tick notify at once. (The
    # figures themselves, a loaded host may stretch: the bound on them is loose.)
    samples = [v for v in pulsed.vitals_of("fresh:heartbeat") if v["ts"] > stopped]
    turned = next((i for i, v in enumerate(samples) if v["stale"]), None)
    assert turned, [(v["looked_at"] - stopped, v["stale"]) for v in samples]   # (the first after the last beat is fresh)
    before, after = samples[turned - 1]["looked_at"], samples[turned]["looked_at"]
    assert before < stopped + WITHIN_S <= after <= noticed and after - before < INTERVAL_S + 1.0
    assert noticed - after < 2.0, noticed - after
    restart = wait_for(lambda: [e for e in pulsed.events("effect") if e["data"]["kind"] == "restart-process"
                                and e["data"]["params"].get("why") == "stale"], 20, what="the stale restart")[0]
    assert restart["data"]["params"]["watch"] == "heartbeat"
    assert "no sign of work in " + str(beat) in restart["data"]["params"]["reason"]
    second = wait_for(lambda: pulsed.vital("process-alive:worker", lambda d: d["alive"] and d["pid"] != first), 20,
                      what="the new copy")["pid"]
    tracker.add(second)
    assert worker.wait(5) == -signal.SIGTERM           # the copy that idled was stopped first
    wait_for(lambda: beat.stat().st_mtime > restart["ts"], 10, what="the new copy's heartbeat")
    wait_for(lambda: {f.name: f.stale for f in pulsed.status().fresh}["heartbeat"] is False, 10, what="fresh again")
    wait_for(lambda: [n for n in notifications(sent, "fresh-watch") if n["target"] == "heartbeat:back"], 10,
             what="work seen again, said")
    assert len([n for n in notifications(sent, "fresh-watch") if n["target"] == "heartbeat"]) == 1

    status_url.counting = False                 # the counter stops; the URL still answers
    cron = wait_for(lambda: [n for n in notifications(sent, "fresh-watch") if n["target"] == "cron"], 20,
                    what="the stuck counter notified")[0]
    assert f"{status_url.url} field cron.runs did not change within {WITHIN_S:g} s" in cron["message"]
    assert not cron["message"].endswith("restarting worker")
    wait_for(lambda: {f.name: f.stale for f in pulsed.status().fresh}["cron"], 10, what="status says stale")
    shown = json.loads(pulsed.ctl("status", "--json").stdout)
    assert [f["name"] for f in shown["fresh"]] == ["heartbeat", "cron"]
    cron_view = shown["fresh"][1]
    assert cron_view["stale"] and cron_view["value"] == str(status_url.runs) and cron_view["changed_at"].endswith("Z")
    table = pulsed.ctl("status").stdout
    assert "PROOF OF WORK" in table and "stale" in table, table
    metrics = {(s.name, tuple(s.labels.items())): s.value
               for family in text_string_to_metric_families(scrape(pulsed)) for s in family.samples}
    assert metrics[("pulse_fresh_stale", (("watch", "cron"),))] == 1
    assert metrics[("pulse_fresh_within_seconds", (("watch", "heartbeat"),))] == WITHIN_S
    assert not [e for e in pulsed.events("effect") if e["data"]["kind"] == "restart-process"
                and e["data"]["params"].get("watch") == "cron"]

    # The report: each staleness an issue citing what was said and done about it.
    report = json.loads(pulsed.ctl("report", "--json", "--analyst", "deterministic").stdout)
    issues = {i["text"].split(" went stale")[0]: i for i in report["issues"] if " went stale" in i["text"]}
    assert issues["proof of work heartbeat"]["text"].endswith("1 restart of worker for it; work seen again")
    assert issues["proof of work heartbeat"]["severity"] == "warn"
    assert restart["id"] in issues["proof of work heartbeat"]["event_ids"]
    assert issues["proof of work cron"]["text"].endswith("still stale at the window's end")
    assert issues["proof of work cron"]["severity"] == "error" and report["verdict"] != "pass"
