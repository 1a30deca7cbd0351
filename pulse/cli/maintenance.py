"""`pulsectl pause PROCESS --for 30m`, `pulsectl resume PROCESS`: leave a critical process alone
during maintenance; `pulsectl notify test`: one notification through every channel. Each
command's body is pulse.cli.maintview's."""

from __future__ import annotations

import click

from pulse.cli import maintview, processview
from pulse.cli.group import Context, pass_ctx
from pulse.core import clock


@click.command()
@click.argument("process")
@click.option("--for", "duration", default="30m", show_default=True, help="How long: 90s, 30m, 2h, 1d.")
@pass_ctx
def pause(ctx: Context, process: str, duration: str) -> None:
    """Leave PROCESS alone (no restarts) for a while."""
    if clock.parse_duration(duration) is None:
        processview.named(ctx, process)     # an unknown process is said first
        raise click.BadParameter(f"{duration!r}: expected a duration like 30m", param_hint="--for")
    maintview.pause(ctx, process, duration)


@click.command()
@click.argument("process")
@pass_ctx
def resume(ctx: Context, process: str) -> None:
    """Watch PROCESS again."""
    maintview.resume(ctx, process)


@click.group()
def notify() -> None:
    """Notifications."""


@notify.command("test")
@click.option("--wait", default=30.0, show_default=True, help="Seconds to wait for the outcome.")
@pass_ctx
def notify_test(ctx: Context, wait: float) -> None:
    """Send one notification through every configured channel, and say how each one took it."""
    maintview.notify_test(ctx, wait)


COMMANDS = [pause, resume, notify]
