"""Tasks: the work Pulse hands to agents, as events, and the projections folded from them.

A task's life is its `task-*` events in events.db (target = the task id):

    task-created → task-assigned → task-executing → task-acked → task-closed
                       ↑               │
                       └── task-failed ┘   (back to pending; after MAX_FAILURES in a row: task-given-up)

`TRANSITIONS` is the whole table. `decide()` checks one requested event against a
task's history and returns the events to append, or raises IllegalTransition; the
store runs it inside the BEGIN IMMEDIATE transaction that appends, so two writers
can never both move a task from the same state. Everything here but
`snapshot_extras` is pure (no I/O). The Structs a snapshot carries (TaskState,
PendingTasks, AgentCapabilityStats) are wire messages, defined in pulse.core.wire.enginerpc.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Iterable, Sequence

import msgspec

from pulse.core import clock
from pulse.core.states import TaskStatus
from pulse.core.wire import eventmsgs
from pulse.core.wire.enginerpc import AgentCapabilityStats, PendingTasks, TaskState
from pulse.core.wire.eventmsgs import TASK_EVENTS, TaskEvent

# Imports inside functions: the engine's rules and tests import this module for its types
# (engine/template/tests/test_assign.py) and open no store: pulse.store (~5-17 ms, python -X importtime)
# is imported by the functions that read or write events.db.

MAX_FAILURES = 3            # consecutive failed runs of one task before it is given up
# Failures that cannot fix themselves (pulse.agents.adapters reads them from the CLI's own words):
# the task is given up at the first, not retried into the same answer.
FINAL_REASONS = frozenset({"not-logged-in", "missing-key", "usage", "turn-cap", "not-installed", "tool-denied"})
# The ends Pulse itself makes (its guards and limits): a task whose runs keep ending so is given up
# after [tasks] same_end_max in a row (the reason alone is the way it ended: a killed run's exit code
# is the signal). Any other reason the operator lists in same_end_reasons counts with its exit code.
PULSE_ENDS = ("over-budget", "loop", "stalled", "timeout", "memory", "pids", "disk")
SENSE_KEY = "pending-tasks"  # a tick whose sense keys include this carries the extras below
SNAPSHOT_TASKS_LIMIT = 100  # the snapshot lists at most this many pending tasks (pending_count is exact)
NEW = "new"                 # the status of a task before its task-created: not a TaskStatus, nothing is in it

E, S = TaskEvent, TaskStatus   # short names, for the table's sake only (deleted after it)
# Which event each status accepts, and the status it leads to. task-failed leads back to
# pending (or to given_up at the failure limit: decide() adds the task-given-up event).
TRANSITIONS: dict[str, dict[str, str]] = {
    NEW:         {E.CREATED: S.PENDING},
    S.PENDING:   {E.ASSIGNED: S.ASSIGNED, E.CLOSED: S.CLOSED, E.GIVEN_UP: S.GIVEN_UP},
    S.ASSIGNED:  {E.EXECUTING: S.EXECUTING, E.FAILED: S.PENDING, E.GIVEN_UP: S.GIVEN_UP},
    S.EXECUTING: {E.ACKED: S.ACKED, E.FAILED: S.PENDING, E.GIVEN_UP: S.GIVEN_UP},
    S.ACKED:     {E.CLOSED: S.CLOSED, E.GIVEN_UP: S.GIVEN_UP},
    S.CLOSED:    {},
    S.GIVEN_UP:  {E.RETRIED: S.PENDING},
}
# Why some moves are refused, in words an operator can act on.
_HINTS = {
    (S.ASSIGNED, E.CLOSED): "an agent holds it; give it up, or wait for its result",
    (S.EXECUTING, E.CLOSED): "it is running; wait for its result, or give it up",
}
del E, S


ENDED = frozenset({TaskStatus.CLOSED, TaskStatus.GIVEN_UP})   # no agent is handed it again (retry: a new start)


class IllegalTransition(Exception):
    """A task event that the transition table refuses; nothing was written."""


# -- task ids -----------------------------------------------------------------------------------------

_ID = r"^(?:task-)?([1-9][0-9]*)$"   # compiled at first use (re caches it)


def task_id(number: int) -> str:
    return f"task-{number}"


def id_order(task: str) -> tuple[int, str]:
    """A sort key that puts task-6 before task-10 (ids that are no task number last, by text)."""
    m = re.match(_ID, task)
    return (int(m[1]), "") if m else (1 << 62, task)


def parse_task_id(text: str) -> str:
    """"7" or "task-7" → "task-7"; anything else is a ValueError."""
    m = re.match(_ID, text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a task id (expected a number such as 7, or task-7)")
    return task_id(int(m[1]))


# -- the transition table, applied -------------------------------------------------------------------

def status_of(state: TaskState | None) -> str:
    return NEW if state is None else state.status


def refusal(state: TaskState | None, type: str, task: str) -> str | None:
    """Why `type` may not happen to the task now, or None when it may."""
    status = status_of(state)
    if type in TRANSITIONS[status]:
        return None
    if status == NEW:
        return f"{task}: no such task"
    if not TRANSITIONS[status]:
        return f"{task} is {status.replace('_', ' ')}: nothing more can happen to it (refused {type})"
    hint = _HINTS.get((status, type))
    return (f"{task}: cannot record {type} while it is {status}" + (f" ({hint})" if hint else "")
            + f"; allowed now: {', '.join(TRANSITIONS[status])}")


def apply(state: TaskState | None, type: str, data: dict, ts: float, task: str) -> TaskState:
    """The state after one event (a new TaskState; `state` is left alone). Raises IllegalTransition."""
    if state is None and type == TaskEvent.RETRIED and "prompt" in data:
        # a fold that forgot the given-up task (forget_ended) has it back from what the retry carries
        return msgspec.structs.replace(apply(None, TaskEvent.CREATED, data, ts, task), created=data.get("created", ts))
    why = refusal(state, type, task)
    if why:
        raise IllegalTransition(why)
    if state is None:
        return TaskState(id=task, project=str(data.get("project", "")), title=str(data.get("title", "")),
                         prompt=str(data.get("prompt", "")), priority=int(data.get("priority", 0)),
                         created=ts, updated=ts, pin=str(data["pin"]) if data.get("pin") else None,
                         tags=[str(t) for t in data.get("tags") or ()],
                         created_by=str(data["created_by"]) if data.get("created_by") else None,
                         parent=str(data["parent"]) if data.get("parent") else None,
                         depth=int(data.get("depth") or 0))
    new = msgspec.structs.replace(state, status=TRANSITIONS[state.status][type], updated=ts)
    if type == TaskEvent.ASSIGNED:
        agent = data.get("agent")
        if not agent:
            raise IllegalTransition(f"{task}: task-assigned needs an agent")
        new.agent = new.last_agent = str(agent)
        new.assigned, new.retry_at = ts, None
    elif type == TaskEvent.EXECUTING:
        if data.get("agent", state.agent) != state.agent:
            raise IllegalTransition(f"{task}: assigned to {state.agent}, not {data.get('agent')}")
        new.started, new.attempts = ts, state.attempts + 1
    elif type == TaskEvent.ACKED:
        new.result, new.acked, new.failures, new.error = data.get("result"), ts, 0, None
    elif type == TaskEvent.FAILED:
        new.agent, new.failures, new.error = None, state.failures + 1, data.get("error")
        if state.agent is not None and state.agent not in state.failed_on and data.get("reason") != "interrupted":
            new.failed_on = [*state.failed_on, state.agent]    # the routing avoids it while another may take it
        after = data.get("retry_after_s")
        new.retry_at = ts + after if isinstance(after, (int, float)) and after > 0 else None
    elif type == TaskEvent.CLOSED:
        new.agent, new.closed = None, ts
    elif type == TaskEvent.GIVEN_UP:
        new.agent, new.given_up = None, ts
    elif type == TaskEvent.RETRIED:   # a fresh start: its failures and the agents it failed on are forgiven
        new.given_up, new.failures, new.error, new.failed_on, new.retry_at = None, 0, None, [], None
    return new


def fold_one(states: dict[str, TaskState], ev) -> bool:
    """Apply one event to `states` in place; False (and no change) when the table refuses it.

    Every write is checked, so a refused event in the history means someone appended
    around the store's checked path; folding skips it rather than inventing a state.
    """
    task = ev.target or ""
    try:
        states[task] = apply(states.get(task), ev.type, ev.data, ev.ts, task)
    except (IllegalTransition, ValueError, TypeError):
        return False
    return True


def fold_tasks(events: Iterable) -> dict[str, TaskState]:
    states: dict[str, TaskState] = {}
    for ev in events:
        if ev.type in TASK_EVENTS:
            fold_one(states, ev)
    return states


def decide(history: Sequence, type: str, task: str, data: dict, ts: float, source: str,
           max_failures: int = MAX_FAILURES, retry: tuple[float, float] | None = None,
           same_end: tuple[int, Sequence[str]] | None = None) -> list[tuple[str, dict]]:
    """The (type, data) events to append for `type` given the task's `history`, or IllegalTransition.

    A failure that reaches `max_failures` in a row, or whose reason cannot fix itself
    (FINAL_REASONS), also gives the task up, in the same transaction, so no reader ever sees it
    pending after its last allowed failure. So does one that ends the run the same way as the
    runs before it, `same_end` = (how many in a row, the reasons that count; 0: never): a run
    ended as a loop or over budget twice will be so again, and each try costs. Another failure
    waits before it is handed out again: `retry` = (first, cap) seconds, doubling per failure in
    a row (data `retry_after_s`).
    """
    state = fold_tasks(history).get(task)
    failures = (state.failures if state is not None else 0) + 1
    final = type == TaskEvent.FAILED and data.get("reason") in FINAL_REASONS
    same = same_end_streak(history, data, same_end) if type == TaskEvent.FAILED and not final else 0
    repeated = same_end is not None and same_end[0] > 0 and same >= same_end[0]
    if type == TaskEvent.FAILED and retry is not None and not final and not repeated and failures < max_failures:
        data = {**data, "retry_after_s": clock.backoff(failures, *retry)}
    after = apply(state, type, data, ts, task)
    out = [(type, data)]
    if final:
        out.append((TaskEvent.GIVEN_UP, {"reason": f"{data['reason']}: retrying cannot fix it", "by": source,
                                         "failures": after.failures}))
    elif repeated:
        out.append((TaskEvent.GIVEN_UP, {
            "reason": f"its last {same} runs all ended the same way ({end_words(data)}): retrying would end it "
                      f"so again ([tasks] same_end_max = {same_end[0]})",
            "by": source, "failures": after.failures, "same_end": data.get("reason")}))
    elif type == TaskEvent.FAILED and after.failures >= max_failures:
        out.append((TaskEvent.GIVEN_UP, {"reason": f"failed {after.failures} times in a row", "by": source,
                                      "failures": after.failures}))
    return out


def end_way(data: dict) -> tuple:
    """How a run ended, for telling two ends apart: a reason of Pulse's own alone, another with its exit code."""
    reason = data.get("reason")
    return (reason,) if reason in PULSE_ENDS else (reason, data.get("code"))


