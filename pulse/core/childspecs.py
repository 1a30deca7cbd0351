"""What each worker is to pulsed: its child spec, as OTP calls it, one row per worker.

Everything else that names a worker is derived from this table: the modules the forkserver
preloads and the class it runs (`entry`), the config slice pulsed sends it (`config`), its
[timings] `<name>_retry_after_failed_s` key and that key's default (`retry_after_failed_s`), the
field of `pulsectl status` its heartbeat fills (`status`), the groups below. A new worker is a row
here and its module (and its slice in pulse.core.config.slices, if it reads config).

Restart policy, the same for every worker (supervisor/child.py applies it; OTP's `permanent`):
any exit pulsed did not ask for is a crash. The first restart of a streak is immediate, the next
wait restart_backoff_base_ms (100 ms) doubling to restart_backoff_max_ms (30 s); more than
intensity_restarts (5) within intensity_period_s (60 s) and the worker is `failed`; a stop is
SIGTERM, then SIGKILL after stop_grace_ms (5 s). A spec says only how one worker differs.

Stdlib only, like pulse.core.states: pulsed and every pulsectl command import it.
"""

from typing import NamedTuple


class _ChildSpecFields(NamedTuple):   # not a dataclass: that imports inspect, ~5 ms of `pulsectl status`
    name: str
    # "module:Class": the forkserver imports the module before it forks anything (so a restart
    # imports nothing) and runs the class in the child
    entry: str
    # the msgspec Struct in pulse.core.config.slices holding what it reads: pulsed sends it that slice
    # alone, and a reload restarts it when its slice changed
    config: str
    # Core: it keeps the host alive. READY=1 waits for it; past the restart intensity limit pulsed
    # stops everything and exits 1 (escalates), and when it says a store is unusable (exit 78),
    # pulsed exits 78. Not core: it goes `failed` and pulsed runs on.
    core: bool = False
    listed: bool = True              # `pulsectl status` lists it and an operator may name it (stop, start, ...)
    enabled_by: str | None = None    # "table.key" of the config flag it runs under; None: it always runs
    # Not core: the default of its [timings] key <name>_retry_after_failed_s, after which a `failed`
    # one is retried by itself; None: no such key, it stays failed until an operator starts it. A
    # core worker is never retried: it escalates.
    retry_after_failed_s: float | None = None
    # The field of `pulsectl status --json` (pulse.core.wire.Status) that its heartbeat's extras
    # (Worker.status_extras) fill while it runs, null otherwise; `status_key`: one key of them, not all.
    status: str | None = None
    status_key: str | None = None
    # pulsed's lifecycle event writer: it starts first and stops last (it writes the others' events,
    # their exits included), gets what was not committed sent again when a new one is ready, and
    # its own exit is not recorded while pulsed stops (nobody would write it).
    writes_events: bool = False


class ChildSpec(_ChildSpecFields):
    __slots__ = ()

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls, *args, **kwargs)
        if self.core and self.retry_after_failed_s is not None:
            raise ValueError(f"{self.name}: a core worker escalates at the limit; it has no retry")
        if not (self.core or self.listed or self.retry_after_failed_s):
            raise ValueError(f"{self.name}: failed, unlisted and never retried, nothing would ever start it again")
        if ":" not in self.entry:
            raise ValueError(f"{self.name}: entry {self.entry!r} is not module:Class")
        if self.status_key is not None and self.status is None:
            raise ValueError(f"{self.name}: status_key {self.status_key!r} without a status field")
        return self

    @property
    def retry_key(self) -> str | None:
        """Its [timings] key: how long a failed one waits before it is retried by itself."""
        return None if self.retry_after_failed_s is None else f"{self.name}_retry_after_failed_s"


# The table, in start order (stop order is the reverse).
CHILD_SPECS: dict[str, ChildSpec] = {spec.name: spec for spec in (
    ChildSpec("eventlog", "pulse.workers.eventwriter:EventWriter", "EventWriterConfig", listed=False,
              writes_events=True, retry_after_failed_s=600),   # the others' events wait in pulsed meanwhile
    ChildSpec("watcher", "pulse.workers.watcher:WatcherWorker", "WatcherConfig", core=True),
    ChildSpec("tick", "pulse.workers.tick:TickWorker", "TickConfig", core=True),
    ChildSpec("executor", "pulse.workers.executor:ExecutorWorker", "ExecutorConfig", core=True),
    # its commit comes in its Ready (wire.Ready.commit), not its heartbeat: status's engine_commit
    ChildSpec("engine", "pulse.workers.enginehost:EngineWorker", "EngineConfig", retry_after_failed_s=600),
    # its web stack is imported when it opens
    ChildSpec("web", "pulse.workers.webserver:WebWorker", "WebConfig", enabled_by="web.enabled",
              retry_after_failed_s=600, status="web_url", status_key="url"),
    # the only process that talks to NATS; never core: the host lives without it (nats-py: at open)
    ChildSpec("fleet", "pulse.workers.fleet:FleetWorker", "FleetConfig", enabled_by="fleet.enabled",
              retry_after_failed_s=600, status="fleet"),
    # the local OTLP receiver: facts of what runs do while they run; never core (uvicorn and the
    # OTLP protos: at open)
    ChildSpec("telemetry", "pulse.workers.telemetry:TelemetryWorker", "TelemetryConfig",
              enabled_by="telemetry.enabled", retry_after_failed_s=600, status="telemetry"),
)}

# Groups of names, derived from the table, for whoever needs a list rather than a property.
CORE_WORKERS = tuple(n for n, s in CHILD_SPECS.items() if s.core)
(EVENT_WRITER,) = (n for n, s in CHILD_SPECS.items() if s.writes_events)     # exactly one
SUPERVISED = tuple(n for n, s in CHILD_SPECS.items() if s.enabled_by is None)   # always run, in start order
WORKERS = tuple(n for n in SUPERVISED if CHILD_SPECS[n].listed)   # always listed; what STATUS= counts
STEERABLE = tuple(n for n, s in CHILD_SPECS.items() if s.listed)  # what an operator may name
LOG_SOURCES = ("pulsed", "forkserver", *CHILD_SPECS)               # who writes pulse.log
RETRIED = tuple(s for s in CHILD_SPECS.values() if s.retry_key)   # each has its [timings] retry key
# Workers named for what is done to them by name (the engine's commit and restarts, the web's page).
ENGINE = "engine"
WEB = "web"
