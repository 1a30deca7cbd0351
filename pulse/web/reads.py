"""The page's JSON API: what each page reads from the stores and pulsed (/api/…, /metrics), read-only.

Each page of the nav is declared here, at the route that feeds it (`@page(name, order)`, pulse.web.site):
with its drawing in static/app.js, that is the whole of a page."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from pulse.core import clock, fleetnames
from pulse.core.childspecs import LOG_SOURCES
from pulse.core.home import Paths
from pulse.core.logs import tail
from pulse.core.states import EffectState, TaskStatus
from pulse.core.wire import controlmsgs, enginerpc, eventmsgs
from pulse.core.wire.eventmsgs import EffectKind, EventType
from pulse.store import (
    archive,
    ballast,
    connection,
    effectqueue,
    eventsdb,
    fleetcursor,
    historysize,
    projection,
    schedulerun,
    vitalsdb,
)
from pulse.web import taskboard
from pulse.web.metrics import HOST, HOST_FIELDS, effect_why, exposition
from pulse.web.site import Page, Web, declare, page

# Imports inside functions: each read imports what only its page needs (agentrun ~100 ms, the gate's
# ledger ~10 ms, the engine's repo ~26 ms): the web worker is preloaded by the forkserver.

WINDOWS = {"1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400}
POINTS = 240                      # a chart's points, whatever its window


EVENTS_PAGE = 100                 # events a page of /events lists; "older" pages back through the rest
ARCHIVE_SEGMENTS_PER_PAGE = 8     # archive segments one page of /events may read: a bounded answer for a rare match


OVERVIEW_VITALS_S = 600           # the overview's charts: the last ten minutes


def status_dict(status: controlmsgs.Status | None) -> dict | None:
    return msgspec.to_builtins(status) if status is not None else None


def host_series(conn, since: float, bucket_s: float) -> dict[str, list]:
    samples = vitalsdb.vitals_buckets(conn, HOST, since, bucket_s)
    return {f.removesuffix("_pct"): [[ts, d[f]] for ts, d in samples if isinstance(d.get(f), (int, float))]
            for f in HOST_FIELDS}


def process_cards(web: Web, status: controlmsgs.Status | None) -> dict[str, dict]:
    """Per critical process, what the overview shows beside its state: its memory and its health
    probe's latency over the last ten minutes (rss_mb, one point per 5 s; latency_ms, one per probe
    bucket), its latest health probe, its restarts and its last action."""
    names = [p.name for p in status.processes] if status is not None else []
    if not names:
        return {}
    since = time.time() - OVERVIEW_VITALS_S

    def series(conn, key: str, field: str) -> list:
        return [[ts, d[field]] for ts, d in vitalsdb.vitals_buckets(conn, key, since, 5)
                if isinstance(d.get(field), (int, float))]

    def from_vitals(conn):
        health = vitalsdb.latest_vitals(conn, [f"health:{n}" for n in names])
        return {n: {"memory": series(conn, f"process-memory:{n}", "rss_mb"),
                    "latency": series(conn, f"health:{n}", "latency_ms"),
                    "health": ({k: health[f"health:{n}"].data.get(k) for k in ("ok", "error")}
                               if f"health:{n}" in health else None)} for n in names}
    cards = web.read(from_vitals, "vitals")
    counts = web.count()
    for name, card in cards.items():
        card["restarts"] = counts.process_restarts[name]
        last = counts.last_effect.get(name)
        card["last_action"] = dict(last) if last else None     # a copy: the next fold changes the original
    return cards


def grouped(actions: list[dict]) -> list[dict]:
    """Runs of the same action (why, kind, target, outcome), newest first, as one row with its count
    and its newest time: ten trims of one file are `rotate-file ×10`, not the whole table."""
    out: list[dict] = []
    for a in actions:
        same = out and all(out[-1][k] == a[k] for k in ("why", "kind", "target", "outcome"))
        if same:
            out[-1]["count"] += 1
        else:
            out.append({**a, "count": 1})
    return out


def overview(web: Web) -> dict:
    status = web.status()

    def from_events(conn):
        promotes = eventsdb.last_events(conn, 1, [EventType.PROMOTE])
        effects = effectqueue.recent_effects(conn, limit=200)
        survival = grouped([{"ts": e.created, "why": effect_why(e.params or {}), "kind": e.kind, "target": e.target,
                             "outcome": state} for e, state, _ in effects if e.origin == "survival"])[:10]
        return {"last_promote": {"ts": promotes[0].ts} if promotes else None, "survival": survival}
    view = web.read(from_events)
    view["vitals"] = web.read(lambda c: host_series(c, time.time() - OVERVIEW_VITALS_S, 5), "vitals")
    view["status"] = status_dict(status)
    view["processes"] = process_cards(web, status)
    if status is None:
        view["error"] = f"pulsed is not answering on {web.paths.home}"
    # A full disk, said from the file system itself (nothing can be written to record it)
    view["disk_full"] = ballast.disk_full_note(web.paths.home, web.paths.home / "ballast")
    view["history"] = web.read(lambda c: historysize.summary_words(historysize.summary(c, historysize.bounds(web.store))))
    return view


# the overview has no /api/ route: its stream (pulse.web.streams) keeps it current
declare(Page("overview", order=0, first=lambda web, request: overview(web)))


def event_filters(request: Request) -> dict:
    q = request.query_params
    since_ts = clock.parse_since(q["since"]) if q.get("since") else None
    return {"types": [q["type"]] if q.get("type") else [], "source": q.get("source") or None,
            "target": q.get("target") or None, "since_ts": since_ts, "text": q.get("q") or None}


def page_of(request: Request) -> int | None:
    """The `before` of a page further back in /events (the oldest id of the page before it)."""
    raw = request.query_params.get("before")
    return int(raw) if raw and raw.isdigit() else None


def as_json(ev: eventmsgs.Event) -> dict:
    return {"id": ev.id, "ts": ev.ts, "type": ev.type, "source": ev.source, "target": ev.target, "data": ev.data}


def events_view(web: Web, request: Request) -> dict:
    """The events the page lists for its filters, newest first, as /api/events gives them."""
    try:
        filters = event_filters(request)
    except ValueError as err:
        return {"events": [], "types": [], "last_id": 0, "error": str(err)}

    before = page_of(request)

    def read(conn):
        found = eventsdb.search_events(conn, **filters, before_id=before, limit=EVENTS_PAGE + 1)
        resume, error = None, None
        if len(found) <= EVENTS_PAGE:         # the live history has no more: go on into the archive
            try:
                past, resume = archive.newest_matching(
                    conn, eventsdb.search_match(**filters), EVENTS_PAGE + 1 - len(found), before_id=before,
                    types=filters["types"], since_ts=filters["since_ts"], max_segments=ARCHIVE_SEGMENTS_PER_PAGE)
                found += past
            except archive.SegmentError as err:
                error = f"{err}; run `pulsectl store check`"
        shown = found[:EVENTS_PAGE]
        view = {"events": [as_json(e) for e in shown], "types": sorted(eventmsgs.EVENT_TYPES),
                "last_id": eventsdb.last_event_id(conn), "before": before,
                "older": shown[-1].id if len(found) > EVENTS_PAGE else resume}
        return {**view, "error": error} if error else view
    return web.read(read)


@page("events", order=10, first=events_view)
async def api_events(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(events_view, request.app.state.web, request))


@page("vitals", order=20)
async def api_vitals(request: Request) -> Response:
    web: Web = request.app.state.web
    window = WINDOWS.get(request.query_params.get("window", "1h"), 3600)

    def read(conn):
        since, bucket = time.time() - window, window / POINTS
        series: dict[str, list] = {}
        for key in vitalsdb.vitals_keys(conn):
            if key == "tick":
                continue
            for ts, data in vitalsdb.vitals_buckets(conn, key, since, bucket):
                for field, value in data.items():
                    if (point := chart_point(field, value)) is not None:
                        series.setdefault(f"{key} {field}", []).append([ts, point])
        return {"window_s": window, "since": since, "now": since + window, "bucket_s": bucket, "series": series}
    return JSONResponse(await run_in_threadpool(web.read, read, "vitals"))


@page("effects", order=30)
async def api_effects(request: Request) -> Response:
    web: Web = request.app.state.web

    def read(conn):
        by_state: dict[str, list] = {s: [] for s in (EffectState.PENDING, EffectState.EXECUTING, EffectState.FAILED,
                                                     EffectState.EXPIRED, EffectState.ACKED)}   # the page's order
        for e, state, why in effectqueue.recent_effects(conn, limit=500):
            by_state[state].append({"id": e.id, "origin": e.origin, "kind": e.kind, "target": e.target,
                                    "created": e.created, "why": why, "task": effect_task(e)})
        return {"now": time.time(), "by_state": by_state}
    return JSONResponse(await run_in_threadpool(web.read, read))


def task_routing(web: Web, conn, task: enginerpc.TaskState) -> dict:
    """Who may take a task, and why a pending one waits (pulse.agents.taskview.waiting)."""
    from pulse.agents import taskview
    return {"pin": task.pin, "tags": task.tags, "waiting": taskview.waiting(conn, web.agents, task)}


@page("tasks", order=40)
async def api_tasks(request: Request) -> Response:
    web: Web = request.app.state.web

    def read(conn):
        board = web.task_board(conn)          # the open tasks, the newest ended, each agent's record
        by_status: dict[str, list] = {s: [] for s in TaskStatus}
        for t in sorted(board.shown, key=lambda t: int(t.id.rpartition("-")[2])):
            by_status.setdefault(t.status, []).append({"id": t.id, "title": t.title, "project": t.project,
                                                       "agent": t.agent or t.last_agent, "attempts": t.attempts,
                                                       **task_routing(web, conn, t)})
        agents = [{"agent": name, "runs": (runs := s.acked + s.failed),
                   "success_rate": s.acked / runs if runs else 0.0,
                   "mean_run_s": s.avg_duration_ms / 1000 if s.avg_duration_ms is not None else None,
                   "cost_usd": s.cost_usd if s.runs_with_cost else None}
                  for name, s in sorted(board.stats.items())]
        history = eventsdb.last_events(conn, 100, eventmsgs.TASK_EVENTS)
        return {"by_status": by_status, "counts": board.counts, "shown_ended": taskboard.SHOWN_ENDED, "agents": agents,
                "history": [as_json(e) for e in reversed(history)]}
    return JSONResponse(await run_in_threadpool(web.read, read))


@page("engine", order=50)
async def api_engine(request: Request) -> Response:
    web: Web = request.app.state.web
    status = await run_in_threadpool(web.status)
    history = await run_in_threadpool(web.read, lambda c: eventsdb.last_events(c, 100, [EventType.PROMOTE, EventType.ROLLBACK]))

    def summarise(ev: eventmsgs.Event) -> dict:
        from pulse.engine import repo
        row = as_json(ev)
        span = (ev.data.get("before"), ev.data.get("after"))
        if all(span):
            if span not in web.diffs:
                web.diffs[span] = repo.diff_summary(web.paths, *span)
            row["diff"] = web.diffs[span]
        return row
    rows = await run_in_threadpool(lambda: [summarise(e) for e in reversed(history)])
    return JSONResponse({"commit": status.engine_commit if status else None, "history": rows,
                         "staging_differs": await run_in_threadpool(staging_differs, web)})


@page("gate", order=60)
async def api_gate(request: Request) -> Response:
    from pulse.gate.durable import DurableStore
    web: Web = request.app.state.web

    def read(conn):
        store = DurableStore(conn, "web", checkpoints=web.paths.home / projection.DIRECTORY)
        ledger = store.catch_up()                      # reads only: never settles or writes
        sessions = [ledger.summary(s) for s in sorted(ledger.sessions, key=lambda s: -ledger.sessions[s].last)]
        blocked = reversed(eventsdb.last_events(conn, 100, [EventType.GATE_BLOCKED]))
        return {"sessions": sessions[:200], "blocked": [as_json(e) for e in blocked]}
    return JSONResponse(await run_in_threadpool(web.read, read))


@page("log", order=70)
async def api_log(request: Request) -> Response:
    web: Web = request.app.state.web
    worker = request.query_params.get("worker") or None
    lines = await run_in_threadpool(tail, web.paths.log_file, worker, 500)
    return JSONResponse({"lines": lines, "processes": list(LOG_SOURCES)})


def schedule_rows(web: Web) -> list[dict]:
    """The schedules as `pulsectl schedule list --json` gives them (pulse.core.schedule.rows), from
    the schedule book's checkpoint: the page and /metrics."""
    from pulse.core import schedule
    if not web.schedules:
        return []
    book = web.read(lambda conn: schedulerun.book_of(conn, web.paths.home))
    return schedule.rows(list(web.schedules), book, time.time())


