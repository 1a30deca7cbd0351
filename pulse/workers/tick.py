"""The tick process: snapshot → rule chain → effects (Understand).

Each tick: fold new events into the projections, read the latest vitals of the
sense keys, run the survival rules around the engine's business chain, commit
the effects in one transaction, ring the executor, then sleep the returned
tick_ms (clamped) or until rung on the wake socket. The engine is called over
RPC with a deadline: dead, frozen, slow, raising or returning garbage all mean
"inner returned no effects" and an `error` event. The tick never waits on
execution, and keeps no rule memory that is not folded from events.db.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Callable

import msgspec
import zmq

from pulse.agents import routing, spend, tasks
from pulse.core import client, clock, schedule
from pulse.core.config import MAX_MEMORY_WINDOW_SAMPLES
from pulse.core.states import EffectState, WorkerState
from pulse.core.wire import codec, controlmsgs, doorbells, enginerpc, eventmsgs
from pulse.core.wire.eventmsgs import EFFECT_END_STATES, ON_CRASH_LOOP, STOP_PROCESS, EffectEvent, EffectKind, EventType, TaskEvent
from pulse.effects import configfiles, registry
from pulse.rules import budget, guardview, onion, survival
from pulse.sensing.builtin import died
from pulse.store import ballast, effectqueue, errorruns, eventsdb, projection, schedulerun, vitalsdb
from pulse.workers.harness import Worker

OUTCOMES_PER_TARGET = 10
RUNS_KEPT = 64          # starts and exits kept per guarded process (max_restarts is at most 50)
PROCESS_ACTIONS = {eventmsgs.ProcessAction.STOP: True, eventmsgs.ProcessAction.START: False,   # → stopped
                   eventmsgs.ProcessAction.RESTART: False}
HISTORY_SAMPLES = 20
# Events folded per read. The first tick of a new tick worker folds the whole history: in batches of
# 5,000 its RSS kept some 11 MiB more on a 16,000-effect history (freed, not returned), so each
# replacement started higher as the history grew; 500 keeps about 1 MiB (the hour-long soak).
FOLD_BATCH = 500
MAX_EFFECTS_PER_TICK = 1_000
ENGINE_REPLY_MAX_BYTES = 4 * 1024 * 1024

# panicRollback answers survival's repairs of the host failing in a row since a promote: the new
# engine may be what breaks the host. Its own answer, a rollback (a repair of the engine), does not
# count: a rollback that failed must not call for another.
HOST_REPAIRS = registry.repair_kinds(registry.Repair.HOST)


@dataclass
class Promote:
    id: int
    ts: float
    before: str
    after: str
    rolled_back: bool = False


@dataclass
class Projections:
    """What the snapshot needs from events.db, folded incrementally (never a full scan per tick)."""
    last_id: int = 0
    pending: dict[str, enginerpc.Effect] = field(default_factory=dict)
    outcomes: dict[str, collections.deque] = field(default_factory=dict)
    notified: dict[str, float] = field(default_factory=dict)
    promotes: list[Promote] = field(default_factory=list)
    crashes: int = 0                       # engine crashes since the last promote
    corrective_streak: int = 0             # survival's HOST_REPAIRS failed in a row since the last promote
    paused: dict[str, float] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)         # processes an operator holds down (process-stop)
    removed: dict[str, dict] = field(default_factory=dict)  # taken out by a reload, not yet stopped (Snapshot.removed)
    exits: dict[str, enginerpc.ProcessExit] = field(default_factory=dict)
    engine_failed_at: float | None = None
    escalated: tuple[float, str] | None = None   # the last time pulsed stopped everything: (when, why)
    engine_recent: collections.deque = field(default_factory=collections.deque)   # (ts, fingerprint) of engine effects
    engine_horizon_s: float = budget.WINDOW_S    # engine_recent keeps this far back
    engine_retryable: dict = field(default_factory=dict)   # fingerprint → when its last engine effect failed
    known_good: dict[str, enginerpc.KnownGood] = field(default_factory=dict)   # process → its known-good config
    schedules: schedule.ScheduleBook = field(default_factory=schedule.ScheduleBook)   # what each schedule ran
    runs: dict[str, "Runs"] = field(default_factory=dict)   # guarded process → its starts and exits

    def fold(self, events: list[eventmsgs.Event]) -> None:
        for ev in events:
            self.last_id = ev.id
            fold = _FOLDS.get(ev.type)
            if fold is not None:
                fold(self, ev)
            if ev.type in configfiles.FOLDED_EVENTS:
                configfiles.fold(self.known_good, ev)
            if ev.type in schedule.FOLDED:
                self.schedules.fold_one(ev)

    def _effect(self, ev: eventmsgs.Event) -> None:
        effect = msgspec.convert(ev.data, enginerpc.Effect)
        self.pending[effect.id] = effect
        if effect.kind == ON_CRASH_LOOP and effect.target is not None:
            runs = self.runs_of(effect.target)
            runs.way_out_at, runs.way_out_ended, runs.way_out_said = ev.ts, 0.0, None
        if effect.kind == STOP_PROCESS and effect.params.get("reload") == self.removed.get(effect.target, {}).get("reload"):
            self.removed.pop(effect.target, None)      # its stop is committed: once
        if effect.origin == "engine":
            self.engine_recent.append((ev.ts, budget.fingerprint(effect)))
            self.engine_retryable.pop(self.engine_recent[-1][1], None)
            while self.engine_recent and ev.ts - self.engine_recent[0][0] > self.engine_horizon_s:
                self.engine_recent.popleft()
        if registry.tells_operator(effect.kind) and effect.params.get("rule"):   # a notification, the daily report
            self.notified[f"{effect.params['rule']}:{effect.target}"] = ev.ts

    def _ended(self, ev: eventmsgs.Event) -> None:
        effect_id = ev.data.get("effect_id", "")
        effect = self.pending.get(effect_id)
        state = EFFECT_END_STATES[ev.type]
        if effect is not None and effect.origin == "survival" and effect.kind in HOST_REPAIRS:
            self.corrective_streak = 0 if state == EffectState.ACKED else self.corrective_streak + 1
        if ev.data.get("requeued"):
            return   # an idempotent effect going round again: still pending
        if effect is not None and effect.origin == "engine" and state != EffectState.ACKED:
            self.engine_retryable[budget.fingerprint(effect)] = ev.ts
            if len(self.engine_retryable) > 1_000:    # only those within the dedupe window matter
                self.engine_retryable = {fp: ts for fp, ts in self.engine_retryable.items()
                                         if ev.ts - ts <= self.engine_horizon_s}
        self.pending.pop(effect_id, None)
        outcome = enginerpc.Outcome(effect_id=effect_id, kind=ev.data.get("kind", ""), state=state, ts=ev.ts,
                               error=ev.data.get("error") or ev.data.get("reason"))
        target = ev.target if ev.target is not None else (effect.target if effect else None)
        if target is not None:
            self.outcomes.setdefault(target, collections.deque(maxlen=OUTCOMES_PER_TARGET)).append(outcome)
        if outcome.kind == EffectKind.RESTART_PROCESS and target is not None and state != EffectState.EXPIRED:
            pid = ev.data.get("pid")
            self.runs_of(target).started(ev.ts, state == EffectState.ACKED, effect, pid if isinstance(pid, int) else 0)
        if outcome.kind == ON_CRASH_LOOP and target is not None:
            self.runs_of(target).way_out_done(ev.ts, state, ev.data)

    def _promote(self, ev: eventmsgs.Event) -> None:
        self.promotes = self.promotes[-9:] + [Promote(ev.id, ev.ts, ev.data.get("before", ""), ev.data.get("after", ""))]
        self.crashes = self.corrective_streak = 0

    def _rollback(self, ev: eventmsgs.Event) -> None:
        if self.promotes:
            self.promotes[-1].rolled_back = True

    def _exited(self, ev: eventmsgs.Event) -> None:
        if ev.target == "engine" and ev.data.get("state") != "stopping" and self.promotes:
            self.crashes += 1

    def _failed(self, ev: eventmsgs.Event) -> None:
        if ev.target == "engine":
            self.engine_failed_at = ev.ts

    def _stopping(self, ev: eventmsgs.Event) -> None:
        if ev.data.get("exit_code"):
            self.escalated = (ev.ts, ev.data.get("reason", ""))

    def _pause(self, ev: eventmsgs.Event) -> None:
        self.paused[ev.target] = ev.data.get("until", 0.0)

    def _resume(self, ev: eventmsgs.Event) -> None:
        self.paused.pop(ev.target, None)

    def _reload(self, ev: eventmsgs.Event) -> None:
        for name in ev.data.get("processes_added") or ():
            self.removed.pop(name, None)
        for name in [*(ev.data.get("processes_removed") or ()), *(ev.data.get("processes_kept") or ())]:
            self.stopped.discard(name)     # its hold ends with its table: added again, it starts afresh
        for name, definition in (ev.data.get("removed_definitions") or {}).items():
            self.removed[name] = {"reload": ev.id, "definition": definition}

    def _process_exited(self, ev: eventmsgs.Event) -> None:
        if ev.target is not None and isinstance(ev.data.get("pid"), int):
            self.exits[ev.target] = enginerpc.ProcessExit(pid=ev.data["pid"], ts=ev.ts, code=ev.data.get("code"),
                                                     signal=ev.data.get("signal"), tail=ev.data.get("tail") or "")
            self.runs_of(ev.target).exits.append(self.exits[ev.target])

    def _operator(self, ev: eventmsgs.Event) -> None:
        """An operator's stop, start or restart of a guarded process (pulsed records those of workers
        with plain actions; a process's carry the `process-` prefix, as a process may share a worker's
        name): held down after a stop until a start or restart, its crash count started over."""
        stopped = PROCESS_ACTIONS.get(str(ev.data.get("action")))
        if ev.target is None or stopped is None:
            return
        (self.stopped.add if stopped else self.stopped.discard)(ev.target)
        runs = self.runs_of(ev.target)
        runs.stopped, runs.operator_at = stopped, ev.ts

    def runs_of(self, name: str) -> "Runs":
        return self.runs.setdefault(name, Runs())

    def lifecycle(self, now: float, window_s: float) -> enginerpc.Lifecycle:
        """The engine since its last promote; last known good = newest promote clean past its window."""
        if not self.promotes:
            return enginerpc.Lifecycle()
        last = self.promotes[-1]
        good = next((p.after for p in reversed(self.promotes)
                     if not p.rolled_back and now - p.ts > window_s), self.promotes[0].before)
        return enginerpc.Lifecycle(promote_id=last.id, promote_ts=last.ts, before=last.before, after=last.after,
                              rolled_back=last.rolled_back, last_known_good=good, crashes=self.crashes,
                              corrective_streak=self.corrective_streak)


def fold_projections(p: Projections, events) -> None:
    p.fold(events)


def dump_projections(p: Projections) -> dict:
    """The tick's projections as msgspec encodes them (its deques as lists)."""
    return msgspec.to_builtins(p, enc_hook=_deque_as_list)


