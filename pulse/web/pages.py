"""The operator's page and /metrics: a Starlette app (the ASGI stack the MCP SDK already brings).

It reads the stores read-only and acts only as pulsectl does: worker restart/stop/start over the
control socket; pause and resume as events; promote and rollback as effects of origin
`operator`. So every action taken from the page is an event like any other. Each page is a
small HTML shell and /static/app.js, which reads /api/…; the overview and the events tail are
live over server-sent events. Every request passes `Guard` (pulse.web.auth) first.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Sequence

import msgspec
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from pulse.core import client, clock, wire
from pulse.core.config import Agent
from pulse.core.home import Paths
from pulse.core.states import EffectState, TaskStatus
from pulse.store import archive, ballast, connection, effectqueue, eventsdb, projection, retention, vitalsdb
from pulse.store.commitwatch import CommitWatch
from pulse.web import auth, taskboard
from pulse.web.metrics import HOST, HOST_FIELDS, Counts, MetricsFold, effect_why, exposition

PAGES = {"overview": "/", "events": "/events", "vitals": "/vitals", "effects": "/effects", "tasks": "/tasks",
         "engine": "/engine", "gate": "/gate", "log": "/log"}
PAGES["fleet"] = "/fleet"         # the hosts of the fleet ([fleet]), as this host's fleet worker last saw them
PAGES["schedules"] = "/schedules"  # the [[schedule]]s: next and last runs, the run each waits on
PAGES["budget"] = "/budget"        # each agent's spend against its limits, and what waits on them
WINDOWS = {"1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400}
POINTS = 240                      # a chart's points, whatever its window
LIVE_S = 0.25                     # how often the overview's stream asks pulsed and the stores for news
TAIL_S = 1.0                      # the events tail looks at least this often (it wakes on each commit)
EVENTS_PAGE = 100                 # events a page of /events lists; "older" pages back through the rest
ARCHIVE_SEGMENTS_PER_PAGE = 8     # archive segments one page of /events may read: a bounded answer for a rare match
OVERVIEW_VITALS_S = 600           # the overview's charts: the last ten minutes


class Commits:
    """One watch of events.db's commits for every stream of the page (pulse.store.commitwatch), fanned
    out: each client's stream waits on it, none polls on a timer of its own."""

    def __init__(self, db: Path):
        self.db, self.count = db, 0
        self.changed: asyncio.Condition | None = None
        self.task: asyncio.Task | None = None

    async def after(self, seen: int, timeout_s: float) -> int:
        """Once a commit newer than `seen` (a count this returned before) came, or `timeout_s` passed."""
        if self.task is None:       # the first stream starts the one watch, on the server's loop
            self.changed = asyncio.Condition()
            self.task = asyncio.create_task(self.watch())
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: self.count != seen), timeout_s)
            except TimeoutError:
                pass
        return self.count

    async def watch(self) -> None:
        watch = CommitWatch(self.db)
        try:
            while True:
                await watch.wait(TAIL_S)
                async with self.changed:
                    self.count += 1
                    self.changed.notify_all()
        finally:
            watch.close()


