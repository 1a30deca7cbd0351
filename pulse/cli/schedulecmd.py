"""`pulsectl schedule list|run`: the [[schedule]]s the tick runs.

What a schedule has run is folded from its events (pulse.core.schedule); `run` commits one run now
through the same path as the tick (pulse.store.schedulerun), marked manual: an operator's event,
outside the slots, so the next slot still runs on time. Exit codes: 0 done; 1 no such schedule; 2 usage.
"""

from __future__ import annotations

import click

from pulse.cli import scheduleview
from pulse.cli.group import Context, pass_ctx


@click.group()
def schedule() -> None:
    """Recurring tasks and effects ([[schedule]] in config.toml), run by the tick."""


@schedule.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines, one schedule each.")
@pass_ctx
def list_(ctx: Context, as_json: bool) -> None:
    """Every schedule: when it runs next, what it ran last, whether its runs keep failing."""
    scheduleview.list_all(ctx, as_json)


@schedule.command()
@click.argument("name")
@pass_ctx
def run(ctx: Context, name: str) -> None:
    """Run schedule NAME once now (recorded as the operator's manual run; its slots are unchanged)."""
    scheduleview.run(ctx, name)


COMMANDS = [schedule]
