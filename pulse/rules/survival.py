"""The survival rules: the outer layers of the onion, shipped with Pulse, run in the tick.

Outermost first: panicRollback, autoRollback, processWatchdog, resourceGuard, fileGuard, dirGuard,
freshWatch, llmWatchdog, networkWatchdog, errorEscalate, engineFailedNotice, escalationNotice, dailyReport.
Each is built from config and is a pure function of (prev, curr, inner): all its
memory ("failed N times in a row", "already notified") is in the snapshot, folded
from events.db, so a killed tick forgets nothing. The first two may bypass the
inner chain; the others decorate it: they let the business rules act first, and
add their own effect only where those did not already handle that target (same
kind, same target). No rule re-issues an effect for a target that has one pending.
The two notices tell the operator about Pulse itself: the engine failed, pulsed escalated;
dailyReport sends the day's report at [report] daily_at (the report effect does the work).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

from pulse.core import clock, staleness
from pulse.core.config import MAX_MEMORY_WINDOW_SAMPLES, DirWatch, FileWatch, FreshWatch, Memory, Process, Survival, TickConfig
from pulse.core.states import EffectState, WorkerState
from pulse.core.wire.enginerpc import MAX_TARGET_CHARS, Effect, Outcome, ProcessExit, ProcessStart, Snapshot, Vital
from pulse.core.wire.eventmsgs import EffectKind
from pulse.rules import knowngood, processstate
from pulse.rules.onion import Inner, RuleResult, handled

NOTIFY_DEADLINE_S = 86_400          # once a channel took a notification, the others get a day to take it too
                                    # (until one has, it is kept whatever its deadline: pulse.effects.notify)
MB = 1024 * 1024
EXIT_FACT_WAIT_S = 2.0              # a death of a process whose exit codes matter waits this long for
                                    # its keeper's process-exited fact (it comes in milliseconds)


def _named(name: str):
    def wrap(rule):
        rule.__qualname__ = name
        return rule
    return wrap


def pending_or_handled(curr: Snapshot, effects: Sequence[Effect], kind: str, target: str | None) -> bool:
    return handled(effects, kind, target) or handled(curr.pending, kind, target)


def looked_at(vital: Vital) -> float:
    """When a process-alive sample's look began (`looked_at`), else its ts: a scan that began before a
    restart started the process and ended after it was acked found nothing, yet says nothing new."""
    began = vital.data.get("looked_at")
    if isinstance(began, (int, float)) and not isinstance(began, bool):
        return min(float(began), vital.ts)
    return vital.ts


def notify(curr: Snapshot, rule: str, target: str, title: str, message: str, **extra) -> Effect:
    """A notification, marked with the rule that sent it (the snapshot remembers it per rule and target).
    It may wait a day in the queue: a webhook needs the network, which may be what is down."""
    return Effect(kind=EffectKind.NOTIFY, target=target, origin="survival", idempotent=True,
                  deadline=curr.ts + NOTIFY_DEADLINE_S, params={"rule": rule, "title": title, "message": message, **extra})


def may_notify(curr: Snapshot, rule: str, target: str, every_s: float, since: float | None = None) -> bool:
    """Deduplicated and rate-limited per (rule, target): nothing sent since `since`, nor within every_s."""
    last = curr.notified.get(f"{rule}:{target}")
    if last is None:
        return True
    return (since is None or last < since) and curr.ts - last >= every_s


def failure_streak(outcomes: Iterable[Outcome], kind: str) -> list[Outcome]:
    """The trailing failed outcomes of `kind` (oldest first): the current streak of failures."""
    streak: list[Outcome] = []
    for outcome in reversed([o for o in outcomes if o.kind == kind]):
        if outcome.state == EffectState.ACKED:
            break
        streak.append(outcome)
    return streak[::-1]


def failing_in_a_row(samples: Sequence[Vital], ok: str = "ok") -> int:
    """Trailing samples whose `ok` is false: failed probes in a row (processWatchdog's health,
    llmWatchdog's endpoint)."""
    n = 0
    for sample in reversed(samples):
        if sample.data.get(ok, True):
            break
        n += 1
    return n


def sooner(tick_ms: int | None, ms: int) -> int:
    return ms if tick_ms is None else min(tick_ms, ms)


def roll_back(curr: Snapshot, rule: str, to: str, reason: str, title: str) -> list[Effect]:
    """Roll the engine back to `to`, and say so."""
    return [Effect(kind=EffectKind.ENGINE_ROLLBACK, target="engine", origin="survival",
                   params={"to": to, "rule": rule, "reason": reason}),
            notify(curr, rule, "engine", title, f"{reason}; rolling back to {to[:12]}")]


# -- 1. panicRollback -------------------------------------------------------------------------------

def panic_rollback(config: TickConfig):
    """Survival's own repairs keep failing since a promote, and the engine changed since the last
    known good: roll back to it, notify, and bypass the inner chain this tick. Once per promote.
    It never fights processWatchdog, which keeps retrying on its own."""
    limit = config.survival.panic_failures

    @_named("panic_rollback")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        life = curr.lifecycle
        if (life.promote_id and not life.rolled_back and life.corrective_streak >= limit
                and life.last_known_good and life.last_known_good != life.after
                and not pending_or_handled(curr, (), EffectKind.ENGINE_ROLLBACK, "engine")):
            reason = (f"{life.corrective_streak} survival repairs failed in a row since the promote; "
                      "back to the last known good")
            return roll_back(curr, "panic-rollback", life.last_known_good, reason, "Engine rolled back (panic)"), None
        return await inner(prev, curr)
    return rule


# -- 2. autoRollback --------------------------------------------------------------------------------

def auto_rollback(config: TickConfig):
    """Within the window after a promote, the new engine erred or crashed too often: roll back
    to the commit before the promote and notify. Once per promote."""
    s = config.survival

    @_named("auto_rollback")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        life = curr.lifecycle
        within = life.promote_ts is not None and curr.ts - life.promote_ts <= s.auto_rollback_window_s
        bad = curr.engine.errors >= s.auto_rollback_errors or life.crashes >= s.auto_rollback_crashes
        if (within and bad and not life.rolled_back and life.before
                and not pending_or_handled(curr, (), EffectKind.ENGINE_ROLLBACK, "engine")):
            reason = f"{curr.engine.errors} errors and {life.crashes} crashes within {s.auto_rollback_window_s:g}s of the promote"
            return roll_back(curr, "auto-rollback", life.before, reason, "Engine rolled back"), None
        return await inner(prev, curr)
    return rule


# -- 3. processWatchdog -----------------------------------------------------------------------------

def process_watchdog(config: TickConfig):
    """A configured critical process is dead, or alive but unhealthy: restart it (the executor's
    restart-process stops what is there, then starts it). The one decider of such restarts.

    - Dead: only a death newer than the last restart outcome counts, so a restart that is
      done but not yet seen by the watcher is not issued twice. Its exit, as its keeper recorded
      it (`process-exited`, for a process Pulse started), decides how: one of its
      `stop_exit_codes` means "do not restart me" (notified once, left down); one of its
      `restart_exit_codes` is a restart it asked for (why exit-code, never a failure); anything
      else is a crash. A process whose exit codes matter waits up to EXIT_FACT_WAIT_S for that fact
      (the keeper rings the tick when it is written).
    - Crash loops (pulse.rules.processstate, from the snapshot's `runs`): a crash after a long run is
      restarted at once; a start after which it died within min_uptime_s failed, and after the first
      each start of a streak of failed ones waits restart_backoff (doubling) after the death. At max_restarts failed
      starts within restart_window_s it is held: no more starts, one notification (rule
      process-fatal) with its last exit and output, until an operator starts it. An operator's stop
      (an `operator` event, action process-stop) leaves it alone until a process-start.
    - Unhealthy (`[[process]] health`): `failures` failed probes in a row, every one newer than
      the last restart outcome and outside the process's start period: `start_period_s` after its
      start, or until its first passing probe if that came sooner (a restart starts the count again).
    - Over its memory ceiling (`[[process]] memory`): `for_samples` samples in a row of its tree's
      RSS (`process-memory:<name>`) above `max_mb`, of the pid that runs now and newer than the
      last restart outcome; the restart's params carry the figures and a reason naming them. Its
      growth is watched too: a least-squares slope over `growth_window_s` steeper than
      `growth_mb_per_h` is notified, once per process (pid) and at most every notify_every_s.
    - Stale (`[[watch.fresh]] restart` names it): a watch that saw no work within its within_s, as of
      a sample newer than the last restart outcome and counted from no earlier than the process's
      start (a new copy gets within_s to show work). Its restarts back off as an unhealthy one's do,
      until a sample shows work again.
    - Restarts of an unhealthy process that brought no healthy probe back off by restart_backoff
      too, counted by the `attempt` each restart carries (so without end, up to max_s); those of one
      over its memory ceiling that brought no sample below it, from process_backoff_base_s.
    - After process_notify_after unhelped restarts in a row of an unhealthy process (or one over its
      ceiling, or a dead one with max_restarts 0) it notifies, once per streak, and keeps trying
      slowly. A paused process is left alone, and one an operator stopped (`pulsectl process stop`)
      stays down until they start it.
    - A [[process]] a reload took out (keep_on_remove unset) is stopped once (stop-process, with its
      table as it was: the executor's config no longer has it).
    - Last-known-good config (`[[process]] config`; pulse.rules.knowngood reads the snapshot for
      it). Here rather than in a rule of its own, because undoing an edit is a way of answering a
      process that must be restarted, and this rule alone decides those restarts:
      * alive (and its probe passing) for config_good_after_s since a start after its files last
        changed, and they are not the known-good ones: keep-config.
      * the known-good files changed within config_rollback_window_s, no restore since that change,
        and the process, restarted since the change, is dead or unhealthy again (a crash loop, or
        staying unhealthy), or it exited with one of its stop_exit_codes after the change (its own
        word that its config is bad): restore-config instead of a restart. Only files it kept are
        in it; one restore per change (folded from events), so it never loops.
      * while a restore runs, no restart; once it has written files back, a restart at once (why
        config-restored, no backoff), and a notification with its diff summary (or its failure).
    """
    processes = {p.name: p for p in config.process if p.restart}
    configured = {p.name for p in config.process}
    s = config.survival
    proofs: dict[str, list[FreshWatch]] = {}
    for watch in config.watch.fresh:
        if watch.restart is not None:
            proofs.setdefault(watch.restart, []).append(watch)

    @_named("process_watchdog")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        effects = effects + removed_stops(curr, configured)
        for name, proc in sorted(processes.items()):
            if name in curr.paused or name in curr.stopped:
                continue
            if proc.config:
                effects, settled = after_restore(curr, effects, proc)
                if not settled:
                    continue
            change = knowngood.unrestored_change(proc, curr) if proc.config else None
            history = curr.outcomes.get(name, ())
            last = max((o.ts for o in history if o.kind == EffectKind.RESTART_PROCESS), default=0.0)
            memory = curr.history.get(f"process-memory:{name}", [])
            if proc.memory is not None:
                effects = effects + growth_notice(curr, name, proc.memory, memory_samples(memory, last), s.notify_every_s)
            if pending_or_handled(curr, effects, EffectKind.RESTART_PROCESS, name):
                continue
            runs = curr.runs.get(name)
            if runs is not None and runs.stopped:
                continue        # an operator stopped it: left down (and alone) until an operator starts it
            vital = curr.vitals.get(f"process-alive:{name}")
            params: dict = {}
            started_pid = runs.starts[-1].pid if runs is not None and runs.starts else 0
            known = fresh_exit(curr.exits.get(name), last, started_pid)
            if vital is not None and (known is not None or not vital.data.get("alive", True)
                                      or outlived(vital, curr.exits.get(name), last, started_pid)):
                if known is None and looked_at(vital) <= last:
                    continue   # this death was seen before the last restart ended: wait for a fresh sample
                died = known.ts if known is not None else vital.data.get("dead_since") or vital.ts
                ended = known or exit_of(curr.exits.get(name), vital.data.get("last_pid"), last)
                if ended is None and (proc.restart_exit_codes or proc.stop_exit_codes) and curr.ts < died + EXIT_FACT_WAIT_S:
                    tick_ms = sooner(tick_ms, int((died + EXIT_FACT_WAIT_S - curr.ts) * 1000) + 1)
                    continue
                if ended is not None and ended.code in proc.stop_exit_codes:
                    if change is not None and ended.ts > change.at:
                        effects = effects + [knowngood.restore_effect(proc, change, "stop-exit-code")]
                        continue
                    if may_notify(curr, "process-watchdog", name, 0, ended.ts):
                        effects = effects + [notify(
                            curr, "process-watchdog", name, f"{name} asked not to be restarted",
                            f"{name} (pid {ended.pid}) exited {ended.code}, one of its stop_exit_codes: left down "
                            "until someone starts it", last_error=" | ".join(ended.tail.splitlines()[-3:]) or None)]
                    continue
                if ended is not None and ended.code in proc.restart_exit_codes:
                    effects = effects + [Effect(kind=EffectKind.RESTART_PROCESS, target=name, origin="survival",
                                                params={"why": "exit-code", "code": ended.code, "pid": ended.pid})]
                    continue
                why, limits = "dead", crash_limits(proc, s)
                streak = crash_loop(curr, proc, died, limits)
                attempt, not_before = len(streak), processstate.next_start_at(streak, died, limits)
                if ended is not None:
                    params = {"code": ended.code, "signal": ended.signal, "pid": ended.pid}
            elif proc.health is not None and failing_in_a_row(counted_probes(
                    curr.history.get(f"health:{name}", []), last, vital, proc.health.start_period_s)) >= proc.health.failures:
                why, streak = "unhealthy", unhelped_restarts(history, curr.history.get(f"health:{name}", []))
                attempt, not_before = unhealthy_backoff(curr, name, crash_limits(proc, s))
                failed = curr.history.get(f"health:{name}", [])[-1].data.get("error")
                params = {"reason": f"health: {failed}"} if failed else {}
            elif proc.memory is not None and (over := over_ceiling(memory_samples(memory, last), proc.memory)):
                why, params = "memory", over
                streak = unhelped_restarts(history, memory, ok=lambda v: under_ceiling(v, proc.memory.max_mb))
                attempt = len(streak)
                not_before = streak[-1].ts + clock.backoff(attempt, s.process_backoff_base_s,
                                                           s.process_backoff_max_s) if streak else 0.0
            elif name in proofs and (stale := stale_proof(curr, proofs[name], last, vital)) is not None:
                why, params = "stale", stale
                samples = [v for w in proofs[name] for v in curr.history.get(f"fresh:{w.name}", [])]
                worked = max((staleness.last_work(v.data) for v in samples if v.data.get("changed_at") is not None),
                             default=0.0)
                streak = [o for o in history if o.kind == EffectKind.RESTART_PROCESS and o.ts > worked]
                attempt, not_before = unhealthy_backoff(curr, name, crash_limits(proc, s), "stale",
                                                        lambda since: staleness.worked_since(samples, since))
            else:
                keep = knowngood.keep_effect(proc, curr) if proc.config else None
                if keep is not None and not pending_or_handled(curr, effects, EffectKind.KEEP_CONFIG, name):
                    effects = effects + [keep]
                continue
            if change is not None and why != "stale" and knowngood.restarted_since(history, change.at):
                effects = effects + [knowngood.restore_effect(proc, change, "crash-loop" if why == "dead" else why)]
                continue
            if why == "dead":
                step = way_out_step(curr, proc, streak)
                if held_fatal(curr, name) or processstate.is_fatal(streak, limits) or step == "held":
                    effects = effects + held_effects(curr, proc, streak, limits, step)
                    continue
            probes = curr.history.get(f"health:{name}", [])
            # A crash loop is said once, when it is held fatal; without a limit, after notify_after starts.
            told_at_fatal = why == "dead" and limits.max_restarts > 0
            if (not told_at_fatal and len(streak) >= s.process_notify_after
                    and may_notify(curr, "process-watchdog", name, 0, streak[0].ts)):
                last_error = getattr(streak[-1], "error", None) or (
                    params.get("reason") if why in ("memory", "stale") else probes[-1].data.get("error") if probes
                    else exit_words(curr.exits.get(name)))
                message = f"{len(streak)} restarts of {name} did not help; still trying"
                if why == "unhealthy":
                    # The one cause Pulse cannot tell from a broken tool: a host too loaded for its start period.
                    message += (f"; no health probe has passed since. If {name} is only slow to start here, "
                                f"lengthen its health start_period_s ({proc.health.start_period_s:g} s now)")
                effects = effects + [notify(curr, "process-watchdog", name, STREAK_TITLES[why].format(name=name),
                                            message, last_error=last_error)]
            if curr.ts < not_before:
                tick_ms = sooner(tick_ms, int((not_before - curr.ts) * 1000) + 1)
                continue
            effects = effects + [Effect(kind=EffectKind.RESTART_PROCESS, target=name, origin="survival",
                                        params={"why": why, "attempt": attempt + 1,
                                                **{k: v for k, v in params.items() if v is not None}})]
        return effects, tick_ms
    return rule


def crash_limits(proc: Process, s: Survival) -> processstate.Limits:
    backoff = proc.restart_backoff
    return processstate.Limits(
        min_uptime_s=proc.min_uptime_s, max_restarts=proc.max_restarts, restart_window_s=proc.restart_window_s,
        backoff_base_s=backoff.base_s if backoff is not None else s.process_backoff_base_s,
        backoff_max_s=backoff.max_s if backoff is not None else s.process_backoff_max_s)


def crash_loop(curr: Snapshot, proc: Process, died: float | None, limits: processstate.Limits) -> list[ProcessStart]:
    """The failed starts in a row of `proc` (pulse.rules.processstate.failed_starts), counting the
    death the watcher saw at `died` before its exit fact is folded; an exit by one of its
    restart_exit_codes (a restart it asked for) is no death of a crash loop."""
    runs = curr.runs.get(proc.name)
    if runs is None:
        return []
    asked = [e for e in runs.exits if e.code is not None and e.code in proc.restart_exit_codes]
    if died is not None and any(abs(e.ts - died) <= EXIT_FACT_WAIT_S for e in asked):
        died = None
    exits = [e for e in runs.exits if e not in asked]
    return processstate.failed_starts(runs.starts, exits, died, curr.ts, limits, runs.operator_at)


def held_fatal(curr: Snapshot, name: str) -> bool:
    """`name` was held fatal (its notification committed) and nobody started it since: it stays held
    when the window slides past its crash loop, until an operator starts it."""
    told = curr.notified.get(f"process-fatal:{name}")
    runs = curr.runs.get(name)
    if told is None or runs is None:
        return False
    return told >= max([runs.operator_at, *(st.ts for st in runs.starts)])


def way_out_step(curr: Snapshot, proc: Process, streak: Sequence[ProcessStart]) -> str | None:
    """For a process with an on_crash_loop argv and a crash loop: what its way out is due
    (processstate.way_out); None without either."""
    runs = curr.runs.get(proc.name)
    if not proc.on_crash_loop or not streak or runs is None:
        return None
    return processstate.way_out(runs.starts, streak, runs.way_out_at, runs.way_out_ended, runs.operator_at)


def held_effects(curr: Snapshot, proc: Process, streak: Sequence[ProcessStart], limits: processstate.Limits,
                 step: str | None) -> list[Effect]:
    """What a process held fatal is due. Without an on_crash_loop argv: the one notification. With
    one: the argv once (said in that notification), then one more start at once (no backoff: the
    argv was meant to end the loop), and if that start dies too, held again and said again, with
    what the argv said; nothing more until an operator starts it."""
    name, ended = proc.name, curr.exits.get(proc.name)
    if not streak or step == "wait":
        return []
    runs = curr.runs[name]
    if step == "run":
        return [Effect(kind=EffectKind.ON_CRASH_LOOP, target=name, origin="survival", params={"starts": len(streak)}),
                *fatal_notice(curr, name, streak, limits, ended, way_out=proc.on_crash_loop)]
    if step == "start":
        return [Effect(kind=EffectKind.RESTART_PROCESS, target=name, origin="survival",
                       params={"why": EffectKind.ON_CRASH_LOOP, "attempt": len(streak) + 1})]
    if step == "held":
        after = next(st.ts for st in runs.starts if st.ts > runs.way_out_at)
        return fatal_notice(curr, name, streak, limits, ended, since=after,
                            way_out_said=runs.way_out_said or "it ended")
    return fatal_notice(curr, name, streak, limits, ended)


def unhealthy_backoff(curr: Snapshot, name: str, limits: processstate.Limits, why: str = "unhealthy",
                      helped: Callable[[float], bool] | None = None) -> tuple[int, float]:
    """(restarts for failed probes in a row that no healthy probe followed, when the next may be): each
    waits backoff(n) after the last. The count is carried by the restarts themselves (their
    `attempt`), not by the probes the snapshot keeps, so a process that takes ever longer to come up
    (Hermes' storm guard) is given ever longer, up to max_s, never killed at one cadence for ever.
    The same for restarts of another `why` (stale), whose `helped(since)` says one did help."""
    runs = curr.runs.get(name)
    last = next((st for st in reversed(runs.starts) if st.origin == "survival"), None) if runs else None
    if last is None or last.why != why or last.ts <= runs.operator_at:
        return 0, 0.0
    probes = curr.history.get(f"health:{name}", [])
    if helped(last.ts) if helped is not None else any(probe_ok(v) for v in probes if v.ts > last.ts):
        return 0, 0.0
    n = max(last.attempt, 1)
    return n, last.ts + processstate.backoff(n, limits.backoff_base_s, limits.backoff_max_s)


def exit_words(ended: ProcessExit | None) -> str | None:
    """"exit code 1" / "killed by SIGKILL", or None when no exit is recorded."""
    if ended is None:
        return None
    return f"killed by {ended.signal}" if ended.code is None else f"exit code {ended.code}"


FATAL_TAIL_LINES = 10        # of its output, in the notification that it is held fatal


def fatal_notice(curr: Snapshot, name: str, streak: Sequence[ProcessStart], limits: processstate.Limits,
                 ended: ProcessExit | None, *, since: float | None = None, way_out: Sequence[str] | None = None,
                 way_out_said: str | None = None) -> list[Effect]:
    """The one notification that `name` is held fatal, with its last exit and the last lines of its output.
    Once per crash loop: the loop's first failed start is when it began (`since`: held again after
    its on_crash_loop, once after the start that followed it). `way_out`: the on_crash_loop argv about
    to run; `way_out_said`: how it ended, when the start after it died too."""
    if not may_notify(curr, "process-fatal", name, 0, streak[0].ts if since is None else since):
        return []
    tail = ended.tail.splitlines()[-FATAL_TAIL_LINES:] if ended is not None else []
    words = exit_words(ended)
    if way_out is not None:
        held = f"running its on_crash_loop ({' '.join(way_out)}) once, then one more start"
    elif way_out_said is not None:
        held = (f"its on_crash_loop ran ({way_out_said}) and the start after it died too: held down until an "
                "operator starts it")
    else:
        held = "held down until an operator starts it"
    message = (f"{name} died within min_uptime_s ({limits.min_uptime_s:g} s) of each of its last {len(streak)} "
               f"starts (max_restarts {limits.max_restarts} within {limits.restart_window_s:g} s): {held}"
               + (f"; last {words}" if words else ""))
    if tail:
        message += ". Its last output:\n" + "\n".join(tail)
    extra = {"on_crash_loop": list(way_out)} if way_out is not None else (
        {"on_crash_loop_said": way_out_said} if way_out_said is not None else {})
    return [notify(curr, "process-fatal", name, f"{name} is crash-looping: held fatal", message,
                   code=ended.code if ended else None, signal=ended.signal if ended else None, output=tail,
                   starts=len(streak), reason=f"{len(streak)} starts died within {limits.min_uptime_s:g} s"
                   + (f"; last {words}" if words else ""), **extra)]


def removed_stops(curr: Snapshot, configured: set[str]) -> list[Effect]:
    """A stop-process for each [[process]] a reload took out and nothing has stopped yet."""
    return [Effect(kind=EffectKind.STOP_PROCESS, target=name, origin="survival", idempotent=True,
                   params={"why": "removed", "reload": removed["reload"], "definition": removed["definition"]})
            for name, removed in sorted(curr.removed.items())
            if name not in configured and not any(e.kind == EffectKind.STOP_PROCESS and e.target == name for e in curr.pending)]


RESTORED_BECAUSE = {      # a restore-config's `why`, as its notification says it
    "crash-loop": "changed, and the process crash-looped on it",
    "unhealthy": "changed, and the process stayed unhealthy on it",
    "stop-exit-code": "changed, and the process exited saying its config is bad",
    "operator": "restored by an operator (pulsectl process config --restore)",
}


def kept_words(known) -> str:
    """Where the versions a restore replaced are kept (in objects/, by content: never beside the file,
    where a program that reads every file of its directory would read it too)."""
    if not known.restore_kept:
        return "What was there is kept in objects/ (`pulsectl process config` names it)."
    return "What was there is kept: " + "; ".join(f"{path} as {copy}" for path, copy in sorted(known.restore_kept.items())) + "."


def after_restore(curr: Snapshot, effects: list[Effect], proc) -> tuple[list[Effect], bool]:
    """processWatchdog's part after a restore-config of `proc`: (effects, whether the rest of the rule
    may act on it now). While the restore runs: nothing (the restart would start what it replaces).
    Once it wrote files back: the restart, at once, and a notification with its diff summary; once
    it failed: a notification, and the usual restarts go on."""
    name = proc.name
    if pending_or_handled(curr, effects, EffectKind.RESTORE_CONFIG, name):
        return effects, False
    known = knowngood.known_of(curr, name)
    told = not may_notify(curr, "config-rollback", name, 0, known.restore_at)
    if knowngood.restored_unrestarted(known):
        restart = Effect(kind=EffectKind.RESTART_PROCESS, target=name, origin="survival",
                         params={"why": "config-restored", "restore": known.restore_id})
        notice = [] if told else [notify(
            curr, "config-rollback", name, f"{name}: config restored to its known-good copy",
            f"{', '.join(known.restored)}: {RESTORED_BECAUSE.get(known.restore_why or '', 'restored')}; written back "
            f"as kept known good at {clock.iso(known.kept_at or 0, ms=False)}, restarting {name}. "
            f"{kept_words(known)}\n{known.restore_undone or known.restore_summary or ''}".rstrip(),
            diff=known.restore_undone or known.restore_summary, summary=known.restore_summary, files=known.restored,
            kept=known.restore_kept, why=known.restore_why)]
        return effects + [restart, *notice], False
    if knowngood.restore_failed(known) and not told:
        effects = effects + [notify(curr, "config-rollback", name, f"{name}: its config could not be restored",
                                    f"restoring the known-good config of {name} failed: {known.restore_summary}",
                                    files=known.restored)]
    return effects, True


STREAK_TITLES = {"dead": "{name} does not come back", "unhealthy": "{name} stays unhealthy",
                 "memory": "{name} stays over its memory ceiling", "stale": "{name} still shows no sign of work"}
GROWTH_MIN_SAMPLES = 5          # a growth fit needs this many samples of one pid ...
GROWTH_MIN_SPAN = 0.75          # ... spanning this share of growth_window_s (or the most the tick reads)


def rss_of(sample: Vital) -> float | None:
    rss = sample.data.get("rss_mb")
    return rss if isinstance(rss, (int, float)) and not isinstance(rss, bool) else None


def under_ceiling(sample: Vital, max_mb: float) -> bool:
    rss = rss_of(sample)
    return rss is not None and rss <= max_mb


def memory_samples(samples: Sequence[Vital], since: float) -> list[Vital]:
    """The measured memory samples of the process as it runs now: of the latest sample's pid, and
    newer than `since` (the last restart outcome). A restart starts the count and the fit again."""
    pid = samples[-1].data.get("pid") if samples else None
    if pid is None:
        return []
    return [v for v in samples if v.ts > since and v.data.get("pid") == pid and rss_of(v) is not None]


def over_ceiling(samples: Sequence[Vital], memory: Memory) -> dict | None:
    """The restart's params when the last `for_samples` samples are all above `max_mb`, else None."""
    recent = samples[-memory.for_samples:]
    if len(recent) < memory.for_samples or any(rss_of(v) <= memory.max_mb for v in recent):
        return None
    rss = rss_of(recent[-1])
    return {"rss_mb": rss, "max_mb": memory.max_mb, "samples": memory.for_samples, "pid": recent[-1].data.get("pid"),
            "reason": f"memory: its tree's RSS {rss:g} MB was above max_mb {memory.max_mb:g} for "
                      f"{memory.for_samples} samples in a row"}


def growth_mb_per_h(samples: Sequence[Vital]) -> float:
    """The slope of a least-squares line through (ts, rss_mb), in MB per hour."""
    t0 = samples[0].ts
    xs, ys = [v.ts - t0 for v in samples], [rss_of(v) for v in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return 0.0 if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx * 3600


def memory_trend(samples: Sequence[Vital], memory: Memory, now: float) -> tuple[float, float] | None:
    """(slope in MB/h, seconds it spans) over the samples of the last growth_window_s, once they are
    enough to judge: GROWTH_MIN_SAMPLES over GROWTH_MIN_SPAN of the window, or as many as the tick
    reads. A process's first minutes (its start-up climb) are not a trend until the window is full."""
    window = [v for v in samples if v.ts >= now - memory.growth_window_s]
    if len(window) < GROWTH_MIN_SAMPLES:
        return None
    span = window[-1].ts - window[0].ts
    if span < GROWTH_MIN_SPAN * memory.growth_window_s and len(window) < MAX_MEMORY_WINDOW_SAMPLES:
        return None
    return growth_mb_per_h(window), span


def roughly(seconds: float) -> str:
    """A duration as a person says it: 40 s, 12 min, 3.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def growth_notice(curr: Snapshot, name: str, memory: Memory, samples: Sequence[Vital], every_s: float) -> list[Effect]:
    """A notification that `name`'s tree grows faster than growth_mb_per_h: once per process (its pid's
    start time), at most every `every_s`, with the slope, the figure now and the time left to the ceiling."""
    trend = memory_trend(samples, memory, curr.ts) if memory.growth_mb_per_h > 0 else None
    if trend is None or trend[0] <= memory.growth_mb_per_h:
        return []
    started = samples[-1].data.get("since") or samples[0].ts
    if not may_notify(curr, "process-memory", name, every_s, started):
        return []
    slope, span = trend
    rss = rss_of(samples[-1])
    left = f"; at this rate it reaches max_mb {memory.max_mb:g} in {roughly((memory.max_mb - rss) / slope * 3600)}" \
        if rss < memory.max_mb else f"; above max_mb {memory.max_mb:g} already"
    return [notify(curr, "process-memory", name, f"{name}'s memory keeps growing",
                   f"{name}'s tree grew {slope:.0f} MB/h over the last {span:.0f} s (growth_mb_per_h is "
                   f"{memory.growth_mb_per_h:g}); now {rss:g} MB{left}",
                   rss_mb=rss, growth_mb_per_h=round(slope, 1), max_mb=memory.max_mb)]


def proof_words(watch: FreshWatch) -> str:
    """What a [[watch.fresh]] looks at, as a notification says it."""
    if watch.path is not None:
        return watch.path + (" (and below)" if watch.recursive else "")
    return f"{watch.url}" + (f" field {watch.field}" if watch.field else "")


def stale_proof(curr: Snapshot, watches: Sequence[FreshWatch], last: float, alive: Vital | None) -> dict | None:
    """A restart's params when one of the watches that prove a process's work is stale: its latest
    sample is newer than the last restart outcome (`last`) and saw no work within within_s, counted
    from no earlier than that restart or the process's start."""
    started = alive.data.get("since") if alive is not None and alive.data.get("alive") else None
    not_before = max(last, started if isinstance(started, (int, float)) else 0.0)
    for watch in watches:
        samples = curr.history.get(f"fresh:{watch.name}")
        if not samples or samples[-1].ts <= last:
            continue
        latest = samples[-1]
        if staleness.is_stale(latest.ts, latest.data, watch.within_s, not_before):
            quiet = staleness.looked_at(latest.ts, latest.data) - max(staleness.last_work(latest.data), not_before)
            return {"watch": watch.name, "reason": f"stale: no sign of work in {proof_words(watch)} for "
                                                  f"{roughly(quiet)} (within_s {watch.within_s:g})"}
    return None


def outlived(vital: Vital, ended: ProcessExit | None, since: float, started_pid: int = 0) -> bool:
    """Is what the watcher sees alive older than a death the keeper recorded since the last restart
    outcome? Then it is not the process Pulse started but something that matches it (a look-alike, a
    leftover): the keeper's word is believed, and the process is dead. A clean exit (code 0) is not a
    death: a launcher's, whose server lives on; nor is the exit of another pid than the one the last
    restart started (`started_pid`, 0: not known), which is that restart's own stop of the old copy,
    recorded by its keeper a moment after the new copy started."""
    if ended is None or ended.ts <= since or (ended.code == 0 and ended.signal is None):
        return False
    if started_pid and ended.pid != started_pid:
        return False
    started = vital.data.get("since")
    return (vital.data.get("pid") != ended.pid and isinstance(started, (int, float))
            and started < ended.ts)


def fresh_exit(ended: ProcessExit | None, since: float, started_pid: int) -> ProcessExit | None:
    """The keeper's record of the death of the process the last restart started (`started_pid`),
    after that restart ended: as sure a death as a fresh sample, which may be a watcher interval
    away (the watcher learns a new pid at its next scan), so none is waited for. A clean exit
    (code 0, no signal) is none: a launcher's, whose server lives on."""
    if ended is None or not started_pid or ended.pid != started_pid or ended.ts <= since:
        return None
    return None if ended.code == 0 and ended.signal is None else ended


def exit_of(ended: ProcessExit | None, pid: int | None, since: float) -> ProcessExit | None:
    """The recorded exit of the death the watcher saw: recorded after the last restart outcome, and
    of the same pid (any pid, when the watcher never saw it alive)."""
    if ended is None:
        return None
    if ended.ts <= since:
        return None             # answered by the last restart already
    return ended if pid is None or ended.pid == pid else None


def counted_probes(probes: Sequence[Vital], since: float, alive: Vital | None, start_period_s: float) -> list[Vital]:
    """The health probes that count toward a restart: after the last restart outcome, and not within
    the start period of the process's start (a gateway takes its time to be ready). As Docker's
    start period, it ends at `start_period_s` or at the first probe that passed, whichever is first:
    a process that was ready once and then froze is not given the rest of its start period."""
    started = alive.data.get("since") if alive is not None and alive.data.get("alive") else None
    if started is None:
        return [v for v in probes if v.ts > since]
    # A passing probe of the copy before the last restart says nothing of this one's start (the
    # process-alive sample may still carry that copy's start for a moment after the restart).
    ready = next((v.ts for v in probes if v.ts > max(started, since) and probe_ok(v)), started + start_period_s)
    not_before = max(since, min(started + start_period_s, ready))
    return [v for v in probes if v.ts > not_before]


def probe_ok(probe: Vital) -> bool:
    return bool(probe.data.get("ok", True))


def unhelped_restarts(outcomes: Iterable[Outcome], probes: Sequence[Vital], kind: str = EffectKind.RESTART_PROCESS,
                      ok: Callable[[Vital], bool] = probe_ok) -> list[Outcome]:
    """The restarts (outcomes of `kind`, oldest first) since the last healthy probe (`ok`), or since the
    oldest probe the snapshot keeps when none was healthy: restarts that did not make it healthy."""
    healthy = [v.ts for v in probes if ok(v)]
    since = healthy[-1] if healthy else (probes[0].ts if probes else 0.0)
    return [o for o in outcomes if o.kind == kind and o.ts > since]


# -- 4. resourceGuard -------------------------------------------------------------------------------

def resource_guard(config: TickConfig):
    """Memory or disk above its threshold. The disk: first, every [[watch.file]] file of at least
    disk_trim_min_mb is rotated or truncated (its action; the largest first, each at most once per
    cooldown), and the archive and cleanup wait until those trims have ended. Then, and for memory:
    archive old agent session files and clean up (temp patterns, vitals gc, objects gc). Never
    touches events.db. One round per cooldown; a full disk is also a notification."""
    s = config.survival
    trimmable = [w for w in config.watch.file if w.action != "notify"]

    @_named("resource_guard")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        vital = curr.vitals.get("system-resource")
        if vital is None:
            return effects, tick_ms
        over = [what for what, limit in (("memory", s.memory_pct), ("disk", s.disk_pct))
                if vital.data.get(f"{what}_pct", 0) >= limit]
        if not over:
            return effects, tick_ms
        trimming = False
        if "disk" in over:
            before = len(effects)
            for watch, path, size, sampled_at in watched_files(curr, trimmable, s.disk_trim_min_mb * MB):
                effects, wait_ms = trim(curr, effects, watch, path, size, sampled_at, "disk", s, s.resource_cooldown_s)
                tick_ms = tick_ms if wait_ms is None else sooner(tick_ms, wait_ms)
            trimming = len(effects) > before or any(e.kind == EffectKind.ROTATE_FILE for e in curr.pending)
        target = "+".join(over)
        wanted = []
        if s.archive_from and s.archive_to:
            wanted.append(Effect(kind=EffectKind.ARCHIVE, target=target, origin="survival", params={
                "from": s.archive_from, "to": s.archive_to, "older_than_h": s.archive_age_h}))
        wanted.append(Effect(kind=EffectKind.CLEANUP, target=target, origin="survival", params={
            "patterns": list(s.cleanup), "vitals_gc": True, "objects_gc": True}))
        # the last round of these, not the disk's notification (sent while the trims were still going)
        rounds = {e.kind for e in wanted}
        cooled = all(curr.ts - o.ts >= s.resource_cooldown_s for o in curr.outcomes.get(target, ()) if o.kind in rounds)
        if cooled and not trimming:
            effects = effects + [e for e in wanted if not pending_or_handled(curr, effects, e.kind, target)]
        if "disk" in over and may_notify(curr, "resource-guard", "disk", s.notify_every_s):
            effects = effects + [notify(curr, "resource-guard", "disk", "Disk nearly full",
                                        f"disk at {vital.data.get('disk_pct')} % (threshold {s.disk_pct} %)")]
        return effects, tick_ms
    return rule


# -- 5. fileGuard -----------------------------------------------------------------------------------

def watched_files(curr: Snapshot, watches: Sequence[FileWatch], min_bytes: float):
    """(watch, path, bytes, when sampled) of each file the latest sample of each watch lists at
    more than `min_bytes`, the largest first; not those the watcher marks refused (inside the Pulse
    home), nor a path too long to be an effect's target."""
    found = []
    for watch in watches:
        samples = curr.history.get(f"file:{watch.name}")
        if not samples:
            continue
        for f in samples[-1].data.get("files", []):
            size, path = f.get("bytes", 0), f.get("path", "")
            if size > min_bytes and not f.get("refused") and 0 < len(path) <= MAX_TARGET_CHARS:
                found.append((watch, path, size, samples[-1].ts))
    return sorted(found, key=lambda found: -found[2])


def trim(curr: Snapshot, effects: list[Effect], watch: FileWatch, path: str, size: int, sampled_at: float,
         why: str, s: Survival, cooldown_s: float = 0.0) -> tuple[list[Effect], int | None]:
    """`effects` plus a rotate-file of `path` as `watch` says, unless one is pending or handled, the
    file was not sampled since its last trim (or that was within `cooldown_s`), or the last trims
    failed and their backoff is not over (then also: in how many ms it is). A streak of failed
    trims is notified once."""
    if pending_or_handled(curr, effects, EffectKind.ROTATE_FILE, path):
        return effects, None
    history = curr.outcomes.get(path, ())
    last = max((o.ts for o in history if o.kind == EffectKind.ROTATE_FILE), default=0.0)
    if sampled_at <= last or curr.ts - last < cooldown_s:
        return effects, None
    streak = failure_streak(history, EffectKind.ROTATE_FILE)
    if streak:
        if may_notify(curr, "file-guard", path, 0, streak[0].ts):
            effects = effects + [notify(curr, "file-guard", path, f"{path} could not be trimmed",
                                        f"{watch.action} of {path} failed {len(streak)} time(s): {streak[-1].error}; "
                                        "trying again with backoff")]
        wait = clock.backoff(len(streak), s.process_backoff_base_s, s.process_backoff_max_s)
        if curr.ts < streak[-1].ts + wait:
            return effects, int((streak[-1].ts + wait - curr.ts) * 1000) + 1
    return effects + [Effect(kind=EffectKind.ROTATE_FILE, target=path, origin="survival", params={
        "watch": watch.name, "action": watch.action, "keep": watch.keep, "why": why, "bytes": size,
        "rule": "resource-guard" if why == "disk" else "file-guard"})], None


def file_guard(config: TickConfig):
    """A [[watch.file]] file over its max_mb: rotated (copytruncate, keeping `keep` gzipped copies)
    or truncated, as its action says (rotate-file), or with action notify only notified about (at
    most every notify_every_s per file). It acts on a sample taken after the file's last trim, so a
    trim done but not yet sampled is not issued twice; after a failed trim it waits (doubling from
    process_backoff_base_s) and notifies once per streak. A file inside the Pulse home (the watcher
    marks it refused) is notified about, never trimmed."""
    s = config.survival
    watches = list(config.watch.file)

    @_named("file_guard")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        for watch in watches:
            samples = curr.history.get(f"file:{watch.name}")
            for f in samples[-1].data.get("files", []) if samples else ():
                path, size = f.get("path", ""), f.get("bytes", 0)
                if size <= watch.max_mb * MB or not 0 < len(path) <= MAX_TARGET_CHARS:
                    continue
                if watch.action == "notify" or f.get("refused"):
                    if may_notify(curr, "file-guard", path, s.notify_every_s):
                        left = f"it is {f['refused']}: Pulse never trims it" if f.get("refused") else \
                            "its action is notify: Pulse leaves it as it is"
                        effects = effects + [notify(
                            curr, "file-guard", path, f"{path} is over {watch.max_mb:g} MiB",
                            f"{path} holds {size / MB:.1f} MiB, over max_mb {watch.max_mb:g} of [[watch.file]] "
                            f"{watch.name!r}; {left}", bytes=size)]
                    continue
                effects, wait_ms = trim(curr, effects, watch, path, size, samples[-1].ts, "max_mb", s)
                tick_ms = tick_ms if wait_ms is None else sooner(tick_ms, wait_ms)
        return effects, tick_ms
    return rule


# -- 5b. dirGuard -----------------------------------------------------------------------------------

def dir_guard(config: TickConfig):
    """A [[watch.dir]] directory over one of its bounds (max_files, max_mb, max_age): trim-dir takes
    its oldest files away (deleted or archived, as `oldest` says) until they hold. As fileGuard: on a
    sample taken after the directory's last trim, one at a time per directory, and after a failed
    trim (files still open for writing, say) it waits, doubling from process_backoff_base_s, and
    notifies once per streak. A directory the watcher marks refused (the Pulse home) is notified
    about, never trimmed."""
    s = config.survival
    watches = list(config.watch.dir)

    @_named("dir_guard")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        for watch in watches:
            samples = curr.history.get(f"dir:{watch.name}")
            for d in samples[-1].data.get("dirs", []) if samples else ():
                path, broken = d.get("path", ""), d.get("over") or []
                if not 0 < len(path) <= MAX_TARGET_CHARS:
                    continue
                if d.get("refused"):
                    if may_notify(curr, "dir-guard", path, s.notify_every_s):
                        effects = effects + [notify(curr, "dir-guard", path, f"{path} is not watched",
                                                    f"[[watch.dir]] {watch.name!r} matches {path}, which Pulse "
                                                    f"never trims: {d['refused']}")]
                    continue
                if broken:
                    effects, wait_ms = trim_dir(curr, effects, watch, path, broken, samples[-1].ts, s)
                    tick_ms = tick_ms if wait_ms is None else sooner(tick_ms, wait_ms)
        return effects, tick_ms
    return rule


def trim_dir(curr: Snapshot, effects: list[Effect], watch: DirWatch, path: str, broken: list[str],
             sampled_at: float, s: Survival) -> tuple[list[Effect], int | None]:
    """`effects` plus a trim-dir of `path`, unless one is pending or handled, the directory was not
    sampled since its last trim, or the last trims failed and their backoff is not over (then also:
    in how many ms it is). A streak of failed trims is notified once."""
    if pending_or_handled(curr, effects, EffectKind.TRIM_DIR, path):
        return effects, None
    history = curr.outcomes.get(path, ())
    last = max((o.ts for o in history if o.kind == EffectKind.TRIM_DIR), default=0.0)
    if sampled_at <= last:
        return effects, None
    streak = failure_streak(history, EffectKind.TRIM_DIR)
    if streak:
        if may_notify(curr, "dir-guard", path, 0, streak[0].ts):
            effects = effects + [notify(curr, "dir-guard", path, f"{path} could not be kept within bounds",
                                        f"trim-dir of {path} ([[watch.dir]] {watch.name!r}) failed {len(streak)} "
                                        f"time(s): {streak[-1].error}; trying again with backoff")]
        wait = clock.backoff(len(streak), s.process_backoff_base_s, s.process_backoff_max_s)
        if curr.ts < streak[-1].ts + wait:
            return effects, int((streak[-1].ts + wait - curr.ts) * 1000) + 1
    return effects + [Effect(kind=EffectKind.TRIM_DIR, target=path, origin="survival", idempotent=True, params={
        "watch": watch.name, "why": ",".join(broken), "rule": "dir-guard"})], None


# -- 5c. freshWatch ---------------------------------------------------------------------------------

def fresh_watch(config: TickConfig):
    """A [[watch.fresh]] saw no sign of work within its within_s (a heartbeat file nobody touches, a
    cron's output directory nobody writes, a status counter that stopped): notified once per
    staleness, a staleness being one last sign of work (work seen again, then stopping again, is a
    new one), and once when work is seen again. The process its `restart` names is restarted by
    processWatchdog, the one decider of restarts, with its backoff and crash-loop rules."""
    watches = list(config.watch.fresh)

    @_named("fresh_watch")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        for watch in watches:
            samples = curr.history.get(f"fresh:{watch.name}")
            if not samples:
                continue
            data = samples[-1].data
            if not staleness.is_stale(samples[-1].ts, data, watch.within_s):
                effects = effects + back_notice(curr, effects, watch, data)
                continue
            worked = staleness.last_work(data)
            if handled(effects, EffectKind.NOTIFY, watch.name) or not may_notify(curr, "fresh-watch", watch.name, 0, worked):
                continue
            seen = (f"its last sign of work was at {clock.iso(worked, ms=False)}" if data.get("changed_at") is not None
                    else f"no sign of work since watching began at {clock.iso(worked, ms=False)}")
            then = f"; restarting {watch.restart}" if watch.restart else ""
            error = f" ({data['error']})" if data.get("error") else ""
            effects = effects + [notify(
                curr, "fresh-watch", watch.name,
                f"{watch.name}: no sign of work for {roughly(staleness.looked_at(samples[-1].ts, data) - worked)}",
                f"{proof_words(watch)} did not change within {watch.within_s:g} s: {seen}{error}{then}",
                changed_at=data.get("changed_at"), within_s=watch.within_s, error=data.get("error"),
                restart=watch.restart)]
        return effects, tick_ms
    return rule


def back_notice(curr: Snapshot, effects: Sequence[Effect], watch: FreshWatch, data: dict) -> list[Effect]:
    """A notification that a watch said stale shows work again: once per staleness said."""
    told = curr.notified.get(f"fresh-watch:{watch.name}")
    target = f"{watch.name}:back"
    if told is None or not may_notify(curr, "fresh-watch", target, 0, told) or handled(effects, EffectKind.NOTIFY, target):
        return []
    return [notify(curr, "fresh-watch", target, f"{watch.name}: work seen again",
                   f"{proof_words(watch)} changed at {clock.iso(staleness.last_work(data), ms=False)}, "
                   f"within its {watch.within_s:g} s again", changed_at=data.get("changed_at"))]


# -- 6. llmWatchdog ---------------------------------------------------------------------------------

def llm_watchdog(config: TickConfig):
    """The LLM endpoint's health check failed fail_after times in a row: restart the [[process]]
    that serves it (`[survival.llm] process`) with restart-process, as processWatchdog does (stop,
    then start: no exec timeout kills a proxy it started); notify if the restart does not bring it
    back. The count starts over at each restart, and restarts that did not help back off
    (doubling from process_backoff_base_s). Inactive when no endpoint is configured."""
    llm = config.survival.llm
    s = config.survival
    served_by = next((p for p in config.process if llm is not None and p.name == llm.process), None)
    start_period = served_by.health.start_period_s if served_by is not None and served_by.health else 0.0

    @_named("llm_watchdog")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        if llm is None or llm.process is None:
            return effects, tick_ms
        # A proxy takes its time to come up (LiteLLM: 8-10 s): probes within its [[process]]
        # health.start_period_s of its start do not count, as for processWatchdog.
        probes = counted_probes(curr.history.get(f"network:{llm.target}", []), 0.0,
                                curr.vitals.get(f"process-alive:{llm.process}"), start_period)
        failing = failing_in_a_row(probes)
        if failing < llm.fail_after:
            return effects, tick_ms
        outcomes = curr.outcomes.get(llm.process, ())
        unhelped = unhelped_restarts(outcomes, probes)
        if unhelped and may_notify(curr, "llm-watchdog", llm.process, s.notify_every_s, probes[-failing].ts):
            effects = effects + [notify(curr, "llm-watchdog", llm.process, "LLM endpoint does not come back",
                                        f"{failing} failed health checks of {llm.target} in a row, even after "
                                        f"restarting {llm.process}")]
        last = max((o.ts for o in outcomes if o.kind == EffectKind.RESTART_PROCESS), default=0.0)
        if (failing_in_a_row([v for v in probes if v.ts > last]) >= llm.fail_after
                and not pending_or_handled(curr, effects, EffectKind.RESTART_PROCESS, llm.process)
                and llm.process not in curr.paused and llm.process not in curr.stopped):
            wait = clock.backoff(len(unhelped), s.process_backoff_base_s, s.process_backoff_max_s) if unhelped else 0.0
            if unhelped and curr.ts < unhelped[-1].ts + wait:
                return effects, sooner(tick_ms, int((unhelped[-1].ts + wait - curr.ts) * 1000) + 1)
            effects = effects + [Effect(kind=EffectKind.RESTART_PROCESS, target=llm.process, origin="survival",
                                        params={"why": "endpoint-down", "endpoint": llm.target})]
        return effects, tick_ms
    return rule


# -- 7. networkWatchdog -----------------------------------------------------------------------------

def network_watchdog(config: TickConfig):
    """DNS or outbound HTTP down: notify once when it goes down and once when it recovers, no
    storm in between (the notifications wait for the network in the queue)."""
    names = [t.name for t in config.watch.network if config.survival.llm is None or t.name != config.survival.llm.target]

    @_named("network_watchdog")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        for name in names:
            vital = curr.vitals.get(f"network:{name}")
            if vital is None:
                continue
            down_at = curr.notified.get(f"network-watchdog:{name}:down", 0.0)
            up_at = curr.notified.get(f"network-watchdog:{name}:up", 0.0)
            if handled(effects, EffectKind.NOTIFY, f"{name}:down") or handled(effects, EffectKind.NOTIFY, f"{name}:up"):
                continue
            if not vital.data.get("ok", True) and down_at <= up_at:
                effects = effects + [notify(curr, "network-watchdog", f"{name}:down", f"{name} is down",
                                            vital.data.get("error") or "unreachable")]
            elif vital.data.get("ok", True) and down_at > up_at:
                effects = effects + [notify(curr, "network-watchdog", f"{name}:up", f"{name} is back", "reachable again")]
        return effects, tick_ms
    return rule


# -- 8. errorEscalate -------------------------------------------------------------------------------

def error_escalate(config: TickConfig):
    """Keyword matches in a watched log: notify (rate-limited), and tick faster while they keep coming.

    A sample counts the matches since the sample before, so the rule reads every sample since
    the last tick (the snapshot's history), not only the latest: under load the tick may run
    after a quiet sample has followed the one with the errors."""
    names = [e.name for e in config.watch.error_log]
    s = config.survival

    @_named("error_escalate")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        for name in names:
            since = prev.ts if prev is not None else 0.0
            fresh = [v for v in curr.history.get(f"error-log:{name}", []) if v.ts > since and v.data.get("matches")]
            if not fresh:
                continue
            tick_ms = sooner(tick_ms, s.error_tick_ms)
            if not handled(effects, EffectKind.NOTIFY, name) and may_notify(curr, "error-escalate", name, s.notify_every_s):
                lines = [line for v in fresh for line in v.data.get("lines") or []]
                effects = effects + [notify(curr, "error-escalate", name, f"Errors in {name}",
                                            f"{sum(v.data['matches'] for v in fresh)} matching lines",
                                            lines=lines[-5:])]
        return effects, tick_ms
    return rule


def engine_failed_notice(config: TickConfig):
    """Pulse notifies about itself: the engine went `failed` (once per failure)."""
    @_named("engine_failed_notice")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        failed_at = curr.engine.failed_at
        if curr.engine.state == WorkerState.FAILED and failed_at and may_notify(curr, "engine-failed", "engine", 0, failed_at):
            effects = effects + [notify(curr, "engine-failed", "engine", "Engine failed",
                                        f"the engine crashed {curr.engine.restarts} times; retrying slowly")]
        return effects, tick_ms
    return rule


def escalation_notice(config: TickConfig):
    """Pulse notifies about itself: it escalated (a core worker crash-looped, pulsed exited so the
    service manager would restart it). Said by the next pulsed's tick, once per escalation."""
    @_named("escalation_notice")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        if curr.escalated and may_notify(curr, "escalation", "pulse", 0, curr.escalated):
            effects = effects + [notify(curr, "escalation", "pulse", "Pulse restarted after an escalation",
                                        f"pulsed stopped everything: {curr.escalation}; it is running again")]
        return effects, tick_ms
    return rule


def last_daily_due(now: float, daily_at: str) -> float:
    """The latest wall time at or before `now` whose host-local clock read `daily_at` (HH:MM)."""
    hour, minute = map(int, daily_at.split(":"))
    day = time.localtime(now)
    due = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, hour, minute, 0, 0, 0, -1))
    if due > now:
        due = time.mktime((day.tm_year, day.tm_mon, day.tm_mday - 1, hour, minute, 0, 0, 0, -1))
    return due


