"""`openclaw`: OpenClaw's agent turn, `openclaw agent --agent main --session-key <task> --message "<prompt>" --json`.

What 2026.9 prints (the docs describe only the `--local` shape):
  - through the gateway (the default): {"runId", "status": "ok", "summary": "completed",
    "result": {"payloads": [...], "meta": {...}}}; with `--local`: {"payloads", "meta"} at the
    top level. Both are read; a `status` other than "ok" fails the run with its `summary`;
  - a failure: exit 1 and {"ok": false, "error": {"type", "message"}} on stdout ("Gateway not
    reachable at ws://127.0.0.1:18789 (ECONNREFUSED)..."): the message's first lines are the reason;
  - the final text: the `text` of each payload that has one, joined by blank lines;
  - tokens and cost: `meta.agentMeta.usage.{input, output, cacheRead, cacheWrite, total}` and
    `usage.cost.total` (or those keys directly on `meta.agentMeta`);
  - the session: `agentMeta.sessionId` (then `meta.sessionId`); duration: `meta.durationMs`.
Without a session key every run shares `agent:main:main` and its context: the default argv gives
each task its own (`--session-key <task id>`, scoped to `--agent`). `--agent main` names OpenClaw's
agent, not Pulse's [[agent]]: set argv to pick another. Prompts that start with "-" are taken as
`--message`'s value.

MCP: no per-run flag is documented, so this adapter hands it no Pulse tools. (Its config's
mcp.servers are started by whatever process runs the turn: through the gateway, the gateway's
children, without the run's token; only `--local` runs the turn in the CLI's own process.)
"""

from __future__ import annotations

from pulse.agents.adapters.base import Adapter, AgentResult, RunOutput, failed, json_result, number, token_counts
from pulse.core.config import ADAPTER_ARGV

USAGE = {"input": "input", "output": "output", "cacheRead": "cache_read", "cacheWrite": "cache_write",
         "total": "total"}


REASON_LINES = 2                 # of an error message, the lines kept in the reason (the first says what)


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


class OpenClawAdapter(Adapter):
    name = "openclaw"
    default_argv = ADAPTER_ARGV["openclaw"]

    def parse(self, run: RunOutput) -> AgentResult:
        obj, failure = json_result(run, exit_fails=False)     # its JSON says how it failed
        if failure is not None:
            return failure
        error = _dict(obj.get("error"))
        if obj.get("ok") is False or run.code != 0:
            said = error.get("message") if isinstance(error.get("message"), str) else None
            lines = [line.strip() for line in (said or "").splitlines() if line.strip()][:REASON_LINES]
            return failed("; ".join(lines + [f"exit code {run.code}"] if run.code else lines)
                          or f"exit code {run.code}")
        body = _dict(obj.get("result")) if "result" in obj and "payloads" not in obj else obj
        payloads = body.get("payloads") if isinstance(body.get("payloads"), list) else []
        texts = [p["text"] for p in payloads if isinstance(p, dict) and isinstance(p.get("text"), str)]
        meta = _dict(body.get("meta"))
        agent_meta = _dict(meta.get("agentMeta"))
        usage = agent_meta.get("usage") if isinstance(agent_meta.get("usage"), dict) else agent_meta
        session = agent_meta.get("sessionId", meta.get("sessionId"))
        extra = {k: agent_meta[k] for k in ("model", "provider") if k in agent_meta}
        if isinstance(obj.get("runId"), str):
            extra["run_id"] = obj["runId"]
        result = AgentResult(ok=True, text="\n\n".join(texts) if texts else None,
                             session_id=session if isinstance(session, str) else None,
                             cost_usd=number(_dict(usage.get("cost")).get("total")),
                             tokens=token_counts(usage, USAGE), duration_ms=number(meta.get("durationMs")),
                             extra=extra)
        if obj.get("status", "ok") != "ok":
            result.ok, result.error = False, f"the gateway says {obj.get('status')}: {obj.get('summary', '')}".rstrip(": ")
        elif not result.text or not result.text.strip():
            result.ok, result.reason, result.error = False, "empty-result", "no payload with text"
        return result
