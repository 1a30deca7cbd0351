"""The gate as a boundary: it decides inside Pulse (the executor's gate role), `pulsectl mcp` is a
proxy to its socket, and an agent run's sessions are who Pulse started (the run token), not who
they say they are. Through the real MCP client over stdio, against a running pulsed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from support import PULSECTL, init_home, wait_for

pytest.importorskip("mcp")

# An agent the command adapter runs: it speaks MCP to `pulsectl mcp` the way an agent CLI does. Its
# write (an exec of `true`) is verified only by a later look.
# Its prompt says how it behaves:
#   impostor      starts `pulsectl mcp --agent other` with PULSE_AGENT/PULSE_TASK changed, writes,
#                 and leaves without verifying
#   wait:PATH     writes, then waits for PATH to exist (someone else's turn), and leaves unverified
AGENT_SCRIPT = """
import asyncio, json, os, sys, time
from mcp import Client, StdioServerParameters

async def main(pulsectl, prompt):
    env = dict(os.environ)
    args = ["mcp"]
    if prompt == "impostor":
        env.update(PULSE_AGENT="other", PULSE_TASK="task-999")
        args += ["--agent", "other"]
    async with Client(StdioServerParameters(command=pulsectl, args=args, env=env), read_timeout_seconds=60) as c:
        await c.call_tool("events", {"target": "boundary"})
        wrote = await c.call_tool("emit_effect", {"kind": "exec", "target": "boundary", "params": {"argv": ["true"]}})
        print(json.dumps({"wrote": wrote.structured_content}), flush=True)
        if prompt.startswith("wait:"):
            deadline = time.monotonic() + 60
            while not os.path.exists(prompt[5:]) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def agent_config(script) -> str:
    return (f'[[agent]]\nname = "alice"\nadapter = "command"\n'
            f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, {json.dumps(PULSECTL)}, "{{prompt}}"]\n'
            "timeout_s = 120\n[tasks]\nmax_failures = 1\n"
            '[allow]\nkinds = ["noop", "exec", "agent-run", "task-add"]\nexec_argv = [["true"]]\n')


def proxy(home, agent: str | None = None, **env_changes):
    from mcp import Client, StdioServerParameters
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "PULSE_AGENT",
                                                               "PULSE_TASK", "PULSE_RUN_TOKEN", "PULSE_GATE_SOCKET")}
    env.update(env_changes)
    args = ["--home", str(home), "mcp", *(["--agent", agent] if agent else [])]
    return Client(StdioServerParameters(command=PULSECTL, args=args, env=env), read_timeout_seconds=60)


def code(result) -> str | None:
    body = result.structured_content
    return None if body["ok"] else body["error"]["code"]


def opened(pulsed) -> list[dict]:
    return [e["data"] for e in pulsed.events("gate-call") if e["data"].get("phase") == "open"]


def add_task(pulsed, prompt: str) -> str:
    out = pulsed.ctl("task", "add", "--project", "ops", "--title", "boundary", "--prompt", prompt)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split()[0].rstrip(":")


def task_end(pulsed, task: str) -> dict:
    return wait_for(lambda: next((e for e in pulsed.events(target=task) if e["type"] in ("task-acked", "task-failed")),
                                 None), 90, what=f"the end of {task}")


@pytest.fixture
def agent_host(pulsed, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(agent_config(script))
    pulsed.start()
    return pulsed


def test_a_run_that_names_another_agent_is_still_its_own_run(agent_host):
    """`pulsectl mcp --agent other` with PULSE_AGENT/PULSE_TASK changed, inside a run: the session is
    the run's agent and task all the same, so its unverified write fails its task (it was acked)."""
    pulsed = agent_host
    task = add_task(pulsed, "impostor")
    ended = task_end(pulsed, task)
    assert ended["type"] == "task-failed" and ended["data"]["reason"] == "unverified-write", ended
    sessions = [s for s in opened(pulsed) if s["task"] == task]
    assert sessions and all(s["agent"] == "alice" for s in sessions), opened(pulsed)
    assert not any(s["agent"] == "other" or s["task"] == "task-999" for s in opened(pulsed))


def test_nobody_without_the_run_token_verifies_or_finishes_for_a_run(agent_host, tmp_path):
    """While alice's run waits with an unverified write, a session that says it is alice on her task
    (no token: the operator's uid, so it may act as an agent, but never for a task) looks and finishes;
    her run is failed all the same. A forged token is refused."""
    pulsed = agent_host
    marker = tmp_path / "your-turn"
    task = add_task(pulsed, f"wait:{marker}")
    wait_for(lambda: [e for e in pulsed.events("gate-call") if e["data"].get("phase") == "end"
                      and e["data"].get("tool") == "emit_effect"], 60, what="alice's write")

    async def stand_in():
        async with proxy(pulsed.home, "alice", PULSE_TASK=task) as c:
            looked = await c.call_tool("events", {"target": "boundary"})
            finished = await c.call_tool("finish", {"summary": "verified for alice"})
        async with proxy(pulsed.home, PULSE_RUN_TOKEN="forged-" + "x" * 40) as c:
            forged = await c.call_tool("events", {"target": "boundary"})
        return looked, finished, forged
    try:
        looked, finished, forged = asyncio.run(asyncio.wait_for(stand_in(), 60))
    finally:
        marker.touch()
    assert not looked.is_error and not finished.is_error
    assert code(forged) == "RUN_UNKNOWN"
    ended = task_end(pulsed, task)
    assert ended["type"] == "task-failed" and ended["data"]["reason"] == "unverified-write", ended
    stand_ins = [s for s in opened(pulsed) if s["agent"] == "alice" and s["task"] != task]
    assert stand_ins and all(not s["task"] for s in stand_ins)     # a tokenless session has no task


def test_the_proxy_fails_closed_without_the_gate(tmp_path):
    """No gate on the socket: every call answers GATE_UNAVAILABLE (retry), nothing is decided elsewhere."""
    home = tmp_path / "home"
    init_home(home)

    async def calls():
        async with proxy(home, PULSE_GATE_SOCKET=str(tmp_path / "no-gate.sock")) as c:
            tools = [t.name for t in (await c.list_tools()).tools]
            return tools, await c.call_tool("status", {}), await c.call_tool("emit_effect", {"kind": "noop"})
    tools, read, write = asyncio.run(asyncio.wait_for(calls(), 60))
    assert "emit_effect" in tools and "finish" in tools
    for result in (read, write):
        assert code(result) == "GATE_UNAVAILABLE" and result.structured_content["error"]["details"]["retry"] is True
    assert not (home / "events.db").exists() or b"gate-call" not in (home / "events.db").read_bytes()
