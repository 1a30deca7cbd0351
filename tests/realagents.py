"""What the real agent CLIs' tests share (tests/test_realcli_claude.py, _codex, _hermes, _openclaw):
pulsed with one [[agent]], tasks added with pulsectl and followed to their end, each CLI's config and
environment. The CLIs come from scripts/install_realcli.sh (<repo>/.realcli, or $PULSE_REALCLI_DIR),
and run against a local model endpoint on 127.0.0.1 (LiteLLM with mock_response "PONG": the
`litellm` fixture of tests/conftest.py, one per test worker), a fake Anthropic endpoint or a
closed port. Nothing here needs the internet.

Each CLI's HOME and its own state directory (CODEX_HOME, HERMES_HOME, OPENCLAW_STATE_DIR) are in
the test's tmp dir; the shell's credentials never reach a CLI (`clean_env`, which each test module
imports to have it autouse); every process started is killed by pid at teardown; retries and
timeouts are bounded so that the group stays short.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

from pulse.store import objects
from realtools import CHAT_MODEL, CODEX_MODEL, MASTER_KEY, SECRET_PREFIXES, agent_env, openclaw_config
from support import wait_for

# The reasons a run cannot fix by running again: its task is given up after that one failure.
FINAL_REASONS = {"not-logged-in", "missing-key", "usage", "turn-cap", "tool-denied"}
DASH_PROMPT = "- say PONG\n- nothing else"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No credential of the shell reaches pulsed or a CLI; HOME is a tmp dir for all of them."""
    for key in list(os.environ):
        if key.startswith(SECRET_PREFIXES):
            monkeypatch.delenv(key)
    home = tmp_path / "user-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


# -- pulsed, tasks and results -------------------------------------------------------------------------

def toml_value(value) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value) if not isinstance(value, list) else "[" + ", ".join(map(toml_value, value)) + "]"


def start(pulsed, adapter: str, env: dict, argv: list[str] | None = None, timeout_s: float = 60,
          max_failures: int | None = None, before: str = "", **agent) -> None:
    """pulsed with one [[agent]] named after its adapter (and [tasks] max_failures if given), after
    the TOML `before`."""
    table = {"name": adapter, "adapter": adapter, **({"argv": argv} if argv else {}), "timeout_s": timeout_s,
             **agent, "env": env}
    text = before + "[[agent]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items())
    if max_failures is not None:
        text += f"\n[tasks]\nmax_failures = {max_failures}\n"
    pulsed.home.mkdir(exist_ok=True)
    (pulsed.home / "config.toml").write_text(text)
    pulsed.start(env={"PULSE_TICK_MS": "200"})


def add_task(pulsed, prompt: str = "Reply with PONG and nothing else.") -> str:
    out = pulsed.ctl("task", "add", "--project", "realcli", "--title", "pong", "--prompt", prompt)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split()[0].rstrip(":")


def task_events(pulsed, task: str) -> list[dict]:
    return [e for e in pulsed.events(target=task) if e["type"].startswith("task-")]


def settled(pulsed, task: str, timeout: float) -> list[dict]:
    """The task's events once it is acked or given up."""
    def done():
        evs = task_events(pulsed, task)
        return evs if any(e["type"] in ("task-acked", "task-given-up") for e in evs) else None
    return wait_for(done, timeout, 0.2, what=f"{task} acked or given up")


def first_failure(pulsed, task: str, timeout: float) -> dict:
    """The data of the task's first task-failed."""
    ev = wait_for(lambda: next(iter(pulsed.events("task-failed", task)), None), timeout, 0.2,
                  what=f"{task} failed")
    print(f"{task} failed ({ev['data'].get('reason')}) in {ev['data'].get('run_ms')} ms: {ev['data'].get('error')}")
    return ev["data"]