def end_words(data: dict) -> str:
    way = end_way(data)
    return str(way[0]) if len(way) == 1 else f"{way[0]}, exit code {way[1]}"


def same_end_streak(history: Sequence, data: dict, same_end: tuple[int, Sequence[str]] | None) -> int:
    """How many runs in a row, this failure (`data`) the last, ended the same way and for a reason
    `same_end` counts (0: it counts none). The streak is that of failures in a row: an ack or the
    operator's retry starts it again, a failure another way breaks it."""
    if same_end is None or data.get("reason") not in same_end[1]:
        return 0
    way, n = end_way(data), 1
    for ev in reversed(history):
        if ev.type in (TaskEvent.ACKED, TaskEvent.RETRIED, TaskEvent.CREATED):
            break
        if ev.type != TaskEvent.FAILED:
            continue
        if end_way(ev.data) != way:
            break
        n += 1
    return n


# -- projections ------------------------------------------------------------------------------------

def urgency(task: TaskState) -> tuple:
    """Sort key: higher priority first, then older first, then by id."""
    return (-task.priority, task.created, task.id)


def pending_tasks(states: dict[str, TaskState], now: float, limit: int = SNAPSHOT_TASKS_LIMIT,
                  first: Callable[[TaskState], bool] | None = None) -> PendingTasks:
    """The tasks to hand out now, most urgent first: pending ones whose retry wait (after a failed
    run) is over. Those still waiting are counted, with the earliest time one is due.
    `first`: when more are due than `limit`, those it says may run now are listed before the others
    (still most urgent first), so tasks no agent may take cannot fill the list."""
    pending = sorted((t for t in states.values() if t.status == TaskStatus.PENDING), key=urgency)
    due = [t for t in pending if t.retry_at is None or t.retry_at <= now]
    if first is not None and len(due) > limit:
        chosen = {t.id for t in sorted(due, key=lambda t: not first(t))[:limit]}   # a stable sort keeps urgency
        due = [t for t in due if t.id in chosen]
    waits = [t.retry_at for t in pending if t.retry_at is not None and t.retry_at > now]
    by_project: dict[str, int] = {}
    for t in pending:
        by_project[t.project] = by_project.get(t.project, 0) + 1
    return PendingTasks(pending_count=len(pending), tasks=due[:limit], by_project=by_project,
                        waiting_retry=len(waits), next_retry=min(waits, default=None))


