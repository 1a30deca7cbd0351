"""config.toml: its schema, its defaults, and PULSE_* overrides.

Every default is stated here once. `load()` raises ConfigError with the key path
(`$.timings.heartbeat_ms`) and what is wrong; pulsed turns that into exit 78.

Each process reads one slice of it (`SLICES`, `SupervisorConfig`): pulsed sends a worker its
slice alone, and a reload restarts exactly the workers whose slice changed (`changed_slices`).
"""

# No `from __future__ import annotations` here: msgspec would evaluate each of the schema's annotation
# strings at the first load, a fifth of the load's time in every pulsectl command that reads the config.

import datetime
import os
import re
from pathlib import Path
from typing import Any, Literal

import msgspec

from pulse.core import argvtemplate
from pulse.core.childspecs import CHILD_SPECS, RETRIED

SCHEMA_VERSION = 1


class ConfigError(Exception):
    """Bad configuration: names the file or variable, the key path, and the problem."""


class _RestartTimings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    restart_backoff_base_ms: int = 100        # second restart in a crash streak waits this long
    restart_backoff_max_ms: int = 30_000      # ... doubling up to this
    healthy_reset_s: float = 30               # running this long forgets the crash streak
    intensity_restarts: int = 5               # more automatic restarts than this ...
    intensity_period_s: float = 60            # ... within this window: a core worker escalates, any other fails


# <worker>_retry_after_failed_s: a failed worker that is not core is retried this long after failing,
# one key per such worker, its default in its child spec (pulse.core.childspecs), in spec order.
_RetryTimings = msgspec.defstruct("_RetryTimings", [(s.retry_key, float, s.retry_after_failed_s) for s in RETRIED],
                                  bases=(_RestartTimings,), forbid_unknown_fields=True, kw_only=True,
                                  module=__name__)


class Timings(_RetryTimings, forbid_unknown_fields=True, kw_only=True):
    heartbeat_ms: int = 1_000                 # workers heartbeat this often from their main loop
    hung_after_ms: int = 10_000               # silent this long: hung (SIGABRT, SIGCONT, SIGKILL)
    ready_timeout_ms: int = 10_000            # not ready this long after spawn: hung
    stop_grace_ms: int = 5_000                # SIGTERM, then SIGKILL after this
    tick_ms: int = 5_000                      # the tick's default period
    tick_ms_min: int = 50                     # clamp of the tick_ms a rule returns
    tick_ms_max: int = 60_000
    engine_rpc_deadline_ms: int = 250         # the tick waits this long for the engine
    sqlite_busy_timeout_ms: int = 5_000       # a write waits this long for another's lock (< hung_after_ms)
    engine_urgent_deadline_ms: int = 50       # ... or this long, in a tick woken by a critical process's death
    effect_deadline_s: float = 60             # an effect older than this expires unrun
    effect_timeout_s: float = 30              # one effect may run this long
    executor_concurrency: int = 8             # effects run at once
    executor_scan_interval_ms: int = 1_000    # executor scan, the doorbell's fallback
    # A failure its kind puts back in the queue (a notification no channel took yet) is tried again
    # after this, doubling per failed attempt up to effect_retry_max_ms.
    effect_retry_base_ms: int = 5_000
    effect_retry_max_ms: int = 300_000
    watcher_interval_ms: int = 5_000          # default watcher interval
    wake_window_s: float = 60                 # what should_wake() sees
    # -- the disk --
    ballast_check_s: float = 60               # once there is room again, the tick re-makes the ballast within this


class LogSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    level: Literal["debug", "info", "warning", "error"] = "info"
    max_bytes: int = 10 * 1024 * 1024         # pulse.log rotates at this size ...
    backups: int = 5                          # ... keeping this many old files


class EngineLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # The engine runs the agent's code: a memory blow-up must kill it, not the survival layer.
    address_space_mb: int = 4096              # RLIMIT_AS of the engine process; 0 = unlimited
    oom_score_adj: int = 800                  # the OOM killer picks the engine first
    typecheck: list[str] | None = None        # argv run in the candidate tree by the promote gate, e.g. ["mypy", "."]


MAX_HEALTH_FAILURES = 20                      # the tick keeps this many recent samples of a counted key
                                              # (health probes; memory samples in a row, too)


