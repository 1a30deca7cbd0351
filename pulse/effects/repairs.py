"""What the kinds that act on files, pulsed and the engine do, in-process: archive, cleanup,
restart-worker, engine-promote, engine-rollback (pulse.effects.kinds has those that start a process).

Not every one is a repair, despite this module's name: whether a kind is one is its descriptor's
`repairs` in pulse.effects.registry, the one place that says so.

Each takes the effect's params and returns a JSON-able result, or raises EffectFailed to fail
the effect with a reason that names what is wrong: what the effect asked for (`bad-params`), the
host it acts on (`not-permitted`, `no-space`, `bad-path`, `io`), pulsed (`unreachable`,
`refused`, `not-enabled`), the engine's promote checks (`refused`). Anything else it raises is a
bug, and the executor records it as one. None of them touches events.db: it is the record of
what happened.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pulse.core import client, safepath
from pulse.core.childspecs import STEERABLE, WEB
from pulse.core.config import ExecutorConfig
from pulse.core.home import Paths, inside
from pulse.core.wire import controlmsgs
from pulse.effects.kinds import EffectFailed, os_failure
from pulse.store import connection, eventsdb, objects, vitalsdb

if TYPE_CHECKING:
    from pulse.engine.repo import EngineDirError

PULSED_ANSWER_S = 3.0


def home_overlap(path: Path, home: Path) -> str | None:
    """How `path` (symlinks and `..` resolved) meets Pulse's home, or None if it does not: the home
    itself, a path inside it, or a folder that holds it. Whoever emits an archive or a cleanup, the
    home (events.db, the engine, the token) is never moved or deleted by one."""
    if inside(path, home):
        return "is Pulse's home" if inside(home, path) else "is inside Pulse's home"
    if inside(home, path):
        return "holds Pulse's home"
    return None


def fixed_part(pattern: str) -> str:
    """The directory a glob's matches all lie under: its leading components without a wildcard."""
    parts = pattern.split("/")
    fixed = []
    for part in parts[:-1]:
        if any(c in part for c in "*?["):
            break
        fixed.append(part)
    return "/".join(fixed) or "/"


def named_dirs(config: ExecutorConfig) -> list[str]:
    """The directories the operator's config names for files Pulse may move or delete: [survival]
    archive_from and archive_to, and where the [survival] cleanup and [[watch.file]] globs lie."""
    s = config.survival
    dirs = [s.archive_from, s.archive_to, *map(fixed_part, s.cleanup), *(fixed_part(w.path) for w in config.watch.file)]
    return [d.rstrip("/") or "/" for d in dirs if d]


def unnamed(path: str, named: list[str] | None) -> bool:
    """Does `path` lie outside every directory in `named` (None: no confinement)? Compared as written:
    safepath follows no link, so the path written is the path acted on."""
    if named is None:
        return False
    return not any(path == d or path.startswith(d.rstrip("/") + "/") for d in named)


def archive(params: dict, home: Path, now: float | None = None, named: list[str] | None = None) -> dict:
    """Move files under `from` older than `older_than_h` into `to`, keeping their relative paths.
    Both are absolute: registry.ArchiveParams checks them before the effect is claimed. Neither
    may meet the home (home_overlap): refused, nothing moved. Both are reached, and walked, without
    following a link (pulse.core.safepath), and under another account's directory the files are
    moved with that account's rights. With `named` (an agent's or the engine's archive), both must
    lie in a directory the operator's config names (named_dirs)."""
    source, dest = Path(params["from"]), Path(params["to"])
    for field, path in (("from", source), ("to", dest)):
        if problem := home_overlap(path, home):
            raise EffectFailed("refused", f"archive {field} {str(path)!r} {problem}; it is never archived")
        if unnamed(str(path), named):
            raise EffectFailed("refused", f"archive {field} {str(path)!r} lies in no directory the config names "
                                          f"({', '.join(named) or 'none'}): not for an agent or the engine")
    cutoff = (time.time() if now is None else now) - float(params.get("older_than_h", 72)) * 3600
    opened: list[safepath.Dir] = []
    try:
        src = safepath.open_dir(str(source))
        opened.append(src)
        dst, missing = safepath.open_existing(str(dest))
        opened.append(dst)
        writer = safepath.joined(src.writer, dst.writer, f"archive from {source} to {dest}")
        return safepath.as_writer(writer, str(source), lambda: move_old(src, dst, missing, cutoff))
    except safepath.Refused as err:
        raise EffectFailed("refused", f"archive: {err}; nothing moved") from None
    except OSError as err:
        raise os_failure(f"archive from {source} to {dest} moved nothing", err, moved=0, bytes=0) from None
    finally:
        for d in opened:
            os.close(d.fd)


