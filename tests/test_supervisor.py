"""pulsed itself: start, status, stop, signals, lock, config, restart policy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from support import PULSECTL, comm, engine_rule, init_home, wait_for

WORKERS = ("watcher", "tick", "executor", "engine")


@pytest.mark.fresh_home   # pulsed's first run makes the home
def test_first_run_makes_home_and_runs_every_worker(pulsed):
    pulsed.start()
    home = pulsed.home
    assert (home / "config.toml").stat().st_mode & 0o777 == 0o600
    assert (home / "engine" / ".git").is_dir() and (home / "staging").is_dir()
    assert os.stat(pulsed.paths.runtime).st_mode & 0o777 == 0o700

    out = pulsed.ctl("status")
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split() == ["NAME", "STATE", "PID", "UPTIME", "CRASHES", "RESTARTED", "LAST", "EXIT", "HEARTBEAT"]
    assert [r.split()[:2] for r in rows[:4]] == [[w, "running"] for w in WORKERS]
    assert rows[4].startswith(f"pulsed pid {pulsed.proc.pid},")

    data = json.loads(pulsed.ctl("status", "--json").stdout)
    assert list(data) == ["version", "supervisor", "workers", "engine_commit", "processes", "web_url", "files", "fleet",
                          "fresh", "dirs", "telemetry", "exit", "history"]
    assert data["version"] == 1 and data["web_url"] is None          # no web worker unless [web] enabled
    assert data["fleet"] is None                                     # no fleet worker unless [fleet] enabled
    assert data["telemetry"] is None                                 # no receiver unless [telemetry] enabled
    assert len(data["engine_commit"]) >= 40 and data["processes"] == []
    assert list(data["supervisor"]) == ["pid", "uptime_s", "home", "started_at"]
    assert data["supervisor"]["home"] == str(home)
    for w in data["workers"]:
        assert list(w) == ["name", "pid", "state", "restarts", "uptime_s", "heartbeat_age_s", "last_exit",
                           "crashes", "operator_restarts", "started_at", "heartbeat_at"]
        assert w["state"] == "running" and w["last_exit"] is None and w["restarts"] == 0


def test_process_titles(pulsed):
    """ps names the worker and the instance (three Pulses on a host told apart); comm, 15 bytes, the worker."""
    status = pulsed.start().status()
    for w in status.workers:
        assert open(f"/proc/{w.pid}/comm").read().strip() == f"pulse: {w.name}"[:15]
        assert psutil.Process(w.pid).cmdline()[0] == f"pulse: {w.name} [{pulsed.home.name}]"


def test_sigterm_stops_in_reverse_order_exit_0_and_removes_sockets(pulsed):
    pulsed.start()
    tree = pulsed.tree()
    sockets = list(pulsed.paths.runtime.glob("*.ipc"))
    assert {s.name for s in sockets} >= {"control.ipc", "heartbeat.ipc", "wake.ipc", "doorbell.ipc", "engine.ipc"}
    assert pulsed.terminate() == 0
    assert not list(pulsed.paths.runtime.glob("*.ipc"))
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree), 2,
             what="the whole tree gone")
    exits = [e["target"] for e in pulsed.events("worker-exited")]
    assert exits == list(reversed(WORKERS))
    assert all(e["data"]["code"] == 0 for e in pulsed.events("worker-exited"))
    types = [e["type"] for e in pulsed.events()]
    assert types[0] == "supervisor-started" and "supervisor-stopping" in types


def test_sigterm_while_the_engine_loads_the_agents_modules_is_a_clean_stop(pulsed, tmp_path):
    """A SIGTERM that lands inside an agent module's import is not that module's error: the
    engine finishes loading, never says ready, and exits 0; nobody waits out stop_grace_ms."""
    loading = tmp_path / "loading"
    engine_rule(pulsed, "slow", f"import pathlib, time\npathlib.Path({str(loading)!r}).touch()\ntime.sleep(0.5)\n")
    # a loaded machine may keep the engine's import past the tests' 3 s ready timeout: not what is tested here
    pulsed.start(env={"PULSE_STOP_GRACE_MS": "30000", "PULSE_READY_TIMEOUT_MS": "15000"}, wait=False)
    wait_for(loading.exists, 15, what="the engine importing rules/slow.py")
    assert pulsed.terminate(timeout=60) == 0
    log = pulsed.log_text()
    assert "SIGKILL" not in log and "SystemExit" not in log
    engine = [e for e in pulsed.events("worker-exited") if e["target"] == "engine"]
    assert [(e["data"]["code"], e["data"]["signal"]) for e in engine] == [(0, None)]
    assert not [e for e in pulsed.events("worker-ready") if e["target"] == "engine"]


def test_sigterm_to_the_whole_process_group_loses_no_event(pulsed):
    """`kill -- -PGID` (or `timeout pulsed`) signals pulsed's process group: pulsed alone gets it, and
    stops the workers in order, the event writer last, so every lifecycle event reaches events.db."""
    pulsed.start()
    forkserver = psutil.Process(pulsed.forkserver_pid())
    assert os.getpgid(forkserver.pid) != os.getpgid(pulsed.proc.pid)
    os.killpg(os.getpgid(pulsed.proc.pid), signal.SIGTERM)
    assert pulsed.proc.wait(15) == 0
    assert "not written" not in pulsed.log_text() and "are restarted" not in pulsed.log_text()
    assert [e["target"] for e in pulsed.events("worker-exited") if e["target"] in WORKERS] == list(reversed(WORKERS))
    assert "supervisor-stopping" in [e["type"] for e in pulsed.events()]


def test_sigint_is_a_clean_stop_too(pulsed):
    pulsed.start()
    pulsed.proc.send_signal(signal.SIGINT)
    assert pulsed.proc.wait(10) == 0


def test_pulsectl_stop_stops_the_daemon(pulsed):
    pulsed.start()
    out = pulsed.ctl("stop")
    assert out.returncode == 0, out.stderr
    assert pulsed.proc.wait(10) == 0


def test_second_instance_refused(pulsed, tracker):
    pulsed.start()
    import subprocess

    from support import PULSED
    second = subprocess.run([PULSED, "--home", str(pulsed.home)], capture_output=True, text=True, timeout=20,
                            env=pulsed.env)
    assert second.returncode == 2
    assert f"already running on {pulsed.home}" in second.stderr and str(pulsed.proc.pid) in second.stderr
    assert pulsed.ctl("status").returncode == 0


@pytest.mark.parametrize("text, key", [
    ("[timings]\nheartbeat_ms = 'fast'\n", "$.timings.heartbeat_ms"),
    ("[timings]\nhartbeat_ms = 100\n", "$.timings.hartbeat_ms"),
    ("[log]\nlevel = 'loud'\n", "$.log.level"),
    ("[timings\n", "not valid TOML"),
])
def test_bad_config_exits_78_naming_the_key(pulsed, text, key):
    pulsed.home.mkdir()
    (pulsed.home / "config.toml").write_text(text)
    pulsed.start(wait=False)
    assert pulsed.proc.wait(20) == 78
    out = (pulsed.home.parent / "pulsed.out").read_text()
    assert key in out and "config.toml" in out


@pytest.mark.fresh_home   # pulsed's first run makes the home
def test_first_run_that_cannot_make_the_home_says_why_and_exits_78(pulsed, tmp_path):
    (tmp_path / "bin").mkdir()                      # a PATH without git: the engine repo cannot be made
    pulsed.start(env={"PATH": str(tmp_path / "bin")}, wait=False)
    assert pulsed.proc.wait(30) == 78
    assert "git is required" in (pulsed.home.parent / "pulsed.out").read_text()
    assert not pulsed.paths.socket_file("control").exists()


def test_bad_override_exits_78_naming_the_variable(pulsed):
    pulsed.start(env={"PULSE_HEARTBEAT_MS": "soon"}, wait=False)
    assert pulsed.proc.wait(20) == 78
    assert "PULSE_HEARTBEAT_MS" in (pulsed.home.parent / "pulsed.out").read_text()


def status_both_ways(pulsed, *args: str) -> subprocess.CompletedProcess:
    """`pulsectl status` served plain (no click) and through click (`--home=` is not a plain
    invocation): the same exit code, the same errors, the same workers in the same states."""
    plain = pulsed.ctl("status", *args)
    clicked = subprocess.run([PULSECTL, f"--home={pulsed.home}", "status", *args], capture_output=True,
                             text=True, timeout=30)
    assert (plain.returncode, plain.stderr) == (clicked.returncode, clicked.stderr)
    rows = [[line.split()[:2] for line in out.stdout.splitlines()[:-1]] for out in (plain, clicked)]
    assert rows[0] == rows[1]
    return plain


def test_status_exit_codes(pulsed):
    pulsed.start()
    assert status_both_ways(pulsed).returncode == 0
    assert pulsed.ctl("stop", "engine").returncode == 0
    out = status_both_ways(pulsed)
    assert out.returncode == 3 and "stopped" in out.stdout
    pulsed.proc.kill()                       # leaves a stale control socket behind
    pulsed.proc.wait(10)
    assert pulsed.paths.socket_file("control").exists()
    started = time.monotonic()
    out = pulsed.ctl("status")
    assert out.returncode == 4 and "not running" in out.stderr
    assert time.monotonic() - started < 3
    assert status_both_ways(pulsed, "--json").returncode == 4


def test_plain_status_never_imports_click(pulsed):
    pulsed.start()
    argv = [sys.executable, "-X", "importtime", "-c", "from pulse.cli import main; main()"]
    plain = subprocess.run([*argv, "--home", str(pulsed.home), "--timeout", "5", "status", "--json"],
                           capture_output=True, text=True, timeout=30)
    assert plain.returncode == 0 and json.loads(plain.stdout)["version"] == 1
    assert " pulse.cli.statusview\n" in plain.stderr and " click\n" not in plain.stderr
    clicked = subprocess.run([*argv, "--home", str(pulsed.home), "status", "--json", "--json"], capture_output=True,
                             text=True, timeout=30)
    assert clicked.returncode == 0 and " click\n" in clicked.stderr


def test_stopped_worker_stays_stopped_across_restart(pulsed):
    pulsed.start()
    assert pulsed.ctl("stop", "engine").returncode == 0
    assert pulsed.terminate() == 0
    pulsed.start(wait=False)
    pulsed.wait_running(names=("watcher", "tick", "executor"))
    assert pulsed.worker("engine").state == "stopped"
    assert pulsed.ctl("start", "engine").returncode == 0
    assert pulsed.worker("engine").state == "running"
    assert pulsed.terminate() == 0
    pulsed.start()       # and a start is remembered too


def test_operator_restarts_never_count_toward_the_limit(pulsed):
    pulsed.start(env={"PULSE_INTENSITY_RESTARTS": "2"})
    for _ in range(5):
        old = pulsed.worker("engine").pid
        out = pulsed.ctl("restart", "engine")
        assert out.returncode == 0, out.stderr
        pulsed.wait_replaced("engine", old)
    assert pulsed.worker("engine").restarts == 5
    assert not pulsed.events("worker-failed")


def test_events_survive_a_pulsed_restart(pulsed):
    pulsed.start()
    assert pulsed.terminate() == 0
    first = pulsed.events()
    pulsed.start()
    assert pulsed.terminate() == 0
    after = pulsed.events()
    assert after[:len(first)] == first
    assert [e["type"] for e in after].count("supervisor-started") == 2


def test_status_lists_the_critical_processes_alive_dead_and_paused(pulsed, tracker):
    argv = ["sleep", "3600.6161"]
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text('[[process]]\nname = "svc"\nmatch = "^sleep 3600.6161$"\n')
    victim = subprocess.Popen(argv, start_new_session=True)
    tracker.add(victim.pid)
    pulsed.start(env={"PULSE_WATCHER_INTERVAL_MS": "100"})

    def process(check):
        data = json.loads(pulsed.ctl("status", "--json").stdout)["processes"]
        return data if data and check(data[0]) else None
    assert wait_for(lambda: process(lambda p: p["alive"]), 10, what="svc alive")[0]["pid"] == victim.pid
    assert pulsed.ctl("pause", "svc", "--for", "10m").returncode == 0
    paused = wait_for(lambda: process(lambda p: p["paused_until"]), 10, what="svc paused")
    assert paused[0]["paused_until"].endswith("Z")                # ISO 8601, not epoch seconds
    victim.kill()
    victim.wait(5)
    wait_for(lambda: process(lambda p: p["alive"] is False), 10, what="svc dead")
    lines = pulsed.ctl("status").stdout.splitlines()
    row = lines[lines.index(next(line for line in lines if line.startswith("PROCESS"))) + 1]
    assert row.split()[:2] == ["svc", "dead,"] and "paused until" in row


# -- every way of stopping is clean: SIGTERM or SIGINT, to pulsed alone, to its process
# group, or to every process of the tree at once; each writes every lifecycle event and exits 0.

def signal_pulsed_alone(pulsed, sig):
    pulsed.proc.send_signal(sig)


def signal_the_group(pulsed, sig):
    """`kill -- -PGID`, `timeout pulsed …`, Ctrl-C in a terminal: pulsed's process group."""
    os.killpg(os.getpgid(pulsed.proc.pid), sig)


