"""Power cuts under a running pulsed: the home on powerfs (tests/powerfs.py), a FUSE file
system that drops every write not synced when the power goes.

50 cuts, each after pulsed was started again on what the last one left: most at a random moment of
its first 1.2 s (opening its stores, starting its workers), every fifth under load (just after its
executor acked one of the non-idempotent exec effects that flow, and git commits in staging). Every
process of Pulse is frozen and SIGKILLed by pid, then unsynced data is dropped. After each cut: both
SQLite stores open and pass quick_check, every effect seen acked before the cut is still acked,
no non-idempotent effect ran twice (each appends its id to a file off powerfs), every object an
event names exists, workers.json reads (the watcher is stopped and started at cuts under load), the
engine's git reads; and pulsed starts again on it (or refuses with one line,
exit 78). scripts/power_cuts.py runs more of them and prints each outcome. Needs root and /dev/fuse."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys

import powercuts
import pytest

from pulse.core.wire import eventmsgs
from pulse.store import archive, eventindex, eventsdb

CUTS = 50


def powerfs_missing() -> str | None:
    """Why powerfs cannot be mounted here, or None: it needs root, /dev/fuse and libfuse 3 (.ci/run installs it)."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        return "mounting powerfs needs root and /dev/fuse"
    try:
        import mfusepy  # noqa: F401  (loads libfuse 3)
    except (ImportError, OSError, EnvironmentError) as err:
        return f"mfusepy cannot load libfuse 3 ({err}): apt-get install fuse3 libfuse3-3"
    return None


@pytest.fixture(autouse=True)
def powerfs_or_skip():
    """In CI (CI=true) a missing FUSE fails the test, as a missing browser does; elsewhere it skips."""
    missing = powerfs_missing()
    if missing and os.environ.get("CI") == "true":
        pytest.fail(missing)
    if missing:
        pytest.skip(missing)


