"""`pulsectl store check`, `store backup DIR` and `store compact`: the home's stores, checked, copied
and kept within their bounds (pulse.store.retention); `pulsectl store restore-archived PATH`: a file
a [[watch.dir]] archived, put back.

A backup is taken online, while pulsed runs, through SQLite's backup API (a consistent copy of
each database, whatever is being written), with objects/, config.toml and the history mark that
matches the copy. Restoring is a copy back, with pulsed stopped (docs/operations.md, "Backups").
"""

from __future__ import annotations

from pathlib import Path

import click

from pulse.cli import storeview
from pulse.cli.group import Context, pass_ctx


@click.group()
def store() -> None:
    """Check the home's stores, back them up, or move old events to the archive."""


@store.command()
@pass_ctx
def check(ctx: Context) -> None:
    """Check every store in full (SQLite's integrity_check, each object's hash). Exit 0 if all are
    sound, 1 if not."""
    storeview.check(ctx)


@store.command()
@click.option("--dry-run", is_flag=True, help="Say what would move, move nothing.")
@pass_ctx
def compact(ctx: Context, dry_run: bool) -> None:
    """Move the events past [store]'s bounds (keep_days, max_mb, keep_free_mb) out of events.db, into
    archive segments (or delete them: archive = false), as pulsed does by itself; say what moved."""
    storeview.compact(ctx, dry_run)


@store.command()
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@pass_ctx
def backup(ctx: Context, dest: Path) -> None:
    """Copy the home's stores into DEST (new or empty), consistently, while pulsed runs."""
    storeview.backup(ctx, dest)


@store.command("restore-archived")
@click.argument("path")
@click.option("--to", "dest", help="Write it here instead (a new file); default: where it was.")
@pass_ctx
def restore_archived(ctx: Context, path: str, dest: str | None) -> None:
    """Put back a file a [[watch.dir]] archived (its newest copy, from objects/, with its mtime and
    mode), as a new file: never over one that exists."""
    storeview.restore_archived(ctx, path, dest)


COMMANDS = [store]
