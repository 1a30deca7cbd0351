"""Watchers (Percept): the built-ins in a real pulsed, the runner in-process, vitals gc.

Real processes and real files throughout: a real pulsed on a temporary home,
`sleep` processes the test starts (and kills by pid), a loopback HTTP server.
Nothing here contacts anything but loopback.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import zmq

from pulse.core import config as configmod
from pulse.core.wire import codec, doorbells, enginerpc
from pulse.engine.api import Watcher
from pulse.sensing.runner import WatcherRunner
from pulse.store import errorruns, eventsdb, vitalsdb
from pulse.workers.watcher import VitalsGc
from support import vitals_of, wait_for

# A minute between samples and between ticks: whatever happens faster was event-driven.
SLOW = {"PULSE_WATCHER_INTERVAL_MS": "60000", "PULSE_TICK_MS": "60000"}
FAST_SAMPLES = {"PULSE_WATCHER_INTERVAL_MS": "100"}


# -- helpers ---------------------------------------------------------------------------------------------

def configure(pulsed, toml: str) -> None:
    pulsed.home.mkdir(parents=True)
    (pulsed.home / "config.toml").write_text(toml)


def latest(home: Path, key: str) -> dict | None:
    rows = vitals_of(home, key)
    return rows[-1] if rows else None


def spawn_sleeper(tracker) -> tuple[subprocess.Popen, str]:
    """A `sleep` with a command line no other process has; killed by pid at teardown."""
    seconds = f"300.{uuid.uuid4().int % 10**9:09d}"
    proc = subprocess.Popen(["sleep", seconds], stdin=subprocess.DEVNULL, start_new_session=True)
    tracker.add(proc.pid)
    return proc, seconds


def holds_pidfd(pid: int) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == "anon_inode:[pidfd]":
                return True
        except OSError:
            pass
    return False


def watch_process_toml(name: str, *, pidfile: Path | None = None, match: str | None = None) -> str:
    how = f'pidfile = "{pidfile}"' if pidfile else f"match = {json.dumps(match)}"
    return f'[log]\nlevel = "debug"\n\n[[process]]\nname = "{name}"\n{how}\n'


# -- system-resource --------------------------------------------------------------------------------------

def test_system_resource_vital_and_a_fresh_install_watches_nothing_else(pulsed):
    pulsed.start()
    v = wait_for(lambda: latest(pulsed.home, "system-resource"), 10, what="a system-resource vital")
    assert 0 <= v["cpu_pct"] <= 100
    assert 0 < v["memory_pct"] <= 100
    assert 0 <= v["swap_pct"] <= 100
    assert 0 < v["disk_pct"] <= 100 and v["disk_path"] == "/"
    assert len(v["load"]) == 3 and all(x >= 0 for x in v["load"])
    assert v["cpus"] >= 1
    assert abs(v["ts"] - time.time()) < 30
    conn = sqlite3.connect(f"file:{pulsed.home / 'vitals.db'}?mode=ro", uri=True)
    keys = {k for (k,) in conn.execute("SELECT DISTINCT key FROM vitals")}
    conn.close()
    # no processes, no outbound targets, no log files by default ("tick" is the tick's own record)
    assert keys - {"tick"} == {"system-resource"}
    assert not pulsed.events("error")


# -- process-alive ------------------------------------------------------------------------------------------

def test_process_alive_by_pidfile_learns_a_death_from_the_kernel(pulsed, tracker, tmp_path):
    sleeper, _ = spawn_sleeper(tracker)
    pidfile = tmp_path / "sleeper.pid"
    pidfile.write_text(f"{sleeper.pid}\n")
    configure(pulsed, watch_process_toml("sleeper", pidfile=pidfile))
    pulsed.start(env=SLOW)
    key = "process-alive:sleeper"
    first = wait_for(lambda: latest(pulsed.home, key), 10, what="the first process-alive sample")
    assert first["alive"] is True and first["pid"] == sleeper.pid and first["since"] > 0
    wait_for(lambda: holds_pidfd(pulsed.worker("watcher").pid), 5, what="the watcher holding a pidfd")

    sleeper.kill()   # not reaped: a zombie is dead too
    v = wait_for(lambda: (lambda v: v if v and v["alive"] is False else None)(latest(pulsed.home, key)), 1.0,
                 what="alive=false within a second, with a 60 s interval")
    assert v["pid"] is None and str(sleeper.pid) in v["reason"]
    sleeper.wait(5)


def test_process_alive_by_match_rearms_after_a_restart(pulsed, tracker):
    first, seconds = spawn_sleeper(tracker)
    configure(pulsed, watch_process_toml("sleeper", match=rf"^sleep {seconds.replace('.', '[.]')}$"))
    pulsed.start(env=SLOW)
    key = "process-alive:sleeper"

    def alive_as(pid):
        v = latest(pulsed.home, key)
        return v if v and v["alive"] and v["pid"] == pid else None

    v = wait_for(lambda: alive_as(first.pid), 10, what="the sleeper found by its command line")
    assert v["matches"] == 1
    wait_for(lambda: holds_pidfd(pulsed.worker("watcher").pid), 5, what="the watcher holding a pidfd")

    first.kill()
    first.wait(5)    # reaped: gone, not a zombie
    wait_for(lambda: latest(pulsed.home, key)["alive"] is False, 1.0, what="alive=false within a second")

    # Restarted soon after: found within the quick re-checks that follow a death, not a minute later,
    # and its pidfd armed, so its own death is learned at once too.
    second = subprocess.Popen(["sleep", seconds], stdin=subprocess.DEVNULL, start_new_session=True)
    tracker.add(second.pid)
    wait_for(lambda: alive_as(second.pid), 1.0, what="the restarted sleeper found within a second")
    wait_for(lambda: holds_pidfd(pulsed.worker("watcher").pid), 2, what="the pidfd re-armed")
    second.kill()
    second.wait(5)
    wait_for(lambda: latest(pulsed.home, key)["alive"] is False, 1.0, what="the second death within a second")


def test_wake_beats_the_interval(pulsed, tracker, tmp_path):
    sleeper, _ = spawn_sleeper(tracker)
    pidfile = tmp_path / "sleeper.pid"
    pidfile.write_text(f"{sleeper.pid}\n")
    configure(pulsed, watch_process_toml("critical", pidfile=pidfile))
    pulsed.start(env=SLOW)
    wait_for(lambda: latest(pulsed.home, "process-alive:critical"), 10, what="the first sample")
    wait_for(lambda: holds_pidfd(pulsed.worker("watcher").pid), 5, what="the watcher holding a pidfd")
    line = "woken by watcher (process-alive:critical)"
    assert line not in pulsed.log_text()   # alive at the first sample: nothing to ring for

    sleeper.kill()
    sleeper.wait(5)
    wait_for(lambda: line in pulsed.log_text(), 1.0, what="the tick woken within a second (tick_ms 60 s)")
    pulsed.wait_samples("process-alive:critical", 3)  # several quick re-checks, all dead ...
    assert pulsed.log_text().count(line) == 1        # ... and only the edge rang


# -- error-log -----------------------------------------------------------------------------------------------

def test_error_log_counts_keywords_across_rotation_and_truncation(pulsed, tmp_path):
    log = tmp_path / "app.log"
    log.write_text("ERROR from before the start: history, not news\n")
    configure(pulsed, f'[[watch.error_log]]\nname = "app"\npath = "{log}"\nkeywords = ["ERROR", "FATAL"]\n')
    pulsed.start(env=FAST_SAMPLES)
    key = "error-log:app"
    wait_for(lambda: latest(pulsed.home, key), 10, what="the first error-log sample")

    def totals():
        rows = vitals_of(pulsed.home, key)
        return (sum(r["matches"] for r in rows), sum(r["by_keyword"]["ERROR"] for r in rows),
                sum(r["by_keyword"]["FATAL"] for r in rows), sum(r["lines_read"] for r in rows))

    def reach(matches, errors, fatals, what):
        wait_for(lambda: totals()[:3] == (matches, errors, fatals), 5, what=what)

    with open(log, "a") as f:
        f.write("ERROR one\nall is well\nFATAL two\nERROR and FATAL three\n")
    reach(3, 2, 2, "the appended matches counted")
    assert totals()[3] == 4   # the line from before the start was never read
    assert any("ERROR and FATAL three" in line for r in vitals_of(pulsed.home, key) for line in r["lines"])

    os.rename(log, tmp_path / "app.log.1")                  # rotation: rename, the writer still has it open ...
    with open(tmp_path / "app.log.1", "a") as f:
        f.write("ERROR written to the old file just after the rename\n")
    log.write_text("FATAL in the new file\n" + "padding, no keyword " * 50 + "\n")   # ... then a new file
    reach(5, 3, 3, "matches from both sides of the rotation")
    wait_for(lambda: totals()[3] == 7, 2, what="the padding line read (our offset is now past it)")

    with open(log, "w") as f:                               # truncation (copytruncate), shorter than before
        f.write("ERROR after truncation\n")
    reach(6, 4, 3, "the match after truncation")
    pulsed.wait_samples(key, 3)                             # a few more samples: nothing is counted twice
    assert totals()[:3] == (6, 4, 3)
    latest_sample = latest(pulsed.home, key)
    assert latest_sample["exists"] is True and latest_sample["path"] == str(log)


# -- network --------------------------------------------------------------------------------------------------

class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


# A name glibc rejects before sending any query (longer than DNS allows), so the DNS failure
# happens without contacting a resolver; `.invalid` (RFC 6761) for good measure.
UNRESOLVABLE = ".".join(["a" * 60] * 5) + ".nonexistent.invalid"


def test_network_up_down_and_dns_failure_on_loopback_only(pulsed):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    configure(pulsed, f"""[log]
level = "debug"

