"""`cursor`: the Cursor Agent CLI, `cursor-agent -p --output-format json --trust --force -- "<prompt>"`.

Not on npm or PyPI, so never run for real in the tests (a fake CLI stands in): what follows is
its documentation's word, and `--` before the prompt is the convention of its CLI parser.

Documented output: one JSON object {"type": "result", "subtype": "success", "is_error": false,
"duration_ms", "duration_api_ms", "result", "session_id", "request_id"}. On failure it exits
non-zero with a message on stderr and prints no JSON (e.g. not logged in): that message is the
task's failure reason. `json` output reports no cost and no tokens, so none are recorded.
Not documented: the subtypes other than "success" (any is_error or other subtype fails the run
with it), and the exit codes (any non-zero fails it).

MCP: the CLI reads MCP servers from its own config files (the project's `.cursor/mcp.json`);
no per-run flag is documented, so this adapter hands it no Pulse tools.
"""

from __future__ import annotations

from pulse.agents.adapters.base import Adapter, AgentResult, RunOutput, json_result, number
from pulse.core.config import ADAPTER_ARGV


class CursorAdapter(Adapter):
    name = "cursor"
    default_argv = ADAPTER_ARGV["cursor"]

    def parse(self, run: RunOutput) -> AgentResult:
        obj, failure = json_result(run)
        if failure is not None:
            return failure
        text = obj.get("result")
        result = AgentResult(ok=True, text=text if isinstance(text, str) else None,
                             session_id=obj.get("session_id") if isinstance(obj.get("session_id"), str) else None,
                             duration_ms=number(obj.get("duration_ms")),
                             extra={k: obj[k] for k in ("subtype", "request_id", "duration_api_ms") if k in obj})
        if obj.get("is_error") or obj.get("subtype", "success") != "success":
            said = f": {result.text[:300]}" if result.text else ""
            result.ok, result.error = False, f"the agent reported an error ({obj.get('subtype', 'is_error')}){said}"
        elif not result.text:
            result.ok, result.reason, result.error = False, "empty-result", "the agent's result is empty"
        return result
