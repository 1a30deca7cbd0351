"""Spend limits that fail closed: what agent runs may cost, per agent (`[[agent]] budget`) and for
the host (`[budget]`), by UTC day, UTC month and the last hour.

The ledger is events in events.db (pulse.core.wire.eventmsgs.SpendEvent), folded here:

  spend-reserved  before a run starts, in the same transaction that claims its agent-run effect
                  (pulse.store.effectqueue.claim_effect's `reserve`): its expected cost, the
                  agent's `max_run_usd`, else the median of its last MEDIAN_OF runs that reported
                  a cost (none yet: 0). A run that would cross a limit is not claimed: it stays
                  pending, its task waits, and a `spend-held` says why (once per wait).
  spend-settled   when the run ends: its real cost. A CLI that reports no cost settles at 0 and
                  says so (`cost_reported: false`): the run counts against runs_per_hour only.
                  A run whose executor died settles at what it reserved: its cost is unknown.
  spend-alert     the operator was told (a `notify` effect committed in the same transaction):
                  once per limit, window and level (80 %, 100 %).
  spend-reset     `pulsectl budget reset AGENT`: the agent's runs until then count no more.
  spend-observed  what a session Pulse did not start (an operator's own Claude Code or Codex,
                  pointed at the telemetry receiver) reported it spent over one flush: counted
                  against the host's limits (never an agent's, never a run's) when its telemetry
                  came with the receiver's token (`counted`); else only shown, all such sessions as
                  one sum, since any local process, an agent run too, can send telemetry without it
                  and must not hold every run back with made-up spend.

A run counts in the windows of the time it was reserved (a run that started before midnight is
yesterday's). Windows are reckoned in pulse.core.clock.now() (its test seam shifts them). Every
function but those that take a connection is pure.
"""

from __future__ import annotations

import math
import time
from _thread import allocate_lock  # threading's Lock itself; threading's import is ~1 ms of `budget`
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import msgspec

from pulse.agents import tasks
from pulse.core import clock
from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import EffectKind, Event, SpendEvent, now_event

# Imports inside functions: pulse.store (~5-15 ms) is imported by the functions that read or write
# events.db: the tick's budget rule and the engine's tests import this module for its folds and types.

if TYPE_CHECKING:
    from pulse.core.config import SpendLimits

HOST = "*"                    # the scope of the host-wide [budget]
MEDIAN_OF = 10                # a run's expected cost: the median of this many recent costs
ALERT_LEVELS = (80, 100)      # per cent of a limit at which the operator is told, once per window
RULE = "spend-limit"          # the notifications' `rule`
HOUR_S = 3600.0
NOTIFY_DEADLINE_S = 86400.0   # a notification may wait a day for a channel to take it (as survival's)
# (config key, window, what it counts)
LIMITS = (("usd_per_day", "day", "usd"), ("usd_per_month", "month", "usd"), ("runs_per_hour", "hour", "runs"))


# -- windows --------------------------------------------------------------------------------------

def window_start(window: str, now: float) -> float:
    """Where `window` began: the UTC day's or month's start; for the hour, 3600 s ago (rolling)."""
    t = time.gmtime(now)
    if window == "day":
        return float(math.floor(now - (t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec) - (now % 1)))
    if window == "month":
        return window_start("day", now) - (t.tm_mday - 1) * 86400
    if window == "hour":
        return now - HOUR_S
    raise ValueError(f"unknown window {window!r}")


def window_key(window: str, now: float) -> str:
    """The window's name, alerts are counted once per: 2026-12-03, 2026-12, 2026-12-03T16."""
    return time.strftime({"day": "%Y-%m-%d", "month": "%Y-%m", "hour": "%Y-%m-%dT%H"}[window], time.gmtime(now))


# The ledger and what is decided on it are msgspec Structs, not dataclasses: `pulsectl budget` reads
# them, and dataclasses (with inspect) and statistics were ~10 ms of its time; msgspec is loaded anyway.

# -- the ledger -----------------------------------------------------------------------------------

class Run(msgspec.Struct):
    effect_id: str
    agent: str
    task: str | None
    at: float                          # when it was reserved (clock.now())
    reserved: float
    usd: float | None = None           # settled cost; None while it runs
    cost_reported: bool | None = None
    started: bool = True               # False: settled unrun (its task had moved on): it counts nowhere

    @property
    def cost(self) -> float:
        """What it counts for now: its settled cost, else its reservation."""
        return self.reserved if self.usd is None else self.usd


