"""`codex`: OpenAI Codex, `codex exec --json --skip-git-repo-check -- "<prompt>"`.

Documented output, and what 0.171 prints: JSON Lines events `thread.started{thread_id}`,
`turn.started`, `item.started/updated/completed{item}` (item types include `agent_message` with
`text`, `reasoning`, `command_execution`, and `error` for warnings), `turn.completed{usage}`,
`turn.failed{error}`, and top-level `error{message}`. Read here:
  - the final text is the last completed `agent_message` item's `text`;
  - the session id is `thread.started`'s `thread_id`; turns = the number of `turn.completed`;
  - tokens: `usage.input_tokens`, `cached_input_tokens`, `cache_write_input_tokens`,
    `output_tokens`, `reasoning_output_tokens`, summed over turns; Codex reports no money;
  - failed: the last turn is `turn.failed` (its message), or the exit is non-zero (the `error`
    events' messages, else stderr). A top-level `error` alone fails nothing: Codex prints
    "Reconnecting... 2/5" for retries it recovers from, then completes the turn; those are kept
    as `recovered`. A run killed at its timeout says what Codex said last ("Reconnecting...
    waiting for network"), since Codex without a reachable endpoint retries without end.
Lines that are not JSON are counted (`bad_lines`); a run with no event at all fails. The prompt
follows `--`, so a prompt starting with "-" is not taken for an option.

MCP: Codex takes config overrides as `-c key=value` (TOML values) and its MCP servers are the
`mcp_servers.<name>` table of its config (`command`, `args`, `env`); the run gets
`-c mcp_servers.pulse.command=…`, `.args=…`, `.env=…` right after `exec` (codex exec has no
--mcp-config; `codex mcp list` shows the server so configured). The env is set explicitly: Codex
hands an MCP server only a whitelist of its own environment. The run token is never in it: a
command line is readable by every account (/proc/<pid>/cmdline), so the token stays in Codex's own
environment and `.env_vars = ["PULSE_RUN_TOKEN"]` has Codex pass it on by name (0.171 does).

Codex exec starts its MCP servers in the background and begins the turn without a server that
has not answered yet (0.171: a server that takes 4 s to start was never even exec'd before a
PONG run ended). So the server is also `required = true` (exec waits for it, and fails, "required
MCP servers failed to initialize: pulse: timed out handshaking ...", exit 1, if it does not
come up) with `startup_timeout_sec` = MCP_STARTUP_TIMEOUT_S: a run has Pulse's tools, or fails.

Codex asks before it calls an MCP tool (unless the tool says it only reads), and exec asks no one:
0.171 answered every call of a Pulse tool "MCP tool call requires approval, but approval policy is
never", and the model was left to say what it liked. So Pulse's server gets
`default_tools_approval_mode = "approve"`: its calls need no approval from Codex, since each one
passes Pulse's gate, which decides and records it. Only the `pulse` server is granted.
"""

from __future__ import annotations

import json

from pulse.agents import otel
from pulse.agents.adapters.base import (
    MCP_STARTUP_TIMEOUT_S,
    Adapter,
    AgentResult,
    Invocation,
    RunOutput,
    failed,
    failed_run,
    json_lines,
    stderr_tail,
    token_counts,
)
from pulse.core.config import ADAPTER_ARGV
from pulse.core.home import RUN_TOKEN_ENV

USAGE = {"input_tokens": "input", "cached_input_tokens": "cache_read", "cache_write_input_tokens": "cache_write",
         "output_tokens": "output", "reasoning_output_tokens": "reasoning"}
SECRET_ENV = (RUN_TOKEN_ENV,)   # passed by name (env_vars), never written into the command line
RECOVERED_KEPT = 5              # of the retries Codex recovered from, the last ones kept in the result


