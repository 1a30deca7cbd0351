"""`pulsectl task add|list|show|output|close|give-up|retry` (of a task of this host, or of one it
offered to the fleet) themselves, click-free: pulse.cli.taskcmd declares them to click,
pulse.cli.fastpath runs them without it."""

from __future__ import annotations

import re
import sys

from pulse.cli.context import Context, echo, fail

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def writable(ctx: Context):
    from pulse.store import eventsdb
    if not ctx.home.is_dir():
        fail(f"no Pulse home at {ctx.home} (run `pulsectl init`, or start pulsed)")
    return eventsdb.open_events(ctx.paths.events_db)


def readonly(ctx: Context):
    from pulse.store import connection
    try:
        return connection.open_readonly(ctx.paths.events_db)
    except connection.StoreError as err:
        fail(str(err))


def ring_tick(ctx: Context, reason: str) -> None:
    """A new task is news for the assignment rule: wake the tick (dropped if nobody listens)."""
    from pulse.core import client
    from pulse.core.wire import doorbells
    client.ring(ctx.paths, "wake", doorbells.Wake("pulsectl", reason))


def line(t) -> str:
    return f"{t.id:<10} {t.status:<9} {t.priority:>4}  {t.project:<16} {t.agent or '-':<12} {t.title}"


HEADER = f"{'ID':<10} {'STATUS':<9} {'PRIO':>4}  {'PROJECT':<16} {'AGENT':<12} TITLE"


def number(task_id: str) -> int:
    return int(task_id.rpartition("-")[2])


def add(ctx: Context, project: str, title: str, prompt: str, priority: int, pin: str | None,
        tags: tuple[str, ...], fleet: bool = False) -> None:
    """A pending task on this host; prints its id. `fleet`: offered to the fleet instead
    (pulse.cli.fleetview.offer_task), its fleet id printed."""
    if fleet:   # the agent may be on another host: --agent names any host's [[agent]]
        from pulse.cli.fleetview import offer_task
        echo(offer_task(ctx, pin, project, title, prompt, priority, tags))
        return
    from pulse.agents import routing, tasks
    from pulse.core.config import ROUTE_NAME
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        fail("--prompt is empty", 2)
    agents = ctx.config("load_agent_tables").agent
    if pin is not None and pin not in {a.name for a in agents}:
        fail(f"--agent {pin}: not an [[agent]] in {ctx.paths.config} "
             f"(configured: {', '.join(a.name for a in agents) or 'none'})", 2)
    for tag in tags:
        if not re.fullmatch(ROUTE_NAME, tag):
            fail(f"--tag {tag!r}: letters, digits and _ . : / -, not starting with a symbol", 2)
    state = tasks.create(writable(ctx), project, title, prompt, priority, source="pulsectl", pin=pin, tags=tags)
    ring_tick(ctx, f"{state.id} created")
    echo(state.id)
    if not agents:
        echo(f"pulsectl: no [[agent]] is configured in {ctx.paths.config}: {state.id} waits, pending, "
             "until one is (then pulsectl reload)", err=True)
    elif (why := routing.unassignable(agents, state)) is not None:
        echo(f"pulsectl: {state.id} waits, pending: {why} (see [[agent]] projects and tags in "
             f"{ctx.paths.config})", err=True)


def list_all(ctx: Context, statuses: tuple[str, ...], as_json: bool) -> None:
    """Every task, oldest first (of `statuses`, when given)."""
    import msgspec

    from pulse.agents import tasks
    from pulse.store import projection
    states = sorted(tasks.load_all(readonly(ctx), ctx.paths.home / projection.DIRECTORY).values(),
                    key=lambda t: number(t.id))
    chosen = [t for t in states if not statuses or t.status in statuses]
    if as_json:
        for t in chosen:
            echo(msgspec.json.encode(t).decode())
        return
    echo(HEADER)
    for t in chosen:
        echo(line(t))


def task_or_fleet_id(text: str) -> str:
    """`task show`'s TASK: a task of this host ("7" or "task-7" → "task-7"), or the fleet id `task add
    --fleet` printed (<host token>-<12 hex digits>); a ValueError that names both forms otherwise."""
    from pulse.agents.tasks import parse_task_id  # with msgspec and the wire, ~10 ms: only `task show` reads one
    try:
        return parse_task_id(text)
    except ValueError as err:
        if re.fullmatch(r"[A-Za-z0-9_-]+-[0-9a-f]{12}", text.strip()):
            return text.strip()
        raise ValueError(f"{err}, or a fleet id such as gw_node-3-0123456789ab") from None


