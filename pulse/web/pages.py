"""The operator's page and /metrics: a Starlette app (the ASGI stack the MCP SDK already brings).

It reads the stores read-only and acts only as pulsectl does: worker restart/stop/start over the
control socket; pause and resume as events; promote and rollback as effects of origin
`operator`. So every action taken from the page is an event like any other. Each page is a
small HTML shell and /static/app.js, which reads /api/…; the overview and the events tail are
live over server-sent events. Every request passes `Guard` (pulse.web.auth) first.

This module holds the HTML pages, the guard and the app; the routes that are not pages live by job:
`reads` (the JSON API, where each page of the nav is declared), `streams` (server-sent events),
`actions` (what pulsectl would do), and what they share in `site`.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from pulse.core import clock
from pulse.core.config import Agent
from pulse.core.home import Paths
from pulse.store import archive, eventsdb
from pulse.web import auth
from pulse.web.actions import act_engine, act_process, act_worker
from pulse.web.reads import api_task, metrics
from pulse.web.site import Page, Web, in_nav_order
from pulse.web.streams import stream_events, stream_overview

# The pages of the nav are declared where their JSON routes are defined (`@page` in pulse.web.reads),
# each with its place in the nav; the nav, each page's route and its /api/<name> are made from those
# rows here, with no line per page. The browser draws every page from JSON, with the one script the
# page's CSP lets run (static/app.js), so a page is its route in reads and its drawing there.


def page_path(name: str) -> str:
    return "/" if name == "overview" else f"/{name}"


def page_paths() -> dict[str, str]:
    """Each page's path, in nav order."""
    return {row.name: page_path(row.name) for row in in_nav_order()}


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


def shell(request: Request, page: str, body: str = "", script: str | None = None, first: Any = None) -> Response:
    """The page's HTML: the nav with `page` current, and `body` (rendered here: the script leaves
    it alone) or an empty main the script fills (`script`: which of its pages, when not `page`).
    `first`: the page's data as its stream or API would give it now, in the page itself, so the
    script draws it at once (a screenshot, a slow link, a stream that is slow to open never show
    "loading…"); the stream then keeps it current."""
    nav = "".join(f'<a href="{page_path(name)}"{" aria-current=page" if name == page else ""}>{name}</a>'
                  for name in page_paths())
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


def page_handler(row: Page):
    async def handler(request: Request) -> Response:
        web: Web = request.app.state.web
        first = await run_in_threadpool(row.first, web, request) if row.first else None
        return shell(request, row.name, first=first)
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


TASK_TARGET = re.compile(r"^task-[1-9][0-9]*$")


async def task_page(request: Request) -> Response:
    return shell(request, "tasks", script="task")


def make_app(paths: Paths, token_file: Path, effect_deadline_s: float, agents: Sequence[Agent] = (),
             budget: Any = None, schedules: Sequence[Any] = (), store: Any = None) -> Any:
    web = Web(paths, token_file, effect_deadline_s)
    web.store = store                # [store]: the history's bounds, said beside its size
    web.agents = list(agents)        # the [[agent]] tables of the web worker's slice: who may take what ...
    web.spend_limits = (list(agents), budget)     # ... their budgets, and the host's [budget]
    web.schedules = list(schedules)
    rows = in_nav_order()
    routes = [Route(page_path(row.name), page_handler(row)) for row in rows]
    routes += [Route(f"/api/{row.name}", row.api, methods=["GET"]) for row in rows if row.api is not None]
    routes += [
        Route("/events/{id}", event_page),
        Route("/tasks/{id}", task_page), Route("/api/tasks/{id}", api_task),
        Route("/static/{name}", static),
        Route("/api/stream/overview", stream_overview),
        Route("/api/stream/events", stream_events),
        Route("/api/workers", act_worker, methods=["POST"]), Route("/api/processes", act_process, methods=["POST"]),
        Route("/api/engine", act_engine, methods=["POST"]),
        Route("/metrics", metrics),
    ]
    app = Starlette(routes=routes)
    app.state.web = web
    return Guard(app, web), web
