"""`pulsectl init`: make the home (what pulsed does on its first run), and say what was made."""

import click

from pulse.cli.context import fail
from pulse.cli.group import Context, pass_ctx
from pulse.core.home import HomeError

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


@click.command()
@pass_ctx
def init(ctx: Context) -> None:
    """Create the Pulse home with working defaults (idempotent)."""
    from pulse.store.provision import ensure_home
    try:
        made = ensure_home(ctx.home)
    except HomeError as err:
        fail(str(err))
    for item in made:
        click.echo(f"made {item}")
    if not made:
        click.echo(f"{ctx.home} is complete; nothing to make")
    from pulse.core import toolscan
    click.echo(toolscan.one_line(toolscan.scan()))


COMMANDS = [init]
