"""`pulsectl status`: every worker, one line each, and the supervisor line.

Exit codes (LSB): 0 every worker running; 3 something not running; 4 pulsed unreachable; 5 a guarded
process down, fatal or unhealthy (pulse.cli.statusview).
A plain `pulsectl status` never reaches this module: pulse.cli serves it without click.
"""

from __future__ import annotations

import sys

import click

from pulse.cli import statusview
from pulse.cli.group import Context, pass_ctx


@click.command()
@click.option("--json", "as_json", is_flag=True, help="The status as JSON (version 1).")
@pass_ctx
def status(ctx: Context, as_json: bool) -> None:
    """Show every worker's and process's state. Exit 0: all up; 3: a worker not running; 4: pulsed
    unreachable; 5: a guarded process down, fatal or unhealthy."""
    sys.exit(statusview.show(ctx.paths, ctx.timeout, as_json))


COMMANDS = [status]
