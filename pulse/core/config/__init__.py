"""config.toml: the whole file (`Config`), reading it (`load`: the file, its presets and PULSE_*
overrides, decoded against every key's bounds, then the checks across keys), and writing it.

Every key is written once, as a field of its table's Struct with its descriptor (`keys`: type,
default, bounds, help); the tables are grouped one module each: `supervision` ([pulse], [timings],
[log], [engine], [tick]), `processes` ([[process]]), `watches` ([watch]), `safety` ([survival],
[store], [allow], [[notify]]), `agentwork` ([[agent]], [tasks], [budget], [gate]), `schedules`
([[schedule]], [report]), `services` ([web], [telemetry], [fleet]). `slices` cuts what each process
reads (its child spec names its slice), `explain` says what a decode error means, and `reference`
writes the commented sample of a fresh home and docs/config.md from the descriptors. A new key is a
field in its table's module; its bounds are checked, and it appears in the sample, the reference and
`pulsectl config --effective`, with nothing else to edit.

`load()` raises ConfigError with the key path (`$.timings.heartbeat_ms`) and what is wrong; pulsed
turns that into exit 78.
"""

# No `from __future__ import annotations` in this package: msgspec would evaluate each of the schema's
# annotation strings at the first load, a fifth of the load's time in every pulsectl command that reads it.

import datetime
import os
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from pulse.core.config.agentwork import (
    ADAPTER_ARGV,
    ADAPTER_GROUP,
    ROUTE_NAME,
    Agent,
    Gate,
    RunLimits,
    SpendLimits,
    Tasks,
    adapter_entry_points,
    adapter_names,
    validate_agents,
    validate_gate,
)
from pulse.core.config.keys import ConfigError, Table, unwrapped
from pulse.core.config.processes import (
    MAX_MEMORY_WINDOW_SAMPLES,
    Backoff,
    Health,
    Memory,
    PidFile,
    Process,
    removed_definition,
    validate_processes,
)
from pulse.core.config.safety import Allow, Llm, Notify, Store, Survival, validate_llm, validate_notify, validate_store
from pulse.core.config.schedules import Report, Schedule, ScheduleEffect, ScheduleTask, validate_report, validate_schedules
from pulse.core.config.services import (
    Fleet,
    Telemetry,
    Web,
    is_loopback,
    listen_address,
    validate_fleet,
    validate_telemetry,
    validate_web,
    without_secrets,
)
from pulse.core.config.supervision import (
    EngineLimits,
    LogSettings,
    PulseSettings,
    TickSettings,
    Timings,
    validate_instance_name,
    validate_timings,
)
from pulse.core.config.watches import (
    MAX_KEEP,
    DirWatch,
    ErrorLogWatch,
    FileWatch,
    FreshWatch,
    NetworkTarget,
    Watch,
    max_age_s,
    validate_watch,
)

SCHEMA_VERSION = 1

# The workers' slices (pulse.core.config.slices) are imported at the first of their names asked of this
# package: pulsed and its workers cut and read them, while a pulsectl command that reads a table or two
# (task add, budget) would make their ~20 Structs for nothing (~3 ms of CPU).
SLICE_NAMES = frozenset({"EVERY_WORKER", "SLICES", "EngineConfig", "ExecutorConfig", "SupervisorConfig",
                         "SupervisorTimings", "TickConfig", "WatcherConfig", "changed_slices", "decode_slice",
                         "encode_slice", "slice_of"})


