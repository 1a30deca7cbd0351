"""`pulsectl budget` (the overview) and `budget reset` themselves, click-free: pulse.cli.budgetcmd
declares them to click, pulse.cli.fastpath runs them without it."""

from __future__ import annotations

from pulse.cli.context import Context, echo, fail

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def _limit(used: float, of: float | None, usd: bool) -> str:
    shown = f"${used:.2f}" if usd else f"{used:g}"
    if of is None:
        return f"{shown} (no limit)"
    return f"{shown} of {f'${of:.2f}' if usd else f'{of:g}'} ({used / of * 100:.0f} %)"


def overview_rows(ctx: Context) -> tuple[list[dict], list[dict]]:
    """(per agent then the host, the sessions Pulse did not start)."""
    from pulse.agents import spend
    from pulse.core import clock
    from pulse.store import connection
    config = ctx.config("load_agent_tables")
    try:
        conn = connection.open_readonly(ctx.paths.events_db)
    except connection.StoreError as err:
        fail(str(err))
    now = clock.now()
    ledger = spend.load(conn, now)
    return spend.overview(ledger, config.agent, config.budget, now), spend.sessions_overview(ledger, now)


def session_lines(sessions: list[dict]) -> list[str]:
    """The sessions Pulse did not start, under the table: what each spent, and whether it counts."""
    if not sessions:
        return []
    out = ["sessions Pulse did not start (their own telemetry; never ended by Pulse):"]
    for s in sessions:
        who = f"{s['service'] or 'session'} {s['session']}" if s["counted"] else "without the receiver's token"
        counts = ("counted against the host's [budget]" if s["counted"] else
                  "not counted: any local process can send that; send the token of telemetry.token to count")
        out.append(f"  {who}: ${s['today_usd']:.2f} today, ${s['month_usd']:.2f} this month ({counts})")
    return out


def show(ctx: Context, as_json: bool) -> None:
    """Per agent, then the host: spend today and this month and runs in the last hour, each against its limit."""
    rows, sessions = overview_rows(ctx)
    if as_json:
        import json
        echo(json.dumps({"agents": rows, "sessions": sessions}))
        return
    echo(f"{'AGENT':<14} {'TODAY (UTC)':<24} {'THIS MONTH':<26} {'RUNS LAST HOUR':<18} WAITING")
    for r in rows:
        name = "host (all)" if r["agent"] == "*" else r["agent"]
        echo(f"{name:<14} {_limit(r['today_usd'], r['usd_per_day'], True):<24} "
             f"{_limit(r['month_usd'], r['usd_per_month'], True):<26} "
             f"{_limit(r['runs_last_hour'], r['runs_per_hour'], False):<18} "
             f"{', '.join(r['waiting_tasks']) or '-'}")
        if r["runs_without_cost"]:
            echo(f"  {r['runs_without_cost']} run(s) of {name} this month reported no cost: they count "
                 "against runs_per_hour only")
    for line in session_lines(sessions):
        echo(line)


def reset(ctx: Context, agent: str) -> None:
    """`agent`'s spend so far forgiven (a `spend-reset` event); the tick, rung, hands out the tasks it held."""
    from pulse.agents import spend
    from pulse.store import eventsdb
    names = [a.name for a in ctx.config("load_agent_tables").agent]
    if agent not in names:
        fail(f"{agent!r} is not a configured [[agent]] (configured: {', '.join(names) or 'none'})")
    if not ctx.paths.events_db.exists():
        fail(f"no events.db at {ctx.paths.events_db} (start pulsed, or run `pulsectl init`)")
    spend.reset(eventsdb.open_events(ctx.paths.events_db), agent, "pulsectl", by="operator")
    from pulse.core import client
    from pulse.core.wire import doorbells
    client.ring(ctx.paths, "wake", doorbells.Wake("pulsectl", f"{agent} spend reset"))   # its held tasks go out now
    echo(f"{agent}: spend reset; the tasks it held back are handed out at the next tick")
