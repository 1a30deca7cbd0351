"""A real CLI calls one of Pulse's tools through `pulsectl mcp` and the gate: an [[agent]] of a real
pulsed, run by the agent-run executor against a scripted model on loopback (realtools.ScriptedModel:
LiteLLM's mock never asks for a tool) that asks for `find_process` of a configured [[process]], then
Pulse's `finish`, then ends its turn.

What must hold: the gate recorded the run's session (its task) and the call's begin and end, ok,
with what it looked at, and the finish; the task is acked with the model's final text, after one run.

Codex (its adapter hands it `pulsectl mcp`), Hermes (its config.yaml names `pulsectl mcp` once,
with the run's token from its environment), and OpenClaw with `--local` (its adapter hands the run a
config of its own). Through its gateway OpenClaw's turn runs in the gateway, which starts MCP
servers with the gateway's environment, not the run's: no run token reaches them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pulse.core.config import ADAPTER_ARGV
from realagents import clean_env, openclaw_env  # noqa: F401 (clean_env, autouse: no credential of the shell reaches a CLI)
from realtools import (
    CHAT_MODEL,
    MASTER_KEY,
    ScriptedModel,
    agent_env,
    free_port,
    require_tools,
)
from support import PULSECTL, wait_for

pytestmark = pytest.mark.realcli

TOOL = "find_process"
PROCESS = "worker"              # the [[process]] the model asks about: configured, never running (`true`)
FINAL = "DONE: looked it up"


@pytest.fixture
def model():
    with ScriptedModel([(TOOL, {"name": PROCESS}), ("finish", {"summary": f"{PROCESS} looked up"})], FINAL) as m:
        yield m


def toml_value(value) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return json.dumps(value)


def start(pulsed, adapter: str, env: dict, **agent) -> str:
    """pulsed with one [[agent]] and one [[process]] to look up; a task added. The task's id."""
    table = {"name": adapter, "adapter": adapter, "timeout_s": 90, **agent, "env": env}
    text = "[[agent]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items())
    text += f'\n[[process]]\nname = "{PROCESS}"\nmatch = "^no-such-program-pulse-gate-test$"\nrestart = ["true"]\n'
    pulsed.home.mkdir(exist_ok=True)
    (pulsed.home / "config.toml").write_text(text)
    pulsed.start(env={"PULSE_TICK_MS": "200"})
    out = pulsed.ctl("task", "add", "--project", "realcli", "--title", "look up",
                     "--prompt", f"Use Pulse's {TOOL} tool to look up the process {PROCESS!r}, then say DONE.")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split()[0].rstrip(":")


def through_the_gate(pulsed, task: str, model: ScriptedModel, timeout: float) -> dict:
    """The task acked after one run, its tool call recorded by the gate; the acked data."""
    def settled():
        evs = [e for e in pulsed.events(target=task) if e["type"].startswith("task-")]
        return evs if any(e["type"] in ("task-acked", "task-given-up", "task-failed") for e in evs) else None
    evs = wait_for(settled, timeout, 0.2, what=f"{task} acked or failed")
    types = [e["type"] for e in evs]
    failures = [e["data"].get("error") for e in evs if e["type"] == "task-failed"]
    assert types[-1] == "task-acked", f"{task}: {types}; failures: {failures}; the model offered {model.offered}"
    assert types.count("task-executing") == 1, types
    acked = evs[-1]["data"]
    assert acked["result"]["result"].strip() == FINAL, acked["result"]

    facts = [e["data"] for e in pulsed.events("gate-call")]
    opened = [f for f in facts if f.get("phase") == "open" and f.get("task") == task]
    assert opened, f"no gate session for {task}; the model offered {model.offered}, called {model.called}"
    sessions = {f["session"] for f in opened}
    calls = [f for f in facts if f.get("session") in sessions and f.get("tool") == TOOL]
    phases = [f["phase"] for f in calls]
    assert phases == ["begin", "end"], f"{TOOL} through the gate: {calls}; the model called {model.called}"
    end = calls[-1]
    assert end["ok"] is True and end["kind"] == "resolve", end
    assert any(PROCESS in str(e[0]) for e in end.get("evidence", [])), end
    finished = [f for f in facts if f.get("session") in sessions and f.get("phase") == "finish"]
    assert len(finished) == 1 and finished[0]["ok"] is True, finished
    print(f"{task} acked in {acked.get('run_ms')} ms after {TOOL} through the gate (session {end['session']})")
    return acked