[[watch.network]]
name = "local"
url = "http://127.0.0.1:{port}/health"
timeout_s = 1

[[watch.network]]
name = "nowhere"
host = "{UNRESOLVABLE}"
timeout_s = 1
""")
    try:
        pulsed.start(env={**FAST_SAMPLES, "no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1"})
        up = wait_for(lambda: (lambda v: v if v and v["ok"] else None)(latest(pulsed.home, "network:local")), 10,
                      what="the loopback target up")
        assert up["dns_ok"] is True and up["http_status"] == 200 and up["latency_ms"] >= 0 and up["error"] is None
        nowhere = wait_for(lambda: latest(pulsed.home, "network:nowhere"), 10, what="the unresolvable target")
        assert nowhere["ok"] is False and nowhere["dns_ok"] is False and nowhere["error"].startswith("dns:")
    finally:
        server.shutdown()
        server.server_close()
    down = wait_for(lambda: (lambda v: v if v and not v["ok"] else None)(latest(pulsed.home, "network:local")), 5,
                    what="the loopback target down once its server stopped")
    assert down["http_status"] is None and down["error"].startswith("http:")
    wait_for(lambda: "woken by watcher (network:local)" in pulsed.log_text(), 2, what="a wake on going down")
    assert not pulsed.events("error")   # a target being down is a vital, not an error of the watcher


# -- the runner: a watcher that raises or hangs does not stop the others -------------------------------------

class Good(Watcher):
    name = key = "good"
    interval_ms = 50

    def __init__(self):
        self.n = 0

    def collect(self):
        self.n += 1
        return {"n": self.n}

    def should_wake(self, window):
        return window[-1].data["n"] == 3


class Raising(Watcher):
    name = key = "raising"
    interval_ms = 50

    def collect(self):
        raise RuntimeError("boom")


class Hanging(Watcher):
    name = key = "hanging"
    interval_ms = 50
    timeout_s = 0.2

    def __init__(self):
        self.release = threading.Event()
        self.running = 0
        self.most_at_once = 0
        self.calls = 0

    def collect(self):
        self.calls += 1
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            self.release.wait(10)
            return {"late": True}
        finally:
            self.running -= 1


class NotJson(Watcher):
    name = key = "not-json"
    interval_ms = 50

    def collect(self):
        return {"value": float("nan")}


def drive(runner: WatcherRunner, seconds: float) -> None:
    """What the harness loop does: poll the runner's fds, then run its timers."""
    deadline = time.monotonic() + seconds
    while (now := time.monotonic()) < deadline:
        poller = zmq.Poller()
        for item in runner.handlers:
            poller.register(item, zmq.POLLIN)
        wake_at = min(t for t in (runner.next_timer(), deadline) if t is not None)
        for item, _ in poller.poll(max(0.0, wake_at - now) * 1000):
            if item in runner.handlers:
                runner.handlers[item]()
        runner.on_timer(time.monotonic())