class Web:
    """What the routes share: the home, the token file, the metrics' counts."""

    def __init__(self, paths: Paths, token_file: Path, effect_deadline_s: float):
        self.paths, self.token_file = paths, token_file
        self.effect_deadline_s = effect_deadline_s   # from the web worker's slice, never config.toml on disk
        self._token: tuple[float, str] | None = None
        self.counts: Counts | None = None
        self.metrics = MetricsFold(paths.home / projection.DIRECTORY)
        self.counting = threading.Lock()     # one fold at a time: the warm-up, or a scrape
        self.diffs: dict[tuple[str, str], str] = {}   # (before, after) → diff summary: commits never change
        self.agents: list[Agent] = []        # set by make_app
        self.board: Any = None               # the tasks page's Folded projection, made at its first request (task_board)
        self.boarding = threading.Lock()
        self.commits = Commits(paths.events_db)
        self.store: Any = None               # the [store] table (make_app)

    def token(self) -> str:
        """The current token; re-read when the file changes (`pulsectl web rotate-token`)."""
        mtime = self.token_file.stat().st_mtime
        if self._token is None or self._token[0] != mtime:
            self._token = (mtime, self.token_file.read_text().strip())
        return self._token[1]

    def events(self):
        return read_connection(self.paths.events_db)

    def vitals(self):
        return read_connection(self.paths.vitals_db)

    def status(self) -> wire.Status | None:
        try:
            return client.request(self.paths, wire.GetStatus(), 2.0).status
        except client.Unreachable:
            return None

    def count(self) -> Counts:
        """The metrics' counts, caught up with the stores (the first call loads their checkpoint, or
        folds the whole history once when there is none)."""
        with self.counting:
            events, vitals = self.events(), self.vitals()
            try:
                self.counts = self.metrics.catch_up(events, vitals)
            finally:
                events.close()
                vitals.close()
            return self.counts

    def save_checkpoints(self) -> None:
        """Write the counts' and the task board's checkpoints now (a clean stop): the next start folds
        only what comes after."""
        for lock, folded in ((self.counting, lambda: self.metrics.folded), (self.boarding, lambda: self.board)):
            with lock:
                if folded() is None:
                    continue
                events = self.events()
                try:
                    folded().conn = events
                    folded().save()
                finally:
                    events.close()

    def task_board(self, conn):
        """The tasks page's fold (pulse.web.taskboard), caught up on `conn`: at the first request from
        its checkpoint, then by what is new; a copy to read outside the lock."""
        with self.boarding:
            if self.board is None:
                self.board = projection.Folded(taskboard.PROJECTION, conn, self.paths.home / projection.DIRECTORY)
            return taskboard.view(self.board.catch_up(conn))

    spend_limits: tuple[list, Any] = ([], None)
    schedules: Sequence[Any] = ()

    def spend_overview(self, conn) -> list[dict]:
        """Each agent's spend and the host's against their limits (pulse.agents.spend), for /metrics."""
        from pulse.agents import spend
        from pulse.core import clock
        from pulse.core.config import SpendLimits
        agents, host = self.spend_limits
        now = clock.now()
        return spend.overview(spend.load(conn, now), agents, host or SpendLimits(), now)

    def sessions_overview(self, conn) -> list[dict]:
        """What sessions Pulse did not start spent (pulse.agents.spend.sessions_overview)."""
        from pulse.agents import spend
        from pulse.core import clock
        now = clock.now()
        return spend.sessions_overview(spend.load(conn, now), now)

    def read(self, what: Callable[[Any], Any], store: str = "events") -> Any:
        conn = self.events() if store == "events" else self.vitals()
        try:
            return what(conn)
        finally:
            conn.close()


# -- the web worker's memory ----------------------------------------------------------------------

# Each request opens its own read-only connection, in one of the server's threads; SQLite's page cache
# (2 MiB by default) is filled as a read goes and freed when the connection closes, but into that thread's
# malloc arena, which keeps it. With the default cache the web worker kept ~2.5 MiB per thread that had read
# much, more as the history grew until the cache was full. A request here reads one indexed range (the OS
# page cache keeps the file warm), so a small cache costs no speed and bounds what a thread can keep.
READ_CACHE_KIB = 512


def read_connection(path: Path):
    """A read-only connection (pulse.store.connection.open_readonly) with a page cache of READ_CACHE_KIB."""
    conn = connection.open_readonly(path)
    conn.execute(f"PRAGMA cache_size = -{READ_CACHE_KIB}")
    return conn


# -- the guard ----------------------------------------------------------------------------------------

class Guard:
    """ASGI middleware: 401 without a session cookie or the bearer token; a POST also needs the
    session's CSRF token and its own Origin. `/?token=` opens a session."""

    def __init__(self, app, web: Web):
        self.app, self.web = app, web

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        token = self.web.token()
        given = request.query_params.get("token")
        if given is not None and request.method == "GET":
            if not auth.token_ok(token, given):
                return await PlainTextResponse("wrong token\n", 401)(scope, receive, send)
            rest = request.url.remove_query_params("token")
            response = RedirectResponse(rest.path + (f"?{rest.query}" if rest.query else ""), 303)
            response.set_cookie(auth.COOKIE, auth.new_session(token), httponly=True, samesite="strict",
                                secure=request.url.scheme == "https", path="/")
            return await response(scope, receive, send)
        cookie = request.cookies.get(auth.COOKIE)
        nonce = auth.session_nonce(token, cookie)
        if nonce is None and not auth.bearer_ok(token, request.headers.get("authorization")):
            return await PlainTextResponse("401: open the address `pulsectl web url` prints\n", 401)(scope, receive, send)
        if request.method not in ("GET", "HEAD"):
            refused = auth.post_refusal(token, request.headers, cookie, own_origin(request))
            if refused is not None:
                return await JSONResponse({"ok": False, "error": refused}, 403)(scope, receive, send)
        scope.setdefault("state", {})["csrf"] = auth.csrf_token(token, nonce) if nonce else ""
        return await self.app(scope, receive, send)


