"""`pulsectl schedule list|run` themselves, click-free: pulse.cli.schedulecmd declares them to click,
pulse.cli.fastpath runs them without it."""

from __future__ import annotations

import time

from pulse.cli.context import Context, echo, fail

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def _book(ctx: Context):
    """Every schedule's state, folded from events.db (empty when there is none yet): from its
    checkpoint, folding what came after (pulse.store.schedulerun.book_of)."""
    from pulse.core import schedule
    from pulse.store import connection, schedulerun
    if not ctx.paths.events_db.exists():
        return schedule.ScheduleBook()
    try:
        conn = connection.open_readonly(ctx.paths.events_db)
    except connection.StoreError as err:
        fail(str(err))
    try:
        return schedulerun.book_of(conn, ctx.paths.home)
    finally:
        conn.close()


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts is not None else "-"


def rows(ctx: Context) -> list[dict]:
    """One dict per configured schedule (pulse.core.schedule.rows)."""
    from pulse.core import schedule
    return schedule.rows(ctx.config().schedule, _book(ctx), time.time())


def list_all(ctx: Context, as_json: bool) -> None:
    """Every schedule: when it runs next, what it ran last, whether its runs keep failing."""
    found = rows(ctx)
    if as_json:
        import json
        for row in found:
            echo(json.dumps(row))
        return
    if not found:
        echo(f"no [[schedule]] in {ctx.paths.config}")
        return
    echo(f"{'NAME':<20} {'WHEN':<16} {'NEXT RUN':<19}  {'LAST RUN':<19}  {'RUN':<12} {'RUNS':>5} "
         f"{'SKIPPED':>7} FAILED")
    for r in found:
        spec = r["spec"].get("cron") or f"every {r['spec']['every']}"
        failed = f"{r['failures_in_row']} in a row" + (" (notified)" if r["failing"] else "") \
            if r["failures_in_row"] else "-"
        # a run still open holds the next: say so where the next run's time would mislead
        nxt = f"after {r['open_run']}" if r["open_run"] else _when(r["next_run"])
        echo(f"{r['name']:<20} {spec:<16} {nxt:<19}  {_when(r['last_run_ts']):<19}  "
             f"{(r['last_run'] or '-')[:12]:<12} {r['runs'] + r['manual_runs']:>5} {r['skipped']:>7} {failed}")


def run(ctx: Context, name: str) -> None:
    """Schedule `name` run once now, as the operator's manual run (its slots unchanged)."""
    from pulse.agents import tasks
    from pulse.core import client
    from pulse.core import schedule as schedulemod
    from pulse.core.wire import doorbells, eventmsgs
    from pulse.store import effectqueue, eventsdb, schedulerun
    config = ctx.config()
    s = next((s for s in config.schedule if s.name == name), None)
    if s is None:
        known = ", ".join(x.name for x in config.schedule) or "none"
        fail(f"no [[schedule]] named {name!r} in {ctx.paths.config} (configured: {known})")
    if not ctx.home.is_dir():
        fail(f"no Pulse home at {ctx.home} (run `pulsectl init`, or start pulsed)")
    conn = eventsdb.open_events(ctx.paths.events_db)
    make_task = effect = None
    if s.task is not None:
        fields = schedulemod.task_fields(s, None)
        make_task = lambda n: eventmsgs.now_event(eventmsgs.TaskEvent.CREATED, "pulsectl", tasks.task_id(n), fields)  # noqa: E731
    else:
        effect = effectqueue.new_effect(schedulemod.effect_of(s), "operator", config.timings.effect_deadline_s)
    fact = schedulerun.commit_run(conn, name, "pulsectl", slot=None, make_task=make_task, effect=effect,
                                  observe_only=config.observe_only, by="operator")
    made = fact.data.get("task") or fact.data.get("effect")
    if effect is not None:
        client.ring(ctx.paths, "doorbell", doorbells.Doorbell("pulsectl"))
    else:
        client.ring(ctx.paths, "wake", doorbells.Wake("pulsectl", f"{made} created by schedule {name}"))
    echo(f"schedule {name}: ran now: {'task ' if s.task is not None else 'effect '}{made}")
