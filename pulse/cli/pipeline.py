"""`pulsectl events`, `vitals`, `effects`, `emit`: the pipeline's stores, read and fed by hand.

Every --json listing is JSON Lines, so `-f` streams.
"""

from __future__ import annotations

import click

from pulse.cli import emitview, eventsview
from pulse.cli.group import Context, pass_ctx
from pulse.core import clock

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def parse_since(text: str) -> float:
    """An ISO time (naive = UTC) or a duration back from now: 30s, 10m, 2h, 1d."""
    try:
        return clock.parse_since(text)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


@click.command()
@click.option("--type", "types", multiple=True, help="Only this event type (repeatable).")
@click.option("--since", help="Only events since an ISO time or a duration (10m, 2h).")
@click.option("-n", "--lines", default=50, show_default=True, help="How many past events to print first.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events.")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines.")
@pass_ctx
def events(ctx: Context, types: tuple[str, ...], since: str | None, lines: int, follow: bool, as_json: bool) -> None:
    """Print events from events.db: the last -n (of --type, over the whole history), or all --since."""
    from pulse.core.wire.eventmsgs import EVENT_TYPES
    unknown = sorted(set(types) - EVENT_TYPES)
    if unknown:
        raise click.BadParameter(f"no event type {', '.join(map(repr, unknown))}; the types are: "
                                 f"{', '.join(sorted(EVENT_TYPES))}", param_hint="--type")
    eventsview.print_events(ctx, types, since, lines, follow, as_json, parse_since)


@click.command()
@click.argument("key", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON Lines.")
@pass_ctx
def vitals(ctx: Context, key: str | None, as_json: bool) -> None:
    """The latest vital of each key (KEY: one key, a family such as `health` for every `health:NAME`,
    or a prefix ending in *)."""
    eventsview.print_vitals(ctx, key, as_json)


@click.command()
@click.option("--pending", is_flag=True, help="Only effects not yet ended (pending or executing).")
@click.option("-n", "--lines", default=50, show_default=True, help="How many, newest first.")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines.")
@pass_ctx
def effects(ctx: Context, pending: bool, lines: int, as_json: bool) -> None:
    """Effects and their state."""
    eventsview.print_effects(ctx, pending, lines, as_json)


@click.command()
@click.argument("kind")
@click.option("--target", help="What the effect acts on.")
@click.option("--param", "params", multiple=True, help="key=value (a JSON value, else a string); repeatable.")
@click.option("--idempotent", is_flag=True, help="Safe to run more than once (run at least once after a crash).")
@click.option("--deadline", "deadline_s", type=float, help="Seconds until it expires unrun (default effect_deadline_s).")
@click.option("--wait", "wait_s", type=float, default=0, help="Wait up to this many seconds for its outcome.")
@pass_ctx
def emit(ctx: Context, kind: str, target: str | None, params: tuple[str, ...], idempotent: bool,
         deadline_s: float | None, wait_s: float) -> None:
    """Queue an effect by hand (origin operator) and ring the executor."""
    emitview.emit(ctx, kind, target, params, idempotent, deadline_s, wait_s)


COMMANDS = [events, vitals, effects, emit]
