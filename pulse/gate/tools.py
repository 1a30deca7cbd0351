"""Pulse's tools for an agent, every call through the gate: what `pulsectl mcp` offers, run inside Pulse.

Three layers, each usable without the one above it:

- `PulseTools`: what each tool does (pulse.gate.catalogue.TOOLS says what kind it is). Reads look at
  events.db, vitals.db, pulse.log and pulsed's status; writes commit an effect with origin
  `agent` (the executor checks it against [allow]), ring the executor, and return only once
  the effect has its terminal event. create_task writes Pulse's own state (a task-created
  event) and reads it back, so it verifies itself.
- `ToolSession`: one session of an agent (and task). Each call goes GateSession.begin → the tool →
  GateSession.end, each step decided and committed to events.db in one transaction by the gate's
  durable store (pulse.gate.durable; source "mcp", target the session id), so the gate
  holds across sessions and restarts. `finish` asks the gate whether the session may end.
- the MCP server is not here: `pulsectl mcp` is a thin proxy (pulse.gate.proxy) to the
  gate's socket (pulse.gate.server), which runs these sessions inside Pulse.

SQLite is used from the event loop's thread only (short statements); blocking waits on
pulsed or psutil run in worker threads; waiting for an effect polls with async sleeps, so
calls in flight at once really are concurrent (the gate's batch rule sees them together).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import time
import uuid
from typing import Any, Awaitable, Callable, Mapping

import msgspec

from pulse.agents import taskpolicy, tasks
from pulse.core import client, clock
from pulse.core.client import daemon_pid
from pulse.core.config import Allow, Config
from pulse.core.config import Gate as GateLimits
from pulse.core.home import Paths
from pulse.core.logs import tail
from pulse.core.states import EFFECT_OPEN, EffectState
from pulse.core.wire import controlmsgs, doorbells, enginerpc, eventmsgs
from pulse.core.wire.eventmsgs import EffectKind, EventType
from pulse.effects import registry
from pulse.effects.kinds import find_processes
from pulse.gate import catalogue, policy
from pulse.gate.durable import DurableStore, stamp
from pulse.gate.protocol import ToolError
from pulse.store import connection, effectqueue, eventsdb, projection, vitalsdb

NOT_RUN_REASONS = ("not-allowed", "deadline")   # an effect that ended with these never touched the host
# The tool stopped waiting, the effect did not: its write is not ended by the session but settled by
# the effect's outcome (pulse.gate.durable), so it holds its resource exactly as long as it runs.
STILL_RUNNING = "STILL_RUNNING"
POLL_S = 0.02
LIST_LIMIT = 200
# The effect kind each write tool commits, said once: the tool commits it, and is offered only when
# [allow] lets it run. emit_effect's is the agent's to choose (checked when it runs).
TOOL_KINDS = {"restart_process": EffectKind.RESTART_PROCESS, "signal_process": EffectKind.SIGNAL,
              "restart_worker": EffectKind.RESTART_WORKER, "promote": EffectKind.ENGINE_PROMOTE,
              "rollback": EffectKind.ENGINE_ROLLBACK, "create_task": EffectKind.TASK_ADD}


Operator = Callable[[str], Awaitable[str]]   # asks a person a question, returns the answer
# The gate's fact naming the effect a write commits, written in the effect's own transaction.
ACTING: contextvars.ContextVar[Callable[[str], eventmsgs.Event] | None] = contextvars.ContextVar("acting", default=None)
# Who the call is (agent, task), as the gate decided it: what an effect that speaks for its sender carries.
ACTOR: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar("actor", default=(policy.OPERATOR_SHELL, ""))


# -- arguments ---------------------------------------------------------------------------------------------
# Each tool's arguments are declared once, in its gate descriptor (policy.Arg). The gate classified
# unknown arguments as writes before a tool ever runs; the tools still refuse them (INVALID_INPUT).

FINISH_PARAMS = {"summary": policy.Arg("string", "What was done and how it was verified.", required=True)}
_JSON_TYPES = {"string": str, "integer": int, "object": dict, "boolean": bool}


PREVIEW_CHARS = 200
TOOL_NAME_BYTES = 64       # a longer tool name is none of ours: it is recorded as its head and a hash


def bounded_tool_name(name: Any) -> str:
    """The tool name as the gate records it: Pulse's own names are short; any other is cut to its
    first characters and a hash of the whole, so a 4 MB name costs events.db a few dozen bytes."""
    name = name if isinstance(name, str) else repr(name)
    if len(name.encode()) <= TOOL_NAME_BYTES:
        return name
    return f"{name[:24]}…#{hashlib.sha256(name.encode(errors='replace')).hexdigest()[:16]}"


def oversized(args: Any, limits: GateLimits) -> str | None:
    """Why a call's arguments are too large ([gate] in config.toml), or None."""
    size = len(json.dumps(args, default=str).encode())
    if size > limits.max_call_bytes:
        return f"the arguments are {size} bytes; at most {limits.max_call_bytes} in one call"
    stack = [args]
    while stack:
        value = stack.pop()
        if isinstance(value, str) and len(value.encode()) > limits.max_string_bytes:
            return f"a string argument is {len(value.encode())} bytes; at most {limits.max_string_bytes}"
        if isinstance(value, dict):
            stack += [*value.keys(), *value.values()]
        elif isinstance(value, (list, tuple)):
            stack += list(value)
    return None


