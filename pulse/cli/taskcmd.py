"""`pulsectl task add|list|show|output|close|give-up|retry`: the work Pulse hands to agents.

A task is its task-* events in events.db; these commands append them through the
checked path (pulse.agents.tasks.record), so an illegal move is refused with its reason
and nothing is written. Exit codes: 0 done; 1 refused or no such task; 2 usage.
"""

from __future__ import annotations

import click

from pulse.cli import taskverbs
from pulse.cli.group import Context, pass_ctx
from pulse.core.states import TaskStatus

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def _task_arg(ctx, param, value: str) -> str:
    from pulse.agents.tasks import parse_task_id
    try:
        return parse_task_id(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


task_arg = click.argument("task", callback=_task_arg)


def _task_or_fleet_arg(ctx, param, value: str) -> str:
    """A task id, or the fleet id `task add --fleet` printed (taskverbs.task_or_fleet_id)."""
    try:
        return taskverbs.task_or_fleet_id(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


@click.group()
def task() -> None:
    """Tasks Pulse hands to agents: add, list, show, close, give up."""


@task.command()
@click.option("--project", required=True, help="What the task belongs to.")
@click.option("--title", required=True, help="One line that says what to do.")
@click.option("--prompt", required=True, help="The agent's instructions ('-' reads them from stdin).")
@click.option("--priority", type=int, default=0, show_default=True,
              help="Higher runs first (then older); handed out as agents' slots free.")
@click.option("--agent", "pin", default=None, help="Only this [[agent]] may take it.")
@click.option("--tag", "tags", multiple=True,
              help="Only an [[agent]] whose tags include it may take the task (repeatable).")
@click.option("--fleet", is_flag=True, help="Offer it to the fleet ([fleet] enabled): a host whose agent may take "
              "it, has a free slot and is within budget runs it; prints its fleet id, for `task show`.")
@pass_ctx
def add(ctx: Context, project: str, title: str, prompt: str, priority: int, pin: str | None,
        tags: tuple[str, ...], fleet: bool) -> None:
    """Add a pending task; prints its id (with --fleet, its fleet id)."""
    taskverbs.add(ctx, project, title, prompt, priority, pin, tags, fleet)


@task.command(name="list")
@click.option("--status", "statuses", multiple=True,
              type=click.Choice([s.value for s in TaskStatus]),
              help="Only tasks in this status (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines, one task each.")
@pass_ctx
def list_(ctx: Context, statuses: tuple[str, ...], as_json: bool) -> None:
    """Every task, oldest first."""
    taskverbs.list_all(ctx, statuses, as_json)


@task.command()
@click.argument("task", callback=_task_or_fleet_arg)
@click.option("--json", "as_json", is_flag=True, help="The task as JSON (times in ISO 8601), as the page shows it.")
@pass_ctx
def show(ctx: Context, task: str, as_json: bool) -> None:
    """One task: its fields, every attempt with its outcome, cost and tokens, and its gate calls. A
    fleet id (`task add --fleet`): which hosts took it, its state there, its outcome, or its
    dead-letter record."""
    taskverbs.show(ctx, task, as_json)


@task.command()
@task_arg
@click.option("--attempt", type=int, default=None, help="This attempt's output (default: the last with one).")
@pass_ctx
def output(ctx: Context, task: str, attempt: int | None) -> None:
    """The agent's output for a task, as text (exit 1 when there is none)."""
    taskverbs.output(ctx, task, attempt)


@task.command()
@click.argument("task", callback=_task_or_fleet_arg)
@pass_ctx
def close(ctx: Context, task: str) -> None:
    """Close a task: its result is accepted (acked), or it needs no agent (pending). A fleet id
    (`task add --fleet`): withdraw it; no host starts it from now on, and a run already going is
    not offered again when it ends."""
    taskverbs.close(ctx, task)


@task.command(name="give-up")
@task_arg
@click.option("--reason", default="given up by the operator", show_default=True)
@pass_ctx
def give_up(ctx: Context, task: str, reason: str) -> None:
    """Give a task up: no agent will be handed it again."""
    taskverbs.give_up(ctx, task, reason)


@task.command()
@task_arg
@pass_ctx
def retry(ctx: Context, task: str) -> None:
    """Put a given-up task back to pending, its failures forgiven: the agents may take it again."""
    taskverbs.retry(ctx, task)


COMMANDS = [task]
