"""The operator's verbs for a guarded process, its kept output, its default cwd, and a reload that
says what it did: real processes through a real pulsed."""

from __future__ import annotations

import json
import socket
import textwrap

import psutil
import pytest
from click.testing import CliRunner

from pulse.cli.group import cli
from pulse.core import guarded
from support import init_home, wait_for

FAST_TICK = {"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "100"}

# A guarded process that says where it runs and which run it is, and keeps a child (its tree).
SERVICE = textwrap.dedent("""
    import os, subprocess, sys, time
    runs = os.path.join(os.getcwd(), sys.argv[1] + ".runs")
    n = int(open(runs).read()) + 1 if os.path.exists(runs) else 1
    open(runs, "w").write(str(n))
    child = subprocess.Popen(["sleep", "3600"])
    print(f"run {n} of {sys.argv[1]} in {os.getcwd()}, child {child.pid}", flush=True)
    time.sleep(3600)
""")


def service(home, name: str) -> str:
    """A [[process]] table whose restart runs SERVICE as `service.py NAME` (relative: found in the cwd)."""
    (home / "service.py").write_text(SERVICE)
    return textwrap.dedent(f"""
        [[process]]
        name = "{name}"
        match = "service.py {name}$"
        restart = ["python3", "service.py", "{name}"]
        stop_timeout_s = 3
    """)


def alive(pulsed, name: str, not_pid: int | None = None) -> int:
    """The pid the watcher sees alive for `name` (another than not_pid)."""
    data = wait_for(lambda: pulsed.vital(f"process-alive:{name}", lambda d: d["alive"] and d["pid"] != not_pid),
                    20, what=f"{name} alive")
    return data["pid"]


def said(pulsed, name: str, run: int) -> None:
    """Wait until run `run` of the service has written its first line to its log."""
    log = pulsed.home / "logs" / f"process-{name}.log"
    wait_for(lambda: log.exists() and f"run {run} of {name}" in log.read_text(), 20, what=f"run {run} of {name} said")


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def gone(procs: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)


def ctl_ok(pulsed, *args: str):
    out = pulsed.ctl(*args)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout


def test_verbs_logs_after_crashes_and_a_stop_held_across_a_pulsed_restart(pulsed, tracker):
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(service(pulsed.home, "svc"))
    pulsed.start(env=FAST_TICK)
    pid = alive(pulsed, "svc")           # not running at first: processWatchdog starts it, in the home
    tracker.add(pid)
    # Three crashes, each restarted; the first run's output is still there after them
    for run in range(1, 4):
        said(pulsed, "svc", run)
        victims = tree(pid)
        tracker.add(*(p.pid for p in victims))   # its child outlives a SIGKILL of it alone: the test's to end
        psutil.Process(pid).kill()
        psutil.wait_procs(victims[:1], 5)
        pid = alive(pulsed, "svc", not_pid=pid)
        tracker.add(pid)
    said(pulsed, "svc", 4)
    out = ctl_ok(pulsed, "process", "logs", "svc", "-n", "100")
    assert f"run 1 of svc in {pulsed.home}," in out           # cwd defaulted to the home, and kept
    assert "run 4 of svc" in out and out.count("[pulse] svc started") == 4
    assert "ended" in out and "killed by SIGKILL" in out

    # restart: stop the tree, start one new copy
    victims = tree(pid)
    out = ctl_ok(pulsed, "process", "restart", "svc")
    assert "svc: restarted, pid" in out
    new = int(out.split("pid ")[1].split()[0])
    tracker.add(new)
    assert new != pid and gone(victims)
    said(pulsed, "svc", 5)

    # stop: the whole tree, and held down, across a restart of pulsed
    victims = tree(new)
    assert len(victims) == 2
    out = ctl_ok(pulsed, "process", "stop", "svc")
    assert "svc: stopped" in out and "held down until `pulsectl process start svc`" in out
    assert gone(victims)
    pulsed.terminate()
    pulsed.start(env=FAST_TICK)
    wait_for(lambda: pulsed.vital("process-alive:svc", lambda d: not d["alive"]), 10, what="seen down")
    ticks = len(pulsed.ticks())
    wait_for(lambda: len(pulsed.ticks()) >= ticks + 10, 15, what="ten more ticks")
    assert not pulsed.vital("process-alive:svc")["alive"]
    listed = [json.loads(line) for line in ctl_ok(pulsed, "process", "list", "--json").splitlines()]
    assert listed == [{"name": "svc", "state": "stopped", "pid": None, "rss_mb": None}]
    assert pulsed.ctl("process", "status", "svc").returncode == 3

    # start: running again, and no longer held
    out = ctl_ok(pulsed, "process", "start", "svc")
    started = int(out.split("pid ")[1].split()[0])
    tracker.add(started)
    assert alive(pulsed, "svc") == started
    assert "svc: alive" in ctl_ok(pulsed, "process", "status", "svc")
    actions = [(e["source"], e["target"], e["data"]["action"]) for e in pulsed.events("operator")]
    assert actions == [("pulsectl", "svc", a) for a in ("process-restart", "process-stop", "process-start")]
    # and a crash after the start is restarted as before (the hold is over)
    tracker.add(*(p.pid for p in tree(started)))
    psutil.Process(started).kill()
    last = alive(pulsed, "svc", not_pid=started)
    tracker.add(last)
    # Its keeper was forked by this home's keepers' server, not a fresh interpreter: a few MiB of its own
    servers = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0] == f"pulse: keepers ({pulsed.home})"]
    assert len(servers) == 1
    keeper = psutil.Process(last).parent()
    assert keeper.cmdline()[0] == f"pulse: keep svc ({pulsed.home})"
    assert keeper.parent().pid == servers[0].pid
    assert keeper.memory_full_info().uss < 6 * 2**20
    # The server never waits for a keeper: the kernel reaps one that ended, and no zombie stays
    ctl_ok(pulsed, "process", "stop", "svc")
    wait_for(lambda: not guarded.living(keeper.pid), 10, what="its keeper ended")
    assert not [c.pid for c in servers[0].children() if c.status() == psutil.STATUS_ZOMBIE]


