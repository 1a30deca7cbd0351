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

import glob
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pulse.core import wire
from pulse.core.config import ExecutorConfig
from pulse.core.home import Paths, inside
from pulse.core.states import STEERABLE, WEB
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


def archive(params: dict, home: Path, now: float | None = None) -> dict:
    """Move files under `from` older than `older_than_h` into `to`, keeping their relative paths.
    Both are absolute: registry.ArchiveParams checks them before the effect is claimed. Neither
    may meet the home (home_overlap): refused, nothing moved."""
    source, dest = Path(params["from"]), Path(params["to"])
    for field, path in (("from", source), ("to", dest)):
        if problem := home_overlap(path, home):
            raise EffectFailed("refused", f"archive {field} {str(path)!r} {problem}; it is never archived")
    cutoff = (time.time() if now is None else now) - float(params.get("older_than_h", 72)) * 3600
    moved = size = 0
    try:
        for path in sorted(source.rglob("*")):
            if not path.is_file() or path.is_symlink() or path.stat().st_mtime >= cutoff:
                continue
            target = dest / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            size += path.stat().st_size
            shutil.move(path, target)
            moved += 1
    except OSError as err:
        raise os_failure(f"archive moved {moved} file(s), then stopped", err, moved=moved, bytes=size) from None
    return {"moved": moved, "bytes": size}


def cleanup(params: dict, paths: Paths, config: ExecutorConfig) -> dict:
    """Delete files matching the absolute glob patterns (registry.CleanupParams checks them before the
    effect is claimed, so a bad one deletes nothing); gc vitals and objects."""
    removed = size = 0
    try:
        for pattern in params.get("patterns", []):
            for name in glob.glob(pattern, recursive=True):
                path = Path(name)
                if path.is_file() and not path.is_symlink() and not home_overlap(path, paths.home):
                    size += path.stat().st_size
                    path.unlink()
                    removed += 1
    except OSError as err:
        raise os_failure(f"cleanup removed {removed} file(s), then stopped", err, removed=removed,
                         bytes=size) from None
    result: dict = {"removed": removed, "bytes": size}
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


def web_enabled(status: wire.Status) -> bool:
    """pulsed lists the web worker only while [web] enabled is in force."""
    return any(w.name == WEB for w in status.workers)


def restart_worker(name: str | None, paths: Paths) -> dict:
    """Ask pulsed to restart a worker (an operator-style restart: never counted as a crash). The web
    worker too, while it is enabled; pulsed's status says whether it is (the executor's own config
    does not hold [web])."""
    from pulse.core import client
    if name not in STEERABLE:
        raise EffectFailed("bad-params", f"no worker named {name!r}: the target is one of {', '.join(STEERABLE)}")
    try:
        if name == WEB and not web_enabled(client.request(paths, wire.GetStatus(), PULSED_ANSWER_S).status):
            raise EffectFailed("not-enabled", "the web worker is not enabled: set [web] enabled = true in "
                                              "config.toml, then pulsectl reload, to run it")
        reply = client.request(paths, wire.RestartWorker(name), PULSED_ANSWER_S)
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
    from pulse.engine import repo
    try:
        result = repo.rollback(paths, to=params.get("to"), source="executor",
                               reason=params.get("rule") or params.get("reason") or "effect")
    except repo.EngineDirError as err:
        raise _refused(err) from None
    return {"before": result.before, "after": result.after, **_reload(paths)}


def engine_promote(params: dict, paths: Paths, config: ExecutorConfig) -> dict:
    """An agent-requested promote of its committed staging tree: the same promote checks, the same lock."""
    from pulse.engine import repo
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
