"""A finished agent run as OTLP trace spans, for an operator's collector ([telemetry] export).

Following the OpenTelemetry semantic conventions for GenAI, version SEMCONV (still "Development"
status: names may move in later versions, so this one is pinned and said in the schema URL):

- one `invoke_agent {gen_ai.agent.name}` span per attempt (span kind CLIENT: the agent is a CLI
  Pulse starts, not code in its process), from the run's start to its end: gen_ai.operation.name
  `invoke_agent`, gen_ai.agent.name, gen_ai.conversation.id (the CLI's session id),
  gen_ai.usage.input_tokens / output_tokens, gen_ai.provider.name where the adapter says whose
  model it is (anthropic, openai); a failed run has status ERROR and error.type its reason;
- under it, one `execute_tool {gen_ai.tool.name}` span per call the run made through Pulse's gate
  (its gate-call facts), from the call's begin to its end: gen_ai.tool.name, gen_ai.tool.call.id,
  gen_ai.tool.type `function`, and the gate's verdict (`pulse.gate.verdict`: allowed, blocked or
  unfinished; `pulse.gate.kind`: read, write, ...); a call blocked or failed has status ERROR.

Pulse's own attributes name the task, project, run and outcome (`pulse.*`). Ids are derived from
the run's id, so a run sent twice (a retry after a lost answer) is the same trace and spans.
Pure, but for `read_run`, which reads the run's facts from events.db.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pulse.core.wire.eventmsgs import Event, EventType, TaskEvent

# Imports inside functions: opentelemetry's protobuf modules (~15-30 ms each, python -X importtime) only
# when the OTLP export builds spans.

SEMCONV = "1.37.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV}"
RUN_ENDS = (TaskEvent.ACKED, TaskEvent.FAILED)
PROVIDERS = {"claude-code": "anthropic", "codex": "openai"}      # the telemetry's service.name → whose model
GATE_CALLS_LIMIT = 500           # a run's gate calls read at most (the newest)
ERROR_TEXT = 500                 # the status message: the start of the run's error


@dataclass
class ToolCall:
    call: str                    # the gate's ticket (session#n), or where it was in the session
    tool: str
    kind: str
    start: float
    end: float
    verdict: str                 # allowed | blocked | unfinished
    ok: bool
    blocked: str | None = None   # the gate's code, when blocked


@dataclass
class RunEnd:
    run: str
    task: str
    agent: str
    outcome: str                 # acked | failed
    start: float
    end: float
    project: str | None = None
    reason: str | None = None
    error: str | None = None
    session: str | None = None
    service: str | None = None   # the CLI's telemetry service.name
    tokens: dict = field(default_factory=dict)
    cost_usd: float | None = None
    calls: list[ToolCall] = field(default_factory=list)


def run_end(ev: Event) -> RunEnd | None:
    """The run a task-acked or task-failed event ends (None: not a run's end, or one that never started)."""
    d = ev.data if isinstance(ev.data, dict) else {}
    if ev.type not in RUN_ENDS or not d.get("run") or not ev.target:
        return None
    result = d.get("result") if isinstance(d.get("result"), dict) else {}
    reported = d.get("telemetry") if isinstance(d.get("telemetry"), dict) else {}
    run_ms = d.get("run_ms") if isinstance(d.get("run_ms"), (int, float)) else 0
    cost = result.get("cost_usd", reported.get("cost_usd"))
    return RunEnd(run=str(d["run"]), task=ev.target, agent=str(d.get("agent") or ""),
                  outcome="acked" if ev.type == TaskEvent.ACKED else "failed", start=ev.ts - run_ms / 1000, end=ev.ts,
                  reason=d.get("reason"), error=d.get("error"),
                  session=result.get("session_id") if isinstance(result.get("session_id"), str) else None,
                  tokens=dict(result.get("tokens") or reported.get("tokens") or {}),
                  cost_usd=float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None)


def tool_calls(gate_events: list[Event], agent: str, start: float, end: float) -> list[ToolCall]:
    """The calls of `agent`'s gate sessions opened within [start, end], from their gate-call facts."""
    sessions = {e.target for e in gate_events if e.type == EventType.GATE_CALL and e.data.get("phase") == "open"
                and e.data.get("agent") == agent and start - 1 <= e.ts <= end + 1}
    begun: dict[str, ToolCall] = {}
    calls: list[ToolCall] = []
    for e in gate_events:
        d = e.data
        if e.type != EventType.GATE_CALL or e.target not in sessions or not start - 1 <= e.ts <= end + 1:
            continue
        phase, tool, kind = d.get("phase"), str(d.get("tool") or "?"), str(d.get("kind") or "")
        ticket = str(d.get("call") or f"{e.target}@{e.id}")
        if phase == "begin":
            begun[ticket] = ToolCall(ticket, tool, kind, e.ts, end, "unfinished", False)
        elif phase == "end":
            call = begun.pop(ticket, None) or ToolCall(ticket, tool, kind, e.ts, e.ts, "allowed", True)
            call.end, call.verdict, call.ok = e.ts, "allowed", bool(d.get("ok"))
            calls.append(call)
        elif phase == "blocked":
            calls.append(ToolCall(ticket, tool, kind, e.ts, e.ts, "blocked", False, str(d.get("blocked") or "")))
        elif phase == "finish":
            calls.append(ToolCall(ticket, "finish", "finish", e.ts, e.ts, "allowed", True))
    calls.extend(begun.values())          # begun, never ended: the run ended first
    return sorted(calls, key=lambda c: (c.start, c.call))


def read_run(conn, ev: Event) -> RunEnd | None:
    """The run `ev` ends, with its project, session and gate calls read from events.db."""
    from pulse.store import eventsdb
    run = run_end(ev)
    if run is None:
        return None
    created = next((e for e in eventsdb.task_history(conn, run.task) if e.type == TaskEvent.CREATED), None)
    if created is not None and isinstance(created.data, dict):
        run.project = created.data.get("project")
    fact = next(iter(eventsdb.search_events(conn, types=(EventType.TELEMETRY,), target=run.run, limit=1)), None)
    if fact is not None and isinstance(fact.data, dict):
        run.service = fact.data.get("service")
        run.session = run.session or fact.data.get("session")
    run.calls = tool_calls(eventsdb.gate_events_of_task(conn, run.task, GATE_CALLS_LIMIT), run.agent,
                           run.start, run.end)
    return run


# -- OTLP -------------------------------------------------------------------------------------------

def ids(*parts: str, size: int) -> bytes:
    return hashlib.sha256("\0".join(parts).encode()).digest()[:size]


def attrs(pairs: dict) -> list:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    out = []
    for key, value in pairs.items():
        if value is None or value == "":
            continue
        if isinstance(value, bool):
            v = AnyValue(bool_value=value)
        elif isinstance(value, int):
            v = AnyValue(int_value=value)
        elif isinstance(value, float):
            v = AnyValue(double_value=value)
        else:
            v = AnyValue(string_value=str(value))
        out.append(KeyValue(key=key, value=v))
    return out


def nanos(seconds: float) -> int:
    return int(seconds * 1e9)


def spans(run: RunEnd) -> list:
    """The run's invoke_agent span and its execute_tool children (opentelemetry-proto Spans)."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
    trace_id, root_id = ids("pulse-run", run.run, size=16), ids("pulse-run-span", run.run, size=8)
    failed = run.outcome == "failed"
    root = Span(trace_id=trace_id, span_id=root_id, name=f"invoke_agent {run.agent}", kind=Span.SPAN_KIND_CLIENT,
                start_time_unix_nano=nanos(run.start), end_time_unix_nano=nanos(run.end),
                attributes=attrs({
                    "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": run.agent,
                    "gen_ai.provider.name": PROVIDERS.get(run.service or ""),
                    "gen_ai.conversation.id": run.session,
                    "gen_ai.usage.input_tokens": _int(run.tokens.get("input")),
                    "gen_ai.usage.output_tokens": _int(run.tokens.get("output")),
                    "error.type": (run.reason or "_OTHER") if failed else None,
                    "pulse.run.id": run.run, "pulse.task.id": run.task, "pulse.project": run.project,
                    "pulse.run.outcome": run.outcome, "pulse.run.cost_usd": run.cost_usd}),
                status=Status(code=Status.STATUS_CODE_ERROR, message=(run.error or "")[:ERROR_TEXT]) if failed
                else Status())
    out = [root]
    for call in run.calls:
        bad = call.verdict != "allowed" or not call.ok
        out.append(Span(
            trace_id=trace_id, span_id=ids("pulse-tool-span", run.run, call.call, size=8), parent_span_id=root_id,
            name=f"execute_tool {call.tool}", kind=Span.SPAN_KIND_INTERNAL,
            start_time_unix_nano=nanos(call.start), end_time_unix_nano=nanos(max(call.end, call.start)),
            attributes=attrs({
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.tool,
                "gen_ai.tool.call.id": call.call, "gen_ai.tool.type": "function",
                "error.type": (call.blocked or call.verdict if call.verdict != "allowed" else "tool_error") if bad
                else None,
                "pulse.gate.verdict": call.verdict, "pulse.gate.kind": call.kind, "pulse.gate.blocked": call.blocked}),
            status=Status(code=Status.STATUS_CODE_ERROR) if bad else Status()))
    return out


def export_request(batch: list[list], resource: dict):
    """One ExportTraceServiceRequest of the runs' spans, under Pulse's resource."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add(schema_url=SCHEMA_URL)
    rs.resource.attributes.extend(attrs(resource))
    ss = rs.scope_spans.add(schema_url=SCHEMA_URL)
    ss.scope.name = "pulse"
    for run in batch:
        ss.spans.extend(run)
    return request


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
