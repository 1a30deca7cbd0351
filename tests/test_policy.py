"""Restart policy, escalation, no orphans, reload."""

from __future__ import annotations

import os
import signal
import time

import psutil

from support import wait_for

SLOW = {  # every timer at 60 s: anything that still happens fast is event-driven
    "PULSE_HEARTBEAT_MS": "60000", "PULSE_HUNG_AFTER_MS": "120000", "PULSE_READY_TIMEOUT_MS": "60000",
    "PULSE_STOP_GRACE_MS": "60000", "PULSE_RESTART_BACKOFF_BASE_MS": "60000", "PULSE_RESTART_BACKOFF_MAX_MS": "60000",
    "PULSE_HEALTHY_RESET_S": "60", "PULSE_ENGINE_RETRY_AFTER_FAILED_S": "60", "PULSE_INTENSITY_PERIOD_S": "60",
    "PULSE_EXECUTOR_SCAN_INTERVAL_MS": "60000", "PULSE_WATCHER_INTERVAL_MS": "60000", "PULSE_TICK_MS": "60000",
    "PULSE_TICK_MS_MAX": "60000",
}


def test_detection_is_not_a_timer(pulsed):
    status = pulsed.start(env=SLOW).status()
    for w in status.workers:
        killed_at = time.monotonic()
        os.kill(w.pid, signal.SIGKILL)
        # Running means its Ready reached pulsed; the heartbeat period is 60 s, so none is awaited.
        replaced = pulsed.wait_replaced(w.name, w.pid, timeout=1.0, heartbeat=False)
        assert time.monotonic() - killed_at < 1.0, f"{w.name} took too long"
        assert replaced.pid in [e["data"]["pid"] for e in wait_for(
            lambda: pulsed.events("worker-ready", w.name)[1:], 2, what="the ready event")]


def test_backoff_grows_then_engine_fails_while_core_keeps_running(pulsed):
    pulsed.start(env={"PULSE_TEST_INJECT": "engine:crash-before-ready*6", "PULSE_ENGINE_RETRY_AFTER_FAILED_S": "2"},
                 wait=False)
    failed = pulsed.wait_state("engine", "failed", timeout=15)
    status = pulsed.status()
    assert [w.state for w in status.workers if w.name != "engine"] == ["running"] * 3
    assert failed.pid is None and failed.last_exit.code == 1
    delays = [e["data"]["delay_ms"] for e in pulsed.events("worker-restarted", "engine")]
    assert delays == [0, 50, 100, 200, 400]          # immediate, then doubling up to the 400 ms cap
    assert len(pulsed.events("worker-failed", "engine")) == 1
    assert pulsed.ctl("status").returncode == 3
    # The slow retry brings it back by itself (start 7 is healthy).
    pulsed.wait_state("engine", "running", timeout=10)
    assert pulsed.events("worker-restarted", "engine")[-1]["data"]["reason"] == "retry-after-failed"
    assert pulsed.ctl("status").returncode == 0


def test_a_failed_event_writer_waits_its_own_retry_not_the_engines_and_loses_nothing(pulsed):
    pulsed.start(env={"PULSE_TEST_INJECT": "eventlog:crash-before-ready*6", "PULSE_EVENTLOG_RETRY_AFTER_FAILED_S": "1",
                      "PULSE_ENGINE_RETRY_AFTER_FAILED_S": "600"})
    # The writer's events wait in pulsed until its retry (start 7) is up and writes them all.
    retried = wait_for(lambda: [e for e in pulsed.events("worker-restarted", "eventlog", written=False)
                                if e["data"]["reason"] == "retry-after-failed"], 15, what="the writer's retry written")
    assert len(retried) == 1
    assert [e["data"]["retry_in_s"] for e in pulsed.events("worker-failed", "eventlog")] == [1]
    seqs = [e["seq"] for e in pulsed.events() if e["source"] == "pulsed"]
    assert seqs == list(range(1, len(seqs) + 1))
    assert pulsed.proc.poll() is None


def test_pulsectl_restart_revives_a_failed_engine_at_once(pulsed):
    pulsed.start(env={"PULSE_TEST_INJECT": "engine:crash-before-ready*6"}, wait=False)
    pulsed.wait_state("engine", "failed", timeout=15)
    out = pulsed.ctl("restart", "engine")
    assert out.returncode == 0, out.stderr
    assert "engine: running" in out.stdout


def test_core_crash_loop_escalates(pulsed):
    pulsed.start(env={"PULSE_TEST_INJECT": "tick:crash-before-ready*99"}, wait=False)
    assert pulsed.proc.wait(20) == 1
    started = [e["data"]["pid"] for e in pulsed.events("worker-started")]
    assert len(started) >= 10 and any(e["target"] == "forkserver" for e in pulsed.events("worker-started"))
    wait_for(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                             for pid in started), 3, what="nothing left alive")
    assert pulsed.events("worker-failed", "tick")
    stopping = pulsed.events("supervisor-stopping")
    assert stopping and stopping[0]["data"]["exit_code"] == 1
    assert "tick crashed more than 5 times in 60s: stopping everything (exit 1)" in pulsed.log_text()


def test_sigkill_of_pulsed_leaves_nothing_alive(pulsed):
    pulsed.start(env={"PULSE_TEST_INJECT": "watcher:grandchild,executor:grandchild,engine:grandchild"})
    spare = pulsed.wait_spare()
    tree = pulsed.tree()
    assert spare.pid in {p.pid for p in tree}
    names = {open(f"/proc/{p.pid}/comm").read().strip() for p in tree}   # comm: the worker alone, 15 bytes
    assert {f"pulse: {w}"[:15] for w in ("forkserver", "watcher", "tick", "executor", "engine")} <= names
    sleepers = [p for p in tree if p.name() == "sleep"]
    assert len(sleepers) == 3
    pulsed.proc.kill()
    pulsed.proc.wait(5)
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree), 2,
             what="no worker, spare, forkserver or grandchild alive 2 s after SIGKILL of pulsed")


def test_reload_restarts_only_affected_workers(pulsed):
    before = {w.name: w.pid for w in pulsed.start().status().workers}
    config = pulsed.home / "config.toml"
    config.write_text(config.read_text() + "\n# operator edit\n")
    # a fresh config.toml's table headers are comments too: uncomment [timings] with the key
    config.write_text(config.read_text().replace("# [timings]", "[timings]", 1)
                      .replace("# executor_concurrency = 8", "executor_concurrency = 4"))
    pulsed.proc.send_signal(signal.SIGHUP)
    pulsed.wait_replaced("executor", before["executor"])
    after = {w.name: w.pid for w in pulsed.wait_running().workers}
    assert {n: p for n, p in after.items() if n != "executor"} == {n: p for n, p in before.items() if n != "executor"}
    # pulsectl reload with nothing changed restarts nothing
    out = pulsed.ctl("reload")
    assert out.returncode == 0 and out.stdout == "reloaded; nothing to restart, start or stop\n"
    # a broken file is refused, and pulsed keeps running on what it had
    config.write_text(config.read_text() + "\n[timings]\nbogus = 1\n")
    out = pulsed.ctl("reload")
    assert out.returncode == 78 and "config.toml" in out.stderr     # as check-config exits on it
    assert {w.name: w.pid for w in pulsed.wait_running().workers} == after
