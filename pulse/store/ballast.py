"""The ballast: a file of a few MiB in the home that Pulse deletes first when the disk is full,
so the effects that free space (and the vital that says the disk is full) can still be committed.
Whoever hits a full disk releases it; the tick puts it back once there is room again."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path


def is_full_disk(err: BaseException) -> bool:
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return True
    return isinstance(err, sqlite3.OperationalError) and "full" in str(err)


def keep(path: Path, size_mb: int) -> bool:
    """Make the ballast if it is missing and there is room; True if it is in place."""
    if size_mb <= 0:
        return False
    if path.exists() and path.stat().st_size == size_mb << 20:
        return True
    try:
        with open(path, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, size_mb << 20)
        return True
    except OSError:
        path.unlink(missing_ok=True)   # no room now; try again later
        return False


def release(path: Path) -> bool:
    """Delete the ballast; False if there was none to give."""
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


# -- saying it: `pulsectl status` and the web overview ask the file system itself, so they
# say it even while nothing can be written to record it.
FULL_BELOW = 1 << 20    # less room than this (1 MiB) for the user pulsed runs as: the disk is full
# The ballast out and less room than this: the disk filled and the room its release freed is all there
# is (the tick puts it back once it fits, with room to spare), so the disk is as good as full.
OUT_BELOW = 64 << 20


def disk_full_note(home: Path, ballast_path: Path) -> str | None:
    """One line saying the home's disk is full, and what that means; None if it is not."""
    try:
        st = os.statvfs(home)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    out = not ballast_path.exists()
    if free < FULL_BELOW:
        released = "; the ballast is released" if out else ""
        return (f"disk full: {free >> 10} KiB free for {home}{released}. Writes that cannot commit fail "
                "(disk-full) and are retried; free space and Pulse resumes by itself")
    if out and free < OUT_BELOW:
        return (f"disk full: the ballast is released and {free >> 20} MiB are free for {home}, the room it "
                "freed and little more; free space (Pulse puts the ballast back once it fits)")
    return None
