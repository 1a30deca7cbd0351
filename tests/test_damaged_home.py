"""A damaged or unusable home: pulsed exits 78 with one line naming the file, what is wrong and
what to do, and never rewrites what it found; pulsectl says the same in one line."""

from __future__ import annotations

import os
import shutil
import subprocess

import psutil
import pytest

from support import PULSED, init_home, wait_for


def start_and_fail(pulsed, timeout: float = 30) -> subprocess.CompletedProcess:
    """pulsed, refusing to start: exit 78, one line each, and nothing of it left running (its
    forkserver, started first thing, ended with it)."""
    proc = subprocess.Popen([PULSED, "--home", str(pulsed.home)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    pulsed.tracker.add(proc.pid)
    stdout, stderr = proc.communicate(timeout=timeout)
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert out.returncode == 78, out.stderr
    assert "Traceback" not in out.stderr
    left = [p.info for p in psutil.process_iter(["pid", "name"]) if session_of(p.pid) == proc.pid]
    assert not left, f"left running by a pulsed that refused to start: {left}"
    return out


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def real_history(pulsed):
    """A home whose events.db has a real history, pulsed stopped."""
    init_home(pulsed.home)
    pulsed.start()
    pulsed.ctl("emit", "noop", "--wait", "10")
    assert pulsed.terminate() == 0


@pytest.mark.parametrize("damage, says", [
    (lambda db: db.write_bytes(b"this is not a database" + db.read_bytes()[22:]), "is not an SQLite database"),
    (lambda db: db.write_bytes(db.read_bytes()[:3000]), "is damaged"),
    (lambda db: db.write_bytes(b""), "is an empty file"),
])
def test_a_damaged_events_db_is_one_line_exit_78_and_left_as_it_was(pulsed, damage, says):
    real_history(pulsed)
    events = pulsed.home / "events.db"
    for extra in ("events.db-wal", "events.db-shm"):
        (pulsed.home / extra).unlink(missing_ok=True)
    damage(events)
    before = events.read_bytes()
    out = start_and_fail(pulsed)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pulsed: {events} ") and says in lines[0]
    assert events.read_bytes() == before                      # never rewritten, truncated or replaced
    listed = pulsed.ctl("events")
    assert listed.returncode != 0 and "Traceback" not in listed.stderr and str(events) in listed.stderr
    assert len(listed.stderr.strip().splitlines()) == 1
    check = pulsed.ctl("store", "check")
    assert check.returncode == 1 and str(events) in check.stderr


def test_a_history_that_went_missing_is_refused(pulsed):
    real_history(pulsed)
    pulsed.start()                      # each start records how long the history is
    assert pulsed.terminate() == 0
    (pulsed.home / "events.db").rename(pulsed.home / "events.db.old")
    for extra in ("events.db-wal", "events.db-shm"):
        (pulsed.home / extra).unlink(missing_ok=True)
    from pulse.store import eventsdb
    eventsdb.open_events(pulsed.home / "events.db").close()          # a new, empty history in its place
    out = start_and_fail(pulsed)
    assert "its history was replaced or rewound" in out.stderr and "events.mark" in out.stderr


def test_a_read_only_home_is_one_line_exit_78(pulsed, tmp_path):
    real_history(pulsed)
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("needs root and mount for a read-only bind mount")
    made = subprocess.run(["mount", "--bind", str(pulsed.home), str(pulsed.home)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {made.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(pulsed.home)], check=True, capture_output=True)
        out = start_and_fail(pulsed)
        assert out.stderr.strip() == f"pulsed: {pulsed.home} is read-only (file or file system); " \
                                     "pulsed must be able to write its home"
    finally:
        subprocess.run(["umount", str(pulsed.home)], capture_output=True)


def test_store_check_and_backup_then_restore(pulsed, tmp_path):
    init_home(pulsed.home)
    pulsed.start()
    assert pulsed.ctl("emit", "noop", "--wait", "10").returncode == 0
    check = pulsed.ctl("store", "check")
    assert check.returncode == 0 and "events.db: ok" in check.stdout, check.stderr
    backup = tmp_path / "backup"
    out = pulsed.ctl("store", "backup", str(backup))                  # online, pulsed running
    assert out.returncode == 0, out.stderr
    assert pulsed.ctl("store", "backup", str(backup)).returncode == 2   # never into a non-empty dir
    acked = len(pulsed.events("effect-acked"))
    assert pulsed.terminate() == 0
    # the home is lost; the backup is copied back, as docs/operations.md says
    (pulsed.home / "events.db").write_bytes(b"garbage")
    for name in ("events.db", "vitals.db", "events.mark", "config.toml"):
        shutil.copy2(backup / name, pulsed.home / name)
    for extra in ("events.db-wal", "events.db-shm", "vitals.db-wal", "vitals.db-shm"):
        (pulsed.home / extra).unlink(missing_ok=True)
    pulsed.start()
    wait_for(lambda: len(pulsed.events("effect-acked")) >= acked, 10, what="the restored history")


def test_a_home_with_only_a_config_starts(pulsed):
    """What a user who wrote config.toml before the first start has: the stores are made."""
    pulsed.home.mkdir(parents=True)
    (pulsed.home / "config.toml").write_text("[timings]\ntick_ms = 4000\n")
    pulsed.start()
    assert (pulsed.home / "events.db").exists() and (pulsed.home / "events.mark").exists()


def test_a_store_damaged_while_running_is_reported_once_and_stops_pulsed_with_78(pulsed):
    """Every start of the watcher would fail the same way: pulsed says so once and exits 78, not N
    crash tracebacks and an escalation that systemd would keep retrying."""
    init_home(pulsed.home)
    pulsed.start()
    watcher = pulsed.worker("watcher").pid
    vitals = pulsed.home / "vitals.db"
    with open(vitals, "r+b") as f:
        f.write(b"this is not a database")
    os.kill(watcher, 9)
    assert pulsed.proc.wait(30) == 78
    log = pulsed.log_text()
    assert "Traceback" not in log
    assert f"{vitals} is not an SQLite database" in log
    assert log.count("cannot use a store") == 1
    failed = [e for e in pulsed.events("worker-failed") if e["data"].get("reason") == "store unusable"]
    assert len(failed) == 1 and failed[0]["target"] in ("watcher", "tick")
