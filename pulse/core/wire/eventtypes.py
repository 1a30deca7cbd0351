"""The types of event Pulse writes outside the families of pulse.core.wire.eventmsgs, alone: what reads
events.db by type without decoding an event (`pulsectl status`) needs no msgspec."""

from __future__ import annotations

from pulse.core.wire.names import Name


class EventType(Name):
    """Every type of event Pulse writes outside the families above (EffectEvent, TaskEvent, SpendEvent,
    ScheduleEvent). Stored and sent as its string: an EventType is the str it stands for."""
    SUPERVISOR_STARTED = "supervisor-started"
    SUPERVISOR_STOPPING = "supervisor-stopping"
    RELOAD = "reload"
    OPERATOR = "operator"
    WORKER_STARTED = "worker-started"
    WORKER_READY = "worker-ready"
    WORKER_EXITED = "worker-exited"
    WORKER_HUNG = "worker-hung"
    WORKER_FAILED = "worker-failed"
    WORKER_RESTARTED = "worker-restarted"
    WAKE = "wake"
    TICK = "tick"
    COLLECT = "collect"
    ERROR = "error"
    PAUSE = "pause"
    RESUME = "resume"
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    NOTIFY = "notify"
    GATE_CALL = "gate-call"
    GATE_BLOCKED = "gate-blocked"
    GATE_RESET = "gate-reset"
    PROCESS_EXITED = "process-exited"
    # Files a trim-dir moved into objects/ (pulse.effects.dirs), each with its path and blob: committed
    # before the files are removed, so an archived file is always found again (target: the directory).
    DIR_ARCHIVED = "dir-archived"
    # A task offered to the fleet (`pulsectl task add --fleet`; target: its fleet id), and what the host
    # that took it reports of it (pulse.workers.fleettasks), both in the origin's events.db.
    FLEET_TASK_OFFERED = "fleet-task-offered"
    FLEET_TASK_UPDATE = "fleet-task-update"
    # A fleet task taken [fleet] max_deliver times without an end (given up, or its host died): the
    # dead-letter record the host that gave up last reports to the origin (target: its fleet id).
    FLEET_TASK_DEAD = "fleet-task-dead"
    # A fleet task its origin's operator took back (`pulsectl task close <fleet id>`; target: its fleet
    # id): no host starts it from then on; a run already going ends as it will, and is not offered again.
    FLEET_TASK_WITHDRAWN = "fleet-task-withdrawn"
    # pulse.store.retention: events left the live history
    HISTORY_MOVED = "history-moved"
    HISTORY_DROPPED = "history-dropped"
    # What a run or session did over one flush of the telemetry receiver (pulse.workers.telemetry): tokens,
    # cost, API requests, tool calls, errors, when it was last heard; target: the run (its agent-run effect
    # id) or "session:<id>" for a session Pulse did not start.
    TELEMETRY = "telemetry"
    # A loop seen and only said, not ended (pulse.agents.loopnotice): a run of an agent with on_loop =
    # "notice" (target: its task), or a session Pulse did not start (target: "session:<id>").
    LOOP_NOTICED = "loop-noticed"