def _deque_as_list(obj):
    if isinstance(obj, collections.deque):
        return list(obj)
    raise NotImplementedError(type(obj))


def load_projections(raw: dict) -> Projections:
    """dump_projections' output back as the tick's projections, each deque with its bound."""
    outcomes, recent, runs = raw.pop("outcomes", {}), raw.pop("engine_recent", []), raw.pop("runs", {})
    p = msgspec.convert(raw, Projections)
    p.outcomes = {target: collections.deque(msgspec.convert(q, list[enginerpc.Outcome]), maxlen=OUTCOMES_PER_TARGET)
                  for target, q in outcomes.items()}
    p.engine_recent = collections.deque((ts, fp) for ts, fp in recent)
    p.runs = {name: Runs(starts=collections.deque(msgspec.convert(r["starts"], list[enginerpc.ProcessStart]), maxlen=RUNS_KEPT),
                         exits=collections.deque(msgspec.convert(r["exits"], list[enginerpc.ProcessExit]), maxlen=RUNS_KEPT),
                         restarts=r["restarts"], stopped=r["stopped"], operator_at=r["operator_at"],
                         way_out_at=r["way_out_at"], way_out_ended=r["way_out_ended"], way_out_said=r["way_out_said"])
              for name, r in runs.items()}
    return p


