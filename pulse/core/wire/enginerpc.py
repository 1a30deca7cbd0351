"""The engine RPC: tick / executor (DEALER) → engine (ROUTER); the snapshot and the effects it carries."""

from __future__ import annotations

from typing import Any

import msgspec

from pulse.core.states import TaskStatus

MAX_TARGET_CHARS = 256          # an effect's target is at most this long (the tick refuses longer ones)


class Effect(msgspec.Struct, kw_only=True):
    """A description of an action: serialisable parameters, interpreted by an executor."""
    kind: str
    target: str | None = None
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    idempotent: bool = False    # True: run at least once; False: at most once
    id: str = ""                # assigned when committed, like the fields below
    created: float = 0.0
    deadline: float = 0.0       # wall clock; not started by then = expired
    origin: str = ""            # survival | engine | operator | agent


class Vital(msgspec.Struct):
    key: str
    ts: float
    data: dict[str, Any]


class Outcome(msgspec.Struct):
    """How an effect ended, as the snapshot shows it."""
    effect_id: str
    kind: str
    state: str                  # an EffectState that ends it: acked | failed | expired
    ts: float
    error: str | None = None


class ProcessExit(msgspec.Struct):
    """A guarded process's exit, as its keeper recorded it (`process-exited`)."""
    pid: int
    ts: float
    code: int | None = None     # None: killed by `signal`
    signal: str | None = None
    tail: str = ""              # its last lines of output


class ProcessStart(msgspec.Struct):
    """A restart-process of a guarded process that ended: when, whether it started, who asked, and
    (survival's) why and which attempt of a streak it was."""
    ts: float
    ok: bool
    origin: str = "survival"
    why: str | None = None
    attempt: int = 0
    asked: float = 0.0          # when the restart was committed
    pid: int = 0                # the process it started (0: not known)


class ProcessRuns(msgspec.Struct, kw_only=True):
    """A guarded process's recent starts and exits, folded from events.db (processWatchdog's crash-loop
    memory, pulse.rules.processstate), and an operator's stop or start of it."""
    starts: list[ProcessStart] = msgspec.field(default_factory=list)     # oldest first, the last few
    exits: list[ProcessExit] = msgspec.field(default_factory=list)       # oldest first, the last few
    restarts: int = 0                   # every restart-process of it that ended
    stopped: bool = False               # an operator stopped it and has not started it since
    operator_at: float = 0.0            # an operator's last stop, start or restart: a crash loop counts from here
    way_out_at: float = 0.0             # its last on-crash-loop effect: when committed ...
    way_out_ended: float = 0.0          # ... when it ended (0: not yet) ...
    way_out_said: str | None = None     # ... and how, in words ("exit code 0: cleared 1 session")


class KnownGood(msgspec.Struct, kw_only=True):
    """A [[process]]'s config files as Pulse last kept them known good, and its last restore of them
    (folded from the keep-config and restore-config effects in events.db)."""
    files: dict[str, str] = msgspec.field(default_factory=dict)   # path → sha256 (hex) of its copy in objects/
    kept_at: float | None = None        # when they were kept (keep-config acked)
    pinned: bool = False                # ... by an operator (`pulsectl process config --pin`), not by survival
    restore_id: str | None = None       # the last restore-config: its effect id ...
    restore_at: float | None = None     # ... when it was committed
    restore_why: str | None = None      # ... why: crash-loop | unhealthy | stop-exit-code | operator
    restore_state: str | None = None    # ... how it ended (an EffectState); None while it runs
    restore_ended_at: float | None = None
    restored: list[str] = msgspec.field(default_factory=list)    # the files it wrote back
    restore_summary: str | None = None  # its diff summary, or why it failed
    restore_undone: str | None = None   # its unified diff (bounded): what it undid
    restore_kept: dict[str, str] = msgspec.field(default_factory=dict)   # path → where what it replaced is kept
    restarted: bool = False             # a restart of the process was committed after it ended


