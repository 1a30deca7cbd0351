"""What the kinds that act on files, pulsed and the engine do, in-process: archive, cleanup,
restart-worker, engine-promote, engine-rollback (pulse.effects.kinds has those that start a process).

Not every one is a repair, despite this module's name: whether a kind is one is its descriptor's
`repairs` in pulse.effects.registry, the one place that says so.

Each takes the effect's params and returns a JSON-able result, or raises to fail
the effect. None of them touches events.db: it is the record of what happened.
"""

from __future__ import annotations

import glob
import os
import shutil
import time
from pathlib import Path

from pulse.core import wire
from pulse.core.config import ExecutorConfig
from pulse.core.home import Paths
from pulse.store import db, objects


def archive(params: dict, now: float | None = None) -> dict:
    """Move files under `from` older than `older_than_h` into `to`, keeping their relative paths."""
    source, dest = Path(params["from"]), Path(params["to"])
    if not source.is_absolute() or not dest.is_absolute():
        raise ValueError("archive needs absolute `from` and `to` paths")
    cutoff = (time.time() if now is None else now) - float(params.get("older_than_h", 72)) * 3600
    moved = size = 0
    for path in sorted(source.rglob("*")):
        if not path.is_file() or path.is_symlink() or path.stat().st_mtime >= cutoff:
            continue
        target = dest / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        size += path.stat().st_size
        shutil.move(path, target)
        moved += 1
    return {"moved": moved, "bytes": size}


def cleanup(params: dict, paths: Paths, config: ExecutorConfig) -> dict:
    """Delete files matching the configured absolute glob patterns; gc vitals and objects."""
    removed = size = 0
    for pattern in params.get("patterns", []):
        if not os.path.isabs(pattern):
            raise ValueError(f"cleanup pattern {pattern!r} is not absolute")
        for name in glob.glob(pattern, recursive=True):
            path = Path(name)
            if path.is_file() and not path.is_symlink() and paths.home not in path.parents:
                size += path.stat().st_size
                path.unlink()
                removed += 1
    result: dict = {"removed": removed, "bytes": size}
    if params.get("vitals_gc"):
        conn = db.open_vitals(paths.vitals_db)
        try:
            result["vitals_removed"] = db.gc_vitals(conn, time.time() - config.store.vitals_retention_h * 3600)
        finally:
            conn.close()
    if params.get("objects_gc"):
        conn = db.open_readonly(paths.events_db)
        try:
            referenced = db.referenced_objects(conn)
        finally:
            conn.close()
        result["objects_removed"] = len(objects.gc(paths.objects, referenced,
                                                   config.store.objects_retention_days * 86400))
    return result


def restart_worker(name: str | None, paths: Paths) -> dict:
    """Ask pulsed to restart a worker (an operator-style restart: never counted as a crash)."""
    from pulse.core import client
    from pulse.core.states import WORKERS
    if name not in WORKERS:
        raise ValueError(f"no worker named {name!r}")
    try:
        reply = client.request(paths, wire.RestartWorker(name), 3.0)
    except client.Unreachable as err:
        raise RuntimeError(str(err)) from None
    if not reply.ok:
        raise RuntimeError(reply.error)
    return {"worker": name}


def engine_rollback(params: dict, paths: Paths) -> dict:
    """Roll main back (through the one engine lock) and reload the engine."""
    from pulse.engine import repo
    result = repo.rollback(paths, to=params.get("to"), source="executor",
                                reason=params.get("rule") or params.get("reason") or "effect")
    return {"before": result.before, "after": result.after, **_reload(paths)}


def engine_promote(params: dict, paths: Paths, config: ExecutorConfig) -> dict:
    """An agent-requested promote of its committed staging tree: the same promote checks, the same lock."""
    from pulse.engine import repo
    result = repo.promote(paths, deploy=True, typecheck=config.engine.typecheck, source="executor",
                               message=params.get("message"))
    return {"before": result.before, "after": result.after, "snapshot": result.snapshot, **_reload(paths)}


def _reload(paths: Paths) -> dict:
    try:
        return {"reloaded": bool(restart_worker("engine", paths))}
    except RuntimeError as err:
        return {"reloaded": False, "reload_error": str(err)}
