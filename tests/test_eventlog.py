"""pulsed's lifecycle events go through its event writer, a process of its own: whatever
happens to the writer or to events.db, each event is written once, in order, and none is lost."""

from __future__ import annotations

import os
import signal
import sqlite3
from datetime import datetime

import pytest

from pulse.core.childspecs import EVENT_WRITER, WORKERS
from pulse.workers.eventwriter import LINGER_QUIET_S
from support import engine_rule, wait_for

# These tests impair the writer on purpose: they read events.db as it is (events(written=False)).


def writer_pid(pulsed, not_pid: int | None = None) -> int:
    """The pid of the event writer that last became ready (by its worker-ready event), other than `not_pid`."""
    ready = wait_for(lambda: [e for e in pulsed.events("worker-ready", written=False) if e["target"] == "eventlog"
                              and e["data"]["pid"] != not_pid], 10, what="an event writer ready")
    pid = ready[-1]["data"]["pid"]
    pulsed.tracker.add(pid)
    return pid


def pulsed_seqs(pulsed) -> list[int]:
    return [e["seq"] for e in pulsed.events(written=False) if e["source"] == "pulsed"]


def assert_each_event_once_in_order(pulsed) -> None:
    seqs = pulsed_seqs(pulsed)
    assert seqs == list(range(1, len(seqs) + 1))


def engine_restarted(pulsed, old_pid: int) -> None:
    """An operator restart of the engine: five lifecycle events while the writer is in trouble."""
    assert pulsed.ctl("restart", "engine").returncode == 0
    pulsed.wait_replaced("engine", old_pid, heartbeat=False)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_writer_killed_or_frozen_loses_and_repeats_nothing(pulsed, how):
    pulsed.start()
    old_writer = writer_pid(pulsed)
    old_engine = pulsed.worker("engine").pid
    os.kill(old_writer, getattr(signal, how))
    engine_restarted(pulsed, old_engine)    # recorded while the writer is down or frozen
    writer_pid(pulsed, not_pid=old_writer)
    new_engine = pulsed.worker("engine").pid
    wait_for(lambda: any(e["target"] == "engine" and e["data"]["pid"] == new_engine
                         for e in pulsed.events("worker-ready", written=False)), 10, what="the new engine's ready event")
    pulsed.events_written()                 # pulsed hears that all it recorded is in
    assert_each_event_once_in_order(pulsed)
    exited = [e for e in pulsed.events("worker-exited", written=False) if e["target"] == "eventlog"]
    assert [e["data"]["pid"] for e in exited] == [old_writer]
    if how == "SIGSTOP":
        assert [e["data"]["pid"] for e in pulsed.events("worker-hung", written=False) if e["target"] == "eventlog"] == [old_writer]
        assert f"eventlog[{old_writer}] Fatal Python error: Aborted" in pulsed.log_text()   # faulthandler
    assert "not written" not in pulsed.log_text()


@pytest.mark.parametrize("fault", ["crash-before-ready", "hang-before-ready", "exit-1"])
def test_writer_that_fails_to_start_or_exits_loses_nothing(pulsed, fault):
    pulsed.start(env={"PULSE_TEST_INJECT": f"eventlog:{fault}"})     # the core is ready without it
    wait_for(lambda: pulsed.events("worker-restarted", written=False), 10, what="the writer's restart written")
    pulsed.events_written()                 # its successor wrote everything, its own start included
    assert_each_event_once_in_order(pulsed)
    assert [e["target"] for e in pulsed.events("worker-restarted", written=False)] == ["eventlog"]
    assert pulsed.terminate() == 0
    assert "not written" not in pulsed.log_text()


