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


# -- saying it (issue 25): `pulsectl status` and the web overview ask the file system itself, so they
# say it even while nothing can be written to record it.
FULL_BELOW = 1 << 20    # less room than this (1 MiB) for the user pulsed runs as: the disk is full


def disk_full_note(home: Path, ballast_path: Path) -> str | None:
    """One line saying the home's disk is full, and what that means; None if it is not."""
    try:
        st = os.statvfs(home)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= FULL_BELOW:
        return None
    released = "; the ballast is released" if not ballast_path.exists() else ""
    return (f"disk full: {free >> 10} KiB free for {home}{released}. Writes that cannot commit fail "
            "(disk-full) and are retried; free space and Pulse resumes by itself")
