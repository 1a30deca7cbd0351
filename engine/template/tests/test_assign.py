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


# -- routing: free slots, eligibility, a failed agent avoided -------------------------------

def routed(tasks, agents, eligible=None, pending=(), stats_by=None):
    """A snapshot with routing: `agents` {name: (concurrency, running)}; every agent eligible unless said."""
    from pulse.engine.api import AgentLoad
    names = list(agents)
    return Snapshot(tick=1, ts=0.0, pending=list(pending),
                    pending_tasks=PendingTasks(pending_count=len(tasks), tasks=tasks,
                                               eligible=eligible or {t.id: names for t in tasks}),
                    agents={n: AgentLoad(agent=n, concurrency=c, running=r) for n, (c, r) in agents.items()},
                    agent_capability_stats=stats_by or {n: stats(n) for n in names})


def handed(curr):
    async def inner(prev, curr):
        return [], None
    effects, _ = asyncio.run(assign(None, curr, inner))
    return [(e.target, e.params["agent"]) for e in effects]


def task(n, **kw):
    return TaskState(id=f"task-{n}", project="p", title="t", prompt="do", **kw)


def test_assign_hands_out_no_more_than_free_slots_most_urgent_first():
    urgent_first = [task(3, priority=9), task(1), task(2)]       # as the snapshot gives them
    assert handed(routed(urgent_first, {"a": (1, 0)})) == [("task-3", "a")]
    assert handed(routed(urgent_first, {"a": (1, 1)})) == []     # busy: all wait, in order, for its slot
    assert handed(routed(urgent_first, {"a": (2, 0), "b": (1, 0)})) == [
        ("task-3", "a"), ("task-1", "a"), ("task-2", "b")]


def test_assign_gives_the_next_task_to_the_free_agent_not_the_best_busy_one():
    s = {"fast": stats("fast", assigned=3, closed=3, avg_duration_ms=10.0), "slow": stats("slow")}
    assert handed(routed([task(1), task(2)], {"fast": (1, 1), "slow": (1, 0)}, stats_by=s)) == [("task-1", "slow")]
    assert handed(routed([task(1), task(2)], {"fast": (1, 0), "slow": (1, 0)}, stats_by=s)) == [
        ("task-1", "fast"), ("task-2", "slow")]


def test_assign_keeps_to_eligible_agents_and_avoids_the_one_a_task_failed_on():
    tasks = [task(1, failed_on=["a"]), task(2), task(3)]
    eligible = {"task-1": ["a", "b"], "task-2": ["a"], "task-3": []}   # task-3: nobody may take it
    assert handed(routed(tasks, {"a": (1, 0), "b": (1, 0)}, eligible)) == [("task-1", "b"), ("task-2", "a")]
    # Failed on its only eligible agent: that one again, rather than never.
    assert handed(routed([task(1, failed_on=["a"])], {"a": (1, 0)})) == [("task-1", "a")]
    # Failed on a, b may take it but is busy: it waits for b.
    assert handed(routed([task(1, failed_on=["a"])], {"a": (1, 0), "b": (1, 1)})) == []


def test_assign_hands_out_nothing_once_no_agent_is_configured_whatever_the_history():
    tasks = [TaskState(id="task-1", project="p", title="t", prompt="do")]
    curr = Snapshot(tick=1, ts=0.0, agent_capability_stats={"gone": stats("gone")},
                    pending_tasks=PendingTasks(pending_count=1, tasks=tasks,
                                               unassignable={"task-1": "no [[agent]] is configured"}))
    assert handed(curr) == []


def test_assign_hands_nothing_to_an_agent_over_a_spend_limit():
    from pulse.engine.api import AgentLoad
    curr = routed([task(1), task(2)], {"a": (2, 0), "b": (1, 0)})
    curr.agents["a"] = AgentLoad(agent="a", concurrency=2, budget="a: $8.00 of $10.00 usd_per_day")
    assert handed(curr) == [("task-1", "b")]                      # b's one slot; a's two are not free
