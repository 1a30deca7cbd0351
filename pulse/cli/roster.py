"""`pulsectl instances`: the running Pulses of this user on this host (and the system's, if
readable), from the registry each pulsed keeps its entry in (pulse.core.instances), listed by
pulse.cli.rosterview. How `pulsectl -i NAME` finds the home of the instance called NAME:
pulse.cli.launch.home_of."""

from __future__ import annotations

import click

from pulse.cli import rosterview
from pulse.cli.group import Context, pass_ctx


@click.command(name="instances")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines: one instance per line.")
@pass_ctx
def instances_cmd(ctx: Context, as_json: bool) -> None:
    """List the running Pulses of this user (and the system's, if readable)."""
    rosterview.list_all(ctx, as_json)


COMMANDS = [instances_cmd]
