"""`pulsectl emit` itself, click-free, and the queueing of an operator's effect that it, `notify test`
and the process verbs share: pulse.cli.pipeline declares emit to click, pulse.cli.fastpath runs it
without it."""

from __future__ import annotations

import json
import sys
import time

from pulse.cli.context import Context, echo, fail
from pulse.core.states import EFFECT_OPEN, EffectState

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def _param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r}: expected key=value")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def emit(ctx: Context, kind: str, target: str | None, params: tuple[str, ...], idempotent: bool,
         deadline_s: float | None, wait_s: float) -> None:
    """An effect queued by hand (origin operator), the executor rung; `wait_s`: its outcome awaited."""
    from pulse.core.wire import enginerpc
    config = ctx.config()
    try:
        values = dict(_param(p) for p in params)
    except ValueError as err:
        fail(f"--param {err}", 2)
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
    echo(effect.id)
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
                echo(f"pulsectl: {effect_id} still {state} after {wait_s:g}s{unrun_because(ctx)}", err=True)
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
    echo(f"{effect.id} {state}" + (f": {why}" if why else ""))
    return 0 if state == EffectState.ACKED else 1
