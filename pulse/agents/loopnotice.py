"""A loop seen and said, not ended: a `loop-noticed` fact and a `notify` effect, in one transaction.

Two places notice a loop without ending it: the watch of a run whose agent has on_loop = "notice"
(pulse.agents.runguards.LoopGuard), and the telemetry worker for a session Pulse did not start
(pulse.workers.telemetry: Pulse never ends what it did not start). Both say it here, so the
operator reads one kind of fact and gets one kind of notification ([[notify]], rule `loop`).
"""

from __future__ import annotations

from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import LOOP_NOTICED, EffectKind, now_event
from pulse.store import effectqueue, eventsdb
from pulse.store.connection import Transaction

RULE = "loop"
NOTIFY_DEADLINE_S = 86400.0     # a notification may wait a day for a channel (as survival's)


def records(target: str, data: dict, source: str, title: str):
    """(the fact, its notification) for a loop noticed on `target` (a task, or session:<id>)."""
    fact = now_event(LOOP_NOTICED, source, target, data)
    note = Effect(kind=EffectKind.NOTIFY, target=target, idempotent=True, params={
        "rule": RULE, "level": "warning", "title": title, "message": f"{title}: {data.get('detail', '')}",
        **{k: v for k, v in data.items() if k in ("run", "task", "agent", "session", "api_requests", "tool_calls",
                                                   "per_min")}})
    return fact, note


def write(conn, target: str, data: dict, source: str, title: str) -> None:
    """The fact and its notification, committed together (the caller's connection, a transaction of its own)."""
    fact, note = records(target, data, source, title)
    with Transaction(conn):
        eventsdb.insert_event(conn, fact)
        effectqueue.insert_effect(conn, effectqueue.new_effect(note, source, NOTIFY_DEADLINE_S), source)
