"""Percept → Understand → Execute end to end: a critical process dies and comes back; rule memory
survives a killed tick."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from support import wait_for


def victims(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if p.info["cmdline"] and tag in " ".join(p.info["cmdline"]) and "pytest" not in " ".join(p.info["cmdline"]):
            out.append(p)
    return out


@pytest.mark.parametrize("engine_fault", [None, "SIGKILL", "SIGSTOP"])
def test_a_killed_critical_process_is_restarted(pulsed, tracker, engine_fault):
    tag = f"pulse-test-victim-{os.getpid()}-{engine_fault}"
    argv = [sys.executable, "-c", "import time, sys; time.sleep(3600)", tag]
    first = subprocess.Popen(argv, start_new_session=True)
    tracker.add(first.pid)
    pulsed.home.mkdir()
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [[process]]
        name = "victim"
        match = "{tag}"
        restart = {json.dumps(argv)}
    """))
    pulsed.start(env={"PULSE_WATCHER_INTERVAL_MS": "60000", "PULSE_TICK_MS": "60000", "PULSE_TICK_MS_MAX": "60000",
                      "PULSE_HUNG_AFTER_MS": "60000"})
    wait_for(lambda: pulsed.vital("process-alive:victim", lambda d: d.get("alive") and d.get("pid") == first.pid),
             10, what="the watcher watching the victim")
    if engine_fault:
        engine = pulsed.worker("engine").pid
        os.kill(engine, getattr(signal, engine_fault))
    try:
        first.kill()
        first.wait(5)
        new = wait_for(lambda: [p for p in victims(tag) if p.pid != first.pid], 10, what="the victim restarted")
        tracker.add(*[p.pid for p in new])
        restarts = wait_for(lambda: pulsed.events("effect-acked"), 10, what="the restart acked")
        assert [e["data"]["kind"] for e in restarts] == ["restart-process"]
        assert len(new) == 1
        # and the new one is watched in turn
        wait_for(lambda: pulsed.vital("process-alive:victim", lambda d: d.get("alive") and d.get("pid") == new[0].pid),
                 10, what="the watcher watching the new victim")
    finally:
        if engine_fault == "SIGSTOP":
            os.kill(engine, signal.SIGCONT)


def test_rule_memory_survives_a_killed_tick(pulsed, tmp_path):
    notes = tmp_path / "notify.jsonl"
    pulsed.home.mkdir()
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [[process]]
        name = "ghost"
        match = "pulse-test-ghost-that-never-runs-{os.getpid()}"
        restart = ["false"]
        max_restarts = 0                  # never held fatal: the streak goes on, told after process_notify_after

        [[notify]]
        kind = "file"
        path = "{notes}"

        [survival]
        process_notify_after = 3
        process_backoff_base_s = 0.2
        process_backoff_max_s = 0.4
    """))
    pulsed.start(env={"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "100"})

    def failures():
        return [e for e in pulsed.events("effect-failed") if e["data"].get("kind") == "restart-process"]
    wait_for(lambda: len(failures()) >= 2, 15, what="two failed restarts")
    tick = pulsed.worker("tick").pid
    os.kill(tick, signal.SIGKILL)                    # mid-streak
    pulsed.wait_replaced("tick", tick)
    wait_for(lambda: len(failures()) >= 6, 20, what="the streak going on after the tick's restart")

    def notified():
        if not notes.exists():
            return []
        return [json.loads(line) for line in notes.read_text().splitlines()
                if json.loads(line).get("rule") == "process-watchdog"]
    sent = wait_for(notified, 10, what="the notification")
    notify_effects = [e for e in pulsed.events("effect") if e["data"]["kind"] == "notify"]
    assert len(notify_effects) == 1 and len(sent) == 1       # once per streak, across the tick's death
    first_notify = notify_effects[0]["id"]
    assert len([f for f in failures() if f["id"] < first_notify]) == 3   # counted on from before the kill