def move_old(src: safepath.Dir, dst_parent: safepath.Dir, missing: list[str], cutoff: float) -> dict:
    """Move every regular file under `src` last changed before `cutoff` to the same place under
    `dst_parent`/`missing` (made when first needed), through descriptors alone."""
    done = {"moved": 0, "bytes": 0}
    try:
        _move_tree(src, lambda: safepath.make_dirs(dst_parent, missing), cutoff, done)
    except safepath.Refused as err:
        raise EffectFailed("refused", f"archive moved {done['moved']} file(s), then stopped: {err}", **done) from None
    except OSError as err:
        raise os_failure(f"archive moved {done['moved']} file(s), then stopped", err, **done) from None
    return done


def _move_tree(src: safepath.Dir, target, cutoff: float, done: dict) -> None:
    """Move what is old under `src` into target() (a directory made on first need, closed here)."""
    dst: safepath.Dir | None = None

    def here() -> safepath.Dir:
        nonlocal dst
        if dst is None:
            dst = target()
        return dst

    try:
        for name in sorted(safepath.listing(src)):
            st = safepath.lstat_in(src, name)
            if stat.S_ISDIR(st.st_mode):
                sub = safepath.step(src, name)
                try:
                    _move_tree(sub, lambda name=name: safepath.make_dirs(here(), [name]), cutoff, done)
                finally:
                    os.close(sub.fd)
            elif stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:   # never a link, a fifo or a device
                _move_file(src, here(), name, st)
                done["moved"] += 1
                done["bytes"] += st.st_size
    finally:
        if dst is not None:
            os.close(dst.fd)


def _move_file(src: safepath.Dir, dst: safepath.Dir, name: str, st: os.stat_result) -> None:
    """renameat; across file systems a copy (created, never through a link), fsynced, then the unlink."""
    try:
        os.rename(name, name, src_dir_fd=src.fd, dst_dir_fd=dst.fd)
        return
    except OSError as err:
        if err.errno != errno.EXDEV:
            err.filename = os.path.join(src.path, name)
            raise
    fd_in = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src.fd)
    try:
        fd_out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                         stat.S_IMODE(st.st_mode), dir_fd=dst.fd)
        try:
            while chunk := os.read(fd_in, 1024 * 1024):
                os.write(fd_out, chunk)
            os.fsync(fd_out)
        finally:
            os.close(fd_out)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst.fd, follow_symlinks=False)
    finally:
        os.close(fd_in)
    os.unlink(name, dir_fd=src.fd)


def cleanup(params: dict, paths: Paths, config: ExecutorConfig, named: list[str] | None = None) -> dict:
    """Delete files matching the absolute glob patterns (registry.CleanupParams checks them before the
    effect is claimed, so a bad one deletes nothing); gc vitals and objects. The globs are matched
    without following a link (pulse.core.safepath), each file is unlinked through its directory's
    descriptor, and one under another account's directory with that account's rights. With `named`
    (an agent's or the engine's cleanup), every pattern must lie in a directory the config names."""
    for pattern in params.get("patterns", []):
        if unnamed(fixed_part(pattern), named):
            raise EffectFailed("refused", f"cleanup pattern {pattern!r} lies in no directory the config names "
                                          f"({', '.join(named) or 'none'}): not for an agent or the engine; nothing deleted")
    by_dir: dict[str, list[str]] = {}
    for pattern in params.get("patterns", []):
        for name, _, _ in safepath.regular_files(pattern):
            if not home_overlap(Path(name), paths.home):
                by_dir.setdefault(os.path.dirname(name), []).append(os.path.basename(name))
    done = {"removed": 0, "bytes": 0}
    for directory, names in by_dir.items():
        try:
            parent = safepath.open_dir(directory)
        except (safepath.Refused, OSError):
            continue                      # swapped or gone since it was matched: nothing of it is deleted
        try:
            removed = safepath.as_writer(parent.writer, directory, lambda: delete_regular(parent, sorted(set(names))))
        except safepath.Refused:
            continue
        except OSError as err:
            raise os_failure(f"cleanup removed {done['removed']} file(s), then stopped", err, **done) from None
        finally:
            os.close(parent.fd)
        done["removed"] += removed["removed"]
        done["bytes"] += removed["bytes"]
    result: dict = dict(done)
    if params.get("vitals_gc"):
        conn = vitalsdb.open_vitals(paths.vitals_db)
        try:
            result["vitals_removed"] = vitalsdb.gc_vitals(conn, time.time() - config.store.vitals_retention_h * 3600)
        finally:
            conn.close()
    if params.get("objects_gc"):
        conn = connection.open_readonly(paths.events_db)
        try:
            referenced = eventsdb.referenced_objects(conn)
        finally:
            conn.close()
        result["objects_removed"] = len(objects.gc(paths.objects, referenced,
                                                   config.store.objects_retention_days * 86400))
    return result


