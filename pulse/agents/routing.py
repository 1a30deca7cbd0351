"""Routing: which configured agents may take a task, and how busy each agent is.

The tick puts both into the snapshot (Snapshot.agents, PendingTasks.eligible/unassignable) so an
assignment rule decides against them without reading config; `pulsectl task show` and the web
board ask the same functions why a task waits. Pure: no I/O.

Who may take a task: an [[agent]] whose `projects` (unset: every project) holds the task's
project, and whose `tags` include every tag the task was added with; a task pinned to an agent
(`task add --agent`) is for that one alone, which must fit too.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from pulse.agents.tasks import parse_task_id
from pulse.core.config import Agent
from pulse.core.states import TaskStatus
from pulse.core.wire.enginerpc import AgentLoad, Effect, PendingTasks, TaskState
from pulse.core.wire.eventmsgs import EffectKind

HELD = (TaskStatus.ASSIGNED, TaskStatus.EXECUTING)   # a run of its agent holds the task


def refusal(agent: Agent, task: TaskState) -> str | None:
    """Why `agent` may not take `task` (words for the operator), or None when it may."""
    if task.pin is not None and task.pin != agent.name:
        return f"pinned to {task.pin}"
    if agent.projects is not None and task.project not in agent.projects:
        return f"{agent.name} takes projects {', '.join(agent.projects)}, not {task.project}"
    missing = [t for t in task.tags if t not in agent.tags]
    if missing:
        return f"{agent.name} lacks tag{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    return None


def eligible(agents: Sequence[Agent], task: TaskState) -> list[str]:
    """The agents that may take `task`, in config order."""
    return [a.name for a in agents if refusal(a, task) is None]


def unassignable(agents: Sequence[Agent], task: TaskState) -> str | None:
    """Why no configured agent may take `task`, or None when one may."""
    if not agents:
        return "no [[agent]] is configured"
    if task.pin is not None and task.pin not in {a.name for a in agents}:
        return f"pinned to {task.pin}, which is not a configured [[agent]]"
    if eligible(agents, task):
        return None
    reasons = [why for a in agents if (why := refusal(a, task)) is not None and not why.startswith("pinned")]
    return "no agent may take it: " + "; ".join(reasons)


def route(agents: Sequence[Agent], pending: PendingTasks | None) -> PendingTasks | None:
    """`pending` with each listed task's eligible agents, or its reason to wait (a new struct)."""
    if pending is None:
        return None
    eligible_by_task, why_by_task = {}, {}
    for task in pending.tasks:
        eligible_by_task[task.id] = eligible(agents, task)
        if (why := unassignable(agents, task)) is not None:
            why_by_task[task.id] = why
    return PendingTasks(pending_count=pending.pending_count, tasks=pending.tasks, by_project=pending.by_project,
                        waiting_retry=pending.waiting_retry, next_retry=pending.next_retry,
                        eligible=eligible_by_task, unassignable=why_by_task)


def _task_of(effect: Effect) -> str:
    """The task an agent-run names, as a task id ("7" and "task-7" are one task); else the effect's id."""
    try:
        return parse_task_id(str(effect.params.get("task_id") or effect.target or ""))
    except ValueError:
        return effect.id or ""


def loads(agents: Sequence[Agent], states: Iterable[TaskState], open_effects: Iterable[Effect],
          over_budget: Mapping[str, str] | None = None) -> dict[str, AgentLoad]:
    """Each agent's runs not ended: the tasks it holds, and agent-run effects naming it still queued.
    A task counts once, whether its effect is queued, running, or already ended its task.
    `over_budget`: agent → why one more run of it would cross a spend limit (AgentLoad.budget)."""
    over_budget = over_budget or {}
    busy: dict[str, set[str]] = {a.name: set() for a in agents}
    for task in states:
        if task.status in HELD and task.agent in busy:
            busy[task.agent].add(task.id)
    for effect in open_effects:
        if effect.kind != EffectKind.AGENT_RUN:
            continue
        agent = effect.params.get("agent")
        if agent in busy:
            busy[agent].add(_task_of(effect))
    return {a.name: AgentLoad(agent=a.name, concurrency=a.concurrency, running=len(busy[a.name]),
                              projects=list(a.projects) if a.projects is not None else None, tags=list(a.tags),
                              budget=over_budget.get(a.name))
            for a in agents}


# -- spend limits (budgets) in the snapshot: a held task costs no effect while it waits -------

def takeable(agents: Sequence[Agent], over_budget: Mapping[str, str]) -> Callable[[TaskState], bool]:
    """Is a task one some agent may take now (eligible, and within its spend limits)? The snapshot
    lists such tasks before those none may take, so tasks that wait cannot crowd one that may run
    out of its bounded list."""
    def may_run(task: TaskState) -> bool:
        return any(name not in over_budget for name in eligible(agents, task))
    return may_run


def budget_waits(pending: PendingTasks | None, agents: Mapping[str, AgentLoad],
                 open_effects: Iterable[Effect]) -> dict[str, str]:
    """task → the agent it waits for: the listed tasks that some agent may take but every such
    agent is over a spend limit, and no agent-run is already queued for them. Their `spend-held`
    says why (pulsectl task show), as a held claim's would."""
    if pending is None:
        return {}
    queued = {_task_of(e) for e in open_effects if e.kind == EffectKind.AGENT_RUN}
    out = {}
    for task in pending.tasks:
        names = pending.eligible.get(task.id, [])
        if (names and task.id not in queued and task.id not in pending.unassignable
                and all(agents.get(n) is not None and agents[n].budget is not None for n in names)):
            out[task.id] = names[0]
    return out


def over_budget_runs(effects: Sequence[Effect], agents: Mapping[str, AgentLoad]) -> tuple[list[Effect], list[Effect]]:
    """(kept, dropped): agent-run effects naming an agent over a spend limit are dropped before commit,
    whatever rule made them (an engine directory's own assignment rule may predate AgentLoad.budget):
    the executor would only hold each until its deadline, and the rule hand out another."""
    kept, dropped = [], []
    for e in effects:
        name = e.params.get("agent")
        load = agents.get(name) if e.kind == EffectKind.AGENT_RUN and isinstance(name, str) else None
        (dropped if load is not None and load.budget is not None else kept).append(e)
    return kept, dropped


# -- across hosts (the fleet, pulse.workers.fleettasks) --------------------------------------------

def fleet_pick(agents: Sequence[Agent], task: TaskState, load: dict[str, AgentLoad],
               held: dict[str, str]) -> tuple[str | None, str | None]:
    """Which of this host's agents takes a fleet task now, by the same rules as a local task: one
    that may take it (refusal), with a free slot (`load`: its runs not ended against its concurrency),
    and not held by a spend limit (`held`: agent → why). Of those, the one with the most free slots
    (config order on a tie). Returns (agent, None), or (None, why this host leaves it to others)."""
    may = [a for a in agents if refusal(a, task) is None]
    if not may:
        return None, unassignable(agents, task) or "no agent may take it"
    free = [a for a in may if load[a.name].running < a.concurrency]
    if not free:
        return None, "busy: " + ", ".join(f"{a.name} {load[a.name].running}/{a.concurrency}" for a in may)
    within = [a for a in free if a.name not in held]
    if not within:
        return None, "budget: " + "; ".join(held[a.name] for a in free)
    best = max(within, key=lambda a: a.concurrency - load[a.name].running)
    return best.name, None
