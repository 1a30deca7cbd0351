"""Control requests, one handler each. Handlers act and reply at once; clients
that want to see the outcome (pulsectl restart/stop/start) poll status."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pulse.core import wire
from pulse.core.states import WORKERS

if TYPE_CHECKING:
    from .arbiter import Arbiter


def _worker(arbiter: "Arbiter", name: str):
    if name not in WORKERS:
        return None, wire.Reply(ok=False, error=f"no worker named {name!r}; workers: {', '.join(WORKERS)}")
    return arbiter.children[name], None


def handle(arbiter: "Arbiter", request) -> wire.Reply:
    if isinstance(request, wire.GetStatus):
        return wire.Reply(ok=True, status=arbiter.status(), engine_commit=arbiter.children["engine"].commit,
                          events_recorded=arbiter.events.seq, events_written=arbiter.events.written)
    if isinstance(request, wire.Reload):
        ok, message = arbiter.reload()
        return wire.Reply(ok=ok, message=message if ok else None, error=None if ok else message)
    if isinstance(request, wire.Shutdown):
        arbiter.begin_shutdown(0, "pulsectl stop")
        return wire.Reply(ok=True, message="stopping")
    if arbiter.shutting_down:
        return wire.Reply(ok=False, error="pulsed is stopping")
    child, error = _worker(arbiter, request.name)
    if error:
        return error
    if isinstance(request, wire.RestartWorker):
        arbiter.operator_restart(child)
        return wire.Reply(ok=True, message=f"restarting {child.name}")
    if isinstance(request, wire.StopWorker):
        arbiter.operator_stop(child)
        return wire.Reply(ok=True, message=f"stopping {child.name}")
    if isinstance(request, wire.StartWorker):
        arbiter.operator_start(child)
        return wire.Reply(ok=True, message=f"starting {child.name}")
    return wire.Reply(ok=False, error=f"unknown request {type(request).__name__}")
