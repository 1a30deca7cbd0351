"""Pulse's tools, as the gate classifies them: what each reads, resolves or changes, and what
verifies a change. The tool server (pulse.gate.tools) runs them; the gate
(pulse.gate.policy), which knows no tool by name, enforces its rules on them.
"""

from __future__ import annotations

from typing import Any, Mapping

from pulse.effects import registry
from pulse.gate.policy import Arg, Call, CallKind, Descriptor, Pattern

# What each write touches and what verifies it. A `status` or `list_workers` covers every
# worker it reports; `find_process` is a live lookup of one configured process; a task's
# creation is read back in the transaction that wrote it, so create_task verifies itself.

def effect_touches(args: Mapping[str, Any]) -> frozenset[str]:
    """emit_effect: the resource follows the kind (its registry descriptor says which); a kind the
    registry does not know (the engine's own) touches its target."""
    params = args.get("params")
    return frozenset({registry.resource(str(args.get("kind") or ""), args.get("target"),
                                        params if isinstance(params, Mapping) else None)})


def events_evidence(call: Call, result: Any) -> list[tuple[Pattern, int | None]]:
    """`events` is about the targets of the events it returned, as of each one's id: a write on R
    is verified by an event targeting R written after the write began (its own outcome counts),
    not by an older one."""
    latest: dict[str, int] = {}
    for ev in result.get("events", ()) if isinstance(result, Mapping) else ():
        if ev.get("target") is not None:
            latest[ev["target"]] = max(latest.get(ev["target"], 0), ev.get("id") or 0)
    return [(Pattern(f"target:{t}"), at) for t, at in latest.items()]


def vitals_evidence(call: Call, result: Any) -> list[tuple[Pattern, int | None]]:
    return [(Pattern(f"vital:{key}"), None) for key in (result or {}).get("vitals", {})]


def process_evidence(call: Call, result: Any) -> list[tuple[Pattern, int | None]]:
    """find_process is about the process it looked up, found alive or reported dead."""
    name = result.get("name") if isinstance(result, Mapping) else None
    return [(Pattern(f"process:{name}"), None)] if name else []


def process_found(call: Call, result: Any) -> dict[str, str]:
    """What find_process found the process to be: its pids with their start times ("" when none
    runs), so a look after an interrupted restart tells whether it replaced the process."""
    if not isinstance(result, Mapping) or not result.get("name"):
        return {}
    procs = result.get("processes") or []
    return {f"process:{result['name']}": ",".join(sorted(f"{p.get('pid')}@{p.get('started')}" for p in procs
                                                          if isinstance(p, Mapping)))}


def _tool(name: str, kind: CallKind, params: Mapping[str, Arg] | None = None, **kw) -> Descriptor:
    return Descriptor(name=name, kind=kind, params=params or {}, **kw)


TOOLS: dict[str, Descriptor] = {d.name: d for d in (
    # resolve: find what to act on
    _tool("find_process", CallKind.RESOLVE, {"name": Arg("string", "A configured [[process]] name.", required=True)},
          covers=("process:{name}",), evidence=process_evidence, found=process_found,
          description="Look up one configured critical process now: its pid, whether it is alive, its command."),
    _tool("list_workers", CallKind.RESOLVE, covers=("worker:*",),
          description="Pulse's workers (watcher, tick, executor, engine) and their states, live from pulsed."),
    _tool("list_tasks", CallKind.RESOLVE, {"status": Arg("string", "Only tasks in this status.")}, covers=("task:*",),
          description="Tasks and their states (optionally only one status)."),
    # read: observe
    _tool("status", CallKind.READ, covers=("worker:*",),
          description="pulsectl status as JSON: the supervisor and every worker."),
    _tool("vitals", CallKind.READ, {"key": Arg("string", "One vital key, or a prefix ending in *.")},
          covers=("vital:{key}",), evidence=vitals_evidence,
          description="The latest sample of each vital key (or of one key, or a prefix ending in *)."),
    _tool("events", CallKind.READ, {
              "type": Arg("string", "Only events of this type."),
              "target": Arg("string", "Only events about this target."),
              "since": Arg("string", "An ISO time or a duration such as 10m."),
              "limit": Arg("integer", "At most this many, newest last (default 50, at most 500).")},
          covers=("target:{target}",), evidence=events_evidence,
          description="Recent events from events.db, optionally of one type, one target, since a time."),
    _tool("log_tail", CallKind.READ, {
              "worker": Arg("string", "Only this process's lines (pulsed, watcher, tick, ...)."),
              "lines": Arg("integer", "How many lines (default 50, at most 500).")}, covers=("log:{worker}",),
          description="The last lines of pulse.log, optionally of one worker."),
    _tool("effect", CallKind.READ, {"id": Arg("string", "The effect id.", required=True)}, covers=("effect:{id}",),
          description="One effect and its state."),
    # write: change the host, or Pulse; each waits for its effect's terminal event
    _tool("restart_process", CallKind.WRITE, {"name": Arg("string", "A configured [[process]] name.", required=True)},
          touches=("process:{name}",),
          verified_by="find_process of the same name, started after the restart returned",
          description="Restart a configured critical process with its configured restart command."),
    _tool("restart_worker", CallKind.WRITE, {"name": Arg("string", "watcher, tick, executor or engine.", required=True)},
          touches=("worker:{name}",), idempotent=True,
          verified_by="status or list_workers, started after the restart returned",
          description="Restart one of Pulse's workers."),
    _tool("signal_process", CallKind.WRITE, {
              "name": Arg("string", "A configured [[process]] name.", required=True),
              "signal": Arg("string", "A signal name such as SIGHUP.", required=True)},
          touches=("process:{name}",),
          verified_by="find_process of the same name, started after the signal returned",
          description="Send a signal to a configured critical process."),
    _tool("emit_effect", CallKind.WRITE, {
              "kind": Arg("string", "The effect kind.", required=True),
              "target": Arg("string", "What it acts on."),
              "params": Arg("object", "The effect's parameters."),
              "idempotent": Arg("boolean", "Safe to run more than once.")}, touches_fn=effect_touches,
          verified_by="by kind: find_process for restart-process and signal, status for engine-promote, "
                      "engine-rollback and restart-worker, "
                      "events of the same target otherwise; noop and notify verify themselves when acked",
          description="Queue any effect (checked against the operator's allow-list) and wait for its outcome."),
    _tool("promote", CallKind.WRITE, touches=("worker:engine",),
          verified_by="status or list_workers, started after the promote returned (the engine reloaded)",
          description="Merge staging into the engine, gate it, and reload the engine."),
    _tool("rollback", CallKind.WRITE, {"to": Arg("string", "A commit of main to return to.")},
          touches=("worker:engine",),
          verified_by="status or list_workers, started after the rollback returned (the engine reloaded)",
          description="Revert the engine to the previous (or a given) commit and reload it."),
    _tool("create_task", CallKind.WRITE, {
              "project": Arg("string", "What the task belongs to.", required=True),
              "title": Arg("string", "One line that says what to do.", required=True),
              "prompt": Arg("string", "The instructions for the agent that takes it.", required=True),
              "priority": Arg("integer", "Higher runs first (default 0).")}, touches=("task:*",),
          verified_by="itself: the task is read back in the transaction that created it (or list_tasks)",
          description="Add a pending task for an agent."),
    # user_input: ask a person
    _tool("ask_operator", CallKind.USER_INPUT,
          {"question": Arg("string", "The question, complete in itself.", required=True)},
          description="Ask the operator a question and wait for the answer."),
)}