def checked_args(tool: str, args: dict, params: Mapping[str, policy.Arg]) -> dict:
    """The arguments, or ToolError INVALID_INPUT naming what is wrong."""
    unknown = sorted(set(args) - set(params))
    if unknown:
        raise ToolError("INVALID_INPUT", f"{tool} takes no argument {', '.join(unknown)}")
    for name, (type_, _, required) in params.items():
        value = args.get(name)
        if value is None:
            if required:
                raise ToolError("INVALID_INPUT", f"{tool} needs {name}")
            continue
        if not isinstance(value, _JSON_TYPES[type_]) or (type_ == "integer" and isinstance(value, bool)):
            raise ToolError("INVALID_INPUT", f"{tool}: {name} must be a {type_}")
    return args


def input_schema(params: Mapping[str, policy.Arg]) -> dict:
    """The MCP input schema, generated from the gate's declaration."""
    return {"type": "object",
            "properties": {n: {"type": a.type, "description": a.description} for n, a in params.items()},
            "required": [n for n, a in params.items() if a.required]}


def tool_description(d: policy.Descriptor) -> str:
    """What the model reads: what the tool does, its kind, and for a write what verifies it."""
    text = f"{d.description} [{d.kind}]"
    if d.kind == policy.CallKind.WRITE:
        text += f" Verified by: {d.verified_by}."
    return text


FINISH_DESCRIPTION = ("Say the session's work is done. Refused (UNVERIFIED_WRITE) while a write has not been "
                      "verified.")


# -- the tools ---------------------------------------------------------------------------------------------

