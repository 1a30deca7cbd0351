"""pulse.store.commitwatch: a reader wakes on a commit to events.db by any process, not on a timer,
and writes to other files of the home (vitals.db) do not wake it."""

from __future__ import annotations

import asyncio
import sys
import time

from pulse.core.wire import enginerpc, eventmsgs
from pulse.store import eventsdb, vitalsdb
from pulse.store.commitwatch import CommitWatch

APPEND = ("import sys; from pathlib import Path; from pulse.core.wire.eventmsgs import now_event; from pulse.store import eventsdb; "
          "eventsdb.append_events(eventsdb.open_events(Path(sys.argv[1])), [now_event('operator', 'test', None, {})])")


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