def tick_projection(engine_horizon_s: float) -> projection.Projection[Projections]:
    """The snapshot's projections as one checkpointed fold. The horizon is config, not history: it is
    part of the version, so a change of it rebuilds rather than keeping what the old one trimmed."""
    return projection.Projection(
        name="tick", new=lambda: Projections(engine_horizon_s=engine_horizon_s), fold=fold_projections,
        dump=dump_projections, load=load_projections,
        code=(Projections, Promote, Runs, enginerpc.Effect, enginerpc.Outcome, enginerpc.ProcessExit, enginerpc.ProcessStart,
              enginerpc.KnownGood,
              configfiles.fold,
              schedule.ScheduleBook, schedule.ScheduleState, budget.fingerprint, registry.tells_operator,
              OUTCOMES_PER_TARGET, HOST_REPAIRS, repr(sorted(_FOLDS_NAMES)), engine_horizon_s))


_FOLDS = {
    EffectEvent.COMMITTED: Projections._effect,
    **{end: Projections._ended for end in EFFECT_END_STATES},
    EventType.PROMOTE: Projections._promote,
    EventType.ROLLBACK: Projections._rollback,
    EventType.WORKER_EXITED: Projections._exited,
    EventType.WORKER_FAILED: Projections._failed,
    EventType.SUPERVISOR_STOPPING: Projections._stopping,
    EventType.PAUSE: Projections._pause,
    EventType.PROCESS_EXITED: Projections._process_exited,
    EventType.OPERATOR: Projections._operator,
    EventType.RESUME: Projections._resume,
    EventType.RELOAD: Projections._reload,
}
_FOLDS_NAMES = {t: f.__name__ for t, f in _FOLDS.items()}


@dataclass
class Runs:
    """A guarded process's recent starts and exits (the snapshot's enginerpc.ProcessRuns)."""
    starts: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RUNS_KEPT))
    exits: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RUNS_KEPT))
    restarts: int = 0
    stopped: bool = False
    operator_at: float = 0.0
    way_out_at: float = 0.0
    way_out_ended: float = 0.0
    way_out_said: str | None = None

    def started(self, ts: float, ok: bool, effect: enginerpc.Effect | None, pid: int) -> None:
        origin = effect.origin if effect is not None else "survival"
        params = effect.params if effect is not None else {}
        attempt = params.get("attempt")
        self.starts.append(enginerpc.ProcessStart(ts, ok, origin, params.get("why"),
                                             attempt if isinstance(attempt, int) else 0,
                                             effect.created if effect is not None and effect.created else ts, pid))
        self.restarts += 1
        if origin == "operator":            # an operator's start: a crash loop counts again from here
            self.stopped, self.operator_at = False, ts

    def way_out_done(self, ts: float, state: str, data: dict) -> None:
        """Its on_crash_loop argv ended: when, and how in words (its code and the last line it said)."""
        code, said = data.get("code"), (data.get("tail") or "").strip().splitlines()[-1:]
        words = f"exit code {code}" if isinstance(code, int) else data.get("error") or data.get("reason") or state
        self.way_out_ended, self.way_out_said = ts, words + (f": {said[0][:200]}" if said else "")

    def view(self) -> enginerpc.ProcessRuns:
        return enginerpc.ProcessRuns(starts=list(self.starts), exits=list(self.exits), restarts=self.restarts,
                                stopped=self.stopped, operator_at=self.operator_at, way_out_at=self.way_out_at,
                                way_out_ended=self.way_out_ended, way_out_said=self.way_out_said)