class Health(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A probe of whether a live process is any use: an HTTP GET of `url` (healthy: answers below
    400) or an `argv` whose exit code is the verdict (0 healthy). Sampled by the watcher into
    `health:<process>`; processWatchdog restarts the process after `failures` failed probes in a row."""
    url: str | None = None                    # e.g. "http://127.0.0.1:18789/readyz"
    argv: list[str] | None = None             # e.g. ["openclaw", "health", "--json"]
    every_s: float = 10
    timeout_s: float = 3
    failures: int = 3
    start_period_s: float = 0                 # failed probes this soon after the process started do not count
    # A probe that answers, but slower than this, failed all the same (a saturated event loop answers
    # /health in seconds long before it stops answering); unset: only timeout_s bounds it.
    max_latency_ms: float | None = None


MAX_MEMORY_WINDOW_SAMPLES = 720               # the growth fit reads at most this many samples (the newest)


class Memory(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A ceiling on a process's memory: the RSS of its whole tree (the process and every descendant,
    summed), which the watcher samples into `process-memory:<process>` every watcher interval.
    processWatchdog restarts the process after `for_samples` samples in a row above `max_mb`, and
    notifies (once per process, at most every [survival] notify_every_s) when a least-squares fit
    over the last `growth_window_s` of samples rises faster than `growth_mb_per_h`."""
    max_mb: float = 4096
    for_samples: int = 3                      # samples in a row above max_mb before the restart
    growth_mb_per_h: float = 500              # a steeper slope is notified; 0: never
    growth_window_s: float = 600              # the fit's window: samples of one pid over at least 3/4 of it
                                              # (or MAX_MEMORY_WINDOW_SAMPLES of them)


MAX_RESTARTS = 50                             # the tick keeps a process's last 64 starts: enough to count these


class Backoff(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The wait before each start of a streak of failed ones: base_s, 2×base_s, 4×base_s … at most max_s."""
    base_s: float = 1
    max_s: float = 300


class PidFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A pidfile that is JSON (OpenClaw's lock file: {"pid": 24677, ...}): the pid is at `key`."""
    path: str
    key: str = "pid"


class Process(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A critical process: watched by `process-alive`, restarted by `restart-process`.

    A restart stops what the process is now (`stop`, else SIGTERM to its process tree, SIGKILL
    after `stop_timeout_s`), waits for it to be gone, then starts `restart`: never two copies."""
    name: str
    # The tested settings of a tool Pulse names (pulse/core/presets: openclaw-gateway, hermes-gateway,
    # litellm), merged under this table's own keys when the file is read.
    preset: str | None = None
    pidfile: str | PidFile | None = None      # found by the pid in this file ...
    match: str | None = None                  # ... or by a regex over its full command line (not Pulse's own)
    restart: list[str] | None = None          # argv that starts it, never a shell string
    stop: list[str] | None = None             # argv that stops it; unset: SIGTERM to its process tree
    stop_timeout_s: float = 10                # then SIGKILL
    start_grace_s: float = 1                  # exited within this after a start: the restart failed, in its words
    cwd: str | None = None                    # where restart and stop run; unset: the home; relative: to it
    env: dict[str, str] = msgspec.field(default_factory=dict)
    # The account it runs as: a process of any other account never counts as it (an agent's look-alike
    # is not the gateway), and `restart` starts it as this one. Unset: Pulse's own account.
    user: str | None = None
    health: Health | None = None              # alive is not enough: also probe this
    memory: Memory | None = None              # unset: no ceiling (its tree's RSS is sampled all the same)
    # Exit codes by which the process asks to be restarted (Hermes' gateway: 75): restarted at
    # once, not counted as a failure; and by which it asks never to be (Hermes: 78, bad config).
    # Known for a process Pulse started: its keeper records every exit in events.db.
    restart_exit_codes: list[int] = msgspec.field(default_factory=list)
    stop_exit_codes: list[int] = msgspec.field(default_factory=list)
    # Last-known-good config (processWatchdog): its config files, absolute paths; none by default.
    # Healthy (alive, its health probe passing) for config_good_after_s since a start after their last
    # change: kept in objects/ as known good. Changed since, and crash-looping or unhealthy within
    # config_rollback_window_s of the change: the known-good files are restored, then it is restarted.
    config: list[str] = msgspec.field(default_factory=list)
    config_good_after_s: float = 60
    config_rollback_window_s: float = 600
    # Crash loops (processWatchdog): a start after which it died within min_uptime_s failed (as
    # supervisord's startsecs, PM2's min_uptime); each start of a streak of failed ones waits
    # restart_backoff, doubling; max_restarts of them within restart_window_s hold it `fatal`
    # (notified once, with its last output) until an operator starts it. Restarts of an unhealthy
    # process back off the same way. 0 max_restarts: never held.
    min_uptime_s: float = 10
    max_restarts: int = 5
    restart_window_s: float = 300
    restart_backoff: Backoff | None = None    # unset: [survival] process_backoff_base_s / _max_s (1 / 300)
    # A way out of a crash loop that restarting cannot end (a stuck session resumed at every start):
    # once held fatal, this argv runs once (as `user`, in `cwd`, with `env`), its outcome recorded,
    # then the process gets one more start; failing that too, it is held until an operator starts it.
    on_crash_loop: list[str] | None = None
    # Taken out of config.toml: a reload stops it (as a restart stops it: its whole tree) unless this
    # is true, when it is left running, no longer watched.
    keep_on_remove: bool = False


REMOVED_KEYS = ("name", "pidfile", "match", "stop", "stop_timeout_s", "cwd")   # what a stop needs of a table


def removed_definition(process: Process) -> dict:
    """What stop-process needs of a [[process]] a reload takes out, carried in the reload event (its
    env is left out: events.db is no place for tokens)."""
    return msgspec.to_builtins({k: getattr(process, k) for k in REMOVED_KEYS if getattr(process, k) is not None})


class Notify(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A notification channel."""
    kind: Literal["log", "file", "webhook", "command"]
    name: str | None = None
    path: str | None = None                   # file: JSON Lines appended here
    url: str | None = None                    # webhook: POST JSON here
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    argv: list[str] | None = None             # command: the notification arrives as JSON on stdin
    retries: int = 3                          # webhook attempts after the first fail
    timeout_s: float = 10
    # Grouped per target, as Alertmanager groups: the first `burst` notifications of a window of
    # `group_s` go out, the rest are held back, and one digest per window says how many were.
    burst: int = 5
    group_s: float = 60


class NetworkTarget(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """An outbound check: DNS resolution of `host`, and an HTTP GET of `url` if given."""
    name: str
    host: str | None = None
    url: str | None = None
    timeout_s: float = 5


class ErrorLogWatch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A log file tailed for keywords (across rotation and truncation)."""
    name: str
    path: str
    keywords: list[str] = msgspec.field(default_factory=lambda: ["ERROR", "CRITICAL", "Traceback"])


MAX_KEEP = 100                                # rotated copies a [[watch.file]] may keep


class FileWatch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Files that must not fill the disk ([[watch.file]]): every regular file `path` matches is
    sampled into vitals (`file:<name>`); one over `max_mb` is rotated, truncated or notified about
    by the survival layer (fileGuard), and when the disk is high resourceGuard trims these first."""
    name: str
    path: str                                 # an absolute glob, e.g. "/var/log/openclaw/*.jsonl" (** spans dirs)
    max_mb: float = 1024                      # a matching file over this many MiB is acted on
    # rotate: copytruncate (a gzipped copy beside it, the file truncated in place: its writer keeps
    # its fd); truncate: emptied in place, nothing kept; notify: only said
    action: Literal["rotate", "truncate", "notify"] = "rotate"
    keep: int = 3                             # rotate keeps <path>.1.gz … <path>.<keep>.gz, the newest first


class FreshWatch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Proof that work happens ([[watch.fresh]]): something that must change within `within_s`, a
    heartbeat file or a cron's output directory (`path`: the file's mtime, or the newest mtime in the
    directory), or a loopback URL's answer (`url`; with `field`, only that dotted field of its JSON).
    Sampled into `fresh:<name>`; stale: notified once per staleness, and `restart` restarted if set."""
    name: str
    path: str | None = None                   # an absolute file or directory; links out of it never followed
    recursive: bool = False                   # a directory: its subdirectories' entries count too
    url: str | None = None                    # e.g. "http://127.0.0.1:18789/status" (loopback only)
    field: str | None = None                  # url: a dotted path into its JSON answer, e.g. "cron.runs"
    within_s: float = 3600
    restart: str | None = None                # the [[process]] to restart when stale; unset: only notified


class DirWatch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Directories that only grow ([[watch.dir]]): every directory `path` matches is sampled into
    vitals (`dir:<name>`: its regular files, however deep, never through a link); one over a bound
    has its oldest files (by mtime) deleted or archived into the home's objects/ until the bounds
    hold again (dirGuard, trim-dir). A file still open for writing is never touched."""
    name: str
    path: str                                 # an absolute directory or glob of directories ("/srv/*/output")
    max_mb: float | None = None               # the files under each directory together, at most this many MiB
    max_files: int | None = None              # ... at most this many files
    max_age: str | None = None                # ... none older than this ("30m", "7d", "1h30m")
    oldest: Literal["delete", "archive"] = "delete"   # archive: moved into objects/, named in the effect's event


class Watch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Thresholds at which a built-in watcher rings the tick at once instead of waiting."""
    cpu_pct: float = 95
    memory_pct: float = 90
    disk_pct: float = 90
    disk_path: str = "/"
    network: list[NetworkTarget] = msgspec.field(default_factory=list)   # none on a fresh install
    error_log: list[ErrorLogWatch] = msgspec.field(default_factory=list)
    file: list[FileWatch] = msgspec.field(default_factory=list)          # none on a fresh install
    fresh: list[FreshWatch] = msgspec.field(default_factory=list)        # none on a fresh install
    dir: list[DirWatch] = msgspec.field(default_factory=list)            # none on a fresh install


class TickSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Vital keys the snapshot carries: exact keys, or prefixes ending in "*".
    # "pending-tasks" adds the pending tasks and the agents' stats (for the assignment rule).
    sense: list[str] = msgspec.field(default_factory=lambda: [
        "system-resource", "process-alive:*", "process-memory:*", "health:*", "config:*", "network:*",
        "error-log:*", "file:*", "fresh:*", "dir:*", "engine:*", "pending-tasks"])
    # The engine's effect budget (pulse.rules.budget): whatever the agent's rules return,
    engine_dedupe_s: float = 60               # identical engine effects within this are committed once
    engine_effects_per_min: int = 120         # at most this many engine effects a minute; the rest dropped
    outcome_wake_min_ms: int = 1_000          # a tick woken by an engine effect's outcome waits this long after the last


class Allow(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What effects of origin `engine` or `agent` may do (survival and operator effects are trusted)."""
    kinds: list[str] = msgspec.field(default_factory=lambda: [
        "noop", "notify", "restart-process", "signal", "agent-run", "task-add"])   # agent-run: configured [[agent]]s only
    exec_argv: list[list[str]] = msgspec.field(default_factory=list)   # allowed argv prefixes for `exec`
    any_exec: bool = False                    # allow every argv (not recommended)
    signals: list[str] = msgspec.field(default_factory=lambda: ["SIGHUP", "SIGTERM", "SIGUSR1", "SIGUSR2"])


class Store(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    vitals_retention_h: float = 24            # vitals older than this are garbage-collected
    objects_retention_days: float = 7         # unreferenced blobs older than this are collected
    error_coalesce_s: float = 3600            # identical errors this close together are one run, counted ...
    error_repeat_s: float = 60                # ... whose repeats are appended as one error event per this
    # events.db's live history (docs/history.md): events past these bounds move, oldest first, into
    # compressed segments under <home>/archive (or are deleted, archive = false)
    keep_days: float = 30                     # events older than this leave the live history; 0: no age bound
    max_mb: float = 512                       # the live history's size bound (MiB); 0: no size bound
    keep_free_mb: float = 1024                # the home's disk keeps this free: below it, the live history is held
                                              # to what it is now (freed pages take the new events)
    archive: bool = True                      # false: events past the bounds are deleted, not archived
    archive_max_mb: float = 2048              # the archive's bound (MiB): its oldest segments go past it; 0: none


class Llm(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The agent's LLM endpoint: a [[watch.network]] target whose failures llmWatchdog answers by
    restarting a [[process]], as processWatchdog restarts one (stop, then start)."""
    target: str                               # the name of a [[watch.network]] entry
    process: str | None = None                # the [[process]] that serves it (required; see validate)
    restart: list[str] | None = None          # no longer read: an error says what to write instead
    fail_after: int = 3                       # failed health checks in a row before a restart


class Survival(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Thresholds of the survival rules (they run in the tick; the engine cannot change them)."""
    panic_failures: int = 3                   # panicRollback: survival's host repairs failed in a row since a promote
    auto_rollback_window_s: float = 600       # autoRollback watches a promote this long ...
    auto_rollback_errors: int = 5             # ... for this many engine errors ...
    auto_rollback_crashes: int = 3            # ... or this many engine crashes
    process_notify_after: int = 3             # failed restarts in a row before processWatchdog notifies
    process_backoff_base_s: float = 1         # after a failed restart, wait this long before the next ...
    process_backoff_max_s: float = 300        # ... doubling up to this
    memory_pct: float = 90                    # resourceGuard acts above these
    disk_pct: float = 90
    resource_cooldown_s: float = 300          # between two rounds of archive/cleanup for one cause
    archive_from: str | None = None           # agent session files older than archive_age_h move ...
    archive_to: str | None = None             # ... here
    archive_age_h: float = 72
    cleanup: list[str] = msgspec.field(default_factory=list)   # glob patterns of deletable temp files
    disk_trim_min_mb: float = 1               # disk above disk_pct: first, every [[watch.file]] file this big is
                                              # rotated or truncated (its action), before archive and cleanup
    ballast_mb: int = 32                      # freed first when the disk is full, so effects can still commit
    error_tick_ms: int = 1_000                # errorEscalate's tick while log errors keep coming
    notify_every_s: float = 300               # at most one notification per (rule, target) this often
    llm: Llm | None = None                    # unset: llmWatchdog is inactive


# Each built-in adapter and its argv when an [[agent]] sets none (None: the agent must set one).
# Defaults of config, so config checks an [[agent]] without importing the adapters (pulsed never
# does); each adapter's module says what its CLI documents and takes its argv from here.
ADAPTER_ARGV: dict[str, list[str] | None] = {
    "command": None,
    "claude-code": ["claude", "-p", "--output-format", "json", "--", "{prompt}"],
    "cursor": ["cursor-agent", "-p", "--output-format", "json", "--trust", "--force", "--", "{prompt}"],
    "codex": ["codex", "exec", "--json", "--skip-git-repo-check", "--", "{prompt}"],
    "hermes": ["hermes", "-z", "{prompt}"],
    "openclaw": ["openclaw", "agent", "--agent", "main", "--session-key", "{task_id}", "--message", "{prompt}",
                 "--json"],
}
ADAPTER_GROUP = "pulse.adapters"              # the entry point group other adapters register under


class SpendLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Spend limits that fail closed (pulse.agents.spend): an agent's (`[[agent]] budget = {...}`)
    or the host's (`[budget]`, all agents together). Days and months are UTC; every limit unset
    (the default) is no limit."""
    usd_per_day: float | None = None          # reported cost of runs started this UTC day; unset: no limit
    usd_per_month: float | None = None        # ... this UTC month; unset: no limit
    runs_per_hour: int | None = None          # runs started in the last 3600 s; unset: no limit


class RunLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """What one run of an agent may use (`[[agent]] limits = {...}`, pulse.agents.runlimits): held by
    the run's own cgroup where the host lets Pulse make one, rlimits as the floor. A run over memory,
    pids or disk ends at once, failed with that reason; cpu is a quota, never an end. 0: no limit."""
    memory_mb: int = 4096                     # all its processes together
    pids: int = 512                           # processes and threads at once
    cpu_percent: int = 100                    # 100: one core
    disk_mb: int = 2048                       # what it may add to its work and scratch dirs; any one file


class Agent(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """An agent Pulse hands tasks to; the `agent-run` effect runs it (see pulse.agents.adapters)."""
    name: str
    adapter: str = "command"                  # command | claude-code | cursor | codex | hermes | openclaw |
                                              # a `pulse.adapters` entry point
    # argv template, never a shell string; placeholders per element: {prompt} {task_id} {title}
    # {project} {agent} {workdir}. Unset: the adapter's (ADAPTER_ARGV; `command` has none).
    argv: list[str] | None = None
    cwd: str | None = None                    # may use {task_id} {agent} {project}; unset: <home>/work/<task_id>
    env: dict[str, str] = msgspec.field(default_factory=dict)   # added to Pulse's; values take placeholders
    timeout_s: float = 1800                   # a run longer than this is killed (its whole process group)
    # a run silent this long (no output and no telemetry) is ended, reason `stalled`, every process of
    # it gone, instead of waiting out timeout_s; unset: only timeout_s ends it. With [telemetry] on, keep
    # it well above [telemetry] flush_s plus the CLI's export interval (a CLI in print mode says nothing
    # on stdout until its end: its telemetry is what shows it alive)
    stall_s: float | None = None
    concurrency: int = 1                      # runs of this agent at once; more wait, pending
    mcp: bool = True                          # hand the run `pulsectl mcp` where its CLI documents a way
    # a run that used the gate is acked only if a session of it called finish; false relaxes that
    # (an unverified write still fails the run)
    gate_requires_finish: bool = True
    # Routing: who may take what. `projects`: the projects whose tasks it takes; unset: every
    # project. `tags`: a task added with --tag goes only to an agent whose tags include all of its tags;
    # empty (the default): it takes untagged tasks only. A task pinned to it (task add --agent) still
    # needs its project and tags to fit.
    projects: list[str] | None = None
    tags: list[str] = msgspec.field(default_factory=list)
    # the projects its create_task may add tasks to; unset: its own `projects` (unset too: any)
    task_projects: list[str] | None = None
    budget: SpendLimits = msgspec.field(default_factory=SpendLimits)   # this agent's limits; default: none
    # the cost a run is expected to have, reserved before it starts; unset: the median of the
    # agent's last 10 runs that reported a cost (none yet: 0). With [telemetry] on, a run whose reported
    # cost reaches it (or what was left under its budget when it started) is ended, reason over-budget
    max_run_usd: float | None = None
    # with [telemetry] on: a run that reported more API requests, or more tool calls, than this in the
    # last minute is in a loop and is ended, reason loop; unset (the default): no loop is looked for
    loop_per_min: int | None = None
    # -- the run's own account --
    # run the agent CLI as this account: it reaches Pulse's gate socket and nothing else of Pulse
    # (pulsed needs root, or CAP_SETUID, CAP_SETGID and CAP_CHOWN); unset (the default): pulsed's own user
    user: str | None = None
    group: str | None = None                  # its group; unset (the default): the user's primary group
    limits: RunLimits = msgspec.field(default_factory=RunLimits)   # what one run may use


class Tasks(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    max_failures: int = 3                     # failed runs of one task in a row before it is given up
    retry_base_s: float = 10                  # a failed run's task waits this long before the next run ...
    retry_max_s: float = 300                  # ... doubling per failure in a row, up to this
    # an agent's create_task (the gate's tool; `task-add` in [allow] kinds): a task made in a run of a
    # task of depth d has depth d + 1 (the operator's are 0), at most this; and one agent makes at most
    # agent_tasks_per_hour of them in any hour
    agent_max_depth: int = 3
    agent_tasks_per_hour: int = 30


class Report(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`pulsectl report` and the daily report (pulse.report)."""
    analyst: str = "deterministic"            # or the name of an [[agent]] that writes the analysis
    analyst_timeout_s: float = 300            # an agent analyst silent this long: the deterministic one is used
    analyst_max_events: int = 400             # the agent gets at most this many events (summarised, with ids)
    daily_at: str | None = None               # "08:00", host local time: the day's report through [[notify]]
    dir: str | None = None                    # where the report effect writes its pages; unset: <home>/reports


# -- schedules ([[schedule]]; the tick runs them, pulse.core.schedule says when) ---------------------

class ScheduleTask(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What a schedule adds at each slot: a pending task, as `pulsectl task add` adds one."""
    project: str
    title: str
    prompt: str
    agent: str | None = None                  # the [[agent]] it is for; unset: whoever the assignment rule picks
    priority: int = 0


class ScheduleEffect(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """... or an effect, committed by the tick (origin "schedule": the operator's config, trusted)."""
    kind: str                                 # an effect kind, e.g. "exec", "notify", "report"
    target: str | None = None
    params: dict[str, Any] = msgspec.field(default_factory=dict)


class Schedule(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Recurring work. Its slots are the times a cron expression matches (host local time) or the
    multiples of `every` since the Unix epoch; at each, one task or effect, committed with the fact
    that the slot ran, so no restart runs a slot twice or skips one. A schedule's first slot is the
    one after it is first seen."""
    name: str
    cron: str | None = None                   # "0 3 * * *": minute hour day-of-month month day-of-week ...
    every: str | None = None                  # ... or a period, "15m" (ms s m h d, "1h30m"); exactly one of them
    task: ScheduleTask | None = None          # each run adds this task ...
    effect: ScheduleEffect | None = None      # ... or commits this effect; exactly one of them
    catch_up: bool = True                     # after downtime, the latest missed slot runs once at start
                                              # (systemd's Persistent=true); never once per missed slot
    grace_s: float = 60                       # catch_up = false: a slot due longer ago than this is skipped
    jitter_s: float = 0                       # each slot runs up to this much after its time (fixed per slot)
    notify_after: int = 2                     # runs in a row that end failed before a notification; 0: never
    # a slot due while the last run's task or effect is still open waits for it (catch_up) or is skipped
    # (counted); true: it runs anyway, and runs may pile up behind a hold
    overlap: bool = False


class Gate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The agents' safety gate, served by the executor (`pulsectl mcp` is its stdio proxy)."""
    max_string_bytes: int = 4 * 1024          # any one string argument; larger: INVALID_INPUT
    max_call_bytes: int = 64 * 1024           # all of one call's arguments, as JSON
    # blocked calls of one agent and task recorded per minute, host-wide; more are only counted (the
    # count rides on the session's next fact), so a model retrying a refused call cannot fill events.db
    blocks_per_min: int = 30
    # where the gate's socket is made; "" (the default): pulsed's private runtime directory. An
    # [[agent]] with a `user` must reach it: name a directory every parent of which that account can
    # traverse, of root or pulsed's account, writable by no other (the main socket there is 0600; each
    # agent account gets its own, in a directory there only it can enter: pulse.gate.sockets)
    socket_dir: str = ""
    # connections the gate holds at once (each is one session; past a limit a new one is refused
    # GATE_BUSY, retry, and the sessions already open go on): all together, from one account (peer
    # uid), from one process (peer pid; a `pulsectl mcp` holds one)
    max_sessions: int = 256
    max_sessions_per_uid: int = 64
    max_sessions_per_pid: int = 4
    hello_timeout_s: float = 10.0             # a connection that says nothing this long is closed (it holds a slot)
    # calls (and session opens) of one agent and task per minute, host-wide, admitted or blocked; past
    # that a call is answered RATE_LIMITED with retry_after_s and records nothing: the bound on what an
    # agent adds to events.db per minute. call_burst: how many may come at once before the rate applies
    calls_per_min: int = 600
    call_burst: int = 120


class Web(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The operator's page and /metrics (`pulsectl web url`). Nothing listens on TCP unless enabled."""
    enabled: bool = False
    listen: str = "127.0.0.1:8370"            # host:port; port 0 takes a free one
    allow_remote: bool = False                # a non-loopback listen needs this, and TLS
    tls_cert: str | None = None               # PEM files; both, or neither
    tls_key: str | None = None


# -- [telemetry]: the local OTLP receiver (pulse.workers.telemetry) --------------------------------

class Telemetry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Off unless enabled. OTLP/HTTP logs, metrics and traces in (protobuf or JSON), folded into one
    `telemetry` fact per run or session and flush_s; at most max_sources of them per flush, so the
    receiver adds at most max_sources * 60 / flush_s events a minute, whatever it is sent."""
    enabled: bool = False
    # host:port; 4318 is OTLP/HTTP's own port, so a CLI an operator points at "the local collector"
    # finds it. Beyond loopback every request needs the token in <home>/telemetry.token
    # (Authorization: Bearer TOKEN, or X-Pulse-Token: TOKEN).
    listen: str = "127.0.0.1:4318"
    max_body_kb: int = 4096                   # a larger request is refused (413) before its body is read
    requests_per_s: float = 50                # admitted requests a second (callers with the token, and the
                                              # others, each as much), after a burst of ...
    burst: int = 100                          # ... this many; past that: 429 with Retry-After
    queue_kb: int = 16384                     # bodies being read or not yet folded; full: 503 (the CLI retries);
                                              # callers without the token get half of it
    flush_s: float = 5                        # what was folded goes to events.db this often
    max_sources: int = 32                     # runs and sessions counted per flush; others' records dropped, counted
    # Pulse's own runs, out: each ended run as GenAI trace spans (invoke_agent, execute_tool per gate
    # call), POSTed as OTLP/HTTP protobuf to <export>/v1/traces; unset (the default): nothing is sent
    export: str | None = None                 # http(s)://host:port of a collector (path prefix allowed)
    export_headers: dict[str, str] = msgspec.field(default_factory=dict)   # e.g. Authorization; never shown
    export_queue: int = 1000                  # runs waiting to be sent; full: the oldest dropped, counted
    export_give_up_s: float = 60              # a run not sent this long (collector down): dropped, counted


# -- [fleet]: this host among others, over NATS JetStream (pulse.workers.fleet) --------------------

class Fleet(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Off unless enabled; the fleet worker is then the only process that talks to NATS. A single
    host never needs it, and survival never waits on it."""
    enabled: bool = False
    url: list[str] = msgspec.field(default_factory=lambda: ["nats://127.0.0.1:4222"])   # nats:// or tls:// servers
    # At most one way to authenticate; none: the server's anonymous access. Never logged or shown.
    creds_file: str | None = None             # a NATS .creds file (JWT + NKey seed)
    token: str | None = None                  # a plain token
    nkey_seed_file: str | None = None         # a file holding an NKey seed ("SU...")
    host: str | None = None                   # this host's name in the fleet; unset: <instance name>@<hostname>
    presence_interval_s: float = 5            # this host's summary goes to the pulse-hosts bucket this often
    presence_ttl_s: float = 30                # ... and is gone from it this long after the last one
    reconnect_max_s: float = 30               # a failed connect is retried after 0.5 s, doubling up to this
    events_batch: int = 500                   # events published per cursor commit
    # A host with [[agent]]s takes fleet tasks for them (`pulsectl task add --fleet`); its claim on a task
    # lapses this long after its last renewal (renewed every third of it while the task runs), and
    # then the task runs again elsewhere: at least once across a host's death, at most once otherwise.
    take_tasks: bool = True
    task_lease_s: float = 30
    # A fleet task is taken at most this many times (a taking ends when its host gives the task up, or
    # when its host dies and the lease lapses); past it, it is dead-lettered: put in the KV bucket
    # pulse-task-dead and recorded on its origin as a `fleet-task-dead` event. Default 3.
    max_deliver: int = 3
    # A fleet task no host takes (no agent anywhere fits, is free or within budget) is dead-lettered this
    # long after it was offered, with each host's last reason for leaving it. Default 86400 (a day).
    offer_ttl_s: float = 86_400
    # A host that gave a fleet task up leaves it to the other hosts this long before it takes it again
    # (the fleet's "failed on" rule: another host that can take it gets it first). Default 60.
    failed_host_wait_s: float = 60
    # The streams and KV buckets the first fleet worker creates keep this many copies, one per NATS server:
    # 1 for a single server; 3 on a three-server cluster, so that each survives the loss of any one server
    # (a stream or bucket that already exists is used as it is). At most 5, and no more than the servers.
    replicas: int = 1


FLEET_URL = re.compile(r"(nats|tls)://[^\s/]+")


def validate_fleet(fleet: Fleet, origin: str) -> None:
    if not fleet.url:
        raise ConfigError(f"{origin}: $.fleet.url: name at least one server")
    for i, url in enumerate(fleet.url):
        if not FLEET_URL.fullmatch(url):
            raise ConfigError(f"{origin}: $.fleet.url[{i}]: not a nats:// or tls:// server address")
    ways = [k for k in ("creds_file", "token", "nkey_seed_file") if getattr(fleet, k) is not None]
    if len(ways) > 1:
        raise ConfigError(f"{origin}: $.fleet: set at most one of creds_file, token, nkey_seed_file (got {', '.join(ways)})")
    if fleet.host is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}", fleet.host):
        raise ConfigError(f"{origin}: $.fleet.host: 1 to 128 letters, digits and _ . @ - (not starting with a symbol)")
    if fleet.presence_interval_s <= 0 or fleet.presence_ttl_s < 2 * fleet.presence_interval_s:
        raise ConfigError(f"{origin}: $.fleet: presence_interval_s must be above 0 and presence_ttl_s at least twice it")
    if fleet.task_lease_s < 1:
        raise ConfigError(f"{origin}: $.fleet.task_lease_s must be at least 1")
    if fleet.max_deliver < 1:
        raise ConfigError(f"{origin}: $.fleet.max_deliver must be at least 1, got {fleet.max_deliver}")
    if fleet.offer_ttl_s <= 0 or fleet.failed_host_wait_s < 0:
        raise ConfigError(f"{origin}: $.fleet: offer_ttl_s must be above 0 and failed_host_wait_s at least 0")
    if not 1 <= fleet.replicas <= 5:
        raise ConfigError(f"{origin}: $.fleet.replicas: 1 to 5 copies of each stream (JetStream's limit), got {fleet.replicas}")
    if fleet.reconnect_max_s < 0.5 or fleet.events_batch < 1:
        raise ConfigError(f"{origin}: $.fleet: reconnect_max_s must be at least 0.5 and events_batch at least 1")


HIDDEN = "(hidden)"


def without_secrets(config: "Config") -> "Config":
    """`config` fit to show (`pulsectl config --effective`, the control socket): the fleet's token
    and the export's header values replaced; the creds and seed are files, named by path, never read here."""
    if config.fleet.token is not None:
        config = msgspec.structs.replace(config, fleet=msgspec.structs.replace(config.fleet, token=HIDDEN))
    if config.telemetry.export_headers:
        config = msgspec.structs.replace(config, telemetry=msgspec.structs.replace(
            config.telemetry, export_headers={k: HIDDEN for k in config.telemetry.export_headers}))
    return config


class PulseSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # This instance's name among the Pulses of the host (`pulsectl instances`, `pulsectl -i NAME`);
    # unset: the home's folder name. Read when pulsed starts.
    name: str | None = None


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    schema: int = SCHEMA_VERSION
    pulse: PulseSettings = msgspec.field(default_factory=PulseSettings)
    observe_only: bool = False                # record what the rules would do as effect-expired, run nothing
    timings: Timings = msgspec.field(default_factory=Timings)
    log: LogSettings = msgspec.field(default_factory=LogSettings)
    engine: EngineLimits = msgspec.field(default_factory=EngineLimits)
    watch: Watch = msgspec.field(default_factory=Watch)
    tick: TickSettings = msgspec.field(default_factory=TickSettings)
    allow: Allow = msgspec.field(default_factory=Allow)
    store: Store = msgspec.field(default_factory=Store)
    survival: Survival = msgspec.field(default_factory=Survival)
    tasks: Tasks = msgspec.field(default_factory=Tasks)
    report: Report = msgspec.field(default_factory=Report)
    gate: Gate = msgspec.field(default_factory=Gate)
    web: Web = msgspec.field(default_factory=Web)
    fleet: Fleet = msgspec.field(default_factory=Fleet)
    telemetry: Telemetry = msgspec.field(default_factory=Telemetry)
    process: list[Process] = msgspec.field(default_factory=list)
    agent: list[Agent] = msgspec.field(default_factory=list)
    schedule: list[Schedule] = msgspec.field(default_factory=list)   # none on a fresh install
    notify: list[Notify] = msgspec.field(default_factory=lambda: [Notify(kind="log")])
    budget: SpendLimits = msgspec.field(default_factory=SpendLimits)   # host-wide, all agents; default: none


# -- what each process reads -----------------------------------------------------------------------
# Each worker declares the config it reads as one Struct of Config's own types (a table whole, or a
# cut of one). pulsed sends a worker its slice and nothing else, so the worker cannot read what its
# slice does not hold, and a reload restarts exactly the workers whose slice changed.

def _cut(name: str, table: type[msgspec.Struct], keys: tuple[str, ...]) -> type[msgspec.Struct]:
    """A Struct holding `keys` of `table`, typed as there."""
    types = {f.name: f.type for f in msgspec.structs.fields(table)}
    return msgspec.defstruct(name, [(k, types[k]) for k in keys], kw_only=True, frozen=True, module=__name__)


EVERY_WORKER = ("heartbeat_ms", "sqlite_busy_timeout_ms")   # the harness reads these in every worker
EventWriterTimings = _cut("EventWriterTimings", Timings, (*EVERY_WORKER, "hung_after_ms"))
WatcherTimings = _cut("WatcherTimings", Timings, (*EVERY_WORKER, "watcher_interval_ms", "wake_window_s"))
TickTimings = _cut("TickTimings", Timings, (*EVERY_WORKER, "tick_ms", "tick_ms_min", "tick_ms_max",
                                            "engine_rpc_deadline_ms", "engine_urgent_deadline_ms",
                                            "effect_deadline_s", "ballast_check_s"))
ExecutorTimings = _cut("ExecutorTimings", Timings, (*EVERY_WORKER, "effect_deadline_s", "effect_timeout_s",
                                                    "executor_concurrency", "executor_scan_interval_ms",
                                                    "engine_rpc_deadline_ms", "effect_retry_base_ms",
                                                    "effect_retry_max_ms"))
EngineTimings = _cut("EngineTimings", Timings, (*EVERY_WORKER, "engine_rpc_deadline_ms",
                                                "watcher_interval_ms", "wake_window_s"))
SupervisorTimings = _cut("SupervisorTimings", Timings, (
    "restart_backoff_base_ms", "restart_backoff_max_ms", "healthy_reset_s", "intensity_restarts",
    "intensity_period_s", *(s.retry_key for s in RETRIED), "heartbeat_ms", "hung_after_ms",
    "ready_timeout_ms", "stop_grace_ms"))
EngineProcessLimits = _cut("EngineProcessLimits", EngineLimits, ("address_space_mb", "oom_score_adj"))
PromoteChecks = _cut("PromoteChecks", EngineLimits, ("typecheck",))
ReportSchedule = _cut("ReportSchedule", Report, ("daily_at",))
WatchedFiles = _cut("WatchedFiles", Watch, ("file", "dir"))
SurvivalPaths = _cut("SurvivalPaths", Survival, ("archive_from", "archive_to", "cleanup"))


class EventWriterConfig(msgspec.Struct, kw_only=True, frozen=True):
    timings: EventWriterTimings
    log: LogSettings
    store: Store = msgspec.field(default_factory=Store)   # the history's bounds: it moves what is past them


class WatcherConfig(msgspec.Struct, kw_only=True, frozen=True):
    timings: WatcherTimings
    log: LogSettings
    watch: Watch
    process: list[Process]
    store: Store


class TickConfig(msgspec.Struct, kw_only=True, frozen=True):
    observe_only: bool
    timings: TickTimings
    log: LogSettings
    tick: TickSettings
    watch: Watch                  # errorEscalate and networkWatchdog act on what is watched
    process: list[Process]
    store: Store
    survival: Survival
    agent: list[Agent]
    report: ReportSchedule        # the daily report is a survival-style rule
    schedule: list[Schedule]      # the tick runs the schedules
    # the host-wide spend limits: the snapshot says which agents are over one (AgentLoad.budget)
    budget: SpendLimits = msgspec.field(default_factory=SpendLimits)


class ExecutorConfig(msgspec.Struct, kw_only=True, frozen=True):
    timings: ExecutorTimings
    log: LogSettings
    allow: Allow
    process: list[Process]
    notify: list[Notify]
    agent: list[Agent]
    tasks: Tasks
    store: Store
    engine: PromoteChecks         # the engine-promote effect runs the promote checks
    report: Report                # the report effect
    watch: WatchedFiles           # rotate-file and trim-dir act only on what a [[watch.file]] / [[watch.dir]] glob matches
    survival: SurvivalPaths       # with the globs above: the directories an agent's archive or cleanup may touch
    budget: SpendLimits           # the host-wide spend limits agent-run reserves against
    gate: Gate                    # the executor serves the agents' gate (pulse.gate.server)


class EngineConfig(msgspec.Struct, kw_only=True, frozen=True):
    timings: EngineTimings
    log: LogSettings
    engine: EngineProcessLimits
    store: Store


WebTimings = _cut("WebTimings", Timings, (*EVERY_WORKER, "effect_deadline_s"))   # the page's engine buttons


class WebConfig(msgspec.Struct, kw_only=True, frozen=True):
    timings: WebTimings
    log: LogSettings
    web: Web
    # the task board says who may take what; /metrics: each agent's spend against its limits
    agent: list[Agent] = msgspec.field(default_factory=list)
    budget: SpendLimits = msgspec.field(default_factory=SpendLimits)   # ... and the host's
    schedule: list[Schedule] = msgspec.field(default_factory=list)     # the schedules page
    store: Store = msgspec.field(default_factory=Store)                # the history's size against its bounds


class SupervisorConfig(msgspec.Struct, kw_only=True, frozen=True):
    """What pulsed itself reads; a reload applies it in place (the instance's name: at start only).
    pulsed holds the whole Config too, but only to cut the workers' slices from it and show it."""
    timings: SupervisorTimings
    log: LogSettings
    pulse: PulseSettings
    web: Web                      # whether the web worker runs
    fleet: Fleet                  # whether the fleet worker runs
    telemetry: Telemetry          # whether the telemetry receiver runs
    process: list[Process]        # the critical processes `pulsectl status` lists


class FleetConfig(msgspec.Struct, kw_only=True, frozen=True):
    timings: WebTimings           # what every worker reads (the same cut as the web's)
    log: LogSettings
    fleet: Fleet
    pulse: PulseSettings          # the instance's name: the default host name
    agent: list[Agent]            # the agents this host advertises
    budget: SpendLimits           # the host-wide spend limits: a task is taken only within them


class TelemetryConfig(msgspec.Struct, kw_only=True, frozen=True):
    timings: WebTimings           # what every worker reads (the same cut as the web's)
    log: LogSettings
    telemetry: Telemetry


# Each worker's slice, the Struct above its child spec names, in start order.
SLICES: dict[str, type[msgspec.Struct]] = {name: globals()[spec.config] for name, spec in CHILD_SPECS.items()}


def slice_of(config: Config, worker: str) -> msgspec.Struct:
    """The part of `config` that `worker` reads (`supervisor` for pulsed's own)."""
    kind = SupervisorConfig if worker == "supervisor" else SLICES[worker]
    return msgspec.convert(msgspec.to_builtins(config), kind)


def encode_slice(config: Config, worker: str) -> bytes:
    return msgspec.msgpack.encode(slice_of(config, worker))


def decode_slice(worker: str, data: bytes) -> msgspec.Struct:
    return msgspec.msgpack.decode(data, type=SLICES[worker])


def changed_tables(old: Config, new: Config) -> list[str]:
    """The top-level keys of config.toml whose values differ."""
    return [f.name for f in msgspec.structs.fields(Config) if getattr(old, f.name) != getattr(new, f.name)]


def changed_slices(old: Config, new: Config) -> list[str]:
    """The workers a reload from `old` to `new` must restart."""
    return [name for name in SLICES if slice_of(old, name) != slice_of(new, name)]


def env_overrides(environ: os._Environ | dict) -> dict[str, object]:
    """PULSE_<TIMING_KEY>=value → {key: value}, typed like the default."""
    out: dict[str, object] = {}
    for field in msgspec.structs.fields(Timings):
        name = "PULSE_" + field.name.upper()
        if name not in environ:
            continue
        raw = environ[name]
        try:
            out[field.name] = float(raw) if field.type is float else int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: expected a number for $.timings.{field.name}") from None
    return out


_UNKNOWN = re.compile(r"Object contains unknown field `(?P<key>[^`]+)`(?: - at `(?P<path>[^`]+)`)?$")
_AT = re.compile(r"^(?P<msg>.*) - at `(?P<path>[^`]+)`$")


_HEADER = re.compile(r"^\s*(?P<comment>#\s*)?(?P<open>\[\[?)\s*(?P<name>[\w.-]+)\s*\]\]?")


def _explain(err: msgspec.ValidationError, source: str = "") -> str:
    text = str(err)
    m = _UNKNOWN.match(text)
    if m:
        path, key = m["path"] or "$", m["key"]
        return f"unknown key {path}.{key}" + (_misplaced(source, path, key) or _did_you_mean(path, key))
    m = _AT.match(text)
    if m:
        choices = _choices(m["path"]) if m["msg"].startswith("Invalid enum value") else None
        hint = f"; one of: {', '.join(choices)}" if choices else _brackets(m["path"], m["msg"])
        return f"{m['path']}: {m['msg']}" + hint
    return text


def _brackets(path: str, msg: str) -> str:
    """`[process]` where `[[process]]` is meant (and the other way round): name the spelling."""
    name = path.removeprefix("$.")
    if "." in name or "[" in name:
        return ""
    if msg == "Expected `array`, got `object`":
        return f"; [[{name}]] is a list of tables: write [[{name}]] (two brackets) above each entry"
    if msg == "Expected `object`, got `array`":
        return f"; [{name}] is one table: write [{name}] (one bracket), once"
    return ""


def _misplaced(source: str, path: str, key: str) -> str:
    """A known key in the wrong table, said by the line that put it there: TOML puts a key in the table
    whose header is above it, so a key under a header left commented lands in the table before, and one
    appended at the end of the file lands in the last table. Empty when the key is no other table's."""
    owners = [f.encode_name for f in msgspec.structs.fields(Config) if key in _safe_fields(f"$.{f.encode_name}")]
    if path != "$" and key in _safe_fields("$"):
        owners = [""]          # a top-level key: above the first table's header
    if not owners or not source:
        return ""
    lines = source.splitlines()
    at = next((i for i, line in enumerate(lines) if re.match(rf"\s*{re.escape(key)}\s*=", line)), None)
    if at is None:
        return ""
    above = [(i, h) for i, h in ((i, _HEADER.match(lines[i])) for i in range(at - 1, -1, -1)) if h]
    comment = next(((i, h) for i, h in above if h["comment"]), None)
    live = next(((i, h) for i, h in above if not h["comment"]), None)
    table = f"[{owners[0]}]" if owners[0] else "the top level"
    where = f"line {at + 1}: `{key}` is a key of {table}"
    if comment and (live is None or comment[0] > live[0]) and comment[1]["name"] == owners[0]:
        return (f"; {where}, and the header above it, `{lines[comment[0]].strip()}` (line {comment[0] + 1}), "
                "is commented out: uncomment it")
    if path != "$" and live is not None:
        return (f"; {where}: TOML puts a key in the table whose header is above it (`{lines[live[0]].strip()}`, "
                f"line {live[0] + 1}), so move it " + (f"under [{owners[0]}]" if owners[0] else "above the first table header"))
    return ""


def _fields_at(path: str) -> list[str]:
    """The keys the table at `path` (`$`, `$.timings`, `$.process[0].health`) takes."""
    import typing
    kind: object = Config
    for part in re.sub(r"\[\d+\]", "", path).split(".")[1:]:
        fields = {f.name: f.type for f in msgspec.structs.fields(kind)} if isinstance(kind, type) else {}
        kind = fields.get(part)
        while typing.get_origin(kind) in (list, typing.Union) or type(kind).__name__ == "UnionType":
            kind = next(a for a in typing.get_args(kind) if isinstance(a, type) and a is not type(None)
                        and issubclass(a, msgspec.Struct))
    if not (isinstance(kind, type) and issubclass(kind, msgspec.Struct)):
        return []
    return [f.encode_name for f in msgspec.structs.fields(kind)]


def _did_you_mean(path: str, key: str) -> str:
    """`; did you mean heartbeat_ms?` for a misspelt key, or the table a top-level key belongs in
    (`level` uncommented under a commented `# [log]` lands at the top level)."""
    import difflib
    if path == "$":      # a table's own key first: a top-level name that merely looks like it is no help
        tables = [f.encode_name for f in msgspec.structs.fields(Config)
                  if key in _safe_fields(f"$.{f.encode_name}")]
        if tables:
            return f"; it belongs in a table: [{tables[0]}] (uncomment that table's header too)"
    close = difflib.get_close_matches(key, _safe_fields(path), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def _safe_fields(path: str) -> list[str]:
    try:
        return _fields_at(path)
    except (StopIteration, TypeError):
        return []


def _choices(path: str) -> list[str] | None:
    """The values a Literal key at `path` (`$.log.level`, `$.notify[0].kind`) takes."""
    import typing
    kind: object = Config
    for part in re.sub(r"\[\d+\]", "", path).split(".")[1:]:
        fields = {f.name: f.type for f in msgspec.structs.fields(kind)} if isinstance(kind, type) else {}
        kind = fields.get(part)
        while typing.get_origin(kind) in (list, typing.Union) or type(kind).__name__ == "UnionType":
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
    return [str(v) for v in typing.get_args(kind)] if typing.get_origin(kind) is Literal else None


def decode(text: str | bytes, origin: str) -> Config:
    """Decode config.toml text; errors name `origin` and the key path."""
    try:
        raw = msgspec.toml.decode(text)
        config = msgspec.convert(with_presets(raw, origin), Config, builtin_types=TOML_TYPES, str_keys=True)
    except msgspec.ValidationError as err:
        source = text.decode(errors="replace") if isinstance(text, bytes) else text
        raise ConfigError(f"{origin}: {_explain(err, source)}") from None
    except msgspec.DecodeError as err:
        raise ConfigError(f"{origin}: not valid TOML: {err}") from None
    if config.schema > SCHEMA_VERSION:
        raise ConfigError(f"{origin}: $.schema is {config.schema}; this Pulse reads up to {SCHEMA_VERSION}")
    return config


TOML_TYPES = (datetime.datetime, datetime.date, datetime.time)   # what msgspec.toml.decode keeps as they are


def with_presets(raw: object, origin: str) -> object:
    """The decoded file with each [[process]]'s preset merged under the table's own keys."""
    tables = raw.get("process") if isinstance(raw, dict) else None
    if not isinstance(tables, list) or not any(isinstance(t, dict) and "preset" in t for t in tables):
        return raw
    from pulse.core import presets
    out = []
    for i, table in enumerate(tables):
        if not isinstance(table, dict):
            out.append(table)
            continue
        try:
            out.append(presets.applied(table))
        except presets.PresetError as err:
            named = f" (the table named {table['name']!r})" if isinstance(table.get("name"), str) else ""
            raise ConfigError(f"{origin}: $.process[{i}].{err.key}{named}: {err.why}") from None
    return {**raw, "process": out}


def validate(config: Config, origin: str) -> Config:
    """Cross-field checks that a type cannot express."""
    t = config.timings
    positive = [f.name for f in msgspec.structs.fields(Timings)]
    for name in positive:
        if getattr(t, name) <= 0:
            raise ConfigError(f"{origin}: $.timings.{name} must be greater than 0, got {getattr(t, name)}")
    if t.restart_backoff_max_ms < t.restart_backoff_base_ms:
        raise ConfigError(f"{origin}: $.timings.restart_backoff_max_ms must be at least restart_backoff_base_ms")
    if t.hung_after_ms <= t.heartbeat_ms:
        raise ConfigError(f"{origin}: $.timings.hung_after_ms ({t.hung_after_ms}) must exceed heartbeat_ms ({t.heartbeat_ms})")
    if t.hung_after_ms <= t.sqlite_busy_timeout_ms:
        raise ConfigError(f"{origin}: $.timings.hung_after_ms ({t.hung_after_ms}) must exceed sqlite_busy_timeout_ms "
                          f"({t.sqlite_busy_timeout_ms}): a worker waiting for a lock would be killed as hung")
    if t.hung_after_ms <= t.engine_rpc_deadline_ms:
        raise ConfigError(f"{origin}: $.timings.hung_after_ms must exceed engine_rpc_deadline_ms")
    if t.engine_urgent_deadline_ms > t.engine_rpc_deadline_ms:
        raise ConfigError(f"{origin}: $.timings.engine_urgent_deadline_ms must not exceed engine_rpc_deadline_ms")
    if not t.tick_ms_min <= t.tick_ms <= t.tick_ms_max:
        raise ConfigError(f"{origin}: $.timings.tick_ms must lie within tick_ms_min … tick_ms_max")
    for key in ("keep_days", "max_mb", "keep_free_mb", "archive_max_mb"):
        if (value := getattr(config.store, key)) < 0:
            raise ConfigError(f"{origin}: $.store.{key} must be 0 or more, got {value}")
    if 0 < config.store.max_mb < 16:           # a bound below one segment's worth would move all the time
        raise ConfigError(f"{origin}: $.store.max_mb must be 0 (no size bound) or at least 16, got {config.store.max_mb}")
    if config.store.error_repeat_s <= 0:     # 0 would append every repeat: the flood that coalescing prevents
        raise ConfigError(f"{origin}: $.store.error_repeat_s must be greater than 0, got {config.store.error_repeat_s}")
    for i, proc in enumerate(config.process):
        where = f"{origin}: $.process[{i}]"
        if (proc.pidfile is None) == (proc.match is None):
            raise ConfigError(f"{where}: set exactly one of pidfile or match")
        if proc.match is not None:
            try:
                re.compile(proc.match)
            except re.error as err:
                raise ConfigError(f"{where}.match: not a valid regex: {err}") from None
        if proc.restart is not None and not proc.restart:
            raise ConfigError(f"{where}.restart: an argv list needs at least the program")
        if proc.health is not None:
            validate_health(proc.health, f"{where}.health")
        if proc.memory is not None:
            validate_memory(proc, f"{where}.memory")
        if proc.stop is not None and not proc.stop:
            raise ConfigError(f"{where}.stop: an argv list needs at least the program")
        if proc.on_crash_loop is not None:
            if not proc.on_crash_loop or not proc.on_crash_loop[0]:
                raise ConfigError(f"{where}.on_crash_loop: an argv list needs at least the program")
            if not proc.restart or proc.max_restarts == 0:
                raise ConfigError(f"{where}.on_crash_loop: runs when the process is held fatal, which needs a "
                                  "restart argv and max_restarts above 0")
        if proc.stop_timeout_s <= 0 or proc.start_grace_s < 0:
            raise ConfigError(f"{where}: stop_timeout_s must be greater than 0 and start_grace_s at least 0")
        if proc.min_uptime_s < 0 or not 0 <= proc.max_restarts <= MAX_RESTARTS or proc.restart_window_s <= 0:
            raise ConfigError(f"{where}: min_uptime_s must be at least 0, max_restarts within 0 … {MAX_RESTARTS} "
                              f"and restart_window_s greater than 0 (got {proc.min_uptime_s:g}, {proc.max_restarts}, "
                              f"{proc.restart_window_s:g})")
        if proc.restart_backoff is not None and not 0 < proc.restart_backoff.base_s <= proc.restart_backoff.max_s:
            raise ConfigError(f"{where}.restart_backoff: base_s must be greater than 0 and at most max_s")
        for field in ("restart_exit_codes", "stop_exit_codes"):
            for j, code in enumerate(getattr(proc, field)):
                if not 1 <= code <= 255:
                    raise ConfigError(f"{where}.{field}[{j}]: an exit code lies within 1 … 255, got {code}")
        if both := set(proc.restart_exit_codes) & set(proc.stop_exit_codes):
            raise ConfigError(f"{where}: exit code {min(both)} is in both restart_exit_codes and stop_exit_codes")
        validate_config_files(proc, where)
    names = [p.name for p in config.process]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.process: names must be unique")
    for i, channel in enumerate(config.notify):
        if channel.burst < 1 or channel.group_s <= 0:
            raise ConfigError(f"{origin}: $.notify[{i}]: burst must be at least 1 and group_s greater than 0")
        need = {"file": "path", "webhook": "url", "command": "argv"}.get(channel.kind)
        if need and not getattr(channel, need):
            raise ConfigError(f"{origin}: $.notify[{i}].{need}: required for kind {channel.kind!r}")
    llm = config.survival.llm
    if llm is not None and llm.target not in {t.name for t in config.watch.network}:
        raise ConfigError(f"{origin}: $.survival.llm.target: no [[watch.network]] named {llm.target!r}")
    if llm is not None and llm.restart is not None:
        raise ConfigError(f"{origin}: $.survival.llm.restart: the endpoint is now restarted as a [[process]] is "
                          "(stopped, then started, never two copies; an exec timeout killed a proxy started "
                          "this way): add a [[process]] with that argv as `restart` and a `match` or `pidfile`, "
                          "and write process = \"<its name>\" here")
    if llm is not None and llm.process is None:
        raise ConfigError(f"{origin}: $.survival.llm.process: required: the [[process]] that serves the endpoint")
    if llm is not None and not any(p.name == llm.process and p.restart for p in config.process):
        raise ConfigError(f"{origin}: $.survival.llm.process: no [[process]] named {llm.process!r} with a restart argv")
    for i, target in enumerate(config.watch.network):
        if not (target.host or target.url):
            raise ConfigError(f"{origin}: $.watch.network[{i}]: set host, url or both")
    validate_watched_files(config.watch.file, origin)
    validate_fresh_watches(config, origin)
    validate_watched_dirs(config.watch.dir, origin)
    if t.effect_retry_max_ms < t.effect_retry_base_ms:
        raise ConfigError(f"{origin}: $.timings.effect_retry_max_ms must be at least effect_retry_base_ms")
    if config.survival.disk_trim_min_mb < 0:
        raise ConfigError(f"{origin}: $.survival.disk_trim_min_mb must be at least 0")
    validate_agents(config, origin)
    validate_spend(config, origin)
    validate_report(config, origin)
    validate_schedules(config, origin)
    validate_web(config.web, origin)
    validate_fleet(config.fleet, origin)
    validate_telemetry(config.telemetry, origin)
    if not 0 < config.gate.max_string_bytes <= config.gate.max_call_bytes:
        raise ConfigError(f"{origin}: $.gate: max_string_bytes must be greater than 0 and at most max_call_bytes")
    if config.gate.blocks_per_min < 1:
        raise ConfigError(f"{origin}: $.gate.blocks_per_min must be at least 1")
    if config.gate.calls_per_min < 1 or config.gate.call_burst < 1:
        raise ConfigError(f"{origin}: $.gate.calls_per_min and $.gate.call_burst must be at least 1 "
                          f"(got {config.gate.calls_per_min} and {config.gate.call_burst})")
    for limit in ("max_sessions", "max_sessions_per_uid", "max_sessions_per_pid"):
        if getattr(config.gate, limit) < 1:
            raise ConfigError(f"{origin}: $.gate.{limit} must be at least 1")
    if config.gate.hello_timeout_s <= 0:
        raise ConfigError(f"{origin}: $.gate.hello_timeout_s must be greater than 0")
    if config.pulse.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}", config.pulse.name):
        raise ConfigError(f"{origin}: $.pulse.name: 1 to 64 letters, digits and _ . @ - (not starting with a symbol)")
    if config.engine.address_space_mb < 0:
        raise ConfigError(f"{origin}: $.engine.address_space_mb must be 0 (unlimited) or more")
    if not -1000 <= config.engine.oom_score_adj <= 1000:
        raise ConfigError(f"{origin}: $.engine.oom_score_adj must lie within -1000 … 1000")
    return config


MAX_AGENT_TIMEOUT_S = 7 * 24 * 3600
WATCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")   # it names a vital: file:<name>


def validate_watched_files(files: list[FileWatch], origin: str) -> None:
    for i, watch in enumerate(files):
        where = f"{origin}: $.watch.file[{i}]"
        if not WATCH_NAME.fullmatch(watch.name):
            raise ConfigError(f"{where}.name: letters, digits and _ . : - (not starting with a symbol), got {watch.name!r}")
        if not os.path.isabs(watch.path):
            raise ConfigError(f"{where}.path must be an absolute glob, got {watch.path!r}")
        if ".." in Path(watch.path).parts:     # a glob climbing out of where it points is not what was configured
            raise ConfigError(f"{where}.path must not contain '..', got {watch.path!r}")
        if not watch.max_mb > 0:
            raise ConfigError(f"{where}.max_mb must be greater than 0, got {watch.max_mb}")
        if not 1 <= watch.keep <= MAX_KEEP:
            raise ConfigError(f"{where}.keep must lie within 1 … {MAX_KEEP}, got {watch.keep}")
    names = [w.name for w in files]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.watch.file: names must be unique")


MAX_FIELD_CHARS = 200                         # a [[watch.fresh]] field's dotted path


def validate_fresh_watches(config: "Config", origin: str) -> None:
    restartable = {p.name for p in config.process if p.restart}
    for i, watch in enumerate(config.watch.fresh):
        where = f"{origin}: $.watch.fresh[{i}]"
        if not WATCH_NAME.fullmatch(watch.name):
            raise ConfigError(f"{where}.name: letters, digits and _ . : - (not starting with a symbol), got {watch.name!r}")
        if (watch.path is None) == (watch.url is None):
            raise ConfigError(f"{where}: set exactly one of path or url")
        if watch.path is not None and (not os.path.isabs(watch.path) or ".." in Path(watch.path).parts):
            raise ConfigError(f"{where}.path must be an absolute path without '..', got {watch.path!r}")
        if watch.url is not None:
            host = urlsplit_host(watch.url)
            if host is None:
                raise ConfigError(f"{where}.url: not an http:// or https:// URL: {watch.url!r}")
            if not is_loopback(host):
                raise ConfigError(f"{where}.url: only a loopback address (127.0.0.1, ::1, localhost), got {host!r}")
        if watch.field is not None and (watch.url is None or not watch.field or len(watch.field) > MAX_FIELD_CHARS
                                        or "" in watch.field.split(".")):
            raise ConfigError(f"{where}.field: a dotted path into the url's JSON answer (like \"cron.runs\"), "
                              f"and only with url; got {watch.field!r}")
        if watch.recursive and watch.path is None:
            raise ConfigError(f"{where}.recursive: only with path")
        if not watch.within_s > 0:
            raise ConfigError(f"{where}.within_s must be greater than 0, got {watch.within_s}")
        if watch.restart is not None and watch.restart not in restartable:
            raise ConfigError(f"{where}.restart: no [[process]] named {watch.restart!r} with a restart argv")
    names = [w.name for w in config.watch.fresh]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.watch.fresh: names must be unique")


def urlsplit_host(url: str) -> str | None:
    """The host of an http(s) URL (brackets of an IPv6 host dropped), None when it is not one."""
    found = re.match(r"https?://(\[[^\]/\s]+\]|[^/:\s?#]+)(:\d+)?([/?#]\S*)?$", url)
    return found.group(1).strip("[]") if found else None


def validate_watched_dirs(dirs: list[DirWatch], origin: str) -> None:
    from pulse.core import schedule as schedulemod
    for i, watch in enumerate(dirs):
        where = f"{origin}: $.watch.dir[{i}]"
        if not WATCH_NAME.fullmatch(watch.name):
            raise ConfigError(f"{where}.name: letters, digits and _ . : - (not starting with a symbol), got {watch.name!r}")
        if not os.path.isabs(watch.path):
            raise ConfigError(f"{where}.path must be an absolute directory or glob, got {watch.path!r}")
        if ".." in Path(watch.path).parts:
            raise ConfigError(f"{where}.path must not contain '..', got {watch.path!r}")
        if Path(watch.path) == Path("/"):
            raise ConfigError(f"{where}.path: not / itself: name the directory that grows")
        if watch.max_mb is None and watch.max_files is None and watch.max_age is None:
            raise ConfigError(f"{where}: set at least one of max_mb, max_files, max_age")
        if watch.max_mb is not None and not watch.max_mb > 0:
            raise ConfigError(f"{where}.max_mb must be greater than 0, got {watch.max_mb}")
        if watch.max_files is not None and watch.max_files < 1:
            raise ConfigError(f"{where}.max_files must be at least 1, got {watch.max_files}")
        if watch.max_age is not None:
            try:
                schedulemod.parse_every(watch.max_age)
            except ValueError as err:
                raise ConfigError(f"{where}.max_age: {err}") from None
    names = [w.name for w in dirs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.watch.dir: names must be unique")


def max_age_s(watch: DirWatch) -> float | None:
    """A [[watch.dir]]'s max_age in seconds (validated: it parses)."""
    from pulse.core import schedule as schedulemod
    return None if watch.max_age is None else schedulemod.parse_every(watch.max_age)


def validate_config_files(proc: Process, where: str) -> None:
    """`[[process]] config`: absolute, distinct paths of a process Pulse can restart, and positive times."""
    for j, path in enumerate(proc.config):
        if not path or not os.path.isabs(path):
            raise ConfigError(f"{where}.config[{j}]: must be an absolute path, got {path!r}")
        if path.endswith("/"):
            raise ConfigError(f"{where}.config[{j}]: names a directory ({path!r}); list the files themselves")
    if len(set(map(os.path.normpath, proc.config))) != len(proc.config):
        raise ConfigError(f"{where}.config: a file is listed twice")
    if proc.config and not proc.restart:
        raise ConfigError(f"{where}.config: needs a restart argv: after restoring the known-good files, "
                          "Pulse restarts the process so that it reads them")
    for field in ("config_good_after_s", "config_rollback_window_s"):
        if not getattr(proc, field) > 0:
            raise ConfigError(f"{where}.{field} must be greater than 0, got {getattr(proc, field)}")


def validate_health(health: Health, where: str) -> None:
    if (health.url is None) == (health.argv is None):
        raise ConfigError(f"{where}: set exactly one of url or argv")
    if health.url is not None and not re.match(r"https?://[^/\s]+", health.url):
        raise ConfigError(f"{where}.url: not an http:// or https:// URL: {health.url!r}")
    if health.argv is not None and not health.argv:
        raise ConfigError(f"{where}.argv: an argv list needs at least the program")
    if not health.every_s > 0 or not health.timeout_s > 0:
        raise ConfigError(f"{where}: every_s and timeout_s must be greater than 0")
    if not 1 <= health.failures <= MAX_HEALTH_FAILURES:
        raise ConfigError(f"{where}.failures must lie within 1 … {MAX_HEALTH_FAILURES}, got {health.failures}")
    if health.start_period_s < 0:
        raise ConfigError(f"{where}.start_period_s must be at least 0")
    if health.max_latency_ms is not None and not 0 < health.max_latency_ms < health.timeout_s * 1000:
        raise ConfigError(f"{where}.max_latency_ms must be greater than 0 and below timeout_s ({health.timeout_s:g} s: "
                          f"a slower probe times out anyway), got {health.max_latency_ms:g}")


def validate_memory(proc: Process, where: str) -> None:
    memory = proc.memory
    if not memory.max_mb > 0:
        raise ConfigError(f"{where}.max_mb must be greater than 0, got {memory.max_mb}")
    if not 1 <= memory.for_samples <= MAX_HEALTH_FAILURES:
        raise ConfigError(f"{where}.for_samples must lie within 1 … {MAX_HEALTH_FAILURES}, got {memory.for_samples}")
    if memory.growth_mb_per_h < 0:
        raise ConfigError(f"{where}.growth_mb_per_h must be at least 0 (0: no growth notice)")
    if not memory.growth_window_s > 0:
        raise ConfigError(f"{where}.growth_window_s must be greater than 0, got {memory.growth_window_s:g}")
    if not proc.restart:
        raise ConfigError(f"{where}: a memory ceiling restarts the process: set its restart argv too")


def _agent_templates(agent: Agent):
    """(field, template, the placeholders it may use) of one [[agent]]."""
    yield from ((f"argv[{j}]", arg, argvtemplate.PLACEHOLDERS) for j, arg in enumerate(agent.argv or []))
    yield from ((f"env.{key}", value, argvtemplate.PLACEHOLDERS) for key, value in agent.env.items())
    if agent.cwd is not None:
        yield "cwd", agent.cwd, argvtemplate.CWD_PLACEHOLDERS


def adapter_entry_points() -> list:
    """The `pulse.adapters` entry points (the built-ins' too): read from metadata, nothing imported."""
    from importlib.metadata import entry_points
    return list(entry_points(group=ADAPTER_GROUP))


def adapter_names() -> set[str]:
    """The built-in adapters and the `pulse.adapters` entry points: names only, nothing imported."""
    return set(ADAPTER_ARGV) | {ep.name for ep in adapter_entry_points()}


def adapter_problem(agent: Agent) -> str | None:
    """What is wrong with an [[agent]]'s adapter and argv, said from config alone; an entry point's
    own default argv is its code's to know, so its check waits until it runs."""
    if agent.adapter in ADAPTER_ARGV:
        if agent.argv is None and ADAPTER_ARGV[agent.adapter] is None:
            return f"argv: adapter {agent.adapter!r} needs an argv"
        return None
    if agent.adapter not in (names := adapter_names()):
        return f"adapter: no adapter {agent.adapter!r} (known: {', '.join(sorted(names))})"
    return None


def validate_agents(config: Config, origin: str) -> None:
    if config.tasks.max_failures < 1:
        raise ConfigError(f"{origin}: $.tasks.max_failures must be at least 1")
    if not 0 <= config.tasks.retry_base_s <= config.tasks.retry_max_s:
        raise ConfigError(f"{origin}: $.tasks: retry_base_s must be at least 0 and at most retry_max_s")
    for key in ("agent_max_depth", "agent_tasks_per_hour"):
        if getattr(config.tasks, key) < 0:
            raise ConfigError(f"{origin}: $.tasks.{key} must be at least 0 (0: agents create no tasks)")
    if not config.agent:
        return
    for i, agent in enumerate(config.agent):
        where = f"{origin}: $.agent[{i}]"
        if not agent.name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]*", agent.name):
            raise ConfigError(f"{where}.name: letters, digits and _ . : - (not starting with a symbol)")
        for field_name, template, allowed in _agent_templates(agent):
            try:
                argvtemplate.placeholders(template, allowed)
            except ValueError as err:
                raise ConfigError(f"{where}.{field_name}: {err}") from None
        if agent.argv is not None and not agent.argv:
            raise ConfigError(f"{where}.argv: an argv list needs at least the program")
        if not 0 < agent.timeout_s <= MAX_AGENT_TIMEOUT_S:
            raise ConfigError(f"{where}.timeout_s must lie within 0 … {MAX_AGENT_TIMEOUT_S} (exclusive of 0)")
        if agent.stall_s is not None and not 0 < agent.stall_s < agent.timeout_s:
            raise ConfigError(f"{where}.stall_s must be greater than 0 and below its timeout_s ({agent.timeout_s})")
        if agent.concurrency < 1:
            raise ConfigError(f"{where}.concurrency must be at least 1")
        if agent.loop_per_min is not None and agent.loop_per_min < 1:
            raise ConfigError(f"{where}.loop_per_min must be at least 1 (unset: no loop guard), got {agent.loop_per_min}")
        problem = adapter_problem(agent)
        if problem:
            raise ConfigError(f"{where}.{problem}")
        routing_problem = agent_routing_problem(agent)
        if routing_problem:
            raise ConfigError(f"{where}.{routing_problem}")
        limits_problem = run_limits_problem(agent.limits)
        if limits_problem:
            raise ConfigError(f"{where}.limits.{limits_problem}")
    names = [a.name for a in config.agent]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.agent: names must be unique")


ROUTE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*")   # a project or a tag, as task add takes it


# The least a limit may be (0 turns it off): below these no agent CLI starts, and a typo of a unit
# (memory_mb = 4 for 4 GiB) would fail every run.
RUN_LIMIT_FLOORS = {"memory_mb": 16, "pids": 4, "cpu_percent": 1, "disk_mb": 1}


def run_limits_problem(limits: RunLimits) -> str | None:
    """What is wrong with an [[agent]]'s limits ("key: why"), or None."""
    for key, least in RUN_LIMIT_FLOORS.items():
        value = getattr(limits, key)
        if value != 0 and value < least:
            return f"{key}: {value} is below {least} (0: no limit)"
    return None


def agent_routing_problem(agent: Agent) -> str | None:
    """What is wrong with an [[agent]]'s projects or tags ("key: why"), or None."""
    if agent.projects is not None and not agent.projects:
        return "projects: an empty list takes no task at all; leave it unset for every project"
    for key, names in (("projects", agent.projects or []), ("tags", agent.tags)):
        for name in names:
            if not ROUTE_NAME.fullmatch(name):
                return f"{key}: {name!r} is not a name (letters, digits and _ . : / -, not starting with a symbol)"
    return None


def validate_spend(config: Config, origin: str) -> None:
    """Spend limits and max_run_usd: a limit is a positive number (0 would stop every run: give
    the agent up instead, or leave it unset for no limit)."""
    scopes = [("$.budget", config.budget, None)] + [(f"$.agent[{i}].budget", a.budget, a.max_run_usd)
                                                    for i, a in enumerate(config.agent)]
    for where, limits, max_run in scopes:
        for name in ("usd_per_day", "usd_per_month", "runs_per_hour"):
            value = getattr(limits, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{origin}: {where}.{name} must be greater than 0 (unset: no limit), got {value}")
        if max_run is not None and max_run < 0:
            raise ConfigError(f"{origin}: {where.removesuffix('.budget')}.max_run_usd must be at least 0, got {max_run}")

def listen_address(listen: str) -> tuple[str, int]:
    """"host:port" (an IPv6 host in brackets) → (host, port); ValueError saying what is wrong."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{listen!r} is not host:port (like 127.0.0.1:8370; port 0 takes a free one)")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost (by text: pulsed validates config and stays small, so no ipaddress)."""
    parts = host.split(".")
    ipv4 = len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)
    return host in ("localhost", "::1", "0:0:0:0:0:0:0:1") or (ipv4 and parts[0] == "127")


def validate_web(web: Web, origin: str) -> None:
    try:
        host, _ = listen_address(web.listen)
    except ValueError as err:
        raise ConfigError(f"{origin}: $.web.listen: {err}") from None
    if (web.tls_cert is None) != (web.tls_key is None):
        raise ConfigError(f"{origin}: $.web: set both tls_cert and tls_key, or neither")
    if not is_loopback(host):
        if not web.allow_remote:
            raise ConfigError(f"{origin}: $.web.listen: {host} is not a loopback address; set allow_remote = true "
                              "(and tls_cert, tls_key) to listen beyond this host")
        if web.tls_cert is None:
            raise ConfigError(f"{origin}: $.web: listening on {host} beyond this host needs tls_cert and tls_key")


EXPORT_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")     # an HTTP token (RFC 9110)


def validate_telemetry(telemetry: Telemetry, origin: str) -> None:
    try:
        listen_address(telemetry.listen)
    except ValueError as err:
        raise ConfigError(f"{origin}: $.telemetry.listen: {err}") from None
    for key in ("max_body_kb", "burst", "max_sources"):
        if getattr(telemetry, key) < 1:
            raise ConfigError(f"{origin}: $.telemetry.{key} must be at least 1, got {getattr(telemetry, key)}")
    if telemetry.requests_per_s <= 0 or telemetry.flush_s <= 0:
        raise ConfigError(f"{origin}: $.telemetry: requests_per_s and flush_s must be greater than 0")
    if telemetry.export is not None and not telemetry.enabled:
        raise ConfigError(f"{origin}: $.telemetry.export: set enabled = true too (the telemetry worker sends "
                          "the runs), or remove export")
    if telemetry.export is not None and not EXPORT_URL.fullmatch(telemetry.export):
        raise ConfigError(f"{origin}: $.telemetry.export: {telemetry.export!r} is not an http:// or https:// "
                          "collector address (like http://127.0.0.1:4318)")
    for name, value in telemetry.export_headers.items():
        if not HEADER_NAME.fullmatch(name) or "\r" in value or "\n" in value:
            raise ConfigError(f"{origin}: $.telemetry.export_headers: {name!r} is not a header name, or its "
                              "value has a line break")
    if telemetry.export_queue < 1 or telemetry.export_give_up_s <= 0:
        raise ConfigError(f"{origin}: $.telemetry: export_queue must be at least 1 and export_give_up_s above 0")
    if telemetry.queue_kb < 2 * telemetry.max_body_kb:
        raise ConfigError(f"{origin}: $.telemetry.queue_kb must hold at least two bodies of max_body_kb "
                          f"({telemetry.max_body_kb}; half of it is for callers without the token), got {telemetry.queue_kb}")


DAILY_AT = re.compile(r"^([01][0-9]|2[0-3]):[0-5][0-9]$")


def validate_report(config: Config, origin: str) -> None:
    r = config.report
    if r.daily_at is not None and not DAILY_AT.match(r.daily_at):
        raise ConfigError(f"{origin}: $.report.daily_at: {r.daily_at!r} is not a time like \"08:00\" (HH:MM, 24 h)")
    if r.analyst != "deterministic" and r.analyst not in {a.name for a in config.agent}:
        raise ConfigError(f"{origin}: $.report.analyst: {r.analyst!r} is neither \"deterministic\" nor an [[agent]] name")
    if r.analyst_timeout_s <= 0:
        raise ConfigError(f"{origin}: $.report.analyst_timeout_s must be greater than 0")
    if r.analyst_max_events < 1:
        raise ConfigError(f"{origin}: $.report.analyst_max_events must be at least 1")
    if r.dir is not None and not os.path.isabs(r.dir):
        raise ConfigError(f"{origin}: $.report.dir must be an absolute path")


SCHEDULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")   # it is an event's target


def validate_schedules(config: Config, origin: str) -> None:
    """Each [[schedule]]: one of cron or every, read by pulse.core.schedule (a bad cron expression
    is named, field by field); one of task or effect; a task for a configured agent only."""
    if not config.schedule:
        return      # without importing pulse.core.schedule: most commands load the config, few schedule
    from pulse.core import schedule as schedulemod
    agents = {a.name for a in config.agent}
    for i, s in enumerate(config.schedule):
        where = f"{origin}: $.schedule[{i}]"
        if not SCHEDULE_NAME.fullmatch(s.name):
            raise ConfigError(f"{where}.name: 1 to 64 letters, digits and _ . : - (not starting with a symbol), "
                              f"got {s.name!r}")
        where = f"{origin}: schedule {s.name!r} ($.schedule[{i}])"
        if (s.cron is None) == (s.every is None):
            raise ConfigError(f"{where}: set exactly one of cron or every")
        if s.cron is not None and (problem := schedulemod.cron_problem(s.cron)):
            raise ConfigError(f"{where}.cron: {problem}")
        if s.every is not None:
            try:
                schedulemod.parse_every(s.every)
            except ValueError as err:
                raise ConfigError(f"{where}.every: {err}") from None
        if (s.task is None) == (s.effect is None):
            raise ConfigError(f"{where}: set exactly one of task or effect")
        if s.task is not None:
            for key in ("project", "title", "prompt"):
                if not getattr(s.task, key).strip():
                    raise ConfigError(f"{where}.task.{key}: must not be empty")
            if s.task.agent is not None and s.task.agent not in agents:
                raise ConfigError(f"{where}.task.agent: no [[agent]] named {s.task.agent!r}")
        if s.effect is not None and not s.effect.kind.strip():
            raise ConfigError(f"{where}.effect.kind: must not be empty")
        for key in ("grace_s", "jitter_s"):
            if getattr(s, key) < 0:
                raise ConfigError(f"{where}.{key} must be at least 0, got {getattr(s, key)}")
        if s.every is not None and s.jitter_s >= schedulemod.parse_every(s.every):
            raise ConfigError(f"{where}.jitter_s must be shorter than every ({s.every})")
        if s.notify_after < 0:
            raise ConfigError(f"{where}.notify_after must be at least 0 (0: never)")
    names = [s.name for s in config.schedule]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.schedule: names must be unique")


def load(path: Path, environ: os._Environ | dict = os.environ) -> Config:
    """config.toml (missing = all defaults) plus PULSE_* overrides, validated."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        text = b""
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    config = decode(text, str(path))
    overrides = env_overrides(environ)
    if overrides:
        config = msgspec.structs.replace(config, timings=msgspec.structs.replace(config.timings, **overrides))
    origin = f"{path} (with PULSE_* overrides)" if overrides else str(path)
    return validate(config, origin)


def _without_none(value: object) -> object:
    """TOML has no null: an unset optional key is simply absent."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def to_toml(config: Config) -> str:
    """TOML text for `config` (tomli-w: imported here, so pulsed and the workers never load it)."""
    import tomli_w
    return tomli_w.dumps(_without_none(msgspec.to_builtins(config)))


def default_toml() -> str:
    """The config.toml a fresh home gets: every default, commented, so an operator sees what is in force."""
    lines = [
        "# Pulse configuration. Every key below shows its default; uncomment to change it.",
        "# `pulsectl check-config` validates this file; `pulsectl reload` applies it.",
        "# Each [timings] key can also be overridden with PULSE_<KEY> in pulsed's environment.",
        f"schema = {SCHEMA_VERSION}",
    ]
    for line in to_toml(Config()).splitlines():
        if line.startswith("schema"):
            continue
        # Table headers are commented too: a table the docs say to add (`[web]`, `[survival.llm]`)
        # pasted below must not declare it a second time, which TOML refuses.
        lines.append("# " + line if line else line)
        if line == "[pulse]":
            lines.append("# name = \"<the home's folder name>\"   # this instance among the host's Pulses")
        if line == "[telemetry]":
            lines.append('# export = "http://127.0.0.1:4318"   # a collector for Pulse\'s runs as OTLP traces; unset: none')
    lines += [
        "",
        "# A critical process, watched and restarted (repeat the table for more):",
        "# [[process]]",
        '# name = "gateway"',
        '# preset = "openclaw-gateway"            # the tested settings of openclaw-gateway, hermes-gateway or',
        "#                                        # litellm, under this table's own keys (`pulsectl guard --detect`)",
        '# pidfile = "/run/gateway.pid"          # or { path = "...", key = "pid" } for a JSON file,',
        '#                                        # or: match = "regex over the full command line"',
        '# restart = ["openclaw", "gateway", "run"]   # argv that starts it, never a shell string',
        '# cwd = "/srv/gateway"                   # where it starts; unset: the home (this file\'s folder);',
        '#                                        # relative: to the home',
        "# env = {}                               # added to Pulse's environment",
        '# user = "openclaw"                      # the account it runs as (and is started as); unset: Pulse\'s own',
        '# stop = ["systemctl", "stop", "gateway"]   # unset: SIGTERM to its process tree ...',
        "# stop_timeout_s = 10.0                   # ... then SIGKILL: a restart never leaves two copies",
        "# start_grace_s = 1.0                     # exits within this of its start: the restart failed",
        '# health = { url = "http://127.0.0.1:18789/readyz", every_s = 10, timeout_s = 3, failures = 3, start_period_s = 15 }',
        "#                                        # max_latency_ms = 1000: a slower answer is a failed probe",
        "# restart_exit_codes = [75]              # it exits 75 to ask for a restart: not a crash",
        "# stop_exit_codes = [78]                 # it exits 78 to say: do not restart me (bad config)",
        '# config = ["/etc/openclaw/openclaw.json"]   # kept known good; restored if an edit breaks it',
        "# config_good_after_s = 60.0              # healthy this long after a start: its config is known good",
        "# config_rollback_window_s = 600.0        # crash-looping or unhealthy this soon after an edit: restore",
        "# min_uptime_s = 10.0                     # died sooner after a start: that start failed (a crash loop) ...",
        "# restart_backoff = { base_s = 1.0, max_s = 300.0 }   # ... the next waits base_s, doubling (unset: [survival]",
        "#                                        # process_backoff_base_s / _max_s); unhealthy restarts back off too",
        "# max_restarts = 5                        # this many failed starts within restart_window_s: held `fatal`,",
        "# restart_window_s = 300.0                # notified once with its last output, until an operator starts it",
        '# on_crash_loop = ["/usr/local/bin/clear-stuck-session"]   # held fatal: run once (as user, in cwd),',
        "#                                        # then one more start; failing too, held until an operator starts it",
        "# keep_on_remove = false                 # taken out of this file: a reload stops it; true: left running",
        "# memory = { max_mb = 4096, for_samples = 3, growth_mb_per_h = 500, growth_window_s = 600 }",
        "#                                        # its tree's RSS: restarted after 3 samples above max_mb,",
        "#                                        # notified when it grows faster than growth_mb_per_h",
        "",
        "# Files that must not fill the disk (fileGuard; repeat the table for more):",
        "# [[watch.file]]",
        '# name = "traces"',
        '# path = "/home/agent/.openclaw/logs/*.jsonl"   # an absolute glob',
        "# max_mb = 1024.0                        # a matching file over this is acted on",
        '# action = "rotate"                      # rotate (copytruncate) | truncate | notify',
        "# keep = 3                               # rotate keeps <file>.1.gz … <file>.3.gz",
        "",
        "# Proof that work happens: something that must change (repeat the table for more):",
        "# [[watch.fresh]]",
        '# name = "heartbeat"',
        '# path = "/home/agent/.openclaw/heartbeat"   # a file (its mtime) or a directory (its newest mtime)',
        "# recursive = false                      # a directory: count its subdirectories' entries too",
        '# # or: url = "http://127.0.0.1:18789/status", field = "cron.runs"   # its answer (or that JSON field)',
        "# within_s = 3600.0                      # no change for this long: stale, notified once",
        '# restart = "gateway"                    # ... and this [[process]] restarted; unset: only notified',
        "# Directories that only grow (dirGuard; repeat the table for more; set at least one bound):",
        "# [[watch.dir]]",
        '# name = "cron-output"',
        '# path = "/home/agent/.hermes/cron/output/*"   # an absolute directory or glob of directories',
        "# max_mb = 512.0                         # each directory's files together, however deep",
        "# max_files = 1000",
        '# max_age = "14d"                        # 30m, 12h, 7d, 1h30m',
        '# oldest = "delete"                      # delete | archive (into the home\'s objects/)',
        "",
        "# An agent that takes tasks (the agent-run effect; repeat the table for more):",
        "# [[agent]]",
        '# name = "claude"',
        '# adapter = "claude-code"                # or command, cursor, codex, hermes, openclaw, an entry point',
        '# argv = ["claude", "-p", "--output-format", "json", "--", "{prompt}"]   # {prompt} {task_id} {workdir} ...',
        '# cwd = "/srv/work/{task_id}"             # unset: <home>/work/<task_id>',
        "# env = {}",
        "# timeout_s = 1800.0",
        "# stall_s = 300.0                         # silent this long (no output, no telemetry): ended, stalled",
        "# loop_per_min = 120                      # more API requests or tool calls a minute: ended, loop",
        "# concurrency = 1",
        "# mcp = true                              # give it Pulse's gated tools (claude-code, codex)",
        "# gate_requires_finish = true             # a run that used the gate is acked only after finish",
        '# projects = ["infra"]                    # only these projects\' tasks; unset: every project',
        '# tags = ["gpu"]                          # tasks added with --tag need all theirs here; unset: untagged only',
        '# task_projects = ["infra"]               # where its create_task may add tasks; unset: its projects',
        "# limits = { memory_mb = 4096, pids = 512, cpu_percent = 100, disk_mb = 2048 }   # one run; 0: none",
        "",
        "# Recurring work, run by the tick (repeat the table for more):",
        "# [[schedule]]",
        '# name = "nightly-deps"',
        '# cron = "0 3 * * *"                      # host local time; or every = "15m"',
        '# task = { project = "infra", title = "Update dependencies", prompt = "...", agent = "claude" }',
        '#                                        # or effect = { kind = "exec", target = "...", params = {...} }',
        "# catch_up = true                         # after downtime, the latest missed slot runs once at start",
        "# grace_s = 60.0                          # catch_up = false: a slot later than this is skipped",
        "# jitter_s = 0.0                          # each slot runs up to this much after its time",
        "# notify_after = 2                        # runs failed in a row before a notification; 0: never",
        "# overlap = false                         # true: a slot runs even while the last run is still open",
    ]
    return "\n".join(lines) + "\n"