def show(ctx: Context, task: str, as_json: bool) -> None:
    """One task: of this host (`task-N`), as the page's task page shows it (pulse.agents.taskview), or
    one this host offered to the fleet (its fleet id)."""
    if not task.startswith("task-"):
        return show_fleet(readonly(ctx), task, as_json)
    import json

    from pulse.agents import taskview
    conn = readonly(ctx)

    def agents():
        """The [[agent]]s, read only for a pending task (config.toml is most of the command's time)."""
        from pulse.core import config as configmod
        try:
            return configmod.load_agent_tables(ctx.paths.config).agent
        except configmod.ConfigError:
            return None             # show the task anyway; pulsectl check-config names what is wrong
    try:
        view = taskview.task_view(conn, task, agents)
    except Exception as err:
        # A read imports the archive (zstandard, hashlib: ~5 ms) only when the task's events reach into it
        archive = sys.modules.get("pulse.store.archive")
        if archive is None or not isinstance(err, archive.SegmentError):
            raise
        fail(f"{task}: {err}; run `pulsectl store check`")   # an archive segment that is not sound
    if view is None:
        fail(f"{task}: no such task")
    if as_json:
        echo(json.dumps(view))
        return
    for text in show_lines(view):
        echo(text)


def show_fleet(conn, fleet_id: str, as_json: bool) -> None:
    """A task this host offered to the fleet, from the reports of the hosts that took it, which this
    host's fleet worker recorded in events.db: pulsectl never talks to NATS for it."""
    import json

    from pulse.agents import taskview
    view = taskview.fleet_task_view(read_fleet_events(conn, fleet_id))
    if view is None:
        fail(f"{fleet_id}: no such fleet task offered from this host")
    if as_json:
        echo(json.dumps(view, default=str))
        return
    for text in taskview.fleet_view_lines(view):
        echo(text)


def read_fleet_events(conn, fleet_id: str) -> list:
    """One fleet task's events, oldest first."""
    from pulse.core.wire import eventmsgs
    from pulse.store import eventsdb
    types = list(eventmsgs.FLEET_TASK_EVENTS)
    return sorted(eventsdb.search_events(conn, types=types, target=fleet_id, limit=100_000), key=lambda e: e.id)


def show_lines(view: dict) -> list[str]:
    """`task show` in words: the same projection as the page's task page (pulse.agents.taskview)."""
    out = [f"{name + ':':<12} {view[name]}" for name in ("id", "title", "project", "status", "priority", "agent",
                                                         "created", "updated", "error")
           if view.get(name) not in (None, "")]
    out += [f"{name + ':':<12} {value}" for name, value in (("pinned to", view["pin"]), ("tags", ", ".join(view["tags"])),
                                                          ("failed on", ", ".join(view["failed_on"]))) if value]
    if gave_up := view.get("given_up"):
        out.append(f"{'given up:':<12} {gave_up['why']} (by {gave_up['by']})")
    if waiting := view.get("waiting"):
        out.append(f"{'waiting:':<12} {waiting['reason']}: {waiting['why']}")
    if view["cost_usd"] is not None:
        out.append(f"{'cost:':<12} ${view['cost_usd']:.4f}")
    if view["tokens"]:
        out.append(f"{'tokens:':<12} " + ", ".join(f"{k} {v}" for k, v in sorted(view["tokens"].items())))
    out.append("prompt:")
    out += [f"  {line}" for line in view["prompt"].splitlines() or [""]]
    out.append(f"attempts: {view['attempts']}")
    for r in view["runs"]:
        why = f" ({r['reason']}: {r['error']})" if r.get("reason") else ""
        cost = f", ${r['cost_usd']:.4f}" if isinstance(r.get("cost_usd"), (int, float)) else ""
        tokens = "".join(f", {v} {k} tokens" for k, v in sorted((r.get("tokens") or {}).items()))
        out.append(f"  #{r['attempt']} {r['agent'] or '-'}: {r['outcome']}{why}")
        out.append(f"     started {r['started'] or '-'}, ended {r['ended'] or '-'}{cost}{tokens}")
        out += [f"     noticed, left running: {n.get('guard')}: {n.get('detail')}" for n in r.get("notices") or []]
        if r.get("output"):
            out.append(f"     output: pulsectl task output {view['id']} --attempt {r['attempt']}")
    out.append(f"gate calls: {len(view['gate_calls'])}")
    for g in view["gate_calls"]:
        ok = "" if g["ok"] is None else (" ok" if g["ok"] else " refused")
        out.append(f"  {g['ts']} {g['phase'] or g['type']:<8} {g['tool'] or '-'}{ok}"
                   + (f" ({g['reason']})" if g.get("reason") else ""))
    out.append("history:")
    out += [f"  {e['ts']} {e['type']:<15} {e['source']}" + (f" ({e['reason']})" if e.get("reason") else "")
            for e in view["events"]]
    return out


