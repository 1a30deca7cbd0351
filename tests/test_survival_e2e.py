"""The survival rules with their faults injected for real: real pulsed, real git, real HTTP on
loopback, real files. Timings shrink through PULSE_* and [survival]."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import subprocess
import textwrap
import threading
import time

import pytest

from support import init_home, notifications, wait_for

FAST_TICK = {"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "100"}


def write_config(pulsed, text: str) -> None:
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(text))


def git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                          timeout=30).stdout.strip()


class Endpoint:
    """A loopback HTTP server whose health the test turns good or bad."""

    def __init__(self):
        endpoint = self
        self.healthy = True

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if endpoint.healthy else 503)
                self.end_headers()

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/health"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    e = Endpoint()
    yield e
    e.close()


class EngineChaos:
    """kill -9 the engine over and over while a test runs: survival must not notice."""

    def __init__(self, pulsed, every_s: float = 0.1):
        self.pulsed, self.every_s = pulsed, every_s
        self.stop = threading.Event()
        self.kills = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(self.every_s):
            try:
                pid = self.pulsed.worker("engine").pid
            except Exception:
                continue
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.kills += 1
                except ProcessLookupError:
                    pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)


CHAOS = pytest.mark.parametrize("chaos", [False, True], ids=["engine-steady", "engine-killed-repeatedly"])


def maybe_chaos(pulsed, chaos: bool):
    return EngineChaos(pulsed) if chaos else contextlib.nullcontext()


@CHAOS
def test_network_watchdog_notifies_once_down_and_once_up_across_a_killed_tick(pulsed, endpoint, tmp_path, chaos):
    notes = tmp_path / "notes.jsonl"
    write_config(pulsed, f"""
        [[watch.network]]
        name = "api"
        url = "{endpoint.url}"
        timeout_s = 1

        [[notify]]
        kind = "file"
        path = "{notes}"
    """)
    # the engine's crash loop must not escalate: its intensity is raised for the chaos run
    pulsed.start(env={**FAST_TICK, "PULSE_INTENSITY_RESTARTS": "1000"})
    wait_for(lambda: pulsed.vital("network:api", lambda d: d["ok"]), 10, what="the target up")
    with maybe_chaos(pulsed, chaos) as killer:
        run_network_scenario(pulsed, endpoint, notes)
    if chaos:
        assert killer.kills >= 2


def run_network_scenario(pulsed, endpoint, notes):
    endpoint.healthy = False
    wait_for(lambda: notifications(notes, "network-watchdog"), 10, what="the down notification")
    tick = pulsed.worker("tick").pid
    os.kill(tick, signal.SIGKILL)                  # it forgets nothing: no second "down"
    pulsed.wait_replaced("tick", tick)
    ticks = len(pulsed.ticks())
    wait_for(lambda: len(pulsed.ticks()) >= ticks + 5, 10, what="five ticks of the new tick, still down")
    assert len(notifications(notes, "network-watchdog")) == 1
    endpoint.healthy = True
    wait_for(lambda: len(notifications(notes, "network-watchdog")) >= 2, 10, what="the up notification")
    sent = notifications(notes, "network-watchdog")
    assert [n["target"] for n in sent] == ["api:down", "api:up"]


@CHAOS
def test_error_escalate_notifies_and_shortens_the_tick(pulsed, tmp_path, chaos):
    log = tmp_path / "app.log"
    log.write_text("starting\n")
    notes = tmp_path / "notes.jsonl"
    write_config(pulsed, f"""
        [[watch.error_log]]
        name = "app"
        path = "{log}"

        [[notify]]
        kind = "file"
        path = "{notes}"

        [survival]
        error_tick_ms = 150
    """)
    pulsed.start(env={"PULSE_TICK_MS": "5000", "PULSE_WATCHER_INTERVAL_MS": "100",
                      "PULSE_INTENSITY_RESTARTS": "1000"})
    wait_for(lambda: pulsed.vital("error-log:app"), 10, what="the log watched")
    with maybe_chaos(pulsed, chaos):
        with log.open("a") as f:
            f.write("ERROR the database went away\n")
        sent = wait_for(lambda: notifications(notes, "error-escalate"), 10, what="the escalation")
        assert sent[0]["target"] == "app" and "ERROR the database went away" in json.dumps(sent[0])
        wait_for(lambda: any(t["data"]["tick_ms"] == 150 for t in pulsed.ticks()), 5, what="a shorter tick")
    assert len(notifications(notes, "error-escalate")) == 1


@CHAOS
def test_llm_watchdog_restarts_the_endpoint(pulsed, endpoint, tmp_path, chaos, tracker):
    """The endpoint's [[process]] is restarted as processWatchdog restarts one: the old copy stopped,
    one new copy started (the restart argv here records itself, then becomes the server again)."""
    marker = tmp_path / "restarted"
    proxy = subprocess.Popen(["sleep", "3600.5151"], start_new_session=True)
    tracker.add(proxy.pid)
    write_config(pulsed, f"""
        [[watch.network]]
        name = "model"
        url = "{endpoint.url}"
        timeout_s = 1

        [[process]]
        name = "proxy"
        match = "^sleep 3600.5151$"
        restart = ["sh", "-c", "touch \\"$0\\"; exec sleep 3600.5151", "{marker}"]

        [survival.llm]
        target = "model"
        process = "proxy"
        fail_after = 3
    """)
    pulsed.start(env={**FAST_TICK, "PULSE_INTENSITY_RESTARTS": "1000"})
    wait_for(lambda: pulsed.vital("network:model", lambda d: d["ok"]), 10, what="the endpoint up")
    assert not marker.exists()
    with maybe_chaos(pulsed, chaos):
        endpoint.healthy = False
        wait_for(marker.exists, 15, what="the endpoint's restart command run")
        new = wait_for(lambda: pulsed.vital("process-alive:proxy", lambda d: d["alive"] and d["pid"] != proxy.pid),
                       10, what="the new copy")
        tracker.add(new["pid"])
    assert proxy.wait(5) == -signal.SIGTERM                  # the old copy was stopped before the new one started
    restarts = [e for e in pulsed.events("effect") if e["data"]["kind"] == "restart-process"]
    assert len(restarts) == 1 and restarts[0]["target"] == "proxy"
    assert restarts[0]["data"]["params"] == {"why": "endpoint-down", "endpoint": "model"}


def test_process_watchdog_leaves_a_paused_process_alone(pulsed, tracker):
    argv = ["sleep", "3600.4242"]
    write_config(pulsed, f"""
        [[process]]
        name = "svc"
        match = "^sleep 3600.4242$"
        restart = {json.dumps(argv)}
    """)
    victim = subprocess.Popen(argv, start_new_session=True)
    tracker.add(victim.pid)
    pulsed.start(env=FAST_TICK)
    wait_for(lambda: pulsed.vital("process-alive:svc", lambda d: d["alive"]), 10, what="watched")
    out = pulsed.ctl("pause", "svc", "--for", "10m")
    assert out.returncode == 0, out.stderr
    wait_for(lambda: pulsed.events("pause"), 5)
    victim.kill()
    victim.wait(5)
    wait_for(lambda: pulsed.vital("process-alive:svc", lambda d: not d["alive"]), 5, what="seen dead")
    ticks = len(pulsed.ticks())
    wait_for(lambda: len(pulsed.ticks()) >= ticks + 5, 10, what="five more ticks")
    assert not [e for e in pulsed.events("effect") if e["data"]["kind"] == "restart-process"]
    assert pulsed.ctl("resume", "svc").returncode == 0
    wait_for(lambda: [e for e in pulsed.events("effect-acked") if e["data"]["kind"] == "restart-process"], 10,
             what="restarted once resumed")
    import psutil
    for p in psutil.process_iter(["cmdline"]):        # the one it started, found by its unique argv
        if p.info["cmdline"] == argv:
            tracker.add(p.pid)


def test_observe_only_runs_nothing(pulsed, tmp_path):
    marker = tmp_path / "ran"
    write_config(pulsed, f"""
        observe_only = true

        [[process]]
        name = "ghost"
        match = "^pulse-observe-ghost-{os.getpid()}$"
        restart = ["touch", "{marker}"]
    """)
    pulsed.start(env=FAST_TICK)
    expired = wait_for(lambda: pulsed.events("effect-expired"), 10, what="a would-be restart")
    assert expired[0]["data"]["reason"] == "observe-only" and expired[0]["data"]["kind"] == "restart-process"
    assert not pulsed.events("effect-executing") and not marker.exists()


RAISES = """
def boom(prev, curr, inner):
    raise RuntimeError("new rule, new bug")
