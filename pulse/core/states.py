"""Worker, effect and task states, and the groups that decide what a state means.

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


# A process exists (or is being created) in these states.
ALIVE_STATES = frozenset({WorkerState.STARTING, WorkerState.RUNNING, WorkerState.HUNG, WorkerState.STOPPING})

# Workers in the core keep the host alive; at the intensity limit their failure escalates
# (pulsed exits non-zero). The engine only ever fails on its own.
CORE_WORKERS = ("watcher", "tick", "executor")
ENGINE = "engine"
WORKERS = CORE_WORKERS + (ENGINE,)   # what pulsectl status lists and operators steer
# pulsed's own event writer: a worker like the others, but part of pulsed, so not listed. It
# starts first and stops last, so that it writes every lifecycle event of the others.
EVENT_WRITER = "eventlog"
SUPERVISED = (EVENT_WRITER,) + WORKERS   # start order; stop order is the reverse
# The operator's page ([web] enabled): supervised and listed only when enabled, started last,
# and like the engine never core.
WEB = "web"
STEERABLE = WORKERS + (WEB,)                                  # what an operator may name
LOG_SOURCES = ("pulsed", "forkserver", EVENT_WRITER, *STEERABLE)   # who writes pulse.log


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
