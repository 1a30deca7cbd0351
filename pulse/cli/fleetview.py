"""`pulsectl fleet status|events|add|tasks` themselves, click-free: pulse.cli.fleetcmd declares them to
click, pulse.cli.fastpath runs them without it.

`pulsectl fleet status`: every host of the fleet ([fleet] in config.toml), as this host's fleet
worker last read it from NATS (<runtime>/fleet-view.json). `pulsectl fleet events` reads the
PULSE_EVENTS stream itself, as a read-only NATS client with the credentials of [fleet]: it never
publishes, and nothing that keeps the host alive waits on it."""

from __future__ import annotations

import re
import sys
import time
from collections import deque

from pulse.cli.context import Context, echo, fail

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def host_line(row: dict) -> tuple[str, ...]:
    seen = time.strftime("%H:%M:%SZ", time.gmtime(row["last_seen"])) if row.get("last_seen") else "-"
    if row["state"] != "up":   # its last summary says what it was, not what runs there now
        return (str(row["host"]), row["state"], "-", "-", "-", "-", seen)
    agents = f"{row['agents_busy']}/{row['agents_busy'] + row['agents_free']}"
    return (str(row["host"]), row["state"], f"{row['workers_running']}/{row['workers_total']}",
            f"{row['processes_healthy']}/{row['processes_total']}", str(row.get("open_effects", "-")), agents, seen)


def status(ctx: Context, as_json: bool) -> None:
    """Every host: up or gone, workers running/total, processes healthy/total, open effects, agents
    busy/total, last seen. Exit 3 when this host's fleet worker has no view yet."""
    from pulse.cli.statusview import columns
    from pulse.core import fleetnames as names
    view = names.read_judged_view(ctx.paths.runtime)
    if view is None:
        enabled = ctx.config().fleet.enabled
        echo("pulsectl: no fleet view yet: " + ("the fleet worker has not reached NATS (see pulsectl status)"
             if enabled else "[fleet] enabled = true in config.toml, then `pulsectl reload`"), err=True)
        sys.exit(3)
    if as_json:
        import json  # only --json prints it
        echo(json.dumps(view, sort_keys=True))
        return
    rows = [("HOST", "STATE", "WORKERS", "PROCESSES", "EFFECTS", "AGENTS BUSY", "LAST SEEN")]
    echo("\n".join(columns(rows + [host_line(r) for r in view["hosts"]])))
    agents = [(r["host"], names.agent_words(a)) for r in view["hosts"] for a in r.get("agents", [])]
    if agents:   # each agent: busy/slots, [tags], (projects), and why a spend limit holds it
        echo("\n".join(["", *columns([("HOST", "AGENT BUSY/SLOTS [TAGS] (PROJECTS) BUDGET")] + agents)]))
    echo(f"as seen by {view['host']} {view['age_s']:.1f}s ago" + (
        ": not refreshed within the presence TTL (NATS unreachable? pulsectl status says why), so the "
        "other hosts are unknown" if view["stale"] else ""))


def event_line(m: dict) -> str:
    import json
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(m["ts"])) + f".{int(m['ts'] % 1 * 1000):03d}Z"
    data = json.dumps(m.get("data") or {}, sort_keys=True)
    return f"{stamp}  {m['host']}  #{m['id']}  {m['type']}  {m['source']}  {m.get('target') or '-'}  {data}"


def events_subject(host: str | None, type_: str | None) -> str:
    from pulse.core import fleetnames as names
    return f"pulse.events.{names.host_token(host) if host else '*'}.{names.host_token(type_) if type_ else '*'}"


async def read_events(fleet_settings, subject: str, last: int, follow: bool, show) -> None:
    """The last `last` events of `subject` (read through from the stream's start), then, with
    `follow`, every new one as it comes."""
    import asyncio
    import json

    import nats

    from pulse.core import fleetnames as names
    options = names.connect_options(fleet_settings, lambda state, reason: None, lambda error: None)
    nc = await nats.connect(**options)
    try:
        sub = await nc.jetstream().pull_subscribe(subject, stream=names.EVENTS_STREAM)
        tail: deque = deque(maxlen=last)
        caught_up = False
        while True:
            try:
                msgs = await sub.fetch(500, timeout=1)
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                msgs = []
            for m in msgs:
                event = json.loads(m.data)
                tail.append(event) if not caught_up else show(event)
                await m.ack()
            if not msgs and not caught_up:
                caught_up = True
                for event in tail:
                    show(event)
                if not follow:
                    return
    finally:
        await nc.close()