def test_reload_stops_a_removed_process_and_says_a_worker_that_failed(pulsed, tracker):
    init_home(pulsed.home)
    both = service(pulsed.home, "gone") + service(pulsed.home, "kept").replace(
        "stop_timeout_s = 3", "stop_timeout_s = 3\nkeep_on_remove = true")
    (pulsed.home / "config.toml").write_text(both)
    pulsed.start(env=FAST_TICK)
    gone_pid, kept_pid = alive(pulsed, "gone"), alive(pulsed, "kept")
    tracker.add(gone_pid, kept_pid)
    said(pulsed, "gone", 1)
    said(pulsed, "kept", 1)
    gone_tree, kept_tree = tree(gone_pid), tree(kept_pid)
    assert len(gone_tree) == 2
    tracker.add(*(p.pid for p in kept_tree))
    # The web worker enabled on a port another process holds: it cannot come back
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (pulsed.home / "config.toml").write_text(
            f'[web]\nenabled = true\nlisten = "127.0.0.1:{port}"\n\n' + service(pulsed.home, "added"))
        check = pulsed.ctl("check-config")
        assert check.returncode == 78 and f"127.0.0.1:{port} is already in use" in check.stderr
        out = pulsed.ctl("reload")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.strip().startswith("web: failed") for line in lines), out.stdout
    assert not any("web: started" in line for line in lines)
    assert f"[[process]] gone: removed, stopped (pid {gone_pid}" in out.stdout
    assert "[[process]] kept: removed, left running (keep_on_remove)" in out.stdout
    assert "[[process]] added: added, running (pid" in out.stdout
    assert gone(gone_tree)                                   # nothing left of its tree
    assert not gone(kept_tree)
    tracker.add(alive(pulsed, "added"))
    stops = [e for e in pulsed.events("effect") if e["data"]["kind"] == "stop-process"]
    assert [(e["target"], e["data"]["origin"]) for e in stops] == [("gone", "survival")]


