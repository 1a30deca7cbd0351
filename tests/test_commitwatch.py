"""pulse.store.commitwatch: a reader wakes on a commit to events.db by any process, not on a timer,
and writes to other files of the home (vitals.db) do not wake it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from pulse.core.wire import enginerpc, eventmsgs
from pulse.store import eventsdb, vitalsdb
from pulse.store.commitwatch import CommitWatch

APPEND = ("import sys; from pathlib import Path; from pulse.core.wire.eventmsgs import now_event; from pulse.store import eventsdb; "
          "eventsdb.append_events(eventsdb.open_events(Path(sys.argv[1])), [now_event('operator', 'test', None, {})])")
APPEND_VITAL = ("import sys, time; from pathlib import Path; from pulse.core.wire.enginerpc import Vital; "
                "from pulse.store import vitalsdb; "
                "vitalsdb.append_vitals(vitalsdb.open_vitals(Path(sys.argv[1])), [Vital('cpu', time.time(), {'percent': 1.0})])")


def test_a_commit_by_another_process_wakes_the_reader_long_before_its_timeout(tmp_path):
    db = tmp_path / "events.db"
    conn = eventsdb.open_events(db)
    eventsdb.append_events(conn, [eventmsgs.now_event("operator", "test", None, {})])
    watch = CommitWatch(db)
    assert not watch.committed()     # what came before the watch is not a commit it reports
    assert watch.fd is not None, "inotify refused on this host"

    async def main() -> float:
        started = time.monotonic()
        writer = await asyncio.create_subprocess_exec(sys.executable, "-c", APPEND, str(db),
                                                      stderr=asyncio.subprocess.PIPE)
        await watch.wait(30)
        _, err = await writer.communicate()
        assert writer.returncode == 0, err.decode()
        return time.monotonic() - started
    try:
        took = asyncio.run(main())
    finally:
        watch.close()
        conn.close()
    assert took < 15, took     # woken by the commit (a fresh interpreter's start, here), not by the 30 s timeout


def test_writes_to_other_files_of_the_home_do_not_wake_it(tmp_path):
    db = tmp_path / "events.db"
    eventsdb.open_events(db).close()
    vitals = vitalsdb.open_vitals(tmp_path / "vitals.db")
    watch = CommitWatch(db)

    async def main() -> float:
        async def write_vitals():
            for _ in range(5):
                vitalsdb.append_vitals(vitals, [enginerpc.Vital("cpu", time.time(), {"percent": 1.0})])
                await asyncio.sleep(0.05)
        started = time.monotonic()
        await asyncio.gather(watch.wait(1.0), write_vitals())
        return time.monotonic() - started
    try:
        assert asyncio.run(main()) >= 1.0
    finally:
        watch.close()
        vitals.close()


def test_a_quick_watch_looks_again_a_few_times_soon_after_a_commit_then_waits_its_timeout(tmp_path):
    """A commit's write wakes the reader a moment before the commit is visible: a watch made with
    RECHECK_FIRST_S looks again within 1, 2, 4, 8 and 16 ms (one 20 ms look delayed a fleet task's
    taking), then waits whole timeouts again."""
    from pulse.store import commitwatch
    db = tmp_path / "events.db"
    conn = eventsdb.open_events(db)
    watch = CommitWatch(db, commitwatch.RECHECK_FIRST_S)

    async def main() -> float:
        eventsdb.append_events(conn, [eventmsgs.now_event("operator", "test", None, {})])
        await asyncio.wait_for(watch.wait(30), 10)          # the commit
        for _ in range(5):                                  # five more looks, none waits its 30 s
            await asyncio.wait_for(watch.wait(30), 10)
        started = time.monotonic()
        await watch.wait(0.5)                               # then quiet: the whole timeout
        return time.monotonic() - started
    try:
        assert asyncio.run(main()) >= 0.5
    finally:
        watch.close()
        conn.close()


def test_the_blocking_wait_wakes_on_a_commit_to_a_named_store_and_not_on_other_files(tmp_path):
    """wait_blocking (pulsectl reload's wait): a commit to vitals.db wakes a watch of events.db's and
    vitals.db's files; a write to another file of the home waits the whole timeout."""
    db = tmp_path / "events.db"
    eventsdb.open_events(db).close()
    vitals = vitalsdb.open_vitals(tmp_path / "vitals.db")
    watch = CommitWatch(db, names=("events.db", "events.db-wal", "vitals.db", "vitals.db-wal"))
    assert watch.fd is not None, "inotify refused on this host"
    try:
        (tmp_path / "other").write_text("x")
        started = time.monotonic()
        watch.wait_blocking(0.5)
        assert time.monotonic() - started >= 0.5
        started = time.monotonic()
        writer = subprocess.Popen([sys.executable, "-c", APPEND_VITAL, str(tmp_path / "vitals.db")])
        try:
            watch.wait_blocking(30)
        finally:
            assert writer.wait(timeout=30) == 0
        assert time.monotonic() - started < 15     # woken by the commit (a fresh interpreter's start), not the 30 s
    finally:
        watch.close()
        vitals.close()