def signal_every_process(pulsed, sig):
    """A shutdown that signals every process (an init system's final kill, `pkill -f pulse`): the
    workers and the forkserver get it at the same moment as pulsed."""
    for proc in pulsed.tree():
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


@pytest.mark.parametrize("how", [signal_pulsed_alone, signal_the_group, signal_every_process],
                         ids=lambda f: f.__name__.removeprefix("signal_"))
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_every_way_of_stopping_writes_every_lifecycle_event_and_exits_0(pulsed, how, sig):
    pulsed.start(env={"PULSE_READY_TIMEOUT_MS": "15000", "PULSE_HUNG_AFTER_MS": "5000"})   # no restart from load
    pulsed.wait_running()
    pids = {w.name: w.pid for w in pulsed.status().workers}
    started = len(pulsed.events())
    how(pulsed, sig)
    assert pulsed.proc.wait(15) == 0
    stop = pulsed.log_text().partition(f"{sig.name}: stopping")[2]     # a loaded machine may restart at start-up
    assert stop and "not written" not in stop and "restart" not in stop and "Traceback" not in stop
    events = pulsed.events()
    assert len(events) > started
    stopping = [e for e in events if e["type"] == "supervisor-stopping"]
    assert [e["data"]["exit_code"] for e in stopping] == [0]
    exits = [e for e in events if e["type"] == "worker-exited" and e["target"] in WORKERS
             and e["id"] > stopping[0]["id"]]
    # each worker's exit is that of the copy that ran when the stop came: the one status showed, unless
    # a loaded machine replaced it between that read and the signal (its exit, then its latest start)
    before = [e for e in events if e["id"] < stopping[0]["id"]]
    running = {e["target"]: e["data"]["pid"] for e in before if e["type"] == "worker-started" and e["target"] in WORKERS}
    replaced = {e["data"].get("pid") for e in before if e["type"] == "worker-exited"}
    assert all(running[w] == pids[w] or pids[w] in replaced for w in WORKERS), (running, pids)
    assert {e["target"]: e["data"]["pid"] for e in exits} == running
    assert not [e for e in events if e["type"] == "worker-started" and e["id"] > stopping[0]["id"]]
    if how is not signal_every_process:       # pulsed alone chose the order: the event writer last
        assert [e["target"] for e in exits] == list(reversed(WORKERS))


