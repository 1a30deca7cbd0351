"""Two real agent runs at once, each with its own run token: run B's session cannot act as run A
(`--agent`, PULSE_AGENT and PULSE_TASK naming A change nothing), so it can neither verify nor finish
for A, nor write under A's name; A's outcome is its own. Through the real MCP client over stdio,
started by the command adapter, against a running pulsed."""

from __future__ import annotations

import json
import sys

import pytest

from support import PULSECTL, init_home, wait_for

pytest.importorskip("mcp")

# prompt "wait:PATH": look at `boundary`, write on it (exec `true`), wait for PATH, leave without
# verifying.
# prompt "intrude:TASK": claim to be alice on TASK (flag and environment), look at `boundary`,
# write on it, look again and finish: everything that would verify and finish alice's run, were
# this session hers.
SCRIPT = """
import asyncio, json, os, sys, time
from mcp import Client, StdioServerParameters

async def main(pulsectl, prompt):
    env, args = dict(os.environ), ["mcp"]
    if prompt.startswith("intrude:"):
        env.update(PULSE_AGENT="alice", PULSE_TASK=prompt[8:])
        args += ["--agent", "alice"]
    async with Client(StdioServerParameters(command=pulsectl, args=args, env=env), read_timeout_seconds=60,
                      mode="legacy") as c:
        await c.call_tool("events", {"target": "boundary"})
        wrote = await c.call_tool("emit_effect", {"kind": "exec", "target": "boundary", "params": {"argv": ["true"]}})
        print(json.dumps({"wrote": wrote.structured_content}), flush=True)
        if prompt.startswith("wait:"):
            deadline = time.monotonic() + 60
            while not os.path.exists(prompt[5:]) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return
        looked = await c.call_tool("events", {"target": "boundary"})
        finished = await c.call_tool("finish", {"summary": "verified and finished for alice"})
        print(json.dumps({"looked": looked.structured_content["ok"], "finished": finished.structured_content}),
              flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def two_agents(script) -> str:
    argv = f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, {json.dumps(PULSECTL)}, "{{prompt}}"]\n'
    return "".join(f'[[agent]]\nname = "{name}"\nadapter = "command"\n{argv}timeout_s = 120\n'
                   for name in ("alice", "bob")) + \
        ('[tasks]\nmax_failures = 1\n'
         '[allow]\nkinds = ["noop", "exec", "agent-run", "task-add"]\nexec_argv = [["true"]]\n')


def add_task(pulsed, agent: str, prompt: str) -> str:
    out = pulsed.ctl("task", "add", "--project", "ops", "--title", "two runs", "--agent", agent, "--prompt", prompt)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split()[0].rstrip(":")


def task_end(pulsed, task: str) -> dict:
    return wait_for(lambda: next((e for e in pulsed.events(target=task) if e["type"] in ("task-acked", "task-failed")),
                                 None), 90, what=f"the end of {task}")


def facts(pulsed, phase: str) -> list[dict]:
    return [e["data"] for e in pulsed.events("gate-call") if e["data"].get("phase") == phase]


def test_run_b_cannot_verify_finish_or_write_for_run_a(pulsed, tmp_path):
    script = tmp_path / "two-runs-agent.py"
    script.write_text(SCRIPT)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(two_agents(script))
    pulsed.start()
    marker = tmp_path / "alice-may-leave"
    task_a = add_task(pulsed, "alice", f"wait:{marker}")
    try:
        wait_for(lambda: [f for f in facts(pulsed, "end") if f.get("tool") == "emit_effect"], 60,
                 what="alice's write, left unverified while her run waits")
        task_b = add_task(pulsed, "bob", f"intrude:{task_a}")
        ended_b = task_end(pulsed, task_b)
        running_a = [e for e in pulsed.events(target=task_a) if e["type"] in ("task-acked", "task-failed")]
    finally:
        marker.touch()
    ended_a = task_end(pulsed, task_a)
    opened = facts(pulsed, "open")
    sessions_a = {f["session"] for f in opened if f["task"] == task_a}
    sessions_b = {f["session"] for f in opened if f["task"] == task_b}
    # both ran at once: B ended while A still waited with its write unverified
    assert not running_a, running_a
    # B's sessions are bob on B's task, whatever they claimed; none of them is alice's
    assert sessions_b and all(f["agent"] == "bob" for f in opened if f["session"] in sessions_b), opened
    assert all(f["agent"] == "alice" for f in opened if f["session"] in sessions_a), opened
    assert not sessions_a & sessions_b
    # B's write, look and finish were B's own: its task is acked, on its own verified write
    assert ended_b["type"] == "task-acked", ended_b
    finishes = facts(pulsed, "finish")
    assert finishes and all(f["session"] in sessions_b for f in finishes), finishes
    writes = {f["session"] for f in facts(pulsed, "begin") if f.get("tool") == "emit_effect"}
    assert writes & sessions_a and writes & sessions_b
    # A's outcome is its own: B's look verified nothing for it and B's finish did not end it
    assert ended_a["type"] == "task-failed" and ended_a["data"]["reason"] == "unverified-write", ended_a
