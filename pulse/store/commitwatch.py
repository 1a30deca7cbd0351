"""Wake on a commit to events.db, told by the kernel: no timer, and no writer needs to know.

Every commit appends to events.db's write-ahead log (`events.db-wal`), and inotify reports each write
to a file of a directory it watches. So a reader that waits here (the page's streams, the fleet's
outbox) hears of a commit by any process (a worker, pulsectl, a keeper) as it lands, then reads what
is new from its last id: the wake-up only says "look", events.db stays the truth, and a reader that
missed wake-ups (it was busy) catches up by that same read.

inotify reports the WAL's write(), and the commit becomes visible to readers a moment later, when
the writer updates the WAL index (shared memory: no event). A reader woken in between reads nothing
new; so after each wake the next wait lasts RECHECK_S at most, one more look once it is visible.

Linux only, like Pulse; where inotify is refused (another OS, fs.inotify.max_user_instances
reached) `wait` sleeps its timeout instead, which is the poll it replaces.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

IN_MODIFY, IN_CREATE, IN_MOVED_TO = 0x002, 0x100, 0x080
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
HEADER = struct.Struct("iIII")            # wd, mask, cookie, len (then the name, NUL-padded)
READ_SIZE = 64 * 1024
RECHECK_S = 0.02                          # the look after a wake, for a commit not yet visible at the wake


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class CommitWatch:
    """inotify on the directory of `db`, for writes to `db` and its WAL (other files' are ignored)."""

    def __init__(self, db: Path):
        self.names = {db.name.encode(), f"{db.name}-wal".encode()}
        self.fd: int | None = None
        self.woken = False                    # the last wait ended on a commit: the next one rechecks soon
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
        deadline = loop.time() + (min(timeout_s, RECHECK_S) if self.woken else timeout_s)
        self.woken = True
        while not self.committed():
            left = deadline - loop.time()
            if left <= 0:
                self.woken = False
                return
            ready = loop.create_future()
            loop.add_reader(self.fd, lambda: ready.done() or ready.set_result(None))
            try:
                await asyncio.wait_for(ready, left)
            except TimeoutError:
                self.woken = False
                return
            finally:
                loop.remove_reader(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
