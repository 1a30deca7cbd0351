"""One worker as pulsed sees it: its state, its process, its restart policy.

Restart policy (every worker is permanent: any exit pulsed did not ask for is a crash):
- The first restart of a crash streak is immediate; the next waits
  restart_backoff_base_ms, doubling up to restart_backoff_max_ms.
- A worker that ran healthy_reset_s before crashing starts a new streak.
- More than intensity_restarts automatic restarts within intensity_period_s:
  the worker is `failed`. The engine is retried after engine_retry_after_failed_s;
  a core worker escalates (pulsed stops everything and exits non-zero).
- Operator restarts, stops and starts never count.
- Exit 78 says a store cannot be used: no restart would help, so none is tried (a core
  worker stops pulsed with 78; the engine is failed until an operator restarts it).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from pulse.core import clock
from pulse.core.config import Timings
from pulse.core.logs import PipeReader
from pulse.core.states import CORE_WORKERS, WorkerState
from pulse.core.wire import LastExit


@dataclass
class Child:
    name: str
    state: WorkerState = WorkerState.STOPPED
    pid: int | None = None
    pidfd: int | None = None
    output: PipeReader | None = None
    forkserver: object | None = None     # the forkserver that was asked for this process
    starts: int = 0                      # spawns since pulsed started
    restarts: int = 0                    # restarts since pulsed started (automatic and operator)
    streak: int = 0                      # crashes in a row, for backoff
    recent: collections.deque = field(default_factory=collections.deque)  # automatic restart times
    spawned_at: float | None = None
    ready_at: float | None = None
    heartbeat_at: float | None = None
    deadline: float | None = None        # when this state's timer fires (meaning depends on state)
    restart_after_stop: bool = False     # STOPPING → STARTING instead of STOPPED
    last_exit: LastExit | None = None
    commit: str | None = None            # what the running process said it runs (the engine's tree)
    report: dict | None = None           # what its last heartbeat added to status (Worker.report)

    @property
    def core(self) -> bool:
        return self.name in CORE_WORKERS


@dataclass(frozen=True)
class Restart:
    delay_s: float


@dataclass(frozen=True)
class Fail:
    retry_at: float | None               # None: escalate (core worker)


def on_crash(child: Child, now: float, t: Timings) -> Restart | Fail:
    """Decide what follows an exit pulsed did not ask for; updates streak and intensity window."""
    if child.ready_at is not None and now - child.ready_at >= t.healthy_reset_s:
        child.streak = 0
    child.streak += 1
    while child.recent and now - child.recent[0] > t.intensity_period_s:
        child.recent.popleft()
    if len(child.recent) >= t.intensity_restarts:
        return Fail(None if child.core else now + t.engine_retry_after_failed_s)
    child.recent.append(now)
    if child.streak == 1:
        return Restart(0.0)
    delay_ms = clock.backoff(child.streak - 1, t.restart_backoff_base_ms, t.restart_backoff_max_ms)
    return Restart(delay_ms / 1000)


def forget_crashes(child: Child) -> None:
    """An operator start, or the slow retry of a failed engine, begins with a clean slate."""
    child.streak = 0
    child.recent.clear()


def next_deadline(child: Child, t: Timings) -> float | None:
    """When pulsed must next look at this child without being woken by it."""
    if child.state is WorkerState.RUNNING and child.heartbeat_at is not None:
        return child.heartbeat_at + t.hung_after_ms / 1000
    return child.deadline
