"""`pulsectl budget [--json]` and `pulsectl budget reset AGENT`: agents' spend against their limits.

`budget` reads events.db (the spend ledger, pulse.agents.spend) and config.toml (the limits) and
needs no pulsed: per agent, then the host, spend today and this month (UTC) and runs in the last
hour, each against its limit, the runs whose CLI reported no cost, and the tasks waiting on a
limit; then the sessions Pulse did not start that spent this month (pulse.agents.spend.observe).
`budget reset AGENT` appends a `spend-reset` event: the agent's runs so far count no more (an
operator action, recorded like every other); the tick, rung, hands the held tasks out.
Raising a limit is editing config.toml and `pulsectl reload`. Exit codes: 0; 1 no such agent or
no events.db; 2 usage.
"""

from __future__ import annotations

import click

from pulse.cli import budgetview
from pulse.cli.context import fail
from pulse.cli.group import Context, pass_ctx

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: {\"agents\": [...], \"sessions\": [...]}, the host last as \"*\".")
@click.pass_context
def budget(click_ctx: click.Context, as_json: bool) -> None:
    """Spend against limits per agent, today and this month; `budget reset AGENT`."""
    if click_ctx.invoked_subcommand is not None:
        return
    budgetview.show(click_ctx.find_object(Context), as_json)


@budget.command()
@click.argument("agent")
@pass_ctx
def reset(ctx: Context, agent: str) -> None:
    """Forgive AGENT's spend so far: its runs until now count against no limit."""
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
    click.echo(f"{agent}: spend reset; the tasks it held back are handed out at the next tick")


COMMANDS = [budget]
