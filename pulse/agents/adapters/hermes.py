"""`hermes`: Nous Research's Hermes Agent, `hermes -z "<prompt>" --usage-file FILE`.

Documented, and what 0.19 does: `-z` prints only the final text on stdout; the usage file
(written even when the run fails) holds `completed` / `failed`, `failure` (the message, when an
exception escaped), `estimated_cost_usd`, `cost_status`, token fields, `api_calls`, `model`,
`provider` and `session_id`. This adapter adds `--usage-file` (in the run's private scratch
directory) to every run, and reads:
  - done: exit code 0, non-empty text, and the usage file (if any) not saying failed;
  - failed: the usage file's `failed` true or `completed` false, or a non-zero exit. The reason
    is the file's `failure`, else, when Hermes exited 0 with its error as the "answer" (its API
    failed: "API call failed after 3 retries: Connection error."), that text, else stderr's last
    lines (`hermes -z: agent failed: ...`);
  - cost: `estimated_cost_usd`; session: `session_id`; tokens: `input_tokens`, `output_tokens`,
    `cache_read_tokens`, `cache_write_tokens`, `reasoning_tokens`, `total_tokens`; `api_calls`
    (model calls, not turns), `model` and `provider` are kept when the file names them.
A missing or unreadable usage file is noted (`usage_file`), not guessed at.

MCP: Hermes reads MCP servers only from its own config.yaml (no per-run flag), and expands
`${VAR}` there from its environment, which holds the run's PULSE_RUN_TOKEN and PULSE_GATE_SOCKET:
one `mcp_servers.pulse` entry the operator writes once (`command: pulsectl`, `args: [mcp]`, those
two in its `env`) serves every run, each as its own gate session. This adapter writes nothing into
Hermes' home. 0.19's -z discovers MCP servers in the background and its first turn waits for them
only `mcp_discovery_timeout` (1.5 s by default): under load `pulsectl mcp` missed it and the model
was offered no Pulse tool, so the entry goes with `mcp_discovery_timeout: 30` (docs/tasks.md).
"""

from __future__ import annotations

import json
import os

from pulse.agents.adapters.base import (
    TAIL_CHARS,
    Adapter,
    AgentResult,
    Invocation,
    RunOutput,
    failed_run,
    number,
    token_counts,
)
from pulse.core.config import ADAPTER_ARGV

USAGE = {"input_tokens": "input", "prompt_tokens": "input", "output_tokens": "output",
         "completion_tokens": "output", "cache_read_tokens": "cache_read", "cache_write_tokens": "cache_write",
         "reasoning_tokens": "reasoning", "total_tokens": "total"}
USAGE_FILE = "usage.json"


class HermesAdapter(Adapter):
    name = "hermes"
    default_argv = ADAPTER_ARGV["hermes"]

    def invocation(self, agent, task, workdir, home=None, scratch=None) -> Invocation:
        inv = super().invocation(agent, task, workdir, home, scratch)
        if scratch is not None:
            inv.argv += ["--usage-file", os.path.join(scratch, USAGE_FILE)]
        return inv

    def parse(self, run: RunOutput) -> AgentResult:
        usage, note = None, None
        if run.invocation.scratch is not None:
            try:
                with open(os.path.join(run.invocation.scratch, USAGE_FILE)) as f:
                    usage = json.load(f)
                if not isinstance(usage, dict):
                    usage, note = None, "not a JSON object"
            except FileNotFoundError:
                note = "not written"
            except (OSError, ValueError) as err:
                note = f"unreadable: {err}"
        said_failed = usage is not None and (usage.get("failed") is True or usage.get("completed") is False)
        said = next((usage[k] for k in ("failure", "error") if isinstance(usage.get(k), str) and usage[k].strip()),
                    None) if usage is not None else None
        text = run.text.strip()
        if run.timed_out:
            result = failed_run(run)
        elif run.code != 0 or said_failed:
            # Exit 0 with failed: Hermes printed its error where the answer goes.
            result = failed_run(run, said or (text[-TAIL_CHARS:] if run.code == 0 and text else None)
                                or (None if run.code != 0 else "the usage file says the run failed"))
        elif not text:
            result = AgentResult(ok=False, reason="empty-result", error="the agent printed no answer")
        else:
            result = AgentResult(ok=True, text=text)
        if note:
            result.extra["usage_file"] = note
        if usage is not None:
            result.cost_usd = number(usage.get("estimated_cost_usd"))
            result.session_id = usage.get("session_id") if isinstance(usage.get("session_id"), str) else None
            result.tokens = token_counts(usage, USAGE)
            result.extra.update({k: usage[k] for k in ("api_calls", "model", "provider") if usage.get(k) is not None})
        return result
