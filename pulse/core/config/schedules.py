"""[[schedule]] and [report]: recurring work the tick runs (pulse.core.schedule says when), and the
report of what happened."""

import os
import re
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from msgspec import Meta

from pulse.core.config.keys import ConfigError, Table

if TYPE_CHECKING:
    from pulse.core.config import Config

DAILY_AT = re.compile(r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
SCHEDULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")   # it is an event's target
# A schedule's spec, read here where it is checked; pulse.core.schedule computes its slots from it.
CRON_FIELDS = ("minute", "hour", "day of month", "month", "day of week")
MIN_EVERY_S = 1.0
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_every(text: str) -> float:
    """"15m", "90s", "1h30m", "2d" → seconds; ValueError saying what a duration looks like."""
    compact = text.replace(" ", "")
    parts = _DURATION_PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"{text!r} is not a duration (like \"90s\", \"15m\", \"1h30m\" or \"1d\")")
    seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if seconds < MIN_EVERY_S:
        raise ValueError(f"{text!r} is shorter than {MIN_EVERY_S:g} s")
    return seconds


def duration_problem(text: str) -> str | None:
    """What is wrong with a duration ("15m", "1h30m"), or None when parse_every reads it."""
    try:
        parse_every(text)
    except ValueError as err:
        return str(err)
    return None


def cron_problem(expr: str) -> str | None:
    """What is wrong with a 5-field cron expression, naming the field; None when croniter reads it."""
    from croniter import croniter  # ~43 ms with dateutil: only a config with a cron schedule pays it
    columns = expr.split()
    if len(columns) != len(CRON_FIELDS):
        return (f"{expr!r} has {len(columns)} fields; a cron expression has 5: "
                f"{', '.join(CRON_FIELDS)} (for seconds, use every = \"30s\")")
    if croniter.is_valid(expr):
        return None
    for i, name in enumerate(CRON_FIELDS):   # croniter says "out of range": find which field
        alone = ["*"] * len(CRON_FIELDS)
        alone[i] = columns[i]
        if not croniter.is_valid(" ".join(alone)):
            return f"{expr!r}: the {name} field {columns[i]!r} is not valid"
    return f"{expr!r} is not a valid cron expression"


class Report(Table):
    """`pulsectl report` and the daily report (pulse.report)."""
    analyst: str = "deterministic"
    """Who writes the analysis: "deterministic" or the name of an [[agent]]."""
    analyst_timeout_s: Annotated[float, Meta(gt=0)] = 300
    """An agent analyst silent this long: the deterministic one is used, in s."""
    analyst_max_events: Annotated[int, Meta(ge=1)] = 400
    """The agent analyst gets at most this many events (summarised, with ids)."""
    daily_at: str | None = None
    """Host local time (HH:MM, 24 h) of the day's report through [[notify]]; unset: none. Example: `"08:00"`"""
    dir: str | None = None
    """An absolute directory where the report effect writes its pages; unset: <home>/reports. Example: `"/srv/reports"`"""


def validate_report(config: "Config", origin: str) -> None:
    r = config.report
    if r.daily_at is not None and not DAILY_AT.match(r.daily_at):
        raise ConfigError(f"{origin}: $.report.daily_at: {r.daily_at!r} is not a time like \"08:00\" (HH:MM, 24 h)")
    if r.analyst != "deterministic" and r.analyst not in {a.name for a in config.agent}:
        raise ConfigError(f"{origin}: $.report.analyst: {r.analyst!r} is neither \"deterministic\" nor an [[agent]] name")
    if r.dir is not None and not os.path.isabs(r.dir):
        raise ConfigError(f"{origin}: $.report.dir must be an absolute path")


class ScheduleTask(Table):
    """What a schedule adds at each slot (`task = {...}`): a pending task, as `pulsectl task add` adds one."""
    project: str
    """The task's project. Example: `"infra"`"""
    title: str
    """The task's title. Example: `"Update dependencies"`"""
    prompt: str
    """What the agent is asked. Example: `"..."`"""
    agent: str | None = None
    """The [[agent]] it is for; unset: whoever the assignment rule picks. Example: `"claude"`"""
    priority: int = 0
    """Higher runs first."""


