"""`pulsectl restart|start WORKER`, `pulsectl stop [WORKER]`, `pulsectl reload`, declared to click: their
bodies are pulse.cli.workerverbs and pulse.cli.reloadview, which pulse.cli.fastpath also runs without click.
"""

from __future__ import annotations

import click

from pulse.cli import workerverbs
from pulse.cli.group import Context, pass_ctx
from pulse.core.childspecs import STEERABLE

# Imports inside functions: pulsectl loads a command's module for any one of its commands, so each
# imports what only it uses: the config loader (~8 ms) only for a name that is no worker's.


class WorkerName(click.Choice):
    """A worker's name; a [[process]]'s name is pointed at `pulsectl process VERB NAME`."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            if ctx is not None and value in process_names(ctx.find_object(Context)):
                self.fail(f"{value!r} is a [[process]], not a worker: `pulsectl process {ctx.info_name} {value}`",
                          param, ctx)
            raise


def process_names(ctx: Context | None) -> list[str]:
    """The [[process]] names config.toml has (none when it cannot be read: the usage error says the rest)."""
    from pulse.core import config as configmod
    try:
        return [p.name for p in configmod.load(ctx.paths.config).process] if ctx is not None else []
    except (configmod.ConfigError, OSError):
        return []


worker_arg = click.argument("worker", type=WorkerName(STEERABLE))
def wait_opt(command):
    """--wait SECONDS (default 15) for the outcome, or --no-wait to return at once."""
    command = click.option("--no-wait", is_flag=True, help="Return at once, without waiting for the outcome.")(command)
    return click.option("--wait", default=15.0, show_default=True, help="Seconds to wait for the outcome.")(command)


@click.command()
@worker_arg
@wait_opt
@pass_ctx
def restart(ctx: Context, worker: str, wait: float, no_wait: bool) -> None:
    """Restart WORKER (also revives a failed engine)."""
    workerverbs.restart(ctx, worker, wait, no_wait)


@click.command()
@worker_arg
@wait_opt
@pass_ctx
def start(ctx: Context, worker: str, wait: float, no_wait: bool) -> None:
    """Start WORKER (after a stop, or a failed engine)."""
    workerverbs.start(ctx, worker, wait, no_wait)


@click.command()
@click.argument("worker", type=WorkerName(STEERABLE), required=False)
@wait_opt
@pass_ctx
def stop(ctx: Context, worker: str | None, wait: float, no_wait: bool) -> None:
    """Stop WORKER and keep it stopped; without WORKER, stop pulsed itself (gracefully) and
    return once it has exited."""
    workerverbs.stop(ctx, worker, wait, no_wait)


@click.command()
@click.option("--wait", default=20.0, show_default=True,
              help="Seconds to wait for what the reload set in motion (0: say only what pulsed began).")
@pass_ctx
def reload(ctx: Context, wait: float) -> None:
    """Re-read config.toml; restart only the workers whose settings changed.

    Then say, per worker and per [[process]], what actually happened: restarted (with its new pid)
    or failed, started, stopped; exit 1 if anything failed. A bad file exits 78, as `pulsectl
    check-config` and pulsed do for the same file, and says that the running configuration was kept."""
    from pulse.cli import reloadview  # the store and the config loader: only `reload` reads them
    reloadview.reload(ctx, wait)


COMMANDS = [restart, start, stop, reload]
