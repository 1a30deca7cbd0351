"""powerfs: a FUSE file system that loses, on a power cut, every write that was not synced.

Run as `python powerfs.py MOUNTPOINT` (foreground). It keeps every file in memory twice: as it is
now, and as it was when last made durable. A file's data is made durable by fsync or fdatasync of
that file; a directory's entries (creates, unlinks, renames, links) only by fsync of that directory,
the strictest reading of POSIX and what SQLite and Pulse must cope with on a real disk. Writing
anything to `/.powercut` (a control file, never listed) is the power cut: every file goes back to
its durable data and every directory to its durable entries; what no durable entry reaches is gone.
The test must first kill every process that writes here (a power cut stops them too).

No write-back cache and no kept page cache (libfuse's defaults): every open re-reads from here, so
after a cut the kernel cannot serve data this file system has dropped. Entry and attribute
timeouts are 0 for the same reason."""

from __future__ import annotations

import errno
import itertools
import os
import stat
import sys
import threading
import time

import mfusepy as fuse

CONTROL = "/.powercut"


class Node:
    """An inode: its data (or entries, or link target) now and as last made durable."""

    def __init__(self, mode: int, target: str = ""):
        self.mode = mode
        self.uid, self.gid = os.getuid(), os.getgid()
        self.mtime = self.ctime = time.time_ns()
        self.data = bytearray()           # a file's bytes now
        self.synced = b""                 # ... and as last fsynced
        self.entries: dict[str, Node] = {}         # a directory's names now
        self.synced_entries: dict[str, Node] = {}  # ... and as last fsynced
        self.target = target              # a symlink's target (durable with the entry naming it)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    def touch(self) -> None:
        self.mtime = self.ctime = time.time_ns()


def power_cut(root: Node) -> dict:
    """Every node reachable from durable entries goes back to its durable state; counts what went."""
    lost = {"bytes": 0, "entries": 0}
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.is_dir:
            lost["entries"] += len(set(node.entries.items()) ^ set(node.synced_entries.items()))
            node.entries = dict(node.synced_entries)
            stack.extend(node.entries.values())
        else:
            lost["bytes"] += abs(len(node.data) - len(node.synced)) + (node.data != node.synced)
            node.data = bytearray(node.synced)
        node.touch()
    return lost