def test_a_process_name_given_to_the_worker_verbs_points_at_process_verbs(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[[process]]\nname = "web1"\nmatch = "x"\n')
    for verb in ("restart", "stop", "start"):
        result = CliRunner().invoke(cli, ["--home", str(home), verb, "web1"])
        assert result.exit_code == 2
        assert f"'web1' is a [[process]], not a worker: `pulsectl process {verb} web1`" in result.output
    result = CliRunner().invoke(cli, ["--home", str(home), "restart", "nope"])
    assert result.exit_code == 2 and "not a worker" not in result.output and "watcher" in result.output


@pytest.mark.parametrize("verb", ["restart", "start"])
def test_a_process_without_a_restart_argv_cannot_be_started(tmp_path, verb):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[[process]]\nname = "w"\nmatch = "x"\n')
    result = CliRunner().invoke(cli, ["--home", str(home), "process", verb, "w"])
    assert result.exit_code == 2 and "has no restart argv" in result.output



def test_the_report_says_an_operator_s_word_on_a_process_as_such():
    from pulse.core.wire import eventmsgs
    from pulse.report.analyst import operator_phrase
    assert operator_phrase(eventmsgs.now_event("operator", "pulsectl", "svc", action="process-stop")) == "stopped the svc process"
    assert operator_phrase(eventmsgs.now_event("operator", "web", "svc", action="process-restart")) == "restarted the svc process"
    assert operator_phrase(eventmsgs.now_event("operator", "pulsed", "tick", action="stop")) == "stopped the tick worker"


def test_the_keeper_appends_and_rotates_its_log_by_size_keeping_the_start(tmp_path):
    """Past LOG_MAX_BYTES the log is rotated into gzipped copies, the newest .1.gz: what came first
    (the start line, the early output) is in a copy, never truncated away."""
    import gzip
    import subprocess
    import sys

    from pulse.effects import keeper
    log = tmp_path / "process-big.log"
    log.write_bytes(b"from an earlier run\n")
    lines = keeper.LOG_MAX_BYTES // 1000 + 100
    writer = f"import sys\nfor i in range({lines}): sys.stdout.write(f'{{i:08d}} ' + 'x' * 990 + '\\n')"
    out = subprocess.run([sys.executable, "-m", "pulse.effects.keeper", str(tmp_path), "big", str(log), "--",
                          sys.executable, "-c", writer], capture_output=True, timeout=60)
    assert out.returncode == 0
    wait_for(lambda: "ended" in log.read_text(errors="replace"), 30, what="the keeper's end line")
    copy = gzip.decompress((tmp_path / "process-big.log.1.gz").read_bytes()).decode()
    assert copy.startswith("from an earlier run\n[pulse] big started, pid ")
    assert "00000000 xxx" in copy
    tail = log.read_text()
    assert f"{lines - 1:08d} xxx" in tail and "ended at " in tail and "exit code 0\n" in tail
    assert len(tail) < keeper.LOG_MAX_BYTES


def test_the_keeper_is_done_with_an_exit_once_the_output_ended(tmp_path, monkeypatch):
    """The exit is recorded once the process's output has ended, not DRAIN_AFTER_EXIT_S after the exit
    (a restart waits on that record): the drain is for a grandchild that holds the pipe open, and
    what that one says before letting go is still in the tail."""
    import subprocess
    import threading

    from pulse.effects import keeper
    monkeypatch.setattr(keeper, "DRAIN_AFTER_EXIT_S", 600.0)
    # exits at once; a grandchild holds the pipe a moment longer, says a line, and lets go
    child = subprocess.Popen(["sh", "-c", "(sleep 0.3; echo from the grandchild) & echo from the child; exit 3"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    path = tmp_path / "process-p.log"
    log = keeper.open_log(str(path))
    copied: dict = {}
    copying = threading.Thread(target=lambda: copied.update(tail=keeper._copy_output(child, log, str(path))),
                               daemon=True)
    copying.start()
    copying.join(60)
    assert not copying.is_alive(), "still draining after the output ended"
    assert copied["tail"].splitlines() == ["from the child", "from the grandchild"]
    assert child.wait(5) == 3
    log.close()


def test_a_kept_process_starts_with_sigint_and_sighup_at_their_defaults(tmp_path):
    """Workers ignore SIGINT and SIGHUP, and an ignored signal stays ignored across exec: the keeper
    starts its process with both at their defaults, whoever started the keeper."""
    import signal
    import subprocess
    import sys

    def ignoring():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log = tmp_path / "process-sig.log"
    subprocess.run([sys.executable, "-m", "pulse.effects.keeper", str(tmp_path), "sig", str(log), "--",
                    "grep", "SigIgn", "/proc/self/status"], preexec_fn=ignoring, capture_output=True, timeout=60,
                   check=True)
    said = wait_for(lambda: "ended" in log.read_text() and log.read_text(), 30, what="the keeper's end line")
    ignored = int(said.split("SigIgn:")[1].split()[0], 16)
    assert not ignored & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGHUP - 1)), said


def executor_context(tmp_path, toml: str):
    from pulse.core import config as configmod
    from pulse.core.home import Paths
    from pulse.effects import kinds
    from pulse.store import eventsdb
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(toml)
    eventsdb.open_events(home / "events.db").close()
    cfg = configmod.slice_of(configmod.load(home / "config.toml", {}), "executor")
    return kinds.EffectContext(cfg, home / "objects", 10.0, paths=Paths(home, tmp_path / "run"))


def test_a_survival_restart_queued_before_an_operator_stop_is_refused(tmp_path):
    """The executor's side of the hold: a restart survival queued before the operator's stop was
    folded never starts a copy behind the stop; the operator's own start does."""
    from pulse.core.wire import enginerpc, eventmsgs
    from pulse.effects import kinds
    from pulse.store import eventsdb
    ctx = executor_context(tmp_path, '[[process]]\nname = "svc"\nmatch = "^never-such$"\nrestart = ["true"]\n')
    conn = eventsdb.open_events(ctx.paths.events_db)
    eventsdb.append_events(conn, [eventmsgs.now_event("operator", "pulsectl", "svc", action="process-stop")])
    survival = enginerpc.Effect(kind="restart-process", target="svc", origin="survival", id="e1")
    with pytest.raises(kinds.EffectFailed) as err:
        kinds.run_restart(survival, ctx)
    assert err.value.reason == "held" and "pulsectl process start svc" in str(err.value.error)
    eventsdb.append_events(conn, [eventmsgs.now_event("operator", "pulsectl", "svc", action="process-start")])
    conn.close()
    assert kinds.run_restart(survival, ctx)["code"] == 0          # `true` ran, and exited 0 within its grace


def test_stop_process_takes_a_removed_table_only_from_survival_or_an_operator(tmp_path, tracker):
    import subprocess

    from pulse.core.wire import enginerpc, eventmsgs
    from pulse.effects import kinds
    ctx = executor_context(tmp_path, "")
    victim = subprocess.Popen(["sleep", "3600.9191"], start_new_session=True)
    tracker.add(victim.pid)
    # Popen returns once the exec began; the kernel shows the new argv a moment later
    wait_for(lambda: psutil.Process(victim.pid).cmdline() == ["sleep", "3600.9191"], 10, what="the victim's argv")
    definition = {"name": "gone", "match": "^sleep 3600.9191$", "stop_timeout_s": 3}
    agent = enginerpc.Effect(kind=eventmsgs.STOP_PROCESS, target="gone", origin="agent", params={"definition": definition})
    with pytest.raises(kinds.EffectFailed):
        kinds.run_stop(agent, ctx)
    assert victim.poll() is None
    survival = enginerpc.Effect(kind=eventmsgs.STOP_PROCESS, target="gone", origin="survival",
                           params={"why": "removed", "reload": 7, "definition": definition})
    assert kinds.run_stop(survival, ctx)["stopped"] == [victim.pid]
    assert victim.wait(5) == -15


def test_logs_follow_prints_what_is_appended_across_a_rotation(tmp_path, tracker):
    import subprocess

    from support import PULSECTL
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    log = home / "logs" / "process-svc.log"
    log.write_text("old line\nlast line\n")
    follower = subprocess.Popen([PULSECTL, "--home", str(home), "process", "logs", "-f", "-n", "1", "svc"],
                                stdout=subprocess.PIPE, text=True)
    tracker.add(follower.pid)
    try:
        assert follower.stdout.readline() == "last line\n"
        with open(log, "a") as f:
            f.write("appended\n")
        assert follower.stdout.readline() == "appended\n"
        with open(log, "r+") as f:       # a rotation empties it in place (copy-then-truncate) ...
            f.truncate(0)
        with open(log, "a") as f:        # ... and less is written after it than was there before
            f.write("after rotation\n")
        assert follower.stdout.readline() == "after rotation\n"
    finally:
        follower.terminate()
        follower.wait(5)
