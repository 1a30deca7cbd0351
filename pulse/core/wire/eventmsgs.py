"""Events (PUB): committed events, live; every event type, effect kind and event family."""

from __future__ import annotations

import enum
import time
from typing import Any, Literal

import msgspec

from pulse.core.states import EffectState
from pulse.core.wire.effectkinds import EffectKind
from pulse.core.wire.eventtypes import EventType


class EffectEvent(enum.StrEnum):
    """An effect's life in events.db: committed, claimed, ended (one end per EffectState that ends it)."""
    COMMITTED = "effect"
    EXECUTING = "effect-executing"
    ACKED = "effect-acked"
    FAILED = "effect-failed"          # also a failure put back in the queue, marked requeued
    EXPIRED = "effect-expired"


# The event each end of an effect is recorded with.
EFFECT_END_EVENTS = {EffectState.ACKED: EffectEvent.ACKED, EffectState.FAILED: EffectEvent.FAILED,
                     EffectState.EXPIRED: EffectEvent.EXPIRED}
EFFECT_END_STATES = {event: state for state, event in EFFECT_END_EVENTS.items()}   # ... and back


class TaskEvent(enum.StrEnum):
    """A task's life in events.db; pulse.agents.tasks.TRANSITIONS says which moves it between which TaskStatus."""
    CREATED = "task-created"
    ASSIGNED = "task-assigned"
    EXECUTING = "task-executing"
    ACKED = "task-acked"
    FAILED = "task-failed"
    CLOSED = "task-closed"
    GIVEN_UP = "task-given-up"
    RETRIED = "task-retried"        # the operator put a given-up task back to pending (pulsectl task retry)


TASK_EVENTS = tuple(TaskEvent)   # a tuple: `in` works on it (a str `in` the enum class raises on 3.11)


class SpendEvent(enum.StrEnum):
    """The spend ledger (pulse.agents.spend): what each agent run reserved and cost, folded into
    spend per agent and window. reserved/settled: target the agent; held: target the task."""
    RESERVED = "spend-reserved"       # a run's expected cost, in the transaction that claims it
    SETTLED = "spend-settled"         # its real cost, when it ended
    HELD = "spend-held"               # a run not started: it would cross a limit (the task waits)
    ALERT = "spend-alert"             # the operator was told: a limit at 80 % or 100 % in its window
    RESET = "spend-reset"             # the operator forgave an agent's spend so far (pulsectl budget reset)
    # what a session Pulse did not start reported it spent over one flush of the telemetry receiver
    # (target: "session:<id>"); counted against the host's [budget] only when sent with the receiver's token
    OBSERVED = "spend-observed"


SPEND_EVENTS = tuple(SpendEvent)


class ScheduleEvent(enum.StrEnum):
    """A [[schedule]]'s facts (target: its name); pulse.core.schedule folds them."""
    RUN = "schedule-run"              # a slot (or the operator's manual run) made its task or effect
    ARMED = "schedule-armed"          # first seen: slots after this one run

class ProcessAction(enum.StrEnum):
    """An operator's word on a [[process]]: an `operator` event (source pulsectl, target the process,
    data {"action": ...}), committed before the effect that acts on it. After process-stop, survival
    leaves the process down, across restarts of pulsed, until a process-start or process-restart."""
    STOP = "process-stop"
    START = "process-start"
    RESTART = "process-restart"


STOP_PROCESS = EffectKind.STOP_PROCESS
ON_CRASH_LOOP = EffectKind.ON_CRASH_LOOP


# Every type of event Pulse writes (tests/test_wire.py checks the source writes no other).
EVENT_TYPES = frozenset({*EventType, *EffectEvent, *TaskEvent, *SpendEvent, *ScheduleEvent})
DIR_ARCHIVED = EventType.DIR_ARCHIVED
GATE_CALL_EVENTS = (EventType.GATE_CALL, EventType.GATE_BLOCKED)   # a task's gate calls, as task show lists them
FLEET_TASK_OFFERED, FLEET_TASK_UPDATE = EventType.FLEET_TASK_OFFERED, EventType.FLEET_TASK_UPDATE
FLEET_TASK_DEAD = EventType.FLEET_TASK_DEAD
FLEET_TASK_WITHDRAWN = EventType.FLEET_TASK_WITHDRAWN
# the origin's record of one fleet task, as its views fold it
FLEET_TASK_EVENTS = (FLEET_TASK_OFFERED, FLEET_TASK_UPDATE, FLEET_TASK_DEAD, FLEET_TASK_WITHDRAWN)
TELEMETRY = EventType.TELEMETRY
LOOP_NOTICED = EventType.LOOP_NOTICED


class Event(msgspec.Struct):
    type: str
    source: str
    target: str | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    ts: float = 0.0             # wall clock
    mono: float = 0.0           # time.monotonic(), comparable across processes of one boot
    seq: int = 0                # the source process's own sequence number
    id: int | None = None       # assigned by events.db


# eventlog socket: pulsed (PUSH) → the event writer (PULL). Each Event, then, when pulsed stops the
# writer last in an ordered stop, END_OF_EVENTS: nothing follows it, so the writer commits what it
# holds and exits at once instead of lingering for stragglers.
END_OF_EVENTS = "end-of-events"
EventlogMessage = Event | Literal["end-of-events"]


def now_event(type: str, source: str, target: str | None = None, data: dict | None = None, **fields) -> Event:
    """An event stamped now; its data is `data` and/or the keyword fields."""
    return Event(type=type, source=source, target=target, data={**(data or {}), **fields}, ts=time.time(),
                 mono=time.monotonic())
