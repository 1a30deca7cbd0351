"""One worker as pulsed sees it: its state, its process, the edges its state may take, and its
restart policy.

Restart policy. Every worker is permanent: any exit pulsed did not ask for is a crash, whatever
its code. How workers differ is their child spec (CHILD_SPECS in pulse.core.childspecs). Every
default below is a [timings] key of config.toml:
- The first restart of a crash streak is immediate; the next waits restart_backoff_base_ms
  (100 ms), doubling up to restart_backoff_max_ms (30 000 ms). A worker that had been ready for
  healthy_reset_s (30 s) when it crashed starts a new streak.
- At most intensity_restarts (5) automatic restarts within intensity_period_s (60 s); the crash
  after them makes the worker `failed`. A core worker (watcher, tick, executor) then escalates:
  pulsed stops everything and exits 1. Any other is retried by itself, with a clean slate, after
  its own [timings] key <name>_retry_after_failed_s (600 s each): eventlog_retry_after_failed_s,
  engine_retry_after_failed_s, web_retry_after_failed_s and so on, one per row of CHILD_SPECS.
- Silent for hung_after_ms (10 000 ms) since its last heartbeat, or not ready ready_timeout_ms
  (10 000 ms) after its spawn: `hung`. SIGABRT (a traceback), SIGCONT, and SIGKILL after
  stop_grace_ms (5 000 ms); that exit is a crash like any other.
- A stop is SIGTERM and SIGCONT, then SIGKILL after stop_grace_ms (5 000 ms).
- Operator restarts, stops and starts never count; an operator start or restart also forgets
  the crashes before it.
- Exit 78 says a store cannot be used: no restart would help, so none is tried. A core worker
  makes pulsed stop and exit 78; any other is `failed`, with no automatic retry, until an
  operator restarts it (the event writer, which no operator can name: until pulsed restarts).

Transitions. A state changes only along an edge of EDGES, each named for what makes it happen.
`check_transition` says whether the state it leaves is one the edge leaves from; `enter_state`
sets the new state and the timer that state starts with (STATE_TIMERS). The arbiter takes every
edge through one method (Arbiter._transition), which also records the edge's lifecycle event.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from pulse.core import clock
from pulse.core.childspecs import ChildSpec
from pulse.core.config import SupervisorTimings
from pulse.core.logs import PipeReader
from pulse.core.states import WorkerState
from pulse.core.wire.controlmsgs import LastExit
from pulse.core.wire.eventmsgs import EventType

S = WorkerState


@dataclass
class Child:
    spec: ChildSpec
    state: WorkerState = WorkerState.STOPPED
    pid: int | None = None
    pidfd: int | None = None
    output: PipeReader | None = None
    forkserver: object | None = None     # the forkserver that was asked for this process
    starts: int = 0                      # spawns since pulsed started
    restarts: int = 0                    # restarts since pulsed started (automatic and operator)
    # ... of which automatic (after a crash, a hang, a retry of a failed worker) and operator's (a
    # restart or a reload's): status shows them apart, so a reload never reads as a crash
    crash_restarts: int = 0
    operator_restarts: int = 0
    streak: int = 0                      # crashes in a row, for backoff
    recent: collections.deque = field(default_factory=collections.deque)  # automatic restart times
    spawned_at: float | None = None
    ready_at: float | None = None
    heartbeat_at: float | None = None
    deadline: float | None = None        # when this state's timer fires (meaning depends on state)
    restart_after_stop: bool = False     # STOPPING → STARTING instead of STOPPED
    last_exit: LastExit | None = None
    commit: str | None = None            # what the running process said it runs (the engine's tree)
    extras: dict | None = None           # what its last heartbeat added to status (Worker.status_extras)

    @property
    def name(self) -> str:
        return self.spec.name


# -- the edges a worker's state may take -----------------------------------------------------------

@dataclass(frozen=True)
class Edge:
    name: str
    sources: frozenset[WorkerState]      # the states it may leave
    target: WorkerState
    event: str | None = None             # the lifecycle event recorded as it is taken


def _edge(name: str, sources: set[WorkerState], target: WorkerState, event: str | None = None) -> Edge:
    return Edge(name, frozenset(sources), target, event)


# A process is being created or runs in these: what a death, a hang or a stop can leave.
_HAS_PROCESS = {S.STARTING, S.RUNNING, S.HUNG}
# Nothing runs in these: what a start or a stop of no process can leave.
_AT_REST = {S.STOPPED, S.BACKOFF, S.FAILED}

START = _edge("start", _AT_REST, S.STARTING)                      # pulsed's start, an operator's, a reload's
BACKOFF_OVER = _edge("backoff-over", {S.BACKOFF}, S.STARTING)     # its backoff delay has passed
RETRY = _edge("retry-after-failed", {S.FAILED}, S.STARTING, EventType.WORKER_RESTARTED)   # its spec's retry timing has passed
RESTART = _edge("restart", {S.STOPPING, *_AT_REST}, S.STARTING, EventType.WORKER_RESTARTED)   # an operator's or a reload's
RESPAWN = _edge("respawn", {S.STARTING}, S.STARTING)              # its forkserver died unanswering: ask the next
FORKSERVER_STUCK = _edge("forkserver-stuck", {S.STARTING}, S.STARTING, EventType.WORKER_HUNG)   # unanswered: kill the forkserver
READY = _edge("ready", {S.STARTING}, S.RUNNING, EventType.WORKER_READY)
HANG = _edge("hang", {S.STARTING, S.RUNNING}, S.HUNG, EventType.WORKER_HUNG)
CRASH_RESTART = _edge("crash-restart", _HAS_PROCESS, S.STARTING, EventType.WORKER_RESTARTED)   # the first crash of a streak
CRASH_BACKOFF = _edge("crash-backoff", _HAS_PROCESS, S.BACKOFF, EventType.WORKER_RESTARTED)    # a later one
CRASH_FAIL = _edge("crash-fail", _HAS_PROCESS, S.FAILED, EventType.WORKER_FAILED)              # the crash past the intensity limit
UNUSABLE = _edge("unusable", _HAS_PROCESS, S.FAILED, EventType.WORKER_FAILED)                  # it exited 78
STOP = _edge("stop", _HAS_PROCESS, S.STOPPING)                    # SIGTERM sent
STOP_DONE = _edge("stop-done", {S.STOPPING}, S.STOPPED)           # it exited as asked
EXIT_IN_SHUTDOWN = _edge("exit-in-shutdown", _HAS_PROCESS, S.STOPPED)   # pulsed is stopping: no restart
CANCEL = _edge("cancel", _AT_REST, S.STOPPED)                     # a stop with no process: its backoff or retry dropped
ABANDON = _edge("abandon", {S.STARTING, S.STOPPING}, S.STOPPED)   # at shutdown's deadline: a spawn never answered

EDGES = (START, BACKOFF_OVER, RETRY, RESTART, RESPAWN, FORKSERVER_STUCK, READY, HANG, CRASH_RESTART,
         CRASH_BACKOFF, CRASH_FAIL, UNUSABLE, STOP, STOP_DONE, EXIT_IN_SHUTDOWN, CANCEL, ABANDON)

# The timer each state starts with (a [timings] key, ms): how long it may last before pulsed acts
# unwoken. BACKOFF and FAILED have none of their own: the crash decision gives theirs (the
# backoff, the retry); RUNNING's is its heartbeat's (next_deadline).
STATE_TIMERS = {S.STARTING: "ready_timeout_ms", S.HUNG: "stop_grace_ms", S.STOPPING: "stop_grace_ms"}


class IllegalTransition(AssertionError):
    """pulsed took an edge from a state the edge does not leave: a bug in pulsed, never bad input."""


def check_transition(state: WorkerState, edge: Edge) -> None:
    if state not in edge.sources:
        allowed = ", ".join(sorted(edge.sources))
        raise IllegalTransition(f"edge {edge.name!r} taken from {state} (it leaves {allowed}) to {edge.target}")


def enter_state(child: Child, edge: Edge, now: float, t: SupervisorTimings, due: float | None = None) -> None:
    """Put `child` in the edge's state, with that state's timer, or `due` when given."""
    child.state = edge.target
    key = STATE_TIMERS.get(edge.target)
    child.deadline = due if due is not None else None if key is None else now + getattr(t, key) / 1000


# -- the restart policy ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Restart:
    delay_s: float


@dataclass(frozen=True)
class Fail:
    retry_in_s: float | None             # None: no automatic retry (a core worker escalates instead)


def retry_after_failed_s(spec: ChildSpec, t: SupervisorTimings) -> float | None:
    return None if spec.retry_key is None else getattr(t, spec.retry_key)


def on_crash(child: Child, now: float, t: SupervisorTimings) -> Restart | Fail:
    """Decide what follows an exit pulsed did not ask for; updates streak and intensity window."""
    if child.ready_at is not None and now - child.ready_at >= t.healthy_reset_s:
        child.streak = 0
    child.streak += 1
    while child.recent and now - child.recent[0] > t.intensity_period_s:
        child.recent.popleft()
    if len(child.recent) >= t.intensity_restarts:
        return Fail(retry_after_failed_s(child.spec, t))
    child.recent.append(now)
    if child.streak == 1:
        return Restart(0.0)
    delay_ms = clock.backoff(child.streak - 1, t.restart_backoff_base_ms, t.restart_backoff_max_ms)
    return Restart(delay_ms / 1000)


def forget_crashes(child: Child) -> None:
    """An operator start, or the slow retry of a failed worker, begins with a clean slate."""
    child.streak = 0
    child.recent.clear()


def next_deadline(child: Child, t: SupervisorTimings) -> float | None:
    """When pulsed must next look at this child without being woken by it."""
    if child.state is WorkerState.RUNNING and child.heartbeat_at is not None:
        return child.heartbeat_at + t.hung_after_ms / 1000
    return child.deadline


def runs(spec: ChildSpec, settings: object) -> bool:
    """Whether pulsed runs this worker under `settings` (its config slice): its flag, if it has one."""
    if spec.enabled_by is None:
        return True
    table, key = spec.enabled_by.split(".")
    return bool(getattr(getattr(settings, table), key))


def how_to_enable(spec: ChildSpec) -> str:
    table, key = spec.enabled_by.split(".")
    return f"[{table}] {key} = true"