UNCOUNTED = "session:*"         # every session whose telemetry came without the token, summed


def hour_of(at: float) -> float:
    """The UTC hour `at` is in: day and month windows start on one, so hourly sums add up exactly."""
    return float(math.floor(at / HOUR_S) * HOUR_S)


class Ledger(msgspec.Struct):
    runs: dict[str, Run] = msgspec.field(default_factory=dict)
    resets: dict[str, float] = msgspec.field(default_factory=dict)  # agent → when its spend was reset
    alerts: list[dict] = msgspec.field(default_factory=list)        # spend-alert data
    held: dict[str, dict] = msgspec.field(default_factory=dict)     # task → its spend-held data, while it waits
    # sessions Pulse did not start: (session, UTC hour) → usd; those without the token as UNCOUNTED,
    # one sum, so what anyone may send costs one entry an hour here
    observed: dict[tuple[str, float], float] = msgspec.field(default_factory=dict)
    sessions: dict[str, dict] = msgspec.field(default_factory=dict)  # session → its service, last seen

    def fold(self, events: Iterable[Event]) -> "Ledger":
        for ev in events:
            d = ev.data
            if ev.type == SpendEvent.RESERVED:
                self.runs[d["effect_id"]] = Run(d["effect_id"], d["agent"], d.get("task"), float(d["at"]),
                                                float(d["usd"]))
                self.held.pop(d.get("task"), None)
            elif ev.type == SpendEvent.SETTLED and d.get("effect_id") in self.runs:
                run = self.runs[d["effect_id"]]
                run.usd, run.cost_reported = float(d["usd"]), d.get("cost_reported")
                run.started = d.get("started", True)
            elif ev.type == SpendEvent.HELD:
                self.held[ev.target or ""] = d
            elif ev.type == SpendEvent.ALERT:
                self.alerts.append(d)
            elif ev.type == SpendEvent.RESET:
                self.resets[ev.target or ""] = float(d["at"])
            elif ev.type == SpendEvent.OBSERVED:
                self.observe(ev.target or "", d)
        return self

    def observe(self, target: str, d: dict) -> None:
        who = target if d.get("counted") else UNCOUNTED
        key = (who, hour_of(float(d.get("at") or 0)))
        self.observed[key] = round(self.observed.get(key, 0.0) + float(d.get("usd") or 0), 6)
        self.sessions[who] = {"service": d.get("service") if who != UNCOUNTED else None,
                              "last": float(d.get("at") or 0)}

    def sessions_usd(self, since: float, counted_only: bool = True, who: str | None = None) -> float:
        """What sessions Pulse did not start spent from `since` on (the counted ones; or one of them)."""
        return round(sum(usd for (s, hour), usd in self.observed.items() if hour >= since
                         and (who is None or s == who) and (not counted_only or s != UNCOUNTED)), 6)

    def counted(self, scope: str, since: float) -> list[Run]:
        """The runs of `scope` (an agent, or HOST: all) that count from `since` on."""
        return [r for r in self.runs.values() if (scope == HOST or r.agent == scope) and r.started
                and r.at >= since and r.at >= self.resets.get(r.agent, -math.inf)]

    def used(self, scope: str, limit: str, now: float) -> float:
        _, window, unit = next(x for x in LIMITS if x[0] == limit)
        since = window_start(window, now)
        runs = self.counted(scope, since)
        if unit == "runs":
            return float(len(runs))
        sessions = self.sessions_usd(since) if scope == HOST else 0.0       # the host's, never an agent's
        return round(sum(r.cost for r in runs) + sessions, 6)

    def alerted(self, scope: str, limit: str, key: str, level: int) -> bool:
        since = self.resets.get(scope, -math.inf)
        return any(a["scope"] == scope and a["limit"] == limit and a["key"] == key and a["level"] >= level
                   and a["at"] >= since for a in self.alerts)

    def settled(self, effect_id: str) -> bool:
        run = self.runs.get(effect_id)
        return run is not None and run.usd is not None


# -- decisions (pure) -----------------------------------------------------------------------------

