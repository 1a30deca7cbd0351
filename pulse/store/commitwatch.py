"""Wake on a commit to events.db, told by the kernel: no timer, and no writer needs to know.

Every commit appends to events.db's write-ahead log (`events.db-wal`), and inotify reports each write
to a file of a directory it watches. So a reader that waits here (the page's streams, the fleet's
outbox) hears of a commit by any process (a worker, pulsectl, a keeper) as it lands, then reads what
is new from its last id: the wake-up only says "look", events.db stays the truth, and a reader that
missed wake-ups (it was busy) catches up by that same read.

inotify reports the WAL's write(), and the commit becomes visible to readers a moment later, when
the writer updates the WAL index (shared memory: no event). A reader woken in between reads nothing
new; so after each wake the next wait lasts RECHECK_S at most, one more look once it is visible. A
reader to whom those milliseconds matter (the fleet's offers: one 20 ms look was most of a task's
way from its offer to its taking on another host) starts at RECHECK_FIRST_S instead, doubling up to
RECHECK_S: a few more cheap looks after each commit, the first within a millisecond of its being
visible; the page's streams keep one look, each of which wakes every client.

`wait_blocking` is `wait` for a process with no event loop (`pulsectl reload`, waiting on what it set
in motion); `written` waits the same way, blocking, for another file of the runtime directory to be
written whole (a worker's published address, os.replace'd into place).

Linux only, like Pulse; where inotify is refused (another OS, fs.inotify.max_user_instances
reached) `wait` sleeps its timeout instead, which is the poll it replaces.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import select
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

IN_MODIFY, IN_CREATE, IN_MOVED_TO = 0x002, 0x100, 0x080
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
HEADER = struct.Struct("iIII")            # wd, mask, cookie, len (then the name, NUL-padded)
READ_SIZE = 64 * 1024
RECHECK_FIRST_S, RECHECK_S = 0.001, 0.02  # the looks after a wake, for a commit not yet visible at the wake


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class CommitWatch:
    """inotify on the directory of `db`, for writes to `db` and its WAL (other files' are ignored)."""

    def __init__(self, db: Path, first_recheck_s: float = RECHECK_S, names: tuple[str, ...] | None = None):
        """`names`: the files of db's directory whose writes count (default: db and its WAL)."""
        self.names = {n.encode() for n in (names or (db.name, f"{db.name}-wal"))}
        self.fd: int | None = None
        self.first_recheck_s = first_recheck_s
        self.recheck_s: float | None = None   # after a wake: how soon the next wait looks again (doubling)
        try:
            libc = _libc()
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd < 0:
                return
            if libc.inotify_add_watch(fd, str(db.parent).encode(), IN_MODIFY | IN_CREATE | IN_MOVED_TO) < 0:
                os.close(fd)
                return
            self.fd = fd
        except (OSError, AttributeError):     # no libc inotify here: wait() polls
            self.fd = None

    def committed(self) -> bool:
        """Take what inotify has queued; True if any of it is a write to events.db or its WAL."""
        if self.fd is None:
            return False
        seen = False
        while True:
            try:
                data = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                return seen
            offset = 0
            while offset + HEADER.size <= len(data):
                _, _, _, length = HEADER.unpack_from(data, offset)
                name = data[offset + HEADER.size: offset + HEADER.size + length].rstrip(b"\0")
                seen = seen or name in self.names
                offset += HEADER.size + length

    async def wait(self, timeout_s: float) -> None:
        """Until the next commit, or `timeout_s` (a commit missed by inotify is caught up by then)."""
        if self.fd is None:
            await asyncio.sleep(timeout_s)
            return
        loop = asyncio.get_running_loop()
        recheck = self.recheck_s
        deadline = loop.time() + (min(timeout_s, recheck) if recheck is not None else timeout_s)
        while not self.committed():
            left = deadline - loop.time()
            if left <= 0:
                self.after_look(recheck)
                return
            ready = loop.create_future()
            loop.add_reader(self.fd, lambda: ready.done() or ready.set_result(None))
            try:
                await asyncio.wait_for(ready, left)
            except TimeoutError:
                self.after_look(recheck)
                return
            finally:
                loop.remove_reader(self.fd)
        self.recheck_s = self.first_recheck_s

    def wait_blocking(self, timeout_s: float) -> None:
        """wait's form for a process without an event loop (pulsectl reload): blocks."""
        if self.fd is None:
            time.sleep(timeout_s)
            return
        recheck = self.recheck_s
        deadline = time.monotonic() + (min(timeout_s, recheck) if recheck is not None else timeout_s)
        while not self.committed():
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                self.after_look(recheck)
                return
        self.recheck_s = self.first_recheck_s

    def after_look(self, recheck: float | None) -> None:
        """A wait ended with no write: the next looks again twice as late, or waits its whole timeout
        once RECHECK_S has passed since the last wake."""
        self.recheck_s = None if recheck is None or recheck * 2 > RECHECK_S else recheck * 2

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def written(path: Path, look: Callable[[], T | None], timeout_s: float) -> T | None:
    """`look()` once it is not None: looked at now, then again after each write to `path` (made,
    replaced, appended), until `timeout_s`. Blocks: for a thread that may wait."""
    if (found := look()) is not None:
        return found                                  # as nearly always: no watch set up
    watch = CommitWatch(path, names=(path.name,))     # then looked at again: no write falls between
    deadline = time.monotonic() + timeout_s
    try:
        while (found := look()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if watch.fd is None:
                time.sleep(left)
            else:
                select.select([watch.fd], [], [], left)
                watch.committed()
        return found
    finally:
        watch.close()
