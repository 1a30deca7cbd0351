"""Schedules (`[[schedule]]`): when each one is due, and what it has run, folded from events.db.

A schedule's slots are the times it should run: the matches of a cron expression in host-local
time (read by croniter, the well-kept parser, never by hand), or the multiples of `every` since
the Unix epoch, so that every process, before or after a restart, computes the same slots. A slot
is due `jitter` after its time: a fraction of `jitter_s` drawn from a hash of (name, slot), the
same each time it is computed, so a restart never moves it.

Every run is a `schedule-run` event (target: the schedule's name; data: its slot, and the task or
effect it made), committed in the one transaction that creates that task or effect
(pulse.store.schedulerun). What has run is the fold of those events (`ScheduleBook`), so a tick
killed at any point neither runs a slot twice nor forgets one. A schedule seen for the first time
is armed (`schedule-armed`, at the slot just past) instead of run: its first run is its next slot.

Everything here is pure but `cron_*`, which read the host's time zone.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Iterable

import msgspec

from pulse.core.config.schedules import Schedule, parse_every
from pulse.core.digest import sha256
from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import EffectEvent, ScheduleEvent, TaskEvent

RUN, ARMED = ScheduleEvent.RUN, ScheduleEvent.ARMED     # the two facts a schedule's history is
# The events the fold reads: its own two, and the ends of the tasks and effects its runs made (ok or not).
TASK_ENDS = {TaskEvent.ACKED: True, TaskEvent.GIVEN_UP: False, TaskEvent.CLOSED: None}   # closed: ended, no verdict
EFFECT_ENDS = {EffectEvent.ACKED: True, EffectEvent.FAILED: False, EffectEvent.EXPIRED: False}
FOLDED = frozenset({RUN, ARMED, *TASK_ENDS, *EFFECT_ENDS})


def _cron(expr: str, t: float):
    from croniter import croniter
    from dateutil.tz import tzlocal  # croniter's own dependency: the zone's rules, DST included
    return croniter(expr, datetime.fromtimestamp(t, tz=tzlocal()))


def cron_at_or_before(expr: str, t: float) -> float:
    # croniter's get_prev is strictly before its start; cron slots are whole seconds, so a start a
    # millisecond later finds a slot at exactly t
    return _cron(expr, t + 0.001).get_prev(float)


def cron_after(expr: str, t: float) -> float:
    return _cron(expr, t).get_next(float)


def slot_at_or_before(s: Schedule, t: float) -> float:
    if s.cron is not None:
        return cron_at_or_before(s.cron, t)
    every = parse_every(s.every)
    return math.floor(t / every) * every


def slot_after(s: Schedule, t: float) -> float:
    if s.cron is not None:
        return cron_after(s.cron, t)
    every = parse_every(s.every)
    return (math.floor(t / every) + 1) * every


def jitter(name: str, slot: float, jitter_s: float) -> float:
    """The slot's delay within [0, jitter_s): from a hash, so every computation agrees."""
    if jitter_s <= 0:
        return 0.0
    hashed = sha256(f"{name}\0{slot:.3f}".encode()).digest()
    return int.from_bytes(hashed[:8], "big") / 2**64 * jitter_s


# -- what to do now --------------------------------------------------------------------------------

class Step(msgspec.Struct, frozen=True):
    """What a schedule needs now: `run` its slot, `arm` it (first seen), `skip` its slot (its last run
    is still open and it does not catch up), or nothing (None)."""
    action: str            # "run" | "arm" | "skip"
    slot: float
    late_s: float          # how long after the slot's due time this is


def due_slot(s: Schedule, now: float) -> float:
    """The latest slot whose due time (slot + jitter) is at or before `now`."""
    slot = slot_at_or_before(s, now)
    if slot + jitter(s.name, slot, s.jitter_s) > now:
        slot = slot_at_or_before(s, slot - 0.001)
    return slot


def next_step(s: Schedule, last_slot: float | None, now: float, open_run: str | None = None) -> Step | None:
    """The step for schedule `s`, given the last slot it ran or was armed at. Only the latest due
    slot is ever run: after downtime, with catch_up, the missed slots are one run, not one each;
    without catch_up, a slot more than grace_s late is skipped (the next one runs on time).

    At most one run of a schedule is open at a time, as a systemd timer never queues a second start
    behind a running one: while `open_run` (its last run's task or effect) has not ended, a due slot
    waits with catch_up (the slots that fall due meanwhile are one run, once it ends: the same rule
    as after downtime) and is skipped, and counted, without it; `overlap` runs it anyway."""
    slot = due_slot(s, now)
    late = now - (slot + jitter(s.name, slot, s.jitter_s))
    if last_slot is None:
        return Step("arm", slot, late)
    if slot <= last_slot:
        return None
    if not s.catch_up and late > s.grace_s:
        return None
    if open_run is not None and not s.overlap:
        return None if s.catch_up else Step("skip", slot, late)
    return Step("run", slot, late)


def next_due(s: Schedule, last_slot: float | None, now: float, open_run: str | None = None) -> float:
    """When the schedule next has something to do: now if a slot is due and unrun, else its next slot's
    due time (a slot held behind an open run runs when that run ends, which wakes no timer)."""
    if next_step(s, last_slot, now, open_run) is not None:
        return now
    slot = slot_at_or_before(s, max(now, last_slot if last_slot is not None else now))
    if (last_slot is not None and slot <= last_slot) or slot + jitter(s.name, slot, s.jitter_s) <= now:
        slot = slot_after(s, slot)    # run (or skipped as too late): the one after it is next
    return slot + jitter(s.name, slot, s.jitter_s)


