"""`pulsectl init`: make the home (what pulsed does on its first run), and say what was made."""

import sys

import click

from pulse.cli.group import Context, pass_ctx


@click.command()
@pass_ctx
def init(ctx: Context) -> None:
    """Create the Pulse home with working defaults (idempotent)."""
    from pulse.core.home import HomeError
    from pulse.store.provision import ensure_home
    try:
        made = ensure_home(ctx.home)
    except HomeError as err:
        click.echo(f"pulsectl: {err}", err=True)
        sys.exit(1)
    for item in made:
        click.echo(f"made {item}")
    if not made:
        click.echo(f"{ctx.home} is complete; nothing to make")
    from pulse.core import toolscan
    click.echo(toolscan.one_line(toolscan.scan()))


COMMANDS = [init]
