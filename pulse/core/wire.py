"""Every message that crosses a process boundary, defined once.

Frames are msgpack. A frame that does not decode to the expected union raises
`Malformed`; receivers log it and drop it, and the next valid frame still works.
"""

from __future__ import annotations

import enum
import time
from typing import Any, Literal, TypeVar

import msgspec

from pulse.core.states import EffectState, TaskStatus

T = TypeVar("T")
STATUS_VERSION = 1


class Malformed(Exception):
    pass


# -- heartbeat socket: worker (PUSH) → pulsed (PULL) -------------------------------------------------

class Ready(msgspec.Struct, tag="ready"):
    name: str
    pid: int
    mono: float                 # time.monotonic() at sending: one clock for every process of a boot
    commit: str | None = None   # the engine: the commit of the tree it loaded


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    name: str
    pid: int
    seq: int
    mono: float
    extras: dict[str, Any] | None = None   # what the worker adds to status (Worker.status_extras), small


class Committed(msgspec.Struct, tag="committed"):
    """From the event writer: every event of pulsed's run up to `seq` is in events.db; with
    `resend`, something after it never arrived: send everything after it again."""
    name: str
    pid: int
    seq: int
    resend: bool = False


WorkerMessage = Ready | Heartbeat | Committed


# -- control socket: pulsectl / workers (DEALER) → pulsed (ROUTER) -----------------------------------

class GetStatus(msgspec.Struct, tag="status"):
    pass


class RestartWorker(msgspec.Struct, tag="restart"):
    name: str


class StopWorker(msgspec.Struct, tag="stop-worker"):
    name: str


class StartWorker(msgspec.Struct, tag="start-worker"):
    name: str


class Reload(msgspec.Struct, tag="reload"):
    pass


class GetConfig(msgspec.Struct, tag="get-config"):
    """The configuration pulsed runs with (`pulsectl config --effective`)."""


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


ControlRequest = GetStatus | RestartWorker | StopWorker | StartWorker | Reload | Shutdown | GetConfig


class LastExit(msgspec.Struct):
    code: int | None
    signal: int | None
    at: str                     # ISO 8601, UTC
    why: str | None = None      # "hung": pulsed aborted it for its silence (the signal is pulsed's SIGABRT)


class WorkerStatus(msgspec.Struct):
    name: str
    pid: int | None
    state: str
    restarts: int
    uptime_s: float | None
    heartbeat_age_s: float | None
    last_exit: LastExit | None
    # Restarts apart (crashes: automatic restarts after a crash, a hang or a failed worker's
    # retry; operator_restarts: `pulsectl restart` and reloads), and times as ISO 8601 (UTC)
    crashes: int = 0
    operator_restarts: int = 0
    started_at: str | None = None       # when the running process was spawned
    heartbeat_at: str | None = None     # its last heartbeat


class SupervisorStatus(msgspec.Struct):
    pid: int
    uptime_s: float
    home: str
    started_at: str | None = None       # ISO 8601 (UTC)


class ProcessStatus(msgspec.Struct):
    """A configured critical process, as the watcher last saw it and the tick knows of pauses."""
    name: str
    alive: bool | None                  # None: not sampled yet
    pid: int | None = None
    paused_until: float | None = None   # wall clock: survival leaves it alone until then (`status --json`: ISO 8601)
    matches: int | None = None          # found by `match`: how many processes matched (more than one: ambiguous)
    rss_mb: float | None = None         # its tree's RSS (it and its descendants), as last sampled
    max_mb: float | None = None         # its `memory` ceiling, when it has one
    config: ConfigStatus | None = None  # its `config` files against their known-good copies, when it has any
    # Its state (a pulse.core.states.ProcessState, as the tick last projected it) and why, and the figures
    # status shows beside it. Times are epoch seconds on the wire (`status --json`: ISO 8601).
    state: str = "unknown"
    why: str = ""
    until: float | None = None          # backoff: its next start; starting: when it counts as running
    started_at: float | None = None     # the running process's start
    uptime_s: float | None = None
    restarts: int = 0                   # restart-process runs that ended (survival's and operators')
    last_exit: ProcessExitView | None = None
    health: HealthView | None = None    # its last health probe, when it has a probe
    stopped: bool = False               # held down by an operator (`pulsectl process stop`) until `process start`


class ProcessExitView(msgspec.Struct, kw_only=True):
    """A guarded process's last recorded exit, as status shows it."""
    at: float
    pid: int | None = None
    code: int | None = None
    signal: str | None = None
    output: list[str] = msgspec.field(default_factory=list)   # its last lines of output (a few)


class HealthView(msgspec.Struct, kw_only=True):
    """A process's last health probe: passed or not, how long it took, failed ones in a row."""
    ok: bool
    at: float
    latency_ms: float | None = None
    failing: int = 0
    error: str | None = None


class ProcessView(msgspec.Struct, kw_only=True):
    """What the tick hands pulsed for one process (in its heartbeat): its state as projected."""
    state: str
    why: str = ""
    until: float | None = None
    started_at: float | None = None
    restarts: int = 0
    last_exit: ProcessExitView | None = None
    health: HealthView | None = None


