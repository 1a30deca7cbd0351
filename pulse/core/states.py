"""Worker, effect and task states, the groups that decide what a state means, and what each
worker is to pulsed (its child spec).

Stdlib only: every other module imports this one.
"""

import enum
from typing import NamedTuple


class WorkerState(enum.StrEnum):
    STARTING = "starting"   # spawned, not yet ready
    RUNNING = "running"     # ready and heartbeating
    BACKOFF = "backoff"     # exited unexpectedly; waiting out its restart delay
    HUNG = "hung"           # alive but silent; being aborted and killed
    STOPPING = "stopping"   # asked to stop; waiting out the grace period
    STOPPED = "stopped"     # not running, by request
    FAILED = "failed"       # hit the restart intensity limit


# Not a state of the machine above but what status shows for a RUNNING worker whose heartbeat is
# overdue, before it is found hung. Still running: `pulsectl status` exits 0 for it.
LATE = "late"


# A process exists (or is being created) in these states.
ALIVE_STATES = frozenset({WorkerState.STARTING, WorkerState.RUNNING, WorkerState.HUNG, WorkerState.STOPPING})


# -- what each worker is to pulsed: its child spec, as OTP calls it --------------------------------
# Every worker is permanent (any exit pulsed did not ask for is a crash) and restarted the same way
# (supervisor/child.py says how); a spec says only how one worker differs from the others. pulsed's
# policy reads these properties, never a worker's name.

class _ChildSpecFields(NamedTuple):   # not a dataclass: that imports inspect, ~5 ms of `pulsectl status`
    name: str
    # Core: it keeps the host alive. READY=1 waits for it; past the restart intensity limit pulsed
    # stops everything and exits 1 (escalates), and when it says a store is unusable (exit 78),
    # pulsed exits 78. Not core: it goes `failed` and pulsed runs on.
    core: bool = False
    listed: bool = True              # `pulsectl status` lists it and an operator may name it (stop, start, ...)
    enabled_by: str | None = None    # "table.key" of the config flag it runs under; None: it always runs
    # Not core: the [timings] key, in seconds, after which a `failed` one is retried by itself; None:
    # it stays failed until an operator starts it. A core worker is never retried: it escalates.
    retry_after_failed: str | None = None
    # pulsed's lifecycle event writer: it starts first and stops last (it writes the others' events,
    # their exits included), gets what was not committed sent again when a new one is ready, and
    # its own exit is not recorded while pulsed stops (nobody would write it).
    writes_events: bool = False


class ChildSpec(_ChildSpecFields):
    __slots__ = ()

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls, *args, **kwargs)
        if self.core and self.retry_after_failed is not None:
            raise ValueError(f"{self.name}: a core worker escalates at the limit; it has no retry")
        if not (self.core or self.listed or self.retry_after_failed):
            raise ValueError(f"{self.name}: failed, unlisted and never retried, nothing would ever start it again")
        return self


# The table, in start order (stop order is the reverse).
CHILD_SPECS: dict[str, ChildSpec] = {spec.name: spec for spec in (
    ChildSpec("eventlog", listed=False, writes_events=True, retry_after_failed="eventlog_retry_after_failed_s"),
    ChildSpec("watcher", core=True),
    ChildSpec("tick", core=True),
    ChildSpec("executor", core=True),
    ChildSpec("engine", retry_after_failed="engine_retry_after_failed_s"),
    ChildSpec("web", enabled_by="web.enabled", retry_after_failed="web_retry_after_failed_s"),
    # the only process that talks to NATS (pulse/workers/fleet.py); never core: the host lives without it
    ChildSpec("fleet", enabled_by="fleet.enabled", retry_after_failed="fleet_retry_after_failed_s"),
    # the local OTLP receiver (pulse/workers/telemetry.py): facts of what runs do while they run; never core
    ChildSpec("telemetry", enabled_by="telemetry.enabled", retry_after_failed="telemetry_retry_after_failed_s"),
)}

