"""What an agent may do with tasks through the gate's tools, and what of them it may see. Pure.

create_task is an agent making work for agents, so it is bounded like the work itself:
- only with `task-add` in [allow] kinds (as `pulsectl emit task-add` from an agent would be);
- only into the projects its [[agent]] names (`task_projects`, else its `projects`; neither: any);
- depth: a task made in a run of a task of depth d has depth d + 1, at most [tasks] agent_max_depth,
  so a fan-out (each run making two) stops;
- rate: one agent makes at most [tasks] agent_tasks_per_hour in any hour (counted from events.db,
  so a restart forgets nothing);
- priority: never above its own task's (a run cannot jump its work ahead of the operator's).

A run's session (one with a task) sees only its own tasks (its task, those it made, those it ran)
and of the events, none about another task, another agent or another agent's gate sessions. The
operator's sessions (no task) see everything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pulse.core.config import Agent, Config
from pulse.core.wire.enginerpc import TaskState
from pulse.core.wire.eventmsgs import EffectKind, EventType

TASK_ID = re.compile(r"task-\d+")
HOUR_S = 3600.0


class Refusal(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def agent_config(config: Config, name: str) -> Agent | None:
    return next((a for a in config.agent if a.name == name), None)


def allowed_projects(agent: Agent | None) -> list[str] | None:
    """Where this agent's create_task may add tasks; None: anywhere."""
    if agent is None:
        return None
    return agent.task_projects if agent.task_projects is not None else agent.projects


def made_within(tasks: Iterable[TaskState], agent: str, now: float, window_s: float = HOUR_S) -> int:
    return sum(1 for t in tasks if t.created_by == agent and now - t.created < window_s)


def check_create(config: Config, agent: str, parent: TaskState | None, project: str,
                 tasks: Iterable[TaskState], now: float) -> int:
    """The new task's depth, or Refusal naming the rule that refuses it."""
    if EffectKind.TASK_ADD not in config.allow.kinds:
        raise Refusal("ACTION_NOT_ALLOWED", 'create_task needs "task-add" in [allow] kinds, which lacks it')
    projects = allowed_projects(agent_config(config, agent))
    if projects is not None and project not in projects:
        raise Refusal("ACTION_NOT_ALLOWED", f"{agent} may add tasks only to {', '.join(projects) or 'no project'} "
                                            f"([[agent]] task_projects, else projects), not to {project!r}")
    depth = parent.depth + 1 if parent is not None else 0
    limits = config.tasks
    if parent is not None and depth > limits.agent_max_depth:
        raise Refusal("TASK_DEPTH", f"{parent.id} is {parent.depth} deep: a task made in its run would be {depth}, "
                                    f"past [tasks] agent_max_depth ({limits.agent_max_depth})")
    made = made_within(tasks, agent, now)
    if made >= limits.agent_tasks_per_hour:
        raise Refusal("RATE_LIMITED", f"{agent} made {made} tasks in the last hour, [tasks] agent_tasks_per_hour "
                                      f"({limits.agent_tasks_per_hour}): nothing was created")
    return depth


def capped_priority(asked: int | None, parent: TaskState | None) -> int:
    """Never above the priority of the task whose run makes it."""
    wanted = asked or 0
    return min(wanted, parent.priority) if parent is not None else wanted


def own_tasks(tasks: Mapping[str, TaskState], agent: str, task: str) -> set[str]:
    """A run's own tasks: its task, those it or its agent made, those its agent ran."""
    return {t.id for t in tasks.values()
            if t.id == task or t.created_by == agent or agent in (t.agent, t.last_agent)}


def visible_event(event: Any, own: set[str], agent: str, others: set[str], own_sessions: set[str]) -> bool:
    """Whether a run's session may see this event: nothing about another task, another agent (by
    name as its target, or in its data) or another agent's gate sessions."""
    target = event.target or ""
    data = event.data if isinstance(event.data, dict) else {}
    if TASK_ID.fullmatch(target) and target not in own:
        return False
    if target in others:
        return False
    if event.type == EventType.GATE_CALL and target not in own_sessions:
        return False
    params = data.get("params") if isinstance(data.get("params"), dict) else {}
    for value in (data.get("task"), data.get("task_id"), params.get("task"), params.get("task_id")):
        if isinstance(value, str) and TASK_ID.fullmatch(value) and value not in own:
            return False
    return not any(isinstance(named, str) and named in others for named in (data.get("agent"), params.get("agent")))


def own_sessions(events: Iterable[Any], agent: str) -> set[str]:
    """The gate sessions of `agent` whose opening is among `events`."""
    return {e.target for e in events if e.type == EventType.GATE_CALL and isinstance(e.data, dict)
            and e.data.get("phase") == "open" and e.data.get("agent") == agent}
