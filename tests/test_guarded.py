"""How the watcher and the executor find a [[process]] (pulse.core.guarded), while other threads of
the same worker look at processes too."""

from __future__ import annotations

import re
import subprocess
import threading
import time

import psutil

from pulse.core import guarded

HAMMER_S = 2.0


def test_matching_keeps_its_attrs_while_another_thread_scans_processes():
    """psutil.process_iter caches its Process objects for every thread and sets `.info` on each
    iteration: another thread's process_iter(["cmdline"]) replaced what matching() had read, and
    its sort on create_time raised KeyError (a watcher sample lost). Two threads, for HAMMER_S."""
    sleeps = [subprocess.Popen(["sleep", "3600"]) for _ in range(2)]
    stop, errors, rounds = threading.Event(), [], [0]

    def other_watcher():           # kept()'s scan, as another watcher thread runs it
        while not stop.is_set():
            for proc in psutil.process_iter(["cmdline"]):
                proc.info.get("cmdline")
            stop.wait(0.001)

    def find():
        # Every process matches: the longer the scan, the wider the window (a match's own scan).
        pattern = re.compile(r".")
        try:
            while not stop.is_set():
                found = {p.pid for p in guarded.matching(pattern)}
                assert {s.pid for s in sleeps} <= found
                rounds[0] += 1
        except Exception as err:        # noqa: BLE001 - reported below, with its type
            errors.append(err)
            stop.set()

    threads = [threading.Thread(target=other_watcher), threading.Thread(target=find)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + HAMMER_S
        while time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for s in sleeps:
            s.kill()
            s.wait(5)
    assert not errors, f"matching() failed after {rounds[0]} rounds: {errors[0]!r}"
    assert rounds[0] > 0


def test_scan_reads_each_process_into_a_dict_of_its_own():
    got = dict(guarded.scan(["cmdline", "create_time"]))
    me = next(info for proc, info in guarded.scan(["cmdline", "create_time"]) if proc.pid == psutil.Process().pid)
    assert set(me) == {"cmdline", "create_time"} and me["create_time"] > 0
    assert all(not hasattr(proc, "info") for proc in got)


def test_the_quick_look_at_command_lines_splits_them_as_psutil_does():
    """guarded.cmdlines() reads /proc without a psutil.Process per process (a look costs a millisecond
    or two, not tens): each command line it gives is psutil's, for a plain argv and for titles set
    over it (words joined by spaces, as Pulse's own processes set theirs)."""
    import sys
    titled = "import setproctitle, time; setproctitle.setproctitle('pulse: keep demo (/a home)'); time.sleep(3600)"
    plain = [sys.executable, "-c", "import time; time.sleep(3600)", "3600.25", "an arg with spaces"]
    procs = [subprocess.Popen(plain), subprocess.Popen([sys.executable, "-c", titled])]
    try:
        wanted = {p.pid for p in procs}

        def titled_now():
            return (psutil.Process(procs[1].pid).cmdline() or [""])[0] == "pulse: keep demo (/a home)"
        deadline = time.monotonic() + 30
        while not titled_now():
            assert time.monotonic() < deadline, "the title was never set"
            time.sleep(0.01)
        seen = {pid: cmdline for pid, cmdline in guarded.cmdlines() if pid in wanted}
        assert seen == {p.pid: psutil.Process(p.pid).cmdline() for p in procs}
        assert seen[procs[0].pid] == plain
        assert [p.pid for p in guarded.matching(re.compile(r"3600\.25 an arg with spaces$"))] == [procs[0].pid]
        assert [p.pid for p in guarded.keepers_of("demo", "/a home")] == [procs[1].pid]
    finally:
        for p in procs:
            p.kill()
            p.wait(5)


def test_a_command_line_is_split_on_nuls_or_on_the_spaces_a_title_put_there():
    assert guarded.split_cmdline("") == []
    assert guarded.split_cmdline("sleep\0an arg\0") == ["sleep", "an arg"]
    assert guarded.split_cmdline("pulse: tick [home]") == ["pulse:", "tick", "[home]"]
    assert guarded.split_cmdline("pulse: tick [home]\0") == ["pulse:", "tick", "[home]"]
    assert guarded.split_cmdline("one\0") == ["one"]


def test_a_keeper_s_children_are_read_from_the_kernel_s_list_as_psutil_finds_them():
    """guarded.children() reads /proc/PID/task/TID/children, not every process's stat: the same
    children as psutil's, and none once the parent is gone."""
    parent = subprocess.Popen(["sh", "-c", "sleep 3600 & sleep 3601 & wait"])
    proc, kids = psutil.Process(parent.pid), []
    try:
        deadline = time.monotonic() + 30
        while len(kids) < 2:
            assert time.monotonic() < deadline, "its children never started"
            time.sleep(0.01)
            kids = proc.children()
        assert [c.pid for c in guarded.children(proc)] == sorted(c.pid for c in kids)
    finally:
        parent.kill()
        parent.wait(5)
        for kid in kids:
            kid.kill()
            kid.wait(5)
    assert guarded.children(proc) == []
