"""`codex`: OpenAI Codex, `codex exec --json --skip-git-repo-check "<prompt>"`.

Documented output: JSON Lines events `thread.started{thread_id}`, `turn.started`,
`item.started/updated/completed{item}` (item types include `agent_message` with `text`,
`reasoning`, `command_execution`), `turn.completed{usage}`, `turn.failed{error}`, `error`.
Read here:
  - the final text is the last completed `agent_message` item's `text`;
  - the session id is `thread.started`'s `thread_id`; turns = the number of `turn.completed`;
  - tokens: `usage.input_tokens`, `cached_input_tokens`, `output_tokens`, summed over turns;
    Codex reports no money, so no cost;
  - `turn.failed` or `error` fails the run with its message.
Not documented exactly: the shape of `error` in `turn.failed` and of the `error` event (read:
`error.message`, else `message`, else the value as text), and the exit code (non-zero fails it).
Lines that are not JSON are counted (`bad_lines`); a run with no event at all fails.

MCP: Codex takes config overrides as `-c key=value` (TOML values) and its MCP servers are the
`mcp_servers.<name>` table of its config (`command`, `args`, `env`); the run gets
`-c mcp_servers.pulse.command=…`, `.args=…`, `.env=…` right after `exec` (codex exec has no
--mcp-config; these override forms are the ones a third-party wrapper reports accepted by
`codex exec --strict-config` 0.145). The env is set explicitly: Codex hands an MCP server only a
whitelist of its own environment.
"""

from __future__ import annotations

import json

from pulse.agents.adapters.base import (Adapter, AgentResult, Invocation, RunOutput, failed_run, json_lines,
                                        token_counts)

USAGE = {"input_tokens": "input", "cached_input_tokens": "cache_read", "output_tokens": "output"}


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
    default_argv = ["codex", "exec", "--json", "--skip-git-repo-check", "{prompt}"]

    def add_mcp(self, inv: Invocation, server: dict) -> None:
        at = inv.argv.index("exec") + 1 if "exec" in inv.argv else 1
        overrides = []
        for key in ("command", "args", "env"):
            overrides += ["-c", f"mcp_servers.pulse.{key}={_toml(server[key])}"]
        inv.argv[at:at] = overrides

    def parse(self, run: RunOutput) -> AgentResult:
        events, bad = json_lines(run.text)
        if run.timed_out or not events:
            return failed_run(run, None if run.timed_out else
                              ("no output" if not run.stdout.strip() else "no JSON events in the output"))
        result = AgentResult(ok=True, turns=0, extra={"bad_lines": bad} if bad else {})
        errors = []
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
                for name, n in token_counts(ev.get("usage"), USAGE).items():
                    result.tokens[name] = result.tokens.get(name, 0) + n
            elif kind == "turn.failed":
                errors.append(_message(ev.get("error", ev)))
            elif kind == "error":
                errors.append(_message(ev))
        if errors:
            result.ok, result.error = False, "; ".join(dict.fromkeys(errors))
        elif run.code != 0:
            failed = failed_run(run)
            result.ok, result.error = False, failed.error
        elif not result.text:
            result.ok, result.reason, result.error = False, "empty-result", "no agent_message in the output"
        return result
