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

import os
import random
import sqlite3
import subprocess
import sys

import powercuts
import pytest

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
    assert problems == [], summary
    refused = [o.pulsed_was for o in outcomes if o.pulsed_was.startswith("exit")]
    assert len(outcomes) == CUTS, f"pulsed refused its home after a cut: {refused}"
    # the load really ran: cuts fell while pulsed ran, effects were acked before them, and ran
    assert sum(o.pulsed_was == "running" for o in outcomes) >= CUTS // 5, summary
    assert max(o.acked_before for o in outcomes) > 0, summary
    assert (tmp_path / "side-effects.log").exists(), summary
    pulsed.proc = None       # run_cuts killed the last one; the fixture has nothing left to stop
