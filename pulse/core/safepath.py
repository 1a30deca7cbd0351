"""Paths Pulse acts on as root beside accounts that may be hostile: reached without following a link,
acted on through the descriptor that was checked, and with the rights of whoever else could have
placed what is there.

A path is opened one component at a time from `/` (openat with O_NOFOLLOW | O_DIRECTORY, each from
the descriptor of the one before), so a directory that is, or becomes, a symbolic link is refused
rather than followed, and `..` is refused outright: the path acted on is the path the operator's
config names, never where a link placed later points. The caller then acts relative to the
directory's descriptor (openat, renameat, unlinkat, fstat), so swapping a directory for a link after
the check changes nothing.

On the way, each directory says who besides root and Pulse's own account could have put things
in it (its `writer`): its owner, when that is another account; for a directory other accounts
share (/tmp; a group-writable /var/log), the owner of each entry in it instead: links are never
followed, and with fs.protected_hardlinks nobody can hard-link there what they could not already
write (without it, such a directory is refused, unless sticky). What lies under another account's directory is
acted on with that account's rights (`as_writer`: a forked child that drops to its uid, its
groups, and acts through the inherited descriptors): whatever it placed there, a hard link to
root's file included, Pulse can do no more to it than that account could itself.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import pickle
import pwd
import stat
from typing import Callable, Iterator, NamedTuple, TypeVar

T = TypeVar("T")

DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """A path Pulse will not act on as it stands; the message names the path and why."""


class Dir(NamedTuple):
    fd: int                 # O_PATH descriptor of the directory (the caller closes it)
    path: str               # as the config named it
    writer: int | None      # the one other account whose directories lead here, if any
    shared: bool            # a sticky directory others may write: its entries' owners count


def trusted(uid: int) -> bool:
    """Root and Pulse's own account: what they placed is Pulse's to act on."""
    return uid == 0 or uid == os.geteuid()


def _trusted_group(gid: int) -> bool:
    return gid == 0 or gid == os.getegid()


def joined(writer: int | None, other: int | None, path: str) -> int | None:
    """The one account two checks found, or Refused when they found two different ones."""
    if other is None or writer == other:
        return writer
    if writer is None:
        return other
    raise Refused(f"{path} lies under directories of two accounts (uids {writer} and {other}): "
                  "Pulse acts there for neither")


def hardlinks_protected() -> bool:
    """fs.protected_hardlinks: nobody may hard-link a file they could not already read and write."""
    try:
        with open("/proc/sys/fs/protected_hardlinks") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def dir_writer(st: os.stat_result, path: str) -> tuple[int | None, bool]:
    """(the other account that owns this directory, whether other accounts share it: then each
    entry's owner is who could have placed it). A directory a group or everyone may write without
    the sticky bit (/var/log, root:syslog 0775 on some hosts) is shared only while the kernel keeps
    hard links to what an account may not already write out of it; else it is refused."""
    mode = st.st_mode
    sticky = bool(mode & stat.S_ISVTX)
    others = bool(mode & stat.S_IWOTH) or (bool(mode & stat.S_IWGRP) and not _trusted_group(st.st_gid))
    if others and not sticky and not hardlinks_protected():
        who = "every account" if mode & stat.S_IWOTH else f"group {st.st_gid}"
        raise Refused(f"{path} is writable by {who} and fs.protected_hardlinks is off: Pulse acts in it for nobody")
    return (None if trusted(st.st_uid) else st.st_uid), others


def entry_writer(parent: Dir, st: os.stat_result) -> int | None:
    """Who besides Pulse could have placed an entry of `parent` (its owner, in a shared directory)."""
    return st.st_uid if parent.shared and not trusted(st.st_uid) else None


def parts_of(path: str) -> list[str]:
    if not os.path.isabs(path):
        raise Refused(f"{path!r} is not an absolute path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"{path} goes up a directory (..): never resolved")
    return parts


def _why_not_dir(parent_fd: int, name: str, where: str, err: OSError) -> Exception:
    if err.errno in (errno.ENOTDIR, errno.ELOOP):
        try:
            if stat.S_ISLNK(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode):
                return Refused(f"{where} is a symbolic link: never followed")
        except OSError:
            pass
    err.filename = where
    return err


def step(parent: Dir, name: str) -> Dir:
    """The directory `name` in `parent`, never through a link (Refused), with who may write it."""
    where = os.path.join(parent.path, name)
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent.fd)
    except OSError as err:
        raise _why_not_dir(parent.fd, name, where, err) from None
    try:
        st = os.fstat(fd)
        owner = entry_writer(parent, st)
        writer, shared = dir_writer(st, where)
        return Dir(fd, where, joined(joined(parent.writer, owner, where), writer, where), shared)
    except BaseException:
        os.close(fd)
        raise


def step_or_follow(parent: Dir, name: str, hops: int = 8) -> Dir:
    """step(), except that a link root or Pulse placed where nobody else may write (/var/run -> /run,
    a merged /lib) is followed: its target walked from / as any path is, named as written."""
    try:
        return step(parent, name)
    except Refused:
        if parent.writer is not None or parent.shared or hops <= 0:
            raise
        try:
            st = lstat_in(parent, name)
            target = os.readlink(name, dir_fd=parent.fd)
        except OSError:
            raise Refused(f"{os.path.join(parent.path, name)} is not a directory") from None
        if not stat.S_ISLNK(st.st_mode) or not trusted(st.st_uid):
            raise
        where = os.path.join(parent.path, name)
        # parent.path holds no link another account placed: `..` in a relative target is its parent
        resolved = target if os.path.isabs(target) else os.path.normpath(os.path.join(parent.path, target))
        return open_dir(resolved, hops - 1)._replace(path=where)


def root() -> Dir:
    fd = os.open("/", DIR_FLAGS)
    try:
        writer, shared = dir_writer(os.fstat(fd), "/")
    except BaseException:
        os.close(fd)
        raise
    return Dir(fd, "/", writer, shared)


def open_dir(path: str, hops: int = 8) -> Dir:
    """The directory at `path`, reached from / without following a link another account could
    have placed (Refused, or an OSError naming the missing part)."""
    current = root()
    try:
        for name in parts_of(path):
            following = step_or_follow(current, name, hops)
            os.close(current.fd)
            current = following
    except BaseException:
        os.close(current.fd)
        raise
    return current


def open_parent(path: str) -> tuple[Dir, str]:
    """(the directory holding `path`'s last component, that component)."""
    parts = parts_of(path)
    if not parts:
        raise Refused("/ has no parent")
    return open_dir("/" + "/".join(parts[:-1])), parts[-1]


def lstat_in(parent: Dir, name: str) -> os.stat_result:
    return os.stat(name, dir_fd=parent.fd, follow_symlinks=False)


def listing(parent: Dir) -> list[str]:
    """The names in a directory, read through its descriptor."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent.fd)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def fsync_dir(parent: Dir) -> None:
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent.fd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- globs, matched without following a link ----------------------------------------------------------

def _matches(name: str, pattern: str) -> bool:
    if name.startswith(".") and not pattern.startswith("."):
        return False                     # as glob: a hidden name only for a pattern that says so
    return fnmatch.fnmatchcase(name, pattern)


def _subdirs(parent: Dir) -> Iterator[Dir]:
    """Each real directory in `parent` (links and refused ones skipped), opened."""
    for name in sorted(listing(parent)):
        if name.startswith("."):
            continue
        try:
            yield step(parent, name)
        except (Refused, OSError):
            continue


def _walk(parent: Dir, parts: list[str]) -> Iterator[tuple[Dir, str]]:
    """(directory, name) of each entry that the remaining pattern parts match under `parent`."""
    head, rest = parts[0], parts[1:]
    if head == "**":
        if rest:
            yield from _walk(parent, rest)
        else:
            yield from ((parent, n) for n in sorted(listing(parent)) if not n.startswith("."))
        for sub in _subdirs(parent):
            try:
                yield from _walk(sub, parts)
            finally:
                os.close(sub.fd)
        return
    names = [n for n in sorted(listing(parent)) if _matches(n, head)] if _magic(head) else [head]
    if not rest:
        yield from ((parent, n) for n in names)
        return
    for name in names:
        try:
            sub = step_or_follow(parent, name)
        except (Refused, OSError):
            continue
        try:
            yield from _walk(sub, rest)
        finally:
            os.close(sub.fd)


def _magic(part: str) -> bool:
    return any(c in part for c in "*?[")


def matched(pattern: str) -> list[tuple[str, os.stat_result, int | None]]:
    """(path, lstat, writer) of each entry an absolute glob matches (`**` spans directories), reached
    without following a link: a directory that is a link, or one that no account may be trusted in,
    matches nothing beneath it. An entry that is itself a link is matched, never followed."""
    try:
        parts = parts_of(pattern)
    except Refused:
        return []                         # `..`: the path as written is not where it leads
    if not parts:
        return []
    found = []
    start = root()
    try:
        for parent, name in _walk(start, parts):
            try:
                st = lstat_in(parent, name)
            except OSError:
                continue                  # gone since it was listed
            try:
                writer = joined(parent.writer, entry_writer(parent, st), parent.path)
            except Refused:
                continue                  # placed by a second account: matches nothing
            found.append((os.path.join(parent.path, name), st, writer))
    except (Refused, OSError):
        pass                              # the fixed part of the pattern is missing or refused: nothing matches
    finally:
        os.close(start.fd)
    return found


def regular_files(pattern: str) -> list[tuple[str, os.stat_result, int | None]]:
    """What matched() finds that is a regular file: never a link, a directory or a device."""
    return [m for m in matched(pattern) if stat.S_ISREG(m[1].st_mode)]


# -- acting with another account's rights -------------------------------------------------------------

def as_writer(writer: int | None, what: str, act: Callable[[], T]) -> T:
    """act(), in this process when nobody but root and Pulse could have placed what it acts on;
    else in a forked child with `writer`'s rights (its uid, primary group and groups), acting
    through the descriptors it inherits. Refused when Pulse cannot take those rights (not root)."""
    if writer is None or writer == os.geteuid():
        return act()
    if os.geteuid() != 0:
        raise Refused(f"{what} lies in a directory uid {writer} may write, and Pulse (uid {os.geteuid()}) "
                      "cannot act with that account's rights")
    rights = rights_of(writer)            # looked up before the fork: the child takes no lock another thread held
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                          # the child: drop, act, say how it went, and leave at once
        try:
            os.close(read_end)
            drop_to(writer, *rights)
            outcome = ("ok", act())
        except BaseException as err:      # noqa: BLE001 - everything goes back to the parent
            outcome = ("err", err)
        try:
            data = pickle.dumps(outcome)
        except Exception as err:          # noqa: BLE001
            data = pickle.dumps(("err", RuntimeError(f"{type(err).__name__}: {err}")))
        try:
            with os.fdopen(write_end, "wb") as out:
                out.write(data)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"the child acting on {what} as uid {writer} said nothing (wait status {status})")
    kind, value = pickle.loads(data)
    if kind == "err":
        raise value
    return value


def rights_of(uid: int) -> tuple[int, list[int]]:
    """(primary group, groups) of the account `uid`; an account no longer listed gets none but its uid."""
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        return uid, []
    return account.pw_gid, os.getgrouplist(account.pw_name, account.pw_gid)


def drop_to(uid: int, gid: int, groups: list[int]) -> None:
    """This process takes `uid`'s rights for good: its groups, its primary group, then its uid."""
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def open_existing(path: str) -> tuple[Dir, list[str]]:
    """(the deepest directory of `path` that exists, reached as open_dir does; the parts below it
    that do not exist yet)."""
    parts = parts_of(path)
    current = root()
    try:
        for i, name in enumerate(parts):
            try:
                following = step_or_follow(current, name)
            except FileNotFoundError:
                return current, parts[i:]
            os.close(current.fd)
            current = following
    except BaseException:
        os.close(current.fd)
        raise
    return current, []


def make_dirs(parent: Dir, missing: list[str], mode: int = 0o755) -> Dir:
    """`missing` made one under the other in `parent` (mkdirat, each then opened without following
    a link); the last, opened. `parent` stays open."""
    current = parent
    try:
        for name in missing:
            try:
                os.mkdir(name, mode, dir_fd=current.fd)
            except FileExistsError:
                pass                      # made meanwhile: step() says whether it is a directory
            following = step(current, name)
            if current is not parent:
                os.close(current.fd)
            current = following
    except BaseException:
        if current is not parent:
            os.close(current.fd)
        raise
    if current is parent:                 # nothing was missing: a descriptor of its own to close
        return parent._replace(fd=os.dup(parent.fd))
    return current


MAX_LINK_HOPS = 8


def open_file_parent(path: str, hops: int = MAX_LINK_HOPS) -> tuple[Dir, str]:
    """(the directory holding the file `path` names, its name there), where a last component that
    is a symbolic link is followed, as a path resolved the same way (every directory of the link's
    own path and of its target's checked, their writers joined): a link the operator placed in a
    directory only root may write is the operator's word, and one another account placed is acted
    on with that account's rights all the same."""
    parent, name = open_parent(path)
    writer = parent.writer
    for _ in range(hops):
        try:
            st = lstat_in(parent, name)
        except FileNotFoundError:
            return parent, name
        except BaseException:
            os.close(parent.fd)
            raise
        if not stat.S_ISLNK(st.st_mode):
            return parent, name
        try:
            writer = joined(writer, entry_writer(parent, st), path)
            target = os.readlink(name, dir_fd=parent.fd)
        finally:
            os.close(parent.fd)
        # parent.path holds no link (it was walked without following one): `..` in a relative target
        # means its parent, as the kernel would read it
        following = target if os.path.isabs(target) else os.path.normpath(os.path.join(parent.path, target))
        parent, name = open_parent(following)
        try:
            writer = joined(writer, parent.writer, path)
        except BaseException:
            os.close(parent.fd)
            raise
        parent = parent._replace(writer=writer)
    os.close(parent.fd)
    raise Refused(f"{path}: more than {hops} symbolic links in a row")


def open_readable(path: str) -> int:
    """A read-only descriptor on the regular file `path` names, for a watcher reading as root: its
    directories never through a link, a last-component link followed only where nobody but root
    and Pulse could have placed it, and under another account's directory only a file that account
    owns (not a hard link it made to someone else's). Refused, or the OSError of a missing file."""
    parent, name = open_parent(path)
    try:
        st = lstat_in(parent, name)
        if stat.S_ISLNK(st.st_mode) and parent.writer is None and not parent.shared:
            os.close(parent.fd)
            parent, name = open_file_parent(path)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent.fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise Refused(f"{path} is a symbolic link another account could have placed: never followed") from None
        err.filename = path
        raise
    finally:
        os.close(parent.fd)
    st = os.fstat(fd)
    owner_ok = parent.writer is None or st.st_uid == parent.writer
    if not stat.S_ISREG(st.st_mode) or not owner_ok:
        os.close(fd)
        raise Refused(f"{path} is not a regular file" if owner_ok else
                      f"{path} lies in uid {parent.writer}'s directory but is uid {st.st_uid}'s: never read as root")
    return fd
