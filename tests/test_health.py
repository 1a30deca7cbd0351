"""Health, not only liveness: `[[process]] health` probes into `health:<name>`, and
processWatchdog restarts a live but unhealthy process after `failures` failed probes, not before;
`restart_exit_codes` / `stop_exit_codes`, from the keeper's process-exited facts; a restart stops
what is there first.

Real pulsed, a loopback HTTP server the test turns unhealthy, real detached processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import psutil
import pytest
from test_survival_e2e import Endpoint

from pulse.core import config
from pulse.core.config import ConfigError
from support import CHROMIUM, browser_or_skip, init_home, wait_for

FAST = {"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "100", "PULSE_EXECUTOR_SCAN_INTERVAL_MS": "100"}


@pytest.fixture
def endpoint():
    e = Endpoint()
    yield e
    e.close()


def write_config(pulsed, text: str) -> None:
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(text))


def restarts(pulsed, name: str) -> list[dict]:
    return [e for e in pulsed.events("effect") if e["data"]["kind"] == "restart-process" and e["target"] == name]


def probes(pulsed, name: str) -> list[dict]:
    """Every health:<name> sample, oldest first, from vitals.db."""
    return pulsed.vitals_of(f"health:{name}")


def test_an_unhealthy_process_is_restarted_after_failures_probes_and_not_before(pulsed, endpoint, tmp_path, tracker):
    victim = subprocess.Popen(["sleep", "3600.1717"], start_new_session=True)
    tracker.add(victim.pid)
    marker = tmp_path / "restarted"
    healer = tmp_path / "heal.py"       # the "restart": records itself, then becomes the process again
    healer.write_text("import os, sys, time\nopen(sys.argv[1], 'a').write(str(time.time()) + '\\n')\n"
                      "os.execvp('sleep', ['sleep', '3600.1717'])\n")
    write_config(pulsed, f"""
        [[process]]
        name = "gw"
        match = "^sleep 3600.1717$"
        restart = [{json.dumps(sys.executable)}, "{healer}", "{marker}"]
        health = {{ url = "{endpoint.url}", every_s = 0.3, timeout_s = 1, failures = 3 }}
    """)
    pulsed.start(env=FAST)
    wait_for(lambda: len([p for p in probes(pulsed, "gw") if p["ok"]]) >= 2, 15, what="healthy probes")
    assert not restarts(pulsed, "gw")
    endpoint.healthy = False
    first = wait_for(lambda: restarts(pulsed, "gw"), 20, what="a restart of the unhealthy process")[0]
    wait_for(marker.exists, 10, what="the restart argv ran")
    assert first["data"]["params"]["why"] == "unhealthy"
    failed_before = [p for p in probes(pulsed, "gw") if not p["ok"] and p["ts"] < first["ts"]]
    assert len(failed_before) >= 3, failed_before                           # not before `failures` ...
    assert all(p["status"] == 503 for p in failed_before)
    # ... and it was alive all along, until the restart stopped it (SIGTERM) before starting another
    assert victim.wait(5) == -signal.SIGTERM
    again = wait_for(lambda: pulsed.vital("process-alive:gw", lambda d: d["alive"] and d["pid"] != victim.pid),
                     10, what="the new copy")
    tracker.add(again["pid"])
    # Healthy again after the restart: no second restart.
    endpoint.healthy = True
    wait_for(lambda: any(p["ok"] and p["ts"] > first["ts"] for p in probes(pulsed, "gw")), 10, what="healthy")
    n = len(probes(pulsed, "gw"))
    wait_for(lambda: len(probes(pulsed, "gw")) >= n + 5, 10, what="more probes")
    assert len(restarts(pulsed, "gw")) == 1
    # Unhealthy again: the count starts over from the restart, so the second restart also waits for 3.
    endpoint.healthy = False
    second = wait_for(lambda: restarts(pulsed, "gw")[1:], 20, what="a second restart")[0]
    since = [p for p in probes(pulsed, "gw") if first["ts"] < p["ts"] < second["ts"]]
    assert [p["ok"] for p in since][-3:] == [False, False, False]


def test_a_health_argv_is_a_verdict_by_exit_code(pulsed, tmp_path, tracker):
    victim = subprocess.Popen(["sleep", "3600.1818"], start_new_session=True)
    tracker.add(victim.pid)
    verdict = tmp_path / "verdict"
    verdict.write_text("0")
    write_config(pulsed, f"""
        [[process]]
        name = "gw"
        match = "^sleep 3600.1818$"
        restart = ["true"]
        health = {{ argv = ["sh", "-c", "echo probing; exit $(cat {verdict})"], every_s = 0.3, failures = 2 }}
    """)
    pulsed.start(env=FAST)
    ok = wait_for(lambda: [p for p in probes(pulsed, "gw") if p["ok"]], 15, what="a healthy probe")[0]
    assert ok["code"] == 0 and "probing" in ok["output"]
    verdict.write_text("4")
    first = wait_for(lambda: restarts(pulsed, "gw"), 20, what="a restart")[0]
    bad = [p for p in probes(pulsed, "gw") if not p["ok"] and p["ts"] < first["ts"]]
    assert len(bad) >= 2 and bad[-1]["code"] == 4 and bad[-1]["error"] == "exit code 4"


GATEWAY = r'''
import json, os, sys, time
log, stop = sys.argv[1], sys.argv[2]
with open(log, "a") as f:
    f.write(json.dumps({"pid": os.getpid()}) + "\n")
while True:
    if os.path.exists(stop):
        code = int(open(stop).read())
        os.unlink(stop)
        sys.exit(code)
    time.sleep(0.05)
'''


def test_exit_codes_are_facts_honoured_across_executor_restarts(pulsed, tmp_path, tracker):
    """restart_exit_codes and stop_exit_codes come from the keeper's process-exited fact, so they
    hold whichever executor started the process; a kill -9 is a crash, restarted at once."""
    gateway = tmp_path / "gateway.py"
    gateway.write_text(GATEWAY)
    log, stop = tmp_path / "gateway.log", tmp_path / "stop"
    starts = lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    write_config(pulsed, f"""
        [[process]]
        name = "hermes"
        match = "gateway.py {log}"
        restart = [{json.dumps(sys.executable)}, "{gateway}", "{log}", "{stop}"]
        restart_exit_codes = [75]
        stop_exit_codes = [78]
    """)
    pulsed.start(env=FAST)

    def started(n: int) -> int:
        pid = wait_for(lambda: starts()[n:], 20, what=f"start number {n + 1}")[0]["pid"]
        tracker.add(pid)
        wait_for(lambda: pulsed.vital("process-alive:hermes", lambda d: d["alive"] and d["pid"] == pid), 10)
        wait_for(lambda: [e for e in pulsed.events("effect-acked") if e["data"].get("pid") == pid], 10,
                 what="its restart acked")        # past the restart's grace: a death now is a death, not a failed start
        return pid

    first = started(0)                  # not running: processWatchdog starts it
    stop.write_text("75")
    second = started(1)
    asked = restarts(pulsed, "hermes")[-1]["data"]["params"]
    assert asked == {"why": "exit-code", "code": 75, "pid": first}
    exits = pulsed.events("process-exited", "hermes")
    assert exits[-1]["data"]["pid"] == first and exits[-1]["data"]["code"] == 75 and exits[-1]["source"] == "keeper"
    # the keeper's wake reached the tick: it decided on the fact, not after EXIT_FACT_WAIT_S without it
    assert restarts(pulsed, "hermes")[-1]["ts"] - exits[-1]["ts"] < 1.0

    # The executor that started it dies; the process lives on, and its next 75 is still a 75.
    executor = pulsed.worker("executor").pid
    os.kill(executor, signal.SIGKILL)
    pulsed.wait_replaced("executor", executor)
    stop.write_text("75")
    third = started(2)
    assert restarts(pulsed, "hermes")[-1]["data"]["params"] == {"why": "exit-code", "code": 75, "pid": second}

    # kill -9: a crash, restarted at once (its keeper says SIGKILL), counted as a death.
    killed_at = time.time()
    os.kill(third, signal.SIGKILL)
    started(3)
    crash = restarts(pulsed, "hermes")[-1]
    # (its start, asked by its exit 75, died within min_uptime_s: a first failed start, restarted at once)
    assert crash["data"]["params"] == {"why": "dead", "attempt": 2, "signal": "SIGKILL", "pid": third}
    assert crash["ts"] - killed_at < 1.5
    assert not [e for e in pulsed.events("effect") if e["data"]["kind"] == "notify"]

    # 78: "do not restart me". Left down, said once, with its last words.
    before = len(restarts(pulsed, "hermes"))
    stop.write_text("78")
    told = wait_for(lambda: [e for e in pulsed.events("effect") if e["data"]["kind"] == "notify"], 10,
                    what="the notification")
    assert "stop_exit_codes" in told[0]["data"]["params"]["message"]
    pulsed.wait_ticks(10)
    after = restarts(pulsed, "hermes")[before:]
    # (once, at a load of 5-6, a restart followed the 78: what it was for, and when the exit was known)
    seen = pulsed.events("process-exited", "hermes") + after
    timeline = [(round(e["ts"] - told[0]["ts"], 3), e["type"], e["data"].get("params") or
                 {k: e["data"].get(k) for k in ("pid", "code", "signal")}) for e in sorted(seen, key=lambda e: e["ts"])]
    assert not after and len(starts()) == 4, timeline


def test_a_restart_stops_what_is_there_first_even_frozen(pulsed, tmp_path, tracker):
    """SIGSTOP the process: found unhealthy, the frozen copy is stopped (SIGTERM+SIGCONT, then SIGKILL
    after stop_timeout_s), then one new copy starts; its output is kept, and a start that fails
    names the process's own words."""
    server = tmp_path / "server.py"
    server.write_text(textwrap.dedent(r'''
        import http.server, os, signal, sys
        if os.path.exists(sys.argv[2]):
            print("config is broken: " + open(sys.argv[2]).read(), flush=True)
            sys.exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)          # a stubborn one: only SIGKILL ends it
        print("listening", flush=True)
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
    '''))
    import socket
    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        port = s_.getsockname()[1]
    broken = tmp_path / "broken"
    write_config(pulsed, f"""
        [[process]]
        name = "gw"
        match = "server.py {port}"
        restart = [{json.dumps(sys.executable)}, "{server}", "{port}", "{broken}"]
        stop_timeout_s = 0.5
        health = {{ url = "http://127.0.0.1:{port}/", every_s = 0.2, timeout_s = 0.5, failures = 2 }}
    """)
    pulsed.start(env=FAST)
    copies = lambda: [p for p in psutil.process_iter(["cmdline"]) if f"server.py {port}" in " ".join(p.info["cmdline"] or [])
                      and not (p.info["cmdline"] or [""])[0].startswith("pulse:")]
    first = wait_for(lambda: pulsed.vital("process-alive:gw", lambda d: d["alive"]), 20, what="started")["pid"]
    tracker.add(first)
    wait_for(lambda: [p for p in probes(pulsed, "gw") if p["ok"]], 10, what="healthy")
    n = len(restarts(pulsed, "gw"))
    os.kill(first, signal.SIGSTOP)
    second = wait_for(lambda: pulsed.vital("process-alive:gw", lambda d: d["alive"] and d["pid"] != first), 20,
                      what="a new copy")["pid"]
    tracker.add(second)
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    assert [p.pid for p in copies()] == [second]
    acked = wait_for(lambda: [e for e in pulsed.events("effect-acked") if e["data"].get("kind") == "restart-process"
                              and e["data"].get("stopped") == [first]], 10, what="the restart's outcome")[0]
    assert acked["data"]["killed"] == [first] and acked["data"]["pid"] == second
    assert len(restarts(pulsed, "gw")) == n + 1
    assert "listening" in (pulsed.home / "logs" / "process-gw.log").read_text()

    # A start that fails: the reason is the process's own last words.
    broken.write_text("no port given")
    os.kill(second, signal.SIGKILL)
    failed = wait_for(lambda: [e for e in pulsed.events("effect-failed") if e["data"].get("kind") == "restart-process"],
                      20, what="a failed restart")[0]
    assert "exit code 1: config is broken: no port given" in failed["data"]["error"]