@pytest.fixture
def runner_parts(tmp_path):
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(f"ipc://{tmp_path}/w.ipc")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"ipc://{tmp_path}/w.ipc")
    vitals_conn = vitalsdb.open_vitals(tmp_path / "vitals.db")
    events_conn = eventsdb.open_events(tmp_path / "events.db")
    yield pull, push, vitals_conn, events_conn
    for closable in (push, pull, vitals_conn, events_conn):
        closable.close()
    ctx.term()


def test_a_watcher_that_raises_or_hangs_does_not_stop_the_others(runner_parts):
    pull, push, vitals_conn, events_conn = runner_parts
    good, hanging = Good(), Hanging()
    runner = WatcherRunner([good, Raising(), hanging, NotJson()], vitals_conn=vitals_conn, events_conn=events_conn,
                           wake_sock=push, source="test", config=configmod.Config(), log=logging.getLogger("test"))
    try:
        drive(runner, 1.0)
        assert hanging.calls == 1 and hanging.most_at_once == 1   # skipped while stuck, never twice at once
        good_vitals = vitalsdb.vitals_window(vitals_conn, "good", 0)
        assert len(good_vitals) >= 10 and [v.data["n"] for v in good_vitals] == list(range(1, len(good_vitals) + 1))
        assert not vitalsdb.vitals_window(vitals_conn, "raising", 0)
        assert not vitalsdb.vitals_window(vitals_conn, "not-json", 0)

        recorded = eventsdb.read_events(events_conn, types=["error"])
        errors = {e.target: e for e in recorded}
        assert set(errors) == {"watcher:raising", "watcher:hanging", "watcher:not-json"}
        raised = errors["watcher:raising"]
        assert raised.source == "test" and raised.data["message"] == "RuntimeError: boom"
        assert "Traceback" in raised.data["traceback"]
        # one event, its repeats counted in its run (an event per [store] error_repeat_s at most)
        assert [e.target for e in recorded].count("watcher:raising") == 1
        assert {run.target: run.total for run in errorruns.error_runs(events_conn)}["watcher:raising"] >= 5
        assert errors["watcher:hanging"].data["message"].startswith("hung:")
        assert errors["watcher:hanging"].data["count"] == 1
        assert "not JSON" in errors["watcher:not-json"].data["message"]

        assert pull.poll(1000), "no wake arrived"
        assert codec.decode(pull.recv(), doorbells.Wake) == doorbells.Wake("test", reason="good")
        assert not pull.poll(100)   # should_wake was true once

        hanging.release.set()       # the stuck collect returns: its sample is kept and it is collected again
        drive(runner, 0.5)
        assert vitalsdb.vitals_window(vitals_conn, "hanging", 0)
        assert hanging.calls >= 2 and hanging.most_at_once == 1
    finally:
        hanging.release.set()
        runner.close()