# Groups of names, derived from the table, for whoever needs a list rather than a property.
CORE_WORKERS = tuple(n for n, s in CHILD_SPECS.items() if s.core)
(EVENT_WRITER,) = (n for n, s in CHILD_SPECS.items() if s.writes_events)     # exactly one
SUPERVISED = tuple(n for n, s in CHILD_SPECS.items() if s.enabled_by is None)   # always run, in start order
WORKERS = tuple(n for n in SUPERVISED if CHILD_SPECS[n].listed)   # always listed; what STATUS= counts
STEERABLE = tuple(n for n, s in CHILD_SPECS.items() if s.listed)  # what an operator may name
LOG_SOURCES = ("pulsed", "forkserver", *CHILD_SPECS)               # who writes pulse.log
# Workers named for what status reports of them (the engine's commit, the web worker's address).
ENGINE = "engine"
WEB = "web"
FLEET = "fleet"
TELEMETRY = "telemetry"


class ProcessState(enum.StrEnum):
    """A guarded [[process]] as status shows it (pulse.rules.processstate projects it from facts)."""
    UNKNOWN = "unknown"       # not sampled yet
    STARTING = "starting"     # alive, not yet past min_uptime_s (or its health start period); or being (re)started
    RUNNING = "running"       # alive, past its start, its probes (if any) passing
    UNHEALTHY = "unhealthy"   # alive, its last `failures` probes failed (a frozen process is not healthy)
    BACKOFF = "backoff"       # died soon after its start; waiting before the next start
    FATAL = "fatal"           # held down: too many quick deaths within restart_window_s
    DEAD = "dead"             # not running, and nothing will start it (no restart argv, or its stop_exit_codes)
    STOPPED = "stopped"       # stopped by an operator
    PAUSED = "paused"         # survival leaves it alone for a while (pulsectl pause)


def process_state_at(state: str, until: float | None, now: float) -> str:
    """A process's state, as the tick last projected it, at `now`: a start that has lasted past its
    `until` is running (status is read between two ticks; the tick's view says when it turns)."""
    if state == ProcessState.STARTING and until is not None and now >= until:
        return ProcessState.RUNNING
    return state


# A critical process in one of these makes `pulsectl status` exit PROCESS_DOWN: down, held down or
# of no use. An operator's stop or pause is intent, not failure; starting is on its way up.
PROCESS_FAILING = frozenset({ProcessState.UNHEALTHY, ProcessState.BACKOFF, ProcessState.FATAL, ProcessState.DEAD})


class EffectState(enum.StrEnum):
    PENDING = "pending"       # committed, not yet claimed
    EXECUTING = "executing"   # claimed by an executor
    ACKED = "acked"           # done
    FAILED = "failed"         # ran and failed, was refused, or was interrupted and may not run twice
    EXPIRED = "expired"       # past its deadline unrun, or recorded only (observe_only)


EFFECT_OPEN = (EffectState.PENDING, EffectState.EXECUTING)
EFFECT_ENDED = frozenset({EffectState.ACKED, EffectState.FAILED, EffectState.EXPIRED})
# (the event each end is recorded with: pulse.core.wire.EFFECT_END_EVENTS)


class TaskStatus(enum.StrEnum):
    PENDING = "pending"       # waiting for an agent
    ASSIGNED = "assigned"     # an agent-run took it
    EXECUTING = "executing"   # its agent runs
    ACKED = "acked"           # its agent answered; the creator may close it
    CLOSED = "closed"
    GIVEN_UP = "given_up"     # failed too often, or given up by hand



class Exit(enum.IntEnum):
    """pulsed's exit codes."""

    OK = 0
    ESCALATED = 1        # a core worker hit its restart intensity limit: let systemd restart us
    ALREADY_RUNNING = 2  # another pulsed holds this home
    CONFIG = 78          # EX_CONFIG: bad configuration, do not restart (RestartPreventExitStatus=78)


class StatusExit(enum.IntEnum):
    """`pulsectl status` exit codes (LSB)."""

    RUNNING = 0
    NOT_RUNNING = 3      # something is not running
    UNKNOWN = 4          # the daemon could not be reached
    PROCESS_DOWN = 5     # every worker runs, but a guarded process is down, fatal or unhealthy
