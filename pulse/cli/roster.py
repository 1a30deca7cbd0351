"""`pulsectl instances`: the running Pulses of this user on this host (and the system's, if
readable), from the registry each pulsed keeps its entry in (pulse.core.instances). How
`pulsectl -i NAME` finds the home of the instance called NAME: pulse.cli.launch.home_of."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pulse.cli.group import Context, pass_ctx
from pulse.cli.launch import registries
from pulse.cli.statusview import columns
from pulse.core import client, instances
from pulse.core.home import Paths
from pulse.core.states import WorkerState
from pulse.core.wire import controlmsgs

PROBE_TIMEOUT_S = 1.0          # per instance: a listing must not hang on one frozen pulsed


def describe(entry: dict, timeout: float) -> dict:
    """The entry, plus whether its pulsed answers and how many of its workers run."""
    out = {k: entry[k] for k in ("name", "home", "pid", "started")}
    try:
        reply = client.request(Paths(Path(entry["home"]), Path(entry["runtime"])), controlmsgs.GetStatus(), timeout)
        workers = reply.status.workers
        out.update(state="answering", running=sum(1 for w in workers if w.state == WorkerState.RUNNING), total=len(workers))
    except client.Unreachable:
        out.update(state="not answering", running=None, total=None)
    return out


@click.command(name="instances")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines: one instance per line.")
@pass_ctx
def instances_cmd(ctx: Context, as_json: bool) -> None:
    """List the running Pulses of this user (and the system's, if readable)."""
    rows = [describe(e, min(ctx.timeout, PROBE_TIMEOUT_S)) for e in instances.live_entries(registries())]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    if not rows:
        click.echo("no Pulse is running")
        return
    table = [("NAME", "PID", "STATE", "WORKERS", "HOME")]
    for r in rows:
        workers = "-" if r["total"] is None else f"{r['running']}/{r['total']}"
        table.append((r["name"], str(r["pid"]), r["state"], workers, r["home"]))
    for line in columns(table):
        click.echo(line)


COMMANDS = [instances_cmd]
