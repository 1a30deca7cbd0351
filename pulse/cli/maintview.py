"""`pulsectl pause`, `resume` and `notify test` themselves, click-free: pulse.cli.maintenance declares
them to click, pulse.cli.fastpath runs them without it."""

from __future__ import annotations

import sys
import time

from pulse.cli.context import Context, echo
from pulse.cli.processview import named
from pulse.core import clock
from pulse.core.states import EffectState

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def _append(ctx: Context, type_: str, target: str, **data) -> None:
    """Commit the event, then ring the tick so the rules see it now."""
    from pulse.core import client
    from pulse.core.wire import doorbells, eventmsgs
    from pulse.store import eventsdb
    conn = eventsdb.open_events(ctx.paths.events_db)
    eventsdb.append_events(conn, [eventmsgs.now_event(type_, "pulsectl", target, **data)])
    client.ring(ctx.paths, "wake", doorbells.Wake("pulsectl", type_))


def pause(ctx: Context, process: str, duration: str) -> None:
    """Leave `process` alone (no restarts) for `duration` (90s, 30m, 2h, 1d: one clock.parse_duration reads)."""
    from pulse.core.wire.eventmsgs import EventType
    named(ctx, process)
    until = time.time() + clock.parse_duration(duration)
    _append(ctx, EventType.PAUSE, process, until=until)
    echo(f"{process} paused until {clock.iso(until, ms=False)}")


def resume(ctx: Context, process: str) -> None:
    """Watch `process` again."""
    from pulse.core.wire.eventmsgs import EventType
    named(ctx, process)
    _append(ctx, EventType.RESUME, process)
    echo(f"{process} watched again")


def notify_test(ctx: Context, wait: float) -> None:
    """One notification through every configured channel, and how each one took it."""
    from pulse.cli.emitview import await_effect, commit_operator_effect
    from pulse.core.wire import enginerpc
    from pulse.core.wire.eventmsgs import EffectKind
    from pulse.effects.notify import channel_label
    config = ctx.config()
    labels = [channel_label(c, i) for i, c in enumerate(config.notify)]
    echo(f"channels: {', '.join(labels) or 'none'}")
    # Not idempotent: a test is said once and answered now, never kept in the queue for retries.
    effect = commit_operator_effect(ctx, enginerpc.Effect(kind=EffectKind.NOTIFY, target="pulse", params={
        "title": "Pulse test notification", "message": "If you read this, this channel works.", "test": True}),
        config.timings.effect_deadline_s)
    state = await_effect(ctx, effect.id, wait)
    if state is None:
        sys.exit(1)
    every_one_took_it = report_channels(ctx, effect.id, labels)
    echo(f"{effect.id} {state}")
    sys.exit(0 if every_one_took_it and state == EffectState.ACKED else 1)


def channel_lines(labels: list[str], answers: dict) -> list[str]:
    """One line per channel: its name, ok or failed, and what it answered."""
    width = max(map(len, labels), default=0)
    lines = []
    for label in labels:
        answer = str(answers.get(label, "failed: not tried"))
        failed = answer.startswith("failed: ")
        lines.append(f"{label:<{width}}  {'failed' if failed else 'ok':<6}  {answer.removeprefix('failed: ')}")
    return lines


def report_channels(ctx: Context, effect_id: str, labels: list[str]) -> bool:
    """Print each channel's answer to the ended effect; True when every channel took it."""
    from pulse.store import eventsdb
    conn = eventsdb.open_events(ctx.paths.events_db)
    try:
        end = eventsdb.effect_end(conn, effect_id)
    finally:
        conn.close()
    data = end.data if end is not None else {}
    answers = data.get("channels")
    if not isinstance(answers, dict):        # refused before any channel was tried (bad-params, not-allowed)
        echo(f"{effect_id} {data.get('reason', 'failed')}: {data.get('error', '')}")
        return False
    for line in channel_lines(labels, answers):
        echo(line)
    return all(not str(answers.get(label, "failed: ")).startswith("failed: ") for label in labels)
