"""Rotating a file in place, logrotate's copytruncate (pulse.effects.files says how and why): the
steps on a directory's descriptor, every name relative to it, never following a link. Shared by the
rotate-file effect and the keeper's own log (pulse.effects.keeper), which a fresh interpreter runs:
so nothing here imports more than the standard library and pulse.core's path primitives."""

from __future__ import annotations

import gzip
import os
import stat
import time

from pulse.core import rotation, safepath

CHUNK = 1024 * 1024
TAIL_IN_MEMORY = 1024 * 1024     # appended during the copy: held in memory over the truncate when this small
GZIP_LEVEL = 1                   # fast: a log compresses well even so, and a full disk cannot wait


class TooSlow(Exception):
    """The copy was not made before its deadline; the file is as it was."""

    def __init__(self, message: str, bytes_read: int):
        super().__init__(message)
        self.bytes_read = bytes_read


def numbered_copies(parent: safepath.Dir, name: str) -> dict[int, str]:
    """n → <name>.n.gz, for each copy there is."""
    copies = {}
    for entry in safepath.listing(parent):
        if entry.startswith(name + ".") and entry.endswith(".gz"):
            middle = entry[len(name) + 1:-len(".gz")]
            if middle.isdigit():
                copies[int(middle)] = entry
    return copies


def drop_copies_from(parent: safepath.Dir, name: str, first: int) -> tuple[int, int]:
    """Delete the copies numbered `first` and beyond: (how many, their bytes)."""
    dropped = size = 0
    for n, copy in numbered_copies(parent, name).items():
        if n >= first:
            size += safepath.lstat_in(parent, copy).st_size
            os.unlink(copy, dir_fd=parent.fd)
            dropped += 1
    return dropped, size


def shift_copies(parent: safepath.Dir, name: str, keep: int) -> None:
    """<name>.n.gz → <name>.(n+1).gz, the oldest first, for n < keep (renames never follow a link)."""
    copies = numbered_copies(parent, name)
    for n in range(keep - 1, 0, -1):
        if n in copies:
            os.rename(copies[n], rotation.copy_name(name, n + 1), src_dir_fd=parent.fd, dst_dir_fd=parent.fd)


def append_member(copy_fd: int, data: bytes, mtime: float) -> None:
    """`data` as one more gzip member at the end of the copy, on disk before this returns."""
    os.lseek(copy_fd, 0, os.SEEK_END)
    os.write(copy_fd, gzip.compress(data, GZIP_LEVEL, mtime=int(mtime)))
    os.fsync(copy_fd)


def gzip_up_to_end(fd: int, copy_fd: int, deadline: float, path: str) -> int:
    """The file from its start to its current end, as the copy's first gzip member; its bytes."""
    copied = 0
    with os.fdopen(os.dup(copy_fd), "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL,
                                                                mtime=int(time.time())) as gz:
        while chunk := os.pread(fd, CHUNK, copied):
            gz.write(chunk)
            copied += len(chunk)
            if time.monotonic() > deadline:
                raise TooSlow(f"the copy of {path} was not made within the effect's timeout "
                              f"({copied} bytes read): the file is as it was", copied)
    os.fsync(copy_fd)
    return copied


def read_tail(fd: int, start: int) -> bytes:
    """What the file holds past `start`, up to TAIL_IN_MEMORY bytes."""
    return os.pread(fd, TAIL_IN_MEMORY, start)


def make_copy_file(parent: safepath.Dir, name: str, like: os.stat_result) -> int:
    """The temporary copy, fresh, with the file's mode and (when Pulse may) its owner."""
    fd = os.open(rotation.temp_name(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=parent.fd)
    os.fchmod(fd, stat.S_IMODE(like.st_mode))
    try:
        os.fchown(fd, like.st_uid, like.st_gid)
    except PermissionError:
        pass                     # not root: the copy is Pulse's, as the file it rotated need not be
    return fd


def rotate(parent: safepath.Dir, name: str, fd: int, keep: int, deadline: float) -> dict:
    """Copy, shift, truncate: the steps the module doc gives, in that order."""
    path = os.path.join(parent.path, name)
    dropped, dropped_bytes = drop_copies_from(parent, name, keep)
    temp = rotation.temp_name(name)
    copy_fd = make_copy_file(parent, name, os.fstat(fd))
    try:
        try:
            copied = gzip_up_to_end(fd, copy_fd, deadline, path)
        except BaseException:
            os.unlink(temp, dir_fd=parent.fd)
            raise
        shift_copies(parent, name, keep)
        os.rename(temp, rotation.copy_name(name, 1), src_dir_fd=parent.fd, dst_dir_fd=parent.fd)
        safepath.fsync_dir(parent)
        # What the writer appended meanwhile: into the copy while there is much of it, then the last
        # of it read and the file emptied at once, so almost nothing can land between the two.
        while len(tail := read_tail(fd, copied)) >= TAIL_IN_MEMORY and time.monotonic() < deadline:
            append_member(copy_fd, tail, time.time())
            copied += len(tail)
        os.ftruncate(fd, 0)
        if tail:
            append_member(copy_fd, tail, time.time())
            copied += len(tail)
        copy_bytes = os.fstat(copy_fd).st_size
    finally:
        os.close(copy_fd)
    return {"action": "rotate", "bytes": copied, "copy": rotation.copy_name(path, 1), "copy_bytes": copy_bytes,
            "copies_deleted": dropped, "deleted_bytes": dropped_bytes, "bytes_freed": copied - copy_bytes + dropped_bytes,
            "copies": sorted(os.path.join(parent.path, c) for c in numbered_copies(parent, name).values())}
