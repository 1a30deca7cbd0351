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

MCP (2026.9.6): an OpenClaw agent's MCP servers are its config's `mcp.servers.<name>` (`command`,
`args`, `env`), started by whatever process runs the turn, with the MCP SDK's default environment
(HOME, PATH, USER...) plus that `env`; `${VAR}` in any config string is expanded from that
process's environment when the config is read. There is no per-run flag. So:
  - through the gateway (the default argv) the servers are the gateway's children, started with
    the gateway's environment, outside the run (its cgroup, its token): this adapter hands that
    run nothing (a `pulsectl mcp` in the gateway's config has no run token: no run's session);
  - with `--local` in the argv the turn runs in the CLI's own process, a child of the run: the run
    gets its own config file in its scratch directory, named by OPENCLAW_CONFIG_PATH, that
    `$include`s the operator's config (OPENCLAW_CONFIG_PATH, else <OPENCLAW_STATE_DIR, else
    <OPENCLAW_HOME or HOME>/.openclaw>/openclaw.json; its directory is added to
    OPENCLAW_INCLUDE_ROOTS, since an include may not leave the including file's directory
    otherwise) and adds `mcp.servers.pulse`. Sibling keys are deep-merged over the included file.
    The server's env names the run's variables as `${NAME}`, so the file holds no token: the
    CLI expands them from its own environment, which has them. (Without that env `pulsectl mcp`
    gets only the SDK's HOME, PATH...: it exits "no Pulse home at ~/.pulse", which OpenClaw
    logs as `failed to start server "pulse" (...): MCP error -32000: Connection closed`.) `--local` needs the state
    directory to itself: it refuses to start while a gateway holds it.
OpenClaw puts every MCP tool behind its Tool Search (`tool_search`, `tool_describe`, `tool_call`)
unless `tools.toolSearch` is false: 2026.9.6 shows directly only its own tools
(isDirectVisibleCatalogTool: source "openclaw"), with no per-server setting to load one server's
tools up front. A model that never searched never saw Pulse's tools, so the run's config sets
`tools.toolSearch: false` (every tool's schema in the prompt, for that run only).
"""

from __future__ import annotations

import json
import os

from pulse.agents.adapters.base import (
    MCP_STARTUP_TIMEOUT_S,
    Adapter,
    AgentResult,
    Invocation,
    RunOutput,
    failed,
    json_result,
    number,
    token_counts,
)
from pulse.core.config import ADAPTER_ARGV

USAGE = {"input": "input", "output": "output", "cacheRead": "cache_read", "cacheWrite": "cache_write",
         "total": "total"}


REASON_LINES = 2                 # of an error message, the lines kept in the reason (the first says what)
SERVER = "pulse"                 # the MCP server's name in mcp.servers
IN_PROCESS = "--local"           # the turn runs in the CLI's own process, not the gateway's
VALUE_OPTIONS = ("--message", "-m")   # options whose next element is a value (a prompt "--local" is one)
CONFIG_FILE = "openclaw.json"    # the run's config, in its scratch directory


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


class OpenClawAdapter(Adapter):
    name = "openclaw"
    default_argv = ADAPTER_ARGV["openclaw"]

    def add_mcp(self, inv: Invocation, server: dict) -> None:
        if not runs_in_process(inv.argv):
            return
        seen = {**os.environ, **inv.env}          # the CLI's environment: pulsed's, the run's over it
        config = {"mcp": {"servers": {SERVER: {
            "command": literal(server["command"]), "args": [literal(a) for a in server["args"]],
            "env": {name: "${" + name + "}" for name in server["env"]},
            "connectionTimeoutMs": MCP_STARTUP_TIMEOUT_S * 1000}}},
            "tools": {"toolSearch": False}}
        operator = operator_config(seen)
        if os.path.isfile(operator):
            config = {"$include": operator, **config}
            roots = [r for r in seen.get("OPENCLAW_INCLUDE_ROOTS", "").split(os.pathsep) if r]
            inv.env["OPENCLAW_INCLUDE_ROOTS"] = os.pathsep.join([*roots, os.path.dirname(operator)])
        path = os.path.join(inv.scratch, CONFIG_FILE)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(config, f, indent=2)
        inv.env["OPENCLAW_CONFIG_PATH"] = path

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


def runs_in_process(argv: list[str]) -> bool:
    """Whether the argv runs the turn in the CLI's own process (`--local`, not a --message's value)."""
    return any(a == IN_PROCESS and (i == 0 or argv[i - 1] not in VALUE_OPTIONS) for i, a in enumerate(argv))


def operator_config(env: dict[str, str]) -> str:
    """The config file OpenClaw would read in `env` (2026.9.6's resolveConfigPath, less its legacy names)."""
    home = env.get("HOME") or os.path.expanduser("~")

    def path(value: str) -> str:
        return os.path.abspath(home + value[1:] if value == "~" or value.startswith("~/") else value)
    if env.get("OPENCLAW_CONFIG_PATH", "").strip():
        return path(env["OPENCLAW_CONFIG_PATH"].strip())
    state = env.get("OPENCLAW_STATE_DIR", "").strip() or os.path.join(
        env.get("OPENCLAW_HOME", "").strip() or home, ".openclaw")
    return os.path.join(path(state), CONFIG_FILE)


def literal(text: str) -> str:
    """`text` as a config string OpenClaw does not expand (`$${` is its escape for a literal `${`)."""
    return text.replace("${", "$${")
