"""The states of a guarded [[process]], and its crash-loop arithmetic: pure functions over facts.

Stdlib only, like supervisord's states.py: processWatchdog decides restarts with these functions and
status shows states made by them, so what status says ("backoff until 12:00:07", "fatal") is what
the rule does. The facts, folded from events.db and vitals by the tick:

- starts: each restart-process that ended, oldest first (`ts` of its outcome, `ok`, `origin`, `why`,
  `attempt`, the `pid` it started, when it was `asked`): a start acked is the process running after
  its start_grace_s; one failed died within it.
- exits: the process's recorded exits, oldest first (`ts`, `pid`, `code`, `signal`, `tail`).
- the latest process-alive sample, its recent health probes, pauses and an operator's stop.

A start FAILED when its restart failed, or when the process it started (its pid) died within
min_uptime_s of it (the newcomer's process that exits 1 three seconds after each start); a run
ended by a restart that did not answer its death (an exit code it asked a restart by, its probes,
its memory, an operator) is not judged. A start that ran
min_uptime_s without dying ends a streak. Failed starts in a row, within restart_window_s and
since an operator last started it, are its crash loop: after the first the next start is at once
(as for a worker), then each waits backoff(n - 1) after the death, and at max_restarts it is held
`fatal` until an operator starts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from pulse.core.states import ProcessState


class Start(Protocol):
    ts: float
    ok: bool
    origin: str
    why: str | None
    pid: int                    # the process it started (0: not known)
    asked: float                # when the restart was committed (0: not known)


class Exit(Protocol):
    ts: float
    pid: int


# The restarts that answer a death: the run before one of these ended by dying. Any other restart
# (for its probes, its memory, its config, an exit code it asked by, an operator's) cut it short.
AFTER_A_DEATH = frozenset({"dead", None})


@dataclass(frozen=True)
class Limits:
    """A [[process]]'s crash-loop settings (pulse.core.config.Process), as plain numbers."""
    min_uptime_s: float
    max_restarts: int
    restart_window_s: float
    backoff_base_s: float
    backoff_max_s: float


def backoff(attempt: int, base_s: float, max_s: float) -> float:
    """The wait before start number `attempt` (1, 2, 3 …) of a streak: base, 2×base, 4×base … at most max."""
    return 0.0 if attempt <= 0 else min(base_s * 2 ** (attempt - 1), max_s)


def start_failed(start: Start, next_start: Start | None, death: float | None, now: float,
                 min_uptime_s: float) -> bool | None:
    """True: the start failed (its restart failed, or its process died within min_uptime_s of it);
    False: the process outlived min_uptime_s; None: neither (it runs, younger than that; or a
    restart that did not answer a death cut it short). `death`: when its process died, if known."""
    if not start.ok:
        return True
    answered_a_death = next_start is None or (next_start.origin == "survival" and next_start.why in AFTER_A_DEATH)
    if not answered_a_death:
        cut = next_start.asked or next_start.ts
        return False if cut - start.ts >= min_uptime_s else None
    if death is not None:
        return death - start.ts < min_uptime_s
    if next_start is not None:          # its exit was not recorded (not Pulse's child): until the next start
        return (next_start.asked or next_start.ts) - start.ts < min_uptime_s
    return False if now - start.ts >= min_uptime_s else None


def death_of(start: Start, next_start: Start | None, exits: Sequence[Exit], died: float | None) -> float | None:
    """When the process a start started died: its recorded exit (by pid), else the watcher's death
    (`died`) for the last start."""
    if start.pid:
        recorded = [e.ts for e in exits if e.pid == start.pid and e.ts > start.ts - 1]
        if recorded:
            return min(recorded)
    else:
        until = (next_start.asked or next_start.ts) if next_start is not None else float("inf")
        recorded = [e.ts for e in exits if start.ts < e.ts < until]
        if recorded:
            return min(recorded)
    return died if next_start is None and died is not None and died > start.ts - 1 else None


def failed_starts(starts: Sequence[Start], exits: Sequence[Exit], died: float | None, now: float, limits: Limits,
                  since: float = 0.0) -> list[Start]:
    """The crash loop: the trailing failed starts (oldest first), within restart_window_s of `now`
    and after `since` (an operator's start). A start that outlived min_uptime_s ends it; one that
    cannot be judged (the run going on now, or one cut short by a restart) is passed over.
    `exits`: the recorded exits that count (not those a process asked a restart by); `died`: the
    death the watcher saw of the process that runs last, before its exit is recorded."""
    streak: list[Start] = []
    horizon = max(since, now - limits.restart_window_s)
    next_start = None
    for start in reversed(starts):
        if start.ts <= horizon:
            break
        failed = start_failed(start, next_start, death_of(start, next_start, exits, died), now, limits.min_uptime_s)
        next_start = start
        if failed is False:
            break       # it ran long enough: the loop, if any, ended here
        if failed:
            streak.append(start)
    return streak[::-1]