def daily_report(config: TickConfig):
    """At [report] daily_at (host local time), the last day's report: one `report` effect whose
    executor writes the page and sends its summary through [[notify]]. Once per day: the last one
    committed is remembered in the snapshot (a pulsed that was down at that hour sends it when it
    is back, and a fresh daily_at sends the one just past at once). Inactive when unset."""
    daily_at = config.report.daily_at

    @_named("daily_report")
    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        if daily_at is None:
            return effects, tick_ms
        due = last_daily_due(curr.ts, daily_at)
        if may_notify(curr, "daily-report", "day", 0, due) and not pending_or_handled(curr, effects, EffectKind.REPORT, "day"):
            effects = effects + [Effect(kind=EffectKind.REPORT, target="day", origin="survival", idempotent=True,
                                        params={"since_s": DAY_S, "notify": True, "rule": "daily-report"})]
        return effects, tick_ms
    return rule


DAY_S = 86_400


def survival_rules(config: TickConfig) -> list:
    """Outermost first."""
    return [panic_rollback(config), auto_rollback(config), process_watchdog(config), resource_guard(config),
            file_guard(config), dir_guard(config), fresh_watch(config), llm_watchdog(config), network_watchdog(config),
            error_escalate(config), engine_failed_notice(config), escalation_notice(config), daily_report(config)]


def counted_keys(config: TickConfig) -> list[str]:
    """Vital keys whose recent samples the snapshot carries: processWatchdog (health probes, memory
    samples) and llmWatchdog count failures in a row, errorEscalate adds up the matches of every
    sample since the last tick, fileGuard and resourceGuard read the latest sizes of the watched
    files, freshWatch and processWatchdog the latest sample of each [[watch.fresh]] (here, whatever
    [tick] sense says)."""
    keys = [f"error-log:{e.name}" for e in config.watch.error_log]
    keys += [f"file:{f.name}" for f in config.watch.file]
    keys += [f"dir:{d.name}" for d in config.watch.dir]
    keys += [f"fresh:{f.name}" for f in config.watch.fresh]
    keys += [f"health:{p.name}" for p in config.process if p.health is not None]
    keys += list(trend_windows(config))
    return keys + ([f"network:{config.survival.llm.target}"] if config.survival.llm else [])


def trend_windows(config: TickConfig) -> dict[str, float]:
    """Vital keys whose samples over a window (seconds) the snapshot carries, beyond the last few:
    processWatchdog fits a process's memory growth over its growth_window_s."""
    return {f"process-memory:{p.name}": p.memory.growth_window_s for p in config.process if p.memory is not None}