def test_sample_now_collects_at_once_between_intervals(runner_parts):
    _, push, vitals_conn, events_conn = runner_parts
    good = Good()
    good.interval_ms = 60_000
    runner = WatcherRunner([good], vitals_conn=vitals_conn, events_conn=events_conn, wake_sock=push,
                           source="test", config=configmod.Config(), log=logging.getLogger("test"))
    try:
        drive(runner, 0.2)
        assert good.n == 1
        runner.sample_now(good)
        drive(runner, 0.2)
        assert [v.data["n"] for v in vitalsdb.vitals_window(vitals_conn, "good", 0)] == [1, 2]
    finally:
        runner.close()


def test_a_wake_nobody_takes_yet_is_offered_again(tmp_path):
    """At the watcher's start (or while the tick restarts) the wake socket has no peer yet."""
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    for option, value in ((zmq.LINGER, 0), (zmq.IMMEDIATE, 1), (zmq.RECONNECT_IVL, 10)):
        push.setsockopt(option, value)
    push.connect(f"ipc://{tmp_path}/late.ipc")
    vitals_conn = vitalsdb.open_vitals(tmp_path / "vitals.db")
    events_conn = eventsdb.open_events(tmp_path / "events.db")
    runner = WatcherRunner([], vitals_conn=vitals_conn, events_conn=events_conn, wake_sock=push, source="test",
                           config=configmod.Config(), log=logging.getLogger("test"))
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    try:
        runner.ring("process-alive:x")
        assert runner.next_timer() is not None   # it will offer it again
        pull.bind(f"ipc://{tmp_path}/late.ipc")
        drive(runner, 0.3)
        assert pull.poll(1000)
        assert codec.decode(pull.recv(), doorbells.Wake) == doorbells.Wake("test", reason="process-alive:x")
        assert runner.next_timer() is None and not pull.poll(100)   # delivered once, then no more offers
    finally:
        runner.close()
        for closable in (push, pull, vitals_conn, events_conn):
            closable.close()
        ctx.term()


# -- vitals gc ---------------------------------------------------------------------------------------------------

