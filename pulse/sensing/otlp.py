"""OTLP in, facts out: what the agent CLIs' telemetry says a run or session did, summed.

Pure: decoded OTLP export requests (opentelemetry-proto's messages) go in; one `Tally` per run or
session comes out per flush, never one per record. Who a record is about:
  - a run Pulse started: every record of a request that carried that run's own token (every run
    Pulse starts sends its own, pulse.agents.otel), whatever its tags say: a run cannot move its
    spend off its own account by dropping or changing its tags while it sends as itself; and the
    resource attribute `pulse.run.id` (with its task `pulse.task.id` and agent `pulse.agent`) of a
    request that carried the receiver's token. What is counted for a run can end it
    (pulse.agents.runguards), so neither an anonymous local sender nor another run can speak for it;
  - else a session: the record's `session.id` (Claude Code), `conversation.id` (Codex) or
    `gen_ai.conversation.id` (the GenAI conventions), as "session:<id>";
  - else the sender: "service:<service.name>".
A session's tally says whether its records came with the receiver's token (`anonymous` when not):
only those sent with it count against the host's [budget] (pulse.agents.spend.observe), since any
local process, an agent run too, can send telemetry without it. Records of one session with and
without the token are two tallies.

What is counted, and from where (one source each, so nothing is counted twice):
  - tokens and cost: Claude Code's `api_request` events (input_tokens, output_tokens,
    cache_read_tokens, cache_creation_tokens, cost_usd: one per request, sent every few seconds);
    Codex's log event `codex.sse_event` of kind `response.completed` (input/output/cached/
    reasoning_token_count); the GenAI metric `gen_ai.client.token.usage` (`gen_ai.token.type`;
    cumulative series turned into deltas); GenAI model-call spans (`gen_ai.usage.input_tokens` /
    `output_tokens`). Claude Code's metrics `claude_code.token.usage` and `claude_code.cost.usage`
    say the same as its events, later (every 60 s by default, and a short run's only at its exit):
    they show the session alive, and are not counted again.
  - API requests: the log events `api_request` and `api_error` (Claude Code, Codex), model-call spans.
  - tool calls: the log event `tool_result`, `execute_tool` spans.
  - errors: `api_error`, an `api_request` with an error or an HTTP status of 400 or more, a
    `tool_result` that did not succeed, a span with status ERROR.
  - last activity: every record, whatever it says (a CLI that reports anything is not stalled).
"""

from __future__ import annotations

from dataclasses import dataclass, field

RUN_ATTR, TASK_ATTR, AGENT_ATTR = "pulse.run.id", "pulse.task.id", "pulse.agent"
SESSION_ATTRS = ("session.id", "conversation.id", "gen_ai.conversation.id")
TOKEN_KINDS = {"input": "input", "output": "output"}      # gen_ai.token.type
CLAUDE_TOKENS = {"input_tokens": "input", "output_tokens": "output", "cache_read_tokens": "cache_read",
                 "cache_creation_tokens": "cache_write"}
CODEX_TOKENS = {"input_token_count": "input", "output_token_count": "output", "cached_token_count": "cache_read",
                "reasoning_token_count": "reasoning"}
MODEL_CALLS = {"chat", "text_completion", "generate_content"}   # GenAI operations that are one API request
SERIES_PER_SOURCE = 64       # cumulative series remembered per tracked source (their last values)
STATUS_ERROR = 2             # Status.STATUS_CODE_ERROR
CUMULATIVE = 2               # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


@dataclass
class Tally:
    """What one run or session did since the last flush."""
    target: str
    run: str | None = None
    task: str | None = None
    agent: str | None = None
    session: str | None = None
    service: str | None = None
    tokens: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0
    api_requests: int = 0
    tool_calls: int = 0
    errors: int = 0
    records: int = 0
    last_at: float = 0.0
    anonymous: bool = False      # a session's records sent without the receiver's token

    def fact(self) -> dict:
        """The `telemetry` event's data: what is known and non-zero."""
        out: dict = {k: v for k, v in (("run", self.run), ("task", self.task), ("agent", self.agent),
                                       ("session", self.session), ("service", self.service)) if v}
        out.update(tokens=dict(self.tokens), cost_usd=round(self.cost_usd, 6), api_requests=self.api_requests,
                   tool_calls=self.tool_calls, errors=self.errors, records=self.records, last_at=self.last_at)
        if self.anonymous:
            out["anonymous"] = True
        return out


