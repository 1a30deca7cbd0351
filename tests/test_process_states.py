"""A guarded process's states and crash loops, through a real pulsed: the newcomer's process that
exits 1 soon after each start backs off, is held `fatal` after max_restarts, is said once with its
output and is not a PASS in the report; restarts of an unhealthy process back off; a SIGSTOPped
process whose probes time out is `unhealthy` and `pulsectl status` exits 5.

Short settings through config.toml keep each test to seconds. The pure state projection is tested
in test_process_state_rules.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from support import init_home, notifications, wait_for

FAST = {"PULSE_TICK_MS": "200", "PULSE_WATCHER_INTERVAL_MS": "100", "PULSE_EXECUTOR_SCAN_INTERVAL_MS": "100"}

pytestmark = pytest.mark.daemon


def restarts(pulsed, name: str) -> list[dict]:
    return [e for e in pulsed.events("effect", written=False)
            if e["data"]["kind"] == "restart-process" and e["target"] == name]


def process(pulsed, name: str):
    return next((p for p in pulsed.status().processes if p.name == name), None)


def status_json(pulsed) -> tuple[int, dict]:
    done = pulsed.ctl("status", "--json")
    return done.returncode, json.loads(done.stdout)


def test_a_crash_loop_backs_off_is_held_fatal_said_once_with_its_output_and_is_no_pass(pulsed, tmp_path):
    script = tmp_path / "crashy.py"     # the newcomer's process: starts, says why, exits 1 a second later
    script.write_text("import sys, time\nprint('listening on :8080', flush=True)\ntime.sleep(1)\n"
                      "print('fatal: bad token in config.yaml line 3', flush=True)\nsys.exit(1)\n")
    sick = tmp_path / "sick.py"         # alive, never healthy: restarted for its probes
    sick.write_text("import time\ntime.sleep(3600)\n")
    notes = tmp_path / "notes.jsonl"
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [[notify]]
        kind = "file"
        path = "{notes}"

        [[process]]
        name = "crashy"
        match = "{script}"
        restart = [{json.dumps(sys.executable)}, "{script}"]
        start_grace_s = 0.3
        min_uptime_s = 10                 # a run is about 1 s (2-3 s on a loaded host): clearly quick
        max_restarts = 3
        restart_window_s = 120
        restart_backoff = {{ base_s = 2, max_s = 4 }}

        [[process]]
        name = "sick"
        match = "{sick}"
        restart = [{json.dumps(sys.executable)}, "{sick}"]
        start_grace_s = 0.1
        health = {{ argv = ["false"], every_s = 0.1, timeout_s = 1, failures = 2 }}
        restart_backoff = {{ base_s = 0.5, max_s = 30 }}
    """))
    pulsed.start(env=FAST)
    # between its quick deaths it waits, and status says until when
    backoff = wait_for(lambda: (p := process(pulsed, "crashy")) and p.state == "backoff" and p.last_exit and p, 20,
                       what="crashy in backoff, its exit recorded")
    assert backoff.until is not None and backoff.last_exit.code == 1 and "starts in a row" in backoff.why
    fatal = wait_for(lambda: (p := process(pulsed, "crashy")) and p.state == "fatal" and p, 30, what="crashy held fatal")
    assert "bad token" in "\n".join(fatal.last_exit.output)
    made = restarts(pulsed, "crashy")
    assert [r["data"]["params"].get("attempt") for r in made] == [1, 2, 3]   # max_restarts starts, then held
    exits = wait_for(lambda: len(e := pulsed.events("process-exited", "crashy", written=False)) >= 3 and e, 10,
                     what="its three exits recorded")
    assert [e["data"]["code"] for e in exits] == [1, 1, 1]
    # after the first quick death at once; after the second, restart_backoff's base_s (2 s) later (an
    # exit is recorded a moment after the death the watcher saw: the keeper reads its last output first)
    assert made[1]["ts"] - exits[0]["ts"] < 2.0 < made[2]["ts"] - exits[1]["ts"] + 1.0, (made, exits)
    code, document = status_json(pulsed)
    assert code == 5, document["exit"]
    assert any("crashy is fatal" in why for why in document["exit"]["why"])
    crashy = next(p for p in document["processes"] if p["name"] == "crashy")
    assert crashy["state"] == "fatal" and crashy["restarts"] == 3 and crashy["last_exit"]["code"] == 1
    told = wait_for(lambda: notifications(notes, "process-fatal"), 10, what="the fatal notification")
    assert "bad token in config.yaml" in told[0]["message"] and told[0]["target"] == "crashy"
    wait_for(lambda: "crashy is crash-looping: held fatal" in pulsed.log_text(), 10, what="it said in pulse.log")
    # held: no start and no second notification over the next ticks
    ticks = len(pulsed.ticks())
    wait_for(lambda: len(pulsed.ticks()) >= ticks + 15, 20, what="15 more ticks")
    assert len(restarts(pulsed, "crashy")) == 3
    assert len(notifications(notes, "process-fatal")) == 1
    report = pulsed.ctl("report", "--since", "10m", "--json")
    analysis = json.loads(report.stdout)
    assert analysis["verdict"] != "pass", analysis
    assert any("crashy crash-looped" in issue["text"] for issue in analysis["issues"])
    # restarts of the unhealthy one back off by the attempts they carry (0.5, 1, 2 s ...), not by the
    # few probes the tick keeps (the old streak forgot restarts older than 20 probes, 2 s here)
    sick_restarts = wait_for(lambda: len(r := restarts(pulsed, "sick")) >= 5 and r[:5], 30, what="5 restarts of sick")
    assert [r["data"]["params"]["why"] for r in sick_restarts[1:]] == ["unhealthy"] * 4
    gaps = [b["ts"] - a["ts"] for a, b in zip(sick_restarts[1:], sick_restarts[2:])]
    assert gaps[-1] >= 2.0 and gaps[-1] > gaps[0] + 1, gaps
    assert process(pulsed, "sick").restarts >= 4          # those that ended (the fifth may still run)
    # leave nothing starting when the test ends: a keeper spawned after teardown's sweep would outlive it
    assert pulsed.ctl("pause", "sick").returncode == 0
    wait_for(lambda: process(pulsed, "sick").state == "paused", 10, what="sick paused")
    wait_for(lambda: not [e for e in pulsed.events("effect", written=False) if e["data"]["kind"] == "restart-process"
                          and e["target"] == "sick" and e["data"]["id"] not in ended_ids(pulsed)], 20,
             what="no restart of sick in flight")


