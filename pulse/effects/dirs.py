"""trim-dir: a directory that a [[watch.dir]] glob matches, kept within its bounds.

Its regular files (however deep, never through a link: pulse.core.dirscan) are taken away oldest
first by mtime, stopping as soon as max_files, max_mb and max_age hold. A file some process holds
open for writing (/proc/*/fd) is never touched; a name that no longer holds the inode that was
planned (renamed, or replaced, meanwhile) is skipped. `oldest = "delete"` unlinks each; `archive`
first copies each into objects/ and commits a `dir-archived` event naming its path and blob, and
only then unlinks it: an archived file is always found again, even if the executor dies next.
Subdirectories left empty are removed; the directory itself stays.

Every name is acted on relative to its directory's descriptor, and, under a directory another
account may write, with that account's rights (safepath.as_writer): a link or a hard link it
placed makes Pulse do nothing it could not do itself. Refused (reason `refused`) for a target the
named [[watch.dir]] does not match as a directory (a directory swapped for a link matches nothing)
and for the Pulse home, a directory in it or one holding it. Acked with the files and bytes taken
away; failed with reason `still-over` (and what it did) when files open for writing, or skipped,
keep the directory over a bound.
"""

from __future__ import annotations

import os
import stat
import time

from pulse.core import dirscan, safepath
from pulse.core.config import DirWatch, ExecutorConfig
from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import DIR_ARCHIVED
from pulse.effects.kinds import EffectContext, EffectFailed, os_failure
from pulse.store import objects

BATCH = 100                  # files removed per step (one fork, under another account's directory), and
                             # copied into objects/ per dir-archived event before they are removed
ARCHIVED_PER_EFFECT = 1000   # at most this many per effect (the events stay small); the next sample goes on
NAMED_IN_ACK = 20            # the ack names the first files it deleted


def configured_dir_watch(config: ExecutorConfig, name: object) -> DirWatch:
    watch = next((w for w in config.watch.dir if w.name == name), None)
    if watch is None:
        known = ", ".join(w.name for w in config.watch.dir) or "none"
        raise EffectFailed("bad-params", f"no [[watch.dir]] named {name!r} (known: {known})")
    return watch


def checked_dir(target: str | None, watch: DirWatch, home) -> str:
    if not target or not os.path.isabs(target):
        raise EffectFailed("bad-params", f"the target must be the absolute path of a directory, got {target!r}")
    if target not in dirscan.matched_dirs(watch.path):
        raise EffectFailed("refused", f"{target} is not a directory [[watch.dir]] {watch.name!r} matches "
                                      f"(path {watch.path!r}, never through a link): trim-dir acts on nothing else")
    if dirscan.touches_home(target, home):
        raise EffectFailed("refused", f"{target} is the Pulse home ({home}), inside it, or holds it: "
                                      "Pulse never trims its own files")
    return target


class Trim:
    """One trim of one directory: the subdirectories it opened, and what it did so far."""

    def __init__(self, top: safepath.Dir, ctx: EffectContext, watch: DirWatch):
        self.top, self.ctx, self.watch = top, ctx, watch
        self.subs: dict[str, safepath.Dir] = {}
        self.removed: list[dirscan.Entry] = []
        self.skipped = 0
        self.archived = 0
        self.more = False            # stopped by the deadline or the archive cap: the next sample goes on

    def sub(self, rel_dir: str) -> safepath.Dir:
        if rel_dir not in self.subs:
            self.subs[rel_dir] = dirscan.open_sub(self.top, rel_dir)
        return self.subs[rel_dir]

    def close(self) -> None:
        for d in self.subs.values():
            os.close(d.fd)

    def path(self, e: dirscan.Entry) -> str:
        return os.path.join(self.top.path, e.rel)

    # -- removing, with the rights of whoever could have placed each file ----------------------------

    def remove(self, batch: list[tuple[dirscan.Entry, tuple[int, float] | None]]) -> None:
        """Unlink each file of the batch that still is the one planned (and, when `expected` is given,
        still has that size and mtime: what was archived), grouped by the account whose rights apply."""
        by_writer: dict[int | None, list] = {}
        for e, expected in batch:
            try:
                parent = self.sub(os.path.dirname(e.rel))
            except (safepath.Refused, OSError):
                self.skipped += 1
                continue                   # its directory swapped for a link, or gone: nothing there
            by_writer.setdefault(e.writer, []).append((parent, e, expected))
        for writer, items in by_writer.items():
            done = safepath.as_writer(writer, self.top.path, lambda items=items: unlink_all(items))
            for (_, e, _), ok in zip(items, done):
                if ok:
                    self.removed.append(e)
                else:
                    self.skipped += 1

    def delete(self, chosen: list[dirscan.Entry]) -> None:
        for start in range(0, len(chosen), BATCH):
            if time.monotonic() > self.ctx.deadline:
                self.more = True
                return
            self.remove([(e, None) for e in chosen[start:start + BATCH]])

    # -- archiving: copied and recorded first ---------------------------------------------------------

    def archive(self, chosen: list[dirscan.Entry]) -> None:
        for start in range(0, len(chosen), BATCH):
            if time.monotonic() > self.ctx.deadline or self.archived >= ARCHIVED_PER_EFFECT:
                self.more = True
                return
            copied = [c for e in chosen[start:start + BATCH] if (c := self.copy(e)) is not None]
            if not copied:
                continue
            self.ctx.record(DIR_ARCHIVED, {"watch": self.watch.name, "dir": self.top.path, "files": [
                {"path": self.path(e), "object": ref, "bytes": size, "mtime": mtime, "mode": mode}
                for e, ref, size, mtime, mode in copied]})
            self.archived += len(copied)
            self.remove([(e, (size, mtime)) for e, _, size, mtime, _ in copied])

    def copy(self, e: dirscan.Entry) -> tuple[dirscan.Entry, str, int, float, int] | None:
        """The file into objects/: (it, its blob, bytes, mtime, permission bits), or None when it is no
        longer the file planned, not the writer's own (a hard link to another's file is never read as
        root), or not copied in time."""
        try:
            parent = self.sub(os.path.dirname(e.rel))
            fd = os.open(os.path.basename(e.rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=parent.fd)
        except (safepath.Refused, OSError):
            self.skipped += 1
            return None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime) != (e.dev, e.ino, e.size, e.mtime) or \
                    (e.writer is not None and st.st_uid != e.writer):
                self.skipped += 1
                return None
            try:
                ref, size = objects.put_fd(self.ctx.objects, fd, self.ctx.deadline)
            except TimeoutError:
                self.more = True
                return None
            return e, ref, size, st.st_mtime, stat.S_IMODE(st.st_mode)
        finally:
            os.close(fd)

    def prune(self) -> None:
        """Subdirectories the trim emptied, deepest first (one still holding anything stays)."""
        for rel_dir in sorted((r for r in self.subs if r), key=lambda r: -r.count("/")):
            try:
                parent = self.sub(os.path.dirname(rel_dir))
            except (safepath.Refused, OSError):
                continue
            # the entry lies in the parent: whoever could write there could have placed it
            where, name = os.path.join(parent.path, os.path.basename(rel_dir)), os.path.basename(rel_dir)
            safepath.as_writer(parent.writer, where, lambda p=parent, n=name: rmdir_if_empty(p, n))


