"""`pulsectl logs [-f] [--worker NAME] [-n N]`: pulse.log, written by pulsed alone."""

from __future__ import annotations

import os
import time

import click

from pulse.cli.group import Context, pass_ctx
from pulse.core import logs as logsmod
from pulse.core.childspecs import LOG_SOURCES


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (across rotation).")
@click.option("--worker", type=click.Choice(LOG_SOURCES), help="Only this process's lines.")
@click.option("-n", "--lines", default=50, show_default=True, help="How many past lines to print first.")
@pass_ctx
def logs(ctx: Context, follow: bool, worker: str | None, lines: int) -> None:
    """Print Pulse's log."""
    path = ctx.paths.log_file
    for line in logsmod.tail(path, worker, lines):
        click.echo(line)
    if not follow:
        return
    f = open(path, encoding="utf-8", errors="replace") if path.exists() else None
    if f is not None:
        f.seek(0, os.SEEK_END)
    try:
        while True:
            line = f.readline() if f is not None else ""
            if line:
                if logsmod.written_by(line, worker):
                    click.echo(line.rstrip("\n"))
                continue
            time.sleep(0.2)
            try:   # rotated or created: reopen
                if f is None or os.stat(path).st_ino != os.fstat(f.fileno()).st_ino:
                    if f is not None:
                        f.close()
                    f = open(path, encoding="utf-8", errors="replace")
            except FileNotFoundError:
                f = None
    except KeyboardInterrupt:
        pass


COMMANDS = [logs]