class AgentStatsFold:
    """AgentCapabilityStats per agent, folded event by event (it needs who held a task when)."""

    def __init__(self, forget_ended: bool = False) -> None:
        self.stats: dict[str, AgentCapabilityStats] = {}
        self.tasks: dict[str, TaskState] = {}
        # forget_ended: a closed or given-up task moves no more (but for the operator's retry, whose
        # event carries the task back), and its agent's counts already hold it; a fold that runs for
        # ever (the tick's) drops it, so its memory follows the open tasks
        self.forget_ended = forget_ended

    def _of(self, agent: str) -> AgentCapabilityStats:
        if agent not in self.stats:
            self.stats[agent] = AgentCapabilityStats(agent=agent)
        return self.stats[agent]

    def fold(self, ev) -> None:
        try:
            self.count(ev)
        finally:
            self.forget_if_ended(ev.target or "")

    def count(self, ev) -> None:
        before = self.tasks.get(ev.target or "")
        if not fold_one(self.tasks, ev):
            return
        agent = credited_agent(before, self.tasks[ev.target or ""], ev.type)
        if agent is None:
            return
        s = self._of(agent)
        if ev.type == TaskEvent.ASSIGNED:
            s.assigned += 1
        elif ev.type == TaskEvent.ACKED:
            s.acked += 1
            s.consecutive_failures = 0
            if before.started is not None:
                s.total_duration_ms += max(0.0, (ev.ts - before.started) * 1000)
                s.avg_duration_ms = round(s.total_duration_ms / s.acked, 3)
        elif ev.type == TaskEvent.FAILED:
            s.failed += 1
            s.consecutive_failures += 1
        if ev.type in (TaskEvent.ACKED, TaskEvent.FAILED):   # a run ended: what it cost
            add_usage(s, ev.data.get("result"))
        if ev.type == TaskEvent.CLOSED:
            s.closed += 1
        elif ev.type == TaskEvent.GIVEN_UP:
            s.given_up += 1

    def forget_if_ended(self, task: str) -> None:
        if self.forget_ended and task in self.tasks and self.tasks[task].status in ENDED:
            del self.tasks[task]


