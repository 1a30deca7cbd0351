"""The executor (DESIGN §4, §7 "Effects", "Writes"): claims, timeouts, orphans, expiry, the allow-list,
the built-in executors, the engine's executors, and exactly-once under kill -9 and a racing claimer.

Effects are committed straight into the home's events.db with pulse.store.effectqueue (as the tick does), and the
doorbell is rung like the tick rings it.
"""

from __future__ import annotations

import collections
import http.server
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import zmq

from pulse.core.config import Allow, Config
from pulse.core.wire import codec, doorbells, enginerpc
from pulse.core.wire.eventmsgs import EFFECT_END_EVENTS
from pulse.effects import kinds, registry
from pulse.store import effectqueue, eventsdb, objects
from pulse.store.provision import ensure_home
from pulse.workers.executor import boot_id, claimer_alive, claimer_id
from support import wait_for

TERMINAL_TYPES = tuple(EFFECT_END_EVENTS.values())
PY = sys.executable


# -- helpers -----------------------------------------------------------------------------------------

def effect(kind: str, target: str | None = None, idempotent: bool = False, **params) -> enginerpc.Effect:
    return enginerpc.Effect(kind=kind, target=target, params=params, idempotent=idempotent, id=uuid.uuid4().hex)


def commit(home: Path, *effects: enginerpc.Effect, origin: str = "operator", deadline_s: float = 60,
           now: float | None = None) -> list[enginerpc.Effect]:
    conn = eventsdb.open_events(home / "events.db")
    try:
        return effectqueue.commit_effects(conn, [effectqueue.new_effect(e, origin, deadline_s, now) for e in effects], "test")
    finally:
        conn.close()


def ring(pulsed, *frames: bytes) -> None:
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(pulsed.paths.endpoint("doorbell"))
    for frame in frames or (codec.encode(doorbells.Doorbell("test")),):
        push.send(frame)
    push.close()


def submit(pulsed, *effects: enginerpc.Effect, **kw) -> list[enginerpc.Effect]:
    committed = commit(pulsed.home, *effects, **kw)
    ring(pulsed)
    return committed


def ending(pulsed, effect_id: str) -> dict | None:
    """The effect's terminal event (a requeue is not one), or None."""
    return next((e for e in pulsed.events() if e["type"] in TERMINAL_TYPES
                 and e["data"].get("effect_id") == effect_id and not e["data"].get("requeued")), None)


def executor_has_looked(pulsed) -> None:
    """A noop submitted now and ended: the executor has scanned and dispatched since. For
    "nothing happened" checks, instead of a sleep."""
    probe, = submit(pulsed, effect("noop"))
    wait_end(pulsed, probe.id)


def wait_end(pulsed, effect_id: str, timeout: float = 10) -> dict:
    return wait_for(lambda: ending(pulsed, effect_id), timeout, interval=0.02, what=f"effect {effect_id} to end")


def history(pulsed, effect_id: str) -> list[str]:
    return [e["type"] + ("(requeued)" if e["data"].get("requeued") else "")
            for e in pulsed.events() if e["data"].get("effect_id") == effect_id or
            (e["type"] == "effect" and e["data"].get("id") == effect_id)]


def write_config(pulsed, text: str) -> None:
    pulsed.home.mkdir(exist_ok=True)
    (pulsed.home / "config.toml").write_text(text)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- pure parts --------------------------------------------------------------------------------------

CONFIGURED = {"gw"}