def ended_ids(pulsed) -> set[str]:
    return {e["data"].get("effect_id") for t in ("effect-acked", "effect-failed", "effect-expired")
            for e in pulsed.events(t, written=False)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_frozen_process_is_unhealthy_and_status_exits_5(pulsed, tracker, tmp_path):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    tracker.add(server.pid)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [[process]]
        name = "web1"
        match = "http.server --bind 127.0.0.1 {port}$"
        min_uptime_s = 0
        health = {{ url = "http://127.0.0.1:{port}/", every_s = 0.2, timeout_s = 0.4, failures = 2 }}
    """))
    pulsed.start(env=FAST)
    up = wait_for(lambda: (p := process(pulsed, "web1")) and p.state == "running" and p.health and p.health.ok and p,
                  20, what="web1 running and healthy")
    assert up.uptime_s is not None and up.health.latency_ms is not None
    assert pulsed.ctl("status").returncode == 0
    os.kill(server.pid, signal.SIGSTOP)
    try:
        # two probes of 0.4 s each, 0.2 s apart, and the tick that reads them: well within 10 s
        frozen = wait_for(lambda: (p := process(pulsed, "web1")) and p.state == "unhealthy" and p, 10,
                          what="web1 unhealthy")
        assert frozen.alive and not frozen.health.ok and frozen.health.failing >= 2
        code, document = status_json(pulsed)
        assert code == 5 and any("web1 is unhealthy" in why for why in document["exit"]["why"]), document["exit"]
        assert "web1" in pulsed.ctl("status").stdout and pulsed.ctl("status").returncode == 5
    finally:
        os.kill(server.pid, signal.SIGCONT)
    wait_for(lambda: process(pulsed, "web1").state == "running", 10, what="web1 running again")
    assert pulsed.ctl("status").returncode == 0
