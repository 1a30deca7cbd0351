"""Agent adapters: how one agent CLI runs one task (the `agent-run` effect, pulse.agents.agentrun).

An agent is a `[[agent]]` table in config.toml (pulse.core.config.Agent): a name, an adapter,
an argv template, cwd, env, timeout_s, concurrency and mcp. An adapter turns a task plus that
table into what to run (`invocation`), and what came out (exit code, stdout, stderr, its files)
into one AgentResult (`parse`): final text, done or failed with the CLI's own reason, session id,
cost, tokens, turns, duration where the CLI reports them. The executor does the rest: the checked
task transitions, the process group, the timeout, the output into objects/.

`base` holds the templates, the interface and the shared parsing; `command` runs any CLI by its exit
code alone; each other module is one CLI, and its docstring says what its CLI documents and what it
reads where the format is not documented.

Every adapter, built-in or not, registers under the `pulse.adapters` entry point group (name =
the `adapter` key in config.toml; value = an Adapter subclass). Built-in names cannot be taken
over. config.toml is validated without importing any (pulse.core.config: the built-ins' argv,
the entry points' names); an adapter's code is imported by the executor, when an agent that
uses it runs.
"""

from __future__ import annotations

from pulse.agents.adapters.base import (
    SUMMARY_CHARS,
    TAIL_CHARS,
    Adapter,
    AgentResult,
    Invocation,
    RunOutput,
    Task,
)
from pulse.agents.adapters.claude_code import ClaudeCodeAdapter
from pulse.agents.adapters.codex import CodexAdapter
from pulse.agents.adapters.command import CommandAdapter
from pulse.agents.adapters.cursor import CursorAdapter
from pulse.agents.adapters.hermes import HermesAdapter
from pulse.agents.adapters.openclaw import OpenClawAdapter
from pulse.core.config import agentwork
from pulse.core.config.agentwork import ADAPTER_GROUP, adapter_names

BUILTIN: dict[str, type[Adapter]] = {cls.name: cls for cls in (
    CommandAdapter, ClaudeCodeAdapter, CursorAdapter, CodexAdapter, HermesAdapter, OpenClawAdapter)}

__all__ = ["BUILTIN", "SUMMARY_CHARS", "TAIL_CHARS", "Adapter",
           "AgentResult", "Invocation", "RunOutput", "Task", "adapter_names",
           "load_adapter", *(cls.__name__ for cls in BUILTIN.values())]


def load_adapter(name: str) -> Adapter:
    """The adapter called `name`: a built-in, else the entry point's class. LookupError if none."""
    if name in BUILTIN:
        return BUILTIN[name]()
    found = [ep for ep in agentwork.adapter_entry_points() if ep.name == name]
    if not found:
        raise LookupError(f"no adapter {name!r} (known: {', '.join(sorted(adapter_names()))})")
    loaded = found[0].load()
    adapter = loaded() if isinstance(loaded, type) else loaded
    if not isinstance(adapter, Adapter):
        raise LookupError(f"entry point {ADAPTER_GROUP}:{name} is not a pulse.agents.adapters.Adapter")
    return adapter
