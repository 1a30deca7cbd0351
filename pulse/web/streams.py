"""The page's live streams (server-sent events): the overview, and the events tail woken by each commit."""

from __future__ import annotations

import asyncio
import json

from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from pulse.store import eventsdb
from pulse.web.reads import as_json, event_filters, overview
from pulse.web.site import TAIL_S, Web

LIVE_S = 0.25                     # how often the overview's stream asks pulsed and the stores for news


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