def delete_regular(parent: safepath.Dir, names: list[str]) -> dict:
    """unlinkat each name that is still a regular file in `parent`: how many, and their bytes."""
    done = {"removed": 0, "bytes": 0}
    for name in names:
        try:
            st = safepath.lstat_in(parent, name)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        try:
            os.unlink(name, dir_fd=parent.fd)
        except OSError as err:
            err.filename = os.path.join(parent.path, name)
            raise
        done["removed"] += 1
        done["bytes"] += st.st_size
    return done


def web_enabled(status: controlmsgs.Status) -> bool:
    """pulsed lists the web worker only while [web] enabled is in force."""
    return any(w.name == WEB for w in status.workers)


def restart_worker(name: str | None, paths: Paths) -> dict:
    """Ask pulsed to restart a worker (an operator-style restart: never counted as a crash). The web
    worker too, while it is enabled; pulsed's status says whether it is (the executor's own config
    does not hold [web])."""
    if name not in STEERABLE:
        raise EffectFailed("bad-params", f"no worker named {name!r}: the target is one of {', '.join(STEERABLE)}")
    try:
        if name == WEB and not web_enabled(client.request(paths, controlmsgs.GetStatus(), PULSED_ANSWER_S).status):
            raise EffectFailed("not-enabled", "the web worker is not enabled: set [web] enabled = true in "
                                              "config.toml, then pulsectl reload, to run it")
        reply = client.request(paths, controlmsgs.RestartWorker(name), PULSED_ANSWER_S)
    except client.Unreachable as err:
        raise EffectFailed("unreachable", f"pulsed did not answer: {err}") from None
    if not reply.ok:
        raise EffectFailed("refused", f"pulsed refused to restart {name}: {reply.error}")
    return {"worker": name}


def _refused(err: "EngineDirError") -> EffectFailed:
    """A promote or rollback that did not happen (EngineDirError): which check refused it, and why."""
    return EffectFailed("refused", str(err), check=err.check, file=err.file, line=err.line)


def engine_rollback(params: dict, paths: Paths) -> dict:
    """Roll main back (through the one engine lock) and reload the engine."""
    from pulse.engine import repo  # ~26 ms: only a promote or rollback
    try:
        result = repo.rollback(paths, to=params.get("to"), source="executor",
                               reason=params.get("rule") or params.get("reason") or "effect")
    except repo.EngineDirError as err:
        raise _refused(err) from None
    return {"before": result.before, "after": result.after, **_reload(paths)}


def engine_promote(params: dict, paths: Paths, config: ExecutorConfig) -> dict:
    """An agent-requested promote of its committed staging tree: the same promote checks, the same lock."""
    from pulse.engine import repo  # ~26 ms: only a promote or rollback
    try:
        result = repo.promote(paths, deploy=True, typecheck=config.engine.typecheck, source="executor",
                              message=params.get("message"))
    except repo.EngineDirError as err:
        raise _refused(err) from None
    return {"before": result.before, "after": result.after, "snapshot": result.snapshot, **_reload(paths)}


def _reload(paths: Paths) -> dict:
    try:
        return {"reloaded": bool(restart_worker("engine", paths))}
    except EffectFailed as err:
        return {"reloaded": False, "reload_error": err.error}
