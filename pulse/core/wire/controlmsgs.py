"""The control socket: pulsectl / workers (DEALER) → pulsed (ROUTER); the status document it answers with."""

from __future__ import annotations

from typing import Any

import msgspec

STATUS_VERSION = 1


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
    # GetStatus: the [store] table in force, whose bounds status says beside the history's size
    # (pulse.store.historysize) without loading the config; None from a pulsed older than the field.
    store: dict[str, Any] | None = None


class ReloadDone(msgspec.Struct, kw_only=True):
    """What a reload set in motion (at: its wall-clock time): the workers restarted, started and
    stopped, and the [[process]] tables added, removed (stopped: a stop-process effect follows) and
    removed but kept running (keep_on_remove), and the pid of each worker status lists as the reload
    found it. pulsectl reload waits on each and says how it ended."""
    at: float
    pids: dict[str, int | None] = msgspec.field(default_factory=dict)
    restarted: list[str] = msgspec.field(default_factory=list)
    started: list[str] = msgspec.field(default_factory=list)
    stopped: list[str] = msgspec.field(default_factory=list)
    processes_added: list[str] = msgspec.field(default_factory=list)
    processes_removed: list[str] = msgspec.field(default_factory=list)
    processes_kept: list[str] = msgspec.field(default_factory=list)


def status_json(status: Status) -> bytes:
    return msgspec.json.encode(status)
