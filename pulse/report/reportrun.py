"""The `report` effect: read a window of events.db, analyse it, write the page, and (params.notify)
send the text summary with the page's path through the [[notify]] channels.

The analyst is the deterministic one (pulse.report.analyst) unless params.analyst or [report]
analyst names an [[agent]]. Then that agent runs as the agent-run effect runs agents: its
adapter's argv (a list, never a shell string), its own process group, killed at its timeout
(the smaller of [report] analyst_timeout_s and the agent's timeout_s). It gets the window's
events (at most analyst_max_events, summarised, each with its id), the deterministic analysis
and the schema, and must answer with the analysis as JSON: the whole output, Claude Code's
`structured_output` or `result`, or the last JSON object in its text. The answer is decoded
against the schema and every citation checked against the window; on a timeout, an answer that
is no JSON, does not fit, or cites an event outside the window, the deterministic analysis is
used and says why (`fallback`). An agent's words never reach the page unchecked: they are
escaped like every other string.

`make_report` is the whole of it for one window; pulsectl calls it directly when no pulsed runs.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Sequence

import msgspec

from pulse.agents import adapters
from pulse.agents import tasks as taskmod
from pulse.core import clock
from pulse.core.config import Agent
from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import EffectKind
from pulse.effects import notify
from pulse.effects.kinds import EffectContext, EffectFailed, os_failure, run_process, store_output
from pulse.effects.registry import Kind
from pulse.report import analyst, render
from pulse.report.analysis import Analysis, InvalidAnalysis, check, cited, decode, encode, schema
from pulse.store import archive, connection, eventindex, eventsdb, projection

DAY_S = 86_400
EVENT_LINE_CHARS = 240
PROMPT_MAX_CHARS = 100_000        # one argv element may hold 128 KiB (MAX_ARG_STRLEN)


class AnalystFailed(Exception):
    """The agent gave no usable answer; the message says why."""


def window(params: dict, now: float) -> tuple[float, float]:
    """[start, end] from params: start/end (wall times), else since_s back from end (default a day)."""
    end = float(params.get("end") or now)
    start = params.get("start")
    start = float(start) if start is not None else end - float(params.get("since_s") or DAY_S)
    if start >= end:
        raise ValueError(f"the window starts ({clock.iso(start)}) at or after it ends ({clock.iso(end)})")
    return start, end


def read(conn, start: float, end: float, project: str | None = None, task: str | None = None, *,
         checkpoints: Path) -> tuple[list, dict[str, tuple[str, str]]]:
    """The window's events in scope, and every task's (project, title): from the tasks projection
    under `checkpoints` (the home's), so a report does not read every task-created event since the
    host began, and still names a task created long before the window. A window that reaches past
    the live history reads the archive segments it meets (archive.SegmentError if one is unsound)."""
    tasks = {t.id: (t.project, t.title) for t in taskmod.load_all(conn, checkpoints).values()}
    return analyst.in_scope(window_events(conn, start, end), tasks, project, task), tasks


def window_events(conn, start: float, end: float) -> list:
    """Every event stamped within [start, end], oldest first: the archived ones, then the live ones."""
    live = eventsdb.events_between(conn, start, end)
    first_live = eventindex.first_live_id(conn)
    if first_live == 1 or start >= (eventindex.event_ts(conn, first_live) or 0):
        return live                       # nothing moved, or the window starts in the live history
    return archive.events_between(conn, start, end) + live


def deterministic(events: Sequence, tasks: dict, start: float, end: float, project: str | None = None,
                  task: str | None = None) -> Analysis:
    return analyst.analyse(events, start, end, tasks=tasks, project=project, task=task)


def page(conn, start: float, end: float, project: str | None = None, task: str | None = None, *,
         checkpoints: Path) -> str:
    """The deterministic report of a window as the HTML page (what a web UI serves at /report)."""
    events, tasks = read(conn, start, end, project, task, checkpoints=checkpoints)
    return render.html(deterministic(events, tasks, start, end, project, task), {ev.id: ev for ev in events})


# -- an agent as analyst ---------------------------------------------------------------------------------

def event_line(ev) -> str:
    data = json.dumps(ev.data, separators=(",", ":"), default=str, ensure_ascii=False)
    line = f"#{ev.id} {clock.iso(ev.ts)} {ev.type} {ev.source} {ev.target or '-'} {data}"
    return line if len(line) <= EVENT_LINE_CHARS else line[:EVENT_LINE_CHARS] + "…"


def chosen_events(events: Sequence, base: Analysis, limit: int) -> list:
    """At most `limit` events: those the deterministic analysis cites, then the newest, in id order."""
    by_id = {ev.id: ev for ev in events}
    keep = dict.fromkeys(i for i in cited(base) if i in by_id)
    for ev in reversed(events):
        if len(keep) >= limit:
            break
        keep.setdefault(ev.id, None)
    return [by_id[i] for i in sorted(list(keep)[:limit])]


def prompt(events: Sequence, base: Analysis, limit: int) -> str:
    shown = chosen_events(events, base, limit)
    head = (
        "You are the analyst of a Pulse report: judge what happened on this host in the window below.\n"
        "Answer with ONE JSON object and nothing else, fitting this JSON Schema (version 1). Cite events "
        "only by the ids shown (#id): a citation of any other event makes your answer invalid, and the "
        "deterministic analysis is used instead. Keep `window` as given.\n"
        f"Schema: {json.dumps(schema(), separators=(',', ':'))}\n"
        f"The deterministic analysis, to check and improve: {encode(base).decode()}\n"
        f"Events ({len(shown)} of {base.window.events} in the window):\n")
    lines, size = [], len(head)
    for ev in shown:
        line = event_line(ev)
        if size + len(line) + 1 > PROMPT_MAX_CHARS:
            break
        lines.append(line)
        size += len(line) + 1
    return head + "\n".join(lines)


def _objects_in(text: str) -> list[object]:
    """JSON values the text may be: the whole of it, a fenced block, its last line, its outer braces."""
    text = text.strip()
    candidates = [text]
    if "```" in text:
        candidates += [part.removeprefix("json").strip() for part in text.split("```")[1::2]]
    candidates += list(reversed(text.splitlines()))
    if "{" in text and "}" in text:
        candidates.append(text[text.index("{"):text.rindex("}") + 1])
    out = []
    for candidate in candidates:
        candidate = candidate.strip()
        if candidate.startswith("{"):
            try:
                out.append(json.loads(candidate))
            except ValueError:
                continue
    return out


def answer(output: bytes) -> dict:
    """The analysis object in an agent's output, or AnalystFailed."""
    text = output.decode("utf-8", "replace")
    for value in _objects_in(text):
        if not isinstance(value, dict):
            continue
        if "score" in value and "verdict" in value:
            return value
        structured = value.get("structured_output")            # claude -p --json-schema
        if isinstance(structured, dict):
            return structured
        result = value.get("result")                           # claude -p --output-format json
        if isinstance(result, dict):
            return result
        if isinstance(result, str):
            for inner in _objects_in(result):
                if isinstance(inner, dict) and "score" in inner:
                    return inner
    raise AnalystFailed("its answer holds no JSON analysis" + (f" (output ended: {text.strip()[-120:]!r})"
                                                              if text.strip() else " (no output)"))


def ask_agent(agent: Agent, text: str, ctx: EffectContext, workdir: Path, timeout_s: float) -> tuple[dict, str]:
    """Run the agent on the prompt; (its answer, where its whole output is in objects/)."""
    try:
        adapter = adapters.load_adapter(agent.adapter)
    except Exception as err:
        raise AnalystFailed(f"adapter {agent.adapter!r}: {type(err).__name__}: {err}") from None
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    invocation = adapter.invocation(agent, adapters.Task("report", text, "report", ""), str(workdir))
    limit = min(timeout_s, agent.timeout_s)
    ctx.timeout_s, ctx.deadline = limit, time.monotonic() + limit
    try:
        code, output, timed_out = run_process(invocation.argv, ctx, env=invocation.env, cwd=invocation.cwd)
    except EffectFailed as err:
        raise AnalystFailed(err.error) from None
    ref = store_output(ctx.objects, output)
    if timed_out:
        raise AnalystFailed(f"timed out after {limit:g}s; its process group was killed")
    try:
        return answer(output), ref
    except AnalystFailed as err:
        raise AnalystFailed(f"{err} (exit code {code})") from None


def judged(raw: dict, base: Analysis, known: set[int], name: str) -> Analysis:
    """The agent's answer as an Analysis of this window, every citation checked; InvalidAnalysis if not."""
    theirs = decode(raw)
    theirs = msgspec.structs.replace(theirs, window=base.window, analyst=name, fallback=None)
    return check(theirs, known)


def make_report(conn, start: float, end: float, *, project: str | None, task: str | None,
                agent: Agent | None, ctx: EffectContext | None, workdir: Path | None,
                timeout_s: float, max_events: int, checkpoints: Path) -> tuple[Analysis, dict[int, object], dict]:
    """(analysis, the window's events by id, notes about the agent's run) for one window."""
    events, tasks = read(conn, start, end, project, task, checkpoints=checkpoints)
    base = deterministic(events, tasks, start, end, project, task)
    notes: dict = {}
    if agent is None:
        return base, {ev.id: ev for ev in events}, notes
    known = {ev.id for ev in events}
    try:
        raw, ref = ask_agent(agent, prompt(events, base, max_events), ctx, workdir, timeout_s)
        notes["agent_output"] = ref
        result = judged(raw, base, known, agent.name)
    except (AnalystFailed, InvalidAnalysis) as err:
        result = msgspec.structs.replace(base, fallback=f"agent {agent.name}: {err}")
    return result, {ev.id: ev for ev in events}, notes


# -- the effect ------------------------------------------------------------------------------------------

class ReportParams(msgspec.Struct):
    since_s: float | None = None          # the window: the last since_s seconds (default a day) ...
    start: float | None = None            # ... or from start (wall time) ...
    end: float | None = None              # ... to end (default now)
    project: str | None = None
    task: str | None = None
    analyst: str | None = None            # "deterministic" or an [[agent]]; unset: [report] analyst
    notify: bool = False                  # send the text summary and the page's path through [[notify]]


def reports_dir(ctx: EffectContext) -> Path:
    home = ctx.home
    return Path(ctx.config.report.dir) if ctx.config.report.dir else home / "reports"


def chosen_agent(config, name: str | None) -> Agent | None:
    name = name or config.report.analyst
    if name in (None, "", "deterministic"):
        return None
    for agent in config.agent:
        if agent.name == name:
            return agent
    raise EffectFailed("bad-params", f"analyst {name!r} is neither \"deterministic\" nor an [[agent]]")


def write_page(folder: Path, analysis: Analysis, events: dict, now: float, effect_id: str) -> Path:
    """The page as report-<UTC stamp>-<effect id>.html: two reports in one second never share a file."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f"report-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}-{effect_id[:12]}.html"
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(render.html(analysis, events))
    os.replace(tmp, path)
    return path


def run_report(effect: Effect, ctx: EffectContext) -> dict:
    """The report effect (see the module doc): acked with the page's path and the analysis's ref."""
    params = msgspec.convert(effect.params, ReportParams)
    now = time.time()
    try:
        start, end = window(effect.params, now)
    except ValueError as err:
        raise EffectFailed("bad-params", str(err)) from None
    agent = chosen_agent(ctx.config, params.analyst)
    home = ctx.home
    conn = connection.open_readonly(home / "events.db")
    try:
        analysis, events, notes = make_report(
            conn, start, end, project=params.project, task=params.task, agent=agent, ctx=ctx,
            workdir=home / "work" / "report", timeout_s=ctx.config.report.analyst_timeout_s,
            max_events=ctx.config.report.analyst_max_events, checkpoints=home / projection.DIRECTORY)
    except archive.SegmentError as err:
        raise EffectFailed("bad-archive", f"{err}; run `pulsectl store check`") from None
    finally:
        conn.close()
    try:
        path = write_page(reports_dir(ctx), analysis, events, now, effect.id)
    except OSError as err:          # [report] dir is the operator's: not writable is theirs to fix, not a bug
        raise os_failure("the report page could not be written", err) from None
    data = {"path": str(path), "analysis": store_output(ctx.objects, encode(analysis)), "score": analysis.score,
            "verdict": analysis.verdict, "analyst": analysis.analyst, "fallback": analysis.fallback, **notes}
    if params.notify:
        summary = render.text(analysis, str(path))
        message = Effect(kind=EffectKind.NOTIFY, id=effect.id, target=effect.target or "report", origin=effect.origin,
                         params={"rule": effect.params.get("rule"), "title": f"Pulse report: {analysis.verdict}, "
                                 f"score {analysis.score}", "message": summary, "path": str(path)})
        # The channels get their own time: an agent analyst may have used up the effect's deadline.
        ctx.timeout_s = ctx.config.timings.effect_timeout_s
        ctx.deadline = time.monotonic() + ctx.timeout_s
        try:
            data["notify"] = notify.run_notify(message, ctx)
        except EffectFailed as err:
            raise EffectFailed("notify", f"the report is at {path}, but {err.error}", **data, **err.data) from None
    return data


# Plugged into pulse.effects.registry (setup.cfg's pulse.effect_kinds).
REPORT = Kind(
    "report", "Writes the report of a window of events.db (the last day by default) as one HTML page "
    "under [report] dir, analysed by the deterministic analyst or an [[agent]] (checked, with the "
    "deterministic analysis as fallback); with notify, sends its text summary and the page's path "
    "through the [[notify]] channels. Acked with the page's path and the analysis in objects/.",
    ReportParams, run_report, True, "what the report is for (free text)", tells_operator=True)
