"""A full disk under a running pulsed: the home on a small tmpfs, filled while effects flow.

pulsed keeps supervising (it keeps no SQLite); the first writer to hit the full disk releases the
ballast, so the survival layer's effects still commit and its notification goes out; writes that
cannot commit fail and are retried, never half-written; the log stops without breaking anything;
`pulsectl status` says the disk is full. When space returns everything resumes by itself and the
ballast is made again. Needs root (mount); CI runs as root."""

from __future__ import annotations

import errno
import json
import os
import re
import sqlite3
import subprocess
import textwrap
import threading
import time
import urllib.request

import pytest

from pulse.core.wire import enginerpc
from pulse.store import ballast, effectqueue, eventsdb
from support import init_home, notifications, wait_for

MiB = 1 << 20
DISK_MB = 48
BALLAST_MB = 4

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(path, chunk=256 * 1024) -> int:
    """Write `path` until the file system says ENOSPC; the bytes written."""
    written = 0
    with open(path, "ab", buffering=0) as f:
        while True:
            try:
                written += f.write(b"\0" * chunk)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                if chunk == 4096:
                    return written
                chunk = 4096


class Committer(threading.Thread):
    """Commits a noop effect every 50 ms, as the tick or `pulsectl emit` would; a commit that fails
    is retried with the same effect (its id is the idempotency key), counted by its error."""

    def __init__(self, db):
        super().__init__(daemon=True)
        self.db, self.stop, self.committed, self.failures = db, threading.Event(), [], {}

    def run(self):
        conn = None
        pending = None
        while not self.stop.wait(0.05):
            pending = pending or effectqueue.new_effect(enginerpc.Effect(kind="noop", idempotent=True), "operator", 600)
            try:
                conn = conn or eventsdb.open_events(self.db)
                effectqueue.commit_effects(conn, [pending], "test")
                self.committed.append(pending.id)
                pending = None
            except sqlite3.Error as err:
                why = "disk-full" if ballast.is_full_disk(err) else str(err)
                self.failures[why] = self.failures.get(why, 0) + 1


def overview(pulsed) -> dict:
    """The overview page's first update, as its stream sends it."""
    url = wait_for(lambda: (out := pulsed.ctl("web", "url")).returncode == 0 and out.stdout.strip(), 30,
                   what="the web worker's address")
    base, _, token = url.partition("/?token=")
    request = urllib.request.Request(f"{base}/api/stream/overview", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        for line in response:
            if line.startswith(b"data:"):
                return json.loads(line[5:])
    raise AssertionError("the overview stream ended without an update")


def acked(pulsed, ids) -> set:
    return {e["data"]["effect_id"] for e in pulsed.events("effect-acked", written=False)} & set(ids)


def test_a_full_disk_is_survived_said_and_recovered_from_by_itself(small_disk, pulsed, tmp_path):
    # small_disk first: unmounted after the pulsed fixture has stopped pulsed and read its log
    pulsed.home = small_disk / "home"
    notes = tmp_path / "notes.jsonl"           # outside the full disk: the notification must get out
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [watch]
        disk_path = "{small_disk}"

        [[notify]]
        kind = "file"
        path = "{notes}"

        [survival]
        ballast_mb = {BALLAST_MB}

        [web]
        enabled = true
        listen = "127.0.0.1:0"
    """))
    pulsed.start(env={"PULSE_BALLAST_CHECK_S": "1", "PULSE_READY_TIMEOUT_MS": "15000"})
    wait_for(lambda: ballast.keep(pulsed.home / "ballast", BALLAST_MB), 10, what="the ballast in place")
    committer = Committer(pulsed.home / "events.db")
    committer.start()
    try:
        wait_for(lambda: len(acked(pulsed, committer.committed)) >= 5, 20, what="effects flowing")
        pids = {w.name: w.pid for w in pulsed.status().workers}

        fill(small_disk / "filler")
        # the survival layer: the ballast is released and the disk's notification goes out
        wait_for(lambda: not (pulsed.home / "ballast").exists(), 30, what="the ballast released")
        wait_for(lambda: notifications(notes, "resource-guard"), 30, what="the disk-full notification")
        # the released ballast's room is free now, but the disk is as full as it was: status says so
        # (as the room it freed, or less once the committer's writes have taken some of it)
        said = pulsed.ctl("status").stdout
        assert re.search(r"disk full: (the ballast is released and|\d+ KiB free for .*; the ballast is released)", said), said
        fill(small_disk / "filler")            # and the ballast's room taken too: really full
        wait_for(lambda: committer.failures.get("disk-full", 0) >= 3, 30, what="commits failing with disk-full")

        # pulsed keeps supervising and says the disk is full
        status = pulsed.ctl("status")
        assert status.returncode == 0, status.stderr
        assert "disk full" in status.stdout, status.stdout
        assert "disk full" in (overview(pulsed)["disk_full"] or "")
        assert {w.name: w.pid for w in pulsed.status().workers} == pids
        for w in pulsed.status().workers:
            pulsed.wait_heartbeat(w.name, w.pid)

        # space returns: everything resumes by itself
        before = len(committer.committed)
        (small_disk / "filler").unlink()
        t0 = time.monotonic()
        wait_for(lambda: len(committer.committed) > before, 30, what="commits again")
        fresh = committer.committed[before:before + 1]
        wait_for(lambda: acked(pulsed, fresh), 30, what="a new effect acked")
        resumed = time.monotonic() - t0
        wait_for(lambda: (pulsed.home / "ballast").exists() and
                 (pulsed.home / "ballast").stat().st_size == BALLAST_MB * MiB, 30, what="the ballast made again")
        ballast_back = time.monotonic() - t0
        os.kill(pids["watcher"], 9)             # the log writes again: pulsed logs this exit
        pulsed.wait_replaced("watcher", pids["watcher"], timeout=20)
        wait_for(lambda: f"watcher (pid {pids['watcher']}) exited" in pulsed.log_text(), 10,
                 what="the log written again")
        assert "disk full" not in pulsed.ctl("status").stdout
        wait_for(lambda: overview(pulsed)["disk_full"] is None, 10, what="the page no longer saying it")
        committer.stop.set()
        committer.join(5)
        # every effect that was committed ends acked: a disk-full retry never lost or doubled one
        wait_for(lambda: acked(pulsed, committer.committed) == set(committer.committed), 30,
                 what="every committed effect acked")
        print(f"\nfull disk: effects acked again {resumed:.2f} s after space returned; ballast back after "
              f"{ballast_back:.2f} s; commits that failed with disk-full: {committer.failures}")
    finally:
        committer.stop.set()
        committer.join(5)
        (small_disk / "filler").unlink(missing_ok=True)
        if pulsed.proc is not None and pulsed.proc.poll() is None:
            assert pulsed.terminate(timeout=30) == 0
    # nothing half-written: every store passes its check
    check = pulsed.ctl("store", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    acks = [e["data"]["effect_id"] for e in pulsed.events("effect-acked")]
    assert len(acks) == len(set(acks))
