"""config.toml as a whole: its top level (`Config`), reading it (`load`: the file, its presets and
PULSE_* overrides, decoded against every key's bounds, then the checks across keys), and writing it.

`load()` raises ConfigError with the key path (`$.timings.heartbeat_ms`) and what is wrong; pulsed
turns that into exit 78.
"""

# No `from __future__ import annotations` in this package's modules: msgspec would evaluate each of the schema's
# annotation strings at the first load, a fifth of the load's time in every pulsectl command that reads it.

import datetime
import os
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from pulse.core.config.agentwork import Agent, Gate, SpendLimits, Tasks, validate_agents, validate_gate
from pulse.core.config.keys import ConfigError, Table, decode_toml, unwrapped
from pulse.core.config.processes import Process, validate_processes
from pulse.core.config.safety import Allow, Notify, Store, Survival, validate_llm, validate_notify, validate_store
from pulse.core.config.schedules import Report, Schedule, validate_report, validate_schedules
from pulse.core.config.services import Fleet, Telemetry, Web, validate_fleet, validate_telemetry, validate_web
from pulse.core.config.supervision import (
    EngineLimits,
    LogSettings,
    PulseSettings,
    TickSettings,
    Timings,
    validate_instance_name,
    validate_timings,
)
from pulse.core.config.watches import Watch, validate_watch

SCHEMA_VERSION = 1


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
        raw = decode_toml(text)
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
