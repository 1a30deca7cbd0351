"""`pulsectl check-config` and `pulsectl config --effective`."""

import sys

import click

from pulse.cli.app import Context, pass_ctx


@click.command("check-config")
@pass_ctx
def check_config(ctx: Context) -> None:
    """Validate config.toml (and PULSE_* overrides). Exit 78 if it is bad."""
    problems = unknown_kinds(ctx, ctx.config())
    for problem in problems:
        click.echo(f"pulsectl: {problem}", err=True)
    if problems:
        sys.exit(78)
    click.echo(f"{ctx.paths.config}: ok")


def unknown_kinds(ctx: Context, config) -> list[str]:
    """allow.kinds may name built-in kinds and the kinds the engine's executors declare; anything
    else is a typo (exit 78, with the nearest name). The engine is asked only when needed: loading
    it runs agent code, in a throwaway process."""
    from pulse.effects import registry
    problems = registry.unknown_kinds(config.allow.kinds)
    if problems and ctx.paths.engine.is_dir():
        from pulse.engine import repo
        try:
            declared = repo.probe(ctx.paths.engine)["kinds"]
        except repo.EngineDirError as err:
            click.echo(f"pulsectl: could not ask the engine which kinds it declares: {err}", err=True)
            declared = []
        problems = registry.unknown_kinds(config.allow.kinds, declared)
    return [f"{ctx.paths.config}: $.allow.kinds: {problem}" for problem in problems]


@click.command("config")
@click.option("--effective", is_flag=True, help="Print the configuration in force, defaults included.")
@pass_ctx
@click.pass_context
def config(click_ctx: click.Context, ctx: Context, effective: bool) -> None:
    """Print the configuration pulsed would run with (--effective)."""
    if not effective:
        click.echo(click_ctx.get_help())
        return
    from pulse.core.config import to_toml
    click.echo(to_toml(ctx.config()), nl=False)


COMMANDS = [check_config, config]