def clamp_tick_ms(value: int | None, default: int, low: int, high: int) -> int:
    return min(max(default if value is None else value, low), high)


def news_of_a_death(prev: enginerpc.Snapshot | None, curr: enginerpc.Snapshot) -> bool:
    """A process alive in the last tick's snapshot is dead in this one (the watcher's own judgement,
    which rings the tick: sensing.builtin.died), or its keeper recorded a new exit: what a death's
    wake says. The snapshot can carry it before the wake arrives (the watcher writes its sample, then
    rings), so a tick already due does not give a frozen engine the long deadline while survival
    holds a restart."""
    if prev is None:
        return False
    if any(key.startswith("process-alive:") and died([v for v in (prev.vitals.get(key), vital) if v is not None])
           for key, vital in curr.vitals.items()):
        return True
    return any(prev.exits.get(name) != ended for name, ended in curr.exits.items())


class EngineClient:
    """The tick's side of the engine RPC: request id, absolute deadline, late replies dropped."""

    def __init__(self, sock: zmq.Socket, deadline_s: float, poll: Callable[[zmq.Socket, int, int], bool]):
        self.sock, self.deadline_s, self.poll = sock, deadline_s, poll   # poll: the worker's (ends at a SIGTERM)
        self.ids = itertools.count(1)
        self.unresponsive = False   # after a timeout: ping without waiting until it answers again

    def _drain(self) -> list[object]:
        replies = []
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return replies
            try:
                replies.append(codec.decode(frame, enginerpc.EngineReply))
            except codec.Malformed:
                replies.append(None)

    def run_chain(self, prev: enginerpc.Snapshot | None, curr: enginerpc.Snapshot,
                  deadline_s: float | None = None) -> tuple[enginerpc.ChainResult | None, str | None]:
        """(result, None) or (None, why the engine gave nothing); deadline_s: this call's, if not the usual."""
        deadline_s = self.deadline_s if deadline_s is None else deadline_s
        if self.unresponsive:
            if any(isinstance(r, enginerpc.Pong) for r in self._drain()):
                self.unresponsive = False
            else:
                self._send(enginerpc.Ping(next(self.ids), time.time() + deadline_s))
                return None, "engine unresponsive since its last deadline; skipped"
        self._drain()   # whatever is left over is late
        request_id = next(self.ids)
        deadline = time.time() + deadline_s
        # IMMEDIATE: writable only once connected (a freshly started engine may take a moment)
        if not (self.poll(self.sock, clock.poll_ms(deadline_s), zmq.POLLOUT)
                and self._send(enginerpc.RunChain(request_id, deadline, prev, curr))):
            return None, "engine not connected"
        while (left := deadline - time.time()) > 0:
            if not self.poll(self.sock, clock.poll_ms(left), zmq.POLLIN):
                break
            for reply in self._drain():
                if reply is None:
                    return None, "engine sent a malformed reply"
                if isinstance(reply, enginerpc.ChainResult) and reply.id == request_id:
                    return reply, None
        self.unresponsive = True
        return None, f"engine did not answer within {deadline_s * 1000:.0f} ms"

    def _send(self, message) -> bool:
        try:
            self.sock.send(codec.encode(message), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False


class TickWorker(Worker):
    name = "tick"

    def open(self) -> None:
        t = self.config.timings
        self.events = eventsdb.open_events(self.paths.events_db)
        self.vitals = vitalsdb.open_vitals(self.paths.vitals_db)
        self.wake = self.socket(zmq.PULL, self.paths.endpoint("wake"), bind=True, handler=self.on_wake)
        # RECONNECT_IVL as the doorbells': with zmq's 100 ms, a tick could wait that long after an engine
        # restart before its first call reached the new engine
        self.engine_sock = self.socket(zmq.DEALER, self.paths.endpoint("engine"), bind=False, IMMEDIATE=1,
                                       MAXMSGSIZE=ENGINE_REPLY_MAX_BYTES, SNDHWM=4, RECONNECT_IVL=10,
                                       RECONNECT_IVL_MAX=200)
        self.control = self.socket(zmq.DEALER, self.paths.endpoint("control"), bind=False)
        self.doorbell = self.socket(zmq.PUSH, self.paths.endpoint("doorbell"), bind=False, **client.DOORBELL)
        self.engine = EngineClient(self.engine_sock, t.engine_rpc_deadline_ms / 1000, self.poll)
        self.ballast = self.paths.home / "ballast"
        ballast.keep(self.ballast, self.config.survival.ballast_mb)
        self.ballast_checked = time.monotonic()
        # Loaded from their checkpoints (or rebuilt) at the first tick, after Ready: a long history
        # must not delay it, and a restart folds only what came after the checkpoint.
        checkpoints = self.paths.home / projection.DIRECTORY
        horizon_s = max(budget.WINDOW_S, self.config.tick.engine_dedupe_s)
        self.folded = projection.Folded(tick_projection(horizon_s), self.events, checkpoints,
                                        progress=lambda: self.progress(), batch=FOLD_BATCH)
        self.projections = self.folded.projection.new()
        # agents known before their first task; ended tasks forgotten (routing needs only those held)
        agents = [a.name for a in self.config.agent]
        self.tasks_folded = (projection.Folded(tasks.book_projection("tick.tasks", agents, forget_ended=True),
                                               self.events, checkpoints, progress=lambda: self.progress())
                             if tasks.SENSE_KEY in self.config.tick.sense else None)
        self.task_book = self.tasks_folded.projection.new() if self.tasks_folded is not None else None
        self.chain = onion.compose(survival.survival_rules(self.config), self.inner)
        self.count = 0
        self.urgent = False       # woken by a critical process's death: the next tick is in a hurry
        self.prev: enginerpc.Snapshot | None = None
        self.next_tick = time.monotonic()
        self.last_tick = 0.0
        self.inner_note: str | None = None
        self.inner_failed = False

    def on_ready(self) -> None:
        # the rule chain's loop (its selector and self-pipe, ~0.5 ms of a restart) is first needed
        # by the first tick, which comes after Ready
        self.loop = asyncio.new_event_loop()

    # -- inputs ----------------------------------------------------------------------------------

    def on_wake(self) -> None:
        message = self.receive(self.wake.recv(), doorbells.Wake, "wake")
        if message is None:
            return
        self.log.debug("woken by %s (%s)", message.source, message.reason)
        # Outcomes of the engine's effects wake it at most every outcome_wake_min_ms: a rule that
        # answers every outcome with a new effect must not spin the tick (and the host) at tick_ms_min.
        gap_ms = (self.config.tick.outcome_wake_min_ms if message.reason == "engine-effect-ended"
                  else self.config.timings.tick_ms_min)
        # A critical process died: survival must restart it now, so the engine gets a short deadline,
        # and the tick runs at once, not tick_ms_min after the last (a death comes once, and a process
        # that keeps dying is paced by its backoff, so this cannot spin the tick).
        died = message.reason.startswith(("process-alive:", "process-exited:"))
        self.urgent = self.urgent or died
        soonest = time.monotonic() if died else self.last_tick + gap_ms / 1000
        self.next_tick = min(self.next_tick, max(time.monotonic(), soonest))

    def fold(self) -> None:
        """Fold what was committed since the last tick (at the first, since the checkpoint)."""
        self.projections = self.folded.catch_up()
        if self.tasks_folded is not None:
            self.task_book = self.tasks_folded.catch_up()

    def engine_state(self) -> enginerpc.EngineHealth:
        """The engine worker's state from pulsed: the tick never calls an engine that is not running."""
        try:
            while self.control.poll(0):
                self.control.recv()   # a late answer to an earlier question: stale
            self.control.send(codec.encode(controlmsgs.GetStatus()), zmq.NOBLOCK)
            if self.control.poll(100):
                reply = codec.decode(self.control.recv(), controlmsgs.Reply)
                engine = next(w for w in reply.status.workers if w.name == "engine")
                promotes = self.projections.promotes
                errors = errorruns.engine_errors_since(self.events, promotes[-1].id if promotes else 0)
                return enginerpc.EngineHealth(engine.state, engine.restarts, errors, self.projections.engine_failed_at)
        except (zmq.ZMQError, codec.Malformed, StopIteration, AttributeError):
            pass
        return enginerpc.EngineHealth("unknown")

    # -- one tick --------------------------------------------------------------------------------

    def snapshot(self) -> enginerpc.Snapshot:
        self.fold()
        p = self.projections
        now = time.time()
        over_budget = self.over_budget() if self.task_book is not None else {}
        extras = (self.task_book.extras(routing.takeable(self.config.agent, over_budget))
                  if self.task_book is not None else {})
        open_effects = list(p.pending.values())
        return enginerpc.Snapshot(
            pending_tasks=routing.route(self.config.agent, extras.get("pending-tasks")),
            agent_capability_stats=extras.get("agent-capability-stats", {}),
            agents=(routing.loads(self.config.agent, self.task_book.states.values(), open_effects, over_budget)
                    if self.task_book is not None else {}),
            tick=self.count, ts=now,
            vitals=vitalsdb.latest_vitals(self.vitals, self.config.tick.sense),
            pending=list(p.pending.values()),
            outcomes={target: list(q) for target, q in p.outcomes.items()},
            engine=self.engine_state(),
            last_promote=p.promotes[-1].ts if p.promotes else None,
            notified=dict(p.notified),
            exits=dict(p.exits),
            runs={name: runs.view() for name, runs in p.runs.items()},
            escalated=p.escalated[0] if p.escalated else None,
            escalation=p.escalated[1] if p.escalated else None,
            lifecycle=p.lifecycle(now, self.config.survival.auto_rollback_window_s),
            paused={name: until for name, until in p.paused.items() if until > now},
            stopped=sorted(p.stopped), removed=dict(p.removed),
            known_good=dict(p.known_good),
            history=read_history(self.vitals, survival.counted_keys(self.config), survival.trend_windows(self.config),
                                 now))

    # -- spend limits: an agent over one gets no run handed out, and its tasks say why they wait ------

    def over_budget(self) -> dict[str, str]:
        """agent → why one more run of it would cross a spend limit now. A read that fails leaves the
        snapshot without holds: the executor's claim still checks every run (fail closed there)."""
        try:
            return {name: hold.why for name, hold in spend.holds(self.events, self.config.agent,
                                                                 self.config.budget).items()}
        except sqlite3.Error as err:
            self.log.warning("could not read the spend ledger: %s", err)
            return {}

    def hold_budget_waits(self, curr: enginerpc.Snapshot) -> bool:
        """Record why each listed task whose agents are all over a limit waits (its `spend-held`, and the
        100 % alerts due), as a held claim would have; the tick hands such a task no run. True when it
        wrote (a notification may be among what it committed: the executor is rung)."""
        if self.config.observe_only:
            return False
        waits = routing.budget_waits(curr.pending_tasks, curr.agents, curr.pending)
        if not waits:
            return False
        agents = {a.name: a for a in self.config.agent}
        told = False
        try:
            said = spend.waiting(self.events)
            for task, agent in waits.items():
                if said.get(task) != curr.agents[agent].budget:
                    told = spend.hold_task(self.events, task, agents[agent], self.config.budget, "tick") is not None or told
        except sqlite3.Error as err:   # locked or full: the next tick records it
            self.log.warning("could not record why tasks wait on a spend limit: %s", err)
        return told

    async def inner(self, prev: enginerpc.Snapshot | None, curr: enginerpc.Snapshot) -> onion.RuleResult:
        """The innermost layer: the engine's business chain, across the process boundary."""
        if curr.engine.state != WorkerState.RUNNING:
            self.inner_note = f"engine {curr.engine.state}; skipped"
            return [], None
        urgent = self.urgent or news_of_a_death(prev, curr)
        urgent_s = self.config.timings.engine_urgent_deadline_ms / 1000 if urgent else None
        result, why = self.engine.run_chain(prev, curr, urgent_s)
        if result is None:
            if self.stop_requested():    # pulsed stopped the engine first: not the engine's failure
                self.inner_note = "stopping; engine skipped"
            else:
                self.inner_error(why)
            return [], None
        if result.error is not None:
            self.inner_note = f"engine rules raised: {result.error}"   # the engine recorded the error itself
            self.inner_failed = True
            return [], None
        effects = [msgspec.structs.replace(e, origin="engine") for e in result.effects]
        self.inner_note = "ok"
        return effects, result.tick_ms

    def record_error(self, target: str | None, message: str) -> None:
        store = self.config.store
        errorruns.record_error(self.events, "tick", target, message, coalesce_s=store.error_coalesce_s,
                        repeat_s=store.error_repeat_s)

    def settle_errors(self) -> None:
        """Append what the error runs counted since their last event, once due: without this, the last
        repeats of an error that stopped would be counted in error_runs only, never in the history.
        The tick does it for every recorder because it is the one worker that always runs, often."""
        store = self.config.store
        try:
            errorruns.settle_error_runs(self.events, store.error_coalesce_s, store.error_repeat_s)
        except sqlite3.OperationalError as err:   # locked or full: the next tick settles them
            self.log.warning("could not settle the error runs: %s", err)

    def inner_error(self, message: str) -> None:
        self.inner_note, self.inner_failed = message, True
        self.record_error("engine", message)

    def run_tick(self) -> None:
        t = self.config.timings
        started = time.monotonic()
        self.count += 1
        self.inner_note, self.inner_failed = None, False
        self.run_schedules()     # first: the engine's state does not matter, and its rules see the new tasks
        curr = self.snapshot()
        try:
            effects, tick_ms = self.loop.run_until_complete(self.chain(self.prev, curr))
            problem = validate_effects(effects)
        except Exception as err:   # a survival rule must never stop the tick
            effects, tick_ms, problem = [], None, f"rule chain raised {type(err).__name__}: {err}"
            self.log.exception("rule chain raised")
        if problem:
            self.record_error(None, problem)
            effects = []
        effects, over = routing.over_budget_runs(effects, curr.agents)
        if over:
            self.log.debug("dropped %d agent-run effects for agents over a spend limit", len(over))
        told = self.hold_budget_waits(curr)
        effects = self.within_budget(effects, curr) + self.schedule_notices(curr)
        tick_ms = clamp_tick_ms(tick_ms, t.tick_ms, t.tick_ms_min, t.tick_ms_max)
        now = time.time()
        committed = [effectqueue.new_effect(e, e.origin or "survival", t.effect_deadline_s, now) for e in effects]
        duration_ms = round((time.monotonic() - started) * 1000, 2)
        record = dict(n=self.count, effects=len(committed), tick_ms=tick_ms, inner=self.inner_note,
                      duration_ms=duration_ms, started_mono=started)
        # Every tick is a vital (kept 24 h); only a tick that did something, or whose engine
        # call went wrong, is also an event: events.db is never compacted.
        notable = committed or self.inner_failed
        self.commit_tick(committed, [eventmsgs.now_event(EventType.TICK, "tick", None, record)] if notable else [])
        if (committed or told) and not self.config.observe_only:
            self.ring_executor()     # before the tick's own bookkeeping: a restart waits on nothing of it
        try:
            vitalsdb.append_vitals(self.vitals, [enginerpc.Vital("tick", now, record)])
        except sqlite3.OperationalError as err:   # a full or locked vitals.db costs this record only
            self.log.warning("could not record tick %d in vitals.db: %s", self.count, err)
        self.settle_errors()
        if time.monotonic() - self.ballast_checked > self.config.timings.ballast_check_s and self.disk_has_room(curr):
            self.ballast_checked = time.monotonic()
            ballast.keep(self.ballast, self.config.survival.ballast_mb)
        self.prev = curr
        self.urgent = False
        self.last_tick = time.monotonic()
        self.next_tick = started + tick_ms / 1000
        if self.config.schedule:   # wake for the next slot, not up to tick_ms after it
            due_in = max(self.next_schedule_due() - time.time(), t.tick_ms_min / 1000)
            self.next_tick = min(self.next_tick, time.monotonic() + due_in)

    def within_budget(self, effects: list[enginerpc.Effect], curr: enginerpc.Snapshot) -> list[enginerpc.Effect]:
        """The engine's effects that its budget admits; for each rule over it, one coalesced error and,
        at most every notify_every_s, a notification."""
        tk = self.config.tick
        p = self.projections
        kept, dropped = budget.admit(effects, p.engine_recent, curr.ts, tk.engine_dedupe_s,
                                     tk.engine_effects_per_min, p.engine_retryable)
        for rule, why in budget.culprits(dropped).items():
            message = f"engine rule {rule!r} is over its effect budget: effects dropped ({why})"
            self.record_error("engine", message)
            if survival.may_notify(curr, "engine-budget", rule, self.config.survival.notify_every_s):
                kept.append(survival.notify(curr, "engine-budget", rule, f"engine rule {rule} floods", message))
        return kept

    # -- schedules: the tick owns them, so they run whatever the engine's state ----------------------

    def run_schedules(self) -> None:
        """Each schedule's due step (run its latest due slot, or arm a new schedule), committed with its
        fact in one transaction; folded first, so a slot this or an earlier tick committed is never rerun."""
        if not self.config.schedule:
            return
        self.fold()
        now = time.time()
        for s in self.config.schedule:
            try:
                book = self.projections.schedules
                step = schedule.next_step(s, book.last_slot(s.name), now, book.open_run(s.name))
                if step is not None:
                    self.commit_schedule_step(s, step, now)
            except Exception as err:   # locked, full, anything: one schedule must never stop the tick or the others
                self.log.exception("schedule %s: could not commit its run", s.name)
                self.record_error(f"schedule:{s.name}", f"schedule {s.name}: could not commit its run: "
                                                        f"{type(err).__name__}: {err}")

    def commit_schedule_step(self, s, step: schedule.Step, now: float) -> None:
        make_task = effect = None
        extra = {}
        if step.action == "run" and s.task is not None:
            make_task = scheduled_task(s, step.slot)
        elif step.action == "run":
            effect = effectqueue.new_effect(schedule.effect_of(s), "schedule", self.config.timings.effect_deadline_s, now)
        elif step.action == "skip":
            extra = {"skipped": True, "open_run": self.projections.schedules.open_run(s.name)}
        fact = schedulerun.commit_run(self.events, s.name, "tick", slot=step.slot, make_task=make_task, effect=effect,
                                      observe_only=self.config.observe_only, late_s=round(step.late_s, 3), **extra)
        if fact is None:
            return
        self.log.info("schedule %s: %s slot %s (%.3f s after its time)", s.name, step.action,
                      time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(step.slot)), step.late_s)
        if effect is not None and not self.config.observe_only:
            self.ring_executor()

    def ring_executor(self) -> None:
        try:
            self.doorbell.send(codec.encode(doorbells.Doorbell("tick")), zmq.NOBLOCK)
        except zmq.Again:
            pass   # the executor's scan finds them

    def next_schedule_due(self) -> float:
        now = time.time()
        book = self.projections.schedules
        return min((schedule.next_due(s, book.last_slot(s.name), now, book.open_run(s.name)) for s in self.config.schedule),
                   default=now)

    def schedule_notices(self, curr: enginerpc.Snapshot) -> list[enginerpc.Effect]:
        """A schedule whose runs keep failing (notify_after in a row) is said, once per failed run at
        most every [survival] notify_every_s."""
        out = []
        for s in self.config.schedule:
            state = self.projections.schedules.states.get(s.name)
            if (state is None or not schedule.failing(state, s.notify_after)
                    or not survival.may_notify(curr, "schedule-failing", s.name, self.config.survival.notify_every_s,
                                               state.last_failure_ts)):
                continue
            out.append(survival.notify(curr, "schedule-failing", s.name, f"Schedule {s.name} keeps failing",
                                       f"its last {state.failures_in_row} runs failed (its latest run: {state.last_run})"))
        return out

    def commit_tick(self, effects: list[enginerpc.Effect], events: list[eventmsgs.Event]) -> None:
        """Commit; on a full disk, free the ballast first so the effects that free space still land.
        A commit that still fails loses this tick's effects, not the tick: the next tick decides again."""
        for attempt in (1, 2):
            try:
                effectqueue.commit_effects(self.events, effects, "tick", events=events,
                                     observe_only=self.config.observe_only)
                self.log_held_fatal(effects)
                return
            except sqlite3.OperationalError as err:
                if attempt == 1 and ballast.is_full_disk(err) and ballast.release(self.ballast):
                    self.log.error("disk full: released the %d MiB ballast to commit this tick's effects",
                                   self.config.survival.ballast_mb)
                    continue
                self.log.error("could not commit tick %d (%d effects): %s", self.count, len(effects), err)
                return

    def log_held_fatal(self, effects: list[enginerpc.Effect]) -> None:
        """A process held fatal is said in pulse.log too, whatever [[notify]] channels there are."""
        for e in effects:
            if e.kind == EffectKind.NOTIFY and e.params.get("rule") == "process-fatal":
                self.log.error("%s: %s", e.params.get("title"), str(e.params.get("message", "")).split("\n")[0])

    def disk_has_room(self, curr: enginerpc.Snapshot) -> bool:
        vital = curr.vitals.get("system-resource")
        return vital is not None and (vital.data.get("disk_pct") or 100) < self.config.survival.disk_pct

    def status_extras(self) -> dict:
        now = time.time()
        extras: dict = {"paused": {name: until for name, until in self.projections.paused.items() if until > now},
                        "stopped": sorted(self.projections.stopped)}
        if self.prev is not None:      # the guards as the last tick saw them (their config files and watched files)
            extras.update(msgspec.to_builtins(guardview.guards(
                self.prev, self.config.process, self.config.watch.file, self.config.survival,
                self.config.watch.fresh, self.config.watch.dir)))
        return extras

    def next_timer(self) -> float:
        return self.next_tick

    def on_timer(self, now: float) -> None:
        if now >= self.next_tick:
            self.run_tick()

    def close(self) -> None:
        for folded in (self.folded, self.tasks_folded):
            if folded is not None:
                folded.save()     # a clean stop: the next start folds nothing twice
        if getattr(self, "loop", None) is not None:   # None: stopped before it was ready
            self.loop.close()
        self.events.close()
        self.vitals.close()
        for sock in (self.wake, self.engine_sock, self.control, self.doorbell):
            sock.close()


