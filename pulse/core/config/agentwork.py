"""[[agent]], [tasks], [budget], [gate]: the agents Pulse hands tasks to, what they may spend and
use, and the gate their tools go through."""

import re
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from msgspec import Meta

from pulse.core import argvtemplate
from pulse.core.config.keys import ConfigError, Table

if TYPE_CHECKING:
    from pulse.core.config import Config

# Each built-in adapter and its argv when an [[agent]] sets none (None: the agent must set one).
# Defaults of config, so config checks an [[agent]] without importing the adapters (pulsed never
# does); each adapter's module says what its CLI documents and takes its argv from here.
ADAPTER_ARGV: dict[str, list[str] | None] = {
    "command": None,
    "claude-code": ["claude", "-p", "--output-format", "json", "--", "{prompt}"],
    "cursor": ["cursor-agent", "-p", "--output-format", "json", "--trust", "--force", "--", "{prompt}"],
    "codex": ["codex", "exec", "--json", "--skip-git-repo-check", "--", "{prompt}"],
    "hermes": ["hermes", "-z", "{prompt}"],
    "openclaw": ["openclaw", "agent", "--agent", "main", "--session-key", "{task_id}", "--message", "{prompt}",
                 "--json"],
}
ADAPTER_GROUP = "pulse.adapters"              # the entry point group other adapters register under
MAX_AGENT_TIMEOUT_S = 7 * 24 * 3600
ROUTE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.:/-]*"   # a project or a tag, as task add takes it (compiled at first use)
# The least a limit may be (0 turns it off): below these no agent CLI starts, and a typo of a unit
# (memory_mb = 4 for 4 GiB) would fail every run.
RUN_LIMIT_FLOORS = {"memory_mb": 16, "pids": 4, "cpu_percent": 1, "disk_mb": 1}

# 0 would stop every run: give the agent up instead, or leave the limit unset for none.
PositiveUsd = Annotated[float, Meta(gt=0)]


class SpendLimits(Table, frozen=True):
    """Spend limits that fail closed (pulse.agents.spend): an agent's (`[[agent]] budget = {...}`)
    or the host's (`[budget]`, all agents together). Days and months are UTC; every limit unset
    (the default) is no limit."""
    usd_per_day: PositiveUsd | None = None
    """Reported cost of runs started this UTC day, in USD; unset: no limit. Example: `20`"""
    usd_per_month: PositiveUsd | None = None
    """... this UTC month, in USD; unset: no limit. Example: `400`"""
    runs_per_hour: Annotated[int, Meta(gt=0)] | None = None
    """Runs started in the last 3600 s; unset: no limit. Example: `30`"""


class RunLimits(Table, frozen=True):
    """What one run of an agent may use (`[[agent]] limits = {...}`, pulse.agents.runlimits): held by
    the run's own cgroup where the host lets Pulse make one, rlimits as the floor. A run over memory,
    pids or disk ends at once, failed with that reason; cpu is a quota, never an end. 0: no limit."""
    memory_mb: Annotated[int, Meta(ge=0)] = 4096
    """All its processes together, in MiB; 0 or at least 16."""
    pids: Annotated[int, Meta(ge=0)] = 512
    """Processes and threads at once; 0 or at least 4."""
    cpu_percent: Annotated[int, Meta(ge=0)] = 100
    """CPU quota, in percent of one core."""
    disk_mb: Annotated[int, Meta(ge=0)] = 2048
    """What it may add to its work and scratch directories, and any one file, in MiB."""


