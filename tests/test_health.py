"""Health, not only liveness (issue 12): `[[process]] health` probes into `health:<name>`, and
processWatchdog restarts a live but unhealthy process after `failures` failed probes, not before;
`restart_exit_codes`: a process Pulse started that exits with one is restarted at once, no crash.

Real pulsed, a loopback HTTP server the test turns unhealthy, real detached processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from support import init_home, wait_for
from test_survival_e2e import Endpoint

from pulse.core import config
from pulse.core.config import ConfigError

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
    import sqlite3
    conn = sqlite3.connect(f"file:{pulsed.home / 'vitals.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT ts, data FROM vitals WHERE key = ? ORDER BY ts", (f"health:{name}",)).fetchall()
    finally:
        conn.close()
    return [{"ts": ts, **json.loads(data)} for ts, data in rows]


def test_an_unhealthy_process_is_restarted_after_failures_probes_and_not_before(pulsed, endpoint, tmp_path, tracker):
    victim = subprocess.Popen(["sleep", "3600.1717"], start_new_session=True)
    tracker.add(victim.pid)
    marker = tmp_path / "restarted"
    healer = tmp_path / "heal.py"       # the "restart": records itself; the test decides what it fixes
    healer.write_text("import sys, time\nopen(sys.argv[1], 'a').write(str(time.time()) + '\\n')\n")
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
    assert victim.poll() is None                                            # ... and it was alive all along
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


def test_restart_exit_codes_restart_at_once_without_counting_a_crash(pulsed, tmp_path, tracker):
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
    """)
    pulsed.start(env=FAST)
    # Not running: processWatchdog starts it (after the exit-code grace: it may have asked).
    first = wait_for(lambda: starts(), 20, what="the gateway started")[0]
    tracker.add(first["pid"])
    wait_for(lambda: pulsed.vital("process-alive:hermes", lambda d: d["alive"] and d["pid"] == first["pid"]), 10)
    wait_for(lambda: [e for e in pulsed.events("effect-acked") if e["data"].get("detached")], 10,
             what="its start acked as a daemon")          # so the exit below comes to the executor's reaper
    stop.write_text("75")
    second = wait_for(lambda: starts()[1:], 10, what="the gateway restarted")[0]
    tracker.add(second["pid"])
    asked = [e for e in restarts(pulsed, "hermes") if e["data"]["params"].get("why") == "exit-code"]
    assert len(asked) == 1 and asked[0]["data"]["params"]["code"] == 75
    assert asked[0]["data"]["params"]["pid"] == first["pid"]
    # Seen dead by the watcher too, yet restarted once only, and no crash counted or notified.
    wait_for(lambda: pulsed.vital("process-alive:hermes", lambda d: d["alive"] and d["pid"] == second["pid"]), 10)
    pulsed.wait_ticks(10)
    assert len(starts()) == 2 and len(restarts(pulsed, "hermes")) == 2
    assert not [e for e in pulsed.events("effect") if e["data"]["kind"] == "notify"
                and e["data"]["params"].get("rule") == "process-watchdog"]
    # Another exit code is a death like any other: processWatchdog restarts it, not the executor.
    stop.write_text("3")
    third = wait_for(lambda: starts()[2:], 20, what="restarted after exit 3")[0]
    tracker.add(third["pid"])
    assert [e["data"]["params"].get("why") for e in restarts(pulsed, "hermes")] == ["dead", "exit-code", "dead"]


@pytest.mark.parametrize("table, where", [
    ('health = { every_s = 1 }', "$.process[0].health: set exactly one of url or argv"),
    ('health = { url = "ftp://x" }', "$.process[0].health.url: not an http"),
    ('health = { url = "http://127.0.0.1:1/", failures = 0 }', "$.process[0].health.failures must lie within"),
    ('health = { argv = [] }', "$.process[0].health.argv: an argv list needs at least the program"),
    ('health = { url = "http://127.0.0.1:1/", every = 3 }', "unknown key $.process[0].health.every"),
    ('restart_exit_codes = [0]', "$.process[0].restart_exit_codes[0]: an exit code lies within 1 … 255"),
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
        health = {{ url = "{endpoint.url}", every_s = 0.2, timeout_s = 1, failures = 2 }}

        [survival]
        process_backoff_base_s = 0.2
    """)
    pulsed.start(env=FAST)
    created = wait_for(lambda: pulsed.events("task-created"), 30, what="a task for the agents")
    assert len(restarts(pulsed, "openclaw-gateway")) >= 2
    assert created[0]["data"]["project"] == "openclaw" and "503" in created[0]["data"]["prompt"]
    added = [e for e in pulsed.events("effect") if e["data"]["kind"] == "task-add"]
    assert added[0]["data"]["origin"] == "engine"
    n = len(restarts(pulsed, "openclaw-gateway"))
    wait_for(lambda: len(restarts(pulsed, "openclaw-gateway")) >= n + 2, 20, what="more restarts")
    assert len(pulsed.events("task-created")) == 1                 # one task per unhealthy streak