class PulseTools:
    """Every tool of catalogue.TOOLS, on one Pulse home. `run(name, args)` → the result dict, or ToolError."""

    def __init__(self, paths: Paths, config: Config, events, to_thread: Callable[..., Awaitable[Any]],
                 sleep: Callable[[float], Awaitable[None]]):
        self.paths, self.config, self.events = paths, config, events
        self.tasks = None          # the projection of every task (pulse.agents.tasks.all_tasks), at first use
        self.to_thread, self.sleep = to_thread, sleep     # anyio's, passed in: this module imports no async lib

    async def run(self, name: str, args: dict, operator: Operator | None = None,
                  acting: Callable[[str], eventmsgs.Event] | None = None, actor: tuple[str, str] | None = None) -> dict:
        """`operator`: how the transport reaches a person for ask_operator, if it can. `acting`: the
        gate's fact to commit with a write's effect (which effect this call's write is). `actor`: the
        (agent, task) the gate says the caller is."""
        method = getattr(self, f"tool_{name}", None)
        if name not in catalogue.TOOLS or method is None:
            raise ToolError("NOT_FOUND", f"no tool {name!r}")
        args = checked_args(name, args, catalogue.TOOLS[name].params)
        token = ACTING.set(acting)      # per task: calls in flight at once each keep their own
        who = ACTOR.set(actor or ACTOR.get())
        try:
            return await (method(operator=operator, **args) if name == "ask_operator" else method(**args))
        finally:
            ACTOR.reset(who)
            ACTING.reset(token)

    # -- resolve --------------------------------------------------------------------------

    async def tool_find_process(self, name: str) -> dict:
        process = next((p for p in self.config.process if p.name == name), None)
        if process is None:
            raise ToolError("NOT_FOUND", f"{name!r} is not a configured [[process]]",
                            configured=[p.name for p in self.config.process])
        found = await self.to_thread(find_processes, process)
        return {"name": name, "alive": bool(found), "checked_at": time.time(),
                "processes": [{"pid": p.pid, "cmdline": _cmdline(p), "started": _create_time(p)} for p in found],
                "found_by": f"pidfile {process.pidfile}" if process.pidfile else f"match {process.match!r}"}

    async def tool_list_workers(self) -> dict:
        status = await self._status()
        return {"workers": status["workers"], "checked_at": time.time()}

    async def tool_list_tasks(self, status: str | None = None) -> dict:
        everything = self._all_tasks()
        agent, task = ACTOR.get()
        if task:        # a run sees its own tasks only (pulse.agents.taskpolicy)
            own = taskpolicy.own_tasks(everything, agent, task)
            everything = {k: t for k, t in everything.items() if k in own}
        states = sorted(everything.values(), key=lambda t: int(t.id.rpartition("-")[2]))
        chosen = [t for t in states if status is None or t.status == status][-LIST_LIMIT:]
        return {"tasks": [msgspec.to_builtins(t) for t in chosen], "count": len(chosen)}

    # -- read -----------------------------------------------------------------------------

    async def tool_status(self) -> dict:
        return await self._status()

    async def tool_vitals(self, key: str | None = None) -> dict:
        try:
            conn = connection.open_readonly(self.paths.vitals_db)
        except connection.StoreError as err:
            raise ToolError("NOT_FOUND", str(err)) from None
        try:
            latest = vitalsdb.latest_vitals(conn, [key] if key else ["*"])
        finally:
            conn.close()
        return {"vitals": {k: {"ts": v.ts, "data": v.data} for k, v in sorted(latest.items())}}

    async def tool_events(self, type: str | None = None, target: str | None = None, since: str | None = None,
                          limit: int | None = None) -> dict:
        limit = min(max(limit or 50, 1), 500)
        since_ts = _since(since) if since else None
        last = eventsdb.last_event_id(self.events)
        first = 0 if since_ts is not None else max(0, last - 5_000)   # bounded: the last 5,000 events at most
        found = [e for e in eventsdb.read_events(self.events, after_id=first, types=(type,) if type else (),
                                              since_ts=since_ts, limit=100_000)
                 if target is None or e.target == target]
        agent, task = ACTOR.get()
        if task:        # a run sees nothing of other tasks, agents or their sessions (pulse.agents.taskpolicy)
            own = taskpolicy.own_tasks(self._all_tasks(), agent, task)
            others = {a.name for a in self.config.agent} - {agent}
            sessions = taskpolicy.own_sessions(eventsdb.read_events(self.events, after_id=first, types=(EventType.GATE_CALL,),
                                                                    limit=100_000), agent)
            found = [e for e in found if taskpolicy.visible_event(e, own, agent, others, sessions)]
        return {"events": [_event(e) for e in found[-limit:]]}

    async def tool_log_tail(self, worker: str | None = None, lines: int | None = None) -> dict:
        return {"lines": tail(self.paths.log_file, worker, min(max(lines or 50, 1), 500))}

    async def tool_effect(self, id: str) -> dict:
        state = effectqueue.effect_state(self.events, id)
        if state is None:
            raise ToolError("NOT_FOUND", f"no effect {id!r}")
        body = effectqueue.effect_of(self.events, id)
        # its terminal event comes after it was created: start the search there (ids grow with time)
        after = max(0, eventsdb.first_id_since(self.events, body.created) - 1) if body else 0
        return {"id": id, "state": state, "effect": msgspec.to_builtins(body) if body else None,
                "outcome": self._outcome(id, after)}

    # -- write ----------------------------------------------------------------------------

    async def tool_restart_process(self, name: str) -> dict:
        return await self._effect(enginerpc.Effect(kind=TOOL_KINDS["restart_process"], target=name))

    async def tool_restart_worker(self, name: str) -> dict:
        return await self._effect(enginerpc.Effect(kind=TOOL_KINDS["restart_worker"], target=name, idempotent=True))

    async def tool_signal_process(self, name: str, signal: str) -> dict:
        return await self._effect(enginerpc.Effect(kind=TOOL_KINDS["signal_process"], target=name, params={"signal": signal}))

    async def tool_emit_effect(self, kind: str, target: str | None = None, params: dict | None = None,
                               idempotent: bool | None = None) -> dict:
        result = await self._effect(enginerpc.Effect(kind=kind, target=target, params=params or {},
                                                idempotent=bool(idempotent)))
        if registry.ack_verifies(kind):   # acked: the acknowledgement is the whole change
            result["verification"] = {"ok": True, "by": f"{kind} acked"}
        return result

    async def tool_promote(self) -> dict:
        return await self._effect(enginerpc.Effect(kind=TOOL_KINDS["promote"], target="engine", params={"by": "agent"}))

    async def tool_rollback(self, to: str | None = None) -> dict:
        params = {"reason": "requested by the agent", **({"to": to} if to else {})}
        return await self._effect(enginerpc.Effect(kind=TOOL_KINDS["rollback"], target="engine", params=params))

    async def tool_create_task(self, project: str, title: str, prompt: str, priority: int | None = None) -> dict:
        agent, task = ACTOR.get()
        everything = self._all_tasks()
        parent = everything.get(task) if task else None
        try:
            depth = taskpolicy.check_create(self.config, agent, parent, project, everything.values(), time.time())
        except taskpolicy.Refusal as refused:
            raise ToolError(refused.code, refused.message) from None
        given = taskpolicy.capped_priority(priority, parent)
        created = tasks.create(self.events, project, title, prompt, given, source="agent", created_by=agent,
                               parent=parent.id if parent else None, depth=depth)
        again = tasks.load(self.events, created.id)    # read back: the verification is in the result
        ok = again is not None and (again.project, again.title, again.prompt) == (project, title, prompt)
        client.ring(self.paths, "wake", doorbells.Wake("mcp", f"{created.id} created"))
        result = {"task": msgspec.to_builtins(again or created),
                  "verification": {"ok": ok, "by": "read back from events.db"}}
        if given != (priority or 0):
            result["priority_capped"] = f"priority {priority} asked; {given}, the priority of {parent.id}, given"
        return result

    # -- user input -----------------------------------------------------------------------

    async def tool_ask_operator(self, question: str, operator: Operator | None) -> dict:
        if operator is None:
            raise ToolError("NO_OPERATOR", "no operator can answer in this session")
        return {"question": question, "answer": await operator(question)}

    # -- helpers --------------------------------------------------------------------------

    def _all_tasks(self) -> dict[str, tasks.TaskState]:
        """Every task's state, from the tasks projection's checkpoint and what came after it: the
        listing and the bounds each call checks cost what is new, not the whole history."""
        if self.tasks is None:
            self.tasks = tasks.all_tasks(self.events, self.paths.home / projection.DIRECTORY)
        return self.tasks.catch_up(self.events).states

    async def _status(self) -> dict:
        try:
            reply = await self.to_thread(client.request, self.paths, controlmsgs.GetStatus(), 3.0)
        except client.Unreachable as err:
            raise ToolError("EXECUTION_CONTEXT_UNAVAILABLE", str(err)) from None
        return msgspec.to_builtins(reply.status)

    async def _effect(self, effect: enginerpc.Effect) -> dict:
        """Commit an effect of origin agent, ring the executor, wait for its terminal event."""
        if daemon_pid(self.paths) is None:
            raise ToolError("EXECUTION_CONTEXT_UNAVAILABLE", f"pulsed is not running on {self.paths.home}")
        t = self.config.timings
        if registry.tells_operator(effect.kind):    # it speaks to the operator: who sends it is the gate's to say
            agent, task = ACTOR.get()
            effect = msgspec.structs.replace(effect, params={**effect.params, "agent": agent, "task": task})
        effect = effectqueue.new_effect(effect, "agent", t.effect_deadline_s)
        mark = eventsdb.last_event_id(self.events)
        acting = ACTING.get()
        effectqueue.commit_effects(self.events, [effect], "mcp", events=[acting(effect.id)] if acting else ())
        client.ring(self.paths, "doorbell", doorbells.Doorbell("mcp"))
        give_up = time.monotonic() + t.effect_deadline_s + t.effect_timeout_s + 5
        while (state := effectqueue.effect_state(self.events, effect.id)) in EFFECT_OPEN:
            if time.monotonic() >= give_up:
                raise ToolError(STILL_RUNNING, f"effect {effect.id} ({effect.kind}) is still {state}: the write stays "
                                f"in flight until it ends; once it has, read what it changed to verify it",
                                acted=True, effect_id=effect.id)
            await self.sleep(POLL_S)
        outcome = self._outcome(effect.id, mark)
        result = {"effect_id": effect.id, "kind": effect.kind, "target": effect.target, "state": state,
                  "outcome": outcome}
        if state != EffectState.ACKED:
            reason = (outcome or {}).get("reason")
            raise ToolError("ACTION_NOT_ALLOWED" if reason == "not-allowed" else "EXECUTION_FAILED",
                            f"effect {effect.id} ({effect.kind}) {state}"
                            + (f": {outcome.get('error') or reason}" if outcome else ""),
                            acted=state == EffectState.FAILED and reason not in NOT_RUN_REASONS, **result)
        return result

    def _outcome(self, effect_id: str, after_id: int) -> dict | None:
        """The data of the effect's terminal event (requeued failures are not terminal)."""
        for ev in eventsdb.read_events(self.events, after_id=after_id, types=tuple(eventmsgs.EFFECT_END_EVENTS.values()),
                                       limit=100_000):
            if ev.data.get("effect_id") == effect_id and not ev.data.get("requeued"):
                return {"type": ev.type, **ev.data}
        return None