def test_codex_calls_a_pulse_tool_through_the_gate(pulsed, model, tmp_path):
    require_tools("codex")
    home, codex_home = tmp_path / "codex-home", tmp_path / "codex-home" / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        f'model = "{CHAT_MODEL}"\nmodel_provider = "scripted"\n\n[model_providers.scripted]\nname = "scripted"\n'
        f'base_url = "{model.url}/v1"\nenv_key = "SCRIPTED_API_KEY"\nwire_api = "responses"\n'
        "request_max_retries = 0\nstream_max_retries = 0\n")
    env = agent_env(home, CODEX_HOME=str(codex_home), SCRIPTED_API_KEY=MASTER_KEY)
    task = start(pulsed, "codex", env)
    through_the_gate(pulsed, task, model, 120)



def test_hermes_calls_a_pulse_tool_through_the_gate(pulsed, model, tmp_path):
    """Hermes reads MCP servers from its own config.yaml only; `${VAR}` there is expanded from its
    environment, which holds the run's token and gate socket: one entry serves every run. Its first
    turn waits for MCP servers only `mcp_discovery_timeout` (1.5 s by default): under load
    `pulsectl mcp` came up later and the model was offered no Pulse tool (docs/tasks.md)."""
    require_tools("hermes")
    home, hermes_home = tmp_path / "hermes-home", tmp_path / "hermes-home" / ".hermes"
    hermes_home.mkdir(parents=True)
    (hermes_home / "config.yaml").write_text(
        f"model:\n  provider: custom\n  default: {CHAT_MODEL}\n  base_url: {model.url}/v1\n  api_key: {MASTER_KEY}\n"
        "agent:\n  api_max_retries: 1\n"
        "mcp_discovery_timeout: 30\n"
        f"mcp_servers:\n  pulse:\n    command: {PULSECTL}\n    args: [mcp]\n    env:\n"
        '      PULSE_RUN_TOKEN: "${PULSE_RUN_TOKEN}"\n      PULSE_GATE_SOCKET: "${PULSE_GATE_SOCKET}"\n')
    env = agent_env(home, HERMES_HOME=str(hermes_home))
    task = start(pulsed, "hermes", env)
    through_the_gate(pulsed, task, model, 120)



def test_openclaw_local_calls_a_pulse_tool_through_the_gate(pulsed, model, tmp_path):
    """OpenClaw starts an agent's MCP servers in the process that runs its turn: with `--local`, the
    CLI itself, in the run. The adapter hands that run its own config (OPENCLAW_CONFIG_PATH, in the
    run's scratch directory) that includes the operator's and adds `pulsectl mcp` with the run's
    variables as `${NAME}`, and Tool Search off (it hides every MCP tool behind tool_search).
    A --local turn is slow to start (SQLite maintenance, plugins, its memory index): the run took
    98-139 s on 2 cores at a load of 13-18, the test 104-150 s; the bounds stay under 3 min."""
    require_tools("openclaw", "node24")
    env = openclaw_env(tmp_path, f"{model.url}/v1", free_port())     # the operator's config: no MCP server
    # its plugins off: by hand, a --local turn took 55 s instead of 88 s (at a load of 17 on 2 cores)
    config = Path(env["OPENCLAW_STATE_DIR"]) / "openclaw.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "plugins": {"enabled": False}}, indent=2))
    argv = [*ADAPTER_ARGV["openclaw"], "--local"]
    task = start(pulsed, "openclaw", env, argv=argv, timeout_s=160)
    through_the_gate(pulsed, task, model, 175)
