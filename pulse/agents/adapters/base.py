"""What every adapter shares: argv templates, the task and run it sees, the result it returns.

argv is a list, never a shell string. Each element may hold placeholders, substituted
element by element (a prompt full of `;`, `$(...)` or quotes stays one argument, verbatim):

    {prompt} {task_id} {title} {project} {agent} {workdir}      ({{ and }} are literal braces)

env values take the same placeholders; cwd takes {task_id} {agent} {project}. An unknown
placeholder is a config error. Unset cwd: a fresh `<home>/work/<task_id>`. {workdir} is the
directory the agent runs in.

Every run's process gets PULSE_HOME, PULSE_AGENT (the [[agent]] name) and PULSE_TASK (the task
id) in its environment (plus PULSE_TASK_ID and PULSE_WORKDIR), so a `pulsectl mcp` its CLI
starts knows whose run it serves. An adapter whose CLI documents a way to be handed an MCP
server adds `pulsectl mcp` to the run when the [[agent]] has `mcp = true` (the default).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pulse.agents import otel
from pulse.core.argvtemplate import substitute

SUMMARY_CHARS = 4_000            # of the agent's final text kept in the task events (the rest: objects/)
TAIL_CHARS = 1_000
STDERR_LINES = 5                 # the last lines of stderr that become a failure's reason
OPTIONS_END = "--"               # every option before it: a prompt that starts with "-" stays a prompt

# Failures that cannot fix themselves: retrying the same run gives the same answer, so the task
# is given up at once (pulse.agents.tasks.FINAL_REASONS), saying why. Matched in the CLI's own
# words (its JSON's message, else stderr), as the real CLIs print them.
_FINAL = [
    ("not-logged-in", re.compile(r"not logged in|please run /login|invalid (?:x-)?api[ _-]?key|"
                                 r"authentication_error|incorrect api key", re.I)),
    ("missing-key", re.compile(r"missing environment variable|no inference provider configured|"
                               r"requires credentials|no api key", re.I)),
    ("usage", re.compile(r"unknown option|unexpected argument|unrecognized arguments?|"
                         r"error: the following arguments are required", re.I)),
]


# -- what an adapter sees and returns ----------------------------------------------------------------

@dataclass
class Task:
    """What an adapter knows of the task it runs."""
    id: str
    prompt: str
    title: str = ""
    project: str = ""


@dataclass
class Invocation:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    scratch: str | None = None        # the run's private directory (MCP config, usage file); removed after


@dataclass
class RunOutput:
    """What came out of one run of the CLI."""
    code: int | None                  # None: killed at the timeout
    stdout: bytes
    stderr: bytes
    timed_out: bool
    invocation: Invocation

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


@dataclass
class AgentResult:
    """One run's outcome, whatever the CLI: it goes into task-acked / task-failed (as `summary()`)
    and, through those events, into AgentCapabilityStats (cost and tokens per agent)."""
    ok: bool
    error: str | None = None           # why it failed, in the CLI's own words where it gave any
    reason: str = "agent"              # task-failed's stable reason: agent | timeout | turn-cap | ...
    text: str | None = None            # the agent's final answer
    session_id: str | None = None      # session or thread id, to resume
    cost_usd: float | None = None
    tokens: dict[str, int] = field(default_factory=dict)     # input / output / cache_read / ... as reported
    turns: int | None = None
    duration_ms: float | None = None   # as the CLI reports it (Pulse times the run itself: run_ms)
    extra: dict[str, Any] = field(default_factory=dict)      # other reported fields worth keeping

    def summary(self, code: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {"code": code}
        if self.text is not None:
            out["result"] = self.text[:SUMMARY_CHARS]
        for key in ("session_id", "cost_usd", "turns", "duration_ms"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.tokens:
            out["tokens"] = dict(self.tokens)
        out.update(self.extra)
        return out


class Adapter:
    """Subclass and register under the `pulse.adapters` entry point group."""
    name = "adapter"
    default_argv: list[str] | None = None        # used when the [[agent]] sets no argv (config.ADAPTER_ARGV)

    def values(self, agent, task: Task, workdir: str) -> dict[str, str]:
        return {"prompt": task.prompt, "task_id": task.id, "title": task.title, "project": task.project,
                "agent": agent.name, "workdir": workdir}

    def invocation(self, agent, task: Task, workdir: str, home: str | os.PathLike | None = None,
                   scratch: str | None = None) -> Invocation:
        values = self.values(agent, task, workdir)
        argv = [substitute(a, values) for a in (agent.argv or self.default_argv or [])]
        env = {k: substitute(v, values) for k, v in agent.env.items()}
        env.update(run_env(agent.name, task.id, home), PULSE_TASK_ID=task.id, PULSE_WORKDIR=workdir)
        inv = Invocation(argv, env, workdir, scratch)
        if getattr(agent, "mcp", False) and scratch is not None:
            self.add_mcp(inv, mcp_server(inv.env))
        return inv

    def options_at(self, inv: Invocation) -> int:
        """Where an option may be added to `inv.argv`: before its `--`, else at the end."""
        return inv.argv.index(OPTIONS_END) if OPTIONS_END in inv.argv else len(inv.argv)

    def add_mcp(self, inv: Invocation, server: dict[str, Any]) -> None:
        """Hand the run `server` ({"command", "args", "env"}) the way the CLI documents; the base
        adapter knows of no way, so the agent gets no Pulse tools."""

    def report_to(self, inv: Invocation, receiver, operator_env: dict[str, str]) -> None:
        """Point the run's telemetry at Pulse's receiver (pulse.agents.otel.Receiver) the way the CLI
        documents, unless `operator_env` (the [[agent]]'s own env) says otherwise. The base adapter
        knows no way: it only tags the run (OTEL_RESOURCE_ATTRIBUTES), for a CLI that exports by itself."""
        otel.tag(inv.env, receiver.tags)

    def cap_spend(self, inv: Invocation, usd: float) -> None:
        """Cap the run's spend at `usd` (what is left under the tightest spend limit, pulse.agents.spend)
        the way the CLI documents; the base adapter knows of no way: the limits still hold, run by run."""

    def parse(self, run: RunOutput) -> AgentResult:
        raise NotImplementedError


# -- helpers for adapters ----------------------------------------------------------------------------

def run_env(agent: str, task: str, home: str | os.PathLike | None) -> dict[str, str]:
    """The environment that names the run to the processes it starts (a `pulsectl mcp` among them)."""
    env = {"PULSE_AGENT": agent, "PULSE_TASK": task}
    if home is not None:
        env["PULSE_HOME"] = str(home)
    return env


def pulsectl_command() -> str:
    """pulsectl beside the running interpreter (a venv's bin/), else whatever PATH has."""
    here = Path(sys.executable).parent / "pulsectl"
    return str(here) if here.exists() else "pulsectl"


# How long a CLI waits for `pulsectl mcp` to answer its initialize before the run's first turn
# (seconds). Claude Code and Codex start their MCP servers in the background and, unless told to
# wait, answer without them: under load the proxy's Python start (the MCP SDK's imports, its gate
# connection) took longer than a short run's turn, and the run had no Pulse tools at all.
MCP_STARTUP_TIMEOUT_S = 30


def mcp_server(env: dict[str, str]) -> dict[str, Any]:
    """`pulsectl mcp` as an MCP stdio server entry, with the run's naming environment."""
    # PULSE_RUN_TOKEN and PULSE_GATE_SOCKET (pulse.core.home, pulse.gate.runs): who the session is, and where the gate is;
    # PULSE_RUN (pulse.effects.kinds.RUN_MARK): the run's mark, by which what is left of it is ended. A CLI that
    # starts its servers with a cleaned environment (Codex) gives them only what this entry says.
    keep = {k: env[k] for k in ("PULSE_HOME", "PULSE_AGENT", "PULSE_TASK", "PULSE_RUN_TOKEN", "PULSE_GATE_SOCKET",
                                "PULSE_RUN") if k in env}
    return {"command": pulsectl_command(), "args": ["mcp"], "env": keep}


def exit_problem(code: int | None, timed_out: bool) -> str | None:
    if timed_out:
        return "timed out; its process group was killed"
    if code is None or code != 0:
        return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return None


def stderr_tail(run: RunOutput, lines: int = STDERR_LINES) -> str:
    """The last non-empty lines of stderr, joined: a CLI's own words when it printed no result."""
    kept = [line.strip() for line in run.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[-TAIL_CHARS:]


def final_reason(said: str | None) -> str | None:
    """The reason code of a failure that cannot fix itself, read from the CLI's words, or None."""
    if said:
        for reason, pattern in _FINAL:
            if pattern.search(said):
                return reason
    return None


def failed(error: str, reason: str = "agent", **extra) -> AgentResult:
    """A failed run: `error` in the CLI's own words; a reason that cannot fix itself is found in them."""
    return AgentResult(ok=False, error=error, reason=final_reason(error) or reason, extra=extra)


def failed_run(run: RunOutput, why: str | None = None, last_said: str | None = None) -> AgentResult:
    """A run that gave no usable result: timeout first (with `last_said`, what the CLI said last,
    so a run that hung retrying says on what), else `why`, else stderr's last lines and the exit."""
    said = stderr_tail(run)
    if run.timed_out:
        error = exit_problem(None, True) + (f"; it last said: {last_said}" if last_said else "")
        return AgentResult(ok=False, reason="timeout", error=error, extra={"stderr": said} if said else {})
    if why and said and why.strip() in said:
        why = None              # the CLI said it on stderr too (Hermes: its usage file and stderr)
    parts = [p for p in (why, said, exit_problem(run.code, False)) if p]
    return failed("; ".join(parts) or "the agent failed", **({"tail": run.text[-TAIL_CHARS:]}
                                                              if run.stdout.strip() else {}))


def json_result(run: RunOutput, exit_fails: bool = True) -> tuple[dict | None, AgentResult | None]:
    """(the CLI's JSON object, None), or (None, the failure): timed out, exited non-zero (when
    `exit_fails`: a CLI whose JSON says how it failed sets it False), no output, or no JSON."""
    obj = json_object(run.text)
    if run.timed_out or (exit_fails and run.code != 0):
        return None, failed_run(run)
    if obj is None:
        return None, failed_run(run, "no output" if not run.stdout.strip() else "no JSON result in the output")
    return obj, None


def json_object(text: str) -> dict | None:
    """The CLI's JSON object: the whole output, or else its last line that is one."""
    for candidate in [text, *reversed(text.splitlines())]:
        candidate = candidate.strip()
        if not candidate.startswith("{"):
            continue
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def json_lines(text: str) -> tuple[list[dict], int]:
    """The JSON objects of a JSON Lines stream, and how many non-empty lines were not one."""
    events, bad = [], 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(value, dict):
            events.append(value)
        else:
            bad += 1
    return events, bad


def number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def count(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def token_counts(usage: Any, names: dict[str, str]) -> dict[str, int]:
    """{our name: n} for each `names` key (the CLI's field) that `usage` reports as an integer."""
    if not isinstance(usage, dict):
        return {}
    return {ours: usage[theirs] for theirs, ours in names.items() if count(usage.get(theirs)) is not None}
