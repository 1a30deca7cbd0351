"""`claude-code`: Claude Code's non-interactive mode, `claude -p --output-format json -- "<prompt>"`.

Documented output, and what 2.1 prints: one JSON object {"type": "result", "subtype", "is_error",
"result", "duration_ms", "num_turns", "session_id", "total_cost_usd", "usage", "modelUsage"}.
Read here:
  - done: exit code 0, that object found, is_error false, a non-empty `result`;
  - `subtype: "error_max_budget_usd"`: stopped at the spend cap Pulse passes as `--max-budget-usd`
    (the dollars left under the tightest spend limit, where one is set), failed, reason `budget-cap`;
  - `subtype: "error_max_turns"`: stopped at the turn cap (`--max-turns`, accepted but hidden
    from --help), failed, reason `turn-cap`, its `errors` kept in the reason;
  - other `is_error`: failed with what `result` says (2.1 says "subtype": "success" with
    is_error true when not logged in or when the API is unreachable: the subtype is named only
    when it is not "success");
  - no object: failed with stderr's last lines (e.g. an unknown option) and the exit code;
  - cost: `total_cost_usd` (older versions printed `cost_usd`; read as a fallback);
  - tokens: `usage.input_tokens`, `output_tokens`, `cache_creation_input_tokens`,
    `cache_read_input_tokens`; when those are all zero (2.1 against a non-streaming endpoint),
    the sums of `modelUsage`'s inputTokens / outputTokens / cacheCreationInputTokens /
    cacheReadInputTokens.
The prompt follows `--`, so a prompt starting with "-" (a bullet list) is not taken for an option.

MCP: `--mcp-config FILE` (documented) with {"mcpServers": {"pulse": {command, args, env}}}, the
file in the run's private scratch directory, inserted before the `--` (after it, Claude reads it
as part of the prompt and silently starts no server).

In print mode Claude Code connects to MCP servers without waiting for them (2.1.197: a server
that takes 6 s to start was never exec'd before a PONG run ended). The server is marked
`"alwaysLoad": true`, which Claude waits for before the first turn, but only up to
MCP_CONNECT_TIMEOUT_MS (its default 5000 ms; then "proceeding; background connection
continues"): the run's env gets MCP_CONNECT_TIMEOUT_MS = MCP_STARTUP_TIMEOUT_S unless the
[[agent]] env sets it. Past that, Claude still runs, without Pulse's tools until the server is up
(Claude has no "required" server that fails the run, as Codex has).

Print mode grants no MCP tool by itself: 2.1.197 answers each call of one with "Claude requested
permissions to use mcp__pulse__find_process, but you haven't granted it yet." and lists it in the
result's `permission_denials` ([{"tool_name", "tool_use_id", "tool_input"}]), while the run still
ends "success" with whatever the model then says. So the run is granted Pulse's tools, and only
those (`--allowedTools mcp__pulse`: every tool of the server named "pulse"; the operator's argv
may allow others, or deny some of Pulse's with `--disallowedTools`, which wins); and a run whose
`permission_denials` name a Pulse tool fails, reason `tool-denied`, naming each tool denied: the
model asked Pulse to act and Pulse never did, whatever the answer claims.
"""

from __future__ import annotations

import json
import math
import os

from pulse.agents import otel
from pulse.agents.adapters.base import (
    MCP_STARTUP_TIMEOUT_S,
    Adapter,
    AgentResult,
    Invocation,
    RunOutput,
    count,
    exit_problem,
    final_reason,
    json_result,
    number,
    stderr_tail,
    token_counts,
)
from pulse.core.config import ADAPTER_ARGV

USAGE = {"input_tokens": "input", "output_tokens": "output", "cache_creation_input_tokens": "cache_write",
         "cache_read_input_tokens": "cache_read"}
SERVER = "pulse"                  # the MCP server's name in --mcp-config: its tools are mcp__pulse__<tool>
TOOL_PREFIX = f"mcp__{SERVER}__"
TELEMETRY_ENV = {"CLAUDE_CODE_ENABLE_TELEMETRY": "1", "OTEL_METRICS_EXPORTER": "otlp", "OTEL_LOGS_EXPORTER": "otlp",
                 "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_METRIC_EXPORT_INTERVAL": "10000",
                 "OTEL_LOGS_EXPORT_INTERVAL": "2000"}
MODEL_USAGE = {"inputTokens": "input", "outputTokens": "output", "cacheCreationInputTokens": "cache_write",
               "cacheReadInputTokens": "cache_read"}


def tokens(obj: dict) -> dict[str, int]:
    """`usage`'s counts, or `modelUsage`'s summed over models when `usage` reports only zeros."""
    counts = token_counts(obj.get("usage"), USAGE)
    if any(counts.values()) or not isinstance(obj.get("modelUsage"), dict):
        return counts
    summed: dict[str, int] = {}
    for per_model in obj["modelUsage"].values():
        for name, n in token_counts(per_model, MODEL_USAGE).items():
            summed[name] = summed.get(name, 0) + n
    return summed or counts


