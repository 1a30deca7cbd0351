"""The agent CLIs' adapters: fake CLIs, written by the test, print exactly the formats
their CLIs document (shared research notes: agent-clis.md), through a running pulsed.

One pulsed per adapter, one [[agent]] whose argv is the adapter's documented default argv with
the fake in front; the task's prompt picks what the fake does (MODE:<name>). Every task is given
one run ([tasks] max_failures = 1), so each ends acked or failed, with its reason and ids.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pulse.agents import adapters, tasks
from pulse.store import connection, objects
from support import wait_for

PY = sys.executable

FAKE_CLI = r'''
import json, os, sys, time

cli = sys.argv[1]
args = sys.argv[2:]
mode = next(a for a in args if a.startswith("MODE:"))[5:]
out = lambda obj: print(json.dumps(obj), flush=True)

if os.environ.get("FAKE_ENV_DUMP"):
    with open(os.environ["FAKE_ENV_DUMP"] + "." + cli + "." + mode, "w") as f:
        json.dump({"connect_timeout_ms": os.environ.get("MCP_CONNECT_TIMEOUT_MS"),
                   "env": {k: os.environ.get(k) for k in ("PULSE_HOME", "PULSE_AGENT", "PULSE_TASK")},
                   "argv": args}, f)

usage_file = args[args.index("--usage-file") + 1] if "--usage-file" in args else None

def usage(**fields):
    with open(usage_file, "w") as f:
        json.dump(fields, f)

if mode == "sleep":
    print("starting", file=sys.stderr, flush=True)
    time.sleep(60)
if mode == "stderr":
    print("some progress", file=sys.stderr)
    print("Error: not logged in. Run the login command first.", file=sys.stderr)
    if cli == "hermes":
        usage(completed=False, failed=True, session_id="hermes-s-fail", estimated_cost_usd=0.01,
              input_tokens=7, output_tokens=0)
    sys.exit(1)
if mode == "malformed":
    if cli == "hermes":
        print("the answer")
        with open(usage_file, "w") as f:
            f.write("{not json")
    else:
        print("this is {not json")
        print("[1, 2")
    sys.exit(0)

if cli == "claude":
    if mode == "ok":
        out({"type": "result", "subtype": "success", "is_error": False, "result": "claude did it",
             "duration_ms": 1234, "num_turns": 3, "session_id": "claude-s-1", "total_cost_usd": 0.25,
             "usage": {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 5,
                       "cache_creation_input_tokens": 2}})
    elif mode == "turncap":
        out({"type": "result", "subtype": "error_max_turns", "is_error": True, "duration_ms": 99,
             "num_turns": 10, "session_id": "claude-s-cap", "total_cost_usd": 0.5,
             "usage": {"input_tokens": 1000, "output_tokens": 200}})
    elif mode == "empty":
        out({"type": "result", "subtype": "success", "is_error": False, "result": "", "session_id": "claude-s-e",
             "num_turns": 1, "duration_ms": 1, "total_cost_usd": 0.0})
    elif mode == "nologin":         # what Claude Code 2.1 printed with no credentials
        out({"type": "result", "subtype": "success", "is_error": True, "duration_ms": 20, "num_turns": 1,
             "result": "Not logged in \u00b7 Please run /login", "session_id": "claude-s-n", "total_cost_usd": 0,
             "usage": {"input_tokens": 0, "output_tokens": 0}})
        sys.exit(1)
    elif mode == "denied":          # 2.1.197 with a Pulse tool not granted: "success", the denial listed
        out({"type": "result", "subtype": "success", "is_error": False, "result": "Done: restarted and verified",
             "num_turns": 5, "session_id": "claude-s-d", "total_cost_usd": 0.001,
             "permission_denials": [
                 {"tool_name": "mcp__pulse__restart_process", "tool_use_id": "toolu_1", "tool_input": {"name": "gw"}},
                 {"tool_name": "Bash", "tool_use_id": "toolu_2", "tool_input": {"command": "true"}}]})
    elif mode == "modelusage":      # 2.1 against a non-streaming endpoint: usage zeros, modelUsage counts
        out({"type": "result", "subtype": "success", "is_error": False, "result": "PONG", "num_turns": 1,
             "session_id": "claude-s-m", "total_cost_usd": 0.02305,
             "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0},
             "modelUsage": {"claude-x": {"inputTokens": 2095, "outputTokens": 503, "costUSD": 0.02305}}})
elif cli == "cursor":
    if mode == "ok":
        out({"type": "result", "subtype": "success", "is_error": False, "duration_ms": 500,
             "duration_api_ms": 400, "result": "cursor did it", "session_id": "cursor-s-1", "request_id": "r-1"})
    elif mode == "empty":
        out({"type": "result", "subtype": "success", "is_error": False, "duration_ms": 5, "duration_api_ms": 4,
             "result": "", "session_id": "cursor-s-e", "request_id": "r-2"})
elif cli == "codex":
    if mode in ("ok", "empty", "turnfailed"):
        out({"type": "thread.started", "thread_id": "codex-t-1"})
        out({"type": "turn.started"})
        out({"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "thinking"}})
        if mode == "ok":
            out({"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": "first"}})
            out({"type": "item.completed", "item": {"id": "item_2", "type": "command_execution",
                                                    "command": "ls", "exit_code": 0}})
            out({"type": "turn.completed", "usage": {"input_tokens": 50, "cached_input_tokens": 10,
                                                     "output_tokens": 5}})
            out({"type": "turn.started"})
            out({"type": "item.completed", "item": {"id": "item_3", "type": "agent_message",
                                                    "text": "codex did it"}})
            out({"type": "turn.completed", "usage": {"input_tokens": 60, "cached_input_tokens": 20,
                                                     "output_tokens": 7}})
        elif mode == "turnfailed":
            out({"type": "turn.failed", "error": {"message": "stream disconnected: rate limit reached"}})
            sys.exit(1)
        else:
            out({"type": "turn.completed", "usage": {"input_tokens": 1, "cached_input_tokens": 0,
                                                     "output_tokens": 0}})
    if mode == "recovered":         # 0.171: retries it recovers from are top-level error events
        out({"type": "thread.started", "thread_id": "codex-t-r"})
        out({"type": "turn.started"})
        out({"type": "error", "message": "Reconnecting... 2/5 (stream disconnected before completion)"})
        out({"type": "item.completed", "item": {"id": "item_0", "type": "error", "message": "Model metadata not found"}})
        out({"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": "PONG"}})
        out({"type": "turn.completed", "usage": {"input_tokens": 4236, "cached_input_tokens": 0,
                                                 "cache_write_input_tokens": 3, "output_tokens": 2,
                                                 "reasoning_output_tokens": 1}})
    elif mode == "nokey":
        out({"type": "thread.started", "thread_id": "codex-t-k"})
        out({"type": "error", "message": "Missing environment variable: `LITELLM_API_KEY`."})
        out({"type": "turn.failed", "error": {"message": "Missing environment variable: `LITELLM_API_KEY`."}})
        sys.exit(1)
elif cli == "hermes":
    if mode == "apifail":           # 0.19 with its API down: exit 0, the error printed as the answer
        print("API call failed after 3 retries: Connection error.")
        usage(completed=False, failed=True, api_calls=1, model=None, provider=None)
    elif mode == "noprovider":
        print("hermes -z: agent failed: No inference provider configured. Run 'hermes model'", file=sys.stderr)
        usage(completed=False, failed=True, failure="No inference provider configured. Run 'hermes model'")
        sys.exit(1)
    elif mode == "ok":
        print("hermes did it")
        usage(completed=True, failed=False, estimated_cost_usd=0.125, input_tokens=300, output_tokens=40,
              api_calls=2, model="hermes-4", provider="nous", session_id="hermes-s-1")
    elif mode == "empty":
        usage(completed=True, failed=False, estimated_cost_usd=0.0, session_id="hermes-s-e")
elif cli == "openclaw":
    if mode == "ok":
        out({"payloads": [{"text": "openclaw did it"}, {"text": "and more"}],
             "meta": {"durationMs": 777, "agentMeta": {"sessionId": "claw-s-1", "provider": "anthropic",
                      "model": "m", "usage": {"input": 11, "output": 3, "cacheRead": 2, "cacheWrite": 1,
                                              "total": 17}}}})
    elif mode == "empty":
        out({"payloads": [], "meta": {"agentMeta": {"sessionId": "claw-s-e"}}})
    elif mode == "gateway":         # 2026.9 through its gateway (the default argv): the same, wrapped
        out({"runId": "run-1", "status": "ok", "summary": "completed",
             "result": {"payloads": [{"text": "PONG", "mediaUrl": None}],
                        "meta": {"agentMeta": {"sessionId": "claw-s-g", "usage": {
                            "input": 11199, "output": 2, "total": 11201, "cost": {"total": 0.0042}}}}}})
    elif mode == "unreachable":
        print("Start it with `openclaw gateway run` or check the URL.", file=sys.stderr)
        out({"ok": False, "error": {"type": "cli_error", "message":
             "Gateway not reachable at ws://127.0.0.1:18789 (ECONNREFUSED).\nStart it with `openclaw gateway run`."}})
        sys.exit(1)
'''

CLI = {"claude-code": "claude", "cursor": "cursor", "codex": "codex", "hermes": "hermes", "openclaw": "openclaw"}

# What each mode must become: (acked?, reason, a piece of the error or result, result fields).
COMMON_FAILURES = {
    "stderr": (False, "not-logged-in", "Error: not logged in", {}),
    "malformed": (False, "agent", "no JSON", {}),
    "sleep": (False, "timeout", "timed out", {}),
    "empty": (False, "empty-result", "", {}),
}
EXPECTED = {
    "claude-code": {
        "ok": (True, None, "claude did it", {"session_id": "claude-s-1", "cost_usd": 0.25, "turns": 3,
                                             "duration_ms": 1234, "tokens": {"input": 100, "output": 20,
                                                                             "cache_read": 5, "cache_write": 2}}),
        "turncap": (False, "turn-cap", "error_max_turns", {"session_id": "claude-s-cap", "cost_usd": 0.5,
                                                           "turns": 10}),
        "nologin": (False, "not-logged-in", "error: Not logged in", {"session_id": "claude-s-n"}),
        "modelusage": (True, None, "PONG", {"tokens": {"input": 2095, "output": 503}}),
        "denied": (False, "tool-denied", "denied Pulse's tool mcp__pulse__restart_process",
                   {"session_id": "claude-s-d", "permission_denials": ["mcp__pulse__restart_process", "Bash"]}),
    },
    "cursor": {"ok": (True, None, "cursor did it", {"session_id": "cursor-s-1", "duration_ms": 500,
                                                    "request_id": "r-1"})},
    "codex": {
        "ok": (True, None, "codex did it", {"session_id": "codex-t-1", "turns": 2,
                                            "tokens": {"input": 110, "cache_read": 30, "output": 12}}),
        "turnfailed": (False, "agent", "rate limit reached", {"session_id": "codex-t-1"}),
        "malformed": (False, "agent", "no JSON events", {}),
        "recovered": (True, None, "PONG", {"session_id": "codex-t-r", "recovered": [
            "Reconnecting... 2/5 (stream disconnected before completion)"], "tokens": {
            "input": 4236, "cache_read": 0, "cache_write": 3, "output": 2, "reasoning": 1}}),
        "nokey": (False, "missing-key", "Missing environment variable", {"session_id": "codex-t-k"}),
    },
    "hermes": {
        "ok": (True, None, "hermes did it", {"session_id": "hermes-s-1", "cost_usd": 0.125, "api_calls": 2,
                                             "tokens": {"input": 300, "output": 40}, "model": "hermes-4"}),
        "stderr": (False, "not-logged-in", "Error: not logged in", {"session_id": "hermes-s-fail", "cost_usd": 0.01}),
        "apifail": (False, "agent", "API call failed after 3 retries", {"api_calls": 1}),
        "noprovider": (False, "missing-key", "No inference provider configured", {}),
        # -z prints only text: a garbled usage file loses the figures, not the answer.
        "malformed": (True, None, "the answer", {"usage_file": "unreadable"}),
    },
    "openclaw": {"ok": (True, None, "openclaw did it\n\nand more",
                        {"session_id": "claw-s-1", "duration_ms": 777,
                         "tokens": {"input": 11, "output": 3, "cache_read": 2, "cache_write": 1, "total": 17}}),
                 "gateway": (True, None, "PONG", {"session_id": "claw-s-g", "cost_usd": 0.0042, "run_id": "run-1",
                                                  "tokens": {"input": 11199, "output": 2, "total": 11201}}),
                 "unreachable": (False, "agent", "Gateway not reachable at ws://127.0.0.1:18789", {})},
}


def agent_table(adapter: str, script: Path, env_dump: Path) -> str:
    default = adapters.load_adapter(adapter).default_argv
    argv = [PY, str(script), CLI[adapter], *default[1:]]
    return (f'[[agent]]\nname = "{CLI[adapter]}-agent"\nadapter = "{adapter}"\nargv = {json.dumps(argv)}\n'
            f'env = {{FAKE_ENV_DUMP = {json.dumps(str(env_dump))}}}\ntimeout_s = 3\nconcurrency = 3\n'
            "\n[tasks]\nmax_failures = 1\n")


def outcome(pulsed, task: str):
    ended = [e for e in pulsed.events(target=task) if e["type"] in ("task-acked", "task-failed")]
    return ended[0] if ended else None


@pytest.mark.parametrize("adapter", sorted(CLI))
def test_each_adapter_reads_its_clis_documented_output_through_pulsed(pulsed, tmp_path, adapter):
    script = tmp_path / "fake_cli.py"
    script.write_text(FAKE_CLI)
    env_dump = tmp_path / "env"
    pulsed.home.mkdir(exist_ok=True)
    (pulsed.home / "config.toml").write_text(agent_table(adapter, script, env_dump))
    pulsed.start(env={"PULSE_TICK_MS": "200"})
    modes = {**COMMON_FAILURES, **EXPECTED[adapter]}
    ids = {}
    for mode in modes:
        out = pulsed.ctl("task", "add", "--project", "p", "--title", mode, "--prompt", f"MODE:{mode}")
        assert out.returncode == 0, out.stderr
        ids[mode] = out.stdout.strip().split()[0].rstrip(":")
    ended = {mode: wait_for(lambda t=task: outcome(pulsed, t), 30, what=f"{adapter} {mode} ended")
             for mode, task in ids.items()}

    for mode, (acked, reason, piece, fields) in modes.items():
        ev = ended[mode]
        assert ev["type"] == ("task-acked" if acked else "task-failed"), (mode, ev)
        result = ev["data"].get("result", {})
        if acked:
            assert result["result"] == piece, mode
        else:
            assert ev["data"]["reason"] == reason, (mode, ev["data"])
            assert piece in ev["data"]["error"], (mode, ev["data"])
        for key, value in fields.items():
            if key == "usage_file":
                assert result[key].startswith(value), (mode, result)
            else:
                assert result[key] == value, (mode, key, result)
        assert ev["data"]["agent"] == f"{CLI[adapter]}-agent"
    # The CLI's own complaint is kept whole in objects/, beside stdout.
    effect = wait_for(lambda: next((e for e in pulsed.events("effect-failed")
                                    if e["data"].get("task_id") == ids["stderr"]), None), 10)
    assert b"not logged in" in objects.get(pulsed.home / "objects", effect["data"]["stderr"])

    # Every run's process was told whose run it is.
    dumped = json.loads(Path(f"{env_dump}.{CLI[adapter]}.ok").read_text())
    assert dumped["env"] == {"PULSE_HOME": str(pulsed.home), "PULSE_AGENT": f"{CLI[adapter]}-agent",
                             "PULSE_TASK": ids["ok"]}
    # Cost and tokens per agent, folded from the events, as the rules see them.
    conn = connection.open_readonly(pulsed.home / "events.db")
    try:
        stats = tasks.snapshot_extras(conn)["agent-capability-stats"][f"{CLI[adapter]}-agent"]
    finally:
        conn.close()
    runs = [ended[m]["data"].get("result", {}) for m in modes]
    assert stats.cost_usd == pytest.approx(sum(r.get("cost_usd", 0) for r in runs))
    assert stats.runs_with_cost == sum(1 for r in runs if "cost_usd" in r)
    want_tokens: dict[str, int] = {}
    for r in runs:
        for name, n in r.get("tokens", {}).items():
            want_tokens[name] = want_tokens.get(name, 0) + n
    assert stats.tokens == want_tokens and stats.acked + stats.failed == len(modes)
    if adapter in ("claude-code", "hermes"):
        assert stats.cost_usd > 0 and stats.tokens


def test_claude_code_is_handed_pulsectl_mcp_with_the_runs_names(pulsed, tmp_path):
    """--mcp-config FILE: `pulsectl mcp` with PULSE_HOME / PULSE_AGENT / PULSE_TASK and the run token; none with mcp = false."""
    script = tmp_path / "fake_cli.py"
    script.write_text(FAKE_CLI + r'''
if "--mcp-config" in args:
    with open(os.environ["FAKE_ENV_DUMP"] + ".mcp", "w") as f:
        f.write(open(args[args.index("--mcp-config") + 1]).read())
''')
    env_dump = tmp_path / "env"
    pulsed.home.mkdir(exist_ok=True)
    (pulsed.home / "config.toml").write_text(agent_table("claude-code", script, env_dump))
    pulsed.start(env={"PULSE_TICK_MS": "200"})
    out = pulsed.ctl("task", "add", "--project", "p", "--title", "t", "--prompt", "MODE:ok")
    task = out.stdout.strip().split()[0].rstrip(":")
    ev = wait_for(lambda: outcome(pulsed, task), 30, what="the run ended")
    assert ev["type"] == "task-acked"
    server = json.loads(Path(f"{env_dump}.mcp").read_text())["mcpServers"]["pulse"]
    assert server["args"] == ["mcp"] and Path(server["command"]).name == "pulsectl"
    # Waited for before the first turn (print mode connects without waiting otherwise), up to 30 s.
    assert server.pop("alwaysLoad") is True and server.pop("type") == "stdio"
    assert json.loads(Path(f"{env_dump}.claude.ok").read_text())["connect_timeout_ms"] == "30000"
    token = server["env"].pop("PULSE_RUN_TOKEN")              # the run's capability (pulse.gate.server)
    assert len(token) >= 40 and server["env"].pop("PULSE_GATE_SOCKET").endswith(".sock")
    # the run's mark, so a server started with a cleaned environment is still ended with the run
    assert server["env"].pop("PULSE_RUN") == ev["data"]["run"]
    assert server["env"] == {"PULSE_HOME": str(pulsed.home), "PULSE_AGENT": "claude-agent", "PULSE_TASK": task}
    argv = json.loads(Path(f"{env_dump}.claude.ok").read_text())["argv"]
    # print mode grants no MCP tool by itself: Pulse's, and only those
    assert argv[argv.index("--allowedTools") + 1] == "mcp__pulse" and argv.count("--allowedTools") == 1
    assert not Path(argv[argv.index("--mcp-config") + 1]).exists()      # the run's scratch is gone
    # Every option before `--`: after it Claude reads --mcp-config as the prompt's and starts no server.
    assert argv.index("--mcp-config") < argv.index("--") == len(argv) - 2 and argv[-1] == "MODE:ok"
    # mcp = false: no server handed over.
    from pulse.core.config import Agent
    for mcp in (True, False):
        inv = adapters.load_adapter("claude-code").invocation(
            Agent(name="a", adapter="claude-code", mcp=mcp), adapters.Task("task-1", "p"), str(tmp_path),
            home=tmp_path, scratch=str(tmp_path))
        assert ("--mcp-config" in inv.argv) is mcp
    # An [[agent]] env's own MCP_CONNECT_TIMEOUT_MS is kept.
    inv = adapters.load_adapter("claude-code").invocation(
        Agent(name="a", adapter="claude-code", env={"MCP_CONNECT_TIMEOUT_MS": "90000"}), adapters.Task("task-1", "p"),
        str(tmp_path), home=tmp_path, scratch=str(tmp_path))
    assert inv.env["MCP_CONNECT_TIMEOUT_MS"] == "90000"


@pytest.mark.parametrize("adapter", sorted(CLI))
def test_a_prompt_that_starts_with_a_dash_stays_the_prompt(tmp_path, adapter):
    """A bullet list ("- restart the gateway") was parsed as an unknown option by Claude Code and Codex."""
    from pulse.core.config import Agent
    prompt = "- restart the gateway\n- then check the logs"
    inv = adapters.load_adapter(adapter).invocation(Agent(name="a", adapter=adapter), adapters.Task("task-9", prompt),
                                                    str(tmp_path), home=tmp_path, scratch=str(tmp_path))
    at = inv.argv.index(prompt)
    assert inv.argv[at - 1] in ("--", "--message", "-z"), inv.argv
    assert inv.argv.count(prompt) == 1


def test_codex_is_handed_pulsectl_mcp_as_config_overrides(tmp_path):
    import tomllib

    from pulse.core.config import Agent
    token = "tok-" + "s" * 40
    inv = adapters.load_adapter("codex").invocation(Agent(name="cx", adapter="codex", env={"PULSE_RUN_TOKEN": token}),
                                                    adapters.Task("task-3", 'say "hi"'), str(tmp_path),
                                                    home=tmp_path / "h o", scratch=str(tmp_path))
    assert inv.argv[:2] == ["codex", "exec"] and inv.argv[-2:] == ["--", 'say "hi"']
    overrides = [inv.argv[i + 1] for i, a in enumerate(inv.argv) if a == "-c"]
    assert inv.argv[2] == "-c" and len(overrides) == 7
    # the run token is never in the command line (any account reads it): Codex passes it on by name
    assert not [a for a in inv.argv if token in a], inv.argv
    assert inv.env["PULSE_RUN_TOKEN"] == token
    parsed = tomllib.loads("\n".join(overrides))["mcp_servers"]["pulse"]   # each override is valid TOML
    assert parsed["args"] == ["mcp"] and parsed["command"].endswith("pulsectl")
    # exec waits for it before the turn, and fails if it does not come up (it answers without it otherwise).
    assert parsed.pop("required") is True and parsed.pop("startup_timeout_sec") == 30
    # its calls need no approval from Codex (exec asks no one: it refused every one); the gate decides
    assert parsed.pop("default_tools_approval_mode") == "approve"
    assert parsed["env"] == {"PULSE_HOME": str(tmp_path / "h o"), "PULSE_AGENT": "cx", "PULSE_TASK": "task-3"}
    assert parsed["env_vars"] == ["PULSE_RUN_TOKEN"]
    for name in ("cursor", "hermes", "openclaw", "command"):      # no documented way: nothing added
        agent = Agent(name="x", adapter=name, argv=None if name != "command" else ["x"])
        inv = adapters.load_adapter(name).invocation(agent, adapters.Task("task-3", "p"), str(tmp_path),
                                                     home=tmp_path, scratch=str(tmp_path))
        assert "--mcp-config" not in inv.argv and "-c" not in inv.argv, name


def test_openclaw_local_is_handed_pulsectl_mcp_in_a_config_of_its_own(tmp_path):
    """With `--local` the turn runs in the CLI's own process: the run's OPENCLAW_CONFIG_PATH is a file
    in its scratch directory that includes the operator's config and adds `pulsectl mcp`, naming the
    run's variables (`${NAME}`, expanded by OpenClaw from its environment): no token in the file or
    the argv. Through the gateway (the default argv) nothing is added."""
    from pulse.core.config import ADAPTER_ARGV, Agent
    token = "tok-" + "s" * 40
    state = tmp_path / "oc-state"
    state.mkdir()
    (state / "openclaw.json").write_text("{}")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {"PULSE_RUN_TOKEN": token, "OPENCLAW_STATE_DIR": str(state), "OPENCLAW_INCLUDE_ROOTS": "/srv/oc"}
    adapter = adapters.load_adapter("openclaw")
    agent = Agent(name="oc", adapter="openclaw", argv=[*ADAPTER_ARGV["openclaw"], "--local"], env=env)
    inv = adapter.invocation(agent, adapters.Task("task-4", "p"), str(tmp_path), home=tmp_path, scratch=str(scratch))
    path = scratch / "openclaw.json"
    assert inv.env["OPENCLAW_CONFIG_PATH"] == str(path) and path.stat().st_mode & 0o777 == 0o600
    assert inv.env["OPENCLAW_INCLUDE_ROOTS"] == f"/srv/oc:{state}"      # the operator's roots kept
    config = json.loads(path.read_text())
    assert config["$include"] == str(state / "openclaw.json")
    assert config["tools"] == {"toolSearch": False}                 # MCP tools are not hidden behind tool_search
    server = config["mcp"]["servers"]["pulse"]
    assert server["args"] == ["mcp"] and server["command"].endswith("pulsectl")
    assert server["env"] == {name: "${" + name + "}" for name in ("PULSE_HOME", "PULSE_AGENT", "PULSE_TASK",
                                                                   "PULSE_RUN_TOKEN")}
    assert token not in path.read_text() and not [a for a in inv.argv if token in a]
    # no operator config: nothing to include
    (state / "openclaw.json").unlink()
    inv = adapter.invocation(agent, adapters.Task("task-4", "p"), str(tmp_path), home=tmp_path, scratch=str(scratch))
    assert "$include" not in json.loads(path.read_text()) and inv.env["OPENCLAW_INCLUDE_ROOTS"] == "/srv/oc"
    # through the gateway, or "--local" only as the prompt: the gateway's config, untouched
    for argv in (None, ["openclaw", "agent", "--message", "--local", "--json"]):
        inv = adapter.invocation(Agent(name="oc", adapter="openclaw", argv=argv, env=env), adapters.Task("task-5", "p"),
                                 str(tmp_path), home=tmp_path, scratch=str(tmp_path / "none"))
        assert "OPENCLAW_CONFIG_PATH" not in inv.env and not (tmp_path / "none").exists()