class ScheduleEffect(Table):
    """... or an effect (`effect = {...}`), committed by the tick (origin "schedule": the operator's config, trusted)."""
    kind: str
    """An effect kind. Example: `"exec"`"""
    target: str | None = None
    """Its target. Example: `"gateway"`"""
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    """Its parameters, as its kind takes them."""


class Schedule(Table):
    """Recurring work. Its slots are the times a cron expression matches (host local time) or the
    multiples of `every` since the Unix epoch; at each, one task or effect, committed with the fact
    that the slot ran, so no restart runs a slot twice or skips one. A schedule's first slot is the
    one after it is first seen. Repeat the table for more."""
    name: str
    """Its name: 1 to 64 letters, digits and _ . : -. Example: `"nightly-deps"`"""
    cron: str | None = None
    """minute hour day-of-month month day-of-week, host local time; exactly one of cron or every. Example: `"0 3 * * *"`"""
    every: str | None = None
    """... or a period (ms s m h d, "1h30m"). Example: `"15m"`"""
    task: ScheduleTask | None = None
    effect: ScheduleEffect | None = None
    # systemd's Persistent=true; never once per missed slot
    catch_up: bool = True
    """After downtime, the latest missed slot runs once at start."""
    grace_s: Annotated[float, Meta(ge=0)] = 60
    """catch_up = false: a slot due longer ago than this is skipped, in s."""
    jitter_s: Annotated[float, Meta(ge=0)] = 0
    """Each slot runs up to this much after its time (fixed per slot), in s; shorter than every."""
    notify_after: Annotated[int, Meta(ge=0)] = 2
    """Runs in a row that end failed before a notification; 0: never."""
    overlap: bool = False
    """A slot due while the last run is still open waits for it (catch_up) or is skipped; true: it runs anyway, and runs
    may pile up behind a hold."""


def validate_schedules(config: "Config", origin: str) -> None:
    """Each [[schedule]]: one of cron or every, as parse_every and cron_problem read them (a bad cron
    expression is named, field by field); one of task or effect; a task for a configured agent only."""
    if not config.schedule:
        return
    agents = {a.name for a in config.agent}
    for i, s in enumerate(config.schedule):
        where = f"{origin}: $.schedule[{i}]"
        if not SCHEDULE_NAME.fullmatch(s.name):
            raise ConfigError(f"{where}.name: 1 to 64 letters, digits and _ . : - (not starting with a symbol), "
                              f"got {s.name!r}")
        where = f"{origin}: schedule {s.name!r} ($.schedule[{i}])"
        if (s.cron is None) == (s.every is None):
            raise ConfigError(f"{where}: set exactly one of cron or every")
        if s.cron is not None and (problem := cron_problem(s.cron)):
            raise ConfigError(f"{where}.cron: {problem}")
        if s.every is not None and (problem := duration_problem(s.every)):
            raise ConfigError(f"{where}.every: {problem}")
        if (s.task is None) == (s.effect is None):
            raise ConfigError(f"{where}: set exactly one of task or effect")
        if s.task is not None:
            for key in ("project", "title", "prompt"):
                if not getattr(s.task, key).strip():
                    raise ConfigError(f"{where}.task.{key}: must not be empty")
            if s.task.agent is not None and s.task.agent not in agents:
                raise ConfigError(f"{where}.task.agent: no [[agent]] named {s.task.agent!r}")
        if s.effect is not None and not s.effect.kind.strip():
            raise ConfigError(f"{where}.effect.kind: must not be empty")
        if s.every is not None and s.jitter_s >= parse_every(s.every):
            raise ConfigError(f"{where}.jitter_s must be shorter than every ({s.every})")
    names = [s.name for s in config.schedule]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.schedule: names must be unique")
