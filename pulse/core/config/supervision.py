"""[pulse], [timings], [log], [engine], [tick]: how pulsed and its workers run."""

import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from pulse.core.childspecs import RETRIED
from pulse.core.config.keys import ConfigError, Table


class PulseSettings(Table):
    """This Pulse among the host's others; read when pulsed starts."""
    name: str | None = None
    """This instance's name among the host's Pulses (`pulsectl instances`, `pulsectl -i NAME`); unset: the home's folder
    name. Example: `"<the home's folder name>"`"""


# Every timing is a positive duration or count.
PositiveInt = Annotated[int, Meta(gt=0)]
PositiveFloat = Annotated[float, Meta(gt=0)]


class _RestartTimings(Table):
    restart_backoff_base_ms: PositiveInt = 100
    """The second restart of a worker's crash streak waits this long, in ms."""
    restart_backoff_max_ms: PositiveInt = 30_000
    """... each later one twice as long, up to this, in ms."""
    healthy_reset_s: PositiveFloat = 30
    """A worker running this long forgets its crash streak, in s."""
    intensity_restarts: PositiveInt = 5
    """More automatic restarts of a worker than this within intensity_period_s: a core worker escalates (pulsed exits),
    any other is `failed`."""
    intensity_period_s: PositiveFloat = 60
    """The window of intensity_restarts, in s."""


# <worker>_retry_after_failed_s: a failed worker that is not core is retried this long after failing,
# one key per such worker, its default in its child spec (pulse.core.childspecs), in spec order.
_RetryTimings = msgspec.defstruct(
    "_RetryTimings",
    [(s.retry_key, Annotated[PositiveFloat, Meta(description=f"A `failed` {s.name} worker is started again by "
                                                            "itself this long after it failed, in s.")],
      s.retry_after_failed_s) for s in RETRIED],
    bases=(_RestartTimings,), kw_only=True, module=__name__)


class Timings(_RetryTimings):
    """The supervisor's and the workers' timings; each can be overridden by PULSE_<KEY> in pulsed's
    environment (tests run fast that way)."""
    heartbeat_ms: PositiveInt = 1_000
    """Each worker heartbeats this often from its main loop, in ms."""
    hung_after_ms: PositiveInt = 10_000
    """A worker silent this long is hung (SIGABRT, SIGCONT, SIGKILL), in ms; above heartbeat_ms, sqlite_busy_timeout_ms
    and engine_rpc_deadline_ms."""
    ready_timeout_ms: PositiveInt = 10_000
    """A worker not ready this long after its spawn is hung, in ms."""
    stop_grace_ms: PositiveInt = 5_000
    """A stop sends SIGTERM, then SIGKILL after this, in ms."""
    tick_ms: PositiveInt = 5_000
    """The tick's period unless a rule asks for another, in ms; within tick_ms_min … tick_ms_max."""
    tick_ms_min: PositiveInt = 50
    """The shortest tick period a rule may ask for, in ms."""
    tick_ms_max: PositiveInt = 60_000
    """The longest tick period a rule may ask for, in ms."""
    engine_rpc_deadline_ms: PositiveInt = 250
    """The tick waits this long for the engine's answer, in ms."""
    sqlite_busy_timeout_ms: PositiveInt = 5_000
    """A write waits this long for another process's lock, in ms; below hung_after_ms."""
    engine_urgent_deadline_ms: PositiveInt = 50
    """The engine's deadline in a tick woken by a critical process's death, in ms; at most engine_rpc_deadline_ms."""
    effect_deadline_s: PositiveFloat = 60
    """An effect older than this expires unrun, in s."""
    effect_timeout_s: PositiveFloat = 30
    """One effect may run this long, in s."""
    executor_concurrency: PositiveInt = 8
    """Effects the executor runs at once."""
    executor_scan_interval_ms: PositiveInt = 1_000
    """The executor scans its queue this often when no doorbell rang, in ms."""
    effect_retry_base_ms: PositiveInt = 5_000
    """A failure its kind puts back in the queue (a notification no channel took yet) is tried again after this, doubling
    per failed attempt, in ms."""
    effect_retry_max_ms: PositiveInt = 300_000
    """... up to this, in ms; at least effect_retry_base_ms."""
    watcher_interval_ms: PositiveInt = 5_000
    """The watcher samples its sensors this often, in ms."""
    wake_window_s: PositiveFloat = 60
    """How far back a rule's should_wake() sees, in s."""
    ballast_check_s: PositiveFloat = 60
    """Once the disk has room again, the tick makes the ballast file again within this, in s."""


def validate_timings(t: Timings, origin: str) -> None:
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
    if t.effect_retry_max_ms < t.effect_retry_base_ms:
        raise ConfigError(f"{origin}: $.timings.effect_retry_max_ms must be at least effect_retry_base_ms")


def validate_instance_name(pulse: PulseSettings, origin: str) -> None:
    if pulse.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}", pulse.name):
        raise ConfigError(f"{origin}: $.pulse.name: 1 to 64 letters, digits and _ . @ - (not starting with a symbol)")


class LogSettings(Table):
    """pulse.log, which pulsed and every worker write."""
    level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe record written."""
    max_bytes: Annotated[int, Meta(gt=0)] = 10 * 1024 * 1024
    """pulse.log rotates at this size, in bytes."""
    backups: Annotated[int, Meta(ge=0)] = 5
    """Rotated files kept beside pulse.log."""


class EngineLimits(Table):
    """The engine process, which runs the agent's rules: a memory blow-up must kill it, not the survival layer."""
    address_space_mb: Annotated[int, Meta(ge=0)] = 4096
    """RLIMIT_AS of the engine process, in MiB; 0: unlimited."""
    oom_score_adj: Annotated[int, Meta(ge=-1000, le=1000)] = 800
    """The engine's OOM score adjustment: 800 has the OOM killer pick it first."""
    typecheck: list[str] | None = None
    """An argv the promote gate runs in the candidate tree; it must exit 0; unset: none. Example: `["mypy", "."]`"""


class TickSettings(Table):
    """What the tick puts in each snapshot, and the budget of the engine's effects (pulse.rules.budget)."""
    sense: list[str] = msgspec.field(
        default_factory=lambda: ["system-resource", "process-alive:*", "process-memory:*", "health:*", "config:*",
                                 "network:*", "error-log:*", "file:*", "fresh:*", "dir:*", "engine:*", "pending-tasks"])
    """Vital keys the snapshot carries: exact keys, or prefixes ending in "*"; "pending-tasks" adds the pending tasks and
    the agents' stats (for the assignment rule)."""
    engine_dedupe_s: Annotated[float, Meta(ge=0)] = 60
    """Identical engine effects within this are committed once, in s."""
    engine_effects_per_min: Annotated[int, Meta(ge=0)] = 120
    """At most this many engine effects a minute are committed; the rest are dropped."""
    outcome_wake_min_ms: Annotated[int, Meta(ge=0)] = 1_000
    """A tick woken by an engine effect's outcome comes at least this long after the last, in ms."""