@page("schedules", order=90)
async def api_schedules(request: Request) -> Response:
    """The [[schedule]]s: their next and last runs, and the run each waits on."""
    return JSONResponse({"schedules": await run_in_threadpool(schedule_rows, request.app.state.web)})


@page("budget", order=100)
async def api_budget(request: Request) -> Response:
    """Each agent's spend and the host's against their limits, as `pulsectl budget --json` gives them."""
    web: Web = request.app.state.web
    return JSONResponse({"rows": await run_in_threadpool(web.read, web.spend_overview),
                         "sessions": await run_in_threadpool(web.read, web.sessions_overview)})


@page("fleet", order=80)
async def api_fleet(request: Request) -> Response:
    """The fleet view the fleet worker writes (pulse.core.fleetnames): every host, up or gone."""
    web: Web = request.app.state.web
    view = await run_in_threadpool(fleetnames.read_judged_view, web.paths.runtime)
    if view is None:
        tasks = await run_in_threadpool(fleet_tasks_of, web.paths)   # offered while NATS is unreachable
        return JSONResponse({"hosts": [], "tasks": tasks, "error": "no fleet view: the fleet worker is off or has not reached NATS "
                             "(pulsectl status says why)"})
    tasks = await run_in_threadpool(fleet_tasks_of, web.paths)
    return JSONResponse({**view, "tasks": tasks})