def test_locked_database_delays_events_without_losing_one(pulsed):
    pulsed.start()
    writer = writer_pid(pulsed)
    old_engine = pulsed.worker("engine").pid
    lock = sqlite3.connect(pulsed.home / "events.db", timeout=5, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        before = pulsed_seqs(pulsed)
        engine_restarted(pulsed, old_engine)
        wait_for(lambda: "cannot commit" in pulsed.log_text(), 10, what="the writer retrying a locked events.db")
        assert pulsed_seqs(pulsed) == before      # nothing got through the lock
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    new_engine = pulsed.worker("engine").pid
    wait_for(lambda: any(e["target"] == "engine" and e["data"]["pid"] == new_engine
                         for e in pulsed.events("worker-ready", written=False)), 10, what="the delayed events written")
    assert_each_event_once_in_order(pulsed)
    assert writer_pid(pulsed) == writer and not pulsed.events("worker-hung", written=False)   # it waited, heartbeating
    assert pulsed.terminate() == 0
    assert pulsed.events(written=False)[-1]["type"] == "worker-exited" and "not written" not in pulsed.log_text()


def test_worker_killed_at_the_stop_grace_still_has_its_exit_written(pulsed, tmp_path):
    """An engine stuck in an agent's rule cannot act on SIGTERM: at stop_grace_ms it and the
    workers not yet stopped are SIGKILLed, but the event writer is spared to write their exits."""
    stuck = tmp_path / "stuck"
    engine_rule(pulsed, "stuck", f"""
        import pathlib, time

        def stuck(prev, curr, inner):
            pathlib.Path({str(stuck)!r}).touch()
            time.sleep(60)
            return [], 1000

        RULES = [stuck]
        """)
    pulsed.start(env={"PULSE_TICK_MS": "200", "PULSE_HUNG_AFTER_MS": "30000"})
    wait_for(stuck.exists, 15, what="the engine inside the stuck rule")
    assert pulsed.terminate(timeout=30) == 0
    log = pulsed.log_text()
    assert "engine (pid" in log and "still alive after 1000 ms: SIGKILL" in log
    assert "not written" not in log
    exits = {e["target"]: e["data"]["signal"] for e in pulsed.events("worker-exited", written=False)}
    assert set(exits) == {"watcher", "tick", "executor", "engine"} and exits["engine"] == signal.SIGKILL
    assert_each_event_once_in_order(pulsed)


def test_pulsed_keeps_no_sqlite(pulsed):
    """The point of the separate writer: SQLite (and the stores) never load into pulsed."""
    pulsed.start()
    maps = open(f"/proc/{pulsed.proc.pid}/maps").read()
    assert "libsqlite3" not in maps and "_sqlite3" not in maps
    writer = writer_pid(pulsed)
    assert "sqlite3" in open(f"/proc/{writer}/maps").read()


def stopped_at(log: str, worker: str) -> datetime:
    """When pulsed logged `worker`'s exit in an ordered stop (its pulse.log timestamp)."""
    line = next(line for line in log.splitlines() if f"supervisor: {worker} (pid " in line and ") stopped (" in line)
    return datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))


def test_ordered_stop_ends_the_writer_at_its_last_event_not_at_a_quiet_inbox(pulsed):
    """pulsed stops the writer last and tells it nothing more comes (END_OF_EVENTS after its last
    event): the other workers' exits are all committed, and the writer leaves as soon as they are,
    not after LINGER_QUIET_S of quiet, which a SIGTERM alone still makes it wait (at least that
    long after its SIGTERM, so before this the gap below was never shorter)."""
    pulsed.start()
    pids = {w.name: w.pid for w in pulsed.status().workers}
    assert pulsed.terminate() == 0
    log = pulsed.log_text()
    assert "not written" not in log
    events = pulsed.events(written=False)
    stopping = next(e["id"] for e in events if e["type"] == "supervisor-stopping")
    exits = [e for e in events if e["type"] == "worker-exited" and e["id"] > stopping]
    assert [(e["target"], e["data"]["pid"]) for e in exits] == [(w, pids[w]) for w in reversed(WORKERS)]
    assert events[-1] == exits[-1]          # the writer's last commit: the last worker's exit
    assert_each_event_once_in_order(pulsed)
    last_worker = WORKERS[0]                # stopped just before the writer
    assert (stopped_at(log, EVENT_WRITER) - stopped_at(log, last_worker)).total_seconds() < LINGER_QUIET_S
