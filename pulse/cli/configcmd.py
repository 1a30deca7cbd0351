"""`pulsectl check-config` and `pulsectl config --effective`."""

import click

from pulse.cli.app import Context, pass_ctx


@click.command("check-config")
@pass_ctx
def check_config(ctx: Context) -> None:
    """Validate config.toml (and PULSE_* overrides). Exit 78 if it is bad."""
    ctx.config()
    click.echo(f"{ctx.paths.config}: ok")


@click.command("config")
@click.option("--effective", is_flag=True, required=True, help="Print the configuration in force, defaults included.")
@pass_ctx
def config(ctx: Context, effective: bool) -> None:
    """Print the configuration pulsed would run with."""
    from pulse.core.config import to_toml
    click.echo(to_toml(ctx.config()), nl=False)


COMMANDS = [check_config, config]