@pytest.mark.parametrize("table, where", [
    ('health = { every_s = 1 }', "$.process[0].health: set exactly one of url or argv"),
    ('health = { url = "ftp://x" }', "$.process[0].health.url: not an http"),
    ('health = { url = "http://127.0.0.1:1/", failures = 0 }', "$.process[0].health.failures must lie within"),
    ('health = { argv = [] }', "$.process[0].health.argv: an argv list needs at least the program"),
    ('health = { url = "http://127.0.0.1:1/", every = 3 }', "unknown key $.process[0].health.every"),
    ('restart_exit_codes = [0]', "$.process[0].restart_exit_codes[0] must lie within 1 … 255, got 0"),
    ('stop_exit_codes = [78]\nrestart_exit_codes = [78]', "$.process[0]: exit code 78 is in both"),
    ('pidfile = { path = "/x", keyy = "pid" }', "unknown key $.process[0].pidfile.keyy"),
    ('health = { url = "http://127.0.0.1:1/", start_period_s = -1 }', "start_period_s must be at least 0"),
])
def test_health_config_errors_name_the_key(tmp_path, table, where):
    path = tmp_path / "config.toml"
    path.write_text(f'[[process]]\nname = "gw"\nmatch = "gw"\n{table}\n')
    with pytest.raises(ConfigError) as err:
        config.load(path, {})
    assert where in str(err.value)