def fsync(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


SQLITE_CRASH = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.executescript("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; CREATE TABLE t (x); INSERT INTO t VALUES (1);"
                 "PRAGMA synchronous=OFF; INSERT INTO t VALUES (2);")
os.kill(os.getpid(), 9)     # no close, no checkpoint: the WAL is all there is
"""


def test_powerfs_drops_what_was_not_synced_and_keeps_what_was(tracker, tmp_path):
    disk = tmp_path / "disk"
    fs = powercuts.mount(disk, tracker.add)
    try:
        (disk / "kept").mkdir()
        fsync(disk)
        subprocess.run([sys.executable, "-c", SQLITE_CRASH, str(disk / "kept" / "t.db")], check=False)
        (disk / "kept" / "synced").write_bytes(b"durable")
        fsync(disk / "kept" / "synced")
        fsync(disk / "kept")
        with open(disk / "kept" / "synced", "ab") as f:
            f.write(b" and then some")                   # appended, never synced
        (disk / "kept" / "unnamed").write_bytes(b"x")    # synced, but its directory entry is not
        fsync(disk / "kept" / "unnamed")
        (disk / "gone").mkdir()                          # its parent never synced after it

        powercuts.power_cut(disk)
        assert (disk / "kept" / "synced").read_bytes() == b"durable"
        assert os.listdir(disk) == ["kept"]
        assert sorted(os.listdir(disk / "kept")) == ["synced", "t.db", "t.db-shm", "t.db-wal"]
        db = sqlite3.connect(disk / "kept" / "t.db")
        assert db.execute("SELECT x FROM t").fetchall() == [(1,)]   # the FULL commit kept, the other gone
        db.close()
    finally:
        powercuts.unmount(disk, fs)


def test_fifty_power_cuts_lose_nothing_acked_and_run_nothing_twice(pulsed, tracker, tmp_path):
    seed = random.randrange(1 << 30)
    outcomes = powercuts.run_cuts(CUTS, tmp_path, pulsed, tracker.add, random.Random(seed))
    summary = f"seed {seed}: " + "; ".join(f"{o.cut_after_s}s {o.pulsed_was} acked {o.acked_before}"
                                           for o in outcomes)
    problems = [(i, o.cut_after_s, o.problems) for i, o in enumerate(outcomes) if o.problems]
    assert problems == [], f"{problems}\n{summary}"
    refused = [o.pulsed_was for o in outcomes if o.pulsed_was.startswith("exit")]
    assert len(outcomes) == CUTS, f"pulsed refused its home after a cut: {refused}"
    # the load really ran: cuts fell while pulsed ran, effects were acked before them, and ran
    assert sum(o.pulsed_was == "running" for o in outcomes) >= CUTS // 5, summary
    assert max(o.acked_before for o in outcomes) > 0, summary
    assert (tmp_path / "side-effects.log").exists(), summary
    pulsed.proc = None       # run_cuts killed the last one; the fixture has nothing left to stop


# The event writer's mover on a host where another process commits at synchronous=FULL (the
# executor does): a move's commit made durable by that process's sync, then a drop of the segment
# past archive_max_mb, then a later move whose directory sync makes the drop's unlink durable, and
# the power goes before the drop's own commit was synced.
MOVER = """
import sys, time
from pathlib import Path
from pulse.core import config as configmod
from pulse.core.wire.eventmsgs import now_event
from pulse.store import eventsdb, retention
retention.SEGMENT_EVENTS = 200     # small segments, so a few hundred events make several
home = Path(sys.argv[1])
conn = eventsdb.open_events(home / "events.db")
unbounded = configmod.Store(keep_days=1e-9, archive_max_mb=0)
tiny = configmod.Store(keep_days=1e-9, archive_max_mb=1e-6)
retention.compact(conn, home, unbounded, "test", max_segments=1)
executor = eventsdb.open_events(home / "events.db", synchronous="FULL")
eventsdb.append_events(executor, [now_event("tick", "tick", None, {"synced": True})])
retention.compact(conn, home, tiny, "test", max_segments=1)
retention.compact(conn, home, tiny, "test", max_segments=1)
print("moved", flush=True)
time.sleep(600)
"""


def test_a_power_cut_after_the_mover_drops_a_segment_leaves_none_named_that_is_gone(tracker, tmp_path):
    """Every segment the manifest names is on disk and reads after the cut: a drop is recorded
    durably before its file is unlinked (else the manifest could name a file the cut left gone)."""
    disk = tmp_path / "disk"
    fs = powercuts.mount(disk, tracker.add)
    try:
        home = disk / "home"
        home.mkdir()
        conn = eventsdb.open_events(home / "events.db")
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(700)])
        conn.close()
        powercuts.sync_tree(home)
        mover = subprocess.Popen([sys.executable, "-c", MOVER, str(home)], stdout=subprocess.PIPE, text=True)
        tracker.add(mover.pid)
        assert mover.stdout.readline().strip() == "moved", mover.communicate(timeout=30)
        mover.kill()                  # the power goes with it: no close, no checkpoint
        mover.wait(10)
        powercuts.power_cut(disk)
        conn = eventsdb.open_events(home / "events.db")
        try:
            named = archive.archived(conn)
            problems = [archive.problem(home / archive.DIRECTORY, seg) for seg in named]
            assert problems == [None] * len(named), problems
            # and every event is live, in a named segment, or in a range recorded as dropped
            ranges = sorted([(m.first_id, m.last_id) for m in archive.moves(conn)]
                            + [(i, i) for (i,) in conn.execute("SELECT id FROM events")])
            assert ranges[0][0] == 1 and all(b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:])), ranges
        finally:
            conn.close()
    finally:
        powercuts.unmount(disk, fs)


MOVES = """
import sys
from pathlib import Path
from pulse.core import config as configmod
from pulse.store import eventsdb, retention
from pulse.core.wire import eventmsgs
retention.SEGMENT_EVENTS = 100     # small segments: a few thousand events make many moves
home = Path(sys.argv[1])
conn = eventsdb.open_events(home / "events.db")
# the executor's commits are FULL: each syncs the WAL, and so makes the moves before it durable
executor = eventsdb.open_events(home / "events.db", synchronous="FULL")
print("ready", flush=True)
store = configmod.Store(keep_days=1e-9, archive_max_mb=0)
n = 0
while retention.compact(conn, home, store, "test", max_segments=1, min_events=100).moved:
    n += 1
    if n % 2:
        eventsdb.append_events(executor, [eventmsgs.now_event("tick", "executor", None, {"synced": n})])
print("done", flush=True)
"""


def whole_history(home) -> tuple[dict[int, tuple], list[str]]:
    """Every event, live or in a segment the manifest names, and what is wrong: an id held twice or missing."""
    conn = sqlite3.connect(home / "events.db")
    try:
        found = {r[0]: (r[1], r[2], json.loads(r[3])) for r in conn.execute("SELECT id, type, target, data FROM events")}
        problems = []
        for seg in archive.archived(conn):
            for e in archive.read_segment(home / archive.DIRECTORY, seg):
                if e.id in found:
                    problems.append(f"event {e.id} is held twice ({seg.segment})")
                found[e.id] = (e.type, e.target, e.data)
    finally:
        conn.close()
    if sorted(found) != list(range(1, max(found) + 1)):
        problems.append(f"ids not contiguous: {len(found)} events, the newest {max(found)}")
    return found, problems


def test_power_cuts_at_every_step_of_a_move_and_at_random_moments_lose_nothing_and_double_nothing(tracker, tmp_path):
    """The mover killed after each of a move's steps, then at random moments of a run of moves, and each
    time the power cut (what was not synced is gone): `pulsectl store check` passes, every event is live
    or in a segment the manifest names, once, as it was written; the next mover goes on from there."""
    from pulse.store import retention
    from support import pulsectl
    disk = tmp_path / "disk"
    fs = powercuts.mount(disk, tracker.add)
    rng = random.Random(34)
    try:
        home = disk / "home"
        home.mkdir()
        conn = eventsdb.open_events(home / "events.db")
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", f"t{i}", {"i": i}) for i in range(3_000)])
        conn.close()
        powercuts.sync_tree(home)
        written, _ = whole_history(home)
        cuts = [(step, None) for step in retention.STEPS] + [(None, rng.uniform(0.0, 0.8)) for _ in range(8)]
        moved_at = []
        for step, after_s in cuts:
            conn = eventsdb.open_events(home / "events.db", synchronous="FULL")     # more to move at each cut
            eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"more": i}) for i in range(300)])
            conn.close()
            env = {**os.environ, **({retention.KILL_ENV: step} if step else {})}
            mover = subprocess.Popen([sys.executable, "-c", MOVES, str(home)], stdout=subprocess.PIPE, text=True,
                                     env=env)
            tracker.add(mover.pid)
            assert mover.stdout.readline().strip() == "ready"
            if step:
                mover.wait(60)                  # it SIGKILLs itself right after the step
            else:
                try:
                    mover.wait(after_s)
                except subprocess.TimeoutExpired:
                    mover.kill()                # the power goes with it: no close, no checkpoint
                    mover.wait(10)
            powercuts.power_cut(disk)
            check = pulsectl(["--home", str(home), "store", "check"], timeout=120)
            assert check.returncode == 0, (step, after_s, check.stdout, check.stderr)
            found, problems = whole_history(home)
            assert problems == [], (step, after_s, problems)
            assert all(found[i] == row for i, row in written.items()), (step, after_s)
            conn = sqlite3.connect(home / "events.db")
            moved_at.append((eventindex.first_live_id(conn), len(archive.archived(conn))))
            conn.close()
        assert max(first for first, _ in moved_at) > 1, moved_at     # some moves outlived their cut
    finally:
        powercuts.unmount(disk, fs)
