"""Control requests, one handler each. Handlers act and reply at once; clients
that want to see the outcome (pulsectl restart/stop/start) poll status."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from pulse.core.childspecs import CHILD_SPECS, ENGINE
from pulse.core.config import without_secrets
from pulse.core.wire import controlmsgs
from pulse.core.wire.eventmsgs import EventType

from .child import how_to_enable

if TYPE_CHECKING:
    from .arbiter import Arbiter


def _worker(arbiter: "Arbiter", name: str):
    listed = arbiter.listed()
    if name not in listed:
        spec = CHILD_SPECS.get(name)
        off = spec is not None and spec.listed and spec.enabled_by is not None
        hint = f" (enable it: {how_to_enable(spec)}, then reload)" if off else ""
        return None, controlmsgs.Reply(ok=False, error=f"no worker named {name!r}{hint}; workers: {', '.join(listed)}")
    return arbiter.children[name], None


def handle(arbiter: "Arbiter", request) -> controlmsgs.Reply:
    if isinstance(request, controlmsgs.GetStatus):
        return controlmsgs.Reply(ok=True, status=arbiter.status(), engine_commit=arbiter.children[ENGINE].commit,
                          events_recorded=arbiter.events.seq, events_written=arbiter.events.written,
                          store=msgspec.to_builtins(arbiter.config.store))
    if isinstance(request, controlmsgs.GetConfig):
        return controlmsgs.Reply(ok=True, config=msgspec.to_builtins(without_secrets(arbiter.config)))
    if isinstance(request, controlmsgs.Reload):
        ok, message = arbiter.reload()
        return controlmsgs.Reply(ok=ok, message=message if ok else None, error=None if ok else message,
                          reload=arbiter.last_reload if ok else None)
    if isinstance(request, controlmsgs.Shutdown):
        arbiter.begin_shutdown(0, "pulsectl stop")
        return controlmsgs.Reply(ok=True, message="stopping")
    if arbiter.shutting_down:
        return controlmsgs.Reply(ok=False, error="pulsed is stopping")
    child, error = _worker(arbiter, request.name)
    if error:
        return error
    actions = {controlmsgs.RestartWorker: ("restart", "restarting", arbiter.operator_restart),
               controlmsgs.StopWorker: ("stop", "stopping", arbiter.operator_stop),
               controlmsgs.StartWorker: ("start", "starting", arbiter.operator_start)}
    if type(request) not in actions:
        return controlmsgs.Reply(ok=False, error=f"unknown request {type(request).__name__}")
    action, doing, act = actions[type(request)]
    arbiter.record(EventType.OPERATOR, child.name, action=action, state=str(child.state))
    act(child)
    return controlmsgs.Reply(ok=True, message=f"{doing} {child.name}")
