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

import json
import os
import sys

import click

from pulse.cli.context import fail
from pulse.cli.group import Context, pass_ctx
from pulse.core.home import GATE_SOCKET_ENV
from pulse.gate import protocol
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


def gate_store(ctx: Context, source: str = "pulsectl"):
    """The gate's durable store on this home, caught up with every session's facts."""
    from pulse.gate.durable import DurableStore
    from pulse.store import eventsdb
    if not ctx.paths.events_db.exists():
        fail(f"no events.db in {ctx.home} (run `pulsectl init`, or start pulsed)")
    from pulse.store import projection
    store = DurableStore(eventsdb.open_events(ctx.paths.events_db), source,
                         checkpoints=ctx.paths.home / projection.DIRECTORY)
    store.catch_up()
    return store


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
    done = reset_through_gate(ctx, protocol.Reset(session, agent, keep_progress))
    if done is None:     # no gate running (pulsed down): nothing else decides now; the operator writes the fact
        from pulse.gate.server import operator_reset
        done = operator_reset(gate_store(ctx), session, agent, keep_progress)
    for line in done.out:
        click.echo(line)
    if done.err:
        click.echo(f"pulsectl: {done.err}", err=True)
    sys.exit(done.code)


def reset_through_gate(ctx: Context, request: protocol.Reset) -> protocol.ResetDone | None:
    """The gate's answer to a reset (it alone writes gate facts while it runs), or None when no gate
    listens. Only the operator's uid, with no run token, may reset."""
    import socket as socketmod

    from pulse.core import config as configmod
    from pulse.gate.sockets import socket_path
    path = os.environ.get(GATE_SOCKET_ENV)      # where a run was told the gate is: it decides who may reset
    if not path:
        try:
            shared = configmod.load(ctx.paths.config).gate.socket_dir
        except (configmod.ConfigError, OSError):
            shared = ""
        path = socket_path(ctx.paths, shared)
    sock = socketmod.socket(socketmod.AF_UNIX)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    with sock, sock.makefile("rwb") as f:
        f.write(protocol.encode(request))
        f.flush()
        line = f.readline()
    try:
        reply = protocol.reply_decoder.decode(line) if line else None
    except ValueError as err:
        reply = protocol.Refused("BAD_REPLY", f"not a reply of the gate's ({err})")
    if not isinstance(reply, protocol.ResetDone):
        why = reply.message if isinstance(reply, protocol.Refused) else "the gate closed the connection"
        return protocol.ResetDone(1, [], f"the gate refused the reset: {why}")
    return reply


@click.group(name="gate")
def gate_group() -> None:
    """The agent's safety gate: its sessions (`pulsectl gate sessions`)."""


@gate_group.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per session (JSON Lines).")
@pass_ctx
def sessions(ctx: Context, as_json: bool) -> None:
    """Every gate session: its agent, task, state, unverified writes and counts."""
    from pulse.cli.statusview import columns
    from pulse.core import clock
    ledger = gate_store(ctx).ledger
    rows = [ledger.summary(sid) for sid in sorted(ledger.sessions, key=lambda s: ledger.sessions[s].opened)]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    if not rows:
        click.echo("no gate sessions yet (`pulsectl mcp` starts one)")
        return
    table = [("SESSION", "AGENT", "TASK", "STATE", "CALLS", "BLOCKED", "LAST", "UNVERIFIED")]
    table += [(r["session"], r["agent"], r["task"] or "-", r["state"], str(r["calls"]), str(r["blocked"]),
               clock.iso(r["last"], ms=False), ", ".join(r["unverified"]) or "-") for r in rows]
    for line in columns(table):
        click.echo(line)


COMMANDS = [mcp, gate_reset, gate_group]
