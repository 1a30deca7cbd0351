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
from pulse.cli.group import Context, pass_ctx


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
    budgetview.reset(ctx, agent)


COMMANDS = [budget]