class EngineHealth(msgspec.Struct):
    state: str                  # the engine worker's state as pulsed reports it, or "unknown"
    restarts: int = 0
    errors: int = 0             # error events from the engine since the last promote
    failed_at: float | None = None   # when it last went `failed` (wall clock)


class Lifecycle(msgspec.Struct, kw_only=True):
    """The engine since its last promote, as the survival rules see it (folded from events.db)."""
    promote_id: int = 0                 # 0: never promoted
    promote_ts: float | None = None
    before: str | None = None           # main before the promote
    after: str | None = None            # main after it (what should be running)
    rolled_back: bool = False           # a rollback happened since
    last_known_good: str | None = None  # the newest promote that ran clean past the autoRollback window
    crashes: int = 0                    # unexpected engine exits since
    corrective_streak: int = 0          # survival's repairs of the host failed in a row since


# -- tasks, as a snapshot carries them (pulse.agents.tasks folds them from events.db) ---------------------

class TaskState(msgspec.Struct, kw_only=True):
    id: str
    project: str
    title: str
    prompt: str
    priority: int = 0
    status: str = TaskStatus.PENDING     # a TaskStatus
    agent: str | None = None             # holding it now (assigned, executing, acked)
    last_agent: str | None = None        # the last agent it was assigned to, kept after it lets go
    result: Any = None                   # what the agent's run returned (task-acked)
    error: str | None = None             # why the last run failed (task-failed)
    failures: int = 0                    # consecutive failed runs; an ack resets it
    attempts: int = 0                    # runs started (task-executing)
    created: float = 0.0                 # wall-clock timestamps of the events that set them
    updated: float = 0.0
    assigned: float | None = None
    started: float | None = None
    acked: float | None = None
    closed: float | None = None
    given_up: float | None = None
    retry_at: float | None = None        # after a failed run: not handed out again before this
    # Routing: who may take it. `pin`: only this [[agent]] (task add --agent); `tags`: only
    # an agent whose tags include them all (task add --tag); `failed_on`: the agents whose runs of it
    # failed (an interrupted run is nobody's failure), whom the assignment rule avoids while another may take it.
    pin: str | None = None
    tags: list[str] = msgspec.field(default_factory=list)
    failed_on: list[str] = msgspec.field(default_factory=list)
    # made by an agent through the gate's create_task: which agent, in the run of which task, and how
    # deep that makes it (a task the operator or Pulse adds is 0; one made in a run of a task of depth
    # d is d + 1), which [tasks] agent_max_depth bounds
    created_by: str | None = None
    parent: str | None = None
    depth: int = 0


class PendingTasks(msgspec.Struct, kw_only=True):
    pending_count: int = 0
    tasks: list[TaskState] = msgspec.field(default_factory=list)   # most urgent first, at most a limit
    by_project: dict[str, int] = msgspec.field(default_factory=dict)
    waiting_retry: int = 0               # pending, but waiting out the backoff after a failed run
    next_retry: float | None = None      # the earliest of those waits' ends
    # Routing, for each listed task: the configured agents that may take it (config order),
    # and, for a task none may take, why (it waits, and task show and the page say so).
    eligible: dict[str, list[str]] = msgspec.field(default_factory=dict)
    unassignable: dict[str, str] = msgspec.field(default_factory=dict)


class AgentCapabilityStats(msgspec.Struct, kw_only=True):
    agent: str
    assigned: int = 0
    acked: int = 0
    failed: int = 0
    closed: int = 0
    given_up: int = 0
    consecutive_failures: int = 0       # failed runs in a row, across tasks; an ack resets it
    avg_duration_ms: float | None = None  # task-executing → task-acked, over acked runs
    total_duration_ms: float = 0.0
    # What the agent's CLI reported, over every run that ended (acked or failed), where it reports it:
    cost_usd: float = 0.0
    tokens: dict[str, int] = msgspec.field(default_factory=dict)   # input / output / cache_read / ...
    runs_with_cost: int = 0             # runs whose CLI reported a cost (codex and cursor report none)