def test_a_restart_takes_the_spare_which_becomes_that_worker_alone(pulsed):
    pulsed.start()
    spare = pulsed.wait_spare()
    old_tick = pulsed.worker("tick").pid
    os.kill(old_tick, signal.SIGKILL)
    assert pulsed.wait_replaced("tick", old_tick).pid == spare.pid and comm(spare.pid) == "pulse: tick"
    # the next restart takes a new spare: the one that became the tick stays the tick alone
    following = pulsed.wait_spare(other_than=spare.pid)
    old_executor = pulsed.worker("executor").pid
    os.kill(old_executor, signal.SIGKILL)
    assert pulsed.wait_replaced("executor", old_executor).pid == following.pid
    pids = [w.pid for w in pulsed.wait_running().workers]
    assert len(set(pids)) == len(pids) and pulsed.worker("tick").pid == spare.pid
    assert [e["data"]["pid"] for e in pulsed.events("worker-started", "tick")][-1] == spare.pid


def test_killing_the_spare_is_harmless(pulsed):
    pulsed.start()
    spare = pulsed.wait_spare()
    before, events = {w.name: w.pid for w in pulsed.status().workers}, len(pulsed.events())
    spare.kill()
    following = pulsed.wait_spare(other_than=spare.pid)     # forked anew
    status = pulsed.wait_running()
    assert {w.name: w.pid for w in status.workers} == before and all(w.restarts == 0 for w in status.workers)
    assert pulsed.events()[events:] == []                    # not a worker: no event, nothing restarted
    os.kill(before["watcher"], signal.SIGKILL)
    assert pulsed.wait_replaced("watcher", before["watcher"]).pid == following.pid
