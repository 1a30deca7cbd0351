"""One task as a person reads it: the projection behind `pulsectl task show|output` and the page's
/tasks/ID, so the CLI and the page can never tell a task two ways.

`task_view` folds the task's task-* events into its fields and one entry per attempt (a run: its
agent, its times, its outcome, the CLI's own reason and error, its cost and tokens, where its
output is kept), and adds the gate calls its runs made (gate-call events of the sessions the
gate opened for this task). Times are ISO 8601 (UTC, pulse.core.clock.iso), never epoch floats.
`output_text` reads an attempt's output from objects/ as text. Pure but for those two reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pulse.agents import tasks
from pulse.core import clock
from pulse.core.states import TaskStatus
from pulse.core.wire import eventmsgs
from pulse.core.wire.eventmsgs import LOOP_NOTICED, EventType, SpendEvent, TaskEvent

# Imports inside functions: pulse.store and the spend ledger (~10-15 ms) only for the reads that need
# them; the page and `pulsectl task show` import this module for one task's view.

OUTPUT_CHARS = 200_000       # the most of an agent's output a page or `task show` carries; `task output` has all
GATE_CALLS_LIMIT = 500       # the gate calls a task view lists (newest kept)
NOTICES_LIMIT = 50           # the loop notices a task view reads (newest; one per run at most)


def iso(ts: float | None) -> str | None:
    return clock.iso(ts) if isinstance(ts, (int, float)) else None


def attempts_of(history: list) -> list[dict]:
    """One dict per run of the task, oldest first, from its task-* events."""
    runs: list[dict] = []
    for ev in history:
        d = ev.data
        if ev.type == TaskEvent.ASSIGNED:
            runs.append({"attempt": len(runs) + 1, "agent": d.get("agent"), "run": d.get("run"),
                         "assigned": iso(ev.ts), "started": None, "ended": None, "outcome": "assigned"})
        elif ev.type == TaskEvent.EXECUTING and runs:
            runs[-1].update(started=iso(ev.ts), outcome="running", run=d.get("run") or runs[-1]["run"])
        elif ev.type in (TaskEvent.ACKED, TaskEvent.FAILED) and runs and runs[-1]["ended"] is None:
            runs[-1].update(ended_outcome(ev))
        elif ev.type == TaskEvent.GIVEN_UP and runs and runs[-1]["ended"] is None:
            runs[-1].update(ended=iso(ev.ts), outcome="given up", reason="given-up", error=d.get("reason"))
    return runs


def ended_outcome(ev) -> dict:
    """What the end of a run says: acked or failed, with the CLI's own reason and error (not just
    "agent"), the run's cost, tokens, exit code and duration, and its output's object ref. A run
    ended before its CLI printed them (over-budget, loop, stalled) has what its telemetry reported."""
    d, result = ev.data, ev.data.get("result") if isinstance(ev.data.get("result"), dict) else {}
    reported = d.get("telemetry") if isinstance(d.get("telemetry"), dict) else {}
    failed = ev.type == TaskEvent.FAILED
    return {"ended": iso(ev.ts), "outcome": "failed" if failed else "acked",
            "reason": d.get("reason") if failed else None, "error": d.get("error") if failed else None,
            "cost_usd": result.get("cost_usd", reported.get("cost_usd")),
            "tokens": result.get("tokens") or reported.get("tokens") or {},
            "code": d.get("code", result.get("code")), "run_ms": d.get("run_ms"),
            "output": d.get("output"), "stderr": d.get("stderr"), "summary": result.get("result"),
            "notices": [n for n in d.get("notices") or [] if isinstance(n, dict)]}


def with_notices(runs: list[dict], noticed: list) -> list[dict]:
    """Each run with what was noticed of it and left running (a loop, on_loop = "notice"): its
    `loop-noticed` facts, read as they are written (a running run shows them), else what its end
    carried (the fact's write may have failed)."""
    by_run: dict[str, list[dict]] = {}
    for ev in sorted(noticed, key=lambda e: e.id or 0):
        d = ev.data if isinstance(ev.data, dict) else {}
        by_run.setdefault(str(d.get("run")), []).append(
            {k: d.get(k) for k in ("guard", "detail", "api_requests", "tool_calls", "per_min")} | {"at": iso(ev.ts)})
    for r in runs:
        r["notices"] = by_run.get(str(r.get("run"))) or r.get("notices") or []
    return runs


def gate_calls(conn, task: str) -> list[dict]:
    """The gate calls the task's runs made: every gate-call and gate-blocked event of the sessions
    opened for it, oldest first."""
    from pulse.store import eventsdb
    return [{"id": e.id, "ts": iso(e.ts), "type": e.type, "session": e.target, "phase": e.data.get("phase"),
             "tool": e.data.get("tool"), "ok": e.data.get("ok"), "reason": e.data.get("reason") or e.data.get("why")}
            for e in eventsdb.gate_events_of_task(conn, task, GATE_CALLS_LIMIT)]


def earlier_writes(conn, task: str, limit: int = 20) -> list[str]:
    """What the task's earlier runs tried to change through the gate, one line per write, oldest
    first (the last `limit`): its tool and resources, its effect, and how it ended (acted, did
    not, refused, or may have acted: interrupted, outcome unknown)."""
    from pulse.store import eventsdb
    writes: dict[str, dict] = {}
    lines: list[tuple[int, str]] = []
    for e in eventsdb.gate_events_of_task(conn, task, GATE_CALLS_LIMIT):
        d = e.data
        if e.type != EventType.GATE_CALL:
            continue
        if d.get("phase") == "begin" and d.get("kind") == "write":
            writes[d["call"]] = {"at": e.id, "ts": e.ts, "what": f"{d.get('tool')} on {', '.join(d.get('touches') or [])}"}
        elif d.get("phase") == "blocked" and d.get("kind") == "write":
            lines.append((e.id, f"{iso(e.ts)} {d.get('tool')}: refused by the gate ({d.get('blocked')}), did not act"))
        elif d.get("call") in writes:
            w = writes[d["call"]]
            if d.get("phase") == "acting":
                w["effect"] = d.get("effect")
            elif d.get("phase") in ("end", "settle"):
                w["how"] = (d.get("why") or "") if d.get("phase") == "settle" else \
                    ("returned, acted" if d.get("acted") else "failed, did not act" if d.get("acted") is False
                     else "ended, outcome unknown")
                if d.get("uncertain"):
                    w["how"] += " (outcome unknown)"
    for w in writes.values():
        effect = f" (effect {w['effect']})" if w.get("effect") else ""
        how = w.get("how") or ("in flight" if w.get("effect") else "began, committed no effect")
        lines.append((w["at"], f"{iso(w['ts'])} {w['what']}{effect}: {how}"))
    return [text for _, text in sorted(lines)[-limit:]]


def waiting(conn, agents: list | Callable[[], list | None] | None, state) -> dict[str, Any] | None:
    """Why a pending task is not handed out, or None: no agent may take it (reason `unassignable`,
    pulse.agents.routing; `agents` None: not known, not said; a function: called only if the task is
    pending), or a spend limit said so since its last event (a `spend-held` event, pulse.agents.spend:
    reason `budget`). The one answer of `pulsectl task show`, the board and the task's page."""
    from pulse.agents import routing
    from pulse.store import eventsdb
    if state.status != TaskStatus.PENDING:
        return None
    if callable(agents):       # read only for a pending task: `pulsectl task show` loads config.toml for it
        agents = agents()
    if agents is not None and (why := routing.unassignable(agents, state)) is not None:
        return {"reason": "unassignable", "why": why}
    held = eventsdb.search_events(conn, types=[SpendEvent.HELD], target=state.id, limit=1)
    if not held or held[0].ts < state.updated:
        return None
    return {"reason": held[0].data.get("reason", "budget"), "why": held[0].data.get("why", ""),
            "since": iso(held[0].ts), "agent": held[0].data.get("agent")}


def task_view(conn, task: str, agents: list | Callable[[], list | None] | None = None) -> dict[str, Any] | None:
    """The task as `pulsectl task show --json` and /api/tasks/ID give it; None when there is none.
    `agents`: the configured [[agent]]s, to say why a pending task waits."""
    from pulse.store import eventsdb
    history = eventsdb.task_history(conn, task)
    state = tasks.fold_tasks(history).get(task)
    if state is None:
        return None
    runs = with_notices(attempts_of(history), eventsdb.search_events(conn, types=[LOOP_NOTICED], target=task,
                                                                     limit=NOTICES_LIMIT))
    return {"id": state.id, "title": state.title, "project": state.project, "prompt": state.prompt,
            "status": str(state.status), "priority": state.priority, "agent": state.agent or state.last_agent,
            "pin": state.pin, "tags": list(state.tags), "failed_on": list(state.failed_on),
            "created": iso(state.created), "updated": iso(state.updated), "error": state.error,
            "attempts": len(runs), "runs": runs, "cost_usd": total_cost(runs), "tokens": total_tokens(runs),
            "gate_calls": gate_calls(conn, task),
            "events": [{"id": e.id, "ts": iso(e.ts), "type": e.type, "source": e.source,
                        "reason": e.data.get("reason")} for e in history],
            "waiting": waiting(conn, agents, state), "given_up": given_up(history, state)}


def given_up(history: list, state) -> dict[str, Any] | None:
    """Why a given-up task is no more retried (its latest task-given-up: after failures in a row,
    ended the same way again and again, a failure no retry can fix, or the operator's word)."""
    if state.status != TaskStatus.GIVEN_UP:
        return None
    ev = next((e for e in reversed(history) if e.type == TaskEvent.GIVEN_UP), None)
    return None if ev is None else {"why": ev.data.get("reason"), "by": ev.data.get("by", ev.source), "at": iso(ev.ts)}


def total_cost(runs: list[dict]) -> float | None:
    costs = [r["cost_usd"] for r in runs if isinstance(r.get("cost_usd"), (int, float))]
    return round(sum(costs), 6) if costs else None


def total_tokens(runs: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in runs:
        for name, n in (r.get("tokens") or {}).items():
            if isinstance(n, int) and not isinstance(n, bool):
                out[name] = out.get(name, 0) + n
    return out


def last_output_ref(view: dict, attempt: int | None = None) -> str | None:
    """The object ref of an attempt's output (the last attempt that has one, by default)."""
    runs = [r for r in view["runs"] if r.get("output") and (attempt is None or r["attempt"] == attempt)]
    return runs[-1]["output"] if runs else None


def output_text(objects_root: Path, ref: str | None, limit: int | None = OUTPUT_CHARS) -> str | None:
    """An output blob as text (undecodable bytes replaced), cut at `limit` characters; None when
    there is no ref or the blob is gone (objects/ may have been collected)."""
    from pulse.store import objects
    if not ref:
        return None
    try:
        text = objects.get(objects_root, ref).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    return text if limit is None or len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters)"


# -- a task offered to the fleet, as its origin host knows it ----------------------------------------

def fleet_task_view(events: list) -> dict[str, Any] | None:
    """One fleet task, from its origin's events (oldest first; all with its fleet id as target): its
    offer, every taking (host, its task id there, the taking's number, its last status), where it is
    now and how it ended (the reports of the hosts that took it), and its dead-letter record if it
    was dead-lettered. None when this host never offered it. Withdrawn by its operator: `withdrawn`
    until a run that was already going reports its end. The projection behind `pulsectl task show
    <fleet id>` and `pulsectl fleet tasks`."""
    offer = next((e for e in events if e.type == eventmsgs.FLEET_TASK_OFFERED), None)
    if offer is None:
        return None
    view = new_fleet_view(offer)
    for ev in events:
        apply_fleet_event(view, ev)
    return view


def new_fleet_view(offer) -> dict[str, Any]:
    d = offer.data
    return {
        "fleet_id": offer.target, "title": d.get("title"), "project": d.get("project"), "agent": d.get("agent"),
        "tags": list(d.get("tags") or []), "priority": d.get("priority", 0), "offered": iso(offer.ts),
        "updated": iso(offer.ts), "status": "offered", "host": None, "task": None, "result": None, "error": None,
        "why": None, "attempts": 0, "runs": [], "dead": None, "withdrawn": None, "history": []}


def apply_fleet_event(view: dict[str, Any], ev) -> None:
    """Fold one of a fleet task's events (after its offer) into its view. Withdrawn, a run that was
    going then changes it only by its end (acked, closed)."""
    r = ev.data
    if ev.type not in (eventmsgs.FLEET_TASK_UPDATE, eventmsgs.FLEET_TASK_DEAD, eventmsgs.FLEET_TASK_WITHDRAWN):
        return
    view["updated"] = iso(ev.ts)
    view["history"].append({"ts": iso(ev.ts), "type": ev.type, "host": r.get("host"), "task": r.get("task"),
                            "status": r.get("status"), "why": r.get("why") or r.get("error")})
    if ev.type == eventmsgs.FLEET_TASK_WITHDRAWN:
        view.update(status="withdrawn", why=r.get("why"), withdrawn=iso(ev.ts))
        return
    if view.get("withdrawn") and r.get("status") not in ("acked", "closed"):
        _fold_taking(view, r)
        return
    if ev.type == eventmsgs.FLEET_TASK_DEAD:
        view.update(status="dead", why=r.get("why"), dead=dict(r), attempts=max(view["attempts"], r.get("attempts") or 0))
        return
    if _stale_report(view, r):
        return
    view.update({k: r.get(k) for k in ("status", "host", "task", "result", "error")}, why=r.get("why"))
    _fold_taking(view, r)


def _stale_report(view: dict, report: dict) -> bool:
    """A report of a run's earlier status heard after its end: the origin's fleet worker died holding it
    unacknowledged, and the stream handed it out again after its ack wait, behind the end. It says
    nothing new, and must not make an acked task look executing again."""
    run = next((x for x in view["runs"] if (x["host"], x["task"]) == (report.get("host"), report.get("task"))), None)
    return (run is not None and run["status"] in ("acked", "closed")
            and report.get("status") not in ("acked", "closed", "given_up", "offered"))


def _fold_taking(view: dict, report: dict) -> None:
    """A host's report into the run of that host's taking it is about."""
    attempt = report.get("attempt") or len(view["runs"]) + 1
    run = next((x for x in view["runs"] if (x["host"], x["task"]) == (report.get("host"), report.get("task"))), None)
    if run is None:
        run = {"host": report.get("host"), "task": report.get("task"), "attempt": attempt, "status": None}
        view["runs"].append(run)
    run["status"] = "given_up" if report.get("status") == "offered" else report.get("status")
    view["attempts"] = max(view["attempts"], attempt)


def fold_fleet_views(views: dict[str, dict[str, Any]], events) -> None:
    """Every fleet task this host offered (fleet id → its fleet_task_view, in the order offered): an
    offer makes its view, its later events fold into it."""
    for ev in events:
        if ev.type == eventmsgs.FLEET_TASK_OFFERED:
            views.setdefault(ev.target, new_fleet_view(ev))
        elif ev.target in views:
            apply_fleet_event(views[ev.target], ev)


def fleet_views_projection():
    from pulse.store import projection
    return projection.Projection(
        name="fleet.tasks", new=dict, fold=fold_fleet_views, state_type=dict[str, dict[str, Any]],
        types=eventmsgs.FLEET_TASK_EVENTS,
        code=(new_fleet_view, apply_fleet_event, _stale_report, _fold_taking, iso, clock.iso))


def fleet_views(conn, checkpoints: Path) -> list[dict[str, Any]]:
    """The fleet tasks this host offered, oldest first (fleet_task_view each), from the projection's
    checkpoint under `checkpoints` and the events after it; a long fold leaves a new checkpoint
    where this process may (pulse.store.projection.may_write)."""
    from pulse.store import projection
    folded = projection.Folded(fleet_views_projection(), conn, checkpoints, every_events=1_000,
                               every_s=float("inf"), save=projection.may_write(checkpoints.parent))
    return list(folded.catch_up().values())


def fleet_view_lines(view: dict) -> list[str]:
    """`pulsectl task show <fleet id>` in words."""
    out = [f"{name + ':':<12} {value}" for name, value in (
        ("fleet id", view["fleet_id"]), ("title", view["title"]), ("project", view["project"]),
        ("status", view["status"]), ("pinned to", view["agent"]), ("tags", ", ".join(view["tags"])),
        ("offered", view["offered"]), ("updated", view["updated"]),
        ("ran on", f"{view['host']} as {view['task']}" if view["host"] else "no host has taken it yet"),
        ("error", view["error"]), ("why", view["why"])) if value not in (None, "")]
    if view["result"] is not None:
        out.append(f"{'result:':<12} {view['result']}")
    out.append(f"takings: {view['attempts']}")
    out += [f"  #{r['attempt']} {r['host']} as {r['task']}: {r['status']}" for r in view["runs"]]
    if view["dead"]:
        out.append(f"dead-lettered: {view['dead'].get('why')} (KV pulse-task-dead, key {view['fleet_id']})")
    out.append("history:")
    out += [f"  {h['ts']} {h['type']:<17} {h['host'] or '-'} {h['task'] or '-'} {h['status'] or '-'}"
            + (f" ({h['why']})" if h.get("why") else "") for h in view["history"]]
    return out


# -- the /fleet page's table of fleet tasks ----------------------------------------------------------

FLEET_BOARD_ROWS = 200   # the newest this many fleet tasks this host offered or took


def result_words(result: Any) -> str | None:
    """An agent's result in a cell: its own words where the result carries them (an adapter's
    `result`, with its cost), else compact JSON; None: no result. The cell is text, never an
    escaped JSON string with literal \\n in it."""
    if result is None:
        return None
    said = result.get("result", result.get("tail")) if isinstance(result, dict) else None
    if isinstance(said, str):   # the agent's answer, else (the command adapter) its output's tail
        cost = result.get("cost_usd")
        return said.strip() + (f" (${cost:.4f})" if isinstance(cost, (int, float)) else "")
    if isinstance(result, str):
        return result
    import json  # ~2 ms: only a result that is neither words nor text (the listings show most without it)
    return json.dumps(result, default=str, separators=(",", ":"))


def offered_row(view: dict) -> dict[str, Any]:
    """A task this host offered (a fleet_task_view) as a row of the fleet page."""
    outcome = view["error"] or view["why"] or result_words(view["result"])
    return {"fleet_id": view["fleet_id"], "role": "offered", "title": view["title"], "state": view["status"],
            "host": view["host"], "agent": view["agent"], "task": view["task"], "outcome": outcome,
            "dead": view["dead"] is not None, "updated": view["updated"]}


def taken_row(fleet_id: str, state) -> dict[str, Any]:
    """A task this host took from the fleet (its own TaskState) as a row of the fleet page."""
    outcome = state.error or result_words(state.result)
    return {"fleet_id": fleet_id, "role": "took", "title": state.title, "state": str(state.status),
            "host": "this host", "agent": state.agent or state.last_agent or state.pin, "task": state.id,
            "outcome": outcome, "dead": False, "updated": iso(state.updated)}


def fleet_board(offered: list[dict], taken: dict[str, str], states: dict) -> list[dict]:
    """The fleet tasks this host offered (fleet_task_views) and took (fleet id → its task, with
    `states` of its tasks), newest update first, at most FLEET_BOARD_ROWS."""
    rows = [offered_row(v) for v in offered]
    rows += [taken_row(fid, states[task]) for fid, task in taken.items() if task in states]
    rows.sort(key=lambda r: r["updated"] or "", reverse=True)
    return rows[:FLEET_BOARD_ROWS]
