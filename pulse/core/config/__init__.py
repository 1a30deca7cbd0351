"""config.toml: every key, reading the file, and writing it.

Every key is written once, as a field of its table's Struct with its descriptor (`keys`: type,
default, bounds, help); the tables are grouped one module each: `supervision` ([pulse], [timings],
[log], [engine], [tick]), `processes` ([[process]]), `watches` ([watch]), `safety` ([survival],
[store], [allow], [[notify]]), `agentwork` ([[agent]], [tasks], [budget], [gate]), `schedules`
([[schedule]], [report]), `services` ([web], [telemetry], [fleet]). `whole` is the file's top level
(`Config`) and reads and checks it (`load`); `agenttables` reads the agents' tables alone. `slices`
cuts what each process reads (its child spec names its slice), `explain` says what a decode error
means, and `reference` writes the commented sample of a fresh home and docs/config.md from the
descriptors. A new key is a field in its table's module; its bounds are checked, and it appears in
the sample, the reference and `pulsectl config --effective`, with nothing else to edit.

Callers name everything as pulse.core.config.X: this package imports the module that defines X at
the first X asked of it. So a pulsectl command that reads one table (`task add`: [[agent]]) makes
only that table's Structs, not the file's ~30 others (~5 ms of its time), and only pulsed and its
workers make the slices (~3 ms).
"""

import sys

# Where each name callers ask of this package is defined (the module under pulse.core.config).
_DEFINED_IN = {
    **dict.fromkeys(("SCHEMA_VERSION", "TOML_TYPES", "Config", "changed_tables", "decode", "default_toml",
                     "env_overrides", "load", "to_toml", "validate", "with_presets"), "whole"),
    **dict.fromkeys(("ConfigError", "Table", "unwrapped"), "keys"),
    **dict.fromkeys(("ADAPTER_ARGV", "ADAPTER_GROUP", "ROUTE_NAME", "Agent", "Gate", "RunLimits", "SpendLimits",
                     "Tasks", "adapter_entry_points", "adapter_names", "validate_agents",
                     "validate_gate"), "agentwork"),
    **dict.fromkeys(("AgentTables", "load_agent_tables"), "agenttables"),
    **dict.fromkeys(("MAX_MEMORY_WINDOW_SAMPLES", "Backoff", "Health", "Memory", "PidFile", "Process",
                     "removed_definition", "validate_processes"), "processes"),
    **dict.fromkeys(("Allow", "Llm", "Notify", "Store", "Survival", "validate_llm", "validate_notify",
                     "validate_store"), "safety"),
    **dict.fromkeys(("Report", "Schedule", "ScheduleEffect", "ScheduleTask", "validate_report",
                     "validate_schedules"), "schedules"),
    **dict.fromkeys(("Fleet", "Telemetry", "Web", "is_loopback", "listen_address", "validate_fleet",
                     "validate_telemetry", "validate_web", "without_secrets"), "services"),
    **dict.fromkeys(("EngineLimits", "LogSettings", "PulseSettings", "TickSettings", "Timings",
                     "validate_instance_name", "validate_timings"), "supervision"),
    **dict.fromkeys(("MAX_KEEP", "DirWatch", "ErrorLogWatch", "FileWatch", "FreshWatch", "NetworkTarget", "Watch",
                     "max_age_s", "validate_watch"), "watches"),
    **dict.fromkeys(("EVERY_WORKER", "SLICES", "EngineConfig", "ExecutorConfig", "SupervisorConfig",
                     "SupervisorTimings", "TickConfig", "WatcherConfig", "changed_slices", "decode_slice",
                     "encode_slice", "slice_of"), "slices"),
}

__all__ = sorted(_DEFINED_IN)


def __getattr__(name: str):
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    __import__(f"{__name__}.{module}")
    value = getattr(sys.modules[f"{__name__}.{module}"], name)
    globals()[name] = value          # asked once: from now on an attribute like any other
    return value