class Measure(msgspec.Struct):
    """One limit of one scope, now: used (usd or runs) of `of`."""
    scope: str
    limit: str
    used: float
    of: float
    key: str

    @property
    def unit(self) -> str:
        return next(x[2] for x in LIMITS if x[0] == self.limit)

    def words(self) -> str:
        who = "the host" if self.scope == HOST else self.scope
        if self.unit == "runs":
            return f"{who}: {self.used:g} of {self.of:g} runs in the last hour"
        return f"{who}: ${self.used:.2f} of ${self.of:.2f} {self.limit}"


def measures(ledger: Ledger, scopes: list[tuple[str, SpendLimits]], now: float) -> list[Measure]:
    """Every limit that is set, for each (scope, limits), with what is used of it now."""
    out = []
    for scope, limits in scopes:
        for limit, window, _ in LIMITS:
            of = getattr(limits, limit)
            if of is not None:
                out.append(Measure(scope, limit, ledger.used(scope, limit, now), float(of), window_key(window, now)))
    return out


def crossing(m: Measure, expected_usd: float) -> bool:
    """Would one more run cross this limit? A run adds 1 to runs, and its expected cost to usd; with
    nothing left (used ≥ limit) no run starts, however little it is expected to cost."""
    if m.unit == "runs":
        return m.used + 1 > m.of
    return m.used >= m.of or m.used + expected_usd > m.of


class Hold(msgspec.Struct):
    """Why a run of an agent would not start now: the limits one more run would cross."""
    why: str
    blocked: list[Measure]


def hold_of(ms: list[Measure], expected_usd: float) -> Hold | None:
    """The hold on one more run expected to cost `expected_usd`, given its scopes' measures (None: it may run)."""
    blocked = [m for m in ms if crossing(m, expected_usd)]
    if not blocked:
        return None
    return Hold("; ".join(m.words() for m in blocked) + f"; the next run is expected to cost ${expected_usd:.2f}",
                blocked)


def limited(agents: list, host: SpendLimits) -> list:
    """The agents any spend limit applies to (every agent when the host has one)."""
    host_set = any(getattr(host, limit) is not None for limit, _, _ in LIMITS)
    return [a for a in agents if host_set or any(getattr(a.budget, limit) is not None for limit, _, _ in LIMITS)]


def agent_holds(ledger: Ledger, agents: list, host: SpendLimits, now: float,
                expected: dict[str, float]) -> dict[str, Hold]:
    """Each agent one more run of which would cross a limit now (its own or the host's), with why: what
    the tick puts in the snapshot (AgentLoad.budget), so no rule hands such a run out. `expected`: each
    agent's expected run cost (expected_cost); pure."""
    out = {}
    for agent in limited(agents, host):
        hold = hold_of(measures(ledger, scopes_of(agent, host), now), expected.get(agent.name, 0.0))
        if hold is not None:
            out[agent.name] = hold
    return out


def projected(m: Measure, expected_usd: float) -> float:
    return m.used + (1 if m.unit == "runs" else expected_usd)


def due_alerts(ledger: Ledger, ms: list[Measure], value, blocked: set[tuple[str, str]] = frozenset()) -> list[tuple[Measure, int]]:
    """(measure, level) for each level a limit has now reached (`value(m)`: what counts, the
    projection at a reservation, the settled spend after a run), or is blocked at (100), that its
    window has not been told of yet. The highest level only: a jump from 50 % to the limit tells once."""
    out = []
    for m in ms:
        share = value(m) / m.of * 100 if m.of else 100
        reached = [lvl for lvl in ALERT_LEVELS if share >= lvl or (lvl == 100 and (m.scope, m.limit) in blocked)]
        if reached and not ledger.alerted(m.scope, m.limit, m.key, max(reached)):
            out.append((m, max(reached)))
    return out


def remaining_usd(ms: list[Measure]) -> float | None:
    """The dollars left under the tightest usd limit (None: no usd limit is set)."""
    left = [max(0.0, m.of - m.used) for m in ms if m.unit == "usd"]
    return round(min(left), 6) if left else None


