"""`pulsectl check-config` and `pulsectl config --effective`."""

import sys

import click

from pulse.cli import Context, pass_ctx


def _load(ctx: Context):
    from pulse import config as configmod
    try:
        return configmod.load(ctx.paths.config)
    except configmod.ConfigError as err:
        click.echo(f"pulsectl: {err}", err=True)
        sys.exit(78)


@click.command("check-config")
@pass_ctx
def check_config(ctx: Context) -> None:
    """Validate config.toml (and PULSE_* overrides). Exit 78 if it is bad."""
    _load(ctx)
    click.echo(f"{ctx.paths.config}: ok")


@click.command("config")
@click.option("--effective", is_flag=True, required=True, help="Print the configuration in force, defaults included.")
@pass_ctx
def config(ctx: Context, effective: bool) -> None:
    """Print the configuration pulsed would run with."""
    from pulse.config import to_toml
    click.echo(to_toml(_load(ctx)), nl=False)


COMMANDS = [check_config, config]
