"""`pulsectl promote`, `deploy`, `rollback`, `engine`, `engine log`, `dev`: the engine directory's
lifecycle; each command's body is pulse.cli.engineview's.

A promote or rollback reloads the engine (restarts the `engine` worker alone),
which also revives a `failed` engine.
"""

from __future__ import annotations

import click

from pulse.cli import engineview
from pulse.cli.group import Context, pass_ctx

AGAIN_HELP = "Promote even the very tree the last rollback rolled away from."


@click.command()
@click.option("-m", "--message", help="The merge commit's message.")
@click.option("--again", is_flag=True, help=AGAIN_HELP)
@pass_ctx
def promote(ctx: Context, message: str | None, again: bool) -> None:
    """Merge staging into main behind the promote checks (compile, import, the engine's tests), then reload."""
    engineview.promote(ctx, message, again)


@click.command()
@click.option("--again", is_flag=True, help=AGAIN_HELP)
@pass_ctx
def deploy(ctx: Context, again: bool) -> None:
    """Promote a staging tree that is already committed."""
    engineview.deploy(ctx, again)


@click.command()
@click.option("--to", "ref", help="A commit of main to return to (default: main before the last promote).")
@pass_ctx
def rollback(ctx: Context, ref: str | None) -> None:
    """Return main to an earlier tree (a new commit; or from a snapshot if git is damaged), then reload."""
    engineview.rollback(ctx, ref)


@click.group(invoke_without_command=True)
@pass_ctx
@click.pass_context
def engine(click_ctx: click.Context, ctx: Context) -> None:
    """The engine directory: alone, what main runs and what staging holds."""
    if click_ctx.invoked_subcommand is None:
        engineview.overview(ctx)


@engine.command("log")
@pass_ctx
def engine_log(ctx: Context) -> None:
    """Promotes and rollbacks, oldest first."""
    engineview.engine_log(ctx)


@click.command()
@pass_ctx
def dev(ctx: Context) -> None:
    """Run the engine on the staging tree, reloading it on every change, until Ctrl-C.

    Survival keeps guarding meanwhile. Leaving dev mode returns the engine to main.
    """
    engineview.dev(ctx)


COMMANDS = [promote, deploy, rollback, engine, dev]
