"""The page's actions, each as pulsectl would take it: worker restart/stop/start over the control
socket; pause and resume as events; a [[process]]'s restart/stop/start, promote and rollback as
effects of origin `operator`. So every action taken from the page is an event like any other."""

from __future__ import annotations

import time

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from pulse.core import client, clock
from pulse.core.wire import controlmsgs, doorbells, enginerpc, eventmsgs
from pulse.core.wire.eventmsgs import EffectKind, EventType
from pulse.store import effectqueue, eventsdb
from pulse.web.site import Web

WORKER_ACTIONS = {"restart": controlmsgs.RestartWorker, "stop": controlmsgs.StopWorker, "start": controlmsgs.StartWorker}


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
            eventsdb.append_events(conn, [eventmsgs.now_event(EventType(action), "web", process, **extra)])
        finally:
            conn.close()
        client.ring(web.paths, "wake", doorbells.Wake("web", action))
    await run_in_threadpool(append)
    until = f" until {clock.iso(extra['until'], ms=False)}" if extra else ""
    return JSONResponse({"ok": True, "message": f"{process} {action}d{until}"})


PROCESS_VERBS = {"restart": eventmsgs.ProcessAction.RESTART, "stop": eventmsgs.ProcessAction.STOP,
                 "start": eventmsgs.ProcessAction.START}


async def steer_process(web: Web, process: str, action: eventmsgs.ProcessAction) -> Response:
    """As `pulsectl process restart|stop|start`: the operator event and its effect, committed
    together; the outcome is an event (the page shows the process's last action)."""
    def commit():
        conn = eventsdb.open_events(web.paths.events_db)
        try:
            effect = effectqueue.commit_process_action(conn, process, action, web.effect_deadline_s, "web")
        finally:
            conn.close()
        client.ring(web.paths, "wake", doorbells.Wake("web", action))
        client.ring(web.paths, "doorbell", doorbells.Doorbell("web"))
        return effect.id
    effect_id = await run_in_threadpool(commit)
    return JSONResponse({"ok": True, "message": f"{process}: {action} queued (effect {effect_id[:12]})"})


async def act_engine(request: Request) -> Response:
    web: Web = request.app.state.web
    action = (await body(request)).get("action")
    kinds = {"promote": (EffectKind.ENGINE_PROMOTE, {"by": "web"}),
             "rollback": (EffectKind.ENGINE_ROLLBACK, {"reason": "from the web page"})}
    if action not in kinds:
        return JSONResponse({"ok": False, "error": "action must be promote or rollback"}, 400)
    kind, params = kinds[action]

    def commit():
        conn = eventsdb.open_events(web.paths.events_db)
        try:
            effect = effectqueue.new_effect(enginerpc.Effect(kind=kind, target="engine", params=params), "operator",
                                   web.effect_deadline_s)
            effectqueue.commit_effects(conn, [effect], "web")
        finally:
            conn.close()
        client.ring(web.paths, "doorbell", doorbells.Doorbell("web"))
        return effect.id
    effect_id = await run_in_threadpool(commit)
    return JSONResponse({"ok": True, "message": f"{action} queued (effect {effect_id[:12]}); its outcome is an event"})


OWN_STOP = ("the page cannot stop the web worker that serves it (it would go dark and never come back); "
            "run `pulsectl stop web` on the host")