def value(any_value) -> object:
    """An OTLP AnyValue as a Python scalar (None for lists, maps and bytes: nothing here reads them)."""
    kind = any_value.WhichOneof("value")
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(any_value, kind)
    return None


def attributes(pairs) -> dict[str, object]:
    return {kv.key: value(kv.value) for kv in pairs}


def number(raw: object) -> float | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw)
        except ValueError:
            return None
    return None


def failed(raw: object) -> bool:
    """A `success` attribute that says no (Claude Code sends "false", Codex false)."""
    return raw is False or (isinstance(raw, str) and raw.lower() == "false")


def event_name(record, attrs: dict) -> str:
    """A log record's event, without its CLI's prefix: "api_request", "tool_result", "sse_event" ...
    The `event.name` attribute first: Codex 0.171 fills the record's own event_name field with where
    in its source the event was made ("event otel/src/events/session_telemetry.rs:1187")."""
    name = attrs.get("event.name") or getattr(record, "event_name", "") or ""
    if not name and record.body.WhichOneof("value") == "string_value" and len(record.body.string_value) < 64:
        name = record.body.string_value
    return str(name).rsplit(".", 1)[-1]


class Fold:
    """Folds decoded export requests into tallies; `take()` hands them over and starts afresh.
    At most `max_sources` tallies at once: records of any further source are dropped and counted."""

    def __init__(self, max_sources: int):
        self.max_sources = max_sources
        self.tallies: dict[str, Tally] = {}
        self.series: dict[tuple, float] = {}     # cumulative series → its last value
        self.dropped = 0                         # records of sources past max_sources
        self.caller: str | None = "*"            # who sent the request being folded (Receiver.caller)

    def take(self) -> list[Tally]:
        out, self.tallies = list(self.tallies.values()), {}
        return out

    # -- who ----------------------------------------------------------------------------------------
    def tally(self, resource: dict, attrs: dict, now: float) -> Tally | None:
        if self.caller != "*" and resource.get(RUN_ATTR) not in (None, self.caller):
            resource = {k: v for k, v in resource.items() if k not in (RUN_ATTR, TASK_ATTR, AGENT_ATTR)}
        if self.caller not in (None, "*"):
            resource = {**resource, RUN_ATTR: self.caller}     # sent as a run: that run's, tagged or not
        run = resource.get(RUN_ATTR)
        session = next((str(v) for a in SESSION_ATTRS if (v := attrs.get(a) or resource.get(a))), None)
        service = resource.get("service.name")
        target = str(run) if run else f"session:{session}" if session else f"service:{service or 'unknown'}"
        anonymous = not run and self.caller is None
        key = target + ("\0anonymous" if anonymous else "")
        t = self.tallies.get(key)
        if t is None:
            if len(self.tallies) >= self.max_sources:
                self.dropped += 1
                return None
            t = self.tallies[key] = Tally(target, run=str(run) if run else None,
                                          task=_str(resource.get(TASK_ATTR)), agent=_str(resource.get(AGENT_ATTR)),
                                          session=session, service=_str(service), anonymous=anonymous)
        elif session and t.session is None:
            t.session = session
        t.records += 1
        t.last_at = max(t.last_at, now)
        return t

    # -- logs ---------------------------------------------------------------------------------------
    def fold(self, signal: str, request, now: float, caller: str | None = "*") -> None:
        """Fold one export request of `signal` (logs, metrics, traces). `caller`: "*" it came with the
        receiver's token, a run id with that run's, None with neither; run tags are believed only
        from "*" or from the run they name."""
        self.caller = caller
        try:
            getattr(self, signal)(request, now)
        finally:
            self.caller = "*"

    def logs(self, request, now: float) -> None:
        for rl in request.resource_logs:
            resource = attributes(rl.resource.attributes)
            for sl in rl.scope_logs:
                for record in sl.log_records:
                    attrs = attributes(record.attributes)
                    t = self.tally(resource, attrs, now)
                    if t is not None:
                        self._log_event(t, event_name(record, attrs), attrs)

    def _log_event(self, t: Tally, name: str, attrs: dict) -> None:
        if name in ("api_request", "api_error"):
            t.api_requests += 1
            for attr, kind in CLAUDE_TOKENS.items():
                self._add_tokens(t, kind, number(attrs.get(attr)))
            if (cost := number(attrs.get("cost_usd"))) is not None and cost > 0:
                t.cost_usd += cost
            status = number(attrs.get("http.response.status_code") or attrs.get("status_code"))
            if name == "api_error" or attrs.get("error.message") or attrs.get("error") or (status or 0) >= 400:
                t.errors += 1
        elif name == "tool_result":
            t.tool_calls += 1
            if failed(attrs.get("success")):
                t.errors += 1
        elif name == "sse_event" and attrs.get("event.kind") == "response.completed":
            for attr, kind in CODEX_TOKENS.items():
                self._add_tokens(t, kind, number(attrs.get(attr)))
        elif name == "sse_event" and attrs.get("event.kind") == "response.failed":
            t.errors += 1

    # -- metrics ------------------------------------------------------------------------------------
    def metrics(self, request, now: float) -> None:
        for rm in request.resource_metrics:
            resource = attributes(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    self._metric(resource, metric, now)

    def _metric(self, resource: dict, metric, now: float) -> None:
        name = metric.name
        kind = metric.WhichOneof("data")
        if kind == "sum":
            points, temporality = metric.sum.data_points, metric.sum.aggregation_temporality
        elif kind == "histogram":
            points, temporality = metric.histogram.data_points, metric.histogram.aggregation_temporality
        else:
            points, temporality = (), 0
        for point in points:
            attrs = attributes(point.attributes)
            t = self.tally(resource, attrs, now)
            if t is None:
                continue
            raw = point.sum if kind == "histogram" else (point.as_double if point.WhichOneof("value") == "as_double"
                                                         else point.as_int)
            if temporality == CUMULATIVE:
                raw = self._delta((t.target, name, tuple(sorted(attrs.items())), point.start_time_unix_nano), raw)
            if name == "gen_ai.client.token.usage":
                self._add_tokens(t, TOKEN_KINDS.get(str(attrs.get("gen_ai.token.type")), "input"), raw)

    def _delta(self, key: tuple, now_value: float) -> float:
        """A cumulative point as what it added since the last point of its series (all of it when
        first seen, or after a reset)."""
        last = self.series.pop(key, None)
        self.series[key] = now_value
        while len(self.series) > SERIES_PER_SOURCE * self.max_sources:
            self.series.pop(next(iter(self.series)))       # the oldest series
        return now_value if last is None or now_value < last else now_value - last

    # -- traces -------------------------------------------------------------------------------------
    def traces(self, request, now: float) -> None:
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    attrs = attributes(span.attributes)
                    t = self.tally(resource, attrs, now)
                    if t is None:
                        continue
                    operation = attrs.get("gen_ai.operation.name")
                    if operation == "execute_tool":
                        t.tool_calls += 1
                    elif operation in MODEL_CALLS:
                        t.api_requests += 1
                        self._add_tokens(t, "input", number(attrs.get("gen_ai.usage.input_tokens")))
                        self._add_tokens(t, "output", number(attrs.get("gen_ai.usage.output_tokens")))
                    if span.status.code == STATUS_ERROR:
                        t.errors += 1

    @staticmethod
    def _add_tokens(t: Tally, kind: str, n: float | None) -> None:
        if n is not None and n > 0:
            t.tokens[kind] = t.tokens.get(kind, 0) + int(n)


def _str(raw: object) -> str | None:
    return str(raw) if raw not in (None, "") else None
