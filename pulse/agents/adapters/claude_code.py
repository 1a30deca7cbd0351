"""`claude-code`: Claude Code's non-interactive mode, `claude -p "<prompt>" --output-format json`.

Documented output: one JSON object {"type": "result", "subtype", "is_error", "result",
"duration_ms", "num_turns", "session_id", "total_cost_usd", "usage"}; subtypes include
"success" and "error_max_turns". Read here:
  - done: exit code 0, that object found, is_error false, a non-empty `result`;
  - `subtype: "error_max_turns"`: stopped at the turn cap, not a success: failed, reason `turn-cap`;
  - other `is_error`: failed with the subtype and whatever `result` says;
  - no object: failed with stderr's last lines (e.g. not logged in) and the exit code;
  - cost: `total_cost_usd` (older versions printed `cost_usd`; read as a fallback);
  - tokens: `usage.input_tokens`, `output_tokens`, `cache_creation_input_tokens`,
    `cache_read_input_tokens`.
Not documented exactly: which non-zero exit code a failure uses (any non-zero fails the run),
and `num_turns` / `duration_ms` may cover the last turn only (Pulse times the run itself: run_ms).

MCP: `--mcp-config FILE` (documented) with {"mcpServers": {"pulse": {command, args, env}}}, the
file in the run's private scratch directory.
"""

from __future__ import annotations

import json
import os

from pulse.agents.adapters.base import (Adapter, AgentResult, Invocation, RunOutput, count, exit_problem,
                                        json_result, number, stderr_tail, token_counts)

USAGE = {"input_tokens": "input", "output_tokens": "output", "cache_creation_input_tokens": "cache_write",
         "cache_read_input_tokens": "cache_read"}


class ClaudeCodeAdapter(Adapter):
    name = "claude-code"
    default_argv = ["claude", "-p", "{prompt}", "--output-format", "json"]

    def add_mcp(self, inv: Invocation, server: dict) -> None:
        path = os.path.join(inv.scratch, "mcp.json")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump({"mcpServers": {"pulse": {"type": "stdio", **server}}}, f)
        inv.argv += ["--mcp-config", path]

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
            tokens=token_counts(obj.get("usage"), USAGE), turns=count(obj.get("num_turns")),
            duration_ms=number(obj.get("duration_ms")),
            extra={"subtype": obj["subtype"]} if isinstance(obj.get("subtype"), str) else {})
        subtype = obj.get("subtype")
        if subtype == "error_max_turns":
            result.ok, result.reason = False, "turn-cap"
            result.error = f"stopped at the turn cap (error_max_turns) after {result.turns} turns"
        elif obj.get("is_error"):
            said = f": {result.text[:300]}" if result.text else ""
            result.ok, result.error = False, f"the agent reported an error ({subtype or 'is_error'}){said}"
        elif run.code != 0:
            result.ok = False
            result.error = "; ".join(p for p in (stderr_tail(run), exit_problem(run.code, False)) if p)
        elif not result.text:
            result.ok, result.reason, result.error = False, "empty-result", "the agent's result is empty"
        return result