def test_vitals_gc_deletes_old_keeps_new_and_lets_writers_in(tmp_path):
    path = tmp_path / "vitals.db"
    conn = vitalsdb.open_vitals(path)
    now = time.time()
    old = [enginerpc.Vital("system-resource", now - 25 * 3600 + i / 1000, {"i": i}) for i in range(20_000)]
    vitalsdb.append_vitals(conn, old)
    vitalsdb.append_vitals(conn, [enginerpc.Vital("system-resource", now - 60, {"fresh": True})])

    waits: list[float] = []
    stop = threading.Event()

    def writer():   # another process's watchers, writing while gc runs
        other = vitalsdb.open_vitals(path)
        while not stop.is_set():
            t0 = time.monotonic()
            vitalsdb.append_vitals(other, [enginerpc.Vital("engine:x", time.time(), {})])
            waits.append(time.monotonic() - t0)
            time.sleep(0.002)
        other.close()

    thread = threading.Thread(target=writer)
    thread.start()
    gc = VitalsGc(conn, 24 * 3600, logging.getLogger("test"), time.monotonic())
    steps = 0
    try:
        deadline = time.monotonic() + 30
        while True:
            time.sleep(max(0.0, gc.next_timer() - time.monotonic()))
            gc.on_timer(time.monotonic())
            steps += 1
            if gc.cutoff is None:
                break
            assert time.monotonic() < deadline
    finally:
        stop.set()
        thread.join()
    assert steps >= 20                     # small transactions, not one big one
    assert gc.deleted == 20_000
    remaining = [v.data for v in vitalsdb.vitals_window(conn, "system-resource", 0)]
    assert remaining == [{"fresh": True}]
    assert len(waits) > 10 and max(waits) < 0.5, f"a writer waited {max(waits):.3f} s"
    conn.close()


def test_vitals_gc_runs_in_the_watcher_at_start_with_the_configured_retention(pulsed):
    pulsed.home.mkdir(parents=True)
    conn = vitalsdb.open_vitals(pulsed.home / "vitals.db")
    now = time.time()
    vitalsdb.append_vitals(conn, [enginerpc.Vital("process-alive:old", now - 2 * 3600 - i, {"alive": True})
                               for i in range(3_000)])
    vitalsdb.append_vitals(conn, [enginerpc.Vital("process-alive:recent", now - 30 * 60, {"alive": True})])
    conn.close()
    (pulsed.home / "config.toml").write_text("[store]\nvitals_retention_h = 1\n")
    pulsed.start(env=SLOW)
    wait_for(lambda: not vitals_of(pulsed.home, "process-alive:old"), 10, what="vitals older than 1 h deleted")
    assert len(vitals_of(pulsed.home, "process-alive:recent")) == 1
    wait_for(lambda: "vitals gc: deleted 3000 vitals older than 1.0 h" in pulsed.log_text(), 5, what="the gc logged")


def test_a_match_never_counts_pulses_own_processes_and_status_says_when_it_is_ambiguous(pulsed, tracker, tmp_path):
    """A process titled "pulse: ..." (a worker, a keeper) or running pulsectl is never the process;
    a second ordinary match is reported, the oldest watched. A JSON pidfile names the pid at a key."""
    first = subprocess.Popen(["sleep", "3600.777"], start_new_session=True)
    tracker.add(first.pid)
    pulse_own = subprocess.Popen([sys.executable, "-c", "import setproctitle, time; "
                                  "setproctitle.setproctitle('pulse: keep x sleep 3600.777'); time.sleep(60)"],
                                 start_new_session=True)
    tracker.add(pulse_own.pid)
    lock = tmp_path / "gateway.lock"
    lock.write_text(json.dumps({"pid": first.pid, "port": 18789}))
    configure(pulsed, watch_process_toml("svc", match="sleep 3600[.]777")
              + f'\n[[process]]\nname = "locked"\npidfile = {{ path = "{lock}", key = "pid" }}\n')
    wait_for(lambda: "pulse: keep" in " ".join(psutil.Process(pulse_own.pid).cmdline()), 10, what="the title set")
    pulsed.start()
    one = wait_for(lambda: latest(pulsed.home, "process-alive:svc"), 10, what="a sample")
    assert one["alive"] and one["pid"] == first.pid and one["matches"] == 1
    assert wait_for(lambda: latest(pulsed.home, "process-alive:locked"), 10)["pid"] == first.pid
    second = subprocess.Popen(["sleep", "3600.777"], start_new_session=True)
    tracker.add(second.pid)
    wait_for(lambda: (latest(pulsed.home, "process-alive:svc") or {}).get("matches") == 2, 15, what="two matches seen")
    def svc():      # pulsed's view comes with the watcher's next heartbeat
        shown = json.loads(pulsed.ctl("status", "--json").stdout)
        return next((p for p in shown["processes"] if p["name"] == "svc" and p["matches"] == 2), None)
    assert wait_for(svc, 10, what="status says two match")["pid"] == first.pid
    assert "2 processes match (the oldest is watched)" in pulsed.ctl("status").stdout