RULES = [boom]
"""


def test_auto_rollback_returns_the_running_engine_to_the_previous_commit(pulsed):
    write_config(pulsed, """
        [survival]
        auto_rollback_errors = 3
    """)
    pulsed.start(env={"PULSE_TICK_MS": "100"})
    before = git(pulsed.home / "engine", "rev-parse", "HEAD")
    (pulsed.home / "staging" / "rules" / "boom.py").write_text(RAISES)
    out = pulsed.ctl("promote")
    assert out.returncode == 0, out.stderr
    rollback = wait_for(lambda: pulsed.events("rollback"), 20, what="the auto rollback")
    assert rollback[0]["data"]["reason"] == "auto-rollback" and rollback[0]["data"]["to"] == before
    head = git(pulsed.home / "engine", "rev-parse", "HEAD")
    assert git(pulsed.home / "engine", "rev-parse", f"{head}^{{tree}}") == \
        git(pulsed.home / "engine", "rev-parse", f"{before}^{{tree}}")
    wait_for(lambda: pulsed.events("worker-ready", "engine")[-1]["data"].get("commit") == head, 10,
             what="the running engine on the rolled-back tree")
    errors = len(pulsed.events("error"))
    assert len(pulsed.events("rollback")) == 1            # once per promote
    assert errors >= 1


def test_panic_rollback_fires_once_per_promote(pulsed):
    write_config(pulsed, f"""
        [[process]]
        name = "ghost"
        match = "^pulse-panic-ghost-{os.getpid()}$"
        restart = ["false"]
        max_restarts = 0                  # never held fatal: panicRollback counts the failures that go on

        [survival]
        panic_failures = 3
        process_backoff_base_s = 0.1
        process_backoff_max_s = 0.2
        auto_rollback_window_s = 600
        auto_rollback_errors = 1000
    """)
    pulsed.start(env=FAST_TICK)
    first_promote_base = git(pulsed.home / "engine", "rev-parse", "HEAD")
    (pulsed.home / "staging" / "rules" / "quiet.py").write_text("RULES = []\n")
    assert pulsed.ctl("promote").returncode == 0
    rollback = wait_for(lambda: pulsed.events("rollback"), 20, what="the panic rollback")
    assert rollback[0]["data"]["reason"] == "panic-rollback" and rollback[0]["data"]["to"] == first_promote_base
    failures = len([e for e in pulsed.events("effect-failed") if e["data"].get("kind") == "restart-process"])
    wait_for(lambda: len([e for e in pulsed.events("effect-failed")
                          if e["data"].get("kind") == "restart-process"]) >= failures + 4, 20,
             what="processWatchdog still retrying on its own")
    assert len(pulsed.events("rollback")) == 1


def test_resource_guard_archives_and_never_touches_events_db(pulsed, tmp_path):
    sessions, archive = tmp_path / "sessions", tmp_path / "archive"
    (sessions / "agent").mkdir(parents=True)
    old = sessions / "agent" / "old.jsonl"
    new = sessions / "agent" / "new.jsonl"
    old.write_text("old session\n")
    new.write_text("new session\n")
    long_ago = time.time() - 7 * 86400
    os.utime(old, (long_ago, long_ago))
    write_config(pulsed, f"""
        [survival]
        memory_pct = 0.01
        archive_from = "{sessions}"
        archive_to = "{archive}"
        archive_age_h = 24
    """)
    pulsed.start(env=FAST_TICK)
    events_before = pulsed.events()
    wait_for(lambda: (archive / "agent" / "old.jsonl").exists(), 15, what="the old session archived")
    assert new.exists() and not old.exists()
    wait_for(lambda: [e for e in pulsed.events("effect-acked") if e["data"]["kind"] == "cleanup"], 10,
             what="the cleanup")
    assert pulsed.events()[:len(events_before)] == events_before     # nothing rewritten or removed
    import sqlite3
    conn = sqlite3.connect(pulsed.home / "events.db")
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs of our own to fill (root only; skipped where mounting is not allowed)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m,mode=0700", "tmpfs", str(mnt)],
                      capture_output=True, timeout=30).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_a_full_disk_frees_its_ballast_and_cleans_up(pulsed, small_disk):
    pulsed.home = small_disk / "home"
    filler = small_disk / "scratch" / "filler.bin"
    filler.parent.mkdir()
    write_config(pulsed, f"""
        [watch]
        disk_path = "{small_disk}"

        [survival]
        disk_pct = 90
        ballast_mb = 4
        cleanup = ["{small_disk}/scratch/*.bin"]
    """)
    pulsed.start(env=FAST_TICK)
    assert (pulsed.home / "ballast").stat().st_size == 4 << 20
    events_before = pulsed.events()
    with open(filler, "wb") as f:                 # fill the disk to the last byte
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    cleaned = wait_for(lambda: [e for e in pulsed.events("effect-acked") if e["data"]["kind"] == "cleanup"], 30,
                       what="the cleanup that frees the disk")
    assert cleaned and not filler.exists()
    assert pulsed.events()[:len(events_before)] == events_before       # nothing stored was lost
    import sqlite3
    for db in ("events.db", "vitals.db"):
        conn = sqlite3.connect(pulsed.home / db)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        conn.close()
    assert pulsed.status() and all(w.state == "running" for w in pulsed.status().workers)


def test_pulse_notifies_about_itself_engine_failed_and_escalation(pulsed, tmp_path):
    notes = tmp_path / "notes.jsonl"
    write_config(pulsed, f"""
        [[notify]]
        kind = "file"
        path = "{notes}"
    """)
    pulsed.start(env={**FAST_TICK, "PULSE_TEST_INJECT": "engine:crash-before-ready*99"}, wait=False)
    pulsed.wait_state("engine", "failed", timeout=15)
    sent = wait_for(lambda: notifications(notes, "engine-failed"), 10, what="the engine-failed notification")
    # Recorded as acked before the stop: an effect still executing when its executor stops runs
    # again under the next one (at least once, by design), and would be sent twice.
    wait_for(lambda: [e for e in pulsed.events("effect-acked") if e["data"]["effect_id"] == sent[0]["effect_id"]],
             10, what="the engine-failed notification acked")
    assert pulsed.terminate() == 0
    pulsed.start(env={**FAST_TICK, "PULSE_TEST_INJECT": "tick:crash-before-ready*99"}, wait=False)
    assert pulsed.proc.wait(20) == 1                      # escalated
    pulsed.start(env=FAST_TICK)                           # what systemd would do
    sent = wait_for(lambda: notifications(notes, "escalation"), 10, what="the escalation notification")
    assert len(sent) == 1 and "tick restart intensity reached" in sent[0]["message"]
    assert len(notifications(notes, "engine-failed")) == 1


def test_notify_test_sends_through_every_channel(pulsed, tmp_path):
    notes = tmp_path / "notes.jsonl"
    write_config(pulsed, f"""
        [[notify]]
        kind = "file"
        path = "{notes}"

        [[notify]]
        kind = "log"
    """)
    pulsed.start()
    out = pulsed.ctl("notify", "test", "--wait", "10")
    assert out.returncode == 0, out.stderr
    assert "acked" in out.stdout
    assert json.loads(notes.read_text().splitlines()[0])["title"] == "Pulse test notification"
    wait_for(lambda: "Pulse test notification" in pulsed.log_text(), 5, what="the log channel")


def test_a_notification_that_cannot_get_out_waits_and_is_retried(pulsed, tmp_path):
    """The network is down when the notification is due: it stays queued and goes out later."""
    received = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    port = server.server_address[1]
    server.server_close()                       # nothing listens yet: the webhook is "down"
    write_config(pulsed, f"""
        [[notify]]
        kind = "webhook"
        url = "http://127.0.0.1:{port}/hook"
        retries = 0
        timeout_s = 1
    """)
    pulsed.start()
    from pulse.core.wire import enginerpc
    from pulse.store import effectqueue, eventsdb
    conn = eventsdb.open_events(pulsed.home / "events.db")
    effect = effectqueue.new_effect(enginerpc.Effect(kind="notify", target="t", idempotent=True,
                                          params={"title": "late", "message": "but not lost"}), "survival", 600)
    effectqueue.commit_effects(conn, [effect], "test")
    wait_for(lambda: [e for e in pulsed.events("effect-failed") if e["data"].get("requeued")], 15,
             what="a failed attempt, requeued")
    assert effectqueue.effect_state(conn, effect.id) in ("pending", "executing")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Hook)   # the network is back
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wait_for(lambda: effectqueue.effect_state(conn, effect.id) == "acked", 30, what="the notification delivered")
        assert received and received[0]["title"] == "late"
    finally:
        server.shutdown()
        server.server_close()
