"""The effect queue: effects live in events.db as events (effect, effect-executing, effect-acked,
effect-failed, effect-expired) plus one mutable row per effect in `effects`, the queue's index,
changed in the same transaction as the event it mirrors. Claims are compare-and-set.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Callable, Sequence

import msgspec

from pulse.core.states import EFFECT_OPEN, EffectState
from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import (
    EFFECT_END_EVENTS,
    EffectEvent,
    EffectKind,
    Event,
    EventType,
    ProcessAction,
    now_event,
)
from pulse.store.connection import Transaction
from pulse.store.eventsdb import insert_event

# -- effects -----------------------------------------------------------------------------------------

def new_effect(effect: Effect, origin: str, deadline_s: float, now: float | None = None) -> Effect:
    """Give an effect its id, times and origin (it is committed next)."""
    now = time.time() if now is None else now
    return msgspec.structs.replace(effect, id=effect.id or os.urandom(16).hex(), created=now,
                                   deadline=effect.deadline or now + deadline_s, origin=origin)


def commit_effects(conn: sqlite3.Connection, effects: Sequence[Effect], source: str,
                   events: Sequence[Event] = (), observe_only: bool = False) -> list[Effect]:
    """Commit effects (and any other events) in one transaction. observe_only: record each as
    effect-expired with reason observe-only in the same transaction, so nothing runs it."""
    with Transaction(conn):
        for ev in events:
            insert_event(conn, ev)
        for eff in effects:
            insert_effect(conn, eff, source, observe_only)
    return list(effects)


ACTS_ON_PROCESS = {ProcessAction.STOP: EffectKind.STOP_PROCESS, ProcessAction.START: EffectKind.RESTART_PROCESS,
                   ProcessAction.RESTART: EffectKind.RESTART_PROCESS}


def commit_process_action(conn: sqlite3.Connection, name: str, action: ProcessAction, deadline_s: float,
                          source: str) -> Effect:
    """An operator's word on a [[process]] (pulsectl process, the page): the `operator` event and the
    effect that acts on it (origin operator), in one transaction, the event first, so the tick holds
    a stopped process down before its stop runs."""
    effect = new_effect(Effect(kind=ACTS_ON_PROCESS[action], target=name, params={"why": "operator"},
                               idempotent=action == ProcessAction.STOP), "operator", deadline_s)
    commit_effects(conn, [effect], source, events=[now_event(EventType.OPERATOR, source, name, action=str(action))])
    return effect


def insert_effect(conn: sqlite3.Connection, eff: Effect, source: str, observe_only: bool = False) -> None:
    """One effect, its event and its queue row, inside the caller's transaction."""
    ev = insert_event(conn, now_event(EffectEvent.COMMITTED, source, eff.target, msgspec.to_builtins(eff)))
    conn.execute(
        "INSERT INTO effects (id, event_id, kind, target, origin, idempotent, created, deadline, state, body) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
        (eff.id, ev.id, eff.kind, eff.target, eff.origin, int(eff.idempotent), eff.created, eff.deadline,
         msgspec.msgpack.encode(eff)))
    if observe_only:
        conn.execute("UPDATE effects SET state = 'expired', why = 'observe-only' WHERE id = ?", (eff.id,))
        insert_event(conn, now_event(EffectEvent.EXPIRED, source, eff.target, effect_id=eff.id, kind=eff.kind,
                                      reason="observe-only"))


def _effect(body: bytes) -> Effect:
    return msgspec.msgpack.decode(body, type=Effect)


# SQLite uses the partial index effects_open only for a query whose WHERE holds the index's own term
# word for word: it does not infer it from `state IN (?)`. Without it, each of the executor's scans
# read and sorted every effect ever committed (0.2 s a scan at 1.2 M effects: the executor busy all
# the time on a year-old host).
OPEN_TERM = "state IN ('pending', 'executing')"
assert set(EFFECT_OPEN) == {"pending", "executing"}, "OPEN_TERM and the index effects_open follow EFFECT_OPEN"