def _since(text: str) -> float:
    try:
        return clock.parse_since(text)
    except ValueError as err:
        raise ToolError("INVALID_INPUT", str(err)) from None


def _event(ev: eventmsgs.Event) -> dict:
    return {"id": ev.id, "ts": ev.ts, "type": ev.type, "source": ev.source, "target": ev.target, "data": ev.data}


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except Exception:   # gone or not ours since the lookup: the pid still says what was found
        return []


def _create_time(proc) -> float | None:
    try:
        return proc.create_time()
    except Exception:
        return None


# -- one gated session ------------------------------------------------------------------------------------

class ToolSession:
    """GateSession.begin → the tool → GateSession.end, each step a fact committed to events.db before the call
    goes on (pulse.gate.durable). `agent` and `task` name who acts: a new session of the same
    agent and task inherits what the last one left unverified."""

    def __init__(self, tools: PulseTools, session_id: str | None = None, clock: Callable[[], float] = time.time,
                 agent: str = policy.OPERATOR_SHELL, task: str = "", pid: int | None = None, store: Any = None):
        """`pid`: the session's client process (the `pulsectl mcp` proxy, by its peer credentials),
        whose end settles what it leaves in flight; this process when None. `store`: a DurableStore
        shared with the other sessions of this process (else one of its own, which folds the gate
        facts after the ledger's checkpoint at its first decision)."""
        self.tools = tools
        pid = os.getpid() if pid is None else pid
        store = store or DurableStore(tools.events, checkpoints=tools.paths.home / projection.DIRECTORY)
        self.gate = policy.GateSession(session_id or f"mcp-{pid}-{uuid.uuid4().hex[:8]}", catalogue.TOOLS, clock,
                                 agent=agent, task=task, store=store,
                                 block_budget=tools.config.gate.blocks_per_min)
        self.gate.open(pid=pid, started=stamp(pid))

    def record(self, *records: policy.Record) -> None:
        """Facts that change no state (an oversized call, an operator's question round)."""
        eventsdb.append_events(self.tools.events, [eventmsgs.now_event(r.type, "mcp", self.gate.id, r.data) for r in records])

    async def call(self, name: str, args: Any, operator: Operator | None = None) -> tuple[dict, str]:
        """(the envelope, the text the model sees). The envelope is {"ok": true, "data": ...}
        or {"ok": false, "error": {"code": ..., ...}}; a block's code leads its text."""
        args = args if args is not None else {}
        name = bounded_tool_name(name)
        too_big = oversized(args, self.tools.config.gate)
        if too_big is not None:     # recorded by hash and a preview: a call never grows events.db by its size
            encoded = json.dumps(args, default=str)
            self.gate.oversized(name, policy.args_hash(args), len(encoded), encoded[:PREVIEW_CHARS])
            err = ToolError("INVALID_INPUT", too_big)
            return err.envelope(), f"{err.code}: {err.message}"
        if name == "finish":
            return self.finish(args)
        admitted = self.gate.begin(name, args)
        if isinstance(admitted, policy.Blocked):
            return admitted.error, admitted.text()
        write = admitted.call.kind == policy.CallKind.WRITE
        try:
            data = await self.tools.run(name, args, operator, self.acting(admitted) if write else None,
                                        actor=(self.gate.agent, self.gate.task))
        except ToolError as err:
            if err.code != STILL_RUNNING:
                self.gate.end(admitted, False, None, err.acted)
            return err.envelope(), f"{err.code}: {err.message}\n{json.dumps(err.envelope(), default=str)}"
        except Exception as err:   # a bug here must not leave the call in flight, or hide a write that acted
            self.gate.end(admitted, False, None, acted=write)
            failed = ToolError("EXECUTION_FAILED", f"{type(err).__name__}: {err}")
            return failed.envelope(), f"{failed.code}: {failed.message}"
        except BaseException:      # cancelled by the client: recorded; its effect's outcome settles a write
            self.gate.end(admitted, False, None, cancelled=True)
            raise
        self.gate.end(admitted, True, data)
        envelope = {"ok": True, "data": data}
        return envelope, json.dumps(envelope, default=str)

    def acting(self, admitted: policy.Admitted) -> Callable[[str], eventmsgs.Event]:
        """The fact that links a write to the effect it commits, written in the effect's transaction."""
        def fact(effect_id: str) -> eventmsgs.Event:
            return eventmsgs.now_event(EventType.GATE_CALL, "mcp", self.gate.id, {"phase": "acting", "session": self.gate.id,
                                                                     "call": admitted.ticket, "effect": effect_id})
        return fact

    def finish(self, args: dict) -> tuple[dict, str]:
        try:
            checked_args("finish", args, FINISH_PARAMS)
        except ToolError as err:
            return err.envelope(), f"{err.code}: {err.message}"
        outcome = self.gate.finish(args)
        if isinstance(outcome, policy.Blocked):
            return outcome.error, outcome.text()
        envelope = {"ok": True, "data": {"finished": True, "state": str(self.gate.state)}}
        return envelope, json.dumps(envelope)


