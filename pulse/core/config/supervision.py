"""[pulse], [timings], [log], [engine], [tick]: how pulsed and its workers run."""

import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from pulse.core.childspecs import RETRIED
from pulse.core.config.keys import ConfigError, Table


class PulseSettings(Table):
    """This Pulse among the host's others; read when pulsed starts."""
    name: Annotated[str | None, Meta(
        description="This instance's name among the host's Pulses (`pulsectl instances`, `pulsectl -i NAME`); "
                    "unset: the home's folder name.", examples=["<the home's folder name>"])] = None


Ms = Annotated[int, Meta(gt=0)]               # every timing is a positive duration or count
Seconds = Annotated[float, Meta(gt=0)]


class _RestartTimings(Table):
    restart_backoff_base_ms: Annotated[Ms, Meta(
        description="The second restart of a worker's crash streak waits this long, in ms.")] = 100
    restart_backoff_max_ms: Annotated[Ms, Meta(
        description="... each later one twice as long, up to this, in ms.")] = 30_000
    healthy_reset_s: Annotated[Seconds, Meta(description="A worker running this long forgets its crash streak, in s.")] = 30
    intensity_restarts: Annotated[Ms, Meta(
        description="More automatic restarts of a worker than this within intensity_period_s: a core worker "
                    "escalates (pulsed exits), any other is `failed`.")] = 5
    intensity_period_s: Annotated[Seconds, Meta(description="The window of intensity_restarts, in s.")] = 60


# <worker>_retry_after_failed_s: a failed worker that is not core is retried this long after failing,
# one key per such worker, its default in its child spec (pulse.core.childspecs), in spec order.
_RetryTimings = msgspec.defstruct(
    "_RetryTimings",
    [(s.retry_key, Annotated[Seconds, Meta(description=f"A `failed` {s.name} worker is started again by itself "
                                                       "this long after it failed, in s.")], s.retry_after_failed_s)
     for s in RETRIED],
    bases=(_RestartTimings,), kw_only=True, module=__name__)


class Timings(_RetryTimings):
    """The supervisor's and the workers' timings; each can be overridden by PULSE_<KEY> in pulsed's
    environment (tests run fast that way)."""
    heartbeat_ms: Annotated[Ms, Meta(description="Each worker heartbeats this often from its main loop, in ms.")] = 1_000
    hung_after_ms: Annotated[Ms, Meta(
        description="A worker silent this long is hung (SIGABRT, SIGCONT, SIGKILL), in ms; above heartbeat_ms, "
                    "sqlite_busy_timeout_ms and engine_rpc_deadline_ms.")] = 10_000
    ready_timeout_ms: Annotated[Ms, Meta(description="A worker not ready this long after its spawn is hung, in ms.")] = 10_000
    stop_grace_ms: Annotated[Ms, Meta(description="A stop sends SIGTERM, then SIGKILL after this, in ms.")] = 5_000
    tick_ms: Annotated[Ms, Meta(
        description="The tick's period unless a rule asks for another, in ms; within tick_ms_min … tick_ms_max.")] = 5_000
    tick_ms_min: Annotated[Ms, Meta(description="The shortest tick period a rule may ask for, in ms.")] = 50
    tick_ms_max: Annotated[Ms, Meta(description="The longest tick period a rule may ask for, in ms.")] = 60_000
    engine_rpc_deadline_ms: Annotated[Ms, Meta(description="The tick waits this long for the engine's answer, in ms.")] = 250
    sqlite_busy_timeout_ms: Annotated[Ms, Meta(
        description="A write waits this long for another process's lock, in ms; below hung_after_ms.")] = 5_000
    engine_urgent_deadline_ms: Annotated[Ms, Meta(
        description="The engine's deadline in a tick woken by a critical process's death, in ms; at most "
                    "engine_rpc_deadline_ms.")] = 50
    effect_deadline_s: Annotated[Seconds, Meta(description="An effect older than this expires unrun, in s.")] = 60
    effect_timeout_s: Annotated[Seconds, Meta(description="One effect may run this long, in s.")] = 30
    executor_concurrency: Annotated[Ms, Meta(description="Effects the executor runs at once.")] = 8
    executor_scan_interval_ms: Annotated[Ms, Meta(
        description="The executor scans its queue this often when no doorbell rang, in ms.")] = 1_000
    effect_retry_base_ms: Annotated[Ms, Meta(
        description="A failure its kind puts back in the queue (a notification no channel took yet) is tried "
                    "again after this, doubling per failed attempt, in ms.")] = 5_000
    effect_retry_max_ms: Annotated[Ms, Meta(
        description="... up to this, in ms; at least effect_retry_base_ms.")] = 300_000
    watcher_interval_ms: Annotated[Ms, Meta(description="The watcher samples its sensors this often, in ms.")] = 5_000
    wake_window_s: Annotated[Seconds, Meta(description="How far back a rule's should_wake() sees, in s.")] = 60
    ballast_check_s: Annotated[Seconds, Meta(
        description="Once the disk has room again, the tick makes the ballast file again within this, in s.")] = 60


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
    level: Annotated[Literal["debug", "info", "warning", "error"], Meta(
        description="The least severe record written.")] = "info"
    max_bytes: Annotated[int, Meta(gt=0, description="pulse.log rotates at this size, in bytes.")] = 10 * 1024 * 1024
    backups: Annotated[int, Meta(ge=0, description="Rotated files kept beside pulse.log.")] = 5


class EngineLimits(Table):
    """The engine process, which runs the agent's rules: a memory blow-up must kill it, not the survival layer."""
    address_space_mb: Annotated[int, Meta(
        ge=0, description="RLIMIT_AS of the engine process, in MiB; 0: unlimited.")] = 4096
    oom_score_adj: Annotated[int, Meta(
        ge=-1000, le=1000, description="The engine's OOM score adjustment: 800 has the OOM killer pick it first.")] = 800
    typecheck: Annotated[list[str] | None, Meta(
        description="An argv the promote gate runs in the candidate tree; it must exit 0; unset: none.",
        examples=[["mypy", "."]])] = None


class TickSettings(Table):
    """What the tick puts in each snapshot, and the budget of the engine's effects (pulse.rules.budget)."""
    sense: Annotated[list[str], Meta(
        description="Vital keys the snapshot carries: exact keys, or prefixes ending in \"*\"; \"pending-tasks\" "
                    "adds the pending tasks and the agents' stats (for the assignment rule).")] = msgspec.field(
        default_factory=lambda: ["system-resource", "process-alive:*", "process-memory:*", "health:*", "config:*",
                                 "network:*", "error-log:*", "file:*", "fresh:*", "dir:*", "engine:*", "pending-tasks"])
    engine_dedupe_s: Annotated[float, Meta(
        ge=0, description="Identical engine effects within this are committed once, in s.")] = 60
    engine_effects_per_min: Annotated[int, Meta(
        ge=0, description="At most this many engine effects a minute are committed; the rest are dropped.")] = 120
    outcome_wake_min_ms: Annotated[int, Meta(
        ge=0, description="A tick woken by an engine effect's outcome comes at least this long after the last, "
                          "in ms.")] = 1_000
