"""What an agent may do through the gate's tools, against a real pulsed and through the real MCP
client: it cannot speak for Pulse (its notifications carry its own origin, agent and task, and
have a budget of their own), and what it creates is bounded (create_task: [allow], routing, depth,
rate, priority; it sees only its own tasks and events).
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from test_gate_boundary import proxy

from pulse.core import client
from pulse.core.wire import doorbells, enginerpc
from pulse.store import effectqueue, eventsdb
from support import PULSECTL, init_home, wait_for

pytest.importorskip("mcp")


def notify_config(path) -> str:
    return (f'[[notify]]\nname = "ops"\nkind = "file"\npath = "{path}"\nburst = 5\ngroup_s = 600\n'
            '[allow]\nkinds = ["noop", "notify"]\n')


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def survival_alert(pulsed, target: str, message: str) -> enginerpc.Effect:
    """A notification as the survival layer queues one."""
    conn = eventsdb.open_events(pulsed.home / "events.db")
    try:
        effect = effectqueue.new_effect(enginerpc.Effect(kind="notify", target=target, idempotent=True, params={
            "rule": "processWatchdog", "title": f"{target} crashed", "message": message}), "survival", 60)
        effectqueue.commit_effects(conn, [effect], "test")
    finally:
        conn.close()
    client.ring(pulsed.paths, "doorbell", doorbells.Doorbell("test"))
    return effect


def test_an_agent_cannot_speak_for_pulse_nor_use_up_its_alerts(pulsed, tmp_path):
    """An agent's notify that says it is survival (origin, rule, effect_id, agent, task in its params)
    reaches the channel as the agent's, with Pulse's own fields; six of them about `gateway` (one
    over the channel's burst of 5), then survival's real alert about `gateway`: that alert is
    delivered at once, not held back for the digest."""
    out = tmp_path / "notifications.jsonl"
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(notify_config(out))
    pulsed.start()
    forged = {"origin": "survival", "effect_id": "chosen-id", "rule": "processWatchdog", "agent": "pulse",
              "task": "task-1", "message": "gateway crashed 3 times"}

    async def agent():
        results = []
        async with proxy(pulsed.home, "mallory") as c:
            for n in range(6):
                await c.call_tool("events", {"target": "gateway"})
                params = forged if n == 0 else {"message": f"fake {n}"}
                results.append(await c.call_tool("emit_effect", {"kind": "notify", "target": "gateway",
                                                                 "params": params}))
        return results
    results = asyncio.run(asyncio.wait_for(agent(), 90))
    assert all(not r.is_error for r in results), [r.structured_content for r in results]
    sent = wait_for(lambda: len(lines(out)) >= 5 and lines(out), 30, what="the agent's first five notifications")
    first = sent[0]
    assert (first["origin"], first["agent"], first["task"]) == ("agent", "mallory", ""), first
    assert first["effect_id"] != "chosen-id" and "rule" not in first, first
    assert first["effect_id"] in {e["data"]["effect_id"] for e in pulsed.events("effect-acked")}
    real = survival_alert(pulsed, "gateway", "gateway crashed 3 times")
    delivered = wait_for(lambda: [n for n in lines(out) if n["effect_id"] == real.id], 30,
                         what="survival's alert on the channel")
    assert delivered[0]["origin"] == "survival" and delivered[0]["rule"] == "processWatchdog", delivered
    assert not delivered[0].get("digest")
    agents = [n for n in lines(out) if n["origin"] == "agent"]
    assert len(agents) == 5, agents          # the sixth is held for the agent's own digest


# -- create_task: [allow], routing, depth, rate, priority; a run sees its own tasks --------------------------

# An agent the command adapter runs: its prompt is a plan, {"calls": [[tool, args], ...], "out": path}; each
# create_task is preceded by the look the gate asks for (list_tasks), then it finishes. What each call answered
# is appended to OUT as one JSON line {"task", "tool", "args", "result"}.
PLAN_SCRIPT = """
import asyncio, json, os, sys
from mcp import Client, StdioServerParameters
pulsectl, prompt = sys.argv[1:3]
plan = json.loads(prompt)

async def main():
    params = StdioServerParameters(command=pulsectl, args=["mcp"], env=dict(os.environ))
    async with Client(params, read_timeout_seconds=60, mode="legacy") as c:
        for tool, args in plan.get("calls", []):
            if tool == "create_task":
                await c.call_tool("list_tasks", {})
            result = (await c.call_tool(tool, args)).structured_content
            with open(plan["out"], "a") as f:
                f.write(json.dumps({"task": os.environ["PULSE_TASK"], "tool": tool, "args": args, "result": result}) + "\\n")
        await c.call_tool("finish", {"summary": "plan done"})

asyncio.run(main())
"""


def plan_agent(name: str, script, projects: list[str]) -> str:
    return (f'[[agent]]\nname = "{name}"\nadapter = "command"\nprojects = {json.dumps(projects)}\n'
            f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, {json.dumps(PULSECTL)}, "{{prompt}}"]\n'
            'timeout_s = 120\n')


def plan(out, *calls) -> str:
    return json.dumps({"out": str(out), "calls": [list(c) for c in calls]})


def add_task(pulsed, project: str, prompt: str, priority: int = 0) -> str:
    done = pulsed.ctl("task", "add", "--project", project, "--title", "planned", "--prompt", prompt,
                      "--priority", str(priority))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split()[0].rstrip(":")


def ended(pulsed, task: str) -> dict:
    return wait_for(lambda: next((e for e in pulsed.events(target=task) if e["type"] in ("task-acked", "task-failed")),
                                 None), 90, what=f"the end of {task}")


def acked(pulsed, task: str) -> dict:
    end = ended(pulsed, task)
    assert end["type"] == "task-acked", end["data"]
    return end


def answers(out) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def err(answer: dict) -> str | None:
    return None if answer["result"]["ok"] else answer["result"]["error"]["code"]


@pytest.fixture
def planners(pulsed, tmp_path):
    script = tmp_path / "plan.py"
    script.write_text(PLAN_SCRIPT)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(
        plan_agent("a", script, ["pa"]) + plan_agent("b", script, ["pb"])
        + "[tasks]\nmax_failures = 1\nagent_tasks_per_hour = 2\nagent_max_depth = 1\n"
        + '[allow]\nkinds = ["noop", "agent-run", "task-add"]\n')
    pulsed.start()
    return pulsed


def test_create_task_keeps_to_its_projects_rate_and_priority_and_a_run_sees_only_its_own(planners, tmp_path):
    """Agent a (projects ["pa"], 2 tasks an hour) in a run of a priority-5 task: a task for pb is
    refused, one asked at priority 9 is made at 5, a second is made, a third is RATE_LIMITED; its
    list_tasks and events show nothing of b's task, whose prompt they never carry."""
    pulsed, out = planners, tmp_path / "answers.jsonl"
    secret = "secret-of-b-" + "z" * 8
    theirs = add_task(pulsed, "pb", json.dumps({"out": str(out), "calls": [], "note": secret}))   # b's
    acked(pulsed, theirs)
    child = plan(out)
    mine = add_task(pulsed, "pa", plan(out, ["create_task", {"project": "pb", "title": "t", "prompt": child}],
                                       ["create_task", {"project": "pa", "title": "t", "prompt": child, "priority": 9}],
                                       ["create_task", {"project": "pa", "title": "t", "prompt": child}],
                                       ["create_task", {"project": "pa", "title": "t", "prompt": child}],
                                       ["list_tasks", {}], ["events", {"limit": 500}]), priority=5)
    acked(pulsed, mine)
    seen = [a for a in answers(out) if a["task"] == mine]
    creates = [a for a in seen if a["tool"] == "create_task"]
    assert [err(a) for a in creates] == ["ACTION_NOT_ALLOWED", None, None, "RATE_LIMITED"], creates
    made = [a["result"]["data"]["task"] for a in creates[1:3]]
    assert [(t["priority"], t["created_by"], t["parent"], t["depth"]) for t in made] == [(5, "a", mine, 1), (0, "a", mine, 1)]
    assert not [t for t in pulsed.events("task-created") if t["data"]["project"] == "pb" and t["source"] == "agent"]
    listed = {t["id"] for t in next(a for a in seen if a["tool"] == "list_tasks")["result"]["data"]["tasks"]}
    assert listed == {mine, made[0]["id"], made[1]["id"]}, listed
    looked = json.dumps(next(a for a in seen if a["tool"] == "events")["result"])
    assert theirs not in looked and secret not in looked and '"b"' not in looked, looked[:2000]


def test_create_task_fan_out_stops_at_the_depth_bound(planners, tmp_path):
    """agent_max_depth = 1: the operator's task (0) makes a child (1), whose run's create_task is
    refused TASK_DEPTH: no grandchild."""
    pulsed, out = planners, tmp_path / "answers.jsonl"
    grandchild = plan(out)
    child = plan(out, ["create_task", {"project": "pa", "title": "g", "prompt": grandchild}])
    top = add_task(pulsed, "pa", plan(out, ["create_task", {"project": "pa", "title": "c", "prompt": child}]))
    acked(pulsed, top)
    made = next(a for a in answers(out) if a["task"] == top)["result"]["data"]["task"]
    # its only write was refused: the child's run is not acked, whatever it says (reason no-write)
    end = ended(pulsed, made["id"])
    assert (end["type"], end["data"]["reason"]) == ("task-failed", "no-write"), end["data"]
    refused = next(a for a in answers(out) if a["task"] == made["id"])
    assert err(refused) == "TASK_DEPTH", refused
    assert len([e for e in pulsed.events("task-created") if e["source"] == "agent"]) == 1


def test_create_task_needs_task_add_allowed(pulsed):
    """[allow] without task-add: create_task is not offered, and a call is refused ACTION_NOT_ALLOWED."""
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text('[allow]\nkinds = ["noop"]\n')
    pulsed.start()

    async def agent():
        async with proxy(pulsed.home, "mallory") as c:
            offered = [t.name for t in (await c.list_tools()).tools]
            await c.call_tool("list_tasks", {})
            return offered, await c.call_tool("create_task", {"project": "ops", "title": "t", "prompt": "p"})
    offered, made = asyncio.run(asyncio.wait_for(agent(), 60))
    assert "create_task" not in offered
    assert made.structured_content["error"]["code"] == "ACTION_NOT_ALLOWED", made.structured_content
    assert not pulsed.events("task-created")


@pytest.mark.parametrize("line, named", [("agent_max_depth = -1", "$.tasks.agent_max_depth"),
                                         ("agent_tasks_per_hour = -2", "$.tasks.agent_tasks_per_hour")])
def test_a_bad_task_bound_is_named(tmp_path, line, named):
    import re

    from pulse.core import config as configmod
    path = tmp_path / "config.toml"
    path.write_text(f"[tasks]\n{line}\n")
    with pytest.raises(configmod.ConfigError, match=re.escape(named)):
        configmod.load(path)
    defaults = configmod.load(tmp_path / "absent.toml")
    assert (defaults.tasks.agent_max_depth, defaults.tasks.agent_tasks_per_hour) == (3, 30)
    shown = configmod.to_toml(defaults)          # `pulsectl config --effective`
    assert "agent_max_depth = 3" in shown and "agent_tasks_per_hour = 30" in shown
