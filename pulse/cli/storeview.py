"""`pulsectl store check|compact|backup|restore-archived` themselves, click-free: pulse.cli.storecmd
declares them to click, pulse.cli.fastpath runs them without it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pulse.cli.context import Context, echo, fail
from pulse.core.digest import sha256

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def check(ctx: Context) -> None:
    """Check every store in full (SQLite's integrity_check, each object's hash). Exit 0 if all are
    sound, 1 if not."""
    import sqlite3

    from pulse.store import connection
    from pulse.store.provision import check_home
    paths = ctx.paths
    problems = check_home(paths)
    for path in (paths.events_db, paths.vitals_db):
        if not path.exists() or any(p.startswith(str(path)) for p in problems):
            continue
        conn = connection.open_readonly(path)
        try:
            found = [row[0] for row in conn.execute("PRAGMA integrity_check(20)")]
        except sqlite3.DatabaseError as err:
            found = [str(err)]
        finally:
            conn.close()
        if found != ["ok"]:
            problems.append(f"{path} is damaged: {'; '.join(found)}")
        else:
            echo(f"{path}: ok")
    problems += _archive_problems(paths)
    bad = [p for p in _objects(paths.objects) if sha256(p.read_bytes()).hexdigest() != p.parent.name + p.name]
    problems += [f"{p} does not hold what its name says (its sha256 differs)" for p in bad]
    if paths.objects.exists() and not bad:
        echo(f"{paths.objects}/: ok ({sum(1 for _ in _objects(paths.objects))} objects)")
    for problem in problems:
        echo(f"pulsectl: {problem}", err=True)
    sys.exit(1 if problems else 0)


def _archive_problems(paths) -> list[str]:
    """Every archive segment the manifest names, read whole (its sha256, its range). A segment file the
    manifest does not name is said, not counted a problem: an interrupted move or drop left it (a kill,
    or a power cut that took the move's transaction), its events are live or recorded dropped, and the
    next move removes it."""
    import sqlite3

    from pulse.store import archive, connection
    if not paths.events_db.exists():
        return []
    try:
        conn = connection.open_readonly(paths.events_db)
    except (connection.StoreError, sqlite3.Error):
        return []                        # said above
    try:
        segments = archive.archived(conn)
    finally:
        conn.close()
    directory = paths.home / archive.DIRECTORY
    problems = [p for seg in segments if (p := archive.problem(directory, seg))]
    named = {seg.segment for seg in segments}
    if directory.is_dir():
        for name in sorted(os.listdir(directory)):
            if (archive.is_segment_name(name) and name not in named) or name.startswith(".tmp-"):
                echo(f"{directory / name}: in no move events.db records, left by an interrupted move (its "
                     "events are still live; the next move removes it)")
    if segments and not problems:
        echo(f"{directory}/: ok ({len(segments)} segments, events {segments[0].first_id}-{segments[-1].last_id})")
    return problems


def compact(ctx: Context, dry_run: bool) -> None:
    """Move the events past [store]'s bounds (keep_days, max_mb, keep_free_mb) out of events.db, into
    archive segments (or delete them: archive = false), as pulsed does by itself; say what moved."""
    import sqlite3

    from pulse.agents import spend
    from pulse.core import config as configmod
    from pulse.store import archive, connection, eventsdb, projection, retention
    paths = ctx.paths
    try:
        store_config = configmod.load(paths.config).store
    except configmod.ConfigError as err:
        fail(str(err), 2)
    if not paths.events_db.exists():
        fail(f"{paths.events_db} does not exist (has pulsed run on this home?)")
    if dry_run:
        conn = connection.open_readonly(paths.events_db)
        try:
            plan = retention.plan(conn, paths.home, store_config)
        finally:
            conn.close()
        _say_plan(plan, store_config.archive, moving=False)
        return
    conn = eventsdb.open_events(paths.events_db)
    try:
        outcome = retention.compact(conn, paths.home, store_config, "pulsectl", readers=spend.listing_projections()
                                    if projection.may_write(paths.home) else ())
    except retention.Busy as err:
        echo(f"pulsectl: {err} (pulsed's event writer is moving events): try again shortly", err=True)
        sys.exit(75)
    except (sqlite3.Error, OSError, ValueError, archive.SegmentError) as err:
        fail(f"the move stopped, its events stay in events.db: {err}")
    finally:
        conn.close()
    for name in outcome.recovered:
        echo(f"removed {name}, left by an interrupted move (its events were still live)")
    _say_plan(outcome.plan, store_config.archive, moving=True)
    for seg in outcome.moved:
        echo(f"moved events {seg.first_id}-{seg.last_id} ({seg.events}) "
             + (f"to {paths.home / 'archive' / str(seg.segment)} ({seg.bytes} bytes)" if seg.segment else "out: deleted"))
    for name in outcome.dropped:
        echo(f"dropped {name}: the archive is over archive_max_mb = {store_config.archive_max_mb:g}")


def _say_plan(plan, keep_archive: bool, moving: bool) -> None:
    verb = ("moving" if moving else "would move") if keep_archive else ("deleting" if moving else "would delete")
    echo(f"live history: events {plan.first}-{plan.last}, {plan.live_bytes / 1048576:.1f} MiB")
    if not plan.why:
        echo("nothing is past the bounds")
    for why in plan.why:
        echo(f"past the bounds: {why}")
    for held in plan.held:
        echo(f"held back by {held}")
    if plan.why:
        echo(f"{verb} events {plan.first}-{plan.upto} ({plan.count})" if plan.count else "nothing may move yet")


def _objects(root: Path):
    """Every blob under objects/ (objects/ab/cdef…), not the temporary files of a write."""
    return (p for p in sorted(root.glob("??/*")) if p.is_file() and not p.name.startswith("."))


def backup(ctx: Context, dest: Path) -> None:
    """Copy the home's stores into DEST (new or empty), consistently, while pulsed runs."""
    import shutil  # with bz2 and lzma, ~3 ms: only for a backup
    import sqlite3

    from pulse.store import archive, connection, eventsdb
    from pulse.store.provision import write_history_mark
    paths = ctx.paths
    if dest.exists() and any(dest.iterdir()):
        fail(f"{dest} is not empty; back up into a new directory", 2)
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path in (paths.events_db, paths.vitals_db):
        source = connection.open_readonly(path)
        target = sqlite3.connect(dest / path.name)
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()
        echo(f"{dest / path.name}: copied")
    copy = connection.open_readonly(dest / paths.events_db.name)
    try:
        events = eventsdb.last_event_id(copy)
        segments = [str(seg.segment) for seg in archive.archived(copy)]
    finally:
        copy.close()
    write_history_mark(dest / paths.history_mark.name, events)
    _backup_archive(paths, dest, segments)
    if paths.objects.exists():
        shutil.copytree(paths.objects, dest / "objects", dirs_exist_ok=True)
        echo(f"{dest / 'objects'}/: copied")
    if paths.config.exists():
        shutil.copy2(paths.config, dest / "config.toml")
        os.chmod(dest / "config.toml", 0o600)
    echo(f"backup of {paths.home} in {dest}: {events} events")


def _backup_archive(paths, dest: Path, names: list[str]) -> None:
    """The archive segments `names` the copied events.db names (segments are never rewritten: a copy is a copy)."""
    import shutil  # as backup's

    from pulse.store import archive
    if not names:
        return
    (dest / archive.DIRECTORY).mkdir(mode=0o700)
    for name in names:
        shutil.copy2(paths.home / archive.DIRECTORY / name, dest / archive.DIRECTORY / name)
    echo(f"{dest / archive.DIRECTORY}/: copied ({len(names)} segments)")


def archived(events_db: Path, path: str) -> dict | None:
    """The newest dir-archived record of `path` (its blob, bytes, mtime, mode), or None."""
    from pulse.core.wire.eventmsgs import DIR_ARCHIVED
    from pulse.store import connection, eventsdb
    if not events_db.exists():
        return None
    conn = connection.open_readonly(events_db)
    try:
        found, after = None, 0
        while batch := eventsdb.read_events(conn, after_id=after, types=(DIR_ARCHIVED,)):
            for ev in batch:
                found = next((f for f in ev.data.get("files") or () if f.get("path") == path), found)
            after = batch[-1].id
    finally:
        conn.close()
    return found


def write_new(dest: str, data: bytes, mtime: float, mode: int) -> None:
    """`data` as the new file `dest`: never over one that exists, never through a link another
    account could have placed, and under another account's directory with its rights."""
    from pulse.core import safepath
    parent, name = safepath.open_parent(dest)

    def create() -> None:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent.fd)
        try:
            os.write(fd, data)
            os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))
            os.fsync(fd)
        finally:
            os.close(fd)
    try:
        safepath.as_writer(parent.writer, dest, create)
    finally:
        os.close(parent.fd)


def restore_archived(ctx: Context, path: str, dest: str | None) -> None:
    """Put back a file a [[watch.dir]] archived (its newest copy, from objects/, with its mtime and
    mode), as a new file: never over one that exists."""
    from pulse.core import safepath
    from pulse.store import objects
    found = archived(ctx.paths.events_db, path)
    if found is None:
        fail(f"no dir-archived event names {path}")
    target = os.path.abspath(dest or path)
    try:
        data = objects.get(ctx.paths.objects, found["object"])
        write_new(target, data, float(found.get("mtime") or 0), int(found.get("mode") or 0o600))
    except FileExistsError:
        fail(f"{target} exists; restore it elsewhere with --to")
    except (OSError, ValueError, safepath.Refused) as err:
        fail(f"{target}: {err}")
    echo(f"{target}: restored from {found['object']} ({len(data)} bytes)")