def __getattr__(name: str):
    if name in SLICE_NAMES:
        from pulse.core.config import slices  # the per-worker slice types, built only for a process that reads one
        return getattr(slices, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# What callers name as pulse.core.config.X: the whole file's Struct and functions below, and these of its modules.
__all__ = [
    "ADAPTER_ARGV", "ADAPTER_GROUP", "EVERY_WORKER", "MAX_KEEP", "MAX_MEMORY_WINDOW_SAMPLES", "ROUTE_NAME", "SLICES",
    "Agent", "Allow", "Backoff", "Config", "ConfigError", "DirWatch", "EngineConfig", "EngineLimits", "ErrorLogWatch",
    "ExecutorConfig", "FileWatch", "Fleet", "FreshWatch", "Gate", "Health", "Llm", "LogSettings", "Memory",
    "NetworkTarget", "Notify", "PidFile", "Process", "PulseSettings", "Report", "RunLimits", "Schedule",
    "ScheduleEffect", "ScheduleTask", "SpendLimits", "Store", "SupervisorConfig", "SupervisorTimings", "Survival",
    "Table", "Tasks", "Telemetry", "TickConfig", "TickSettings", "Timings", "Watch", "WatcherConfig", "Web",
    "adapter_entry_points", "adapter_names", "changed_slices", "changed_tables", "decode", "decode_slice",
    "default_toml", "encode_slice", "env_overrides", "is_loopback", "listen_address", "load", "max_age_s",
    "removed_definition", "slice_of", "to_toml", "validate", "with_presets", "without_secrets",
]


class Config(Table):
    """The top level of config.toml."""
    schema: Annotated[int, Meta(ge=1)] = SCHEMA_VERSION
    """The file's schema version; a newer one than this Pulse reads is refused."""
    pulse: PulseSettings = msgspec.field(default_factory=PulseSettings)
    observe_only: bool = False
    """Record what the rules would do as effect-expired events, and run nothing."""
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


def validate(config: Config, origin: str) -> Config:
    """The checks across keys that a key's own bounds cannot express (those were checked as the file was decoded)."""
    validate_timings(config.timings, origin)
    validate_instance_name(config.pulse, origin)
    validate_store(config.store, origin)
    validate_processes(config.process, origin)
    validate_notify(config.notify, origin)
    validate_llm(config, origin)
    validate_watch(config, origin)
    validate_agents(config, origin)
    validate_report(config, origin)
    validate_schedules(config, origin)
    validate_web(config.web, origin)
    validate_fleet(config.fleet, origin)
    validate_telemetry(config.telemetry, origin)
    validate_gate(config.gate, origin)
    return config


TOML_TYPES = (datetime.datetime, datetime.date, datetime.time)   # what msgspec.toml.decode keeps as they are


def decode(text: str | bytes, origin: str, overrides: dict[str, object] | None = None) -> Config:
    """Decode config.toml text, with `overrides` of [timings] keys (env_overrides) on top; errors
    name `origin` and the key path, and a value out of its key's bounds the value."""
    try:
        raw = msgspec.toml.decode(text)
    except msgspec.DecodeError as err:
        raise ConfigError(f"{origin}: not valid TOML: {err}") from None
    raw = with_presets(raw, origin)
    if overrides and isinstance(raw.get("timings", {}), dict):
        raw = {**raw, "timings": {**raw.get("timings", {}), **overrides}}
    try:
        config = msgspec.convert(raw, Config, builtin_types=TOML_TYPES, str_keys=True)
    except msgspec.ValidationError as err:
        from pulse.core.config import explain  # only a bad file needs it: ~0.5 ms of every good load spared
        source = text.decode(errors="replace") if isinstance(text, bytes) else text
        raise ConfigError(f"{origin}: {explain.explain(err, Config, raw, source)}") from None
    if config.schema > SCHEMA_VERSION:
        raise ConfigError(f"{origin}: $.schema is {config.schema}; this Pulse reads up to {SCHEMA_VERSION}")
    return config


def with_presets(raw: object, origin: str) -> object:
    """The decoded file with each [[process]]'s preset merged under the table's own keys."""
    tables = raw.get("process") if isinstance(raw, dict) else None
    if not isinstance(tables, list) or not any(isinstance(t, dict) and "preset" in t for t in tables):
        return raw
    from pulse.core import presets  # only a [[process]] with a preset
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


def env_overrides(environ: os._Environ | dict) -> dict[str, object]:
    """PULSE_<TIMING_KEY>=value → {key: value}, typed like the default."""
    out: dict[str, object] = {}
    for field in msgspec.structs.fields(Timings):
        name = "PULSE_" + field.name.upper()
        if name not in environ:
            continue
        raw = environ[name]
        try:
            out[field.name] = float(raw) if unwrapped(field.type) is float else int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: expected a number for $.timings.{field.name}") from None
    return out


def load(path: Path, environ: os._Environ | dict = os.environ) -> Config:
    """config.toml (missing = all defaults) plus PULSE_* overrides, validated."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        text = b""
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    config = decode(text, str(path))     # the file alone: a bad value in it is refused even where an override would hide it
    overrides = env_overrides(environ)
    if not overrides:
        return validate(config, str(path))
    origin = f"{path} (with PULSE_* overrides)"
    return validate(decode(text, origin, overrides), origin)


def changed_tables(old: Config, new: Config) -> list[str]:
    """The top-level keys of config.toml whose values differ."""
    return [f.name for f in msgspec.structs.fields(Config) if getattr(old, f.name) != getattr(new, f.name)]


def _without_none(value: object) -> object:
    """TOML has no null: an unset optional key is simply absent."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def to_toml(config: Config) -> str:
    """TOML text for `config` (tomli-w: imported here, so pulsed and the workers never load it)."""
    import tomli_w  # pulsed and the workers never write TOML
    return tomli_w.dumps(_without_none(msgspec.to_builtins(config)))


def default_toml() -> str:
    """The config.toml a fresh home gets: every key at its default, commented, with its help."""
    from pulse.core.config import reference  # only a new home's writer needs it, never pulsed or a worker
    return reference.sample(Config, SCHEMA_VERSION)