class ClaudeCodeAdapter(Adapter):
    name = "claude-code"
    default_argv = ADAPTER_ARGV["claude-code"]

    def add_mcp(self, inv: Invocation, server: dict) -> None:
        path = os.path.join(inv.scratch, "mcp.json")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump({"mcpServers": {SERVER: {"type": "stdio", **server, "alwaysLoad": True}}}, f)
        # alwaysLoad waits for the server before the first turn, this long (see the docstring).
        inv.env.setdefault("MCP_CONNECT_TIMEOUT_MS", str(MCP_STARTUP_TIMEOUT_S * 1000))
        at = self.options_at(inv)
        # --allowedTools takes several values: the next option (or the `--`) ends them
        inv.argv[at:at] = ["--mcp-config", path, "--allowedTools", f"mcp__{SERVER}"]

    def report_to(self, inv: Invocation, receiver, operator_env: dict[str, str]) -> None:
        # Claude Code's documented telemetry (CLAUDE_CODE_ENABLE_TELEMETRY and the standard OTEL_*
        # variables): its events (api_request with tokens and cost, tool_result, api_error) and
        # metrics over OTLP/HTTP, more often than its defaults (5 s events, 60 s metrics) so a run is
        # seen spending, and alive, while it runs.
        otel.tag(inv.env, receiver.tags)
        if otel.operator_decides(operator_env):
            return
        for key, value in {**TELEMETRY_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}.items():
            inv.env.setdefault(key, value)          # an export interval the operator set stays
        if (headers := receiver.headers_env()) is not None:
            inv.env[otel.HEADERS_ENV] = headers

    def cap_spend(self, inv: Invocation, usd: float) -> None:
        # `--max-budget-usd` (print mode; documented): Claude stops between turns once past it, with
        # subtype error_max_budget_usd. Rounded down to the cent, never to 0 (which it would refuse).
        at = self.options_at(inv)
        inv.argv[at:at] = ["--max-budget-usd", f"{max(0.01, math.floor(usd * 100) / 100):.2f}"]

    def parse(self, run: RunOutput) -> AgentResult:
        obj, failure = json_result(run, exit_fails=False)     # its JSON says how it failed
        if failure is not None:
            return failure
        text = obj.get("result")
        cost = number(obj.get("total_cost_usd"))
        result = AgentResult(
            ok=True, text=text if isinstance(text, str) or text is None else json.dumps(text),
            session_id=obj.get("session_id") if isinstance(obj.get("session_id"), str) else None,
            cost_usd=cost if cost is not None else number(obj.get("cost_usd")),
            tokens=tokens(obj), turns=count(obj.get("num_turns")),
            duration_ms=number(obj.get("duration_ms")),
            extra={"subtype": obj["subtype"]} if isinstance(obj.get("subtype"), str) else {})
        subtype = obj.get("subtype")
        errors = [e for e in obj.get("errors", []) if isinstance(e, str)] if isinstance(obj.get("errors"), list) else []
        if subtype == "error_max_budget_usd":
            result.ok, result.reason = False, "budget-cap"
            result.error = f"stopped at its spend cap (--max-budget-usd, error_max_budget_usd) at ${cost or 0:.2f}"
        elif subtype == "error_max_turns":
            result.ok, result.reason = False, "turn-cap"
            result.error = "; ".join([f"stopped at the turn cap (error_max_turns) after {result.turns} turns",
                                      *errors])
        elif obj.get("is_error"):
            said = "; ".join([result.text[:300]] if result.text else errors) or "no message"
            kind = f" ({subtype})" if subtype and subtype != "success" else ""
            result.ok, result.error = False, f"the agent reported an error{kind}: {said}"
            result.reason = final_reason(said) or "agent"
        elif run.code != 0:
            result.ok = False
            result.error = "; ".join(p for p in (stderr_tail(run), exit_problem(run.code, False)) if p)
            result.reason = final_reason(result.error) or "agent"
        elif not result.text:
            result.ok, result.reason, result.error = False, "empty-result", "the agent's result is empty"
        denied = denied_tools(obj)
        if denied:
            result.extra["permission_denials"] = denied
        if (pulses := [t for t in denied if t.startswith(TOOL_PREFIX)]) and result.ok:
            result.ok, result.reason = False, "tool-denied"
            result.error = (f"Claude Code denied Pulse's tool{'s' if len(pulses) > 1 else ''} {', '.join(pulses)} "
                            "(its permission_denials): what the agent asked Pulse to do was not done, whatever "
                            "it answered; grant them (--allowedTools mcp__pulse), or drop the argv's "
                            "--disallowedTools for them")
        return result


def denied_tools(obj: dict) -> list[str]:
    """The tools the result's `permission_denials` name, each once, in order."""
    denials = obj.get("permission_denials")
    names = [d.get("tool_name") for d in denials if isinstance(d, dict)] if isinstance(denials, list) else []
    return list(dict.fromkeys(n for n in names if isinstance(n, str)))
