"""Out-of-band alerts that survive the outage: a notification every channel refuses is kept and
retried until one takes it, and each channel that took it gets it once, across executor kills.

Real pulsed, a real webhook server on loopback whose answers the test sets (500, then 200), and a
real command channel (a script whose path holds the test's tmp_path) that exits 1 while its flag
file exists.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sys
import textwrap
import threading
import time

import pytest

from pulse.core import client
from pulse.core.wire import doorbells, enginerpc
from pulse.store import effectqueue, eventsdb
from support import init_home, wait_for

FAST_RETRIES = {"PULSE_EFFECT_RETRY_BASE_MS": "200", "PULSE_EFFECT_RETRY_MAX_MS": "800", "PULSE_TICK_MS": "100",
                "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}

# The command channel: the notification on stdin, appended to the out file, unless the flag file says "down".
COMMAND = """
import os, sys
flag, out = sys.argv[1], sys.argv[2]
body = sys.stdin.read()
if os.path.exists(flag):
    print("local channel down", file=sys.stderr)
    sys.exit(1)
with open(out, "a") as f:
    f.write(body)
"""


class Hook:
    """A loopback webhook: answers `status` after `delay_s`; keeps (effect_id, status) of every POST."""

    def __init__(self):
        hook = self
        self.status, self.delay_s, self.answered, self.in_flight = 500, 0.0, [], 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.in_flight += 1
                time.sleep(hook.delay_s)
                status = hook.status
                try:
                    self.send_response(status)
                    self.end_headers()
                finally:
                    hook.in_flight -= 1
                    hook.answered.append((body["effect_id"], status))

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def taken(self, effect_id: str) -> int:
        return sum(1 for eid, status in self.answered if eid == effect_id and status == 200)

    def refused(self, effect_id: str) -> int:
        return sum(1 for eid, status in self.answered if eid == effect_id and status != 200)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


class Local:
    """The command channel's files: down while `flag` exists; what it took, in `out`."""

    def __init__(self, tmp_path):
        self.script = tmp_path / f"notify-local-{tmp_path.name}.py"
        self.script.write_text(COMMAND)
        self.flag, self.out = tmp_path / "local-down", tmp_path / "local.jsonl"
        self.flag.touch()

    def taken(self, effect_id: str) -> int:
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        return sum(1 for line in lines if json.loads(line)["effect_id"] == effect_id)


