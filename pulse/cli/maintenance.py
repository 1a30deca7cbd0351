"""`pulsectl pause PROCESS --for 30m`, `pulsectl resume PROCESS`: leave a critical process alone
during maintenance; `pulsectl notify test`: one notification through every channel."""

from __future__ import annotations

import sys
import time

import click

from pulse.cli.group import Context, pass_ctx
from pulse.core import clock


def _append(ctx: Context, type_: str, target: str, **data) -> None:
    """Commit the event, then ring the tick so the rules see it now."""
    from pulse.core import client, wire
    from pulse.store import eventsdb
    conn = eventsdb.open_events(ctx.paths.events_db)
    eventsdb.append_events(conn, [wire.now_event(type_, "pulsectl", target, **data)])
    client.ring(ctx.paths, "wake", wire.Wake("pulsectl", type_))


def _known_process(ctx: Context, name: str) -> None:
    names = [p.name for p in ctx.config().process]
    if name not in names:
        click.echo(f"pulsectl: no [[process]] named {name!r} in config.toml (known: {', '.join(names) or 'none'})",
                   err=True)
        sys.exit(2)


@click.command()
@click.argument("process")
@click.option("--for", "duration", default="30m", show_default=True, help="How long: 90s, 30m, 2h, 1d.")
@pass_ctx
def pause(ctx: Context, process: str, duration: str) -> None:
    """Leave PROCESS alone (no restarts) for a while."""
    _known_process(ctx, process)
    seconds = clock.parse_duration(duration)
    if seconds is None:
        raise click.BadParameter(f"{duration!r}: expected a duration like 30m", param_hint="--for")
    until = time.time() + seconds
    _append(ctx, "pause", process, until=until)
    click.echo(f"{process} paused until {clock.iso(until, ms=False)}")


@click.command()
@click.argument("process")
@pass_ctx
def resume(ctx: Context, process: str) -> None:
    """Watch PROCESS again."""
    _known_process(ctx, process)
    _append(ctx, "resume", process)
    click.echo(f"{process} watched again")


@click.group()
def notify() -> None:
    """Notifications."""


@notify.command("test")
@click.option("--wait", default=30.0, show_default=True, help="Seconds to wait for the outcome.")
@pass_ctx
def notify_test(ctx: Context, wait: float) -> None:
    """Send one notification through every configured channel, and say how it went."""
    from pulse.cli.pipeline import queue_effect
    from pulse.core import wire
    config = ctx.config()
    click.echo(f"channels: {', '.join(c.name or c.kind for c in config.notify) or 'none'}")
    effect = wire.Effect(kind="notify", target="pulse", params={
        "title": "Pulse test notification", "message": "If you read this, this channel works.", "test": True})
    sys.exit(queue_effect(ctx, effect, config.timings.effect_deadline_s, wait))


COMMANDS = [pause, resume, notify]