def events(ctx: Context, follow: bool, host: str | None, type_: str | None, last: int, as_json: bool) -> None:
    """Every host's events, from the PULSE_EVENTS stream (in order per host)."""
    import asyncio
    import json
    settings = ctx.config().fleet
    if not settings.enabled:
        echo("pulsectl: [fleet] is not enabled in config.toml", err=True)
        sys.exit(3)

    def show(event: dict) -> None:
        echo(json.dumps(event, sort_keys=True) if as_json else event_line(event))
    try:
        asyncio.run(read_events(settings, events_subject(host, type_), last, follow, show))
    except KeyboardInterrupt:
        pass
    except Exception as err:
        from pulse.core.fleetnames import describe
        fail(f"cannot read the fleet's events: {describe(err)}", 4)


def this_host(ctx: Context) -> str:
    from pulse.core import fleetnames as names
    from pulse.core.instances import default_name
    config = ctx.config()
    return config.fleet.host or names.default_host(config.pulse.name or default_name(ctx.home))


def unknown_pin(view: dict | None, pin: str | None) -> str | None:
    """Why no host of the fleet could run a task pinned to `pin`, or None. Judged from the fleet view
    (every host's agents, gone ones included, since a gone host may come back): without a view (NATS
    not reached yet) nothing is known, and the offer is left to the hosts."""
    if view is None or pin is None:
        return None
    known = sorted({a["name"] for host in view.get("hosts", []) for a in host.get("agents", [])})
    if pin in known:
        return None
    return ("no host of the fleet has an [[agent]] of that name (the fleet's agents: "
            + (", ".join(known) or "none") + "; pulsectl fleet status lists them)")


def offer_task(ctx: Context, pin: str | None, project: str, title: str, prompt: str, priority: int,
               tags: tuple[str, ...]) -> str:
    """Offer a task to the fleet: a `fleet-task-offered` event of this host's events.db (never a local
    task), which this host's fleet worker publishes. Returns its fleet id. The one code path of
    `pulsectl task add --fleet` and `pulsectl fleet add`."""
    import secrets

    from pulse.core import fleetnames as names
    from pulse.core.config import ROUTE_NAME
    from pulse.core.wire import eventmsgs
    from pulse.store import eventsdb
    if not ctx.config().fleet.enabled:
        echo("pulsectl: [fleet] is not enabled in config.toml", err=True)
        sys.exit(3)
    for name, value in [("--agent", pin)] + [("--tag", t) for t in tags]:
        if value is not None and not re.fullmatch(ROUTE_NAME, value):
            fail(f"{name} {value!r}: letters, digits and _ . : / -, not starting with a symbol", 2)
    unknown = unknown_pin(names.read_view(ctx.paths.runtime), pin)
    if unknown:   # said, not refused: a host with that agent may join before offer_ttl_s
        echo(f"pulsectl: warning: --agent {pin!r}: {unknown}; offered anyway, it waits for such a host "
             f"for [fleet] offer_ttl_s ({ctx.config().fleet.offer_ttl_s:g}s)", err=True)
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        echo("pulsectl: --prompt is empty", err=True)
        sys.exit(2)
    fleet_id = f"{names.host_token(this_host(ctx))}-{secrets.token_hex(6)}"
    data = {"agent": pin, "project": project, "title": title, "prompt": prompt, "priority": priority,
            **({"tags": sorted(set(tags))} if tags else {})}
    conn = eventsdb.open_events(ctx.paths.events_db)
    eventsdb.append_events(conn, [eventmsgs.now_event(eventmsgs.FLEET_TASK_OFFERED, "pulsectl", fleet_id, data)])
    return fleet_id


def add(ctx: Context, agent: str | None, tags: tuple[str, ...], project: str, title: str, prompt: str,
        priority: int) -> None:
    """`fleet add`: offer_task, its fleet id printed."""
    echo(offer_task(ctx, agent, project, title, prompt, priority, tags))


def task_row(view: dict) -> tuple[str, ...]:
    """A fleet task under `pulsectl fleet tasks`' header: where it ran, and how it ended in words."""
    from pulse.agents.taskview import result_words
    where = ", ".join(f"{r['host']}:{r['task']}" for r in view["runs"]) or "-"
    outcome = view["error"] or view["why"] or result_words(view["result"]) or "-"
    return (view["fleet_id"], view["status"], view["agent"] or "-", where, view["title"] or "-",
            " ".join(outcome.split()))


def tasks(ctx: Context, as_json: bool) -> None:
    """The tasks this host offered to the fleet: where each ran (every host that took it) and how it
    ended (`dead`: dead-lettered after [fleet] max_deliver takings)."""
    from pulse.agents.taskview import fleet_views
    from pulse.store import connection, projection
    conn = connection.open_readonly(ctx.paths.events_db)
    try:
        views = fleet_views(conn, ctx.paths.home / projection.DIRECTORY)
    finally:
        conn.close()
    if as_json:
        import json  # only --json prints it
        for view in views:
            echo(json.dumps(view, sort_keys=True, default=str))
        return
    from pulse.cli.statusview import columns
    header = ("FLEET ID", "STATUS", "AGENT", "RAN ON", "TITLE", "OUTCOME")
    echo("\n".join(columns([header] + [task_row(v) for v in views])))