def _states_term(states: Sequence[str]) -> str:
    term = f"state IN ({','.join('?' * len(states))})"
    return f"{OPEN_TERM} AND {term}" if set(states) <= set(EFFECT_OPEN) else term


def open_effects(conn: sqlite3.Connection, state: str | None = None,
                 limit: int = 1000) -> list[tuple[Effect, str, str | None, int | None]]:
    """(effect, state, claimer, pgid) of effects not yet ended, oldest first (by the index effects_open)."""
    states = (state,) if state else EFFECT_OPEN
    if not set(states) <= set(EFFECT_OPEN):
        raise ValueError(f"open_effects: {state!r} is not an open state ({', '.join(EFFECT_OPEN)})")
    rows = conn.execute(
        f"SELECT body, state, claimer, pgid FROM effects WHERE {_states_term(states)} ORDER BY created LIMIT ?",
        (*states, limit))
    return [(_effect(r[0]), r[1], r[2], r[3]) for r in rows]


def effect_of(conn: sqlite3.Connection, effect_id: str) -> Effect | None:
    """One effect as committed, by its id."""
    row = conn.execute("SELECT body FROM effects WHERE id = ?", (effect_id,)).fetchone()
    return _effect(row[0]) if row else None


class Held(str):
    """claim_effect's answer when `reserve` held the effect back: why (it stays pending, unclaimed)."""


def claim_effect(conn: sqlite3.Connection, effect_id: str, claimer: str, source: str,
                 reserve: Callable[[sqlite3.Connection, Effect], str | None] | None = None) -> Effect | Held | None:
    """pending → executing, atomically: None if someone else claimed it first.

    reserve (an agent-run's spend limits): called in the same transaction once the effect is seen
    pending; it may write (a reservation, or why it is held) and returns None to go on with the
    claim, or why not: then what it wrote commits, the effect stays pending, and Held(why) is returned."""
    with Transaction(conn):
        if reserve is not None:
            row = conn.execute("SELECT body FROM effects WHERE id = ? AND state = 'pending'", (effect_id,)).fetchone()
            if row is None:
                return None
            held = reserve(conn, _effect(row[0]))
            if held is not None:
                return Held(held)
        cur = conn.execute("UPDATE effects SET state = 'executing', claimer = ? WHERE id = ? AND state = 'pending'",
                           (claimer, effect_id))
        if cur.rowcount != 1:
            return None
        body, target = conn.execute("SELECT body, target FROM effects WHERE id = ?", (effect_id,)).fetchone()
        effect = _effect(body)
        insert_event(conn, now_event(EffectEvent.EXECUTING, source, target, effect_id=effect_id, kind=effect.kind,
                                      claimer=claimer))
        return effect


# The pgid of a claim whose process is being started, its group not known yet: an executor that dies
# before it records the group may have started the process all the same (the child can run before
# Popen returns), so its successor must not say the effect never ran.
SPAWNING = 0


def record_pgid(conn: sqlite3.Connection, effect_id: str, pgid: int) -> None:
    """The process group an executing effect started (or SPAWNING, just before it starts one), so a
    successor can kill or await it, and knows whether it may have acted."""
    with Transaction(conn):
        conn.execute("UPDATE effects SET pgid = ? WHERE id = ? AND state = 'executing'", (pgid, effect_id))


def _move_effect(conn: sqlite3.Connection, effect_id: str, source: str, *, where: str, args: Sequence,
                 state: str, event: str, release: bool = False, **data) -> bool:
    """One effect whose row matches `where` → `state`, with its event, in one transaction; False if
    it does not match (someone else moved it first). release: forget its claimer and process group."""
    with Transaction(conn):
        row = conn.execute(f"SELECT target, kind FROM effects WHERE id = ? AND {where}", (effect_id, *args)).fetchone()
        if row is None:
            return False
        why = data.get("error") or data.get("reason") if state != EffectState.ACKED else None
        conn.execute("UPDATE effects SET state = ?, why = ?" + (", claimer = NULL, pgid = NULL" if release else "")
                     + " WHERE id = ?", (state, why, effect_id))
        insert_event(conn, now_event(event, source, row[0], effect_id=effect_id, kind=row[1], **data))
        return True