def median(values: list[float]) -> float:
    """The middle value (of an even count, the mean of the two middle ones), as statistics.median,
    which is not imported for it: its module and what it loads were milliseconds of `pulsectl budget`."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def expected_cost(max_run_usd: float | None, recent_costs: list[float]) -> float:
    """What a run is expected to cost: max_run_usd where set, else the median of the recent costs (none: 0)."""
    if max_run_usd is not None:
        return float(max_run_usd)
    return float(median(recent_costs[:MEDIAN_OF])) if recent_costs else 0.0


def scopes_of(agent, host: SpendLimits) -> list[tuple[str, SpendLimits]]:
    return [(agent.name, agent.budget), (HOST, host)]


# -- reading and writing events.db (every statement is in pulse.store) ------------------------------

KEEP_S = 40 * 86400           # the ledger forgets runs and alerts this much older than its newest run:
                              # no window (a month at most) reaches back that far


def fold_ledger(ledger: Ledger, events: Iterable[Event]) -> None:
    """The projection's fold: the events, then what no window can count any more forgotten (else the
    state, and its checkpoint, would hold every run the host ever made)."""
    ledger.fold(events)
    newest = max((r.at for r in ledger.runs.values()), default=None)
    if newest is None:
        return
    horizon = newest - KEEP_S
    if any(r.at < horizon for r in ledger.runs.values()):
        ledger.runs = {k: r for k, r in ledger.runs.items() if r.at >= horizon}
    if ledger.alerts and float(ledger.alerts[0].get("at", horizon)) < horizon:
        ledger.alerts = [a for a in ledger.alerts if float(a.get("at", horizon)) >= horizon]


def ledger_projection():
    """The spend ledger as a checkpointed projection (pulse.store.projection): a process that starts (the
    executor after a kill, `pulsectl budget`) loads the checkpoint and folds the spend events after it;
    what retention moved to the archive is folded from there, so a run whose events moved still counts."""
    from pulse.store import projection
    return projection.Projection(name="spend", new=Ledger, fold=fold_ledger, types=tuple(SpendEvent),
                                 state_type=Ledger, code=(Ledger, Run, KEEP_S))


def listing_projections() -> list:
    """The projections only pulsectl's listings keep (every task; the schedule book), or that a worker
    keeps only while it has work for them (the spend ledger: `pulsectl budget`, the executor's claims of
    agent runs): retention folds their checkpoints forward before it moves events
    (pulse.store.retention.refresh). Here, above pulse.agents.tasks, since the ledger is one of them."""
    from pulse.store import schedulerun
    return [tasks.book_projection(tasks.ALL_TASKS), schedulerun.schedules_projection(), ledger_projection()]


# The ledger each process keeps, per database file: a claim folds only the spend events committed since
# (read inside its write transaction, so nothing is missed). Forgotten when a transaction that used it
# fails (forget), so it never holds what was rolled back: the next load starts from the checkpoint.
# A checkpoint is written only outside a transaction (its fsync must not hold the claim's lock), so it
# never holds what a later rollback undid.
_folded: dict[str, object] = {}    # database file → projection.Folded of ledger_projection()
_folded_lock = allocate_lock()


def _database(conn) -> str:
    return conn.execute("PRAGMA database_list").fetchone()[2]


def forget(conn) -> None:
    with _folded_lock:
        _folded.pop(_database(conn), None)


def load(conn, now: float) -> Ledger:
    """The ledger of every window open at `now` (and of the past KEEP_S: every count filters by time),
    with every committed spend event folded. The caller must not change it."""
    from pulse.store import projection
    key = _database(conn)
    with _folded_lock:
        folded = _folded.get(key)
        if folded is None:
            checkpoints = Path(key).parent / projection.DIRECTORY
            folded = _folded[key] = projection.Folded(ledger_projection(), conn, checkpoints,
                                                      save=bool(key) and projection.may_write(Path(key).parent))
        return folded.catch_up(conn, save=not conn.in_transaction)


def recent_costs(ledger: Ledger, agent: str) -> list[float]:
    """The reported costs of the agent's latest runs, newest first: from the ledger, which keeps them
    when retention has moved their settlements out of the live history."""
    runs = sorted((r for r in ledger.runs.values() if r.agent == agent and r.cost_reported and r.usd is not None),
                  key=lambda r: r.at, reverse=True)
    return [float(r.usd) for r in runs[:MEDIAN_OF]]


def _alert_writes(ledger: Ledger, alerts: list[tuple[Measure, int]], now: float, source: str,
                  why: str) -> tuple[list[Event], list[Effect]]:
    events, effects = [], []
    for m, level in alerts:
        data = {"scope": m.scope, "limit": m.limit, "key": m.key, "level": level, "used": m.used, "of": m.of,
                "at": now}
        events.append(now_event(SpendEvent.ALERT, source, m.scope, data))
        title = (f"Spend limit reached: {m.words()}" if level >= 100 else
                 f"Spend at {level} % of a limit: {m.words()}")
        effects.append(Effect(kind=EffectKind.NOTIFY, target=m.scope, idempotent=True, params={
            # a limit reached is the limit working as asked, not a fault: warning, like its 80 % notice
            "rule": RULE, "level": "warning", "title": title,
            "message": f"{title}; {why}", "scope": m.scope, "limit": m.limit, "percent": level,
            "used": m.used, "of": m.of, "window": m.key}))
    return events, effects


def _write_due_alerts(conn, scopes, now: float, source: str, why: str) -> None:
    """Inside the caller's transaction, after it wrote spend: the alerts that spend brought due in
    `scopes`, on the ledger read back with it."""
    ledger = load(conn, now)
    alerts = due_alerts(ledger, measures(ledger, scopes, now), lambda m: m.used)
    _write(conn, *_alert_writes(ledger, alerts, now, source, why), source)


def _write(conn, events: list[Event], effects: list[Effect], source: str) -> None:
    """Inside the caller's transaction: the events, and the notifications committed as effects."""
    from pulse.store import effectqueue, eventsdb
    for ev in events:
        eventsdb.insert_event(conn, ev)
    for eff in effects:
        effectqueue.insert_effect(conn, effectqueue.new_effect(eff, "spend", NOTIFY_DEADLINE_S), source)


