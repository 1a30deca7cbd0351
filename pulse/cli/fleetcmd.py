"""`pulsectl fleet status|events|add|tasks`: the Pulses of the fleet, over NATS JetStream; each
command's body is pulse.cli.fleetview's."""

from __future__ import annotations

import click

from pulse.cli import fleetview
from pulse.cli.group import Context, pass_ctx


@click.group()
def fleet() -> None:
    """The Pulses of the fleet, over NATS JetStream (enable with [fleet] enabled = true)."""


@fleet.command()
@click.option("--json", "as_json", is_flag=True, help="The view as JSON: {at, host, ttl_s, hosts: [...]}.")
@pass_ctx
def status(ctx: Context, as_json: bool) -> None:
    """Every host: up or gone, workers running/total, processes healthy/total, open effects, agents
    busy/total, last seen. Exit 3 when this host's fleet worker has no view yet."""
    fleetview.status(ctx, as_json)


@fleet.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events as the stream gets them.")
@click.option("--host", default=None, help="Only this host's events (its [fleet] host name).")
@click.option("--type", "type_", default=None, help="Only events of this type.")
@click.option("-n", "--last", default=50, show_default=True, help="How many of the latest to print first.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line: host, id, seq, ts, type, source, "
              "target, data.")
@pass_ctx
def events(ctx: Context, follow: bool, host: str | None, type_: str | None, last: int, as_json: bool) -> None:
    """Every host's events, from the PULSE_EVENTS stream (in order per host)."""
    fleetview.events(ctx, follow, host, type_, last, as_json)


@fleet.command(name="add")
@click.option("--agent", default=None, help="Only this [[agent]] may take it (on whichever host has it).")
@click.option("--tag", "tags", multiple=True, help="Only an [[agent]] whose tags include it may take it (repeatable).")
@click.option("--project", required=True, help="What the task belongs to.")
@click.option("--title", required=True, help="One line that says what to do.")
@click.option("--prompt", required=True, help="The agent's instructions ('-' reads them from stdin).")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first on the host that takes it.")
@pass_ctx
def add(ctx: Context, agent: str | None, tags: tuple[str, ...], project: str, title: str, prompt: str,
        priority: int) -> None:
    """Offer a task to the fleet; prints its fleet id. The same as `pulsectl task add --fleet`: a host
    one of whose agents may take it (pin, projects, tags), has a free slot and is within budget runs
    it, and `pulsectl task show <fleet id>` here follows it."""
    fleetview.add(ctx, agent, tags, project, title, prompt, priority)


@fleet.command(name="tasks")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line (as `task show <fleet id> --json`).")
@pass_ctx
def fleet_tasks(ctx: Context, as_json: bool) -> None:
    """The tasks this host offered to the fleet: where each ran (every host that took it) and how it
    ended (`dead`: dead-lettered after [fleet] max_deliver takings)."""
    fleetview.tasks(ctx, as_json)


COMMANDS = [fleet]
