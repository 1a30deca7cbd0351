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
