"""`pulsectl process ...`: the verbs for a critical process ([[process]]), as for a worker.

- `list`, `status NAME`: what the watcher last saw of each (alive, pid, held down, paused) and,
  for one, its last exit and the end of its output.
- `restart|stop|start NAME`: each an `operator` event (data {"action": "process-restart" | "process-stop"
  | "process-start"}, eventmsgs.ProcessAction), then the effect that acts, of origin operator: restart-process
  (the path processWatchdog's restarts take: stop its tree, then start; never two copies) or stop-process.
  A stopped process stays down, across restarts of pulsed, until `start` (or `restart`): survival
  folds the event and leaves it alone.
- `logs [-f] [-n N] NAME`: its own output, as its keeper appends it to logs/process-NAME.log
  (and the gzipped copies a rotation keeps beside it).
- `config NAME [--pin | --restore]`: its config files, known good against current (hashes, times, a
  diff summary); take the current files as known good, or write the known-good ones back by hand.
  Both are effects of origin `operator` (keep-config, restore-config); after a restore,
  processWatchdog restarts the process, as after its own.
"""

from __future__ import annotations

import click

from pulse.cli import processview
from pulse.cli.group import Context, pass_ctx


@click.group()
def process() -> None:
    """A critical process ([[process]]): list, status, restart, stop, start, logs, config."""


@process.command("config")
@click.argument("name")
@click.option("--pin", is_flag=True, help="Take the current files as known good.")
@click.option("--restore", is_flag=True, help="Write the known-good files back (processWatchdog then restarts it).")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
@click.option("--wait", default=15.0, show_default=True, help="Seconds to wait for --pin or --restore to be done.")
@pass_ctx
def config(ctx: Context, name: str, pin: bool, restore: bool, as_json: bool, wait: float) -> None:
    """NAME's config files: known good against current; --pin or --restore to act on them."""
    if pin and restore:
        raise click.UsageError("--pin and --restore are exclusive")
    processview.config(ctx, name, pin, restore, as_json, wait)


@process.command("list")
@click.option("--json", "as_json", is_flag=True, help="As JSON Lines.")
@pass_ctx
def list_(ctx: Context, as_json: bool) -> None:
    """Every [[process]]: its state and pid."""
    processview.list_all(ctx, as_json)


@process.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
@pass_ctx
def status_(ctx: Context, name: str, as_json: bool) -> None:
    """NAME: state, pid, its last exit and the end of its output. Exits 0 while it is alive, 3 if not."""
    processview.status(ctx, name, as_json)


def wait_option(command):
    return click.option("--wait", default=30.0, show_default=True,
                        help="Seconds to wait for the outcome (0: return at once).")(command)


@process.command("restart")
@click.argument("name")
@wait_option
@pass_ctx
def restart(ctx: Context, name: str, wait: float) -> None:
    """Restart NAME as survival does: stop its tree, then start it (never two copies); ends a stop."""
    processview.restart(ctx, name, wait)


@process.command("stop")
@click.argument("name")
@wait_option
@pass_ctx
def stop(ctx: Context, name: str, wait: float) -> None:
    """Stop NAME (its whole tree) and keep it down, across restarts of pulsed, until `start`."""
    processview.stop(ctx, name, wait)


@process.command("start")
@click.argument("name")
@wait_option
@pass_ctx
def start(ctx: Context, name: str, wait: float) -> None:
    """Start NAME (after a stop, or when it is down); one already alive is left as it is."""
    processview.start(ctx, name, wait)


@process.command("logs")
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Keep printing its output as it comes (across rotation).")
@click.option("-n", "--lines", default=50, show_default=True, help="How many past lines to print first.")
@pass_ctx
def logs(ctx: Context, name: str, follow: bool, lines: int) -> None:
    """NAME's own output, as its keeper kept it, across its restarts."""
    processview.logs(ctx, name, follow, lines)


COMMANDS = [process]