# -- what the MCP server offers (the gate sends it to the proxy) ------------------------------------

def unavailable(allow: Allow) -> dict[str, str]:
    """The write tools [allow] would refuse every time, each with the entry that enables it."""
    return {tool: f'allow.kinds lacks "{kind}"' for tool, kind in TOOL_KINDS.items() if kind not in allow.kinds}


def tool_list(allow: Allow | None = None) -> list[tuple[str, str, dict]]:
    """(name, description, input schema) of every tool that can work under `allow` (all of them
    when None), finish last."""
    hidden = unavailable(allow) if allow is not None else {}
    out = [(name, tool_description(d), input_schema(d.params)) for name, d in catalogue.TOOLS.items() if name not in hidden]
    return out + [("finish", FINISH_DESCRIPTION, input_schema(FINISH_PARAMS))]


def instructions(allow: Allow) -> str:
    text = ("Pulse's tools for this host. Every call passes a safety gate: a write on a resource needs that "
            "resource resolved or read first, one write at a time, each verified by a later read of the same "
            "resource that finds it, before the next write or finish.")
    hidden = unavailable(allow)
    if hidden:
        text += " Not offered here, as config.toml's [allow] refuses them: " + "; ".join(
            f"{tool} ({why})" for tool, why in sorted(hidden.items())) + "."
    return text