class PowerFS(fuse.Operations):
    use_ns = True

    def __init__(self):
        self.root = Node(stat.S_IFDIR | 0o755)
        self.handles: dict[int, Node] = {}
        self.next_fh = itertools.count(1)
        self.mutex = threading.Lock()
        self.cuts = 0

    # -- paths ------------------------------------------------------------------------------------

    def _node(self, path: str) -> Node:
        node = self.root
        for part in filter(None, path.split("/")):
            if not node.is_dir or part not in node.entries:
                raise fuse.FuseOSError(errno.ENOENT)
            node = node.entries[part]
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._node(head or "/")
        if not parent.is_dir:
            raise fuse.FuseOSError(errno.ENOTDIR)
        return parent, name

    def _file(self, path: str, fh) -> Node:
        return self.handles.get(fh) or self._node(path)

    def _open(self, node: Node) -> int:
        fh = next(self.next_fh)
        self.handles[fh] = node
        return fh

    # -- attributes -------------------------------------------------------------------------------

    def getattr(self, path, fh=None):
        with self.mutex:
            if path == CONTROL:
                return {"st_mode": stat.S_IFREG | 0o600, "st_nlink": 1, "st_size": 0}
            node = self.handles.get(fh) if fh else None
            node = node or self._node(path)
            size = len(node.data) if not node.is_dir else 4096
            if stat.S_ISLNK(node.mode):
                size = len(node.target)
            return {"st_mode": node.mode, "st_nlink": 2 if node.is_dir else 1, "st_size": size,
                    "st_uid": node.uid, "st_gid": node.gid, "st_mtime": node.mtime,
                    "st_ctime": node.ctime, "st_atime": node.mtime,
                    "st_blocks": (size + 511) // 512, "st_blksize": 4096}

    def chmod(self, path, mode):
        with self.mutex:
            node = self._node(path)
            node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
            return 0

    def chown(self, path, uid, gid):
        with self.mutex:
            node = self._node(path)
            node.uid = uid if uid != -1 else node.uid
            node.gid = gid if gid != -1 else node.gid
            return 0

    def utimens(self, path, times=None):
        with self.mutex:
            node = self._node(path)
            node.mtime = times[1] if times else time.time_ns()
            return 0

    def statfs(self, path):
        # room to spare: the full disk is another test's (tests/test_full_disk.py)
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 20, "f_bfree": 1 << 19,
                "f_bavail": 1 << 19, "f_files": 1 << 16, "f_ffree": 1 << 15, "f_favail": 1 << 15,
                "f_namemax": 255}

    # -- directories ------------------------------------------------------------------------------

    def readdir(self, path, fh):
        with self.mutex:
            return [".", "..", *self._node(path).entries]

    def mkdir(self, path, mode):
        with self.mutex:
            parent, name = self._parent(path)
            if name in parent.entries:
                raise fuse.FuseOSError(errno.EEXIST)
            parent.entries[name] = Node(stat.S_IFDIR | (mode & 0o7777))
            parent.touch()
            return 0

    def rmdir(self, path):
        with self.mutex:
            parent, name = self._parent(path)
            node = self._node(path)
            if node.entries:
                raise fuse.FuseOSError(errno.ENOTEMPTY)
            del parent.entries[name]
            parent.touch()
            return 0

    def fsyncdir(self, path, datasync, fh):
        with self.mutex:
            node = self._node(path)
            node.synced_entries = dict(node.entries)
            return 0

    # -- names ------------------------------------------------------------------------------------

    def unlink(self, path):
        with self.mutex:
            parent, name = self._parent(path)
            if name not in parent.entries:
                raise fuse.FuseOSError(errno.ENOENT)
            del parent.entries[name]
            parent.touch()
            return 0

    def rename(self, old, new):
        with self.mutex:
            src, old_name = self._parent(old)
            dst, new_name = self._parent(new)
            node = self._node(old)
            target = dst.entries.get(new_name)
            if target is not None and target.is_dir and target.entries:
                raise fuse.FuseOSError(errno.ENOTEMPTY)
            del src.entries[old_name]
            dst.entries[new_name] = node
            src.touch()
            dst.touch()
            return 0

    def link(self, target, source):
        with self.mutex:
            node = self._node(source)
            parent, name = self._parent(target)
            if name in parent.entries:
                raise fuse.FuseOSError(errno.EEXIST)
            parent.entries[name] = node
            parent.touch()
            return 0

    def symlink(self, target, source):
        with self.mutex:
            parent, name = self._parent(target)
            if name in parent.entries:
                raise fuse.FuseOSError(errno.EEXIST)
            parent.entries[name] = Node(stat.S_IFLNK | 0o777, target=source)
            return 0

    def readlink(self, path):
        with self.mutex:
            return self._node(path).target

    # -- files ------------------------------------------------------------------------------------

    def create(self, path, mode, fi=None):
        with self.mutex:
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                node = parent.entries[name] = Node(stat.S_IFREG | (mode & 0o7777))
                parent.touch()
            return self._open(node)

    def open(self, path, flags):
        with self.mutex:
            if path == CONTROL:
                return 0
            node = self._node(path)
            if flags & os.O_TRUNC:      # atomic_o_trunc: the kernel leaves the truncation to open
                del node.data[:]
                node.touch()
            return self._open(node)

    def release(self, path, fh):
        with self.mutex:
            self.handles.pop(fh, None)
            return 0

    def read(self, path, size, offset, fh):
        with self.mutex:
            return bytes(self._file(path, fh).data[offset:offset + size])

    def write(self, path, data, offset, fh):
        with self.mutex:
            if path == CONTROL:
                lost = power_cut(self.root)
                self.handles.clear()
                self.cuts += 1
                print(f"powerfs: power cut {self.cuts}: {lost['bytes']} bytes and {lost['entries']} "
                      "directory entries dropped", file=sys.stderr, flush=True)
                return len(data)
            node = self._file(path, fh)
            if offset > len(node.data):
                node.data.extend(b"\0" * (offset - len(node.data)))
            node.data[offset:offset + len(data)] = data
            node.touch()
            return len(data)

    def truncate(self, path, length, fh=None):
        with self.mutex:
            if path == CONTROL:
                return 0
            node = self._file(path, fh)
            if length < len(node.data):
                del node.data[length:]
            else:
                node.data.extend(b"\0" * (length - len(node.data)))
            node.touch()
            return 0

    def fallocate(self, path, mode, offset, size, fh):
        with self.mutex:
            node = self._file(path, fh)
            if mode == 0 and offset + size > len(node.data):
                node.data.extend(b"\0" * (offset + size - len(node.data)))
            return 0

    def fsync(self, path, datasync, fh):
        with self.mutex:
            node = self._file(path, fh)
            node.synced = bytes(node.data)
            return 0

    def flush(self, path, fh):
        return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: powerfs.py MOUNTPOINT", file=sys.stderr)
        return 2
    fuse.FUSE(PowerFS(), argv[1], foreground=True, nothreads=True,
              entry_timeout=0, attr_timeout=0, negative_timeout=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