class AgentLoad(msgspec.Struct, kw_only=True):
    """One configured [[agent]]'s load, as the assignment rule sees it."""
    agent: str
    concurrency: int = 1                 # runs of it at once ([[agent]] concurrency)
    running: int = 0                     # runs handed to it and not ended: its tasks assigned or executing,
                                         # and agent-run effects naming it that are still queued
    projects: list[str] | None = None    # the projects it takes; None: every project
    tags: list[str] = msgspec.field(default_factory=list)   # a tagged task needs all its tags among these
    # Why one more run of it would cross a spend limit now (pulse.agents.spend; None: within them all).
    # While set it has no free slot, so an assignment rule that counts free slots hands it nothing.
    budget: str | None = None

    @property
    def free(self) -> int:
        return 0 if self.budget is not None else max(0, self.concurrency - self.running)


class Snapshot(msgspec.Struct, kw_only=True):
    """What the rules see: the latest vitals of the sense keys, and projections of events.db."""
    tick: int
    ts: float
    vitals: dict[str, Vital] = msgspec.field(default_factory=dict)
    pending: list[Effect] = msgspec.field(default_factory=list)       # committed, not yet ended
    outcomes: dict[str, list[Outcome]] = msgspec.field(default_factory=dict)   # recent, per target
    engine: EngineHealth = msgspec.field(default_factory=lambda: EngineHealth("unknown"))
    last_promote: float | None = None
    notified: dict[str, float] = msgspec.field(default_factory=dict)   # "rule:target" → last notify (or report) committed
    lifecycle: Lifecycle = msgspec.field(default_factory=Lifecycle)
    paused: dict[str, float] = msgspec.field(default_factory=dict)     # process → paused until (wall clock)
    stopped: list[str] = msgspec.field(default_factory=list)          # processes an operator holds down
    # [[process]] tables a reload took out (keep_on_remove unset) and not yet stopped: name → {"reload":
    # the reload event's id, "definition": the table as it was}; processWatchdog stops each once
    removed: dict[str, dict] = msgspec.field(default_factory=dict)
    exits: dict[str, ProcessExit] = msgspec.field(default_factory=dict)  # process → its last recorded exit
    runs: dict[str, ProcessRuns] = msgspec.field(default_factory=dict)   # process → its recent starts and exits
    history: dict[str, list[Vital]] = msgspec.field(default_factory=dict)   # recent samples of counted keys
    known_good: dict[str, KnownGood] = msgspec.field(default_factory=dict)  # process → its known-good config
    escalated: float | None = None      # when pulsed last stopped everything and exited non-zero
    escalation: str | None = None       # why
    # Only when the tick's sense keys include "pending-tasks":
    pending_tasks: PendingTasks | None = None
    agent_capability_stats: dict[str, AgentCapabilityStats] = msgspec.field(default_factory=dict)
    agents: dict[str, AgentLoad] = msgspec.field(default_factory=dict)   # every [[agent]], by name


class Ping(msgspec.Struct, tag="ping"):
    id: int
    deadline: float             # absolute, time.time(); the engine drops expired requests


class Pong(msgspec.Struct, tag="pong"):
    id: int
    pid: int


class RunChain(msgspec.Struct, tag="run-chain"):
    """Run the engine's business rules: the innermost layer of the onion."""
    id: int
    deadline: float
    prev: Snapshot | None
    curr: Snapshot


class ChainResult(msgspec.Struct, tag="chain-result"):
    id: int
    effects: list[Effect]
    tick_ms: int | None = None
    error: str | None = None


class RunExecutor(msgspec.Struct, tag="run-executor"):
    """Carry out an effect of a kind only the engine's executors know."""
    id: int
    deadline: float
    effect: Effect


class ExecutorResult(msgspec.Struct, tag="executor-result"):
    id: int
    ok: bool
    result: dict[str, Any] = msgspec.field(default_factory=dict)
    error: str | None = None
    unknown_kind: bool = False


EngineRequest = Ping | RunChain | RunExecutor
EngineReply = Pong | ChainResult | ExecutorResult