def configure(pulsed, hook: Hook, local: Local) -> None:
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [[notify]]
        name = "hook"
        kind = "webhook"
        url = "{hook.url}"
        retries = 0
        timeout_s = 2

        [[notify]]
        name = "local"
        kind = "command"
        argv = ["{sys.executable}", "{local.script}", "{local.flag}", "{local.out}"]
    """))


def queue_notification(pulsed, deadline_s: float) -> enginerpc.Effect:
    """A notification as the survival layer queues one: idempotent, with a deadline."""
    conn = eventsdb.open_events(pulsed.home / "events.db")
    try:
        effect = effectqueue.new_effect(enginerpc.Effect(kind="notify", target="gateway", idempotent=True, params={
            "rule": "test", "title": "gateway down", "message": "and the webhook with it"}), "survival", deadline_s)
        effectqueue.commit_effects(conn, [effect], "test")
    finally:
        conn.close()
    client.ring(pulsed.paths, "doorbell", doorbells.Doorbell("test"))
    return effect


def attempts(pulsed, effect_id: str) -> list[dict]:
    """The failed attempts put back in the queue."""
    return [e for e in pulsed.events("effect-failed") if e["data"]["effect_id"] == effect_id and e["data"].get("requeued")]


def ended(pulsed, effect_id: str) -> dict | None:
    conn = eventsdb.open_events(pulsed.home / "events.db")
    try:
        end = eventsdb.effect_end(conn, effect_id)
    finally:
        conn.close()
    return None if end is None else {"type": end.type, **end.data}


def taken_by(pulsed, effect_id: str) -> list[str]:
    return [e["data"]["channel"] for e in pulsed.events("notify") if e["data"]["effect_id"] == effect_id]


def kill_executor(pulsed) -> None:
    pid = pulsed.worker("executor").pid
    os.kill(pid, signal.SIGKILL)
    pulsed.wait_replaced("executor", pid)


def test_a_notification_no_channel_takes_is_kept_past_its_deadline_and_arrives_once(pulsed, tmp_path, hook):
    local = Local(tmp_path)
    configure(pulsed, hook, local)
    hook.delay_s = 1.0                         # a slow refusal: the kill below lands in an attempt
    pulsed.start(env=FAST_RETRIES)
    note = queue_notification(pulsed, deadline_s=1)
    wait_for(lambda: len(attempts(pulsed, note.id)) >= 3 and time.time() > note.deadline + 1, 20,
             what="three refused attempts, past the deadline")
    assert ended(pulsed, note.id) is None                    # kept: neither expired nor failed
    before = len(attempts(pulsed, note.id))
    wait_for(lambda: hook.in_flight, 10, what="an attempt under way")
    kill_executor(pulsed)                                    # in the middle of an attempt
    retried = wait_for(lambda: attempts(pulsed, note.id)[before + 1:], 20, what="the new executor retrying it")
    assert attempts(pulsed, note.id)[before]["data"]["reason"] == "interrupted"   # the orphan, put back
    assert retried[0]["data"]["reason"].startswith("retry later")
    hook.delay_s = 0.0
    assert hook.taken(note.id) == local.taken(note.id) == 0 and taken_by(pulsed, note.id) == []

    hook.status = 200                                        # the webhook is back
    end = wait_for(lambda: ended(pulsed, note.id), 20, what="the notification delivered")
    assert end["type"] == "effect-acked" and end["undelivered"] == ["local"]
    assert end["channels"]["hook"] == "HTTP 200 after 1 attempt(s)"
    assert end["channels"]["local"].startswith("failed: exit code 1") and "local channel down" in end["channels"]["local"]
    assert hook.taken(note.id) == 1 and hook.refused(note.id) >= 4 and taken_by(pulsed, note.id) == ["hook"]
    pulsed.wait_ticks(20)                                    # 2 s, beyond the longest backoff: nothing more comes
    assert hook.taken(note.id) == 1 and local.taken(note.id) == 0


def test_each_channel_gets_it_once_across_an_executor_killed_between_them(pulsed, tmp_path, hook):
    local = Local(tmp_path)
    configure(pulsed, hook, local)
    pulsed.start(env=FAST_RETRIES)
    note = queue_notification(pulsed, deadline_s=600)
    wait_for(lambda: len(attempts(pulsed, note.id)) >= 2, 20, what="two refused attempts")
    hook.status = 200
    wait_for(lambda: taken_by(pulsed, note.id) == ["hook"], 20, what="the webhook taking it")
    kill_executor(pulsed)
    before = len(attempts(pulsed, note.id))
    retried = wait_for(lambda: attempts(pulsed, note.id)[before:], 20, what="the new executor retrying the rest")
    assert retried[0]["data"]["channels"]["hook"].endswith("(taken before)")
    assert ended(pulsed, note.id) is None                    # local has not taken it, and the deadline is ahead

    local.flag.unlink()                                      # the local channel is back
    end = wait_for(lambda: ended(pulsed, note.id), 20, what="the notification delivered everywhere")
    assert end["type"] == "effect-acked" and "undelivered" not in end
    assert hook.taken(note.id) == 1 and local.taken(note.id) == 1
    assert sorted(taken_by(pulsed, note.id)) == ["hook", "local"]
    pulsed.wait_ticks(20)
    assert hook.taken(note.id) == 1 and local.taken(note.id) == 1


def test_notify_test_says_per_channel_what_each_answered(pulsed, tmp_path, hook):
    local = Local(tmp_path)
    configure(pulsed, hook, local)
    with open(pulsed.home / "config.toml", "a") as f:
        f.write(f'\n[[notify]]\nkind = "file"\npath = "{tmp_path / "notes.jsonl"}"\n')
    pulsed.start(env=FAST_RETRIES)
    out = pulsed.ctl("notify", "test", "--wait", "15")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "channels: hook, local, file#2"
    by_channel = {line.split()[0]: line.split(None, 2)[1:] for line in lines[2:5]}
    assert by_channel == {"hook": ["failed", "HTTP 500"], "local": ["failed", by_channel["local"][1]],
                          "file#2": ["ok", "appended"]}
    assert by_channel["local"][1].startswith("exit code 1") and "local channel down" in by_channel["local"][1]
    assert lines[5].endswith(" failed")
    effect_id = lines[1]
    assert ended(pulsed, effect_id)["type"] == "effect-failed" and attempts(pulsed, effect_id) == []   # said once

    hook.status = 200
    local.flag.unlink()
    out = pulsed.ctl("notify", "test", "--wait", "15")
    assert out.returncode == 0, out.stdout + out.stderr
    assert [line.split()[:2] for line in out.stdout.splitlines()[2:5]] == [["hook", "ok"], ["local", "ok"],
                                                                         ["file#2", "ok"]]
