"""rotate-file: a file that a [[watch.file]] glob matches, rotated or truncated in place.

Rotate is logrotate's copytruncate. The file is copied, gzipped, to `<file>.1.gz` (the copies
before it shifted to `.2.gz` … `.<keep>.gz`, the one that would fall beyond `keep` deleted first,
which also frees room on a full disk), then truncated in place: a writer holding it open with
O_APPEND writes its next line at the start of the emptied file, with nothing to reopen or signal.
What the writer appends while the copy is made is read after it, as a second gzip member of the
same copy (`zcat` and Python's gzip read both), and the file is truncated right after that last
read returns: only a line appended in the microseconds between the two is lost. A writer without
O_APPEND goes on at its old offset, leaving a hole of zeros before its next line (as under
logrotate). Truncate only empties the file.

Before anything is touched, the effect is refused (reason `refused`) for a target that the
[[watch.file]] it names does not match (it never acts beyond what was configured), a file inside
the Pulse home, a rotated copy, and anything that is not a regular file (a symlink is never
followed). Acked with the action, the file's size when it was emptied, the bytes freed (that size,
less the new copy's, plus the deleted copies') and the copies kept.

A copy that cannot be made within the effect's timeout fails (reason `timeout`) and leaves the file
as it was; so does a disk too full for the copy (reason `no-space`). If the executor dies between the
truncate and the write of what was read last (at most TAIL_IN_MEMORY bytes), that tail is lost;
anywhere else, the file is as it was or a copy holds everything.
"""

from __future__ import annotations

import errno
import gzip
import os
import stat
import time

from pulse.core import rotation, safepath
from pulse.core.config import ExecutorConfig, FileWatch
from pulse.core.home import inside
from pulse.core.wire.enginerpc import Effect
from pulse.effects.kinds import EffectContext, EffectFailed, os_failure

CHUNK = 1024 * 1024
TAIL_IN_MEMORY = 1024 * 1024     # appended during the copy: held in memory over the truncate when this small
GZIP_LEVEL = 1                   # fast: a log compresses well even so, and a full disk cannot wait


# -- what may be touched -------------------------------------------------------------------------------

def configured_watch(config: ExecutorConfig, name: object) -> FileWatch:
    watch = next((w for w in config.watch.file if w.name == name), None)
    if watch is None:
        known = ", ".join(w.name for w in config.watch.file) or "none"
        raise EffectFailed("bad-params", f"no [[watch.file]] named {name!r} (known: {known})")
    return watch


def kind_of_file(mode: int) -> str:
    for test, what in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a fifo"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return what
    return "not a regular file"


def checked_target(target: str | None, watch: FileWatch, home) -> tuple[str, int | None]:
    """(the target, the account whose rights it is trimmed with), if this effect may touch it; else
    EffectFailed saying why not."""
    if not target or not os.path.isabs(target):
        raise EffectFailed("bad-params", f"the target must be the absolute path of a file, got {target!r}")
    if rotation.is_copy(target):
        raise EffectFailed("refused", f"{target} is a copy a rotation keeps, not a file to rotate")
    found = {path: (st, writer) for path, st, writer in safepath.matched(watch.path)}
    if target not in found:
        raise EffectFailed("refused", f"{target} is not matched by [[watch.file]] {watch.name!r} "
                                      f"(path {watch.path!r}, never through a link): rotate-file acts on nothing else")
    if home is not None and inside(target, home):
        raise EffectFailed("refused", f"{target} is inside the Pulse home ({home}): Pulse never trims its own files")
    st, writer = found[target]
    if not stat.S_ISREG(st.st_mode):
        raise EffectFailed("refused", f"{target} is {kind_of_file(st.st_mode)}, not a regular file: never followed or trimmed")
    return target, writer


def open_regular(parent: safepath.Dir, name: str) -> int:
    """An fd on `name` in `parent`, read-write, refusing a symlink (O_NOFOLLOW) or anything but a
    regular file that replaced it since it was checked (O_NONBLOCK: a fifo does not hang the open)."""
    path = os.path.join(parent.path, name)
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent.fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise EffectFailed("refused", f"{path} is a symlink: never followed") from None
        err.filename = path
        raise os_failure("rotate-file could not open the file", err) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise EffectFailed("refused", f"{path} is not a regular file: never trimmed")
    return fd


# -- truncate -------------------------------------------------------------------------------------------

def truncate(fd: int) -> dict:
    size = os.fstat(fd).st_size
    os.ftruncate(fd, 0)
    return {"action": "truncate", "bytes": size, "bytes_freed": size}


# -- rotate: every name relative to the directory's descriptor ------------------------------------------

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
                raise EffectFailed("timeout", f"the copy of {path} was not made within the effect's timeout "
                                              f"({copied} bytes read): the file is as it was", bytes_read=copied)
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


def trim(parent: safepath.Dir, name: str, action: str, keep: int, deadline: float) -> dict:
    """Truncate or rotate `name` in `parent`, with whatever rights this process has."""
    fd = open_regular(parent, name)
    try:
        return truncate(fd) if action == "truncate" else rotate(parent, name, fd, keep, deadline)
    except OSError as err:
        raise os_failure(f"{action} of {os.path.join(parent.path, name)} stopped", err) from None
    finally:
        os.close(fd)


# -- the effect -----------------------------------------------------------------------------------------

def run_rotate_file(effect: Effect, ctx: EffectContext) -> dict:
    watch = configured_watch(ctx.config, effect.params.get("watch"))
    action = effect.params.get("action") or watch.action
    if action not in ("rotate", "truncate"):
        raise EffectFailed("refused", f"[[watch.file]] {watch.name!r} only notifies (action {action!r}): "
                                      "nothing to rotate or truncate")
    keep = effect.params.get("keep") or watch.keep
    path, writer = checked_target(effect.target, watch, ctx.paths.home if ctx.paths is not None else None)
    began = time.monotonic()
    try:
        parent, name = safepath.open_parent(path)     # again: what was matched may have been swapped since
    except safepath.Refused as err:
        raise EffectFailed("refused", str(err)) from None
    except OSError as err:
        raise os_failure("rotate-file found no file", err) from None
    try:
        writer = safepath.joined(parent.writer, writer, path)
        result = safepath.as_writer(writer, path, lambda: trim(parent, name, action, keep, ctx.deadline))
    except safepath.Refused as err:
        raise EffectFailed("refused", str(err)) from None
    finally:
        os.close(parent.fd)
    return {"path": path, "watch": watch.name, **result, **({"as_uid": writer} if writer is not None else {}),
            "took_s": round(time.monotonic() - began, 3)}