def _toml(value) -> str:
    """A TOML value: strings as basic strings (JSON's escapes are TOML's), lists, inline tables."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def _message(value) -> str:
    if isinstance(value, dict):
        inner = value.get("error", value)
        if isinstance(inner, dict):
            return str(inner.get("message") or json.dumps(inner))
        return str(value.get("message") or inner)
    return str(value)


class CodexAdapter(Adapter):
    name = "codex"
    default_argv = ADAPTER_ARGV["codex"]

    def add_mcp(self, inv: Invocation, server: dict) -> None:
        at = inv.argv.index("exec") + 1 if "exec" in inv.argv else 1
        secret = {k: v for k, v in server["env"].items() if k in SECRET_ENV}
        shown = {**server, "env": {k: v for k, v in server["env"].items() if k not in secret}}
        overrides = []
        for key in ("command", "args", "env"):
            overrides += ["-c", f"mcp_servers.pulse.{key}={_toml(shown[key])}"]
        if secret:      # by name from Codex's environment, which the run's env already holds
            inv.env.update(secret)
            overrides += ["-c", f"mcp_servers.pulse.env_vars={_toml(sorted(secret))}"]
        # Wait for it before the turn (see the module's docstring): without it, its tools, or not at all.
        overrides += ["-c", "mcp_servers.pulse.required=true",
                      "-c", f"mcp_servers.pulse.startup_timeout_sec={MCP_STARTUP_TIMEOUT_S}",
                      # Granted: exec asks no one, so a tool that needs approval is refused (see the docstring).
                      "-c", 'mcp_servers.pulse.default_tools_approval_mode="approve"']
        inv.argv[at:at] = overrides

    def report_to(self, inv: Invocation, receiver, operator_env: dict[str, str]) -> None:
        # Codex's [otel] table: its log events (codex.api_request, codex.sse_event with the token
        # counts, codex.tool_result) over OTLP/HTTP in protobuf, set as `-c` overrides after `exec`
        # like the MCP server; the token, when one is needed, goes by the environment
        # (OTEL_EXPORTER_OTLP_HEADERS), never on the command line. An argv that sets otel.* itself wins.
        otel.tag(inv.env, receiver.tags)
        if otel.operator_decides(operator_env) or any(a.startswith("otel.") for a in inv.argv):
            return
        at = inv.argv.index("exec") + 1 if "exec" in inv.argv else 1
        exporter = {"otlp-http": {"endpoint": f"{receiver.url}/v1/logs", "protocol": "binary"}}
        inv.argv[at:at] = ["-c", f"otel.exporter={_toml(exporter)}"]
        if (headers := receiver.headers_env()) is not None:
            inv.env[otel.HEADERS_ENV] = headers

    def parse(self, run: RunOutput) -> AgentResult:
        events, bad = json_lines(run.text)
        said = [_message(ev) for ev in events if ev.get("type") == "error"]
        if run.timed_out or not events:
            return failed_run(run, None if run.timed_out else
                              ("no output" if not run.stdout.strip() else "no JSON events in the output"),
                              last_said=said[-1] if said else None)
        result = AgentResult(ok=True, turns=0, extra={"bad_lines": bad} if bad else {})
        last_turn_failed = None
        for ev in events:
            kind = ev.get("type")
            if kind == "thread.started" and isinstance(ev.get("thread_id"), str):
                result.session_id = ev["thread_id"]
            elif kind == "item.completed" and isinstance(ev.get("item"), dict):
                item = ev["item"]
                if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                    result.text = item["text"]
            elif kind == "turn.completed":
                result.turns += 1
                last_turn_failed = None
                for name, n in token_counts(ev.get("usage"), USAGE).items():
                    result.tokens[name] = result.tokens.get(name, 0) + n
            elif kind == "turn.failed":
                last_turn_failed = _message(ev.get("error", ev))
        if last_turn_failed is not None:
            return _with(failed(last_turn_failed), result)
        if run.code != 0:
            why = "; ".join(dict.fromkeys(said)) or stderr_tail(run)
            return _with(failed("; ".join(p for p in (why, f"exit code {run.code}") if p)), result)
        if said:
            result.extra["recovered"] = said[-RECOVERED_KEPT:]
        if not result.text:
            result.ok, result.reason, result.error = False, "empty-result", "no agent_message in the output"
        return result


def _with(failure: AgentResult, seen: AgentResult) -> AgentResult:
    """`failure`, keeping what the run reported before it failed (session, tokens, turns)."""
    failure.session_id, failure.tokens, failure.turns = seen.session_id, seen.tokens, seen.turns
    failure.extra.update(seen.extra)
    return failure