def is_fatal(streak: Sequence[Start], limits: Limits) -> bool:
    return limits.max_restarts > 0 and len(streak) >= limits.max_restarts


def way_out(starts: Sequence[Start], streak: Sequence[Start], ran_at: float, ended_at: float,
            operator_at: float) -> str:
    """What a process held fatal, with an on_crash_loop argv, is due: "run" the argv (not run for this
    crash loop yet: its streak began after the last run, or an operator started it since), "wait" for
    it to end, "start" (the one more start after it), or "held" (that start failed too: held until an
    operator starts it). `ran_at`/`ended_at`: when the last on_crash_loop run was committed and ended
    (0: never, not yet)."""
    first_after = next((st for st in starts if st.ts > ran_at), None)
    for_this_loop = ran_at > operator_at and bool(streak) and (
        ran_at >= streak[0].ts or any(st is first_after for st in streak))
    if not for_this_loop:
        return "run"
    if ended_at < ran_at:
        return "wait"
    return "start" if first_after is None else "held"


def next_start_at(streak: Sequence[Start], died: float, limits: Limits) -> float:
    """When a process that died at `died` may be started again: at once after a long run and after
    the first failed start (as pulsed restarts its workers), then backoff(n - 1) after its death."""
    return died + backoff(len(streak) - 1, limits.backoff_base_s, limits.backoff_max_s)


@dataclass
class View:
    """A process's state and what status shows beside it."""
    state: ProcessState
    why: str = ""
    until: float | None = None          # backoff: the next start; starting: when it counts as running
    started: float | None = None        # the running process's start (wall clock)


def project(*, now: float, alive: bool | None, started: float | None, died: float | None,
            restarting: bool, guarded: bool, stopped: bool, paused_until: float | None,
            streak: Sequence[Start], held: bool, limits: Limits, last_exit: str | None,
            probes_failing: int, failures: int | None, healthy_since_start: bool,
            start_period_s: float, asked_not_to_restart: bool) -> View:
    """The state of one process from its facts.

    alive/started/died: the latest process-alive sample; restarting: a restart-process of it is
    pending; guarded: processWatchdog restarts it (it has a restart argv); stopped: an operator
    stopped it; streak: failed_starts(); held: it was held fatal and nobody started it since;
    last_exit: its last exit in words; probes_failing: its
    counted health probes failed in a row (failures: how many make it unhealthy; None: no probe);
    healthy_since_start: a probe passed since it started; asked_not_to_restart: its last exit was
    one of its stop_exit_codes."""
    if alive is None:
        return View(ProcessState.UNKNOWN, "not sampled yet")
    if paused_until is not None and paused_until > now:
        return View(ProcessState.PAUSED, "survival leaves it alone", until=paused_until,
                    started=started if alive else None)
    if not alive:
        if stopped:
            return View(ProcessState.STOPPED, "stopped by an operator")
        if restarting:
            return View(ProcessState.STARTING, "being restarted")
        if not guarded:
            return View(ProcessState.DEAD, "not running; it has no restart argv: Pulse does not start it"
                        + (f" (last {last_exit})" if last_exit else ""))
        if asked_not_to_restart:
            return View(ProcessState.DEAD, f"{last_exit}, one of its stop_exit_codes: left down until someone starts it")
        if held or is_fatal(streak, limits):
            return View(ProcessState.FATAL, f"{max(len(streak), limits.max_restarts)} starts in a row died within "
                        f"min_uptime_s {limits.min_uptime_s:g} s: held down until an operator starts it"
                        + (f"; last {last_exit}" if last_exit else ""))
        if streak:
            at = next_start_at(streak, died if died is not None else now, limits)
            if at > now:
                held = f" (held fatal at max_restarts {limits.max_restarts})" if limits.max_restarts else ""
                return View(ProcessState.BACKOFF, f"died within min_uptime_s of {len(streak)} starts in a row{held}"
                            + (f"; last {last_exit}" if last_exit else ""), until=at)
        return View(ProcessState.STARTING, "dead; being restarted" + (f" (last {last_exit})" if last_exit else ""))
    if failures is not None and probes_failing >= failures:
        return View(ProcessState.UNHEALTHY, f"{probes_failing} failed health probes in a row", started=started)
    settle = [started + limits.min_uptime_s] if started is not None else []
    if failures is not None and not healthy_since_start and started is not None:
        settle.append(started + start_period_s)
    until = max(settle, default=None)
    if until is not None and now < until:
        return View(ProcessState.STARTING, "within min_uptime_s of its start" if until == settle[0]
                    else "within its health start_period_s", until=until, started=started)
    return View(ProcessState.RUNNING, "", started=started)