class ConfigFileStatus(msgspec.Struct):
    path: str
    # known-good: holds its known-good content · changed: differs from it · missing: gone ·
    # not-kept: no known-good copy of it (yet) · unreadable: the watcher could not read it ·
    # unsampled: not sampled yet
    state: str


class ConfigStatus(msgspec.Struct, kw_only=True):
    """A [[process]]'s last-known-good config as status shows it (folded by the tick)."""
    files: list[ConfigFileStatus]
    kept_at: float | None = None        # when its known-good copies were kept
    pinned: bool = False                # ... by an operator, not by survival
    restored_at: float | None = None    # its last restore: when ...
    restore_why: str | None = None      # ... why (crash-loop | unhealthy | stop-exit-code | operator) ...
    restore_state: str | None = None    # ... how it ended (an EffectState; None while it runs) ...
    restore_summary: str | None = None  # ... and its diff summary, or why it failed


class FileWatchStatus(msgspec.Struct, kw_only=True):
    """A [[watch.file]] glob as status shows it: what its latest sample found, and its last trim."""
    name: str
    path: str                           # the glob
    action: str                         # rotate | truncate | notify
    max_mb: float
    files: int | None = None            # files it matched at its latest sample (None: not sampled yet)
    bytes: int = 0                      # their total size
    largest: str | None = None          # the largest of them ...
    largest_bytes: int = 0              # ... and its size
    over: int = 0                       # how many are over max_mb
    sampled_at: float | None = None
    last_trim_at: float | None = None   # its newest rotate-file that ended: when ...
    last_trim_state: str | None = None  # ... and how (acked | failed | expired)


class FreshWatchStatus(msgspec.Struct, kw_only=True):
    """A [[watch.fresh]] as status shows it: what it looks at, its last sign of work, stale or not."""
    name: str
    what: str                           # the path, or the url (and its field)
    within_s: float
    restart: str | None = None          # the [[process]] restarted when stale
    stale: bool | None = None           # None: not sampled yet
    changed_at: float | None = None     # its last sign of work (None: none seen)
    age_s: float | None = None          # how long before its latest sample that was (or watching began)
    value: str | None = None            # a url's answer (or field) as last seen, cut
    error: str | None = None            # why its latest sample could not look
    sampled_at: float | None = None


class DirWatchStatus(msgspec.Struct, kw_only=True):
    """A [[watch.dir]] glob as status shows it: its directories at the latest sample, and its last trim."""
    name: str
    path: str                           # the glob
    oldest: str                         # delete | archive
    max_mb: float | None = None
    max_files: int | None = None
    max_age: str | None = None
    dirs: int | None = None             # directories it matched at its latest sample (None: not sampled yet)
    files: int = 0                      # their files, all together ...
    bytes: int = 0                      # ... and their size
    oldest_mtime: float | None = None   # the oldest file's mtime
    over: int = 0                       # how many directories break a bound
    refused: int = 0                    # ... and how many Pulse will not touch (the home)
    sampled_at: float | None = None
    last_trim_at: float | None = None   # its newest trim-dir that ended: when ...
    last_trim_state: str | None = None  # ... and how (acked | failed | expired)


class Status(msgspec.Struct):
    """`pulsectl status --json`, version 1; engine_commit and processes were added after. web_url,
    fleet and telemetry are what those workers' heartbeats carry (each named by its child spec's
    `status`, pulse.core.childspecs); pulsed composes the others."""
    version: int
    supervisor: SupervisorStatus
    workers: list[WorkerStatus]
    engine_commit: str | None = None
    processes: list[ProcessStatus] = msgspec.field(default_factory=list)
    web_url: str | None = None          # the web worker's address, when it runs (`pulsectl web url`)
    files: list[FileWatchStatus] = msgspec.field(default_factory=list)   # each [[watch.file]]
    fleet: dict[str, Any] | None = None  # the fleet worker's own account, when it runs (pulse.workers.fleet)
    fresh: list[FreshWatchStatus] = msgspec.field(default_factory=list)   # each [[watch.fresh]]
    dirs: list[DirWatchStatus] = msgspec.field(default_factory=list)     # each [[watch.dir]]
    telemetry: dict[str, Any] | None = None  # the telemetry receiver's address and counters, when it runs


class Reply(msgspec.Struct, omit_defaults=True):
    ok: bool
    error: str | None = None
    message: str | None = None
    status: Status | None = None
    engine_commit: str | None = None   # beside the status document, whose version 1 stays as published
    config: dict[str, Any] | None = None   # GetConfig: the running configuration, as plain data
    events_recorded: int = 0           # pulsed's lifecycle events so far (the last seq) ...
    events_written: int = 0            # ... and how many of them the event writer has committed
    reload: "ReloadDone | None" = None   # Reload: what pulsed set in motion, for pulsectl to see through


