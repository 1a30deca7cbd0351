"""The assignment rule's choice (pure), run by the promote gate."""

import asyncio

from rules.assign import assign, choose

from pulse.agents.tasks import AgentCapabilityStats, PendingTasks, TaskState
from pulse.engine.api import Effect, Snapshot


def stats(name, **kw):
    return AgentCapabilityStats(agent=name, **kw)


def test_choose_skips_failing_agents_then_prefers_ratio_then_speed():
    s = {"a": stats("a", assigned=4, closed=4, consecutive_failures=1),
         "b": stats("b", assigned=4, closed=2, avg_duration_ms=900.0),
         "c": stats("c", assigned=4, closed=2, avg_duration_ms=100.0)}
    assert choose(s) == "c"                       # a fails in a row; b and c tie on ratio; c is faster
    s["c"].consecutive_failures = 2
    assert choose(s) == "b"
    s["b"].consecutive_failures = 1
    assert choose(s) == "a"                       # all failing: the best of them anyway
    assert choose({}) is None
    assert choose({}, ["x"]) == "x"


def test_assign_emits_one_agent_run_per_pending_task_not_already_running():
    tasks = [TaskState(id=f"task-{n}", project="p", title="t", prompt="do") for n in (1, 2)]
    curr = Snapshot(tick=1, ts=0.0, pending_tasks=PendingTasks(pending_count=2, tasks=tasks),
                    agent_capability_stats={"bot": stats("bot")},
                    pending=[Effect(kind="agent-run", params={"task_id": "task-1", "agent": "bot"})])

    async def inner(prev, curr):
        return [], None
    effects, _ = asyncio.run(assign(None, curr, inner))
    assert [(e.kind, e.target, e.params) for e in effects] == [
        ("agent-run", "task-2", {"task_id": "task-2", "agent": "bot"})]


def test_assign_hands_out_nothing_while_no_agent_is_known():
    tasks = [TaskState(id="task-1", project="p", title="t", prompt="do")]
    curr = Snapshot(tick=1, ts=0.0, pending_tasks=PendingTasks(pending_count=1, tasks=tasks))

    async def inner(prev, curr):
        return [], None
    assert asyncio.run(assign(None, curr, inner)) == ([], None)
