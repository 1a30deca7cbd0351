"""The tests' pulsectl (support.pulsectl, through tests/ctlzygote.py) answers as the console script does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from support import CTL_ZYGOTE, PULSECTL, init_home, pulsectl, wait_for


@pytest.mark.parametrize("argv", [
    ["status"],                                   # the plain path: no pulsed here, exit 4 and why
    ["status", "--json"],
    ["task", "list"],                             # the fast path, reading the home
    ["events", "-n", "3", "--type", "nosuch"],    # click's usage error, exit 2
    ["config", "--effective"],
    ["--version"],
    ["task", "add", "--help"],
])
def test_it_answers_as_the_console_script_does(tmp_path, argv):
    init_home(tmp_path / "home")
    args = ["--home", str(tmp_path / "home"), *argv]
    script = subprocess.run([PULSECTL, *args], capture_output=True, text=True, timeout=60)
    forked = pulsectl(args, timeout=60)
    assert (forked.returncode, forked.stdout, forked.stderr) == (script.returncode, script.stdout, script.stderr)


def test_its_environment_and_working_directory_are_the_callers(tmp_path, monkeypatch):
    init_home(tmp_path / "home")
    monkeypatch.chdir(tmp_path)
    shown = pulsectl(["--home", "home", "config", "--effective"], env={**os.environ, "PULSE_HOME": "/nowhere"})
    assert shown.returncode == 0 and "[store]" in shown.stdout, shown.stderr          # --home home, from here
    unset = pulsectl(["status"], env={**os.environ, "PULSE_HOME": str(tmp_path / "home")})
    assert unset.returncode == 4 and str(tmp_path / "home") in unset.stderr, unset.stderr


def test_a_run_past_its_timeout_is_killed_and_said_as_subprocess_says_it(tmp_path):
    init_home(tmp_path / "home")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(subprocess.TimeoutExpired):
        pulsectl(["--home", str(tmp_path / "home"), "events", "-f"], timeout=1)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.status() != "zombie"]
    assert [p.cmdline() for p in left if "ctlzygote.py" not in " ".join(p.cmdline())] == []
    assert pulsectl(["--version"]).returncode == 0            # and the next run is served as ever


def ours() -> list[psutil.Process]:
    """This worker's zygote and what it forked, wherever they were reparented: their command line is
    the zygote's, which names this process; other processes of the worker (a session's LiteLLM) are not."""
    me = str(os.getpid())
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        line = p.info["cmdline"] or []
        if p.info["status"] != psutil.STATUS_ZOMBIE and len(line) >= 3 and line[-3].endswith("ctlzygote.py") \
                and line[-1] == me:
            found.append(p)
    return found


def test_a_run_cut_short_ends_with_its_zygote_and_the_next_run_is_answered_afresh(tmp_path):
    """pytest-timeout's alarm (or ^C) mid-run: the zygote and its run are ended, not left to answer
    the next request with this one's exit."""
    init_home(tmp_path / "home")
    pulsectl(["--version"])                                     # the zygote is up
    assert len(ours()) == 1

    class Cut(Exception):
        pass

    def cut(signum, frame):
        raise Cut
    previous = signal.signal(signal.SIGALRM, cut)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(Cut):
            pulsectl(["--home", str(tmp_path / "home"), "events", "-f"], timeout=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    wait_for(lambda: not ours(), 10, what="the zygote and its run gone")
    script = subprocess.run([PULSECTL, "--version"], capture_output=True, text=True, timeout=60)
    again = pulsectl(["--version"])
    assert (again.returncode, again.stdout) == (0, script.stdout)


def test_a_zygote_started_from_a_thread_outlives_the_thread(tmp_path):
    """Tests call pulsectl from threads (asyncio.to_thread); the zygote a thread started serves the
    next call once that thread has ended, rather than dying with it mid-request."""
    CTL_ZYGOTE.close()
    first = threading.Thread(target=pulsectl, args=(["--version"],))
    first.start()
    first.join()
    zygote = CTL_ZYGOTE.proc
    wait_for(lambda: zygote.poll() is not None or not psutil.pid_exists(first.native_id), 5,
             what="the starting thread gone")
    assert pulsectl(["--version"]).returncode == 0 and CTL_ZYGOTE.proc is zygote and zygote.poll() is None


def test_a_worker_killed_mid_run_takes_its_zygote_and_run_along(tmp_path):
    init_home(tmp_path / "home")
    worker = subprocess.Popen(
        [sys.executable, "-c", "import sys, support; support.pulsectl(sys.argv[1:], timeout=600)",
         "--home", str(tmp_path / "home"), "events", "-f"], cwd=Path(__file__).parent)
    try:
        def theirs() -> list[psutil.Process]:
            return [p for p in psutil.Process(worker.pid).children(recursive=True) if p.status() != "zombie"]
        wait_for(lambda: len(theirs()) == 2, 30, what="its zygote and its run")
        family = theirs()
    finally:
        worker.kill()
        worker.wait()
    wait_for(lambda: not any(p.is_running() and p.status() != "zombie" for p in family), 10,
             what="the zygote and its run ended with their worker")
