"""`pulsectl instances` itself, click-free: pulse.cli.roster declares it to click, pulse.cli.fastpath
runs it without it."""

from __future__ import annotations

from pathlib import Path

from pulse.cli.context import Context, echo
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


def list_all(ctx: Context, as_json: bool) -> None:
    """The running Pulses of this user (and the system's, if readable): a table, or JSON Lines."""
    rows = [describe(e, min(ctx.timeout, PROBE_TIMEOUT_S)) for e in instances.live_entries(registries())]
    if as_json:
        import json  # only --json prints it
        for row in rows:
            echo(json.dumps(row))
        return
    if not rows:
        echo("no Pulse is running")
        return
    table = [("NAME", "PID", "STATE", "WORKERS", "HOME")]
    for r in rows:
        workers = "-" if r["total"] is None else f"{r['running']}/{r['total']}"
        table.append((r["name"], str(r["pid"]), r["state"], workers, r["home"]))
    for line in columns(table):
        echo(line)
