"""`pulsectl check-config` and `pulsectl config --effective`."""

import click

from pulse.cli import configview
from pulse.cli.group import Context, pass_ctx


@click.command("check-config")
@pass_ctx
def check_config(ctx: Context) -> None:
    """Validate config.toml (and PULSE_* overrides). Exit 78 if it is bad."""
    configview.check(ctx)


@click.command("config")
@click.option("--effective", is_flag=True, help="Print the configuration in force, defaults included.")
@pass_ctx
@click.pass_context
def config(click_ctx: click.Context, ctx: Context, effective: bool) -> None:
    """Print the configuration pulsed would run with (--effective)."""
    if not effective:
        # Printing the help and exiting 0 looked like success to a script: say what to run instead.
        raise click.UsageError("say what to print: --effective (the configuration in force, defaults "
                               "included); `pulsectl check-config` validates config.toml", click_ctx)
    configview.effective(ctx)


COMMANDS = [check_config, config]
