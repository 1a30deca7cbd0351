"""Assignment: hand each pending task to the best agent. An example: edit it to your taste.

Each tick, for every pending task that no agent-run effect is already on, it emits one
`agent-run` effect {"task_id", "agent"}. The executor's agent-run then, in one checked
transaction, moves the task pending → assigned → executing (a second effect for the same
task is refused: reason task-state), runs the agent, and records task-acked or task-failed.
A failed run puts the task back to pending, so the next tick hands it out again;
[tasks] max_failures failures in a row give it up.

The best agent (choose): agents with failures in a row are skipped while another has none;
then the highest closed/assigned ratio; then the lowest average duration; then the name.
The candidates are the agents in the snapshot's stats (every configured [[agent]] is there
from the start) plus AGENTS below. With none at all, tasks wait: handing one out would only
fail it.

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


def assignments(curr, already=()) -> list:
    """The agent-run effects for `curr`'s pending tasks (pure: easy to test)."""
    pending = curr.pending_tasks
    if pending is None or not pending.tasks:
        return []
    busy = {e.params.get("task_id") for e in [*curr.pending, *already] if e.kind == "agent-run"}
    out = []
    for task in pending.tasks:
        if task.id in busy:
            continue
        agent = choose(curr.agent_capability_stats, AGENTS)
        if agent is None:
            break                 # no agent at all: the tasks wait (pulsectl task add said so)
        out.append(Effect(kind="agent-run", target=task.id, params={"task_id": task.id, "agent": agent}))
    return out


async def assign(prev, curr, inner):
    """Decorates: the inner rules decide first; then pending tasks are handed out."""
    effects, tick_ms = await inner(prev, curr)
    return effects + assignments(curr, effects), tick_ms


RULES = [assign]