def reserve(conn, effect: Effect, agent, task: str | None, host: SpendLimits, source: str) -> str | None:
    """Inside the transaction that claims an agent-run: reserve the run's expected cost, or, when it
    would cross a limit, hold it (None: reserved, the claim goes on; else why it is held, and the
    claim is not made). Either way what it records commits with the transaction."""
    try:
        return _reserve(conn, effect, agent, task, host, source)
    except BaseException:
        forget(conn)
        raise


def _held_writes(ledger: Ledger, hold: "Hold", agent_name: str, task: str | None, effect_id: str | None,
                 now: float, source: str) -> tuple[list[Event], list[Effect]]:
    """What a held run records: the 100 % alerts of the limits it is held by (once per window), and a
    `spend-held` for its task unless the task already waits for the same words."""
    events, effects = _alert_writes(ledger, due_alerts(ledger, hold.blocked, lambda m: m.used,
                                                       {(m.scope, m.limit) for m in hold.blocked}),
                                    now, source, f"{task or 'a task'} waits (reason budget)")
    if task is not None and ledger.held.get(task, {}).get("why") != hold.why:
        events.insert(0, now_event(SpendEvent.HELD, source, task, {
            "reason": "budget", "agent": agent_name, "effect_id": effect_id, "why": hold.why, "at": now,
            "limits": [msgspec.structs.asdict(m) for m in hold.blocked]}))
    return events, effects


def _reserve(conn, effect: Effect, agent, task: str | None, host: SpendLimits, source: str) -> str | None:
    now = clock.now()
    ledger = load(conn, now)
    expected = expected_cost(agent.max_run_usd, recent_costs(ledger, agent.name))
    ms = measures(ledger, scopes_of(agent, host), now)
    hold = hold_of(ms, expected)
    if hold is not None:
        events, effects = _held_writes(ledger, hold, agent.name, task, effect.id, now, source)
        _write(conn, events, effects, source)
        return hold.why
    cap = remaining_usd(ms)
    events, effects = _alert_writes(ledger, due_alerts(ledger, ms, lambda m: projected(m, expected)), now, source,
                                    f"{agent.name} started a run expected to cost ${expected:.2f}")
    events.insert(0, now_event(SpendEvent.RESERVED, source, agent.name, {
        "effect_id": effect.id, "agent": agent.name, "task": task, "usd": expected, "at": now,
        **({"cap_usd": cap} if cap is not None else {})}))
    _write(conn, events, effects, source)
    return None


def holds(conn, agents: list, host: SpendLimits) -> dict[str, Hold]:
    """agent_holds now, read from events.db: nothing is read when no limit is set anywhere."""
    subject = limited(agents, host)
    if not subject:
        return {}
    now = clock.now()
    ledger = load(conn, now)
    expected = {a.name: _expected_now(conn, ledger, a) for a in subject}
    return agent_holds(ledger, subject, host, now, expected)