def finish_effect(conn: sqlite3.Connection, effect_id: str, state: str, source: str,
                  from_states: Sequence[str] = (EffectState.EXECUTING,), **data) -> bool:
    """executing (or pending, for expiry) → acked | failed | expired, with its event; False if not in from_states."""
    return _move_effect(conn, effect_id, source, where=f"state IN ({','.join('?' * len(from_states))})",
                        args=from_states, state=state, event=EFFECT_END_EVENTS[state], **data)


def finish_claimed_effect(conn: sqlite3.Connection, effect_id: str, claimer: str, state: str, source: str,
                          **data) -> bool:
    """executing under `claimer` → acked | failed, with its event; False if it is not (or no longer) that
    claimer's: an executor only ever ends its own claims, or a dead claimer's when it settles an orphan."""
    return _move_effect(conn, effect_id, source, where="state = 'executing' AND claimer = ?", args=(claimer,),
                        state=state, event=EFFECT_END_EVENTS[state], **data)


def requeue_claimed_effect(conn: sqlite3.Connection, effect_id: str, claimer: str, source: str,
                           reason: str, **data) -> bool:
    """executing under `claimer` → pending (it runs again), with an effect-failed event marked requeued
    (and `data`: what this attempt did)."""
    return _move_effect(conn, effect_id, source, where="state = 'executing' AND claimer = ?", args=(claimer,),
                        state=EffectState.PENDING, event=EffectEvent.FAILED, release=True, reason=reason, requeued=True,
                        **{k: v for k, v in data.items() if v is not None})


def effect_state(conn: sqlite3.Connection, effect_id: str) -> str | None:
    row = conn.execute("SELECT state FROM effects WHERE id = ?", (effect_id,)).fetchone()
    return row[0] if row else None


def effect_why(conn: sqlite3.Connection, effect_id: str) -> str | None:
    """Why it failed or expired (the error, else the reason code); None while open or acked."""
    row = conn.execute("SELECT why FROM effects WHERE id = ?", (effect_id,)).fetchone()
    return row[0] if row else None


def list_effects(conn: sqlite3.Connection, states: Sequence[str] = (),
                 limit: int = 100) -> list[tuple[Effect, str, str | None]]:
    """(effect, state, why it failed or expired), newest first; all states (recent_effects) unless
    `states` is given."""
    if not states:
        return recent_effects(conn, limit)
    rows = conn.execute(f"SELECT body, state, why FROM effects WHERE {_states_term(states)} ORDER BY created DESC LIMIT ?",
                        (*states, limit))
    return [(_effect(r[0]), r[1], r[2]) for r in rows]


def recent_effects(conn: sqlite3.Connection, limit: int = 100) -> list[tuple[Effect, str, str | None]]:
    """The last `limit` effects committed, of every state, newest first. It walks the table's own
    order (rowid, the order of commit, which is the order of `created`: an effect is stamped just
    before its commit) back from its end, so it reads `limit` rows whatever the history's length;
    ordering by `created`, which no index holds, scans and sorts every effect ever committed (the
    page's overview asks four times a second; on 1.2 M effects `pulsectl effects` took seconds)."""
    rows = conn.execute("SELECT body, state, why FROM effects ORDER BY rowid DESC LIMIT ?", (limit,)).fetchall()
    effects = [(_effect(r[0]), r[1], r[2]) for r in rows]
    return sorted(effects, key=lambda row: row[0].created, reverse=True)


def forget_ended(conn: sqlite3.Connection, first_id: int, last_id: int) -> int:
    """Inside the transaction that moves events first_id..last_id out of events.db (pulse.store.retention):
    the queue's rows of the ended effects committed by them go too, or the live file would keep a row
    per effect ever run. An open effect's event never moves, so none of its rows is touched here."""
    return conn.execute("DELETE FROM effects WHERE event_id BETWEEN ? AND ? AND state NOT IN (?, ?)",
                        (first_id, last_id, *EFFECT_OPEN)).rowcount