@pytest.mark.parametrize("origin, kind, target, params, allow, refused", [
    ("survival", "exec", None, {"argv": ["rm", "-rf", "/tmp/x"]}, Allow(), None),        # trusted
    ("operator", "signal", "anything", {"signal": "SIGKILL"}, Allow(), None),            # trusted
    ("engine", "exec", None, {"argv": ["rm", "-rf", "/tmp/x"]}, Allow(), "kind 'exec' is not in allow.kinds"),
    ("engine", "exec", None, {"argv": ["rm", "x"]}, Allow(kinds=["exec"]), "matches no allow.exec_argv prefix"),
    ("agent", "exec", None, {"argv": ["systemctl", "restart", "gw"]},
     Allow(kinds=["exec"], exec_argv=[["systemctl", "restart"]]), None),
    ("agent", "exec", None, {"argv": ["systemctl"]},
     Allow(kinds=["exec"], exec_argv=[["systemctl", "restart"]]), "matches no allow.exec_argv prefix"),
    ("agent", "exec", None, {"argv": ["systemctl", "restart", "gw"], "env": {"LD_PRELOAD": "/tmp/evil.so"}},
     Allow(kinds=["exec"], exec_argv=[["systemctl", "restart"]]), "env and cwd need allow.any_exec"),
    ("agent", "exec", None, {"argv": ["anything"]}, Allow(kinds=["exec"], exec_argv=[[]]),
     "matches no allow.exec_argv prefix"),                                               # an empty prefix is no prefix
    ("engine", "exec", None, {"argv": ["anything"], "cwd": "/"}, Allow(kinds=["exec"], any_exec=True), None),
    ("engine", "signal", "gw", {"signal": "SIGHUP"}, Allow(), None),
    ("engine", "signal", "sshd", {"signal": "SIGHUP"}, Allow(), "'sshd' is not a configured [[process]]"),
    ("engine", "signal", "gw", {"signal": "SIGKILL"}, Allow(), "signal 'SIGKILL' is not in allow.signals"),
    ("agent", "restart-process", "nope", {}, Allow(), "'nope' is not a configured [[process]]"),
    ("agent", "noop", None, {}, Allow(kinds=[]), "kind 'noop' is not in allow.kinds"),
    ("engine", "my-engine-kind", None, {}, Allow(kinds=[]), "not-allowed: kind 'my-engine-kind' is not in allow.kinds"),
    ("engine", "my-engine-kind", None, {}, Allow(kinds=["my-engine-kind"]), None),   # listed: it runs
])
def test_allow_list(origin, kind, target, params, allow, refused):
    e = enginerpc.Effect(kind=kind, target=target, params=params, origin=origin)
    why = registry.refusal(e, allow, CONFIGURED)
    if refused is None:
        assert why is None
    else:
        assert why.startswith("not-allowed: ") and refused in why


def test_outside_pulse_under_systemd_only():
    argv = ["sleep", "300"]
    assert kinds.outside_pulse(argv, "u", {}, "/usr/bin/systemd-run", 0) == argv
    assert kinds.outside_pulse(argv, "u", {"INVOCATION_ID": "x"}, None, 0) == argv
    assert kinds.outside_pulse(argv, "u", {"INVOCATION_ID": "x"}, "/usr/bin/systemd-run", 0) == [
        "/usr/bin/systemd-run", "--scope", "--collect", "--quiet", "--unit=u", "--", "sleep", "300"]
    assert kinds.outside_pulse(argv, "u", {"INVOCATION_ID": "x"}, "/usr/bin/systemd-run", 1000)[1] == "--user"
    assert kinds.unit_name("my gw/1", "0123456789") == "pulse-restart-my-gw-1-01234567"


def test_claimer_ids_tell_the_living_from_the_dead():
    boot = boot_id()
    me = claimer_id()
    assert claimer_alive(me, boot)
    pid, _, rest = me.partition(":")
    assert not claimer_alive(f"{pid}:{int(rest.split('@')[0]) + 1}@{boot}", boot)   # same pid, another process
    assert not claimer_alive(me.split("@")[0] + "@another-boot", boot)
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not claimer_alive(f"{dead.pid}:1@{boot}", boot)
    assert not claimer_alive("garbage", boot) and not claimer_alive(None, boot)


def test_effect_timeout_is_bounded_by_the_config():
    assert kinds.effect_timeout(enginerpc.Effect(kind="exec", params={"timeout_s": 5}), 30) == 5
    assert kinds.effect_timeout(enginerpc.Effect(kind="exec", params={"timeout_s": 500}), 30) == 30
    assert kinds.effect_timeout(enginerpc.Effect(kind="exec", params={"timeout_s": "x"}), 30) == 30


def test_run_process_outside_a_daemon(tmp_path):
    """The process primitive alone: output, the group killed at the timeout and after the leader's exit."""
    def ctx():   # one per effect: its deadline starts with it
        return kinds.EffectContext(Config(), tmp_path, timeout_s=1.0)

    code, out, timed_out = kinds.run_process([PY, "-c", "print('x' * 5000)"], ctx())
    assert (code, len(out), timed_out) == (0, 5001, False)
    # what the claim records: that a process is starting, before it can run (it may run before Popen
    # returns, and its executor die then), then its group; the process carries the effect's mark
    ran, told = tmp_path / "ran", []
    recording = ctx()
    recording.effect_id = "eff-1"
    recording.starting = lambda: told.append(("starting", ran.exists()))
    recording.started = lambda pgid: told.append(("started", pgid))
    code, out, _ = kinds.run_process(["sh", "-c", f'touch {ran}; echo "${kinds.EFFECT_MARK}"'], recording)
    assert told[0] == ("starting", False) and told[1][0] == "started" and told[1][1] > 0 and len(told) == 2
    assert (code, out) == (0, b"eff-1\n")
    t0 = time.monotonic()
    code, out, timed_out = kinds.run_process(["sh", "-c", "sleep 300 & echo $!; wait"], ctx())
    assert timed_out and code is None and 0.9 < time.monotonic() - t0 < 2
    wait_for(lambda: not alive(int(out.split()[0])), 2, what="the timed-out group's background sleep killed")
    t0 = time.monotonic()
    code, out, timed_out = kinds.run_process(["sh", "-c", "sleep 300 & echo $!"], ctx())
    assert time.monotonic() - t0 < kinds.DRAIN_AFTER_EXIT_S + 0.3   # done when the leader is
    assert code == 0 and not timed_out
    wait_for(lambda: not alive(int(out.split()[0])), 2, what="a leftover of an exited leader killed")


