"""Agent adapters: how one agent CLI runs one task (the `agent-run` effect, pulse.effects.kinds).

An agent is a `[[agent]]` table in config.toml (pulse.core.config.Agent): a name, an adapter,
an argv template, cwd, env, timeout_s and concurrency. An adapter turns a task plus that
table into what to run (`invocation`), and what came out (exit code, output) into a result
(`parse`). The executor does the rest: the checked task transitions, the process group,
the timeout, the output into objects/.

argv is a list, never a shell string. Each element may hold placeholders, substituted
element by element (a prompt full of `;`, `$(...)` or quotes stays one argument, verbatim):

    {prompt} {task_id} {title} {project} {agent} {workdir}      ({{ and }} are literal braces)

env values take the same placeholders; cwd takes {task_id} {agent} {project}. An unknown
placeholder is a config error. Unset cwd: a fresh `<home>/work/<task_id>`. {workdir} is the
directory the agent runs in.

Built-in adapters:
    command      any CLI: exit code 0 = done; the result is the exit code and the output's tail.
    claude-code  Claude Code's non-interactive mode. Assumption (documented, not verified against
                 every version): `claude -p "<prompt>" --output-format json` prints one JSON object
                 {"type": "result", "subtype": "success" | "error_...", "is_error": bool,
                 "result": "<final text>", "session_id": "...", "total_cost_usd": n,
                 "num_turns": n, "duration_ms": n} and exits non-zero on failure. Done = exit code
                 0, that object found and is_error false. Its default argv is the line above; an
                 argv in config.toml replaces it (add "--model", "--allowedTools", ... there).

Third-party adapters register under the `pulse.adapters` entry point group (name = the
`adapter` key in config.toml; value = an Adapter subclass). Built-in names cannot be
taken over. Only names are read when config.toml is validated: an adapter's code is
imported by the executor, when an agent that uses it runs.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field
from typing import Any, Iterable

GROUP = "pulse.adapters"
PLACEHOLDERS = ("prompt", "task_id", "title", "project", "agent", "workdir")
CWD_PLACEHOLDERS = ("task_id", "agent", "project")
SUMMARY_CHARS = 4_000            # of the agent's final text kept in the task-acked event (the rest: objects/)
TAIL_CHARS = 1_000


# -- templates ---------------------------------------------------------------------------------------

def placeholders(template: str, allowed: Iterable[str] = PLACEHOLDERS) -> list[str]:
    """The placeholders of `template`; ValueError naming an unknown or malformed one."""
    allowed = tuple(allowed)
    out = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"malformed template {template!r}: {err} (write {{{{ and }}}} for literal braces)") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in allowed or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"unknown placeholder {shown}; known: {', '.join('{' + a + '}' for a in allowed)}")
        out.append(name)
    return out


def substitute(template: str, values: dict[str, str]) -> str:
    """`template` with its placeholders replaced by plain text: no format mini-language, no shell."""
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(literal)
        if name is not None:
            parts.append(values[name])
    return "".join(parts)


# -- the interface -----------------------------------------------------------------------------------

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


@dataclass
class AgentResult:
    ok: bool
    summary: dict[str, Any] = field(default_factory=dict)    # the task's result (task-acked), JSON-able
    error: str | None = None                                  # why it failed (task-failed)


class Adapter:
    """Subclass and register under the `pulse.adapters` entry point group."""
    name = "adapter"
    default_argv: list[str] | None = None        # used when the [[agent]] sets no argv

    def check(self, agent) -> str | None:
        """A problem with this [[agent]] table (config time), or None."""
        if not (agent.argv or self.default_argv):
            return f"adapter {agent.adapter!r} needs an argv"
        return None

    def values(self, agent, task: Task, workdir: str) -> dict[str, str]:
        return {"prompt": task.prompt, "task_id": task.id, "title": task.title, "project": task.project,
                "agent": agent.name, "workdir": workdir}

    def invocation(self, agent, task: Task, workdir: str) -> Invocation:
        values = self.values(agent, task, workdir)
        argv = [substitute(a, values) for a in (agent.argv or self.default_argv or [])]
        env = {k: substitute(v, values) for k, v in agent.env.items()}
        env.update(PULSE_TASK_ID=task.id, PULSE_AGENT=agent.name, PULSE_WORKDIR=workdir)
        return Invocation(argv, env, workdir)

    def parse(self, code: int | None, output: bytes, timed_out: bool) -> AgentResult:
        raise NotImplementedError


def _exit_problem(code: int | None, timed_out: bool) -> str | None:
    if timed_out:
        return "timed out; its process group was killed"
    if code is None or code != 0:
        return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return None


class CommandAdapter(Adapter):
    """Any CLI: exit code 0 means done; the result is the exit code and the tail of the output."""
    name = "command"

    def parse(self, code: int | None, output: bytes, timed_out: bool) -> AgentResult:
        text = output.decode("utf-8", "replace")
        summary = {"code": code, "tail": text[-TAIL_CHARS:]}
        problem = _exit_problem(code, timed_out)
        return AgentResult(ok=problem is None, summary=summary, error=problem)


def _json_object(text: str) -> dict | None:
    """The agent's JSON object: the whole output, or else its last line that is one
    (stderr is merged into the output, so warnings may come before it)."""
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


class ClaudeCodeAdapter(Adapter):
    """Claude Code's non-interactive mode: `claude -p "<prompt>" --output-format json` (see the module doc)."""
    name = "claude-code"
    default_argv = ["claude", "-p", "{prompt}", "--output-format", "json"]
    KEPT = ("session_id", "subtype", "num_turns", "duration_ms", "total_cost_usd")

    def parse(self, code: int | None, output: bytes, timed_out: bool) -> AgentResult:
        text = output.decode("utf-8", "replace")
        obj = _json_object(text)
        problem = _exit_problem(code, timed_out)
        if obj is None:
            return AgentResult(ok=False, summary={"code": code, "tail": text[-TAIL_CHARS:]},
                          error=problem or "no JSON result in the output")
        result = obj.get("result")
        summary = {"code": code, "result": (result if isinstance(result, str) else json.dumps(result))[:SUMMARY_CHARS]
                   if result is not None else None, **{k: obj[k] for k in self.KEPT if k in obj}}
        if obj.get("is_error"):
            reported = f"the agent reported an error ({obj.get('subtype', 'is_error')})"
            problem = reported if problem is None else f"{reported}; {problem}"
        return AgentResult(ok=problem is None, summary=summary, error=problem)


