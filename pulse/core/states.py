"""Worker, effect and task states, and the groups that decide what a state means (what each
worker is to pulsed, its child spec, is pulse.core.childspecs).

Stdlib only: every other module imports this one.
"""

import enum


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
