"""What `pulsectl process list` prints, without click: pulse.cli.processcmd declares it to click,
pulse.cli.fastpath runs it without it (operators and scripts run it in loops, as `status`)."""

from __future__ import annotations

import json

from pulse.cli.context import Context, echo
from pulse.core.wire import controlmsgs


def state_of(p) -> str:
    """One word for a process as status reports it (its fuller states: pulsectl status)."""
    if p.stopped:
        return "stopped"
    if p.paused_until is not None:
        return "paused"
    return {True: "alive", False: "dead", None: "unsampled"}[p.alive]


def shown(ctx: Context) -> list:
    """Every [[process]] as pulsed's status shows it (pulsed not answering: exit 4, saying so)."""
    return ctx.request(controlmsgs.GetStatus()).status.processes


def list_all(ctx: Context, as_json: bool) -> None:
    """Every [[process]]: its state and pid."""
    rows = shown(ctx)
    if as_json:
        for p in rows:
            echo(json.dumps({"name": p.name, "state": state_of(p), "pid": p.pid, "rss_mb": p.rss_mb}))
        return
    if not rows:
        echo("no [[process]] in config.toml")
        return
    width = max(len(p.name) for p in rows)
    for p in rows:
        echo(f"{p.name:<{width}}  {state_of(p):<9}  " + (f"pid {p.pid}" if p.pid else "-")
             + (f"  {p.rss_mb:g} MiB" if p.rss_mb is not None else ""))