# The tick asks every tick: an agent's expected cost is worked out again only once the ledger has a
# new settlement of its (recent_costs sorts the agent's runs of the last KEEP_S, thousands on a busy
# host). Keyed by database file and agent: (its settled runs seen, expected).
_expected: dict[tuple[str, str], tuple[int, float]] = {}


def _expected_now(conn, ledger: Ledger, agent) -> float:
    if agent.max_run_usd is not None:
        return float(agent.max_run_usd)
    key = (_database(conn), agent.name)
    settled = sum(1 for r in ledger.runs.values() if r.agent == agent.name and r.usd is not None)
    known = _expected.get(key)
    if known is None or known[0] != settled:
        known = _expected[key] = (settled, expected_cost(None, recent_costs(ledger, agent.name)))
    return known[1]


def waiting(conn) -> dict[str, str]:
    """task → the words it waits with (its latest spend-held since its last reservation)."""
    return {task: held.get("why", "") for task, held in load(conn, clock.now()).held.items()}


def hold_task(conn, task: str, agent, host: SpendLimits, source: str) -> str | None:
    """The tick's word that `task` waits because its agent is over a limit: in one transaction, the
    hold checked again on the ledger read inside it, then its `spend-held` (once per wording) and the
    100 % alerts due, as a held claim records them (none is attempted: no rule hands the run out).
    Returns why it waits (None: the agent may run after all)."""
    from pulse.store.connection import Transaction
    with Transaction(conn):
        try:
            now = clock.now()
            ledger = load(conn, now)
            expected = expected_cost(agent.max_run_usd, recent_costs(ledger, agent.name))
            hold = hold_of(measures(ledger, scopes_of(agent, host), now), expected)
            if hold is None:
                return None
            events, effects = _held_writes(ledger, hold, agent.name, task, None, now, source)
            _write(conn, events, effects, source)
        except BaseException:
            forget(conn)
            raise
        return hold.why


def with_queued(m: Measure, runs: int, expected_usd: float) -> Measure:
    """`m` as it will be once `runs` more runs, not reserved yet, are (each at `expected_usd`)."""
    return msgspec.structs.replace(m, used=m.used + (runs if m.unit == "runs" else runs * expected_usd))


def hold_reason(conn, agent, host: SpendLimits, queued: dict[str, int] | None = None) -> str | None:
    """Why a run of `agent` starting now would be held by a spend limit, or None. Reads only: the
    fleet asks it before taking a task for `agent`; the claim's `reserve` still decides the run.
    `queued`: runs per agent already promised and not reserved yet (the fleet tasks this host took
    that its executor has not claimed): they count as if reserved at the expected cost, failing closed."""
    now = clock.now()
    queued = queued or {}
    try:
        ledger = load(conn, now)
        expected = expected_cost(agent.max_run_usd, recent_costs(ledger, agent.name))
        ms = measures(ledger, scopes_of(agent, host), now)
    except BaseException:
        forget(conn)
        raise
    ahead = [with_queued(m, sum(queued.values()) if m.scope == HOST else queued.get(agent.name, 0), expected)
             for m in ms]
    blocked = [m for m in ahead if crossing(m, expected)]
    return "; ".join(m.words() for m in blocked) if blocked else None


def settle(conn, effect_id: str, agent, host: SpendLimits, cost_usd: float | None, source: str,
           interrupted: bool = False, started: bool = True) -> dict | None:
    """The run ended: its reservation becomes its real cost (one transaction; once). No cost
    reported: 0, counted in runs only; interrupted (its executor died): what it reserved stands;
    never started (its task had moved on): 0.
    Tells the operator of a limit the real cost reached. Returns the spend-settled data (None:
    nothing was reserved, or it was settled already)."""
    from pulse.store.connection import Transaction
    with Transaction(conn):
        now = clock.now()
        ledger = load(conn, now)
        run = ledger.runs.get(effect_id)
        if run is None or run.usd is not None:
            return None
        if not started:
            data = {"usd": 0.0, "cost_reported": None, "started": False, "note": "the run never started"}
        elif cost_usd is not None:
            data = {"usd": round(float(cost_usd), 6), "cost_reported": True}
        elif interrupted:
            data = {"usd": run.reserved, "cost_reported": False,
                    "note": "interrupted: its cost is unknown, so what it reserved stands"}
        else:
            data = {"usd": 0.0, "cost_reported": False,
                    "note": "the CLI reported no cost: this run counts against runs_per_hour only"}
        data = {"effect_id": effect_id, "agent": run.agent, "task": run.task, "reserved": run.reserved, **data}
        try:
            _write(conn, [now_event(SpendEvent.SETTLED, source, run.agent, data)], [], source)
            _write_due_alerts(conn, scopes_of(agent, host), now, source,
                              f"after {run.agent}'s run on {run.task} cost ${data['usd']:.2f}")
        except BaseException:
            forget(conn)
            raise
        return data


