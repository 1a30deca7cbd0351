"""The deterministic analyst: pure functions from a window's events to an Analysis.

No I/O, no clock: the same events give the same analysis. The rules, all readable here:

- Runs. An agent run is the task-executing event that starts it (its `run` is the agent-run
  effect's id) and the task-acked or task-failed that ends it; a task-given-up right after its
  last failed run turns that run's outcome into `given_up`. A run still open at the window's
  end is `running`.
- Agents are judged by their tasks, not their runs: a task's outcome is that of its last ended
  run (done if acked; failed if failed or given up), so the retries of one hard task count
  once. Each task weighs by how recently it ended: 1 at the window's end, halving every half
  window (a task that ended half a window ago weighs 1/2, a whole window ago 1/4). The agent's
  share is the weight of its tasks done over the weight of all its ended tasks. It fails when
  that share is below 50 %, or when its last 3 tasks all failed; it warns below 90 %, or when
  its most recent task failed; else it passes. So 4 tasks of 5 done, the fifth given up after
  three attempts, is a warning, not a failure; an agent that keeps failing always judges worse
  than one that keeps succeeding. A run longer than twice its agent's own median (once it has
  3 acked runs) is slow.
- Survival. Effects of origin `survival`: its repairs (the kinds the effect registry marks as
  repairs: restart-process, archive, cleanup, exec, engine-rollback), its notifications. A
  repair that failed is an issue.
- The score starts at 100 and loses, each loss capped: failed runs 4 each (at most 30),
  tasks given up 8 (24), failed survival repairs 6 (24), rollbacks 10 (20), gate blocks 2 (10),
  slow runs 1 (5), errors 1 per distinct error (10), workers that failed or an escalation 10
  each (20), Pulse's own workers' crashes 3 each (15) and hangs 5 each (15), guarded processes held
  fatal (crash-looping) 10 each (20), proofs of work ([[watch.fresh]]) that went stale 5 each (15).
  Verdict: pass from 80, warn from 50, fail below; a window in which any role fails, a guarded
  process was held fatal, or a proof of work is still stale at its end, is never a pass (at most warn).
- Guards. Watched directories ([[watch.dir]]) that dirGuard kept within bounds are a highlight: each
  directory, how often it was trimmed, the files and MiB taken away, citing the trims. Each proof of
  work that went stale (freshWatch's notification) is an issue citing it, the restarts of its process
  it asked for (why `stale`) and the notification that work was seen again, if it was; one still
  stale at the window's end is an error, one seen again a warning.
- Pulse itself. Its own workers are the survival layer: a worker that exited unasked (crashed or
  killed) or was found hung makes the survival card warn, one that pulsed gave up on (`failed`,
  the restart intensity reached) makes it fail; each is an issue, citing its event.
- Errors. An error that keeps recurring is an `error` event, then one per [store]
  error_repeat_s with the count since: errors are told apart by what erred (source, target,
  message), not counted as events, and their `count`s add up to every occurrence.
- Spend. Who spent what: the `spend-settled` events of the window per agent, costliest first
  (runs whose CLI reported no cost are counted and named), one highlight; each task a spend
  limit held back (`spend-held`), an issue. Neither costs the score.
- Loops noticed and left running (`loop-noticed`: on_loop = "notice", or a session Pulse did not
  start): one issue, a warning, naming who looped. What sessions Pulse did not start spent
  (`spend-observed`), counted or not: a highlight. Neither costs the score.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from pulse.core.states import EffectState
from pulse.core.wire.eventmsgs import (
    EFFECT_END_STATES,
    LOOP_NOTICED,
    TASK_EVENTS,
    EffectEvent,
    EffectKind,
    EventType,
    SpendEvent,
    TaskEvent,
)
from pulse.effects import registry
from pulse.report.analysis import MAX_CITATIONS, Analysis, Finding, RoleCard, TimelineEntry, Window, stamp

OPERATOR_SOURCES = frozenset({"pulsectl"})
OPERATOR_TYPES = frozenset({"operator", "reload"})   # pulsed records what an operator asked of it
SLOW_FACTOR = 2.0
SLOW_AFTER_RUNS = 3

# (what loses points, points each, at most)
PENALTIES = {
    "failed_runs": (4, 30), "given_up": (8, 24), "failed_repairs": (6, 24), "rollbacks": (10, 20),
    "gate_blocks": (2, 10), "slow_runs": (1, 5), "errors": (1, 10), "worker_failures": (10, 20),
    "worker_crashes": (3, 15), "worker_hangs": (5, 15), "crash_loops": (10, 20), "stale_proofs": (5, 15),
}
# a worker-exited while it was one of these is a death nobody asked for (a stop or restart exits `stopping`;
# an exit while `hung` is pulsed's own kill, counted by its worker-hung)
UNASKED_EXIT_STATES = frozenset({"running", "starting"})
FATAL_RULE = "process-fatal"    # processWatchdog's notification that a guarded process is held fatal
FRESH_RULE = "fresh-watch"      # freshWatch's notifications: a proof of work stale (target: the watch), or back
BACK = ":back"                  # (target: the watch's name and this)
PASS_FROM, WARN_FROM = 80, 50


def verdict_of(score: int) -> str:
    return "pass" if score >= PASS_FROM else "warn" if score >= WARN_FROM else "fail"


def _ids(ids: Iterable[int | None]) -> list[int]:
    out = [i for i in dict.fromkeys(ids) if i is not None]
    return out[:MAX_CITATIONS]


def _pct(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 1) if whole else None


# -- scope ----------------------------------------------------------------------------------------------

def task_of(ev) -> str | None:
    """The task an event is about: task-* events by target, agent-run effects by their task."""
    if ev.type in TASK_EVENTS:
        return ev.target
    if ev.type == EffectEvent.COMMITTED and ev.data.get("kind") == EffectKind.AGENT_RUN:
        params = ev.data.get("params") or {}
        raw = params.get("task_id", ev.data.get("target"))
        if raw is None:
            return None
        text = str(raw)
        return text if text.startswith("task-") else f"task-{text}"
    return None


def in_scope(events: Sequence, tasks: Mapping[str, tuple[str, str]], project: str | None = None,
             task: str | None = None) -> list:
    """The events of one project's or one task's tasks and runs (their effects' ends included);
    everything when neither is given. `tasks`: task id → (project, title), from task-created events."""
    if project is None and task is None:
        return list(events)
    wanted = {t for t, (p, _) in tasks.items() if project is None or p == project}
    if task is not None:
        wanted &= {task}
    effect_ids: set[str] = set()
    out = []
    for ev in events:
        about = task_of(ev)
        if about is not None and about in wanted:
            out.append(ev)
            if ev.type == EffectEvent.COMMITTED:
                effect_ids.add(ev.data.get("id", ""))
        elif ev.type in EFFECT_END_STATES and ev.data.get("effect_id") in effect_ids:
            out.append(ev)
    return out


# -- folding ---------------------------------------------------------------------------------------------

@dataclass
class Run:
    run: str
    agent: str
    task: str
    start: float
    end: float | None = None
    outcome: str = "running"
    error: str | None = None
    event_ids: list[int] = field(default_factory=list)
    cost: float = 0.0

    @property
    def duration(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - self.start)


@dataclass
class Action:
    """An effect of origin survival (or operator) and what became of it."""
    id: str
    kind: str
    target: str | None
    ts: float
    rule: str | None
    origin: str
    reason: str | None = None       # why it was done, in figures (a memory restart: the RSS, the ceiling)
    why: str | None = None          # its params' `why` (a restart's cause: dead, memory, config-restored …)
    freed: int | None = None        # a rotate-file's or trim-dir's bytes freed (its ack)
    removed: int | None = None      # a trim-dir's files deleted or archived
    watch: str | None = None        # the [[watch.*]] it answers (a trim-dir's, a restart for a stale proof)
    end: float | None = None
    state: str = EffectState.PENDING
    error: str | None = None
    event_ids: list[int] = field(default_factory=list)


@dataclass
class Fold:
    runs: dict[str, Run] = field(default_factory=dict)
    open_run: dict[str, str] = field(default_factory=dict)         # task → its open run
    last_run: dict[str, str] = field(default_factory=dict)         # task → its last run
    given_up: list = field(default_factory=list)                   # task-given-up events
    actions: dict[str, Action] = field(default_factory=dict)       # effect id → survival/operator effect
    promotes: list = field(default_factory=list)
    rollbacks: list = field(default_factory=list)
    gate_blocks: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    worker_failures: list = field(default_factory=list)
    worker_crashes: list = field(default_factory=list)             # worker-exited, unasked
    worker_hangs: list = field(default_factory=list)               # worker-hung
    operator: list = field(default_factory=list)
    agents: set[str] = field(default_factory=set)


def _run_key(ev, task: str) -> str:
    return str(ev.data.get("run") or f"{task}@{ev.id}")


def fold(events: Iterable, window_start: float) -> Fold:
    f = Fold()
    for ev in events:
        t = ev.type
        if (ev.source in OPERATOR_SOURCES and t != EffectEvent.EXECUTING) or t in OPERATOR_TYPES:
            f.operator.append(ev)
        if t == TaskEvent.EXECUTING:
            task = ev.target or ""
            key = _run_key(ev, task)
            agent = str(ev.data.get("agent") or "?")
            f.agents.add(agent)
            f.runs[key] = Run(key, agent, task, ev.ts, event_ids=[ev.id])
            f.open_run[task], f.last_run[task] = key, key
        elif t in (TaskEvent.ACKED, TaskEvent.FAILED):
            task = ev.target or ""
            key = ev.data.get("run") or f.open_run.get(task)
            run = f.runs.get(key) if key else None
            if run is None:                     # began before the window
                agent = str(ev.data.get("agent") or "?")
                key = key or f"{task}@{ev.id}"
                run = f.runs[key] = Run(key, agent, task, window_start)
                f.agents.add(agent)
            run.end, run.outcome = ev.ts, "acked" if t == TaskEvent.ACKED else "failed"
            run.error = ev.data.get("error")
            run.event_ids.append(ev.id)
            result = ev.data.get("result")
            if isinstance(result, dict) and isinstance(result.get("total_cost_usd"), (int, float)):
                run.cost = float(result["total_cost_usd"])
            f.open_run.pop(task, None)
            f.last_run[task] = key
        elif t == TaskEvent.GIVEN_UP:
            f.given_up.append(ev)
            key = f.last_run.get(ev.target or "")
            run = f.runs.get(key) if key else None
            if run is not None and run.outcome == "failed" and ev.data.get("failures"):
                run.outcome = "given_up"
                run.event_ids.append(ev.id)
        elif t == EffectEvent.COMMITTED:
            origin = ev.data.get("origin")
            if origin in ("survival", "operator"):
                params = ev.data.get("params") or {}
                params = params if isinstance(params, dict) else {}
                f.actions[ev.data.get("id", "")] = Action(
                    ev.data.get("id", ""), str(ev.data.get("kind", "")), ev.target, ev.ts, params.get("rule"), origin,
                    reason=reason_of(params), why=params.get("why"),
                    watch=params.get("watch") if isinstance(params.get("watch"), str) else None, event_ids=[ev.id])
        elif t in EFFECT_END_STATES:
            action = f.actions.get(ev.data.get("effect_id", ""))
            if action is not None and not ev.data.get("requeued"):
                action.state, action.end = EFFECT_END_STATES[t], ev.ts
                action.error = ev.data.get("error") or ev.data.get("reason")
                if isinstance(ev.data.get("bytes_freed"), int):
                    action.freed = ev.data["bytes_freed"]
                if isinstance(ev.data.get("removed"), int):
                    action.removed = ev.data["removed"]
                action.event_ids.append(ev.id)
        elif t == EventType.PROMOTE:
            f.promotes.append(ev)
        elif t == EventType.ROLLBACK:
            f.rollbacks.append(ev)
        elif t == EventType.GATE_BLOCKED:
            f.gate_blocks.append(ev)
        elif t == EventType.ERROR:
            f.errors.append(ev)
        elif t == EventType.WORKER_FAILED or (t == EventType.SUPERVISOR_STOPPING and ev.data.get("exit_code")):
            f.worker_failures.append(ev)
        elif t == EventType.WORKER_EXITED and ev.data.get("state") in UNASKED_EXIT_STATES:
            f.worker_crashes.append(ev)
        elif t == EventType.WORKER_HUNG:
            f.worker_hangs.append(ev)
    return f


# -- judging ----------------------------------------------------------------------------------------------

def plural(n: int, word: str, words: str | None = None) -> str:
    """"1 repair", "3 repairs": a count in words a person reads, never "repair(s)"."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def times(n: int) -> str:
    return "once" if n == 1 else "twice" if n == 2 else f"{n} times"


@dataclass
class TaskOutcome:
    """One task of one agent: the outcome of its last ended run, and when that ended."""
    task: str
    done: bool
    end: float
    runs: int


def task_outcomes(runs: Sequence[Run]) -> list[TaskOutcome]:
    """Each task's last ended run decides it; oldest first."""
    by_task: dict[str, list[Run]] = {}
    for run in runs:
        if run.outcome != "running":
            by_task.setdefault(run.task, []).append(run)
    out = []
    for task, ended in by_task.items():
        last = max(ended, key=lambda r: (r.end or r.start))
        out.append(TaskOutcome(task, last.outcome == "acked", last.end or last.start, len(ended)))
    return sorted(out, key=lambda t: t.end)


def recency_weight(ended_at: float, start: float, end: float) -> float:
    """1 at the window's end, halving every half window."""
    half = max((end - start) / 2, 1.0)
    return 0.5 ** (max(0.0, end - ended_at) / half)


def weighted_share(outcomes: Sequence[TaskOutcome], start: float, end: float) -> float:
    weights = [(recency_weight(t.end, start, end), t.done) for t in outcomes]
    total = sum(w for w, _ in weights)
    return sum(w for w, done in weights if done) / total if total else 1.0


def agent_card(name: str, runs: Sequence[Run], slow: Sequence[Run], start: float | None = None,
               end: float | None = None) -> RoleCard:
    ended = [r for r in runs if r.outcome != "running"]
    acked = [r for r in ended if r.outcome == "acked"]
    failed = [r for r in ended if r.outcome in ("failed", "given_up")]
    given_up = [r for r in ended if r.outcome == "given_up"]
    durations = [r.duration for r in acked if r.duration is not None]
    outcomes = task_outcomes(runs)
    done = [t for t in outcomes if t.done]
    if end is None:
        end = max((t.end for t in outcomes), default=0.0)
    if start is None:
        start = min((r.start for r in runs), default=end)
    share = round(100 * weighted_share(outcomes, start, end), 1)
    last_three_failed = len(outcomes) >= 3 and not any(t.done for t in outcomes[-3:])
    said = f"{len(done)} of {plural(len(outcomes), 'task')} done" + (
        f" in {plural(len(ended), 'run')}" if len(ended) != len(outcomes) else "")
    if not outcomes:
        verdict, summary = "pass", "no run ended in the window" if runs else "idle"
    elif share < 50 or last_three_failed:
        verdict = "fail"
        summary = said + ("; its last 3 tasks all failed" if last_three_failed else "")
    elif share < 90 or not outcomes[-1].done:
        verdict = "warn"
        summary = said + ("; its most recent task failed" if not outcomes[-1].done else "")
    else:
        verdict, summary = "pass", said
    figures: dict = {
        "runs": len(runs), "acked": len(acked), "failed": len(failed), "given_up": len(given_up),
        "running": len(runs) - len(ended), "success_rate_pct": _pct(len(acked), len(ended)),
        "tasks": len(outcomes), "tasks_done": len(done), "tasks_done_weighted_pct": share if outcomes else None,
        "retries": len(runs) - len({r.task for r in runs}),
        "median_s": round(statistics.median(durations), 3) if durations else None,
        "max_s": round(max(durations), 3) if durations else None,
        "slow_runs": len(slow),
        "cost_usd": round(sum(r.cost for r in runs), 4) if any(r.cost for r in runs) else None,
    }
    cite = [i for r in (failed[-5:] + acked[-5:] if failed else acked[-10:]) for i in r.event_ids]
    return RoleCard(role="agent", name=name, verdict=verdict, summary=summary, figures=figures,
                    event_ids=_ids(cite))


def slow_runs(runs: Sequence[Run]) -> list[Run]:
    """Acked runs longer than SLOW_FACTOR × their agent's own median (once it has SLOW_AFTER_RUNS)."""
    durations = [r.duration for r in runs if r.outcome == "acked" and r.duration is not None]
    if len(durations) < SLOW_AFTER_RUNS:
        return []
    median = statistics.median(durations)
    return [r for r in runs if r.outcome == "acked" and r.duration is not None and median > 0
            and r.duration > SLOW_FACTOR * median]


def reason_of(params: dict) -> str | None:
    """Why an effect was committed, from its params: its own words (`reason`), else its `why` (a
    notification: its title)."""
    reason = params.get("reason") or params.get("why") or params.get("title")
    return str(reason) if reason else None


def _label(action: Action) -> str:
    return f"{action.kind} {action.target}" if action.target else action.kind


def _described(action: Action) -> str:
    """Its label, and its reason when it has one: what a reader of the report needs to know about it."""
    return f"{_label(action)} ({action.reason})" if action.reason else _label(action)


def is_repair(action: Action) -> bool:
    return action.kind in registry.repair_kinds()


def worker_words(crashes: Sequence, hangs: Sequence, failures: Sequence) -> str:
    """Pulse's own workers in the window, in words: "tick crashed 2×, watcher hung, web failed"."""
    said: dict[str, list[str]] = {}
    for what, events in (("crashed", crashes), ("hung", hangs), ("failed", failures)):
        for ev in events:
            if ev.type == EventType.SUPERVISOR_STOPPING:
                said.setdefault("pulsed", []).append("escalated")
            else:
                said.setdefault(str(ev.target), []).append(what)
    parts = []
    for worker, whats in said.items():
        for what in dict.fromkeys(whats):
            n = whats.count(what)
            parts.append(f"{worker} {what}" + (f" {times(n)}" if n > 1 else ""))
    return ", ".join(parts)


def survival_card(actions: Sequence[Action], rollbacks: Sequence, crashes: Sequence = (), hangs: Sequence = (),
                  failures: Sequence = ()) -> RoleCard:
    repairs = [a for a in actions if is_repair(a)]
    failed = [a for a in repairs if a.state == EffectState.FAILED]
    acked = [a for a in repairs if a.state == EffectState.ACKED]
    notes = [a for a in actions if a.kind == EffectKind.NOTIFY]
    pulse_itself = worker_words(crashes, hangs, failures)
    if failures:
        verdict, summary = "fail", f"Pulse's own workers: {pulse_itself}"
    elif not actions:
        verdict, summary = "pass", "nothing needed doing"
    elif failed and len(failed) >= len(acked):
        verdict, summary = "fail", f"{len(failed)} of {plural(len(repairs), 'repair')} failed"
    elif failed:
        verdict, summary = "warn", f"{len(failed)} of {plural(len(repairs), 'repair')} failed"
    else:
        verdict = "pass"
        sent = f"{plural(len(notes), 'notification')} sent"
        summary = f"{plural(len(acked), 'repair')} done, {sent}" if repairs else sent
    if pulse_itself and not failures:   # a crash or a hang of Pulse itself is never "nothing needed doing"
        verdict = "warn" if verdict == "pass" else verdict
        summary = f"Pulse's own workers: {pulse_itself}; " + summary
    figures = {"actions": len(actions), "repairs": len(repairs), "repairs_acked": len(acked),
               "repairs_failed": len(failed), "notifications": len(notes),
               "rollbacks": sum(1 for a in actions if a.kind == EffectKind.ENGINE_ROLLBACK),
               **guard_figures(acked),
               **({"proofs_stale": n} if (n := len(stale_proofs(actions))) else {}),
               **{k: v for k, v in (("worker_crashes", len(crashes)), ("worker_hangs", len(hangs)),
                                    ("worker_failures", len(failures))) if v}}
    cite = [ev.id for ev in [*failures, *hangs, *crashes][:10]] + [i for a in (failed + acked)[:10] for i in a.event_ids]
    return RoleCard(role="survival", name="survival", verdict=verdict, summary=summary, figures=figures,
                    event_ids=_ids(cite))


def guard_figures(acked: Sequence[Action]) -> dict:
    """What the guards did (only those that did something): processes restarted at their memory
    ceiling, configs restored to known good, watched files trimmed and the MiB that freed, watched
    directories kept within bounds and the files and MiB their trims took away."""
    trims = [a for a in acked if a.kind == EffectKind.ROTATE_FILE]
    dir_trims = [a for a in acked if a.kind == EffectKind.TRIM_DIR]
    figures = {"memory_restarts": sum(1 for a in acked if a.kind == EffectKind.RESTART_PROCESS and a.why == "memory"),
               "config_restores": sum(1 for a in acked if a.kind == EffectKind.RESTORE_CONFIG),
               "files_trimmed": len(trims),
               "mb_freed": round(sum(a.freed or 0 for a in trims) / 1048576, 1),
               "dirs_trimmed": len(dir_trims),
               "dir_files_removed": sum(a.removed or 0 for a in dir_trims),
               "dir_mb_freed": round(sum(a.freed or 0 for a in dir_trims) / 1048576, 1)}
    return {k: v for k, v in figures.items() if v}
OPERATOR_VERBS = {"restart": "restarted", "stop": "stopped", "start": "started"}


def operator_phrase(ev) -> str:
    """What the operator did, in words: "restarted executor", "reloaded the configuration"."""
    if ev.type == EventType.OPERATOR:
        action = str(ev.data.get("action", ""))
        if action.startswith("process-"):        # pulsectl process restart|stop|start, or the page's buttons
            verb = action.removeprefix("process-")
            return f"{OPERATOR_VERBS.get(verb, verb)} the {ev.target} process"
        return f"{OPERATOR_VERBS.get(action, action)} the {ev.target} worker".strip()
    if ev.type == EventType.RELOAD:
        return "reloaded the configuration" if ev.data.get("ok", True) else "tried a reload the config refused"
    if ev.type.startswith("task-"):
        return {TaskEvent.CREATED: "added a task", TaskEvent.CLOSED: "closed a task", TaskEvent.GIVEN_UP: "gave up a task",
                TaskEvent.RETRIED: "retried a task"}.get(ev.type, f"moved a task to {ev.type[5:]}")
    if ev.type.startswith("effect"):
        return ""            # the effect itself is counted below, by kind
    return f"{ev.type.replace('-', ' ')} {ev.target or ''}".strip()


def operator_card(events: Sequence, actions: Sequence[Action]) -> RoleCard:
    counts: dict[str, int] = {}
    for ev in events:
        phrase = operator_phrase(ev)
        if phrase:
            counts[phrase] = counts.get(phrase, 0) + 1
    for action in actions:
        phrase = f"asked for {action.kind}" + (f" on {action.target}" if action.target else "") + " by hand"
        counts[phrase] = counts.get(phrase, 0) + 1
    said = []
    for phrase, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:6]:
        if phrase.startswith(("added a task", "closed a task", "gave up a task")) and n > 1:
            said.append(phrase.replace(" a task", f" {n} tasks"))
        else:
            said.append(phrase if n == 1 else f"{phrase} {times(n)}")
    summary = ", ".join(said) if said else "no operator action"
    return RoleCard(role="operator", name="operator", verdict="pass", summary=summary,
                    figures={"actions": len(events)}, event_ids=_ids(ev.id for ev in events[-10:]))


