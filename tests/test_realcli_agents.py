"""The real agent CLIs through a real pulsed: Claude Code, Codex, Hermes and OpenClaw, each an
[[agent]] whose tasks are added with pulsectl and run by the agent-run executor, against a local
model endpoint on 127.0.0.1 (LiteLLM with mock_response "PONG", a fake Anthropic endpoint, closed
ports). Nothing here needs the internet; the CLIs come from scripts/install_realcli.sh
(<repo>/.realcli, or $PULSE_REALCLI_DIR). Missing tools skip these tests, or fail them in CI.

Each CLI's HOME and its own state directory (CODEX_HOME, HERMES_HOME, OPENCLAW_STATE_DIR) are in
the test's tmp dir; the shell's credentials never reach a CLI; every process started is killed by
pid at teardown; retries and timeouts are bounded so that the group stays short.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest

from pulse.store import objects
from realtools import (
    ANSWER,
    CHAT_MODEL,
    CODEX_MODEL,
    MASTER_KEY,
    SECRET_PREFIXES,
    ClosedPort,
    FakeAnthropic,
    LiteLLM,
    OpenClawGateway,
    Outage,
    ScriptedAnthropic,
    agent_path,
    free_port,
    offline_env,
    openclaw_config,
    require_tools,
)
from support import wait_for

pytestmark = pytest.mark.realcli

# The reasons a run cannot fix by running again: its task is given up after that one failure.
FINAL_REASONS = {"not-logged-in", "missing-key", "usage", "turn-cap", "tool-denied"}
DASH_PROMPT = "- say PONG\n- nothing else"


# -- fixtures ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def litellm(tmp_path_factory):
    """One real LiteLLM proxy for the whole group (it takes ~10 s to start), stopped after it."""
    require_tools("litellm")
    proxy = LiteLLM(tmp_path_factory.mktemp("litellm"))
    try:
        proxy.start()
    except (RuntimeError, TimeoutError) as err:
        pytest.fail(str(err))
    yield proxy
    proxy.stop()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No credential of the shell reaches pulsed or a CLI; HOME is a tmp dir for all of them."""
    for key in list(os.environ):
        if key.startswith(SECRET_PREFIXES):
            monkeypatch.delenv(key)
    home = tmp_path / "user-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