def unlink_all(items: list[tuple[safepath.Dir, dirscan.Entry, tuple[int, float] | None]]) -> list[bool]:
    """Unlink each name that still holds the planned inode (and size and mtime, when given)."""
    done = []
    for parent, e, expected in items:
        name = os.path.basename(e.rel)
        ok = dirscan.still_there(parent, name, e)
        if ok and expected is not None:
            st = safepath.lstat_in(parent, name)
            ok = (st.st_size, st.st_mtime) == expected      # written to since it was copied: kept
        if ok:
            try:
                os.unlink(name, dir_fd=parent.fd)
            except FileNotFoundError:
                ok = False
        done.append(ok)
    return done


def rmdir_if_empty(parent: safepath.Dir, name: str) -> bool:
    try:
        os.rmdir(name, dir_fd=parent.fd)  # never a link (ENOTDIR), never one holding anything
    except OSError:
        return False
    return True


def run_trim_dir(effect: Effect, ctx: EffectContext) -> dict:
    watch = configured_dir_watch(ctx.config, effect.params.get("watch"))
    path = checked_dir(effect.target, watch, ctx.paths.home if ctx.paths is not None else None)
    bounds = dirscan.bounds_of(watch)
    began = time.monotonic()
    try:
        top = safepath.open_dir(path)     # again: what was matched may have been swapped since
    except safepath.Refused as err:
        raise EffectFailed("refused", str(err)) from None
    except OSError as err:
        raise os_failure("trim-dir found no directory", err) from None
    trim = Trim(top, ctx, watch)
    try:
        entries = dirscan.files(top)
        held = dirscan.open_for_writing(dirscan.real_path(top))
        now = time.time()
        chosen, will_hold = dirscan.plan(entries, bounds, now, held)
        broken = dirscan.over(entries, bounds, now)
        try:
            (trim.archive if watch.oldest == "archive" else trim.delete)(chosen)
            trim.prune()
        except OSError as err:
            raise os_failure(f"trim-dir of {path} stopped", err, **outcome(trim, entries, broken, held, began)) from None
        except safepath.Refused as err:
            raise EffectFailed("refused", str(err), **outcome(trim, entries, broken, held, began)) from None
    finally:
        trim.close()
        os.close(top.fd)
    done = outcome(trim, entries, broken, held, began)
    if not trim.more and (not will_hold or trim.skipped):
        gone = set(trim.removed)
        left = dirscan.over([e for e in entries if e not in gone], bounds, time.time())
        if left:
            raise EffectFailed("still-over", f"{path} is still over {', '.join(left)}: {done['held_open']} "
                                             f"file(s) open for writing and {trim.skipped} that changed or went "
                                             "away meanwhile were left", **done)
    return done


def outcome(trim: Trim, entries: list[dirscan.Entry], broken: list[str], held: set, began: float) -> dict:
    removed_bytes = sum(e.size for e in trim.removed)
    return {"path": trim.top.path, "watch": trim.watch.name, "oldest": trim.watch.oldest, "over": broken,
            "removed": len(trim.removed), "bytes_freed": removed_bytes, "archived": trim.archived,
            "files_left": len(entries) - len(trim.removed),
            "bytes_left": sum(e.size for e in entries) - removed_bytes,
            "held_open": sum(1 for e in entries if (e.dev, e.ino) in held), "skipped": trim.skipped,
            "more": trim.more, "first_removed": [trim.path(e) for e in trim.removed[:NAMED_IN_ACK]],
            "took_s": round(time.monotonic() - began, 3)}