def scheduled_task(s, slot: float):
    """The task-created event a run of schedule `s` at `slot` appends, given the next task number."""
    fields = schedule.task_fields(s, slot)
    return lambda n: eventmsgs.now_event(TaskEvent.CREATED, "tick", tasks.task_id(n), fields)


def read_history(conn: sqlite3.Connection, counted: list[str], windows: dict[str, float],
                 now: float) -> dict[str, list[enginerpc.Vital]]:
    """The recent samples survival counts (the last HISTORY_SAMPLES of each counted key), and for a
    key with a trend window, every sample of that window if they are more (at most
    MAX_MEMORY_WINDOW_SAMPLES, the newest): both end at the newest sample, so the longer holds the other."""
    out = {key: vitalsdb.recent_vitals(conn, key, HISTORY_SAMPLES) for key in counted}
    for key, window_s in windows.items():
        window = vitalsdb.recent_vitals(conn, key, MAX_MEMORY_WINDOW_SAMPLES, since_ts=now - window_s)
        if len(window) > len(out.get(key, ())):
            out[key] = window
    return out


def validate_effects(effects: list[enginerpc.Effect]) -> str | None:
    """Bounds no rule may exceed; None when the effects are fine."""
    if len(effects) > MAX_EFFECTS_PER_TICK:
        return f"rules emitted {len(effects)} effects in one tick (at most {MAX_EFFECTS_PER_TICK})"
    for e in effects:
        if not e.kind or len(e.kind) > 64:
            return f"effect kind {e.kind[:80]!r} is empty or longer than 64 characters"
        if e.target is not None and len(e.target) > enginerpc.MAX_TARGET_CHARS:
            return f"effect target longer than {enginerpc.MAX_TARGET_CHARS} characters"
    return None


# Computed once here, where the forkserver preloads this module: a restarted tick inherits the
# sources its projections' versions are hashed from, instead of reading them before its first fold.
tick_projection(budget.WINDOW_S)
tasks.book_projection("tick.tasks", forget_ended=True)