# -- the fold --------------------------------------------------------------------------------------

class ScheduleState(msgspec.Struct, kw_only=True):
    """One schedule, as its events say (`pulsectl schedule list --json` prints it)."""
    name: str
    last_slot: float | None = None         # the latest slot run (or armed at): later ones are due
    armed_at: float | None = None          # when it was first seen
    last_run_ts: float | None = None       # when its latest run (slot or manual) was committed
    last_run: str | None = None            # that run's task or effect id
    runs: int = 0
    manual_runs: int = 0
    last_outcome: str | None = None        # "ok" | "failed", of the latest run that ended
    failures_in_row: int = 0               # runs that ended failed, since the last that ended well
    last_failure_ts: float | None = None
    open_run: str | None = None            # its latest run's task or effect while it has not ended
    skipped: int = 0                       # slots skipped because a run was still open (catch_up = false)
    last_skipped_ts: float | None = None


class ScheduleBook(msgspec.Struct):
    """Every schedule's state, folded event by event; `open` maps a run's task or effect id to its schedule.
    (A Struct, not a dataclass: `pulsectl schedule list` would import dataclasses, and inspect with it, ~8 ms.)"""
    states: dict[str, ScheduleState] = {}     # msgspec copies an empty default for each book
    open: dict[str, str] = {}

    def of(self, name: str) -> ScheduleState:
        if name not in self.states:
            self.states[name] = ScheduleState(name=name)
        return self.states[name]

    def last_slot(self, name: str) -> float | None:
        state = self.states.get(name)
        return state.last_slot if state else None

    def fold(self, events: Iterable) -> None:
        for ev in events:
            if ev.type in FOLDED:
                self.fold_one(ev)

    def fold_one(self, ev) -> None:
        if ev.type in (RUN, ARMED):
            self._run(ev)
            return
        run = ev.target if ev.type in TASK_ENDS else ev.data.get("effect_id")
        if run not in self.open or (ev.type == EffectEvent.FAILED and ev.data.get("requeued")):
            return
        state = self.of(self.open.pop(run))
        if state.open_run == run:
            state.open_run = None
        ok = TASK_ENDS.get(ev.type, EFFECT_ENDS.get(ev.type))
        if ok is None:           # closed by the operator: it ended, with no verdict on the schedule
            return
        state.last_outcome = "ok" if ok else "failed"
        state.failures_in_row = 0 if ok else state.failures_in_row + 1
        if not ok:
            state.last_failure_ts = ev.ts

    def _run(self, ev) -> None:
        state = self.of(ev.target or "")
        slot = ev.data.get("slot")
        if isinstance(slot, (int, float)) and not ev.data.get("manual"):
            state.last_slot = max(slot, state.last_slot if state.last_slot is not None else slot)
        if ev.type == ARMED:
            state.armed_at = state.armed_at or ev.ts
            return
        if ev.data.get("skipped"):
            state.skipped += 1
            state.last_skipped_ts = ev.ts
            return
        run = ev.data.get("task") or ev.data.get("effect")
        state.last_run_ts, state.last_run = ev.ts, run
        if ev.data.get("manual"):
            state.manual_runs += 1
        else:
            state.runs += 1
        if run:
            self.open[run] = state.name
            state.open_run = run

    def open_run(self, name: str) -> str | None:
        state = self.states.get(name)
        return state.open_run if state else None


def rows(schedules: list[Schedule], book: ScheduleBook, now: float) -> list[dict]:
    """One dict per configured schedule: its spec, what it makes, its next run, its state (last run,
    runs, the run it waits on, slots skipped, failures): `pulsectl schedule list --json` and the page."""
    out = []
    for s in schedules:
        state = book.states.get(s.name) or ScheduleState(name=s.name)
        out.append({**msgspec.to_builtins(state), "spec": {"cron": s.cron} if s.cron else {"every": s.every},
                    "makes": "task" if s.task is not None else f"effect {s.effect.kind}",
                    "next_run": next_due(s, state.last_slot, now, state.open_run),
                    "failing": failing(state, s.notify_after)})
    return out


def task_fields(s: Schedule, slot: float | None) -> dict:
    """The task-created data of a run of `s` (slot None: a manual run). Its `agent` pins the task to
    that agent, as `pulsectl task add --agent` does (the `pin` field routing reads)."""
    t = s.task
    return {"project": t.project, "title": t.title, "prompt": t.prompt, "priority": t.priority, "schedule": s.name,
            **({"slot": slot} if slot is not None else {}), **({"pin": t.agent} if t.agent else {})}


def effect_of(s: Schedule):
    """The effect a run of `s` commits (its id and times are given at commit)."""
    return Effect(kind=s.effect.kind, target=s.effect.target, params=dict(s.effect.params))


def failing(state: ScheduleState, notify_after: int) -> bool:
    """Its runs keep failing: at least `notify_after` in a row ended failed (0: never said)."""
    return notify_after > 0 and state.failures_in_row >= notify_after
