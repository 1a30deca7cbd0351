"""`pulsectl restart|start WORKER`, `pulsectl stop [WORKER]`.

Operator actions never count toward the restart intensity limit. A stopped
worker stays stopped across pulsed restarts until `pulsectl start`.
Each waits (up to --wait seconds) until the worker is where it was asked to be.
"""

from __future__ import annotations

import sys
import time

import click

from pulse.cli.group import Context, pass_ctx
from pulse.core.childspecs import STEERABLE
from pulse.core.client import daemon_pid
from pulse.core.states import WorkerState
from pulse.core.wire import controlmsgs

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


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


def listed(ctx: Context, name: str) -> controlmsgs.WorkerStatus | None:
    """The worker as status lists it; None when it is not listed (the web worker, not enabled)."""
    return next((w for w in ctx.request(controlmsgs.GetStatus()).status.workers if w.name == name), None)


def wait_for(ctx: Context, name: str, done, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        worker = listed(ctx, name)
        if worker is None:
            click.echo(f"pulsectl: {name} is no longer listed (its config table turned it off)", err=True)
            sys.exit(1)
        if done(worker):
            click.echo(f"{name}: {worker.state}" + (f" (pid {worker.pid})" if worker.pid else ""))
            return
        if time.monotonic() >= deadline:
            click.echo(f"pulsectl: {name} is {worker.state} after {seconds:g}s", err=True)
            sys.exit(1)
        time.sleep(0.05)


@click.command()
@worker_arg
@wait_opt
@pass_ctx
def restart(ctx: Context, worker: str, wait: float, no_wait: bool) -> None:
    """Restart WORKER (also revives a failed engine)."""
    found = listed(ctx, worker)          # not listed (web, not enabled): pulsed's refusal says why
    old = found.pid if found else None
    click.echo(ctx.request(controlmsgs.RestartWorker(worker)).message)
    if wait and not no_wait:
        wait_for(ctx, worker, lambda w: w.state == WorkerState.RUNNING and w.pid != old, wait)


@click.command()
@worker_arg
@wait_opt
@pass_ctx
def start(ctx: Context, worker: str, wait: float, no_wait: bool) -> None:
    """Start WORKER (after a stop, or a failed engine)."""
    click.echo(ctx.request(controlmsgs.StartWorker(worker)).message)
    if wait and not no_wait:
        wait_for(ctx, worker, lambda w: w.state == WorkerState.RUNNING, wait)


@click.command()
@click.argument("worker", type=WorkerName(STEERABLE), required=False)
@wait_opt
@pass_ctx
def stop(ctx: Context, worker: str | None, wait: float, no_wait: bool) -> None:
    """Stop WORKER and keep it stopped; without WORKER, stop pulsed itself (gracefully) and
    return once it has exited."""
    wait = 0 if no_wait else wait
    if worker is None:
        pid = daemon_pid(ctx.paths)
        click.echo(ctx.request(controlmsgs.Shutdown()).message)
        deadline = time.monotonic() + wait
        while wait and pid and daemon_pid(ctx.paths) == pid:
            if time.monotonic() >= deadline:
                click.echo(f"pulsectl: pulsed (pid {pid}) still running after {wait:g}s", err=True)
                sys.exit(1)
            time.sleep(0.05)
        if wait and pid:
            click.echo(f"pulsed (pid {pid}) stopped")
        return
    click.echo(ctx.request(controlmsgs.StopWorker(worker)).message)
    if wait:
        wait_for(ctx, worker, lambda w: w.state == "stopped", wait)


@click.command()
@click.option("--wait", default=20.0, show_default=True,
              help="Seconds to wait for what the reload set in motion (0: say only what pulsed began).")
@pass_ctx
def reload(ctx: Context, wait: float) -> None:
    """Re-read config.toml; restart only the workers whose settings changed.

    Then say, per worker and per [[process]], what actually happened: restarted (with its new pid)
    or failed, started, stopped; exit 1 if anything failed. A bad file exits 78, as `pulsectl
    check-config` and pulsed do for the same file, and says that the running configuration was kept."""
    from pulse.cli import reloadview
    reloadview.reload(ctx, wait)


COMMANDS = [restart, start, stop, reload]
