"""The gate's durable store: its facts are gate-call events in events.db, and every decision is
taken inside one BEGIN IMMEDIATE.

Each process that uses the gate (a `pulsectl mcp` session, pulsectl's reset and listing, an agent
run's check) folds the facts of every session into its own HostLedger, incrementally: a decision
folds what others committed since, decides, and appends its own fact in the same transaction, so
two sessions cannot both pass, and a session that restarts forgets nothing.

Before deciding it settles the writes nobody will end: a write whose session's process is gone,
or that its client cancelled, is settled from its effect's outcome (acked, or failed after it
started: it acted; expired, refused, failed before it started, or no effect committed: it never
did). A write whose effect is still open stays in flight, however long its tool waited: it may
yet act. In flight is the effect's, not the session's: once a write's effect has ended, it is
settled within OUTCOME_GRACE_S even if its session lives on and never says so (frozen with
SIGSTOP, or stopped waiting), so no session holds a resource past its effect.

Given the home's checkpoint directory, the HostLedger is a checkpointed projection (LEDGER,
pulse.store.projection): a process that starts (the executor's gate after a kill, an agent run's
verdict) loads the newest checkpoint and folds only the facts after it, not every fact since the
host was installed.
"""

from __future__ import annotations

import collections
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import msgspec

from pulse.core.states import EFFECT_OPEN, EffectState
from pulse.core.wire.eventmsgs import EventType, now_event
from pulse.gate import policy
from pulse.store import connection, effectqueue, eventsdb, projection

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
    import psutil  # ~14 ms: the page and pulsectl read the ledger without it
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


# -- the ledger as a checkpointed projection --------------------------------------------------------------
# Its dump turns the keys msgpack cannot carry as map keys (principals are tuples, looks are Patterns)
# into lists of pairs; load types every part back with msgspec.convert.

class _ActorDump(msgspec.Struct, array_like=True):
    looked: list[tuple[policy.Pattern, int]]
    unverified: dict[str, policy.Debt]
    verified: int
    found: dict[str, tuple[str, int]]


class _LedgerDump(msgspec.Struct, array_like=True):
    position: int
    sessions: dict[str, policy.SessionFacts]
    actors: list[tuple[str, str, _ActorDump]]
    flights: dict[str, policy.Flight]
    changes: dict[str, policy.Change]
    uncertain: dict[str, policy.Uncertain]
    blocks: list[tuple[str, str, list[float]]]


def fold_facts(ledger: policy.HostLedger, events) -> None:
    for ev in events:
        ledger.apply(ev.id, ev.ts, ev.data)


def dump_ledger(ledger: policy.HostLedger) -> _LedgerDump:
    return _LedgerDump(
        ledger.position, ledger.sessions,
        [(agent, task, _ActorDump(list(a.looked.items()), a.unverified, a.verified, a.found))
         for (agent, task), a in ledger.actors.items()],
        ledger.flights, ledger.changes, ledger.uncertain,
        [(agent, task, list(times)) for (agent, task), times in ledger.blocks.items()])


def load_ledger(raw: Any) -> policy.HostLedger:
    dump = msgspec.convert(raw, _LedgerDump)
    ledger = policy.HostLedger()
    ledger.position, ledger.sessions = dump.position, dump.sessions
    ledger.actors = {(agent, task): policy.Actor(dict(a.looked), a.unverified, a.verified, a.found)
                     for agent, task, a in dump.actors}
    ledger.flights, ledger.changes, ledger.uncertain = dump.flights, dump.changes, dump.uncertain
    ledger.blocks = {(agent, task): collections.deque(times) for agent, task, times in dump.blocks}
    return ledger


LEDGER = projection.Projection(
    name="gate.ledger", new=policy.HostLedger, fold=fold_facts, types=(EventType.GATE_CALL,), dump=dump_ledger, load=load_ledger,
    code=(policy.HostLedger, policy.SessionFacts, policy.Actor, policy.Flight, policy.Change, policy.Uncertain, policy.Debt,
          policy.Pattern, policy.is_covered, policy.about, policy.conflicts, _ActorDump, _LedgerDump))


