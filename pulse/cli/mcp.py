"""`pulsectl mcp`: serve Pulse's gated tools to an agent over MCP on stdio; `pulsectl gate`
and `gate-reset`: the operator's view of the gate and its reset.

`pulsectl mcp` is a thin proxy to the gate, which runs inside Pulse (pulse.gate.server); it
opens no store. A plain `pulsectl [--home DIR] mcp [--agent NAME]` never reaches click: pulse.cli.main
hands it to pulse.gate.proxy.run directly, as every agent run starts one; this command serves the
other spellings (and --help). In an agent run its session is the run's agent and task, by the run token in its
environment; the operator's own sessions may name an agent (`--agent`, else PULSE_AGENT, else
operator-shell). The gate's state lives in events.db: a new session of the same agent and task
starts where the last one left off. stdout carries JSON-RPC only; anything else goes to stderr
(the first line there names the session).
"""

from __future__ import annotations

import sys

import click

from pulse.cli import gateview
from pulse.cli.group import Context, pass_ctx
from pulse.gate.policy import OPERATOR_SHELL

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


@click.command()
@click.option("--agent", default=None, metavar="NAME",
              help=f"Who acts, for the operator's own sessions (default: PULSE_AGENT, else {OPERATOR_SHELL}). "
                   "Inside an agent run the run token decides: the session is that run's agent and task.")
@pass_ctx
def mcp(ctx: Context, agent: str | None) -> None:
    """Serve the gated tools over MCP on stdin/stdout: a proxy to Pulse's gate (one session)."""
    from pulse.gate.proxy import run
    sys.exit(run(ctx.home, agent))


@click.command(name="gate-reset")
@click.argument("session", required=False)
@click.option("--agent", default=None, metavar="NAME", help="Reset every session of this agent instead.")
@click.option("--keep-progress", is_flag=True,
              help="Forget the unverified writes only; keep what the agent has looked at.")
@pass_ctx
def gate_reset(ctx: Context, session: str | None, agent: str | None, keep_progress: bool) -> None:
    """Reset the gate of SESSION (its full id, as `pulsectl gate sessions` lists it), or of every
    session of an --agent: forget its unverified writes and, unless --keep-progress, what it has
    looked at. The gate writes the fact (pulsectl does, when no gate runs); running sessions see it at their next call."""
    if (session is None) == (agent is None):
        raise click.UsageError("give a SESSION or --agent NAME (one of them)")
    gateview.reset(ctx, session, agent, keep_progress)


@click.group(name="gate")
def gate_group() -> None:
    """The agent's safety gate: its sessions (`pulsectl gate sessions`)."""


@gate_group.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per session (JSON Lines).")
@pass_ctx
def sessions(ctx: Context, as_json: bool) -> None:
    """Every gate session: its agent, task, state, unverified writes and counts."""
    gateview.sessions(ctx, as_json)


COMMANDS = [mcp, gate_reset, gate_group]
