"""`pulsectl schedule list|run`: the [[schedule]]s the tick runs.

What a schedule has run is folded from its events (pulse.core.schedule); `run` commits one run now
through the same path as the tick (pulse.store.schedulerun), marked manual: an operator's event,
outside the slots, so the next slot still runs on time. Exit codes: 0 done; 1 no such schedule; 2 usage.
"""

from __future__ import annotations

import json
import sys
import time

import click

from pulse.cli.group import Context, pass_ctx


def _fail(message: str, code: int = 1):
    click.echo(f"pulsectl: {message}", err=True)
    sys.exit(code)


def _rebuild_book(conn, upto_id: int):
    """The schedule book from the first event: what came before a schedule's first fact is no
    schedule's, so the ends of older tasks and effects are skipped."""
    from pulse.core import schedule
    from pulse.store import eventsdb
    book = schedule.ScheduleBook()
    first = eventsdb.read_events(conn, types=[schedule.ARMED, schedule.RUN], limit=1)
    after = first[0].id - 1 if first else upto_id
    while after < upto_id and (batch := eventsdb.events_after(conn, after, upto_id, sorted(schedule.FOLDED), 5_000)):
        book.fold(batch)
        after = batch[-1].id
    return book


def schedules_projection():
    """The schedule book as a checkpointed projection (the tick keeps its own inside its projections)."""
    from pulse.core import schedule
    from pulse.store import projection
    return projection.Projection(name="schedules", new=schedule.ScheduleBook, fold=schedule.ScheduleBook.fold,
                                 types=tuple(sorted(schedule.FOLDED)), state_type=schedule.ScheduleBook,
                                 rebuild=_rebuild_book, code=(schedule.ScheduleBook, schedule.ScheduleState))


def _book(ctx: Context):
    """Every schedule's state, folded from events.db (empty when there is none yet): from its
    checkpoint, folding what came after."""
    from pulse.core import schedule
    from pulse.store import connection, projection
    if not ctx.paths.events_db.exists():
        return schedule.ScheduleBook()
    try:
        conn = connection.open_readonly(ctx.paths.events_db)
    except connection.StoreError as err:
        _fail(str(err))
    home = ctx.paths.home
    return projection.Folded(schedules_projection(), conn, home / projection.DIRECTORY, every_events=1_000,
                             every_s=float("inf"), save=projection.may_write(home)).catch_up()


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts is not None else "-"


def rows(ctx: Context) -> list[dict]:
    """One dict per configured schedule: its spec, next run, last run and failures."""
    import msgspec

    from pulse.core import schedule
    book, now = _book(ctx), time.time()
    out = []
    for s in ctx.config().schedule:
        state = book.states.get(s.name) or schedule.ScheduleState(name=s.name)
        out.append({**msgspec.to_builtins(state), "spec": {"cron": s.cron} if s.cron else {"every": s.every},
                    "makes": "task" if s.task is not None else f"effect {s.effect.kind}",
                    "next_run": schedule.next_due(s, state.last_slot, now),
                    "failing": schedule.failing(state, s.notify_after)})
    return out


@click.group()
def schedule() -> None:
    """Recurring tasks and effects ([[schedule]] in config.toml), run by the tick."""


@schedule.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines, one schedule each.")
@pass_ctx
def list_(ctx: Context, as_json: bool) -> None:
    """Every schedule: when it runs next, what it ran last, whether its runs keep failing."""
    found = rows(ctx)
    if as_json:
        for row in found:
            click.echo(json.dumps(row))
        return
    if not found:
        click.echo(f"no [[schedule]] in {ctx.paths.config}")
        return
    click.echo(f"{'NAME':<20} {'WHEN':<16} {'NEXT RUN':<19}  {'LAST RUN':<19}  {'RUN':<12} {'RUNS':>5} FAILED")
    for r in found:
        spec = r["spec"].get("cron") or f"every {r['spec']['every']}"
        failed = f"{r['failures_in_row']} in a row" + (" (notified)" if r["failing"] else "") \
            if r["failures_in_row"] else "-"
        click.echo(f"{r['name']:<20} {spec:<16} {_when(r['next_run']):<19}  {_when(r['last_run_ts']):<19}  "
                   f"{(r['last_run'] or '-')[:12]:<12} {r['runs'] + r['manual_runs']:>5} {failed}")


@schedule.command()
@click.argument("name")
@pass_ctx
def run(ctx: Context, name: str) -> None:
    """Run schedule NAME once now (recorded as the operator's manual run; its slots are unchanged)."""
    from pulse.agents import tasks
    from pulse.core import client, wire
    from pulse.core import schedule as schedulemod
    from pulse.store import effectqueue, eventsdb, schedulerun
    config = ctx.config()
    s = next((s for s in config.schedule if s.name == name), None)
    if s is None:
        known = ", ".join(x.name for x in config.schedule) or "none"
        _fail(f"no [[schedule]] named {name!r} in {ctx.paths.config} (configured: {known})")
    if not ctx.home.is_dir():
        _fail(f"no Pulse home at {ctx.home} (run `pulsectl init`, or start pulsed)")
    conn = eventsdb.open_events(ctx.paths.events_db)
    make_task = effect = None
    if s.task is not None:
        fields = schedulemod.task_fields(s, None)
        make_task = lambda n: wire.now_event(wire.TaskEvent.CREATED, "pulsectl", tasks.task_id(n), fields)  # noqa: E731
    else:
        effect = effectqueue.new_effect(schedulemod.effect_of(s), "operator", config.timings.effect_deadline_s)
    fact = schedulerun.commit_run(conn, name, "pulsectl", slot=None, make_task=make_task, effect=effect,
                                  observe_only=config.observe_only, by="operator")
    made = fact.data.get("task") or fact.data.get("effect")
    if effect is not None:
        client.ring(ctx.paths, "doorbell", wire.Doorbell("pulsectl"))
    else:
        client.ring(ctx.paths, "wake", wire.Wake("pulsectl", f"{made} created by schedule {name}"))
    click.echo(f"schedule {name}: ran now: {'task ' if s.task is not None else 'effect '}{made}")


COMMANDS = [schedule]
