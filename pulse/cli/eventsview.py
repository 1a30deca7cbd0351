"""`pulsectl events`, `effects` and `vitals` themselves, click-free: pulse.cli.pipeline declares them
to click, pulse.cli.fastpath runs them without it (they are what operators run in loops)."""

from __future__ import annotations

import time
from typing import Callable

from pulse.cli.context import Context, echo, fail
from pulse.core import clock
from pulse.core.states import EFFECT_OPEN

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).

readable_times = clock.readable_times     # times as ISO 8601 in all pulsectl prints


def connect(ctx: Context, name: str):
    from pulse.store import connection
    try:
        return connection.open_readonly(ctx.home / name)
    except connection.StoreError as err:
        fail(str(err))


def compact(value: object) -> str:
    """`value` as one line of JSON, its times readable. msgspec's encoder, which pulsectl has loaded
    already, not the json module (~1 ms of imports, six regular expressions compiled, for every
    `pulsectl events`): text as UTF-8, not escaped."""
    import msgspec
    return msgspec.json.encode(readable_times(msgspec.to_builtins(value)), enc_hook=str).decode()


def event_line(ev, as_json: bool) -> str:
    if as_json:
        return compact(ev)
    data = compact(ev.data)
    return f"{ev.id:>7} {clock.iso(ev.ts)} {ev.type:<17} {ev.source:<9} {ev.target or '-':<20} {data}"


def print_events(ctx: Context, types: tuple[str, ...], since: str | None, lines: int, follow: bool, as_json: bool,
                 parse_since: Callable[[str], float] = clock.parse_since) -> None:
    """The last `lines` events (of `types`, over the whole history), or all since `since` (read by
    `parse_since`: click's command says a bad one as a usage error); `follow`: then every new one."""
    from pulse.store import eventsdb
    conn = connect(ctx, "events.db")
    since_ts = parse_since(since) if since else None
    last = eventsdb.last_event_id(conn)
    past = (eventsdb.read_events(conn, types=types, since_ts=since_ts) if since_ts is not None
            else eventsdb.last_events(conn, lines, types))
    past = with_archived(conn, past, since_ts, lines, types)
    for ev in past:
        echo(event_line(ev, as_json))
    try:
        while follow:
            batch = eventsdb.read_events(conn, after_id=last, limit=1000)
            if batch:
                last = batch[-1].id
                for ev in batch:
                    if not types or ev.type in types:
                        echo(event_line(ev, as_json))
            else:
                time.sleep(0.2)
    except KeyboardInterrupt:
        pass


def with_archived(conn, past: list, since_ts: float | None, lines: int, types: tuple[str, ...]) -> list:
    """`past` with the archived events before it where the range reaches into the archive (the
    oldest events moved out of events.db: pulse.store.archive). A segment that fails its checksum
    is refused: said, and exit 1."""
    from pulse.store import eventindex
    first_live = eventindex.first_live_id(conn)
    if first_live == 1:
        return past                       # nothing moved
    if since_ts is not None and since_ts >= (eventindex.event_ts(conn, first_live) or 0):
        return past                       # the range starts in the live history
    if since_ts is None and len(past) >= lines:
        return past
    from pulse.store import archive  # zstandard and hashlib, ~4 ms: only for a range that reaches the archive
    try:
        if since_ts is not None:
            return archive.events_since(conn, since_ts, types) + past
        return archive.last_events(conn, lines - len(past), types, before_id=first_live) + past
    except archive.SegmentError as err:
        fail(f"{err}; run `pulsectl store check`")


def print_effects(ctx: Context, pending: bool, lines: int, as_json: bool) -> None:
    """The newest `lines` effects (`pending`: only those not yet ended) and their state."""
    import msgspec

    from pulse.store import effectqueue
    conn = connect(ctx, "events.db")
    rows = effectqueue.list_effects(conn, EFFECT_OPEN if pending else (), lines)
    if not as_json:
        echo(f"{'ID':<32}  {'STATE':<9} {'KIND':<16} {'TARGET':<20} {'ORIGIN':<9} {'CREATED':<24} WHY")
    for effect, state, why in rows:
        if as_json:
            echo(compact({**msgspec.to_builtins(effect), "state": state, "why": why}))
        else:
            echo(f"{effect.id:<32}  {state:<9} {effect.kind:<16} {effect.target or '-':<20} "
                 f"{effect.origin:<9} {clock.iso(effect.created):<24} {why or ''}".rstrip())


def print_vitals(ctx: Context, key: str | None, as_json: bool) -> None:
    """The latest vital of each key: of `key` alone, of its family (`health`: every `health:NAME`), or
    of a prefix ending in *; every key when None."""
    from pulse.store import vitalsdb
    conn = connect(ctx, "vitals.db")
    latest = vitalsdb.latest_vitals(conn, [key] if key else ["*"])
    if key and not latest and not key.endswith(("*", ":")):   # a family's name alone: each of its keys
        latest = vitalsdb.latest_vitals(conn, [key + ":*"])
    if key and not latest:
        fail(f"no vitals for {key!r}")
    for k in sorted(latest):
        v = latest[k]
        echo(compact(v) if as_json else
             f"{k:<28} {clock.iso(v.ts)}  {compact(v.data)}")
