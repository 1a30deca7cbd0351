"""What each process reads of config.toml: one slice per worker, named by its child spec
(pulse.core.childspecs), and pulsed's own.

Each worker declares the config it reads as one Struct of Config's own types (a table whole, or a
cut of one). pulsed sends a worker its slice and nothing else, so the worker cannot read what its
slice does not hold, and a reload restarts exactly the workers whose slice changed.
"""

from typing import TYPE_CHECKING

import msgspec

from pulse.core.childspecs import CHILD_SPECS, RETRIED
from pulse.core.config.agentwork import Agent, Gate, SpendLimits, Tasks
from pulse.core.config.keys import unwrapped
from pulse.core.config.processes import Process
from pulse.core.config.safety import Allow, Notify, Store, Survival
from pulse.core.config.schedules import Report, Schedule
from pulse.core.config.services import Fleet, Telemetry, Web
from pulse.core.config.supervision import EngineLimits, LogSettings, PulseSettings, TickSettings, Timings
from pulse.core.config.watches import Watch

if TYPE_CHECKING:
    from pulse.core.config import Config


def _cut(name: str, table: type[msgspec.Struct], keys: tuple[str, ...]) -> type[msgspec.Struct]:
    """A Struct holding `keys` of `table`, typed as there but for their bounds: a slice is cut from a
    config already checked, and pulsed sends it to a worker that trusts it."""
    types = {f.name: unwrapped(f.type) for f in msgspec.structs.fields(table)}
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
TelemetryOn = _cut("TelemetryOn", Telemetry, ("enabled",))


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
    telemetry: TelemetryOn        # an agent run waits for the receiver to be up when it is enabled


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
    budget: SpendLimits           # the host's: what sessions Pulse did not start spend counts against it


# Each worker's slice, the Struct above its child spec names, in start order.
SLICES: dict[str, type[msgspec.Struct]] = {name: globals()[spec.config] for name, spec in CHILD_SPECS.items()}


def slice_of(config: "Config", worker: str) -> msgspec.Struct:
    """The part of `config` that `worker` reads (`supervisor` for pulsed's own)."""
    kind = SupervisorConfig if worker == "supervisor" else SLICES[worker]
    return msgspec.convert(msgspec.to_builtins(config), kind)


def encode_slice(config: "Config", worker: str) -> bytes:
    return msgspec.msgpack.encode(slice_of(config, worker))


def decode_slice(worker: str, data: bytes) -> msgspec.Struct:
    return msgspec.msgpack.decode(data, type=SLICES[worker])


def changed_slices(old: "Config", new: "Config") -> list[str]:
    """The workers a reload from `old` to `new` must restart."""
    return [name for name in SLICES if slice_of(old, name) != slice_of(new, name)]