def observe(conn, observed: list[tuple[str, dict]], host: SpendLimits, source: str) -> None:
    """The telemetry receiver's word on what sessions Pulse did not start spent (target, data:
    usd, counted, service, session), in one transaction with the host's alerts it brings due."""
    from pulse.store.connection import Transaction
    with Transaction(conn):
        try:
            now = clock.now()
            events = [now_event(SpendEvent.OBSERVED, source, target, {**d, "at": now}) for target, d in observed]
            _write(conn, events, [], source)
            if any(d.get("counted") for _, d in observed):
                spent = sum(d["usd"] for _, d in observed if d.get("counted"))
                _write_due_alerts(conn, [(HOST, host)], now, source,
                                  f"sessions Pulse did not start reported ${spent:.2f} more")
        except BaseException:
            forget(conn)
            raise


def sessions_overview(ledger: Ledger, now: float) -> list[dict]:
    """The sessions Pulse did not start that spent this month, most recent first: each counted one
    (its telemetry came with the receiver's token), then all the others as one row (`session` None)."""
    day, month = window_start("day", now), window_start("month", now)
    rows = []
    for who, seen in sorted(ledger.sessions.items(), key=lambda kv: -kv[1]["last"]):
        month_usd = ledger.sessions_usd(month, counted_only=False, who=who)
        if not month_usd and seen["last"] < month:
            continue
        rows.append({"session": None if who == UNCOUNTED else who.removeprefix("session:"),
                     "service": seen["service"], "counted": who != UNCOUNTED,
                     "today_usd": ledger.sessions_usd(day, counted_only=False, who=who), "month_usd": month_usd,
                     "last_at": seen["last"]})
    return sorted(rows, key=lambda r: not r["counted"])


def reset(conn, agent: str, source: str, **data) -> Event:
    """`pulsectl budget reset AGENT`: its runs so far count no more (an event, like every operator action)."""
    from pulse.store import eventsdb
    return eventsdb.append_events(conn, [now_event(SpendEvent.RESET, source, agent,
                                                   {"at": clock.now(), **data})])[0]


def reservation(conn, effect_id: str) -> dict | None:
    """The spend-reserved data of a run (its cap_usd: the dollars left when it started)."""
    from pulse.store import eventsdb
    facts = eventsdb.effect_facts(conn, effect_id, SpendEvent.RESERVED)
    return facts[-1] if facts else None


# -- what an operator reads: pulsectl budget, /metrics, the report -----------------------------------

def overview(ledger: Ledger, agents: list, host: SpendLimits, now: float) -> list[dict]:
    """Per agent, then the host: spend today and this month, runs in the last hour, each against its
    limit (None: no limit), the runs that reported no cost, and the tasks waiting on a limit."""
    rows = []
    for name, limits in [*((a.name, a.budget) for a in agents), (HOST, host)]:
        month = ledger.counted(name, window_start("month", now))
        rows.append({
            "agent": name,
            "today_usd": ledger.used(name, "usd_per_day", now), "usd_per_day": limits.usd_per_day,
            "month_usd": ledger.used(name, "usd_per_month", now), "usd_per_month": limits.usd_per_month,
            "runs_last_hour": int(ledger.used(name, "runs_per_hour", now)), "runs_per_hour": limits.runs_per_hour,
            "runs_this_month": len(month),
            "running_reserved_usd": round(sum(r.reserved for r in month if r.usd is None), 6),
            "runs_without_cost": sum(1 for r in month if r.cost_reported is False),
            "waiting_tasks": sorted((t for t, h in ledger.held.items() if name in (HOST, h.get("agent"))),
                                    key=tasks.id_order),
            "reset_at": ledger.resets.get(name),
            # the host's: what sessions Pulse did not start spent, counted in its today_usd and month_usd
            **({"sessions_today_usd": ledger.sessions_usd(window_start("day", now)),
                "sessions_month_usd": ledger.sessions_usd(window_start("month", now))} if name == HOST else {}),
        })
    return rows
