"""`pulsectl report`: what happened on this host, judged, on one page (pulse.report).

Default: the last 24 h as a short text summary. --json prints the analysis exactly (its schema is
pulse.report.analysis); --html FILE writes the self-contained page. The deterministic analyst
runs here and needs no pulsed. An agent as analyst (--analyst NAME, or [report] analyst) runs
as a `report` effect in pulsed's executor; when no pulsed runs, pulsectl runs the agent itself
through the same code (its adapter's argv, its timeout, its own process group) and says so.
Exit codes: 0 a report was made (whatever its verdict); 1 no events.db, or the effect failed;
2 usage.
"""

from __future__ import annotations

import time

import click

from pulse.cli.context import fail
from pulse.cli.group import Context, pass_ctx

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).

EFFECT_SLACK_S = 30          # beyond the analyst's timeout, for the executor to claim the effect and write


def _window(since: str | None, start: str | None, end: str | None) -> tuple[float, float]:
    from pulse.cli.pipeline import parse_since
    if since and (start or end):
        raise click.UsageError("give --since, or --from/--to, not both")
    now = time.time()
    if start or end:
        lo = parse_since(start) if start else now - 86_400
        hi = parse_since(end) if end else now
    else:
        lo, hi = parse_since(since or "24h"), now
    if lo >= hi:
        raise click.UsageError("the window must start before it ends")
    return lo, hi


def _pulsed_running(ctx: Context) -> bool:
    from pulse.core import client
    from pulse.core.wire import controlmsgs
    try:
        client.request(ctx.paths, controlmsgs.GetStatus(), min(ctx.timeout, 2.0))
        return True
    except client.Unreachable:
        return False


def _through_executor(ctx: Context, config, params: dict, wait_s: float):
    """Queue a report effect (origin operator), wait for its end; the analysis it stored."""
    from pulse.core import client
    from pulse.core.wire import doorbells, enginerpc, eventmsgs
    from pulse.report.analysis import decode
    from pulse.store import effectqueue, eventsdb, objects
    effect = effectqueue.new_effect(enginerpc.Effect(kind=eventmsgs.EffectKind.REPORT, target="pulsectl", params=params,
                                                     idempotent=True), "operator", config.timings.effect_deadline_s)
    conn = eventsdb.open_events(ctx.paths.events_db)
    effectqueue.commit_effects(conn, [effect], "pulsectl")
    client.ring(ctx.paths, "doorbell", doorbells.Doorbell("pulsectl"))
    deadline = time.monotonic() + wait_s
    while (ended := eventsdb.effect_end(conn, effect.id)) is None:
        if time.monotonic() >= deadline:
            fail(f"the report effect {effect.id} did not end within {wait_s:g}s (see `pulsectl effects`)")
        time.sleep(0.05)
    if ended.type != eventmsgs.EffectEvent.ACKED:
        fail(f"the report effect {effect.id} {eventmsgs.EFFECT_END_STATES[ended.type]}: "
              f"{ended.data.get('error') or ended.data.get('reason')}")
    return decode(objects.get(ctx.paths.objects, ended.data["analysis"]))


@click.command()
@click.option("--since", help="The window: back from now, a duration (24h, 90m) or an ISO time. Default 24h.")
@click.option("--from", "start", help="The window's start (ISO time, naive = UTC).")
@click.option("--to", "end", help="The window's end (ISO time; default now).")
@click.option("--project", help="Only this project's tasks and their runs.")
@click.option("--task", "task", help="Only this task and its runs (7 or task-7).")
@click.option("--json", "as_json", is_flag=True, help="Print the analysis as JSON (its schema, exactly).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, writable=True),
              help="Write the page to this file (self-contained HTML).")
@click.option("--analyst", help="deterministic, or the name of an [[agent]]; default [report] analyst.")
@pass_ctx
def report(ctx: Context, since: str | None, start: str | None, end: str | None, project: str | None,
           task: str | None, as_json: bool, html_path: str | None, analyst: str | None) -> None:
    """What happened on this host, judged: score, verdicts, issues, each citing its events."""
    from pulse.report import analysis as analysismod
    from pulse.report import render
    from pulse.store import archive, connection
    if as_json and html_path:
        raise click.UsageError("give --json or --html, not both")
    if task is not None:
        from pulse.agents.tasks import parse_task_id
        try:
            task = parse_task_id(task)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--task") from None
    lo, hi = _window(since, start, end)
    config = ctx.config()
    name = analyst or config.report.analyst
    agent = None
    if name != "deterministic":
        agent = next((a for a in config.agent if a.name == name), None)
        if agent is None:
            fail(f"--analyst {name!r} is neither \"deterministic\" nor an [[agent]] in {ctx.paths.config}", 2)
    try:
        conn = connection.open_readonly(ctx.paths.events_db)
    except connection.StoreError as err:
        fail(str(err))
    try:
        result, by_id = _analysed(ctx, conn, config, agent, lo, hi, project, task)
    except archive.SegmentError as err:      # refused, never half-read: the report would miss what it holds
        fail(f"{err}; run `pulsectl store check`")
    analysismod.check(result, set(by_id))          # never print a report that cites what is not there
    if result.fallback:
        click.echo(f"pulsectl: the agent's analysis was not used: {result.fallback}", err=True)
    if as_json:
        click.echo(analysismod.encode(result).decode())
    elif html_path:
        with open(html_path, "w", encoding="utf-8") as f:
            f.write(render.html(result, by_id))
        click.echo(render.text(result, html_path), nl=False)
    else:
        click.echo(render.text(result), nl=False)


def _analysed(ctx: Context, conn, config, agent, lo: float, hi: float, project: str | None, task: str | None):
    """(the analysis, the window's events by id): by pulsed's executor when an agent analyses and
    pulsed runs, else here."""
    from pulse.core import config as configmod
    from pulse.report import reportrun
    from pulse.store import projection
    if agent is not None and _pulsed_running(ctx):
        params = {"start": lo, "end": hi, "project": project, "task": task, "analyst": agent.name}
        result = _through_executor(ctx, config, params, config.report.analyst_timeout_s + EFFECT_SLACK_S)
        events, _ = reportrun.read(conn, lo, hi, project, task, checkpoints=ctx.home / projection.DIRECTORY)
        return result, {ev.id: ev for ev in events}
    effect_ctx = workdir = None
    if agent is not None:
        from pulse.effects.kinds import EffectContext
        click.echo("pulsectl: pulsed is not running; the analyst agent runs from pulsectl", err=True)
        effect_ctx = EffectContext(config=configmod.slice_of(config, "executor"), objects=ctx.paths.objects,
                                   timeout_s=config.report.analyst_timeout_s, paths=ctx.paths)
        workdir = ctx.home / "work" / "report"
    result, by_id, _ = reportrun.make_report(
        conn, lo, hi, project=project, task=task, agent=agent, ctx=effect_ctx, workdir=workdir,
        timeout_s=config.report.analyst_timeout_s, max_events=config.report.analyst_max_events,
        checkpoints=ctx.home / projection.DIRECTORY)
    return result, by_id


COMMANDS = [report]