def latest_of_each_error(errors: Sequence) -> list:
    """The latest error event of each distinct error (same source, target and message), oldest first."""
    latest = {(ev.source, ev.target, str(ev.data.get("message", ""))): ev for ev in errors}
    return sorted(latest.values(), key=lambda ev: ev.id if ev.id is not None else 0)


def _penalty(what: str, n: int) -> int:
    each, most = PENALTIES[what]
    return min(each * n, most)


# -- findings: one function per kind of finding; analyse puts them in the report's order ------------------

def titles_of(events: Sequence, tasks: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """task id → title: from `tasks` (created before the window), then the window's task-created events."""
    titles = {t: title for t, (_, title) in tasks.items()}
    titles.update({ev.target: str(ev.data.get("title", "")) for ev in events if ev.type == TaskEvent.CREATED})
    return titles


def named(task_id: str, titles: Mapping[str, str]) -> str:
    title = titles.get(task_id)
    return f"{task_id} “{title[:80]}”" if title else task_id


def agent_highlights(cards: Sequence[RoleCard]) -> list[Finding]:
    return [Finding(text=f"{card.name} {card.summary}", severity="info", event_ids=card.event_ids)
            for card in cards if card.role == "agent" and card.verdict == "pass" and card.figures.get("acked")]


def agent_issues(cards: Sequence[RoleCard]) -> list[Finding]:
    return [Finding(text=f"{card.name} {card.summary}", severity="error" if card.verdict == "fail" else "warn",
                    event_ids=card.event_ids)
            for card in cards if card.role == "agent" and card.verdict != "pass"]


def spend_highlights(events: Sequence) -> list[Finding]:
    """Who spent what: the agents' runs settled in the window (pulse.agents.spend), costliest first."""
    spent: dict[str, list] = {}
    for ev in events:
        if ev.type == SpendEvent.SETTLED and ev.data.get("cost_reported") is not None:
            spent.setdefault(str(ev.data.get("agent")), []).append(ev)
    if not spent:
        return []

    def words(name: str, settled: list) -> str:
        unknown = sum(1 for ev in settled if ev.data.get("cost_reported") is False)
        return (f"{name} ${sum(float(ev.data.get('usd') or 0) for ev in settled):.2f} over {len(settled)} run(s)"
                + (f" ({unknown} with no cost reported)" if unknown else ""))
    order = sorted(spent, key=lambda n: (-sum(float(ev.data.get("usd") or 0) for ev in spent[n]), n))
    return [Finding(text="spend: " + "; ".join(words(n, spent[n]) for n in order), severity="info",
                    event_ids=_ids(ev.id for n in order for ev in spent[n][-5:]))]


def session_spend_highlights(events: Sequence) -> list[Finding]:
    """What sessions Pulse did not start reported spending in the window (`spend-observed`): the
    counted ones (sent with the receiver's token, against the host's [budget]) and the others."""
    observed = [ev for ev in events if ev.type == SpendEvent.OBSERVED]
    if not observed:
        return []
    counted = [ev for ev in observed if ev.data.get("counted")]
    usd = sum(float(ev.data.get("usd") or 0) for ev in counted)
    other = sum(float(ev.data.get("usd") or 0) for ev in observed if not ev.data.get("counted"))
    sessions = len({ev.target for ev in counted})
    text = (f"sessions Pulse did not start: ${usd:.2f} over {plural(sessions, 'session')}, counted against the "
            f"host's budget" + (f"; ${other:.2f} more reported without the receiver's token, not counted" if other else ""))
    return [Finding(text=text, severity="info", event_ids=_ids(ev.id for ev in observed[-MAX_CITATIONS:]))]


def spend_held_issues(events: Sequence) -> list[Finding]:
    """Tasks a spend limit held back in the window (the latest word on each)."""
    held = {ev.target: ev for ev in events if ev.type == SpendEvent.HELD}
    return [Finding(text=f"{task} waited on a spend limit: {ev.data.get('why', '')}", severity="warn",
                    event_ids=_ids([ev.id])) for task, ev in sorted(held.items(), key=lambda kv: str(kv[0]))]


def loop_notice_issues(events: Sequence) -> list[Finding]:
    """Loops noticed and left running (an agent's on_loop = "notice", a session Pulse did not
    start): one finding for all, naming each run's task or session once."""
    noticed = [ev for ev in events if ev.type == LOOP_NOTICED]
    if not noticed:
        return []
    who = list(dict.fromkeys(str(ev.target) for ev in noticed))
    return [Finding(text=f"{plural(len(noticed), 'loop')} noticed and left running: " + ", ".join(who[:5])
                    + (f" and {len(who) - 5} more" if len(who) > 5 else "") + f"; the last: {noticed[-1].data.get('detail', '')}",
                    severity="warn", event_ids=_ids(ev.id for ev in noticed[-MAX_CITATIONS:]))]


def repairs_highlight(survival: Sequence[Action]) -> list[Finding]:
    acked = [a for a in survival if is_repair(a) and a.state == EffectState.ACKED]
    if not acked:
        return []
    shown = "; ".join(sorted({_described(a) for a in acked})[:5])
    return [Finding(text=f"survival repaired {times(len(acked))}: {shown}", severity="info",
                    event_ids=_ids(i for a in acked for i in a.event_ids))]


def promotes_highlight(promotes: Sequence) -> list[Finding]:
    return [Finding(text=f"the engine was promoted {times(len(promotes))}", severity="info",
                    event_ids=_ids(ev.id for ev in promotes))] if promotes else []


def given_up_issues(given_up: Sequence, runs: Iterable[Run], titles: Mapping[str, str]) -> list[Finding]:
    """One per task-given-up: after its failed runs (with the last error), or by someone's hand."""
    runs = list(runs)
    out = []
    for ev in given_up:
        failures = [r for r in runs if r.task == ev.target and r.outcome in ("failed", "given_up")]
        last_error = next((r.error for r in reversed(failures) if r.error), None) or ev.data.get("reason") or ""
        n = ev.data.get("failures") or len(failures)
        by = "" if ev.data.get("failures") else f" by {ev.data.get('by', ev.source)}"
        text = (f"{named(ev.target, titles)} failed {n} times and was given up: {last_error}" if ev.data.get("failures")
                else f"{named(ev.target, titles)} was given up{by}: {ev.data.get('reason', '')}")
        out.append(Finding(text=text, severity="error", event_ids=_ids(
            [i for r in failures for i in r.event_ids] + [ev.id])))
    return out


def failed_repair_issues(failed_repairs: Sequence[Action]) -> list[Finding]:
    """One per repaired thing (kind and target), however often it failed, with its last error."""
    by_label: dict[str, list[Action]] = {}
    for a in failed_repairs:
        by_label.setdefault(_label(a), []).append(a)
    out = []
    for label, failures in by_label.items():
        times = "" if len(failures) == 1 else f" {len(failures)} times"
        out.append(Finding(text=f"survival repair {label} failed{times}: {failures[-1].error or 'no reason recorded'}",
                           severity="error", event_ids=_ids(i for a in failures for i in a.event_ids)))
    return out


def rollback_issues(rollbacks: Sequence) -> list[Finding]:
    return [Finding(text=f"engine rolled back to {str(ev.data.get('to', ''))[:12]} "
                         f"({ev.data.get('reason') or 'no reason recorded'}, by {ev.source})",
                    severity="warn", event_ids=[ev.id]) for ev in rollbacks]


def gate_block_issues(blocks: Sequence) -> list[Finding]:
    if not blocks:
        return []
    reasons = sorted({str(ev.data.get("code") or ev.data.get("reason") or "blocked") for ev in blocks})
    return [Finding(text=f"the gate blocked {plural(len(blocks), 'tool call')} of agents: {', '.join(reasons[:5])}",
                    severity="warn", event_ids=_ids(ev.id for ev in blocks))]


def error_issues(errors: Sequence) -> list[Finding]:
    if not errors:
        return []
    distinct = latest_of_each_error(errors)
    total = sum(int(ev.data.get("count") or 1) for ev in errors)
    last = str(errors[-1].data.get("message", ""))[:200]
    return [Finding(text=f"{plural(len(distinct), 'distinct error')}, {total} in all; the last: {last}",
                    severity="warn", event_ids=_ids(ev.id for ev in distinct[-MAX_CITATIONS:]))]


def worker_failure_issues(failures: Sequence) -> list[Finding]:
    return [Finding(text=f"worker {ev.target} failed (restart intensity reached)" if ev.type == EventType.WORKER_FAILED
                    else f"pulsed escalated: {ev.data.get('reason', '')}", severity="error", event_ids=[ev.id])
            for ev in failures]


def worker_death_issues(crashes: Sequence, hangs: Sequence) -> list[Finding]:
    """Pulse's own workers that died unasked or hung, one finding each kind (pulsed replaced them)."""
    out = []
    for events, what in ((hangs, "hung (silent past hung_after_ms; each replaced)"),
                         (crashes, "exited unasked (a crash or a kill; each restarted)")):
        if events:
            names = [str(ev.target) for ev in events]
            who = ", ".join(f"{name} {times(names.count(name))}" for name in dict.fromkeys(names))
            out.append(Finding(text=f"Pulse's own workers {what}: {who}", severity="warn",
                               event_ids=_ids(ev.id for ev in events)))
    return out


def crash_loops(actions: Sequence[Action]) -> list[Action]:
    """processWatchdog's notifications that a guarded process was held fatal (a crash loop)."""
    return [a for a in actions if a.kind == EffectKind.NOTIFY and a.rule == FATAL_RULE]


def crash_loop_issues(fatal: Sequence[Action]) -> list[Finding]:
    return [Finding(text=f"process {a.target} crash-looped and was held fatal ({a.reason})", severity="error",
                    event_ids=_ids(a.event_ids)) for a in fatal]


def dir_trims_highlight(survival: Sequence[Action]) -> list[Finding]:
    """The watched directories dirGuard kept within bounds: each, how often, what it took away."""
    acked = [a for a in survival if a.kind == EffectKind.TRIM_DIR and a.state == EffectState.ACKED and a.target]
    if not acked:
        return []
    by_dir: dict[str, list[Action]] = {}
    for a in acked:
        by_dir.setdefault(str(a.target), []).append(a)
    said = []
    for path, trims in sorted(by_dir.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:5]:
        over = sorted({b for a in trims for b in (a.why or "").split(",") if b})
        said.append(f"{path} trimmed {times(len(trims))}" + (f" (over {', '.join(over)})" if over else "")
                    + f": {plural(sum(a.removed or 0 for a in trims), 'file')}, "
                    f"{sum(a.freed or 0 for a in trims) / 1048576:.1f} MiB taken away")
    more = f"; and {plural(len(by_dir) - 5, 'more directory', 'more directories')}" if len(by_dir) > 5 else ""
    return [Finding(text="watched directories kept within bounds: " + "; ".join(said) + more, severity="info",
                    event_ids=_ids(i for a in acked for i in a.event_ids))]


def stale_proofs(survival: Sequence[Action]) -> dict[str, list[Action]]:
    """watch name → freshWatch's notifications that it went stale, oldest first."""
    out: dict[str, list[Action]] = {}
    for a in survival:
        if a.kind == EffectKind.NOTIFY and a.rule == FRESH_RULE and a.target and not a.target.endswith(BACK):
            out.setdefault(a.target, []).append(a)
    return out


def still_stale(name: str, notices: Sequence[Action], survival: Sequence[Action]) -> bool:
    """No notification that work was seen again after its last staleness."""
    return not any(a.kind == EffectKind.NOTIFY and a.rule == FRESH_RULE and a.target == name + BACK and a.ts > notices[-1].ts
                   for a in survival)


def stale_proof_issues(survival: Sequence[Action]) -> list[Finding]:
    """One per proof of work that went stale: how often, its last words, the restarts it asked for,
    and whether work was seen again before the window's end."""
    out = []
    for name, notices in stale_proofs(survival).items():
        back = [a for a in survival if a.kind == EffectKind.NOTIFY and a.rule == FRESH_RULE and a.target == name + BACK]
        restarts = [a for a in survival if a.kind == EffectKind.RESTART_PROCESS and a.why == "stale" and a.watch == name]
        stale = still_stale(name, notices, survival)
        text = (f"proof of work {name} went stale" + (f" {times(len(notices))}" if len(notices) > 1 else "")
                + f": {notices[-1].reason or 'no sign of work'}"
                + (f"; {plural(len(restarts), 'restart')} of {restarts[-1].target} for it" if restarts else "")
                + ("; still stale at the window's end" if stale else "; work seen again"))
        out.append(Finding(text=text, severity="error" if stale else "warn",
                           event_ids=_ids(i for a in [*notices, *restarts, *back] for i in a.event_ids)))
    return out


def slow_runs_issue(slow: Sequence[Run]) -> list[Finding]:
    return [Finding(text=f"{plural(len(slow), 'run')} took more than {SLOW_FACTOR:g}× their agent's typical (median) time",
                    severity="info", event_ids=_ids(i for r in slow for i in r.event_ids))] if slow else []


def timeline(runs: Sequence[Run], survival: Sequence[Action], engine_events: Sequence, end: float,
             titles: Mapping[str, str]) -> list[TimelineEntry]:
    """Agent runs (by start), survival's actions, then promotes and rollbacks (by id)."""
    entries = [TimelineEntry(lane=f"agent:{r.agent}", label=f"{named(r.task, titles)} ({r.agent})", start=stamp(r.start),
                             end=stamp(r.end if r.end is not None else max(r.start, end)), outcome=r.outcome,
                             event_ids=_ids(r.event_ids), run=r.run)
               for r in sorted(runs, key=lambda r: r.start)]
    entries += [TimelineEntry(lane="survival", label=_described(a), start=stamp(a.ts),
                              end=stamp(a.end if a.end is not None else a.ts), outcome=a.state,
                              event_ids=_ids(a.event_ids)) for a in survival]
    entries += [TimelineEntry(lane="engine", label=f"{ev.type} {str(ev.data.get('after', ''))[:12]}",
                              start=stamp(ev.ts), end=stamp(ev.ts), outcome=ev.type, event_ids=[ev.id])
                for ev in sorted(engine_events, key=lambda e: e.id)]
    return entries


# -- the analysis -----------------------------------------------------------------------------------------

def runs_by_agent(runs: Iterable[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for run in runs:
        out.setdefault(run.agent, []).append(run)
    return out


def score_of(f: Fold, failed_repairs: Sequence[Action], slow: Sequence[Run], fatal: Sequence[Action] = (),
             stale: int = 0) -> int:
    """100 less each loss, each capped (PENALTIES)."""
    lost = {
        "failed_runs": sum(1 for r in f.runs.values() if r.outcome in ("failed", "given_up")),
        "given_up": len(f.given_up), "failed_repairs": len(failed_repairs), "rollbacks": len(f.rollbacks),
        "gate_blocks": len(f.gate_blocks), "slow_runs": len(slow), "errors": len(latest_of_each_error(f.errors)),
        "worker_failures": len(f.worker_failures), "worker_crashes": len(f.worker_crashes),
        "worker_hangs": len(f.worker_hangs), "crash_loops": len(fatal), "stale_proofs": stale,
    }
    return max(0, 100 - sum(_penalty(what, n) for what, n in lost.items()))


def analyse(events: Sequence, start: float, end: float, *, tasks: Mapping[str, tuple[str, str]] = {},
            project: str | None = None, task: str | None = None) -> Analysis:
    """The analysis of `events` (the window [start, end], already scoped with in_scope).
    `tasks`: task id → (project, title), for tasks created before the window."""
    f = fold(events, start)
    titles = titles_of(events, tasks)
    runs = list(f.runs.values())
    agents = runs_by_agent(runs)
    slow = {name: slow_runs(agent_runs) for name, agent_runs in agents.items()}
    all_slow = [r for agent_runs in slow.values() for r in agent_runs]
    actions = sorted(f.actions.values(), key=lambda a: a.ts)
    # the report's own effect (the daily report) is not something survival did about the host
    survival = [a for a in actions if a.origin == "survival" and a.kind != EffectKind.REPORT]
    failed_repairs = [a for a in survival if is_repair(a) and a.state == EffectState.FAILED]
    fatal = crash_loops(survival)
    stale = stale_proofs(survival)

    cards = [agent_card(name, agents[name], slow[name], start, end) for name in sorted(agents)]
    cards.append(survival_card(survival, f.rollbacks, f.worker_crashes, f.worker_hangs, f.worker_failures))
    cards.append(operator_card(f.operator, [a for a in actions if a.origin == "operator"]))

    issues = [*agent_issues(cards), *given_up_issues(f.given_up, runs, titles), *failed_repair_issues(failed_repairs),
              *rollback_issues(f.rollbacks), *gate_block_issues(f.gate_blocks), *error_issues(f.errors),
              *worker_failure_issues(f.worker_failures), *worker_death_issues(f.worker_crashes, f.worker_hangs),
              *crash_loop_issues(fatal), *stale_proof_issues(survival), *slow_runs_issue(all_slow)]
    highlights = [*agent_highlights(cards), *repairs_highlight(survival), *dir_trims_highlight(survival),
                  *promotes_highlight(f.promotes)]
    highlights += spend_highlights(events)
    highlights += session_spend_highlights(events)
    issues += spend_held_issues(events)
    issues += loop_notice_issues(events)
    if not issues:
        highlights.append(Finding(text="nothing went wrong in the window", severity="info", event_ids=[]))

    score = score_of(f, failed_repairs, all_slow, fatal, len(stale))
    verdict = verdict_of(score)
    stale_at_end = any(still_stale(name, notices, survival) for name, notices in stale.items())
    if verdict == "pass" and (fatal or stale_at_end or any(card.verdict == "fail" for card in cards)):
        verdict = "warn"        # a role failed, a guarded process crash-looped, or nothing is happening: never a pass
    return Analysis(window=Window(start=stamp(start), end=stamp(end), project=project, task=task,
                                  events=len(events)),
                    score=score, verdict=verdict, highlights=highlights, issues=issues, role_analysis=cards,
                    timeline=timeline(runs, survival, f.promotes + f.rollbacks, end, titles))