def fleet_tasks_of(paths: Paths) -> list[dict]:
    """The fleet tasks this host offered or took, for the fleet page (pulse.agents.taskview.fleet_board)."""
    from pulse.agents import tasks, taskview
    conn = connection.open_readonly(paths.events_db)
    try:
        offered = taskview.fleet_views(conn, paths.home / projection.DIRECTORY)
        taken = fleetcursor.taken_tasks(paths.home / fleetnames.CURSOR_FILE)
        states = tasks.load_all(conn, paths.home / projection.DIRECTORY) if taken else {}
    finally:
        conn.close()
    return taskview.fleet_board(offered, taken, states)


async def metrics(request: Request) -> Response:
    web: Web = request.app.state.web

    def scrape() -> bytes:
        counts = web.count()
        host = {k: v.data for k, v in web.read(lambda c: vitalsdb.latest_vitals(c, [HOST]), "vitals").items()}
        return exposition(counts, web.status(), host, web.read(web.spend_overview), schedule_rows(web))
    return Response(await run_in_threadpool(scrape), media_type="text/plain; version=0.0.4; charset=utf-8")


# A vital's fields that are facts, not gauges: the host's CPU count, a process's pid and start time.
NOT_CHARTED = frozenset({"cpus", "pid", "since", "started",
                         "code", "http_status"})    # a status code is a verdict's detail, not a measure