class ReloadDone(msgspec.Struct, kw_only=True):
    """What a reload set in motion (at: its wall-clock time): the workers restarted, started and
    stopped, and the [[process]] tables added, removed (stopped: a stop-process effect follows) and
    removed but kept running (keep_on_remove). pulsectl reload waits on each and says how it ended."""
    at: float
    restarted: list[str] = msgspec.field(default_factory=list)
    started: list[str] = msgspec.field(default_factory=list)
    stopped: list[str] = msgspec.field(default_factory=list)
    processes_added: list[str] = msgspec.field(default_factory=list)
    processes_removed: list[str] = msgspec.field(default_factory=list)
    processes_kept: list[str] = msgspec.field(default_factory=list)


# -- wake (tick binds), doorbell (executor binds): one-way doorbells ----------------------------------

class Wake(msgspec.Struct, tag="wake"):
    source: str
    reason: str = ""


class Doorbell(msgspec.Struct, tag="doorbell"):
    source: str


# -- engine RPC: tick / executor (DEALER) → engine (ROUTER) --------------------------------------------

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


# -- pulsed ↔ its forkserver (a socketpair, not zmq) --------------------------------------------------

class Spawn(msgspec.Struct, tag="spawn"):
    name: str
    start: int                  # how many times pulsed has started this worker, counting this one
    config: bytes               # msgpack of the worker's slice of the config (pulse.core.config.SLICES)
    runtime: str
    home: str
    run: float = 0.0            # pulsed's run: the mono stamp of its supervisor-started event
    instance: str = ""          # the instance's name ([pulse] name, else the home's folder): in its title


class Spawned(msgspec.Struct, tag="spawned"):
    name: str
    pid: int


class Exited(msgspec.Struct, tag="exited"):
    pid: int
    code: int | None            # exit status, or None when killed by a signal
    signal: int | None


ForkserverMessage = Spawn | Spawned | Exited


# -- events (PUB): committed events, live --------------------------------------------------------------

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


STOP_PROCESS = "stop-process"     # the effect kind that stops a [[process]] (pulse.effects.kinds.run_stop)
ON_CRASH_LOOP = "on-crash-loop"   # the effect kind that runs a [[process]]'s on_crash_loop argv (kinds.run_on_crash_loop)


# Every type of event Pulse writes (tests/test_wire.py checks the source writes no other).
EVENT_TYPES = frozenset({
    "supervisor-started", "supervisor-stopping", "reload", "operator",
    "worker-started", "worker-ready", "worker-exited", "worker-hung", "worker-failed", "worker-restarted",
    "wake", "tick", "collect", "error", "pause", "resume",
    *EffectEvent,
    "promote", "rollback", "notify",
    *TaskEvent,
    "gate-call", "gate-blocked", "gate-reset",
    "process-exited",
    "dir-archived",                                 # DIR_ARCHIVED below
    *SpendEvent,
    *ScheduleEvent,
    *("fleet-task-offered", "fleet-task-update"),   # FLEET_TASK_EVENTS below
    "fleet-task-dead",                              # FLEET_TASK_DEAD below
    "fleet-task-withdrawn",                         # FLEET_TASK_WITHDRAWN below
    *("history-moved", "history-dropped"),          # pulse.store.retention: events left the live history
    "telemetry",                                    # TELEMETRY below
})
# Files a trim-dir moved into objects/ (pulse.effects.dirs), each with its path and blob: committed
# before the files are removed, so an archived file is always found again (target: the directory).
DIR_ARCHIVED = "dir-archived"
GATE_CALL_EVENTS = ("gate-call", "gate-blocked")   # a task's gate calls, as task show lists them
# A task offered to the fleet (`pulsectl task add --fleet`; target: its fleet id), and what the host
# that took it reports of it (pulse.workers.fleettasks), both in the origin's events.db.
FLEET_TASK_OFFERED, FLEET_TASK_UPDATE = "fleet-task-offered", "fleet-task-update"
# A fleet task taken [fleet] max_deliver times without an end (given up, or its host died): the
# dead-letter record the host that gave up last reports to the origin (target: its fleet id).
FLEET_TASK_DEAD = "fleet-task-dead"
# A fleet task its origin's operator took back (`pulsectl task close <fleet id>`; target: its fleet
# id): no host starts it from then on; a run already going ends as it will, and is not offered again.
FLEET_TASK_WITHDRAWN = "fleet-task-withdrawn"
# the origin's record of one fleet task, as its views fold it
FLEET_TASK_EVENTS = (FLEET_TASK_OFFERED, FLEET_TASK_UPDATE, FLEET_TASK_DEAD, FLEET_TASK_WITHDRAWN)
# What a run or session did over one flush of the telemetry receiver (pulse.workers.telemetry): tokens,
# cost, API requests, tool calls, errors, when it was last heard; target: the run (its agent-run effect
# id) or "session:<id>" for a session Pulse did not start.
TELEMETRY = "telemetry"


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


_encoder = msgspec.msgpack.Encoder()
_decoders: dict[Any, msgspec.msgpack.Decoder] = {}


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode(frame: bytes, kind: type[T]) -> T:
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.msgpack.Decoder(kind)
    try:
        return decoder.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise Malformed(f"{err} (frame of {len(frame)} bytes: {bytes(frame[:32])!r})") from None


def status_json(status: Status) -> bytes:
    return msgspec.json.encode(status)