def test_the_templates_openclaw_rule_hands_the_gateway_to_an_agent_when_restarts_do_not_help(
        pulsed, endpoint, tracker):
    victim = subprocess.Popen(["sleep", "3600.1919"], start_new_session=True)
    tracker.add(victim.pid)
    endpoint.healthy = False
    write_config(pulsed, f"""
        [[process]]
        name = "openclaw-gateway"
        match = "^sleep 3600.1919$"
        restart = ["true"]
        health = {{ url = "{endpoint.url}", every_s = 0.2, timeout_s = 1, failures = 2, start_period_s = 0.5 }}
        max_restarts = 0        # its restart exits at once: a crash loop, which must not hold it here

        [survival]
        process_backoff_base_s = 0.2
    """)
    # The rule's START_PERIOD_S is kept equal to health.start_period_s, as its docstring says.
    rule = pulsed.home / "engine" / "rules" / "openclaw.py"
    text = rule.read_text()
    assert "\nSTART_PERIOD_S = 15.0 " in text
    rule.write_text(text.replace("\nSTART_PERIOD_S = 15.0 ", "\nSTART_PERIOD_S = 0.5 "))
    pulsed.start(env=FAST)
    created = wait_for(lambda: pulsed.events("task-created"), 30, what="a task for the agents")
    assert len(restarts(pulsed, "openclaw-gateway")) >= 2
    assert created[0]["data"]["project"] == "openclaw" and "503" in created[0]["data"]["prompt"]
    added = [e for e in pulsed.events("effect") if e["data"]["kind"] == "task-add"]
    assert added[0]["data"]["origin"] == "engine"
    n = len(restarts(pulsed, "openclaw-gateway"))
    wait_for(lambda: len(restarts(pulsed, "openclaw-gateway")) >= n + 2, 20, what="more restarts")
    assert len(pulsed.events("task-created")) == 1                 # one task per unhealthy streak


