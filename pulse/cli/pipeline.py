"""`pulsectl events`, `vitals`, `effects`, `emit`: the pipeline's stores, read and fed by hand.

Every --json listing is JSON Lines, so `-f` streams.
"""

from __future__ import annotations

import json
import sys
import time

import click

from pulse.cli import eventsview
from pulse.cli.context import fail
from pulse.cli.group import Context, pass_ctx
from pulse.core import clock
from pulse.core.states import EFFECT_OPEN, EffectState

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


_connect = eventsview.connect
readable_times = eventsview.readable_times     # times as ISO 8601 in all pulsectl prints
_json_line = eventsview.json_line


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

    from pulse.store import vitalsdb
    conn = _connect(ctx, "vitals.db")
    latest = vitalsdb.latest_vitals(conn, [key] if key else ["*"])
    if key and not latest and not key.endswith(("*", ":")):   # a family's name alone: each of its keys
        latest = vitalsdb.latest_vitals(conn, [key + ":*"])
    if key and not latest:
        fail(f"no vitals for {key!r}")
    for k in sorted(latest):
        v = latest[k]
        click.echo(_json_line(v) if as_json else
                   f"{k:<28} {clock.iso(v.ts)}  {json.dumps(readable_times(v.data), separators=(',', ':'), default=str)}")


@click.command()
@click.option("--pending", is_flag=True, help="Only effects not yet ended (pending or executing).")
@click.option("-n", "--lines", default=50, show_default=True, help="How many, newest first.")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines.")
@pass_ctx
def effects(ctx: Context, pending: bool, lines: int, as_json: bool) -> None:
    """Effects and their state."""
    eventsview.print_effects(ctx, pending, lines, as_json)


def _param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{text!r}: expected key=value")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


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
    from pulse.core.wire import enginerpc
    config = ctx.config()
    try:
        values = dict(_param(p) for p in params)
    except click.BadParameter as err:
        fail(f"--param {err.message}", 2)
    effect = enginerpc.Effect(kind=kind, target=target, params=values, idempotent=idempotent)
    sys.exit(queue_effect(ctx, effect, deadline_s or config.timings.effect_deadline_s, wait_s))


def commit_operator_effect(ctx: Context, effect, deadline_s: float):
    """Commit an effect of origin operator, ring the executor, print its id: the committed effect."""
    from pulse.core import client
    from pulse.core.wire import doorbells
    from pulse.store import effectqueue, eventsdb
    effect = effectqueue.new_effect(effect, "operator", deadline_s)
    conn = eventsdb.open_events(ctx.paths.events_db)
    try:
        effectqueue.commit_effects(conn, [effect], "pulsectl")
    finally:
        conn.close()
    client.ring(ctx.paths, "doorbell", doorbells.Doorbell("pulsectl"))
    click.echo(effect.id)
    return effect


def await_effect(ctx: Context, effect_id: str, wait_s: float) -> str | None:
    """The state the effect ended in, or None if it is still open after wait_s (said on stderr)."""
    from pulse.store import effectqueue, eventsdb
    conn = eventsdb.open_events(ctx.paths.events_db)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            state = effectqueue.effect_state(conn, effect_id)
            if state not in EFFECT_OPEN:
                return state
            if time.monotonic() >= deadline:
                click.echo(f"pulsectl: {effect_id} still {state} after {wait_s:g}s{unrun_because(ctx)}", err=True)
                return None
            time.sleep(0.01)
    finally:
        conn.close()


def unrun_because(ctx: Context) -> str:
    """Why an effect may be waiting: pulsed is down (it stays queued until pulsed starts), else nothing."""
    from pulse.core import client
    if client.daemon_pid(ctx.paths) is None:
        return f": pulsed is not running on {ctx.paths.home}; it stays queued and runs once pulsed starts"
    return ""


def queue_effect(ctx: Context, effect, deadline_s: float, wait_s: float) -> int:
    """Commit an operator effect, ring the executor, print its id, and (wait_s) its outcome: an exit code."""
    from pulse.store import effectqueue, eventsdb
    effect = commit_operator_effect(ctx, effect, deadline_s)
    if not wait_s:
        return 0
    state = await_effect(ctx, effect.id, wait_s)
    if state is None:
        return 1
    conn = eventsdb.open_events(ctx.paths.events_db)
    try:
        why = effectqueue.effect_why(conn, effect.id)
    finally:
        conn.close()
    click.echo(f"{effect.id} {state}" + (f": {why}" if why else ""))
    return 0 if state == EffectState.ACKED else 1


COMMANDS = [events, vitals, effects, emit]
