"""`pulsectl logs [-f] [--worker NAME] [-n N]`: pulse.log, written by pulsed alone (printed by
pulse.cli.logview)."""

from __future__ import annotations

import click

from pulse.cli import logview
from pulse.cli.group import Context, pass_ctx
from pulse.core.childspecs import LOG_SOURCES


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (across rotation).")
@click.option("--worker", type=click.Choice(LOG_SOURCES), help="Only this process's lines.")
@click.option("-n", "--lines", default=50, show_default=True, help="How many past lines to print first.")
@pass_ctx
def logs(ctx: Context, follow: bool, worker: str | None, lines: int) -> None:
    """Print Pulse's log."""
    logview.print_log(ctx, follow, worker, lines)


COMMANDS = [logs]
