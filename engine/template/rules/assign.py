"""Assignment: hand each pending task to the best free agent that may take it. An example: edit it to your taste.

Each tick, it walks the snapshot's pending tasks in the order given (higher priority first, then
older) and, for each that no agent-run effect is already on, emits one `agent-run` effect
{"task_id", "agent"} while an agent that may take it has a free slot. It hands out no more runs
than the agents have free slots (Snapshot.agents: running against concurrency), so a task added
later with a higher priority is still first in line when a slot frees. An agent one more run of
which would cross a spend limit ([[agent]] budget, [budget]) has no free slot (AgentLoad.budget
says why): its tasks wait, with no effect made, until a new day or month, a raised limit or
`pulsectl budget reset` lets it run (Pulse drops an agent-run for such an agent anyway).

The executor's agent-run then, in one checked transaction, moves the task pending → assigned →
executing (a second effect for the same task is refused: reason task-state), runs the agent, and
records task-acked or task-failed. A failed run puts the task back to pending, so a later tick
hands it out again, to another agent that may take it when there is one; [tasks] max_failures
failures in a row give it up.

Who may take a task (PendingTasks.eligible): an [[agent]] whose `projects` and `tags` fit it, or
the one it is pinned to (pulsectl task add --agent). A task none may take waits, and says why
(PendingTasks.unassignable, shown by pulsectl task show and the page).

The best agent (choose): agents with failures in a row are skipped while another has none;
then the highest closed/assigned ratio; then the lowest average duration; then the name.
When the snapshot carries no agents (a tick without "pending-tasks", an older Pulse), the
candidates are the agents in the snapshot's stats plus AGENTS below, one task each per tick.

Needs "pending-tasks" in config.toml's [tick] sense (the default), and "agent-run" in
[allow] kinds (the default); agents come from config.toml's [[agent]] tables.
"""

from pulse.engine.api import Effect

AGENTS: list[str] = []     # agents to consider even before they have stats ([[agent]] names)


def choose(stats: dict, candidates=()) -> str | None:
    """The best agent among `candidates` and the agents in `stats` (AgentCapabilityStats by name)."""
    names = sorted(set(candidates) | set(stats))
    if not names:
        return None

    def failing(name):
        s = stats.get(name)
        return s is not None and s.consecutive_failures > 0

    pool = [n for n in names if not failing(n)] or names

    def rank(name):
        s = stats.get(name)
        ratio = s.closed / s.assigned if s is not None and s.assigned else 0.0
        avg = s.avg_duration_ms if s is not None and s.avg_duration_ms is not None else float("inf")
        return (-ratio, avg, name)

    return min(pool, key=rank)


def candidates(task, pending, failed_on=()) -> list[str]:
    """The agents that may take `task`, without those its runs failed on while another may take it."""
    allowed = pending.eligible.get(task.id, [])
    fresh = [name for name in allowed if name not in failed_on]
    return fresh or allowed


def assignments(curr, already=()) -> list:
    """The agent-run effects for `curr`'s pending tasks (pure: easy to test)."""
    pending = curr.pending_tasks
    if pending is None or not pending.tasks:
        return []
    runs = [e for e in [*curr.pending, *already] if e.kind == "agent-run"]
    busy = {e.params.get("task_id") for e in runs}
    if not curr.agents and not pending.unassignable:   # a snapshot without routing: the agents it knows
        agent = choose(curr.agent_capability_stats, AGENTS)
        return [] if agent is None else [
            Effect(kind="agent-run", target=t.id, params={"task_id": t.id, "agent": agent})
            for t in pending.tasks if t.id not in busy]
    free = {name: load.free for name, load in curr.agents.items()}
    for e in already:                      # runs the inner rules just handed out take slots too
        if e.kind == "agent-run" and free.get(e.params.get("agent"), 0) > 0:
            free[e.params.get("agent")] -= 1
    out = []
    for task in pending.tasks:             # most urgent first, as the snapshot gives them
        if task.id in busy:
            continue
        ready = [name for name in candidates(task, pending, task.failed_on) if free.get(name, 0) > 0]
        agent = choose({n: s for n, s in curr.agent_capability_stats.items() if n in ready}, ready)
        if agent is None:
            continue                       # its agents are busy (or none may take it): it waits its turn
        free[agent] -= 1
        out.append(Effect(kind="agent-run", target=task.id, params={"task_id": task.id, "agent": agent}))
    return out


async def assign(prev, curr, inner):
    """Decorates: the inner rules decide first; then pending tasks are handed out."""
    effects, tick_ms = await inner(prev, curr)
    return effects + assignments(curr, effects), tick_ms


RULES = [assign]