class DurableStore:
    """policy.MemoryStore's contract (`ledger`, `transact`), kept in events.db. `checkpoints`: the
    home's checkpoint directory, where the ledger's projection starts from (None: from the first fact)."""

    def __init__(self, conn: sqlite3.Connection, source: str = "mcp",
                 alive: Callable[[int | None, float | None], bool] = process_alive,
                 checkpoints: Path | None = None):
        self.conn, self.source, self.alive = conn, source, alive
        self.ledger = policy.HostLedger()
        self.folded = None if checkpoints is None else projection.Folded(
            LEDGER, conn, checkpoints, save=projection.may_write(checkpoints.parent))

    def catch_up(self, save: bool = True) -> policy.HostLedger:
        """Fold every fact committed since the last one folded. `save`: write the checkpoint if it is
        due (not inside a decision's transaction: its fsync would hold every other session's)."""
        if self.folded is None:
            for ev in eventsdb.gate_facts(self.conn, self.ledger.position):
                self.ledger.apply(ev.id, ev.ts, ev.data)
            return self.ledger
        self.ledger = self.folded.catch_up(self.conn, save=save)
        return self.ledger

    def transact(self, decide: Callable[[], Any]) -> Any:
        try:
            with connection.transaction(self.conn):
                self.catch_up(save=False)
                for record in self.settlements():
                    self._commit(record)
                outcome = decide()
                for record in policy.records_of(outcome):
                    self._commit(record)
        except BaseException:
            # The ledger folded facts this rollback undid: fold it again from events.db (now, if
            # the file answers; else at the next decision, which catches up first), from the
            # checkpoint when there is one.
            self.ledger = policy.HostLedger()
            if self.folded is not None:
                self.folded.state = None
            try:
                self.catch_up()
            except sqlite3.Error:
                pass
            raise
        if self.folded is not None:
            # its own facts were folded as they were committed (policy.complete): the projection is past them
            self.folded.last_id = max(self.folded.last_id, self.ledger.position)
            if self.folded.due():
                self.folded.save()
        return outcome

    def _commit(self, record: policy.Record) -> None:
        position = eventsdb.last_event_id(self.conn) + 1       # inside BEGIN IMMEDIATE: the id it gets
        ts = time.time()
        policy.complete(self.ledger, record, position, ts)
        data = record.data
        # folded at the ts it is stored with: this ledger (and the checkpoint written of it) is the one a
        # fold of the history makes
        fact = msgspec.structs.replace(now_event(record.type, self.source, data.get("session") or data.get("agent"),
                                                 data), ts=ts)
        ev = eventsdb.insert_event(self.conn, fact)
        if ev.id != position:
            raise RuntimeError(f"gate fact got id {ev.id}, folded at {position}")

    def settlements(self, now: float | None = None) -> list[policy.Record]:
        """Settle facts for the calls in flight that nobody will end: a gone session's, a cancelled
        write's once its effect ended, and any write whose effect ended OUTCOME_GRACE_S ago."""
        now = time.time() if now is None else now
        out = []
        for flight in list(self.ledger.flights.values()):
            facts = self.ledger.sessions.get(flight.session)
            gone = facts is not None and not self.alive(facts.pid, facts.started)
            if flight.kind != policy.CallKind.WRITE:
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


def settle_fact(flight: policy.Flight, settled: Settled, how: str) -> policy.Record:
    return policy.Record(EventType.GATE_CALL, {
        "phase": "settle", "session": flight.session, "call": flight.call, "tool": flight.tool,
        "kind": str(flight.kind), "acted": settled.acted, "effect": flight.effect, "ended": settled.ended,
        "why": how + settled.why, **({"uncertain": True} if settled.uncertain else {})})


def stamp(pid: int) -> float | None:
    """A process's start time, which with its pid names it (see process_alive)."""
    import psutil  # ~14 ms: the page and pulsectl read the ledger without it
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