# -- exec ----------------------------------------------------------------------------------------------

def test_exec_records_code_tail_and_full_output(pulsed):
    pulsed.start()
    big = "".join(f"line {i}\n" for i in range(1000))     # ~8.9 KB: more than the tail keeps
    ok, bad = submit(pulsed, effect("exec", argv=[PY, "-c", f"import sys; sys.stdout.write({big!r})"]),
                     effect("exec", argv=["sh", "-c", "echo out; echo err >&2; exit 3"]))
    acked = wait_end(pulsed, ok.id)
    assert acked["type"] == "effect-acked" and acked["data"]["code"] == 0
    assert acked["data"]["tail"] == big.encode()[-kinds.TAIL_BYTES:].decode()
    assert objects.get(pulsed.home / "objects", acked["data"]["output"]) == big.encode()
    assert history(pulsed, ok.id) == ["effect", "effect-executing", "effect-acked"]
    failed = wait_end(pulsed, bad.id)
    assert failed["type"] == "effect-failed"
    assert (failed["data"]["reason"], failed["data"]["code"], failed["data"]["tail"]) == ("exit", 3, "out\nerr\n")
    assert failed["data"]["error"] == "exit code 3"


def test_exec_timeout_kills_its_process_group(pulsed, tmp_path):
    pulsed.start()
    pidfile = tmp_path / "grandchild.pid"
    slow, = submit(pulsed, effect("exec", argv=["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], timeout_s=1))
    t0 = time.monotonic()
    failed = wait_end(pulsed, slow.id, timeout=5)
    assert 0.9 < time.monotonic() - t0 < 3
    assert failed["type"] == "effect-failed" and failed["data"]["reason"] == "timeout"
    grandchild = int(pidfile.read_text())
    pulsed.tracker.add(grandchild)
    wait_for(lambda: not alive(grandchild), 2, what="the effect's background sleep killed with its group")


def test_a_slow_effect_blocks_nothing(pulsed):
    pulsed.start(env={"PULSE_EXECUTOR_CONCURRENCY": "2"})
    slow, = submit(pulsed, effect("exec", argv=["sleep", "4"], timeout_s=10))
    wait_for(lambda: "effect-executing" in history(pulsed, slow.id), 5, what="the slow effect running")
    t0 = time.monotonic()
    quick = submit(pulsed, *[effect("noop") for _ in range(20)])
    for e in quick:
        assert wait_end(pulsed, e.id, timeout=3)["type"] == "effect-acked"
    assert time.monotonic() - t0 < 2 and ending(pulsed, slow.id) is None
    executor = pulsed.worker("executor")
    pulsed.wait_heartbeat("executor", executor.pid)     # the main loop kept heartbeating
    assert executor.restarts == 0


def test_malformed_doorbell_then_a_valid_one_still_runs_effects(pulsed):
    pulsed.start(env={"PULSE_EXECUTOR_SCAN_INTERVAL_MS": "60000"})   # only the doorbell can start it
    # its first scan comes at its first turn, which a loaded machine may delay past the commit below:
    # once a rung effect has run, the next scan is a minute away and only a doorbell starts one
    first, = commit(pulsed.home, effect("noop"))
    ring(pulsed)
    assert wait_end(pulsed, first.id, timeout=10)["type"] == "effect-acked"
    e, = commit(pulsed.home, effect("noop"))
    ring(pulsed, b"", b"\x00\xff garbage", codec.encode(doorbells.Wake("x")))
    # the loop handles frames in order: once all three complaints are out, it has acted on them
    wait_for(lambda: pulsed.log_text().count("dropped a malformed frame on the doorbell socket") >= 3, 5,
             what="the doorbell's three complaints")
    assert ending(pulsed, e.id) is None
    t0 = time.monotonic()
    ring(pulsed)
    assert wait_end(pulsed, e.id, timeout=3)["type"] == "effect-acked"
    assert time.monotonic() - t0 < 1
    assert pulsed.worker("executor").restarts == 0


def test_the_scan_is_the_doorbells_fallback(pulsed):
    pulsed.start(env={"PULSE_EXECUTOR_SCAN_INTERVAL_MS": "300"})
    e, = commit(pulsed.home, effect("noop"))       # no doorbell: as if it were lost
    assert wait_end(pulsed, e.id, timeout=3)["type"] == "effect-acked"


def test_expired_effects_are_recorded_not_run(pulsed):
    pulsed.start()
    stale, = submit(pulsed, effect("exec", argv=["touch", str(pulsed.home / "ran")]), now=time.time() - 120)
    expired = wait_end(pulsed, stale.id, timeout=5)
    assert expired["type"] == "effect-expired" and expired["data"]["reason"] == "deadline"
    assert history(pulsed, stale.id) == ["effect", "effect-expired"]
    assert not (pulsed.home / "ran").exists()


# -- orphans -------------------------------------------------------------------------------------------

def test_orphans_are_settled_when_the_executor_starts(pulsed, tmp_path):
    """Claimed by a dead executor: its process group is killed first, then idempotent → run again,
    not idempotent → failed, `interrupted-after-start` if it may have acted (its process group was
    recorded, or that it was starting one, or its kind runs no process), else
    `interrupted-before-start`. A live claimer's effect is left alone."""
    ensure_home(pulsed.home)
    out = tmp_path / "ran.txt"
    append = [PY, "-c", "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')", str(out)]
    once = effect("exec", argv=append + ["once"])
    again = effect("exec", argv=append + ["again"], idempotent=True)
    predates = effect("noop")
    unstarted = effect("exec", argv=append + ["unstarted"])
    spawning = effect("exec", argv=append + ["spawning"])   # its executor died between the fork and the record
    live = effect("noop")
    commit(pulsed.home, once, again, unstarted, spawning, live)
    commit(pulsed.home, predates, now=time.time() + 10)    # created "after" the process below started
    dead = subprocess.Popen(["true"])
    dead.wait()
    dead_claimer = f"{dead.pid}:1@{boot_id()}"
    leftover = subprocess.Popen(["sleep", "300"], process_group=0)   # what the dead executor's effect left
    unrelated = subprocess.Popen(["sleep", "301"], process_group=0)  # its group id, recorded, got "reused"
    # what the spawning one started, known by the effect's mark alone
    started = subprocess.Popen(["sleep", "302"], process_group=0, env={**os.environ, kinds.EFFECT_MARK: spawning.id})
    pulsed.tracker.add(leftover.pid, unrelated.pid, started.pid)
    conn = eventsdb.open_events(pulsed.home / "events.db")
    for e in (once, again, predates, unstarted, spawning):
        assert effectqueue.claim_effect(conn, e.id, dead_claimer, "dead-executor") is not None
    effectqueue.record_pgid(conn, spawning.id, effectqueue.SPAWNING)
    effectqueue.record_pgid(conn, once.id, leftover.pid)
    effectqueue.record_pgid(conn, predates.id, unrelated.pid)
    assert effectqueue.claim_effect(conn, live.id, claimer_id(), "test") is not None

    pulsed.start()
    failed = wait_end(pulsed, once.id)
    assert failed["type"] == "effect-failed" and failed["data"]["reason"] == "interrupted-after-start"
    assert failed["data"]["dead_claimer"] == dead_claimer and failed["data"]["may_have_acted"]
    never = wait_end(pulsed, unstarted.id)["data"]      # claimed, but no process group was ever recorded
    assert never["reason"] == "interrupted-before-start" and not never["may_have_acted"]
    maybe = wait_end(pulsed, spawning.id)["data"]       # its process may have run: said so, and it is ended
    assert maybe["reason"] == "interrupted-after-start" and maybe["may_have_acted"]
    assert started.wait(5) == -signal.SIGKILL
    assert leftover.wait(5) == -signal.SIGKILL
    assert wait_end(pulsed, again.id)["type"] == "effect-acked"
    assert history(pulsed, again.id) == ["effect", "effect-executing", "effect-failed(requeued)",
                                         "effect-executing", "effect-acked"]
    assert out.read_text() == "again\n"                  # the non-idempotent ones never ran
    assert wait_end(pulsed, predates.id)["data"]["reason"] == "interrupted-after-start"
    assert unrelated.poll() is None                      # older than the effect: not its process
    executor_has_looked(pulsed)
    assert effectqueue.effect_state(conn, live.id) == "executing"
    conn.close()


def test_kill_9_mid_effect(pulsed, tmp_path):
    """A real executor death: the effect's process dies with it (PDEATHSIG); the successor kills the
    rest of its process group (a background child PDEATHSIG does not reach), then settles the effect."""
    pulsed.start()
    pidfile = tmp_path / "grandchild.pid"
    e, = submit(pulsed, effect("exec", argv=["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], timeout_s=25))
    conn = eventsdb.open_events(pulsed.home / "events.db")
    row = wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() and
                   next((r for r in effectqueue.open_effects(conn, "executing") if r[3]), None), 5,
                   what="the effect running, its process group recorded")
    leader, grandchild = row[3], int(pidfile.read_text())
    pulsed.tracker.add(leader, grandchild)
    before = pulsed.worker("executor").pid
    os.kill(before, signal.SIGKILL)
    wait_for(lambda: not alive(leader), 2, what="the effect's process dead with its executor (PDEATHSIG)")
    pulsed.wait_replaced("executor", before)
    failed = wait_end(pulsed, e.id)
    assert failed["type"] == "effect-failed" and failed["data"]["reason"] == "interrupted-after-start"
    assert not alive(grandchild)                      # killed before the effect was settled
    conn.close()


def fcntl_lockers(path: Path) -> set[int]:
    """The pids holding an fcntl (POSIX) lock on the file at `path`, as /proc/locks lists them."""
    st = os.stat(path)
    lockers = set()
    with open("/proc/locks") as f:
        for fields in map(str.split, f):
            if fields[1] != "POSIX":        # "->": a waiter, not a holder
                continue
            major, minor, inode = fields[5].split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino):
                lockers.add(int(fields[4]))
    return lockers


def test_the_executor_keeps_its_lock_on_events_db_when_its_threads_open_their_connections(pulsed):
    """Each open connection holds a shared fcntl lock on events.db, and a connection closing in another
    process deletes the WAL and the -shm only when it finds none. The executor opens a connection per
    thread as effects come; that must not drop the locks its other connections hold (closing any
    descriptor of the file does), or the WAL could be deleted under them and the claims they commit
    next go to a deleted file that no other process reads: a non-idempotent effect claimed, and run,
    twice (and what was synced, lost to a power cut)."""
    pulsed.start()
    executor_has_looked(pulsed)        # a runner thread opened its connection, after the loop's
    assert pulsed.worker("executor").pid in fcntl_lockers(pulsed.home / "events.db")


# -- the allow-list, live --------------------------------------------------------------------------------

def test_disallowed_effects_fail_without_running(pulsed, tmp_path):
    write_config(pulsed, '[allow]\nkinds = ["exec", "signal", "noop"]\nexec_argv = [["true"]]\n')
    pulsed.start()
    marker = tmp_path / "ran"
    bad_exec, bad_signal = submit(pulsed, effect("exec", argv=["touch", str(marker)]),
                                  effect("signal", target="sshd", signal="SIGHUP"), origin="engine")
    good_exec, = submit(pulsed, effect("exec", argv=["true", "whatever"]), origin="agent")
    operator, = submit(pulsed, effect("exec", argv=["touch", str(marker)]), origin="operator")
    for e, why in ((bad_exec, "matches no allow.exec_argv prefix"), (bad_signal, "not a configured [[process]]")):
        failed = wait_end(pulsed, e.id)
        assert failed["type"] == "effect-failed" and failed["data"]["reason"] == "not-allowed"
        assert failed["data"]["error"].startswith("not-allowed: ") and why in failed["data"]["error"]
        assert history(pulsed, e.id) == ["effect", "effect-failed"]      # never claimed, never run
    assert wait_end(pulsed, good_exec.id)["type"] == "effect-acked"
    assert wait_end(pulsed, operator.id)["type"] == "effect-acked"     # the operator is trusted
    assert marker.exists()


# -- notify ----------------------------------------------------------------------------------------------

class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append((json.loads(body), self.headers.get("Authorization")))
        self.send_response(500 if len(self.server.requests) == 1 else 200)   # the first one fails
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_notify_channels(pulsed, tmp_path, webhook):
    journal, via_command = tmp_path / "journal.jsonl", tmp_path / "command.jsonl"
    write_config(pulsed, f"""
[[notify]]
kind = "log"

[[notify]]
kind = "file"
name = "journal"
path = "{journal}"

[[notify]]
kind = "command"
name = "cmd"
argv = ["{PY}", "-c", "import sys; open(sys.argv[1], 'a').write(sys.stdin.read())", "{via_command}"]

[[notify]]
kind = "webhook"
name = "hook"
url = "http://127.0.0.1:{webhook.server_port}/hook"
headers = {{ "Authorization" = "Bearer t0ken" }}
retries = 2
timeout_s = 2

[[notify]]
kind = "command"
name = "broken"
argv = ["sh", "-c", "echo nope >&2; exit 1"]
""")
    pulsed.start(env={"NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"})
    e, = submit(pulsed, effect("notify", target="gw", message="gw is down", level="warning"))
    # Without `channels`, every channel: the broken one fails the effect, the others still deliver.
    failed = wait_end(pulsed, e.id, timeout=15)
    assert failed["type"] == "effect-failed" and failed["data"]["reason"] == "notify"
    channels = failed["data"]["channels"]
    assert channels["broken"].startswith("failed: exit code 1") and "nope" in channels["broken"]
    assert channels["journal"] == "appended" and channels["cmd"] == "exit code 0" and channels["log#0"] == "logged"
    assert channels["hook"] == "HTTP 200 after 2 attempt(s)"                       # retried after the 500
    for got in (json.loads(journal.read_text()), json.loads(via_command.read_text()), webhook.requests[1][0]):
        assert (got["effect_id"], got["message"], got["target"], got["level"]) == (e.id, "gw is down", "gw", "warning")
    assert [auth for _, auth in webhook.requests] == ["Bearer t0ken"] * 2
    assert "notify: " in pulsed.log_text() and "gw is down" in pulsed.log_text()

    ok, = submit(pulsed, effect("notify", message="again", channels=["journal", "cmd"]))
    acked = wait_end(pulsed, ok.id)
    assert acked["type"] == "effect-acked" and set(acked["data"]["channels"]) == {"journal", "cmd"}
    assert [json.loads(line)["message"] for line in journal.read_text().splitlines()] == ["gw is down", "again"]
    bad, = submit(pulsed, effect("notify", message="x", channels=["nosuch"]))
    assert wait_end(pulsed, bad.id)["data"]["reason"] == "bad-params"


# -- restart-process and signal ----------------------------------------------------------------------------

# The sleeper's argument is this run's own, so no other run's process (or anything else on the host)
# can match it.
SLEEP = f"3000.{random.randrange(10**6):06d}"
PROCESSES = f"""
[[process]]
name = "sleeper"
match = "^sleep {SLEEP}$"
restart = ["sleep", "{SLEEP}"]

[[process]]
name = "oneshot-ok"
match = "^no process looks like this$"
restart = ["true"]

[[process]]
name = "oneshot-fails"
match = "^no process looks like this$"
restart = ["sh", "-c", "exit 4"]
"""


def test_restart_process_and_signal(pulsed):
    write_config(pulsed, PROCESSES)
    old = subprocess.Popen(["sleep", SLEEP])
    pulsed.tracker.add(old.pid)
    pulsed.start()
    restart, ok, fails, missing = submit(
        pulsed, effect("restart-process", target="sleeper"), effect("restart-process", target="oneshot-ok"),
        effect("restart-process", target="oneshot-fails"), effect("restart-process", target="nosuch"),
        origin="survival")
    acked = wait_end(pulsed, restart.id)
    assert acked["type"] == "effect-acked" and acked["data"]["detached"] is True
    new = acked["data"]["pid"]
    pulsed.tracker.add(new)
    assert new != old.pid and psutil.Process(new).cmdline() == ["sleep", SLEEP]
    # What was there was stopped first (SIGTERM; default disposition restored in children): never two copies.
    assert old.wait(5) == -signal.SIGTERM and acked["data"]["stopped"] == [old.pid]
    keeper = psutil.Process(new).parent()                           # its keeper, in a session of its own
    assert keeper.cmdline()[0] == f"pulse: keep sleeper ({pulsed.home})"
    assert os.getsid(new) == os.getsid(keeper.pid) != os.getsid(pulsed.worker("executor").pid)
    assert os.readlink(f"/proc/{new}/fd/0") == "/dev/null"
    assert all(os.readlink(f"/proc/{new}/fd/{fd}").startswith("pipe:") for fd in (1, 2))   # to its log
    assert wait_end(pulsed, ok.id)["data"]["code"] == 0
    failed = wait_end(pulsed, fails.id)
    assert (failed["type"], failed["data"]["reason"], failed["data"]["code"]) == ("effect-failed", "exit", 4)
    assert wait_end(pulsed, missing.id)["data"]["reason"] == "bad-params"

    # The restarted process is not a leftover: it outlives its executor.
    executor = pulsed.worker("executor").pid
    os.kill(executor, signal.SIGKILL)
    pulsed.wait_replaced("executor", executor)
    executor_has_looked(pulsed)                          # the new executor has settled what it found
    assert alive(new)

    # signal: the configured process, found by its match, never a pid from the effect.
    # Paused first: processWatchdog would otherwise start another sleeper, which would outlive the test.
    assert pulsed.ctl("pause", "sleeper", "--for", "10m").returncode == 0
    hup, absent = submit(pulsed, effect("signal", target="sleeper", signal="SIGTERM"),
                         effect("signal", target="oneshot-ok", signal="SIGHUP"), origin="agent")
    sent = wait_end(pulsed, hup.id)
    assert sent["type"] == "effect-acked" and sent["data"]["pids"] == [new]
    wait_for(lambda: not alive(new), 5, what="the restarted sleep terminated")
    exited = wait_for(lambda: pulsed.events("process-exited", "sleeper"), 5, what="its keeper's record")
    assert exited[-1]["data"] == {"pid": new, "code": None, "signal": "SIGTERM", "tail": ""}
    assert wait_end(pulsed, absent.id)["data"]["reason"] == "not-running"


# -- the engine's executors --------------------------------------------------------------------------------

def test_engine_kind_waits_while_the_engine_is_stopped_then_expires(pulsed):
    pulsed.start()
    assert pulsed.ctl("stop", "engine").returncode == 0
    pulsed.wait_state("engine", "stopped")
    e, = submit(pulsed, effect("my-engine-kind"), deadline_s=2)
    executor_has_looked(pulsed)
    assert history(pulsed, e.id) == ["effect"]                      # not claimed while nobody can run it
    expired = wait_end(pulsed, e.id, timeout=5)
    assert expired["type"] == "effect-expired"
    assert history(pulsed, e.id) == ["effect", "effect-expired"]


class FakeEngine(threading.Thread):
    """Answers the engine RPC in place of the (stopped) engine: Ping, and RunExecutor by kind."""

    def __init__(self, endpoint: str):
        super().__init__(daemon=True)
        self.endpoint, self.stop = endpoint, threading.Event()
        self.calls: list[str] = []
        self.bound = threading.Event()

    def run(self):
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.endpoint)
        self.bound.set()
        late = []
        while not self.stop.is_set():
            if sock.poll(20):
                identity, frame = sock.recv_multipart()
                request = codec.decode(frame, enginerpc.EngineRequest)
                if isinstance(request, enginerpc.Ping):
                    sock.send_multipart([identity, codec.encode(enginerpc.Pong(request.id, os.getpid()))])
                    continue
                if not isinstance(request, enginerpc.RunExecutor):
                    continue   # the tick's business-chain calls: not this fake's concern
                kind = request.effect.kind
                self.calls.append(kind)
                reply = {"engine-ok": enginerpc.ExecutorResult(request.id, True, {"did": kind}),
                         "engine-unknown": enginerpc.ExecutorResult(request.id, False, unknown_kind=True),
                         "engine-broken": enginerpc.ExecutorResult(request.id, False, error="boom")}.get(kind)
                if reply is not None:
                    sock.send_multipart([identity, codec.encode(reply)])
                elif kind == "engine-late":
                    late.append((time.monotonic() + 2.0, identity, enginerpc.ExecutorResult(request.id, True)))
            for item in [x for x in late if x[0] <= time.monotonic()]:
                late.remove(item)
                sock.send_multipart([item[1], codec.encode(item[2])])
        sock.close()


def test_engine_executors_over_the_rpc(pulsed):
    pulsed.start(env={"PULSE_EFFECT_TIMEOUT_S": "1"})
    assert pulsed.ctl("stop", "engine").returncode == 0
    pulsed.wait_state("engine", "stopped")
    fake = FakeEngine(pulsed.paths.endpoint("engine"))
    fake.start()
    try:
        assert fake.bound.wait(5)
        ok, unknown, broken, late = submit(pulsed, effect("engine-ok"), effect("engine-unknown"),
                                           effect("engine-broken"), effect("engine-late"))
        acked = wait_end(pulsed, ok.id)
        assert acked["type"] == "effect-acked" and acked["data"]["result"] == {"did": "engine-ok"}
        assert wait_end(pulsed, unknown.id)["data"]["reason"] == "unknown-kind"
        assert wait_end(pulsed, broken.id)["data"]["error"] == "boom"
        t0 = time.monotonic()
        no_answer = wait_end(pulsed, late.id, timeout=5)   # the answer comes after the deadline: dropped
        assert no_answer["data"]["reason"] == "engine-no-answer" and time.monotonic() - t0 < 2
        wait_for(lambda: "dropped a late reply from the engine" in pulsed.log_text(), 5, what="the late reply dropped")
        assert fake.calls.count("engine-late") == 1                 # not idempotent: never sent twice
        assert pulsed.worker("executor").restarts == 0
    finally:
        fake.stop.set()
        fake.join(5)


# -- exactly once --------------------------------------------------------------------------------------------

# Each effect runs this with (file, effect id): it appends its id with a single O_APPEND write,
# pausing before and after, so that kills land before, during and after the write.
APPEND = ("import os, sys, time\n"
          "time.sleep(0.02)\n"
          "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)\n"
          "os.write(fd, (sys.argv[2] + '\\n').encode())\n"
          "time.sleep(0.02)\n")

# A second claimer, racing the executor for the oldest pending effects through the same store API;
# it runs what it wins the same way (argv) and records it under its own claimer id.
RACER = """
import subprocess, sys, time
from pathlib import Path
from pulse.store import effectqueue, eventsdb
from pulse.workers.executor import claimer_id
conn = eventsdb.open_events(Path(sys.argv[1]), "FULL")
me, done, won = claimer_id(), Path(sys.argv[2]), 0
while not done.exists():
    pending = effectqueue.open_effects(conn, "pending", limit=8)
    if not pending:
        time.sleep(0.005)
        continue
    for effect, *_ in pending:
        if effectqueue.claim_effect(conn, effect.id, me, "racer") is not None:
            won += 1
            code = subprocess.run(effect.params["argv"]).returncode
            effectqueue.finish_claimed_effect(conn, effect.id, me, "acked" if code == 0 else "failed", "racer", code=code)
            break
print(won)
"""


def test_exactly_once_under_kill_9_and_a_racing_claimer(pulsed, tmp_path):
    """1,000 effects, half non-idempotent (appending their id to a file), half idempotent (appending to
    another, where repeats are allowed), while the executor is kill -9'd over and over and a second
    claimer races it. The restart intensity limit is raised for this test (PULSE_INTENSITY_RESTARTS=1000):
    otherwise the fifth kill within a minute would escalate, by design, and stop pulsed."""
    pulsed.start(env={"PULSE_INTENSITY_RESTARTS": "1000", "PULSE_EXECUTOR_CONCURRENCY": "4"})
    once_file, again_file = tmp_path / "once.txt", tmp_path / "again.txt"
    once, again = [], []
    for i in range(1000):
        idempotent = i % 2 == 1
        e = effect("exec", idempotent=idempotent, timeout_s=20)
        e.params["argv"] = [PY, "-I", "-S", "-c", APPEND, str(again_file if idempotent else once_file), e.id]
        (again if idempotent else once).append(e)
    everything = [e for pair in zip(once, again) for e in pair]
    commit(pulsed.home, *everything, deadline_s=300)
    done_flag = tmp_path / "racer.done"
    racer = subprocess.Popen([PY, "-c", RACER, str(pulsed.home / "events.db"), str(done_flag)],
                             stdout=subprocess.PIPE, text=True)
    pulsed.tracker.add(racer.pid)
    ring(pulsed)

    conn = eventsdb.open_events(pulsed.home / "events.db")

    def open_count() -> int:
        return len(effectqueue.open_effects(conn, limit=2000))

    kills, rng = 0, random.Random(7)
    t0 = time.monotonic()
    pid = pulsed.worker("executor").pid
    while kills < 12 and open_count() > 50:
        time.sleep(rng.uniform(0.3, 0.5))
        os.kill(pid, signal.SIGKILL)
        kills += 1
        pid = pulsed.wait_replaced("executor", pid, heartbeat=False).pid
    wait_for(lambda: open_count() == 0, 60, interval=0.1, what="every effect ended")
    elapsed = time.monotonic() - t0
    done_flag.touch()
    racer_won = int(racer.communicate(timeout=10)[0])
    conn.close()

    endings = collections.defaultdict(list)
    for ev in pulsed.events():
        if ev["type"] in TERMINAL_TYPES and not ev["data"].get("requeued"):
            endings[ev["data"]["effect_id"]].append(ev["type"])
    # 1. every effect ends in exactly one terminal event
    assert set(endings) == {e.id for e in everything}
    assert all(len(types) == 1 for types in endings.values()), [t for t in endings.values() if len(t) > 1][:3]
    # 2. no id appears twice in the file
    written = once_file.read_text().split()
    assert len(written) == len(set(written))
    # 3. every acked non-idempotent id is in the file
    acked_once = {e.id for e in once if endings[e.id] == ["effect-acked"]}
    assert acked_once <= set(written)
    # 4. every idempotent effect ends acked (and ran at least once)
    assert all(endings[e.id] == ["effect-acked"] for e in again)
    assert {e.id for e in again} <= set(again_file.read_text().split())

    # The run was a real race: kills interrupted effects, and both claimers won some.
    failed = [ev for ev in pulsed.events("effect-failed")]
    assert kills >= 10, f"only {kills} kills landed before the effects ran out ({elapsed:.1f}s)"
    assert all(ev["data"]["reason"].startswith("interrupted") for ev in failed)   # requeued: "interrupted"
    assert any(not ev["data"].get("requeued") for ev in failed) and any(ev["data"].get("requeued") for ev in failed)
    executor_won = len([ev for ev in pulsed.events("effect-executing") if ev["source"] == "executor"])
    assert racer_won > 0 and executor_won > 0
    print(f"\nexactly-once: {kills} kills in {elapsed:.1f}s; racer won {racer_won}, executor claimed "
          f"{executor_won}; {len(once) - len(acked_once)} non-idempotent interrupted, "
          f"{sum(1 for ev in failed if ev['data'].get('requeued'))} idempotent re-run")
