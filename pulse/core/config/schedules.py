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


class Report(Table):
    """`pulsectl report` and the daily report (pulse.report)."""
    analyst: Annotated[str, Meta(
        description="Who writes the analysis: \"deterministic\" or the name of an [[agent]].")] = "deterministic"
    analyst_timeout_s: Annotated[float, Meta(
        gt=0, description="An agent analyst silent this long: the deterministic one is used, in s.")] = 300
    analyst_max_events: Annotated[int, Meta(
        ge=1, description="The agent analyst gets at most this many events (summarised, with ids).")] = 400
    daily_at: Annotated[str | None, Meta(
        description="Host local time (HH:MM, 24 h) of the day's report through [[notify]]; unset: none.",
        examples=["08:00"])] = None
    dir: Annotated[str | None, Meta(
        description="An absolute directory where the report effect writes its pages; unset: <home>/reports.",
        examples=["/srv/reports"])] = None


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
    project: Annotated[str, Meta(description="The task's project.", examples=["infra"])]
    title: Annotated[str, Meta(description="The task's title.", examples=["Update dependencies"])]
    prompt: Annotated[str, Meta(description="What the agent is asked.", examples=["..."])]
    agent: Annotated[str | None, Meta(
        description="The [[agent]] it is for; unset: whoever the assignment rule picks.", examples=["claude"])] = None
    priority: Annotated[int, Meta(description="Higher runs first.")] = 0


class ScheduleEffect(Table):
    """... or an effect (`effect = {...}`), committed by the tick (origin "schedule": the operator's config, trusted)."""
    kind: Annotated[str, Meta(description="An effect kind.", examples=["exec"])]
    target: Annotated[str | None, Meta(description="Its target.", examples=["gateway"])] = None
    params: Annotated[dict[str, Any], Meta(description="Its parameters, as its kind takes them.")] = \
        msgspec.field(default_factory=dict)


class Schedule(Table):
    """Recurring work. Its slots are the times a cron expression matches (host local time) or the
    multiples of `every` since the Unix epoch; at each, one task or effect, committed with the fact
    that the slot ran, so no restart runs a slot twice or skips one. A schedule's first slot is the
    one after it is first seen. Repeat the table for more."""
    name: Annotated[str, Meta(description="Its name: 1 to 64 letters, digits and _ . : -.", examples=["nightly-deps"])]
    cron: Annotated[str | None, Meta(
        description="minute hour day-of-month month day-of-week, host local time; exactly one of cron or every.",
        examples=["0 3 * * *"])] = None
    every: Annotated[str | None, Meta(description="... or a period (ms s m h d, \"1h30m\").", examples=["15m"])] = None
    task: ScheduleTask | None = None
    effect: ScheduleEffect | None = None
    # systemd's Persistent=true; never once per missed slot
    catch_up: Annotated[bool, Meta(description="After downtime, the latest missed slot runs once at start.")] = True
    grace_s: Annotated[float, Meta(
        ge=0, description="catch_up = false: a slot due longer ago than this is skipped, in s.")] = 60
    jitter_s: Annotated[float, Meta(
        ge=0, description="Each slot runs up to this much after its time (fixed per slot), in s; shorter than "
                          "every.")] = 0
    notify_after: Annotated[int, Meta(
        ge=0, description="Runs in a row that end failed before a notification; 0: never.")] = 2
    overlap: Annotated[bool, Meta(
        description="A slot due while the last run is still open waits for it (catch_up) or is skipped; true: it "
                    "runs anyway, and runs may pile up behind a hold.")] = False


def validate_schedules(config: "Config", origin: str) -> None:
    """Each [[schedule]]: one of cron or every, read by pulse.core.schedule (a bad cron expression
    is named, field by field); one of task or effect; a task for a configured agent only."""
    if not config.schedule:
        return      # without importing pulse.core.schedule: most commands load the config, few schedule
    from pulse.core import schedule as schedulemod
    agents = {a.name for a in config.agent}
    for i, s in enumerate(config.schedule):
        where = f"{origin}: $.schedule[{i}]"
        if not SCHEDULE_NAME.fullmatch(s.name):
            raise ConfigError(f"{where}.name: 1 to 64 letters, digits and _ . : - (not starting with a symbol), "
                              f"got {s.name!r}")
        where = f"{origin}: schedule {s.name!r} ($.schedule[{i}])"
        if (s.cron is None) == (s.every is None):
            raise ConfigError(f"{where}: set exactly one of cron or every")
        if s.cron is not None and (problem := schedulemod.cron_problem(s.cron)):
            raise ConfigError(f"{where}.cron: {problem}")
        if s.every is not None:
            try:
                schedulemod.parse_every(s.every)
            except ValueError as err:
                raise ConfigError(f"{where}.every: {err}") from None
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
        if s.every is not None and s.jitter_s >= schedulemod.parse_every(s.every):
            raise ConfigError(f"{where}.jitter_s must be shorter than every ({s.every})")
    names = [s.name for s in config.schedule]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.schedule: names must be unique")
