"""`pulsectl mcp`: serve Pulse's gated tools to an agent over MCP on stdio.

One process is one agent session: its gate starts in RESOLVING and lives as long as
the connection. stdout carries JSON-RPC only; anything else goes to stderr (the first
line there names the session). `pulsectl gate-reset SESSION [--keep-progress]` is the
operator's reset of a live session's gate; the agent has no tool for it.
"""

from __future__ import annotations

import re
import sys
import time

import click

from pulse.cli.app import Context, pass_ctx


@click.command()
@pass_ctx
def mcp(ctx: Context) -> None:
    """Serve the gated tools over MCP on stdin/stdout (one agent session)."""
    from pulse.core import config as configmod
    if not ctx.home.is_dir():
        click.echo(f"pulsectl: no Pulse home at {ctx.home} (run `pulsectl init`, or start pulsed)", err=True)
        sys.exit(1)
    try:
        config = configmod.load(ctx.paths.config)
    except configmod.ConfigError as err:
        click.echo(f"pulsectl: {err}", err=True)
        sys.exit(78)
    import importlib.util
    if importlib.util.find_spec("mcp") is None:   # an install requirement; say so plainly if it is missing
        click.echo("pulsectl: the MCP server needs the `mcp` package (pip install 'mcp>=2,<3')", err=True)
        sys.exit(1)
    from pulse.agents.toolserver import serve
    serve(ctx.paths, config)


@click.command(name="gate-reset")
@click.argument("session")
@click.option("--keep-progress", is_flag=True,
              help="Drop verification tracking but keep the validated target (VERIFYING → READING).")
@click.option("--wait", default=5.0, show_default=True, help="Seconds to wait for the session to confirm.")
@pass_ctx
def gate_reset(ctx: Context, session: str, keep_progress: bool, wait: float) -> None:
    """Reset the gate of a running `pulsectl mcp` SESSION (the target of its gate-call events):
    back to RESOLVING, forgetting its target, unverified write and recoveries."""
    import psutil

    from pulse.store import db
    from pulse.agents.toolserver import RESET_SIGNALS
    m = re.fullmatch(r"mcp-([0-9]+)-[0-9a-f]{8}", session)
    if m is None:
        raise click.BadParameter(f"{session!r} is not an MCP session id (like mcp-1234-0123abcd)")
    try:
        proc = psutil.Process(int(m[1]))
        serving = "mcp" in proc.cmdline() and any("pulsectl" in part for part in proc.cmdline())
    except psutil.Error:
        serving = False
    if not serving:   # gone, or its pid now belongs to something else: signal nothing
        click.echo(f"pulsectl: session {session} is not running", err=True)
        sys.exit(1)
    conn = db.open_readonly(ctx.paths.events_db)
    mark = db.last_event_id(conn)
    proc.send_signal(RESET_SIGNALS["keep-progress" if keep_progress else "plain"])
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        for ev in db.read_events(conn, after_id=mark, types=("gate-call",)):
            if ev.target == session and ev.data.get("tool") == "reset":
                click.echo(f"{session}: {ev.data['state_before']} → {ev.data['state']}")
                return
        time.sleep(0.05)
    click.echo(f"pulsectl: session {session} did not confirm the reset within {wait:g}s", err=True)
    sys.exit(1)


COMMANDS = [mcp, gate_reset]
