"""A directory that only grows ([[watch.dir]]), read and planned without following a link.

The directory is walked through descriptors (pulse.core.safepath): each subdirectory is opened
with O_NOFOLLOW from its parent's descriptor, so a link inside it, or a subdirectory swapped for
one, leads nowhere; only regular files count, each named by its path relative to the directory
and known by (device, inode), so a file renamed while the walk runs is counted once and acted on
only if the name still holds that inode, with the size and mtime it had. `plan` is pure: the oldest files by mtime, first, until
the bounds hold, skipping those still open for writing.

`open_for_writing` finds those: one readlink per open descriptor on the host (/proc/*/fd), and an
fstat and a read of /proc/<pid>/fdinfo only for a descriptor whose target lies in the directory.
A writer that mapped a file (mmap) and closed its descriptor is not seen.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Iterator, NamedTuple

from pulse.core import config as configmod
from pulse.core import safepath
from pulse.core.home import inside

MB = 1024 * 1024
MAX_DEPTH = 32               # subdirectories deeper than this are not walked: a hostile account's
                             # thousand nested directories cost neither a thousand descriptors nor the stack


class Entry(NamedTuple):
    rel: str                  # its path below the directory ("job/2026-01-01.md")
    size: int                 # st_size: what it holds, a sparse file's holes too
    mtime: float
    dev: int
    ino: int
    writer: int | None        # the account whose rights it is acted on with (safepath)


class Bounds(NamedTuple):
    max_bytes: int | None
    max_files: int | None
    max_age_s: float | None


def bounds_of(watch: configmod.DirWatch) -> Bounds:
    return Bounds(None if watch.max_mb is None else int(watch.max_mb * MB), watch.max_files, configmod.max_age_s(watch))


def touches_home(path: str, home) -> bool:
    """The directory is the home, lies in it, or holds it: Pulse never trims its own stores."""
    return home is not None and (inside(path, home) or inside(home, path))


def matched_dirs(pattern: str) -> list[str]:
    """Each directory the glob matches, reached without following a link another account could place."""
    return [path for path, st, _ in safepath.matched(pattern) if stat.S_ISDIR(st.st_mode)]


def walk(top: safepath.Dir, rel: str = "", depth: int = 0) -> Iterator[tuple[safepath.Dir, str, os.stat_result]]:
    """(directory, relative path, lstat) of every entry below `top`, MAX_DEPTH levels at most, read
    with scandir through the directory's descriptor; subdirectories opened with safepath.step (a
    link, or a directory swapped for one, is skipped, never followed). `top` stays open; the rest
    are closed."""
    try:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=top.fd)
    except OSError:
        return                                # gone or swapped since it was opened: nothing there
    subdirs = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue                  # gone since it was listed
                yield top, os.path.join(rel, entry.name), st
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(entry.name)
    finally:
        os.close(fd)
    for name in sorted(subdirs) if depth < MAX_DEPTH else ():
        try:
            sub = safepath.step(top, name)
        except (safepath.Refused, OSError):
            continue
        try:
            yield from walk(sub, os.path.join(rel, name), depth + 1)
        finally:
            os.close(sub.fd)


def files(top: safepath.Dir) -> list[Entry]:
    """Each regular file below `top`, once per inode (a name renamed during the walk may be listed
    twice, or not at all); never a link, a device or a fifo."""
    seen: dict[tuple[int, int], Entry] = {}
    for parent, rel, st in walk(top):
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        try:
            writer = safepath.joined(parent.writer, safepath.entry_writer(parent, st), parent.path)
        except safepath.Refused:
            continue                          # placed by a second account: never acted on
        seen[(st.st_dev, st.st_ino)] = Entry(rel, st.st_size, st.st_mtime, st.st_dev, st.st_ino, writer)
    return list(seen.values())


def over(entries: list[Entry], bounds: Bounds, now: float) -> list[str]:
    """The bounds the files break: max_files, max_mb, max_age."""
    broken = []
    if bounds.max_files is not None and len(entries) > bounds.max_files:
        broken.append("max_files")
    if bounds.max_bytes is not None and sum(e.size for e in entries) > bounds.max_bytes:
        broken.append("max_mb")
    if bounds.max_age_s is not None and any(now - e.mtime > bounds.max_age_s for e in entries):
        broken.append("max_age")
    return broken


def plan(entries: list[Entry], bounds: Bounds, now: float, held: set[tuple[int, int]]) -> tuple[list[Entry], bool]:
    """(the files to take away, oldest first by mtime, stopping as soon as the bounds hold; whether
    they will hold then). A file in `held` (open for writing) is never chosen, but still counts."""
    count, total = len(entries), sum(e.size for e in entries)
    chosen = []
    for e in sorted(entries, key=lambda e: (e.mtime, e.rel)):
        too_old = bounds.max_age_s is not None and now - e.mtime > bounds.max_age_s
        too_many = bounds.max_files is not None and count > bounds.max_files
        too_big = bounds.max_bytes is not None and total > bounds.max_bytes
        if not (too_old or too_many or too_big):
            break                             # the rest are newer: none is too old either
        if (e.dev, e.ino) in held:
            continue
        chosen.append(e)
        count, total = count - 1, total - e.size
    gone = set(chosen)
    left = [e for e in entries if e not in gone]
    return chosen, not over(left, bounds, now)


def real_path(top: safepath.Dir) -> str:
    """Where the kernel says the directory's descriptor lies (what /proc/*/fd links name)."""
    return os.readlink(f"/proc/self/fd/{top.fd}")


FD_WRITE_MODES = (os.O_WRONLY, os.O_RDWR)


def open_for_writing(real: str) -> set[tuple[int, int]]:
    """(device, inode) of each file below `real` that some process holds open for writing."""
    prefix = real.rstrip("/") + "/"
    held: set[tuple[int, int]] = set()
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return held
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue                          # gone, or a process we may not look into
        for fd in fds:
            link = f"/proc/{pid}/fd/{fd}"
            try:
                if not os.readlink(link).startswith(prefix):
                    continue
                st = os.stat(link)
                if writing(pid, fd):
                    held.add((st.st_dev, st.st_ino))
            except OSError:
                continue                      # closed meanwhile
    return held


def writing(pid: str, fd: str) -> bool:
    """Whether that descriptor was opened for writing (its fdinfo flags' access mode)."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE in FD_WRITE_MODES
    except (OSError, ValueError):
        return False
    return False


def open_sub(top: safepath.Dir, rel_dir: str) -> safepath.Dir:
    """The subdirectory `rel_dir` of `top`, stepped into one part at a time, never through a link
    (Refused); `top` itself (a descriptor of its own) for "". The caller closes it."""
    current = top._replace(fd=os.dup(top.fd))
    try:
        for name in [p for p in rel_dir.split("/") if p]:
            following = safepath.step(current, name)
            os.close(current.fd)
            current = following
    except BaseException:
        os.close(current.fd)
        raise
    return current


def still_there(parent: safepath.Dir, name: str, entry: Entry) -> bool:
    """The name still holds the regular file that was planned, as it was (not one renamed or made in
    its place: a freed inode number is soon given again, so its size and mtime must match too)."""
    try:
        st = safepath.lstat_in(parent, name)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            return False
        raise
    return stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino, st.st_size, st.st_mtime) == \
        (entry.dev, entry.ino, entry.size, entry.mtime)