class Agent(Table):
    """An agent Pulse hands tasks to; the `agent-run` effect runs it (see pulse.agents.adapters).
    Repeat the table for more."""
    name: str
    """Its name, as tasks and routing name it. Example: `"claude"`"""
    adapter: str = "command"
    """How its CLI is run and read: command, claude-code, cursor, codex, hermes, openclaw, or a `pulse.adapters` entry
    point. Example: `"claude-code"`"""
    argv: list[str] | None = None
    """The argv template, never a shell string; placeholders per element: {prompt} {task_id} {title} {project} {agent}
    {workdir}; unset: the adapter's (command has none). Example: `["claude", "-p", "--output-format", "json", "--",
    "{prompt}"]`"""
    cwd: str | None = None
    """Where a run starts; may use {task_id} {agent} {project}; unset: <home>/work/<task_id>. Example:
    `"/srv/work/{task_id}"`"""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Added to Pulse's environment; values take placeholders."""
    timeout_s: Annotated[float, Meta(gt=0, le=MAX_AGENT_TIMEOUT_S)] = 1800
    """A run longer than this is killed (its whole process group), in s."""
    # A CLI in print mode says nothing on stdout until its end: its telemetry is what shows it alive,
    # so with [telemetry] on keep it well above flush_s plus the CLI's export interval.
    stall_s: Annotated[float, Meta(gt=0)] | None = None
    """A run silent this long (no output, no telemetry) is ended, reason stalled, in s; below timeout_s; unset: only
    timeout_s ends it. Example: `300`"""
    concurrency: Annotated[int, Meta(ge=1)] = 1
    """Runs of this agent at once; more wait, pending."""
    mcp: bool = True
    """Hand the run `pulsectl mcp` where its CLI documents a way."""
    gate_requires_finish: bool = True
    """A run that used the gate is acked only if a session of it called finish; false relaxes that (an unverified write
    still fails the run)."""
    # Routing: who may take what. A task pinned to it (task add --agent) still needs its project
    # and tags to fit.
    projects: list[str] | None = None
    """The projects whose tasks it takes; unset: every project. Example: `["infra"]`"""
    tags: list[str] = msgspec.field(default_factory=list)
    """A task added with --tag goes only to an agent whose tags include all of its tags; empty: it takes untagged tasks
    only."""
    task_projects: list[str] | None = None
    """The projects its create_task may add tasks to; unset: its own projects (unset too: any). Example: `["infra"]`"""
    budget: SpendLimits = msgspec.field(default_factory=SpendLimits)
    max_run_usd: Annotated[float, Meta(ge=0)] | None = None
    """The cost a run is expected to have, reserved before it starts, in USD; with [telemetry] on, a run reaching it is
    ended, over-budget; unset: the median of its last 10 runs' costs. Example: `2.5`"""
    loop_per_min: Annotated[int, Meta(ge=1)] | None = None
    """With [telemetry] on: a run reporting more API requests, or tool calls, than this in a minute is in a loop
    (on_loop says what follows); unset: no loop guard. Example: `120`"""
    on_loop: Literal["end", "notice"] = "end"
    """What a run past loop_per_min gets: "end" ends it, reason loop; "notice" only says it (a loop-noticed fact on
    the task, and [[notify]], once per run) and lets it go on."""
    # pulsed needs root, or CAP_SETUID, CAP_SETGID and CAP_CHOWN
    user: str | None = None
    """The account the agent CLI runs as: it reaches Pulse's gate socket and nothing else of Pulse; unset: pulsed's own.
    Example: `"agent"`"""
    group: str | None = None
    """Its group; unset: the user's primary group. Example: `"agent"`"""
    limits: RunLimits = msgspec.field(default_factory=RunLimits)


class Tasks(Table):
    """Tasks: how often a failing one is run again, and what agents may add."""
    max_failures: Annotated[int, Meta(ge=1)] = 3
    """Failed runs of one task in a row before it is given up."""
    retry_base_s: Annotated[float, Meta(ge=0)] = 10
    """A failed run's task waits this long before its next run, doubling per failure in a row, in s ..."""
    retry_max_s: Annotated[float, Meta(ge=0)] = 300
    """... up to this, in s."""
    # The reasons of Pulse's own ends count alone; any other listed (the agent's own failure, "agent")
    # only with the same exit code.
    same_end_max: Annotated[int, Meta(ge=0)] = 2
    """A task whose last this many runs in a row all ended the same way, for one of same_end_reasons, is given up,
    saying so; 0: never."""
    same_end_reasons: list[str] = msgspec.field(
        default_factory=lambda: ["over-budget", "loop", "stalled", "timeout", "memory", "pids", "disk"])
    """The ends that count for same_end_max."""
    # The operator's tasks have depth 0.
    agent_max_depth: Annotated[int, Meta(ge=0)] = 3
    """A task an agent's create_task made in a run of a task of depth d has depth d + 1, at most this; 0: agents create
    no tasks."""
    agent_tasks_per_hour: Annotated[int, Meta(ge=0)] = 30
    """Tasks one agent may create in any hour; 0: none."""


class Gate(Table):
    """The agents' safety gate, served by the executor (`pulsectl mcp` is its stdio proxy)."""
    max_string_bytes: Annotated[int, Meta(gt=0)] = 4 * 1024
    """Any one string argument, in bytes; larger: INVALID_INPUT."""
    max_call_bytes: Annotated[int, Meta(gt=0)] = 64 * 1024
    """All of one call's arguments, as JSON, in bytes; at least max_string_bytes."""
    # so a model retrying a refused call cannot fill events.db
    blocks_per_min: Annotated[int, Meta(ge=1)] = 30
    """Blocked calls of one agent and task recorded a minute, host-wide; more are only counted."""
    # An [[agent]] with a `user` must reach it: the main socket there is 0600; each agent account gets
    # its own, in a directory there only it can enter (pulse.gate.sockets).
    socket_dir: str = ""
    """Where the gate's socket is made: a directory of root or pulsed's account, writable by no other, every parent
    traversable by the agents' accounts; "": pulsed's runtime directory."""
    # Past a limit a new connection is refused GATE_BUSY, retry; the sessions already open go on.
    max_sessions: Annotated[int, Meta(ge=1)] = 256
    """Connections (sessions) the gate holds at once."""
    max_sessions_per_uid: Annotated[int, Meta(ge=1)] = 64
    """... from one account (peer uid)."""
    max_sessions_per_pid: Annotated[int, Meta(ge=1)] = 4
    """... from one process (a `pulsectl mcp` holds one)."""
    hello_timeout_s: Annotated[float, Meta(gt=0)] = 10.0
    """A connection that says nothing this long is closed (it holds a slot), in s."""
    # The bound on what an agent adds to events.db per minute.
    calls_per_min: Annotated[int, Meta(ge=1)] = 600
    """Calls and session opens of one agent and task a minute, host-wide; past that: RATE_LIMITED with retry_after_s,
    nothing recorded."""
    call_burst: Annotated[int, Meta(ge=1)] = 120
    """How many calls may come at once before calls_per_min applies."""