def output(ctx: Context, task: str, attempt: int | None) -> None:
    """The agent's output for a task (of `attempt`, else the last with one), as text; exit 1 when there
    is none."""
    from pulse.agents import taskview
    view = taskview.task_view(readonly(ctx), task)
    if view is None:
        fail(f"{task}: no such task")
    ref = taskview.last_output_ref(view, attempt)
    text = taskview.output_text(ctx.paths.objects, ref, limit=None)
    if text is None:
        which = f"attempt {attempt}" if attempt is not None else "any attempt"
        fail(f"{task}: no output kept for {which}" + (f" ({ref} is gone from objects/)" if ref else ""))
    echo(text, nl=not text.endswith("\n"))


def record(ctx: Context, task: str, type: str, **data) -> None:
    from pulse.agents import tasks
    try:
        state = tasks.record(writable(ctx), task, type, "pulsectl", **data)
    except tasks.IllegalTransition as err:
        fail(str(err))
    echo(f"{task}: {state.status}")


def close(ctx: Context, task: str) -> None:
    """A task closed (acked, or pending and needing no agent); a fleet id withdrawn."""
    if not task.startswith("task-"):
        return withdraw(writable(ctx), task)
    from pulse.core.wire.eventmsgs import TaskEvent
    record(ctx, task, TaskEvent.CLOSED, by="operator")


def give_up(ctx: Context, task: str, reason: str) -> None:
    """A task given up: no agent will be handed it again."""
    from pulse.core.wire.eventmsgs import TaskEvent
    record(ctx, task, TaskEvent.GIVEN_UP, by="operator", reason=reason)


def retry(ctx: Context, task: str) -> None:
    """A given-up task back to pending, its failures forgiven."""
    from pulse.core import client
    from pulse.core.wire import doorbells, eventmsgs
    from pulse.store import eventsdb
    created = eventsdb.search_events(writable(ctx), types=[eventmsgs.TaskEvent.CREATED], source="fleet", target=task, limit=1)
    if created:   # the fleet has moved on with it: a run here now could be its second
        fail(f"{task} was taken from the fleet (fleet task {created[0].data.get('fleet_id', '?')}): "
              "offer it again where it came from (pulsectl task add --fleet)")
    from pulse.agents import tasks
    state = tasks.load(readonly(ctx), task)
    # the task's own fields ride on the event: a fold that forgot the given-up task has it back from them
    fields = {k: getattr(state, k) for k in ("project", "title", "prompt", "priority", "pin", "tags", "created",
                                             "created_by", "parent", "depth")} if state is not None else {}
    record(ctx, task, eventmsgs.TaskEvent.RETRIED, by="operator", **fields)
    client.ring(ctx.paths, "wake", doorbells.Wake("pulsectl", f"{task} retried"))


def withdraw(conn, fleet_id: str) -> None:
    """Take back a task this host offered (`pulsectl task close <fleet id>`): a `fleet-task-withdrawn`
    event, which this host's fleet worker makes known to every host (pulse.workers.fleettasks)."""
    from pulse.agents import taskview
    from pulse.core.wire import eventmsgs
    from pulse.store import eventsdb
    view = taskview.fleet_task_view(read_fleet_events(conn, fleet_id))
    if view is None:
        echo(f"pulsectl: {fleet_id}: no such fleet task offered from this host (withdraw it where it was added)",
             err=True)
        sys.exit(1)
    if view["status"] in ("acked", "closed", "dead", "withdrawn"):
        fail(f"{fleet_id} is {view['status']} already: nothing to withdraw")
    running = view["host"] if view["status"] in ("assigned", "executing") else None
    why = "withdrawn by the operator of its origin"
    eventsdb.append_events(conn, [eventmsgs.now_event(eventmsgs.FLEET_TASK_WITHDRAWN, "pulsectl", fleet_id, {"why": why})])
    echo(f"{fleet_id}: withdrawn" + (f" (its run on {running} ends as it will, and is not offered again)"
                                     if running else ""))