BUILTIN: dict[str, type[Adapter]] = {"command": CommandAdapter, "claude-code": ClaudeCodeAdapter}


# -- discovery ---------------------------------------------------------------------------------------

def _entry_points():
    from importlib.metadata import entry_points
    return entry_points(group=GROUP)


def adapter_names() -> set[str]:
    """Every adapter name: the built-ins and the `pulse.adapters` entry points (names only, nothing imported)."""
    return set(BUILTIN) | {ep.name for ep in _entry_points()}


def load_adapter(name: str) -> Adapter:
    """The adapter called `name`: a built-in, else the entry point's class. LookupError if none."""
    if name in BUILTIN:
        return BUILTIN[name]()
    found = [ep for ep in _entry_points() if ep.name == name]
    if not found:
        raise LookupError(f"no adapter {name!r} (known: {', '.join(sorted(adapter_names()))})")
    loaded = found[0].load()
    adapter = loaded() if isinstance(loaded, type) else loaded
    if not isinstance(adapter, Adapter):
        raise LookupError(f"entry point {GROUP}:{name} is not a pulse.agents.adapters.Adapter")
    return adapter


def check_agent(agent) -> str | None:
    """Config-time problems of one [[agent]] that need the adapter (names only for third parties)."""
    if agent.adapter not in adapter_names():
        return f"adapter: no adapter {agent.adapter!r} (known: {', '.join(sorted(adapter_names()))})"
    if agent.adapter in BUILTIN:
        return BUILTIN[agent.adapter]().check(agent)
    return None