def shown(pulsed, task: str) -> dict:
    out = pulsed.ctl("task", "show", task, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def acked(pulsed, task: str, timeout: float) -> dict:
    """task-acked's data, after exactly one run; else the test fails with what the task went through."""
    evs = settled(pulsed, task, timeout)
    types = [e["type"] for e in evs]
    failures = [e["data"].get("error") for e in evs if e["type"] == "task-failed"]
    assert types[-1] == "task-acked", f"{task}: {types}; failures: {failures}"
    assert types.count("task-executing") == 1, f"{task} ran {types.count('task-executing')} times: {failures}"
    state = shown(pulsed, task)
    assert state["status"] == "acked" and state["attempts"] == 1
    data = evs[-1]["data"]
    print(f"{task} acked in {data.get('run_ms')} ms: {json.dumps(data['result'])}")
    return data


def output(pulsed, data: dict) -> str:
    """What the CLI printed on stdout in that run (kept in objects/)."""
    return objects.get(pulsed.home / "objects", data["output"]).decode()


def given_up_at_once(pulsed, task: str, timeout: float) -> dict:
    """A reason that cannot fix itself: one task-failed, then task-given-up; `task show` says
    given_up after 1 attempt. Returns the task-failed's data."""
    first_failure(pulsed, task, timeout)
    evs = task_events(pulsed, task)
    types = [e["type"] for e in evs]
    failed = next(e["data"] for e in evs if e["type"] == "task-failed")
    assert types[-2:] == ["task-failed", "task-given-up"], \
        f"{task} not given up after its first failure: {types}; the failure: {failed}"
    assert failed.get("final") is True or failed.get("reason") in FINAL_REASONS, failed
    state = shown(pulsed, task)
    assert (state["status"], state["attempts"]) == ("given_up", 1), state
    return failed


def gate_opened_before_the_answer(pulsed, task: str) -> str | None:
    """Why the run did not have Pulse's tools for its turn, or None when it did: a `pulsectl mcp`
    session for the task was opened (the gate writes that fact before it welcomes the proxy, and
    the proxy answers the CLI's initialize only after its welcome) before the task was acked.
    Both CLIs start MCP servers in the background; unless told to wait for Pulse's (the adapters
    do) a short run answers before the proxy is up: the fact then comes late, or never."""
    events = pulsed.events()
    opened = [e["id"] for e in events if e["type"] == "gate-call" and e["data"].get("phase") == "open"
              and e["data"].get("task") == task]
    answered = [e["id"] for e in events if e["type"] == "task-acked" and e["target"] == task]
    if not opened:
        return "no gate session opened for the run"
    if not answered or opened[0] > answered[0]:
        return f"the gate session opened (event {opened[0]}) after the run was acked (event {answered[:1]})"
    return None


# -- per CLI: config and environment ---------------------------------------------------------------------

def claude_env(tmp_path, base_url: str, key: str | None = MASTER_KEY, **extra) -> dict:
    home = tmp_path / "claude-home"
    home.mkdir(exist_ok=True)
    env = agent_env(home, ANTHROPIC_BASE_URL=base_url, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                    DISABLE_AUTOUPDATER="1", **extra)
    if key:
        env["ANTHROPIC_API_KEY"] = key
    return env


def codex_env(tmp_path, base_url: str, key: str | None = MASTER_KEY, stream_retries: int = 0) -> dict:
    """CODEX_HOME/config.toml: the `litellm` provider (Responses API, key from LITELLM_API_KEY),
    Codex's own request retries off, its stream retries `stream_retries`."""
    home, codex_home = tmp_path / "codex-home", tmp_path / "codex-home" / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{CODEX_MODEL}"\nmodel_provider = "litellm"\n\n[model_providers.litellm]\nname = "LiteLLM"\n'
        f'base_url = "{base_url}/v1"\nenv_key = "LITELLM_API_KEY"\nwire_api = "responses"\n'
        f"request_max_retries = 0\nstream_max_retries = {stream_retries}\n")
    env = agent_env(home, CODEX_HOME=str(codex_home))
    if key:
        env["LITELLM_API_KEY"] = key
    return env


def hermes_env(tmp_path, base_url: str | None) -> dict:
    """HERMES_HOME/config.yaml: a `custom` provider on `base_url`/v1, one retry; None: no provider."""
    home, hermes_home = tmp_path / "hermes-home", tmp_path / "hermes-home" / ".hermes"
    hermes_home.mkdir(parents=True, exist_ok=True)
    if base_url:
        (hermes_home / "config.yaml").write_text(
            f"model:\n  provider: custom\n  default: {CHAT_MODEL}\n  base_url: {base_url}/v1\n  api_key: {MASTER_KEY}\n"
            "agent:\n  api_max_retries: 1\n")
    return agent_env(home, HERMES_HOME=str(hermes_home))


def openclaw_env(tmp_path, litellm_url: str, gateway_port: int) -> dict:
    home, state = tmp_path / "openclaw-home", tmp_path / "openclaw-home" / ".openclaw"
    home.mkdir(exist_ok=True)
    openclaw_config(state, litellm_url, gateway_port)
    return agent_env(home, OPENCLAW_STATE_DIR=str(state))


def cli_json(text: str) -> dict:
    """The one JSON object a CLI printed (the whole stdout, or its last line that is one)."""
    try:
        return json.loads(text)
    except ValueError:
        return next(json.loads(line) for line in reversed(text.splitlines()) if line.startswith("{"))


class CmdlineWatch:
    """Every process's environment and command line, read over and over in a thread while in the
    block: the values of `prefix` (NAME=) found in environments, and the command lines (which any
    account can read) that held one of them."""

    def __init__(self, prefix: bytes):
        self.prefix, self.tokens, self.seen = prefix, set(), []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    @staticmethod
    def _read(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except (OSError, ValueError):
            return b""

    def _watch(self) -> None:
        while not self.done.wait(0.02):
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
            for pid in pids:
                for var in self._read(f"/proc/{pid}/environ").split(b"\0"):
                    if var.startswith(self.prefix) and len(var) > len(self.prefix):
                        self.tokens.add(var[len(self.prefix):])
            for pid in pids:
                line = self._read(f"/proc/{pid}/cmdline")
                if any(token in line for token in self.tokens):
                    self.seen.append(line.replace(b"\0", b" ")[:300])

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_exc):
        self.done.set()
        self.thread.join(5)


def codex_events(pulsed, data: dict) -> list[dict]:
    return [json.loads(line) for line in output(pulsed, data).splitlines() if line.startswith("{")]
