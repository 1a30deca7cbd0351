"""The gate's durable store: its facts are gate-call events in events.db, and every decision is
taken inside one BEGIN IMMEDIATE.

Each process that uses the gate (a `pulsectl mcp` session, pulsectl's reset and listing, an agent
run's check) folds the facts of every session into its own Ledger, incrementally: a decision
folds what others committed since, decides, and appends its own fact in the same transaction, so
two sessions cannot both pass, and a session that restarts forgets nothing.

Before deciding it settles the writes nobody will end: a write whose session's process is gone,
or that its client cancelled, is settled from its effect's outcome (acked, or failed after it
started: it acted; expired, refused, failed before it started, or no effect committed: it never
did). A write whose effect is still open stays in flight, however long its tool waited: it may
yet act. In flight is the effect's, not the session's: once a write's effect has ended, it is
settled within OUTCOME_GRACE_S even if its session lives on and never says so (frozen with
SIGSTOP, or stopped waiting), so no session holds a resource past its effect.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any, Callable, NamedTuple

from pulse.agents import gate
from pulse.core.states import EFFECT_OPEN, EffectState
from pulse.core.wire import now_event
from pulse.store import connection, effectqueue, eventsdb

NOT_ACTED = ("not-allowed", "deadline", "interrupted-before-start")   # an effect that ended so never ran
# A live session ends its own write as soon as it reads the outcome (milliseconds); past this, the
# outcome settles the write for it.
OUTCOME_GRACE_S = 2.0


class Settled(NamedTuple):
    acted: bool
    why: str
    ended: int | None           # the id of the event that ended the effect
    ended_ts: float | None
    uncertain: bool = False     # it may have acted, nobody knows how far: interrupted while it ran


def process_alive(pid: int | None, started: float | None) -> bool:
    """The session's process still runs (the same process: a pid alone may have been reused)."""
    if pid is None:
        return True
    import psutil
    try:
        return started is None or abs(psutil.Process(pid).create_time() - started) < 0.05
    except psutil.Error:
        return False


def acted_by_outcome(conn: sqlite3.Connection, effect_id: str | None) -> Settled | None:
    """Whether a write's effect acted, why we think so, and the event that ended it; None while
    it may still act."""
    if effect_id is None:
        return Settled(False, "it committed no effect", None, None)
    state = effectqueue.effect_state(conn, effect_id)
    if state in EFFECT_OPEN:
        return None
    end = eventsdb.effect_end(conn, effect_id)
    reason = (end.data.get("reason") if end else None) or ""
    ended, ended_ts = (end.id, end.ts) if end else (None, None)
    if state == EffectState.ACKED:
        return Settled(True, f"its effect {effect_id} was acked", ended, ended_ts)
    if state == EffectState.EXPIRED or reason in NOT_ACTED:
        return Settled(False, f"its effect {effect_id} ended {state} ({reason or 'never run'})", ended, ended_ts)
    if reason.startswith("interrupted"):        # interrupted-after-start: its executor died while it ran
        return Settled(True, f"its effect {effect_id} was interrupted while it ran: it may have acted", ended,
                       ended_ts, uncertain=True)
    return Settled(True, f"its effect {effect_id} failed after it started", ended, ended_ts)


class DurableStore:
    """gate.MemoryStore's contract (`ledger`, `transact`), kept in events.db."""

    def __init__(self, conn: sqlite3.Connection, source: str = "mcp",
                 alive: Callable[[int | None, float | None], bool] = process_alive):
        self.conn, self.source, self.alive = conn, source, alive
        self.ledger = gate.Ledger()

    def catch_up(self) -> gate.Ledger:
        """Fold every fact committed since the last one folded."""
        for ev in eventsdb.gate_facts(self.conn, self.ledger.position):
            self.ledger.apply(ev.id, ev.ts, ev.data)
        return self.ledger

    def transact(self, decide: Callable[[], Any]) -> Any:
        try:
            with connection.transaction(self.conn):
                self.catch_up()
                for record in self.settlements():
                    self._commit(record)
                outcome = decide()
                for record in gate.records_of(outcome):
                    self._commit(record)
        except BaseException:
            # The ledger folded facts this rollback undid: fold it again from events.db (now, if
            # the file answers; else at the next decision, which catches up first).
            self.ledger = gate.Ledger()
            try:
                self.catch_up()
            except sqlite3.Error:
                pass
            raise
        return outcome

    def _commit(self, record: gate.Record) -> None:
        position = eventsdb.last_event_id(self.conn) + 1       # inside BEGIN IMMEDIATE: the id it gets
        gate.complete(self.ledger, record, position, time.time())
        data = record.data
        ev = eventsdb.insert_event(self.conn, now_event(record.type, self.source, data.get("session") or data.get("agent"),
                                                  data))
        if ev.id != position:
            raise RuntimeError(f"gate fact got id {ev.id}, folded at {position}")

    def settlements(self, now: float | None = None) -> list[gate.Record]:
        """Settle facts for the calls in flight that nobody will end: a gone session's, a cancelled
        write's once its effect ended, and any write whose effect ended OUTCOME_GRACE_S ago."""
        now = time.time() if now is None else now
        out = []
        for flight in list(self.ledger.flights.values()):
            facts = self.ledger.sessions.get(flight.session)
            gone = facts is not None and not self.alive(facts.pid, facts.started)
            if flight.kind != gate.CallKind.WRITE:
                if gone or flight.cancelled:
                    out.append(settle_fact(flight, Settled(False, "its session is gone", None, None), "session gone: "))
                continue
            if not (gone or flight.cancelled or flight.effect):
                continue                     # a live session's write that has committed no effect yet
            settled = acted_by_outcome(self.conn, flight.effect)
            if settled is None:
                continue                     # its effect may still act: in flight, whoever waits for it
            if flight.cancelled or gone:
                out.append(settle_fact(flight, settled, "cancelled: " if flight.cancelled else "session gone: "))
            elif settled.ended_ts is not None and now - settled.ended_ts >= OUTCOME_GRACE_S:
                out.append(settle_fact(flight, settled, "effect ended, its session silent: "))
        return out


def settle_fact(flight: gate.Flight, settled: Settled, how: str) -> gate.Record:
    return gate.Record("gate-call", {
        "phase": "settle", "session": flight.session, "call": flight.call, "tool": flight.tool,
        "kind": str(flight.kind), "acted": settled.acted, "effect": flight.effect, "ended": settled.ended,
        "why": how + settled.why, **({"uncertain": True} if settled.uncertain else {})})


def stamp(pid: int) -> float | None:
    """A process's start time, which with its pid names it (see process_alive)."""
    import psutil
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