def own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.headers.get('host', '')}"


# -- pages ----------------------------------------------------------------------------------------------

def shell(request: Request, page: str, body: str = "", script: str | None = None, first: Any = None) -> Response:
    """The page's HTML: the nav with `page` current, and `body` (rendered here: the script leaves
    it alone) or an empty main the script fills (`script`: which of its pages, when not `page`).
    `first`: the page's data as its stream or API would give it now, in the page itself, so the
    script draws it at once (a screenshot, a slow link, a stream that is slow to open never show
    "loading…"); the stream then keeps it current."""
    nav = "".join(f'<a href="{href}"{" aria-current=page" if name == page else ""}>{name}</a>'
                  for name, href in PAGES.items())
    csrf = html.escape(request.scope.get("state", {}).get("csrf", ""))
    text = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf" content="{csrf}"><link rel="icon" href="data:,"><title>Pulse · {page}</title>
<link rel="stylesheet" href="/static/app.css"></head>
<body data-page="{script or (page if not body else 'static')}"><header><strong>Pulse</strong><nav>{nav}</nav>
<span id="said" class="muted" role="status" aria-live="polite"></span>
<button id="theme" type="button" aria-label="switch between dark and light">◐</button></header>
<main>{body or '<p class="muted">loading…</p>'}</main>{first_data(first)}
<script src="/static/app.js" defer></script></body></html>"""
    return Response(text, media_type="text/html", headers={"Cache-Control": "no-store",
                    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'"})


def first_data(first: Any) -> str:
    """`first` as an inert JSON block (never run: the page's CSP runs scripts from /static only);
    `<` escaped, so no text in it can close the block."""
    if first is None:
        return ""
    text = json.dumps(first, default=str, sort_keys=True).replace("<", "\\u003c")
    return f'\n<script type="application/json" id="first">{text}</script>'


def page(name: str):
    async def handler(request: Request) -> Response:
        web: Web = request.app.state.web
        first = None
        if name == "overview":
            first = await run_in_threadpool(overview, web)
        elif name == "events":
            first = await run_in_threadpool(events_view, web, request)
        return shell(request, name, first=first)
    return handler


async def event_page(request: Request) -> Response:
    web: Web = request.app.state.web
    try:
        wanted = int(request.path_params["id"])
        ev = await run_in_threadpool(web.read, lambda c: eventsdb.event_by_id(c, wanted) or archive.event_by_id(c, wanted))
    except ValueError:
        ev = None
    except archive.SegmentError as err:
        return shell(request, "events", f'<section><h2>Event unreadable</h2><p>{html.escape(str(err))}; run '
                                        '<code>pulsectl store check</code></p></section>')
    if ev is None:
        return shell(request, "events", '<section><h2>No such event</h2></section>')
    # the time as a <time> the script shows in the page's one format; a task's id links to its page
    cells = {"id": html.escape(str(ev.id)), "when": f'<time data-ts="{ev.ts}">{clock.iso(ev.ts)}</time>',
             "type": html.escape(ev.type), "source": html.escape(ev.source),
             "target": (f'<a href="/tasks/{html.escape(ev.target)}">{html.escape(ev.target)}</a>'
                        if ev.target and TASK_TARGET.match(ev.target) else html.escape(ev.target or "-"))}
    rows = "".join(f"<tr><th scope=row>{k}</th><td class=wrap>{v}</td></tr>" for k, v in cells.items())
    body = (f'<section data-event="{ev.id}"><h2>Event {ev.id}</h2><table>{rows}</table>'
            f'<pre>{html.escape(json.dumps(clock.readable_times(ev.data), indent=2, sort_keys=True))}</pre></section>')
    return shell(request, "events", body)


async def static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in ("app.js", "app.css"):
        return PlainTextResponse("not found\n", 404)
    text = (resources.files("pulse.web") / "static" / name).read_text()
    return Response(text, media_type="text/javascript" if name.endswith(".js") else "text/css")


# -- reads ------------------------------------------------------------------------------------------------

def status_dict(status: wire.Status | None) -> dict | None:
    return msgspec.to_builtins(status) if status is not None else None


def host_series(conn, since: float, bucket_s: float) -> dict[str, list]:
    samples = vitalsdb.vitals_buckets(conn, HOST, since, bucket_s)
    return {f.removesuffix("_pct"): [[ts, d[f]] for ts, d in samples if isinstance(d.get(f), (int, float))]
            for f in HOST_FIELDS}


def process_cards(web: Web, status: wire.Status | None) -> dict[str, dict]:
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
        promotes = eventsdb.last_events(conn, 1, ["promote"])
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
    view["history"] = web.read(lambda c: retention.summary_words(retention.summary(c, web.store)))
    return view


async def stream_overview(request: Request):
    web: Web = request.app.state.web

    async def updates():
        last = None
        while not await request.is_disconnected():
            view = await run_in_threadpool(overview, web)
            text = json.dumps(view, default=str, sort_keys=True)
            if text != last:
                yield {"data": text}
                last = text
            await asyncio.sleep(LIVE_S)
    return EventSourceResponse(updates(), ping=15)


def event_filters(request: Request) -> dict:
    q = request.query_params
    since_ts = clock.parse_since(q["since"]) if q.get("since") else None
    return {"types": [q["type"]] if q.get("type") else [], "source": q.get("source") or None,
            "target": q.get("target") or None, "since_ts": since_ts, "text": q.get("q") or None}


def page_of(request: Request) -> int | None:
    """The `before` of a page further back in /events (the oldest id of the page before it)."""
    raw = request.query_params.get("before")
    return int(raw) if raw and raw.isdigit() else None


def as_json(ev: wire.Event) -> dict:
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
        view = {"events": [as_json(e) for e in shown], "types": sorted(wire.EVENT_TYPES),
                "last_id": eventsdb.last_event_id(conn), "before": before,
                "older": shown[-1].id if len(found) > EVENTS_PAGE else resume}
        return {**view, "error": error} if error else view
    return web.read(read)


async def api_events(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(events_view, request.app.state.web, request))


async def stream_events(request: Request):
    web: Web = request.app.state.web
    filters = event_filters(request)
    after = int(request.query_params.get("after") or 0)

    async def updates():
        nonlocal after
        seen = web.commits.count
        while not await request.is_disconnected():
            def read(conn):
                last = eventsdb.last_event_id(conn)          # first: what commits meanwhile waits for the next look
                return last, [e for e in eventsdb.search_events(conn, **filters, after_id=after, limit=500) if e.id <= last]
            last, found = await run_in_threadpool(web.read, read)
            if found:
                yield {"data": json.dumps([as_json(e) for e in reversed(found)], default=str)}
            after = last
            seen = await web.commits.after(seen, TAIL_S)
    return EventSourceResponse(updates(), ping=15)


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


def task_routing(web: Web, conn, task: wire.TaskState) -> dict:
    """Who may take a task, and why a pending one waits (pulse.agents.taskview.waiting)."""
    from pulse.agents import taskview
    return {"pin": task.pin, "tags": task.tags, "waiting": taskview.waiting(conn, web.agents, task)}


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
        history = eventsdb.last_events(conn, 100, wire.TASK_EVENTS)
        return {"by_status": by_status, "counts": board.counts, "shown_ended": taskboard.SHOWN_ENDED, "agents": agents,
                "history": [as_json(e) for e in reversed(history)]}
    return JSONResponse(await run_in_threadpool(web.read, read))


async def api_engine(request: Request) -> Response:
    web: Web = request.app.state.web
    status = await run_in_threadpool(web.status)
    history = await run_in_threadpool(web.read, lambda c: eventsdb.last_events(c, 100, ["promote", "rollback"]))

    def summarise(ev: wire.Event) -> dict:
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


async def api_gate(request: Request) -> Response:
    from pulse.gate.durable import DurableStore
    web: Web = request.app.state.web

    def read(conn):
        store = DurableStore(conn, "web", checkpoints=web.paths.home / projection.DIRECTORY)
        ledger = store.catch_up()                      # reads only: never settles or writes
        sessions = [ledger.summary(s) for s in sorted(ledger.sessions, key=lambda s: -ledger.sessions[s].last)]
        blocked = reversed(eventsdb.last_events(conn, 100, ["gate-blocked"]))
        return {"sessions": sessions[:200], "blocked": [as_json(e) for e in blocked]}
    return JSONResponse(await run_in_threadpool(web.read, read))


async def api_log(request: Request) -> Response:
    from pulse.core.childspecs import LOG_SOURCES
    from pulse.core.logs import tail
    web: Web = request.app.state.web
    worker = request.query_params.get("worker") or None
    lines = await run_in_threadpool(tail, web.paths.log_file, worker, 500)
    return JSONResponse({"lines": lines, "processes": list(LOG_SOURCES)})


# -- actions: what pulsectl would do ----------------------------------------------------------------------

WORKER_ACTIONS = {"restart": wire.RestartWorker, "stop": wire.StopWorker, "start": wire.StartWorker}


async def body(request: Request) -> dict:
    try:
        data = await request.json()
    except ValueError:
        data = None
    return data if isinstance(data, dict) else {}


async def act_worker(request: Request) -> Response:
    web: Web = request.app.state.web
    data = await body(request)
    action, worker = data.get("action"), data.get("worker")
    if action not in WORKER_ACTIONS or not isinstance(worker, str):
        return JSONResponse({"ok": False, "error": f"action must be one of {sorted(WORKER_ACTIONS)}, with a worker"}, 400)
    if (action, worker) == ("stop", "web"):
        return JSONResponse({"ok": False, "error": OWN_STOP}, 409)
    try:
        reply = await run_in_threadpool(client.request, web.paths, WORKER_ACTIONS[action](worker), 5.0)
    except client.Unreachable as err:
        return JSONResponse({"ok": False, "error": str(err)}, 503)
    return JSONResponse({"ok": reply.ok, "message": reply.message, "error": reply.error}, 200 if reply.ok else 409)


async def act_process(request: Request) -> Response:
    web: Web = request.app.state.web
    data = await body(request)
    action, process = data.get("action"), data.get("process")
    if action not in ("pause", "resume", *PROCESS_VERBS) or not isinstance(process, str):
        return JSONResponse({"ok": False, "error": "action must be pause, resume, restart, stop or start, "
                                                   "with a process"}, 400)
    status = await run_in_threadpool(web.status)
    if status is None or process not in {p.name for p in status.processes}:
        return JSONResponse({"ok": False, "error": f"no critical process {process!r}"}, 404)
    if action in PROCESS_VERBS:
        return await steer_process(web, process, PROCESS_VERBS[action])
    extra = {}
    if action == "pause":
        seconds = clock.parse_duration(str(data.get("for") or "30m"))
        if seconds is None:
            return JSONResponse({"ok": False, "error": f"{data.get('for')!r} is not a duration like 30m"}, 400)
        extra["until"] = time.time() + seconds

    def append():
        conn = eventsdb.open_events(web.paths.events_db)
        try:
            eventsdb.append_events(conn, [wire.now_event(action, "web", process, **extra)])
        finally:
            conn.close()
        client.ring(web.paths, "wake", wire.Wake("web", action))
    await run_in_threadpool(append)
    until = f" until {clock.iso(extra['until'], ms=False)}" if extra else ""
    return JSONResponse({"ok": True, "message": f"{process} {action}d{until}"})


PROCESS_VERBS = {"restart": wire.ProcessAction.RESTART, "stop": wire.ProcessAction.STOP,
                 "start": wire.ProcessAction.START}


async def steer_process(web: Web, process: str, action: wire.ProcessAction) -> Response:
    """As `pulsectl process restart|stop|start`: the operator event and its effect, committed
    together; the outcome is an event (the page shows the process's last action)."""
    def commit():
        conn = eventsdb.open_events(web.paths.events_db)
        try:
            effect = effectqueue.commit_process_action(conn, process, action, web.effect_deadline_s, "web")
        finally:
            conn.close()
        client.ring(web.paths, "wake", wire.Wake("web", action))
        client.ring(web.paths, "doorbell", wire.Doorbell("web"))
        return effect.id
    effect_id = await run_in_threadpool(commit)
    return JSONResponse({"ok": True, "message": f"{process}: {action} queued (effect {effect_id[:12]})"})


async def act_engine(request: Request) -> Response:
    web: Web = request.app.state.web
    action = (await body(request)).get("action")
    kinds = {"promote": ("engine-promote", {"by": "web"}), "rollback": ("engine-rollback", {"reason": "from the web page"})}
    if action not in kinds:
        return JSONResponse({"ok": False, "error": "action must be promote or rollback"}, 400)
    kind, params = kinds[action]

    def commit():
        conn = eventsdb.open_events(web.paths.events_db)
        try:
            effect = effectqueue.new_effect(wire.Effect(kind=kind, target="engine", params=params), "operator",
                                   web.effect_deadline_s)
            effectqueue.commit_effects(conn, [effect], "web")
        finally:
            conn.close()
        client.ring(web.paths, "doorbell", wire.Doorbell("web"))
        return effect.id
    effect_id = await run_in_threadpool(commit)
    return JSONResponse({"ok": True, "message": f"{action} queued (effect {effect_id[:12]}); its outcome is an event"})


def schedule_rows(web: Web) -> list[dict]:
    """The schedules as `pulsectl schedule list --json` gives them (pulse.core.schedule.rows), from
    the schedule book's checkpoint: the page and /metrics."""
    from pulse.core import schedule
    from pulse.store import schedulerun
    if not web.schedules:
        return []
    book = web.read(lambda conn: schedulerun.book_of(conn, web.paths.home))
    return schedule.rows(list(web.schedules), book, time.time())


async def api_schedules(request: Request) -> Response:
    return JSONResponse({"schedules": await run_in_threadpool(schedule_rows, request.app.state.web)})


async def api_budget(request: Request) -> Response:
    """Each agent's spend and the host's against their limits, as `pulsectl budget --json` gives them."""
    web: Web = request.app.state.web
    return JSONResponse({"rows": await run_in_threadpool(web.read, web.spend_overview),
                         "sessions": await run_in_threadpool(web.read, web.sessions_overview)})


# -- metrics ------------------------------------------------------------------------------------------------

async def api_fleet(request: Request) -> Response:
    """The fleet view the fleet worker writes (pulse.core.fleetnames): every host, up or gone."""
    from pulse.core import fleetnames
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
    from pulse.core import fleetnames
    from pulse.store import fleetcursor
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


# -- the task page: one task as `pulsectl task show` tells it -------------------------------------

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
OWN_STOP = ("the page cannot stop the web worker that serves it (it would go dark and never come back); "
            "run `pulsectl stop web` on the host")


def effect_task(effect: wire.Effect) -> str | None:
    """The task an effect works on (an agent-run's params.task_id), for the effects page's link."""
    from pulse.agents.agentrun import run_subject
    if effect.kind != "agent-run":
        return None
    try:
        return run_subject(effect) or None
    except ValueError:
        return None


TASK_TARGET = re.compile(r"^task-[1-9][0-9]*$")
def staging_differs(web: Web) -> list[str] | None:
    """What a promote would change now (`git diff --name-status` lines of staging against main), or
    None when git cannot say: the page's promote applies only when there is something, and after a
    rollback it says that staging still holds what was rolled back."""
    from pulse.engine import repo
    try:
        return repo.staging_differs(web.paths)
    except repo.EngineDirError:
        return None


async def task_page(request: Request) -> Response:
    return shell(request, "tasks", script="task")


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


def make_app(paths: Paths, token_file: Path, effect_deadline_s: float, agents: Sequence[Agent] = (),
             budget: Any = None, schedules: Sequence[Any] = (), store: Any = None) -> Any:
    web = Web(paths, token_file, effect_deadline_s)
    web.store = store                # [store]: the history's bounds, said beside its size
    web.agents = list(agents)        # the [[agent]] tables of the web worker's slice: who may take what ...
    web.spend_limits = (list(agents), budget)     # ... their budgets, and the host's [budget]
    web.schedules = list(schedules)
    routes = [Route(path, page(name)) for name, path in PAGES.items()]
    routes += [
        Route("/events/{id}", event_page),
        Route("/tasks/{id}", task_page), Route("/api/tasks/{id}", api_task),
        Route("/static/{name}", static),
        Route("/api/stream/overview", stream_overview),
        Route("/api/stream/events", stream_events),
        Route("/api/events", api_events), Route("/api/vitals", api_vitals), Route("/api/effects", api_effects),
        Route("/api/tasks", api_tasks), Route("/api/engine", api_engine, methods=["GET"]),
        Route("/api/gate", api_gate), Route("/api/log", api_log),
        Route("/api/workers", act_worker, methods=["POST"]), Route("/api/processes", act_process, methods=["POST"]),
        Route("/api/engine", act_engine, methods=["POST"]),
        Route("/metrics", metrics),
        Route("/api/fleet", api_fleet),
        Route("/api/schedules", api_schedules), Route("/api/budget", api_budget),
    ]
    app = Starlette(routes=routes)
    app.state.web = web
    return Guard(app, web), web