def validate_gate(gate: Gate, origin: str) -> None:
    if gate.max_string_bytes > gate.max_call_bytes:
        raise ConfigError(f"{origin}: $.gate: max_string_bytes must be at most max_call_bytes")


def _agent_templates(agent: Agent):
    """(field, template, the placeholders it may use) of one [[agent]]."""
    yield from ((f"argv[{j}]", arg, argvtemplate.PLACEHOLDERS) for j, arg in enumerate(agent.argv or []))
    yield from ((f"env.{key}", value, argvtemplate.PLACEHOLDERS) for key, value in agent.env.items())
    if agent.cwd is not None:
        yield "cwd", agent.cwd, argvtemplate.CWD_PLACEHOLDERS


def adapter_entry_points() -> list:
    """The `pulse.adapters` entry points (the built-ins' too): read from metadata, nothing imported."""
    from importlib.metadata import entry_points  # ~20 ms: only for an adapter not built in
    return list(entry_points(group=ADAPTER_GROUP))


def adapter_names() -> set[str]:
    """The built-in adapters and the `pulse.adapters` entry points: names only, nothing imported."""
    return set(ADAPTER_ARGV) | {ep.name for ep in adapter_entry_points()}


def adapter_problem(agent: Agent) -> str | None:
    """What is wrong with an [[agent]]'s adapter and argv, said from config alone; an entry point's
    own default argv is its code's to know, so its check waits until it runs."""
    if agent.adapter in ADAPTER_ARGV:
        if agent.argv is None and ADAPTER_ARGV[agent.adapter] is None:
            return f"argv: adapter {agent.adapter!r} needs an argv"
        return None
    if agent.adapter not in (names := adapter_names()):
        return f"adapter: no adapter {agent.adapter!r} (known: {', '.join(sorted(names))})"
    return None


def validate_agents(config: "Config", origin: str) -> None:
    if config.tasks.retry_base_s > config.tasks.retry_max_s:
        raise ConfigError(f"{origin}: $.tasks: retry_base_s must be at most retry_max_s")
    for i, agent in enumerate(config.agent):
        where = f"{origin}: $.agent[{i}]"
        if not agent.name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]*", agent.name):
            raise ConfigError(f"{where}.name: letters, digits and _ . : - (not starting with a symbol)")
        for field_name, template, allowed in _agent_templates(agent):
            try:
                argvtemplate.placeholders(template, allowed)
            except ValueError as err:
                raise ConfigError(f"{where}.{field_name}: {err}") from None
        if agent.argv is not None and not agent.argv:
            raise ConfigError(f"{where}.argv: an argv list needs at least the program")
        if agent.on_loop == "notice" and agent.loop_per_min is None:
            raise ConfigError(f'{where}.on_loop = "notice" needs loop_per_min (the rate that is a loop)')
        if agent.stall_s is not None and not agent.stall_s < agent.timeout_s:
            raise ConfigError(f"{where}.stall_s must be greater than 0 and below its timeout_s ({agent.timeout_s})")
        for problem in (adapter_problem(agent), agent_routing_problem(agent)):
            if problem:
                raise ConfigError(f"{where}.{problem}")
        limits_problem = run_limits_problem(agent.limits)
        if limits_problem:
            raise ConfigError(f"{where}.limits.{limits_problem}")
    names = [a.name for a in config.agent]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.agent: names must be unique")


def run_limits_problem(limits: RunLimits) -> str | None:
    """What is wrong with an [[agent]]'s limits ("key: why"), or None."""
    for key, least in RUN_LIMIT_FLOORS.items():
        value = getattr(limits, key)
        if value != 0 and value < least:
            return f"{key}: {value} is below {least} (0: no limit)"
    return None


def agent_routing_problem(agent: Agent) -> str | None:
    """What is wrong with an [[agent]]'s projects or tags ("key: why"), or None."""
    if agent.projects is not None and not agent.projects:
        return "projects: an empty list takes no task at all; leave it unset for every project"
    for key, names in (("projects", agent.projects or []), ("tags", agent.tags)):
        for name in names:
            if not re.fullmatch(ROUTE_NAME, name):
                return f"{key}: {name!r} is not a name (letters, digits and _ . : / -, not starting with a symbol)"
    return None
