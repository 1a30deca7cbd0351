"""`openclaw`: OpenClaw's agent turn, `openclaw agent --agent main --message "<prompt>" --json`.

Documented: JSON with `payloads` and `meta.agentMeta`, usage under `meta.agentMeta` as input /
output / cacheRead / cacheWrite / total; in gateway mode it falls back to the embedded agent if
the gateway request fails. Read here:
  - the final text: the `text` of each payload that has one, joined by blank lines;
  - tokens: `meta.agentMeta.usage.{input, output, cacheRead, cacheWrite, total}` (or those keys
    directly on `meta.agentMeta`);
  - failure: a non-zero exit (stderr's last lines), no JSON, or no text.
Not documented exactly: the shape of a payload (read: `text`), where usage sits inside
`agentMeta` (both places read), the session id's key (read: `sessionId` of `agentMeta`, then
of `meta`), a duration (read: `durationMs` of `meta`), the cost (none read: none documented),
and the exit codes. The default `--agent main` names OpenClaw's agent, not Pulse's [[agent]]:
set argv to pick another.

MCP: no per-run flag is documented, so this adapter hands it no Pulse tools.
"""

from __future__ import annotations

from pulse.agents.adapters.base import Adapter, AgentResult, RunOutput, json_result, number, token_counts

USAGE = {"input": "input", "output": "output", "cacheRead": "cache_read", "cacheWrite": "cache_write",
         "total": "total"}


class OpenClawAdapter(Adapter):
    name = "openclaw"
    default_argv = ["openclaw", "agent", "--agent", "main", "--message", "{prompt}", "--json"]

    def parse(self, run: RunOutput) -> AgentResult:
        obj, failure = json_result(run)
        if failure is not None:
            return failure
        payloads = obj.get("payloads") if isinstance(obj.get("payloads"), list) else []
        texts = [p["text"] for p in payloads if isinstance(p, dict) and isinstance(p.get("text"), str)]
        meta = obj.get("meta") if isinstance(obj.get("meta"), dict) else {}
        agent_meta = meta.get("agentMeta") if isinstance(meta.get("agentMeta"), dict) else {}
        usage = agent_meta.get("usage") if isinstance(agent_meta.get("usage"), dict) else agent_meta
        session = agent_meta.get("sessionId", meta.get("sessionId"))
        result = AgentResult(ok=True, text="\n\n".join(texts) if texts else None,
                             session_id=session if isinstance(session, str) else None,
                             tokens=token_counts(usage, USAGE), duration_ms=number(meta.get("durationMs")),
                             extra={k: agent_meta[k] for k in ("model", "provider") if k in agent_meta})
        if not result.text or not result.text.strip():
            result.ok, result.reason, result.error = False, "empty-result", "no payload with text"
        return result
