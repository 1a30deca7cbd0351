"""`pulsectl fleet status`: every host of the fleet ([fleet] in config.toml), as this host's fleet
worker last read it from NATS (<runtime>/fleet-view.json): pulsectl itself never talks to NATS."""

from __future__ import annotations

import json
import sys
import time

import click

from pulse.cli.group import Context, pass_ctx


@click.group()
def fleet() -> None:
    """The Pulses of the fleet, over NATS JetStream (enable with [fleet] enabled = true)."""


def host_line(row: dict) -> tuple[str, ...]:
    agents = f"{row['agents_busy']}/{row['agents_busy'] + row['agents_free']}"
    seen = time.strftime("%H:%M:%SZ", time.gmtime(row["last_seen"])) if row.get("last_seen") else "-"
    return (str(row["host"]), row["state"], f"{row['workers_running']}/{row['workers_total']}",
            f"{row['processes_healthy']}/{row['processes_total']}", str(row.get("open_effects", "-")), agents, seen)


@fleet.command()
@click.option("--json", "as_json", is_flag=True, help="The view as JSON: {at, host, ttl_s, hosts: [...]}.")
@pass_ctx
def status(ctx: Context, as_json: bool) -> None:
    """Every host: up or gone, workers running/total, processes healthy/total, open effects, agents
    busy/total, last seen. Exit 3 when this host's fleet worker has no view yet."""
    from pulse.cli.statusview import columns
    from pulse.core import fleetnames as names
    view = names.read_view(ctx.paths.runtime)
    if view is None:
        enabled = ctx.config().fleet.enabled
        click.echo("pulsectl: no fleet view yet: " + ("the fleet worker has not reached NATS (see pulsectl status)"
                   if enabled else "[fleet] enabled = true in config.toml, then `pulsectl reload`"), err=True)
        sys.exit(3)
    if as_json:
        click.echo(json.dumps(view, sort_keys=True))
        return
    rows = [("HOST", "STATE", "WORKERS", "PROCESSES", "EFFECTS", "AGENTS BUSY", "LAST SEEN")]
    click.echo("\n".join(columns(rows + [host_line(r) for r in view["hosts"]])))
    click.echo(f"as seen by {view['host']} {names.view_age_s(view):.1f}s ago")


COMMANDS = [fleet]