def add_usage(stats: AgentCapabilityStats, result) -> None:
    """A run's reported cost and tokens (its adapter's result, pulse.agents.adapters) into `stats`."""
    if not isinstance(result, dict):
        return
    cost = result.get("cost_usd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        stats.cost_usd = round(stats.cost_usd + cost, 6)
        stats.runs_with_cost += 1
    tokens = result.get("tokens")
    if isinstance(tokens, dict):
        for name, n in tokens.items():
            if isinstance(n, int) and not isinstance(n, bool):
                stats.tokens[name] = stats.tokens.get(name, 0) + n


def credited_agent(before: TaskState | None, after: TaskState, type: str) -> str | None:
    """The agent an event counts for: the one holding the task, or, for a give-up after
    failed runs, the one that failed it last. A task the operator closes or gives up
    before any agent touched it (or after a clean hand-back) counts for nobody."""
    if type == TaskEvent.ASSIGNED:
        return after.agent
    if before is None or type == TaskEvent.CREATED:
        return None
    if type == TaskEvent.CLOSED:
        return before.agent if before.status == TaskStatus.ACKED else None
    if type == TaskEvent.GIVEN_UP and before.agent is None:
        return before.last_agent if before.failures else None
    return before.agent


def agent_capability_stats(events: Iterable) -> dict[str, AgentCapabilityStats]:
    fold = AgentStatsFold()
    for ev in events:
        if ev.type in TASK_EVENTS:
            fold.fold(ev)
    return fold.stats


class TaskBook:
    """Both projections, folded incrementally: `last_id` is the last event folded."""

    def __init__(self, agents: Iterable[str] = (), forget_ended: bool = False) -> None:
        self.last_id = 0
        self.agents = AgentStatsFold(forget_ended)     # forget_ended: `states` holds the open tasks only
        for name in agents:          # configured agents show (with zero counts) before their first task
            self.agents._of(name)

    @property
    def states(self) -> dict[str, TaskState]:
        return self.agents.tasks

    def fold(self, events: Iterable) -> None:
        for ev in events:
            if ev.type in TASK_EVENTS:
                self.agents.fold(ev)
            if ev.id is not None:
                self.last_id = max(self.last_id, ev.id)

    def extras(self, first: Callable[[TaskState], bool] | None = None) -> dict[str, Any]:
        return {"pending-tasks": pending_tasks(self.states, time.time(), first=first),
                "agent-capability-stats": dict(sorted(self.agents.stats.items()))}


def book_projection(name: str, agents: Iterable[str] = (), forget_ended: bool = False):
    """A TaskBook as a checkpointed projection (pulse.store.projection) named `name`."""
    from pulse.store import projection
    agents = list(agents)

    def load_book(raw: dict) -> TaskBook:
        book = TaskBook(agents, forget_ended)
        book.agents.stats.update(msgspec.convert(raw["stats"], dict[str, AgentCapabilityStats]))
        book.agents.tasks.update(msgspec.convert(raw["tasks"], dict[str, TaskState]))
        book.last_id = raw["last_id"]
        return book

    return projection.Projection(
        name=name, new=lambda: TaskBook(agents, forget_ended), fold=TaskBook.fold, types=tuple(TASK_EVENTS),
        dump=lambda book: {"stats": book.agents.stats, "tasks": book.agents.tasks, "last_id": book.last_id},
        load=load_book, code=(TaskBook, AgentStatsFold, TaskState, AgentCapabilityStats, fold_one, apply,
                              credited_agent, add_usage, TRANSITIONS, forget_ended))


def snapshot_extras(conn, book: TaskBook | None = None,
                    first: Callable[[TaskState], bool] | None = None) -> dict[str, Any]:
    """What a snapshot carries when its sense keys include "pending-tasks":
    {"pending-tasks": PendingTasks, "agent-capability-stats": {agent: AgentCapabilityStats}}.

    Reads only task-* events (by the (type, id) index). Pass the same `book` every tick
    to fold only what is new since the last call; without one, it folds from the start.
    """
    book = book if book is not None else TaskBook()
    catch_up(conn, book)
    return book.extras(first)


def catch_up(conn, book: TaskBook, batch: int = 5_000) -> TaskBook:
    """Fold into `book` every task event committed since it last looked."""
    from pulse.store import eventsdb
    while True:
        events = eventsdb.task_events(conn, after_id=book.last_id, limit=batch)
        book.fold(events)
        if len(events) < batch:
            return book


# -- reading and writing events.db (the only I/O here; every statement is in pulse.store.eventsdb) -----

def create(conn, project: str, title: str, prompt: str, priority: int = 0, source: str = "pulsectl",
           pin: str | None = None, tags: Sequence[str] = (), created_by: str | None = None,
           parent: str | None = None, depth: int = 0) -> TaskState:
    """Append a task-created event under the next task id; returns the new task. `pin`: only that
    agent may take it; `tags`: only an agent with all of them (pulse.agents.routing). `created_by`,
    `parent`, `depth`: the agent whose run (of task `parent`) made it, and how deep it is."""
    from pulse.store import eventsdb
    fields = {"project": project, "title": title, "prompt": prompt, "priority": int(priority)}
    if pin:
        fields["pin"] = pin
    if tags:
        fields["tags"] = sorted(set(tags))
    if created_by:
        fields.update(created_by=created_by, depth=int(depth), **({"parent": parent} if parent else {}))
    ev = eventsdb.create_task_event(conn, lambda n: eventmsgs.now_event(TaskEvent.CREATED, source, task_id(n), fields))
    return apply(None, ev.type, ev.data, ev.ts, ev.target)


def record(conn, task: str, type: str, source: str, max_failures: int = MAX_FAILURES, run: str | None = None,
           retry: tuple[float, float] | None = None, same_end: tuple[int, Sequence[str]] | None = None,
           **data) -> TaskState:
    """Append `type` for `task` if the transition table allows it now (checked and appended in
    one transaction), plus task-given-up when a failure reaches `max_failures`. Returns the
    task's new state; raises IllegalTransition, writing nothing, when the move is refused.

    `run`: only if the task is held by that run (see current_run), so the end of one run can
    never land on the next one (an orphan settled late, say); the events carry it."""
    from pulse.store import eventsdb
    if run is not None:
        data = {**data, "run": run}

    def decide_events(history: list) -> list:
        if run is not None and current_run(history, task) != run:
            raise IllegalTransition(f"{task}: not held by run {run}")
        ts = time.time()
        return [eventmsgs.now_event(t, source, task, d) for t, d in
                decide(history, type, task, data, ts, source, max_failures, retry, same_end)]

    eventsdb.append_task_events(conn, task, decide_events)
    return load(conn, task)


def current_run(history: Sequence, task: str) -> str | None:
    """The run (an agent-run effect id) holding the task: the `run` of its latest task-assigned or
    task-executing event while it is assigned or executing; None otherwise."""
    state = fold_tasks(history).get(task)
    if state is None or state.status not in (TaskStatus.ASSIGNED, TaskStatus.EXECUTING):
        return None
    for ev in reversed(history):
        if ev.type in (TaskEvent.ASSIGNED, TaskEvent.EXECUTING):
            return ev.data.get("run")
    return None


def start_run(conn, task: str, agent: str, run: str, source: str, **data) -> TaskState:
    """A run of `agent` takes the task: task-assigned (from pending) and task-executing, both
    checked and appended in one transaction, each carrying `run`. A task already assigned to
    `agent` by someone else only gets task-executing. Raises IllegalTransition otherwise."""
    from pulse.store import eventsdb

    def decide_events(history: list) -> list:
        state = fold_tasks(history).get(task)
        steps = [TaskEvent.EXECUTING]
        if state is not None and state.status == TaskStatus.PENDING:
            steps.insert(0, TaskEvent.ASSIGNED)
        elif state is not None and state.status == TaskStatus.ASSIGNED and state.agent != agent:
            raise IllegalTransition(f"{task}: assigned to {state.agent}, not {agent}")
        out, seen = [], list(history)
        for step in steps:
            for t, d in decide(seen, step, task, {**data, "agent": agent, "run": run}, time.time(), source):
                ev = eventmsgs.now_event(t, source, task, d)
                out.append(ev)
                seen.append(ev)
        return out

    eventsdb.append_task_events(conn, task, decide_events)
    return load(conn, task)


def load(conn, task: str) -> TaskState | None:
    from pulse.store import eventsdb
    return fold_tasks(eventsdb.task_history(conn, task)).get(task)


ALL_TASKS = "tasks"     # the projection of every task, kept by the readers that list them all


def load_all(conn, checkpoints) -> dict[str, TaskState]:
    """Every task's state, from the checkpoint under `checkpoints` (the home's checkpoint directory)
    of the projection of every task, folding only what came after it, and writing a new one when
    this fold was long and this process may (pulse.store.projection.may_write)."""
    return all_tasks(conn, checkpoints).catch_up().states


def all_tasks(conn, checkpoints):
    """The projection of every task, from its checkpoint under `checkpoints`, for a reader that keeps
    it and calls `catch_up()` again to fold only what is new (a long-lived server's listings)."""
    from pulse.store import projection
    return projection.Folded(book_projection(ALL_TASKS), conn, checkpoints, every_events=1_000,
                             every_s=float("inf"), save=projection.may_write(checkpoints.parent))