def chart_point(field: str, value: Any) -> float | None:
    """A vital's field as a chart's value, or None when it is not charted: a verdict (`ok`, `dns_ok`)
    is 1 or 0 (a failing probe is seen as a drop, not as a flat 200), a wall time is no measure
    (`dead_since` drew as 1.8e9), nor are counts of things that do not change."""
    if field in NOT_CHARTED or value is None:
        return None
    if isinstance(value, bool):
        return float(value) if field == "ok" or field.endswith("_ok") else None
    if not isinstance(value, (int, float)) or clock.is_wall_time(field, value):
        return None
    return value


def effect_task(effect: enginerpc.Effect) -> str | None:
    """The task an effect works on (an agent-run's params.task_id), for the effects page's link."""
    from pulse.agents.agentrun import run_subject
    if effect.kind != EffectKind.AGENT_RUN:
        return None
    try:
        return run_subject(effect) or None
    except ValueError:
        return None


def staging_differs(web: Web) -> list[str] | None:
    """What a promote would change now (`git diff --name-status` lines of staging against main), or
    None when git cannot say: the page's promote applies only when there is something, and after a
    rollback it says that staging still holds what was rolled back."""
    from pulse.engine import repo
    try:
        return repo.staging_differs(web.paths)
    except repo.EngineDirError:
        return None


async def api_task(request: Request) -> Response:
    from pulse.agents import tasks, taskview
    web: Web = request.app.state.web
    try:
        task = tasks.parse_task_id(request.path_params["id"])
    except ValueError as err:
        return JSONResponse({"error": str(err)}, 404)

    def read(conn):
        view = taskview.task_view(conn, task, web.agents)
        if view is not None:
            view["output_text"] = taskview.output_text(web.paths.objects, taskview.last_output_ref(view))
        return view
    try:
        view = await run_in_threadpool(web.read, read)
    except archive.SegmentError as err:     # its events are in an archive segment that is not sound
        return JSONResponse({"error": f"{task}: {err}; run `pulsectl store check`"}, 500)
    return JSONResponse(view if view is not None else {"error": f"{task}: no such task"}, 200 if view else 404)