def test_a_health_endpoint_slowed_past_max_latency_ms_is_restarted_with_the_figures(pulsed, tmp_path, tracker):
    """It still answers 200, only slower than max_latency_ms: each such probe failed, saying its latency
    and the bound, and after `failures` of them the process is restarted with that reason. The probes'
    latency is a vital, which the overview charts beside the process's health (on a phone too)."""
    from test_fresh import Status
    slow = Status()
    victim = subprocess.Popen(["sleep", "3600.2121"], start_new_session=True)
    tracker.add(victim.pid)
    try:
        write_config(pulsed, f"""
            [web]
            enabled = true
            listen = "127.0.0.1:0"

            [[process]]
            name = "gw"
            match = "^sleep 3600.2121$"
            restart = ["sleep", "3600.2121"]
            health = {{ url = "{slow.url}", every_s = 0.2, timeout_s = 2, failures = 2, max_latency_ms = 300 }}
        """)
        pulsed.start(env=FAST)
        wait_for(lambda: len([p for p in probes(pulsed, "gw") if p["ok"]]) >= 2, 15, what="quick healthy probes")
        assert not restarts(pulsed, "gw")
        slow.delay = 0.5
        first = wait_for(lambda: restarts(pulsed, "gw"), 20, what="a restart of the slow process")[0]
        params = first["data"]["params"]
        assert params["why"] == "unhealthy" and params["reason"].startswith("health: answered in ")
        assert params["reason"].endswith(" ms, over max_latency_ms 300"), params
        failed = [p for p in probes(pulsed, "gw") if not p["ok"] and p["ts"] < first["ts"]]
        assert len(failed) >= 2 and all(p["status"] == 200 and p["slow"] and p["latency_ms"] >= 500 for p in failed)
        assert victim.wait(5) == -signal.SIGTERM
        tracker.add(wait_for(lambda: pulsed.vital("process-alive:gw", lambda d: d["alive"] and d["pid"] != victim.pid),
                             10, what="the new copy")["pid"])
        # the overview carries the probes' latency as a series (the page draws it beside the health)
        url = wait_for(lambda: pulsed.ctl("web", "url").stdout.strip(), 10, what="pulsectl web url")
        base, _, token = url.partition("/?token=")
        request = urllib.request.Request(base + "/", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            html = response.read().decode()
        first_state = json.loads(html.split('<script type="application/json" id="first">')[1].split("</script>")[0])
        series = first_state["processes"]["gw"]["latency"]
        assert series and max(value for _, value in series) >= 500, series
        # ... and draws it, on a phone, without running off the screen
        from test_web import LAUNCH, OVERFLOW
        with browser_or_skip()() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH)
            try:
                tab = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
                tab.goto(url)
                tab.wait_for_selector('[data-process="gw"] [data-field="health"] polyline', state="attached",
                                      timeout=20_000)
                assert tab.evaluate(OVERFLOW) == []
                tab.screenshot(path=str(tmp_path / "overview-phone-latency.png"), full_page=True)
            finally:
                browser.close()
    finally:
        slow.close()