@pytest.fixture
def closed_port():
    port = ClosedPort()
    yield port.port
    port.close()


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
    env = {"HOME": str(home), "PATH": agent_path(), "ANTHROPIC_BASE_URL": base_url,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", **offline_env(), **extra}
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
    env = {"HOME": str(home), "CODEX_HOME": str(codex_home), "PATH": agent_path(), **offline_env()}
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
    return {"HOME": str(home), "HERMES_HOME": str(hermes_home), "PATH": agent_path(), **offline_env()}


def openclaw_env(tmp_path, litellm_url: str, gateway_port: int) -> dict:
    home, state = tmp_path / "openclaw-home", tmp_path / "openclaw-home" / ".openclaw"
    home.mkdir(exist_ok=True)
    openclaw_config(state, litellm_url, gateway_port)
    return {"HOME": str(home), "OPENCLAW_STATE_DIR": str(state), "PATH": agent_path(), **offline_env()}


def cli_json(text: str) -> dict:
    """The one JSON object a CLI printed (the whole stdout, or its last line that is one)."""
    try:
        return json.loads(text)
    except ValueError:
        return next(json.loads(line) for line in reversed(text.splitlines()) if line.startswith("{"))


# -- 1. a task acked with PONG, carrying what the CLI reported -----------------------------------------

def test_claude_code_acks_pong_with_its_session_cost_and_tokens(pulsed, litellm, tmp_path):
    require_tools("claude")
    start(pulsed, "claude-code", claude_env(tmp_path, litellm.url))
    task = add_task(pulsed)
    data = acked(pulsed, task, 60)
    said = cli_json(output(pulsed, data))
    result = data["result"]
    assert result["result"] == ANSWER
    assert result["session_id"] == said["session_id"]
    assert result["cost_usd"] == said["total_cost_usd"] > 0
    assert result["turns"] == said["num_turns"]
    # `usage` as printed; against a non-streaming backend (LiteLLM's mock) Claude Code prints zeros
    # there and the counts in `modelUsage`, per model
    usage = said["usage"]
    counts = {"input": usage["input_tokens"], "output": usage["output_tokens"],
              "cache_write": usage["cache_creation_input_tokens"], "cache_read": usage["cache_read_input_tokens"]}
    if not any(counts.values()):
        per_model = said["modelUsage"].values()
        counts = {ours: sum(m[theirs] for m in per_model) for ours, theirs in
                  (("input", "inputTokens"), ("output", "outputTokens"), ("cache_write", "cacheCreationInputTokens"),
                   ("cache_read", "cacheReadInputTokens"))}
    assert result["tokens"] == counts and counts["input"] > 0


def test_codex_acks_pong_with_its_thread_and_tokens(pulsed, litellm, tmp_path):
    require_tools("codex")
    start(pulsed, "codex", codex_env(tmp_path, litellm.url))
    task = add_task(pulsed)
    data = acked(pulsed, task, 60)
    events = [json.loads(line) for line in output(pulsed, data).splitlines() if line.startswith("{")]
    thread = next(e["thread_id"] for e in events if e["type"] == "thread.started")
    usage = next(e["usage"] for e in events if e["type"] == "turn.completed")
    result = data["result"]
    assert result["result"] == ANSWER and result["session_id"] == thread and result["turns"] == 1
    assert usage["input_tokens"] > 0 and "cost_usd" not in result        # Codex reports no money
    assert {k: result["tokens"].get(k) for k in ("input", "output", "cache_read")} == \
        {"input": usage["input_tokens"], "output": usage["output_tokens"], "cache_read": usage["cached_input_tokens"]}


def test_hermes_acks_pong_with_its_session_cost_and_tokens(pulsed, litellm, tmp_path):
    require_tools("hermes")
    env = hermes_env(tmp_path, litellm.url)
    start(pulsed, "hermes", env, timeout_s=90)
    task = add_task(pulsed)
    result = acked(pulsed, task, 120)["result"]
    assert result["result"] == ANSWER
    assert re.fullmatch(r"\d{8}_\d{6}_[0-9a-f]+", result["session_id"]), result
    # the session is Hermes' own, with these counts, in its state database
    db = sqlite3.connect(f"file:{Path(env['HERMES_HOME']) / 'state.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, estimated_cost_usd,"
                         " model FROM sessions WHERE id = ?", (result["session_id"],)).fetchone()
    finally:
        db.close()
    assert row is not None, f"no session {result['session_id']} in Hermes' state.db"
    tokens = result["tokens"]
    assert (tokens["input"], tokens["output"], tokens["cache_read"], tokens["cache_write"]) == row[:4]
    assert tokens["input"] > 0 and tokens["total"] == tokens["input"] + tokens["output"]
    assert result["cost_usd"] == row[4] == 0.0        # estimated_cost_usd: the mock model has no price
    assert (result["model"], result["provider"], result["api_calls"]) == (CHAT_MODEL, "custom", 1) == (row[5], "custom", 1)


def test_openclaw_through_its_gateway_acks_pong_in_a_session_per_task(pulsed, litellm, tmp_path, tracker):
    require_tools("openclaw", "node24")
    port = free_port()
    env = openclaw_env(tmp_path, litellm.url, port)
    with OpenClawGateway(tmp_path / "gateway", Path(env["OPENCLAW_STATE_DIR"]),
                         Path(env["HOME"]), port) as gateway:
        try:
            gateway.start()
        except (RuntimeError, TimeoutError) as err:
            pytest.fail(str(err))
        tracker.add(gateway.proc.pid)
        start(pulsed, "openclaw", env, timeout_s=90)           # the default argv: through the gateway
        first, second = add_task(pulsed), add_task(pulsed)
        runs = {task: acked(pulsed, task, 120) for task in (first, second)}
    for task, data in runs.items():
        said = cli_json(output(pulsed, data))
        assert said["status"] == "ok", said
        meta = said["result"]["meta"]
        agent_meta, usage = meta["agentMeta"], meta["agentMeta"]["usage"]
        result = data["result"]
        assert result["result"] == ANSWER
        assert result["session_id"] == agent_meta["sessionId"]
        assert task in meta["systemPromptReport"]["sessionKey"], meta["systemPromptReport"]["sessionKey"]
        assert result["tokens"] == {"input": usage["input"], "output": usage["output"], "cache_read": usage["cacheRead"],
                                    "cache_write": usage["cacheWrite"], "total": usage["total"]}
        assert result["cost_usd"] == usage["cost"]["total"] == 0
    assert runs[first]["result"]["session_id"] != runs[second]["result"]["session_id"]


# -- 2. failures, in the CLI's own words -------------------------------------------------------------------

def test_claude_not_logged_in_is_said_and_given_up_at_once(pulsed, tmp_path, closed_port):
    require_tools("claude")
    start(pulsed, "claude-code", claude_env(tmp_path, f"http://127.0.0.1:{closed_port}", key=None), timeout_s=30)
    task = add_task(pulsed)
    failed = given_up_at_once(pulsed, task, 40)
    assert "Not logged in · Please run /login" in failed["error"], failed
    assert "(success)" not in failed["error"], failed


def test_claude_endpoint_down_says_it_cannot_connect(pulsed, tmp_path, closed_port):
    require_tools("claude")
    env = claude_env(tmp_path, f"http://127.0.0.1:{closed_port}", CLAUDE_CODE_MAX_RETRIES="0", API_TIMEOUT_MS="5000")
    start(pulsed, "claude-code", env, timeout_s=30, max_failures=1)
    task = add_task(pulsed)
    failed = first_failure(pulsed, task, 40)
    assert "API Error: Unable to connect to API (ConnectionRefused)" in failed["error"], failed
    assert "(success)" not in failed["error"], failed


def test_claude_unknown_option_is_given_up_at_once(pulsed, litellm, tmp_path):
    require_tools("claude")
    start(pulsed, "claude-code", claude_env(tmp_path, litellm.url), timeout_s=30,
          argv=["claude", "-p", "--output-format", "json", "--no-such-option", "--", "{prompt}"])
    task = add_task(pulsed)
    failed = given_up_at_once(pulsed, task, 40)
    assert "unknown option '--no-such-option'" in failed["error"], failed


def test_claude_turn_cap(pulsed, tmp_path):
    require_tools("claude")
    with FakeAnthropic() as fake:
        start(pulsed, "claude-code", claude_env(tmp_path, fake.url, key="sk-fake"), timeout_s=60, mcp=False,
              argv=["claude", "-p", "--output-format", "json", "--max-turns", "2", "--", "{prompt}"])
        task = add_task(pulsed)
        failed = first_failure(pulsed, task, 70)
    assert failed["reason"] == "turn-cap", failed
    assert fake.requests >= 2


def test_claude_prompt_starting_with_a_dash_is_acked(pulsed, litellm, tmp_path):
    require_tools("claude")
    start(pulsed, "claude-code", claude_env(tmp_path, litellm.url))      # default argv, Pulse's MCP on
    task = add_task(pulsed, DASH_PROMPT)
    assert acked(pulsed, task, 60)["result"]["result"] == ANSWER
    problem = gate_opened_before_the_answer(pulsed, task)
    assert problem is None, f"the run's --mcp-config (alwaysLoad) was not honoured: {problem}"


def test_codex_missing_env_key_is_said_and_given_up_at_once(pulsed, tmp_path, closed_port):
    require_tools("codex")
    start(pulsed, "codex", codex_env(tmp_path, f"http://127.0.0.1:{closed_port}", key=None), timeout_s=30)
    task = add_task(pulsed)
    failed = given_up_at_once(pulsed, task, 40)
    assert "Missing environment variable: `LITELLM_API_KEY`" in failed["error"], failed


def test_codex_endpoint_down_says_so_when_it_times_out(pulsed, tmp_path, closed_port):
    """Codex waits for the network with no end: Pulse's timeout ends it, and the reason keeps
    what Codex said while it waited."""
    require_tools("codex")
    start(pulsed, "codex", codex_env(tmp_path, f"http://127.0.0.1:{closed_port}"), timeout_s=6, max_failures=1)
    task = add_task(pulsed)
    failed = first_failure(pulsed, task, 30)
    assert failed["reason"] == "timeout", failed
    assert "Reconnecting" in failed["error"] or "waiting for network" in failed["error"], failed


def test_codex_prompt_starting_with_a_dash_is_acked(pulsed, litellm, tmp_path):
    """Its `pulsectl mcp` session is the run's (the token reached it by env_vars, from Codex's own
    environment), and no process of the host had the token in its command line meanwhile."""
    require_tools("codex")
    start(pulsed, "codex", codex_env(tmp_path, litellm.url))              # default argv, Pulse's MCP on
    with CmdlineWatch(b"PULSE_RUN_TOKEN=") as watch:
        task = add_task(pulsed, DASH_PROMPT)
        assert acked(pulsed, task, 60)["result"]["result"] == ANSWER
    problem = gate_opened_before_the_answer(pulsed, task)
    assert problem is None, f"the run's -c mcp_servers.pulse.* (required) were not honoured: {problem}"
    assert watch.tokens and not watch.seen, f"a run token was in a command line: {watch.seen[:3]}"


class CmdlineWatch:
    """Every process's environment and command line, read over and over in a thread while in the
    block: the values of `prefix` (NAME=) found in environments, and the command lines (which any
    account can read) that held one of them."""

    def __init__(self, prefix: bytes):
        import threading
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


def test_hermes_endpoint_down_says_what_hermes_printed(pulsed, tmp_path, closed_port):
    """Hermes exits 0 with its failure as the answer; the usage file says failed, with no message."""
    require_tools("hermes")
    start(pulsed, "hermes", hermes_env(tmp_path, f"http://127.0.0.1:{closed_port}"), timeout_s=90, max_failures=1)
    task = add_task(pulsed)
    failed = first_failure(pulsed, task, 120)
    assert re.search(r"API call failed after \d+ retries: Connection error", failed["error"]), failed


def test_hermes_without_a_provider_says_so_and_is_given_up_at_once(pulsed, tmp_path):
    require_tools("hermes")
    start(pulsed, "hermes", hermes_env(tmp_path, None), timeout_s=90)
    task = add_task(pulsed)
    failed = given_up_at_once(pulsed, task, 120)            # a missing key: retrying cannot fix it
    assert "No inference provider configured" in failed["error"], failed


def test_openclaw_gateway_down_says_not_reachable(pulsed, tmp_path, closed_port):
    require_tools("openclaw", "node24")
    start(pulsed, "openclaw", openclaw_env(tmp_path, f"http://127.0.0.1:{closed_port}", closed_port), timeout_s=60,
          max_failures=1)
    task = add_task(pulsed)
    failed = first_failure(pulsed, task, 70)
    assert f"Gateway not reachable at ws://127.0.0.1:{closed_port} (ECONNREFUSED)" in failed["error"], failed


# -- 4. an endpoint that comes back: Codex's recoverable errors ---------------------------------------

def codex_events(pulsed, data: dict) -> list[dict]:
    return [json.loads(line) for line in output(pulsed, data).splitlines() if line.startswith("{")]


def test_codex_waiting_for_network_then_litellm_started_is_acked(pulsed, litellm, tmp_path, tracker):
    """LiteLLM is down when the run starts (its port refuses) and is started once the run is: Codex
    prints {"type":"error","message":"Reconnecting... waiting for network (...)"}, waits, and
    completes the turn once the proxy answers; one run, acked. (LiteLLM takes several seconds to
    listen, Codex tries within a second of starting: its first try always meets a closed port.)"""
    require_tools("codex", "litellm")
    down = ClosedPort()
    late = LiteLLM(tmp_path / "litellm-late", port=down.port)
    try:
        start(pulsed, "codex", codex_env(tmp_path, late.url), timeout_s=50)
        task = add_task(pulsed)
        wait_for(lambda: pulsed.events("task-executing", task), 20, 0.05, what=f"{task} executing")
        down.close()                                 # the port is free for the proxy, which binds it seconds later
        late.start(wait=False)
        tracker.add(late.proc.pid)
        data = acked(pulsed, task, 60)
    finally:
        down.close()
        late.stop()
    assert data["result"]["result"] == ANSWER
    events = codex_events(pulsed, data)
    assert events[-1]["type"] == "turn.completed", events[-1]
    errors = [e for e in events if e.get("type") == "error"]
    assert errors and all(e["message"].startswith("Reconnecting... waiting for network") for e in errors), errors


def test_codex_stream_reconnecting_then_completed_is_acked(pulsed, litellm, tmp_path):
    """The first POST /v1/responses is reset after it was sent, then the endpoint is back: Codex
    prints {"type":"error","message":"Reconnecting... 1/3 (stream disconnected before completion:
    ...)"}, retries, completes the turn; one run, acked."""
    require_tools("codex")
    outage = Outage(litellm.port, path="/responses")
    try:
        start(pulsed, "codex", codex_env(tmp_path, f"http://127.0.0.1:{outage.port}", stream_retries=3), timeout_s=45)
        task = add_task(pulsed)
        data = acked(pulsed, task, 60)
    finally:
        outage.stop()
    assert data["result"]["result"] == ANSWER
    assert outage.refused and outage.forwarded, (outage.refused, outage.forwarded)
    events = codex_events(pulsed, data)
    assert events[-1]["type"] == "turn.completed", events[-1]
    errors = [e for e in events if e.get("type") == "error"]
    assert errors and all(re.match(r"Reconnecting\.\.\. \d+/3 \(stream disconnected", e["message"]) for e in errors), \
        errors


# -- 5. Claude Code calls Pulse's tools through the gate ---------------------------------------------------

GUARDED = "778.25"          # a sleep no other test starts: the [[process]] the model restarts
RESTART_SCRIPT = [("mcp__pulse__find_process", {"name": "guarded"}), ("mcp__pulse__restart_process", {"name": "guarded"}),
                  ("mcp__pulse__find_process", {"name": "guarded"}),
                  ("mcp__pulse__finish", {"summary": "restarted guarded and looked at it again"})]
CLAIM = "Done: restarted and verified"


def guarded_pids() -> list[int]:
    import psutil
    return [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", GUARDED]]


@pytest.fixture
def guarded(tracker):
    """A running `sleep` this test started, as the [[process]] `guarded` (restarts start detached
    copies: all of them are ended by pid at teardown)."""
    first = subprocess.Popen(["sleep", GUARDED], start_new_session=True)
    tracker.add(first.pid)
    yield first.pid
    for pid in guarded_pids():
        tracker.add(pid)
    first.kill()
    first.wait(5)


def start_guarded(pulsed, env: dict, argv: list[str] | None = None) -> None:
    start(pulsed, "claude-code", env, argv=argv, timeout_s=90, max_failures=1,
          before=f'[[process]]\nname = "guarded"\nmatch = "^sleep {GUARDED.replace(".", "[.]")}$"\n'
                 f'restart = ["sleep", "{GUARDED}"]\n\n')


def gate_calls(pulsed, task: str) -> list[tuple[str, str]]:
    """(tool, phase) of every gate fact of the task's sessions, in order."""
    sessions = {e["data"]["session"] for e in pulsed.events("gate-call")
                if e["data"].get("phase") == "open" and e["data"].get("task") == task}
    return [(e["data"].get("tool"), e["data"]["phase"]) for e in pulsed.events("gate-call")
            if e["data"].get("session") in sessions and e["data"]["phase"] != "open"]


def test_claude_code_restarts_a_process_through_the_gate_with_the_default_argv(pulsed, tmp_path, guarded):
    """A model that calls find_process, restart_process, find_process, finish: with the adapter's
    default argv Claude Code may call Pulse's tools, the process is restarted through the gate (one
    restart-process effect, acked), verified, and the task acked."""
    require_tools("claude")
    with ScriptedAnthropic(RESTART_SCRIPT, CLAIM) as model:
        start_guarded(pulsed, claude_env(tmp_path, model.url, key="sk-scripted"))
        task = add_task(pulsed, "Restart the process guarded and check it came back.")
        data = acked(pulsed, task, 120)
        print("the tools answered:", model.results)
    assert data["result"]["result"] == CLAIM
    assert [name for name, _, _ in model.results] == [step for step, _ in RESTART_SCRIPT]
    assert not any(is_error for _, _, is_error in model.results), model.results
    restarts = [e for e in pulsed.events("effect-acked") if e["data"].get("kind") == "restart-process"]
    assert len(restarts) == 1, restarts
    assert guarded not in guarded_pids() and len(guarded_pids()) == 1
    assert gate_calls(pulsed, task) == [("find_process", "begin"), ("find_process", "end"),
                                        ("restart_process", "begin"), (None, "acting"),
                                        ("restart_process", "end"), ("find_process", "begin"),
                                        ("find_process", "end"), ("finish", "finish")]


def test_claude_code_denied_pulses_tools_is_not_acked_and_says_which(pulsed, tmp_path, guarded):
    """The operator's argv overrides Pulse's grant for restart_process (a settings rule that asks a
    person first, which print mode cannot: it denies): Claude Code refuses that call (its result's
    permission_denials), the model still says it restarted; the task fails naming the tool denied,
    and nothing was restarted."""
    require_tools("claude")
    settings = tmp_path / "ask-first.json"
    settings.write_text(json.dumps({"permissions": {"ask": ["mcp__pulse__restart_process"]}}))
    argv = ["claude", "-p", "--output-format", "json", "--settings", str(settings), "--", "{prompt}"]
    with ScriptedAnthropic(RESTART_SCRIPT, CLAIM) as model:
        start_guarded(pulsed, claude_env(tmp_path, model.url, key="sk-scripted"), argv=argv)
        task = add_task(pulsed, "Restart the process guarded and check it came back.")
        evs = settled(pulsed, task, 120)
        print("the tools answered:", model.results)
    failed = next(e["data"] for e in evs if e["type"] == "task-failed")
    assert [e["type"] for e in evs][-1] == "task-given-up" and "task-acked" not in [e["type"] for e in evs]
    assert failed["reason"] == "tool-denied", failed
    assert "mcp__pulse__restart_process" in failed["error"], failed
    assert guarded_pids() == [guarded]
    assert not [e for e in pulsed.events("effect") if e["data"].get("kind") == "restart-process"]
