"""`pulsectl mcp` end to end: the real MCP client over stdio, against a running pulsed.

One session walks the gate the way an agent would: a write before any target (blocked),
a resolve, two writes in one batch (one blocked), finish on an unverified write (refused),
a read of the wrong resource (not verification), the right one (verified), a
self-verifying write, an effect the allow-list refuses, and finish. The events it leaves
are checked too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from support import PULSECTL, init_home, wait_for

pytest.importorskip("mcp")

MARK = "777.125"   # a sleep no other test starts: the critical process of this test


def sleepers() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if p.info["cmdline"] == ["sleep", MARK]:
            out.append(p)
    return out


SLEEPER = ("[[process]]\n"
           'name = "sleeper"\n'
           f'match = "^sleep {MARK.replace(".", "[.]")}$"\n'
           f'restart = ["sleep", "{MARK}"]\n')
# An effect that takes a while, so a write can be caught in flight: exec of `sleep` on target "napper".
NAPPER = '[allow]\nkinds = ["noop", "notify", "restart-process", "signal", "exec"]\nexec_argv = [["sleep"]]\n'


def with_sleeper(pulsed, tracker, config: str):
    """A pulsed whose config has one critical process, a `sleep` this test started."""
    pulsed.home.mkdir(parents=True)
    (pulsed.home / "config.toml").write_text(config)
    first = subprocess.Popen(["sleep", MARK], start_new_session=True)
    tracker.add(first.pid)
    pulsed.start()
    yield pulsed
    for p in sleepers():   # restarts start detached sleepers: end them by pid
        tracker.add(p.pid)
    first.kill()
    first.wait(5)


@pytest.fixture
def host(pulsed, tracker):
    yield from with_sleeper(pulsed, tracker, SLEEPER)


@pytest.fixture
def napper_host(pulsed, tracker):
    yield from with_sleeper(pulsed, tracker, SLEEPER + NAPPER)


def server_params(home, agent: str | None = None):
    from mcp import StdioServerParameters
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "PULSE_AGENT",
                                                               "PULSE_TASK")}
    return StdioServerParameters(command=PULSECTL, args=["--home", str(home), "mcp",
                                                         *(["--agent", agent] if agent else [])], env=env)


def envelope(result) -> dict:
    return result.structured_content


def code(result) -> str | None:
    body = envelope(result)
    return None if body["ok"] else body["error"]["code"]


async def agent_session(home, answers: list[str], mode: str = "auto") -> dict:
    import mcp_types as types
    from mcp import Client

    async def operator(context, params):
        answers.append(params.message)
        return types.ElicitResult(action="accept", content={"answer": "the sleeper, please"})

    seen: dict = {}
    async with Client(server_params(home), elicitation_callback=operator, read_timeout_seconds=60, mode=mode) as c:
        seen["tools"] = sorted(t.name for t in (await c.list_tools()).tools)
        call = c.call_tool
        seen["write_first"] = await call("restart_process", {"name": "sleeper"})
        seen["ask"] = await call("ask_operator", {"question": "Which process?"})
        seen["still_blocked"] = await call("restart_process", {"name": "sleeper"})   # user_input validated nothing
        seen["resolve"] = await call("find_process", {"name": "sleeper"})
        seen["batch"] = await asyncio.gather(call("restart_process", {"name": "sleeper"}),
                                             call("restart_process", {"name": "sleeper"}))
        seen["finish_early"] = await call("finish", {"summary": "restarted it"})
        seen["other_read"] = await call("status", {})
        seen["second_write"] = await call("signal_process", {"name": "sleeper", "signal": "SIGTERM"})
        seen["verify"] = await call("find_process", {"name": "sleeper"})
        seen["no_tasks"] = await call("list_tasks", {})                    # a write needs its resource looked at
        seen["task"] = await call("create_task", {"project": "ops", "title": "check the sleeper",
                                                  "prompt": "Find out why it was restarted."})
        seen["events"] = await call("events", {})                           # no target: every target
        seen["refused"] = await call("emit_effect", {"kind": "exec", "params": {"argv": ["true"]}})
        seen["tasks"] = await call("list_tasks", {})
        seen["finish"] = await call("finish", {"summary": "restarted and verified"})
    return seen


# auto: the SDK client opens in the 2026-07-28 era, which the SDK serves; legacy: the initialize
# handshake, which every agent CLI speaks and the proxy serves by hand (pulse.gate.mcpstdio).
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_an_agent_session_through_the_gate(host, mode):
    answers: list[str] = []
    seen = asyncio.run(asyncio.wait_for(agent_session(host.home, answers, mode), 120))

    # the default [allow] refuses restart-worker, engine-promote and engine-rollback: those tools are not offered
    assert seen["tools"] == sorted(["find_process", "list_workers", "list_tasks", "status", "vitals", "events",
                                    "log_tail", "effect", "restart_process", "signal_process",
                                    "emit_effect", "create_task", "ask_operator", "finish"])
    first = seen["write_first"]
    assert first.is_error and first.content[0].text.startswith("FSM_BLOCKED: ")
    assert envelope(first)["error"] | {"reason": None} == {"code": "FSM_BLOCKED", "state": "RESOLVING",
                                                          "tool": "restart_process", "kind": "write",
                                                          "reason": None, "recoverable": True}
    assert not seen["ask"].is_error, envelope(seen["ask"])
    assert envelope(seen["ask"])["data"]["answer"] == "the sleeper, please" and answers == ["Which process?"]
    assert code(seen["still_blocked"]) == "FSM_BLOCKED"
    resolved = envelope(seen["resolve"])["data"]
    assert resolved["alive"] and resolved["processes"]

    outcomes = sorted(code(r) or "ok" for r in seen["batch"])
    assert outcomes == ["FSM_BLOCKED", "ok"]
    blocked = next(r for r in seen["batch"] if r.is_error)
    assert "in flight" in envelope(blocked)["error"]["reason"]
    done = next(r for r in seen["batch"] if not r.is_error)
    assert envelope(done)["data"]["state"] == "acked" and envelope(done)["data"]["outcome"]["type"] == "effect-acked"

    assert code(seen["finish_early"]) == "UNVERIFIED_WRITE"
    assert seen["finish_early"].content[0].text.startswith("UNVERIFIED_WRITE: ")
    assert not seen["other_read"].is_error                     # status covers workers, not the process
    assert code(seen["second_write"]) == "FSM_BLOCKED"
    assert envelope(seen["second_write"])["error"]["state"] == "VERIFYING"
    assert envelope(seen["verify"])["data"]["alive"]
    task = envelope(seen["task"])["data"]
    assert task["verification"]["ok"] and task["task"]["status"] == "pending"
    not_allowed = envelope(seen["refused"])["error"]
    assert not_allowed["code"] == "ACTION_NOT_ALLOWED" and "allow" in not_allowed["message"]
    assert [t["title"] for t in envelope(seen["tasks"])["data"]["tasks"]] == ["check the sleeper"]
    assert envelope(seen["finish"]) == {"ok": True, "data": {"finished": True, "state": "READING"}}

    # What the session left in events.db: the facts the gate decided on, each committed before the
    # call went on (open; begin and end of each call; the effect a write committed; blocks; finish).
    every, blocks = host.events("gate-call"), host.events("gate-blocked")
    assert len({e["target"] for e in every + blocks}) == 1 and every[0]["source"] == "mcp"
    assert every[0]["data"] | {"pid": None, "started": None} == {
        "phase": "open", "session": every[0]["target"], "agent": "operator-shell", "task": None, "pid": None,
        "started": None}
    assert [e["data"]["code"] for e in blocks] == ["FSM_BLOCKED", "FSM_BLOCKED", "FSM_BLOCKED", "UNVERIFIED_WRITE",
                                                  "FSM_BLOCKED"]
    refused = [e["data"] for e in every if e["data"].get("phase") == "blocked"]
    assert [(c["tool"], c["blocked"]) for c in refused] == [(b["data"]["tool"], b["data"]["code"]) for b in blocks]
    calls = [e for e in every if e["data"].get("phase") in ("end", "finish") or e["data"].get("round")]
    if mode == "auto":
        # 2026-07-28: ask_operator counts twice, the round that returned the question to the client
        # and the call with the answer that the gate judged (the handshake era asks in between)
        assert calls[0]["data"] | {"session": None} == {"session": None, "tool": "ask_operator", "kind": "user_input",
                                                         "ok": True, "round": "question"}
        calls = calls[1:]
    assert [e["data"]["tool"] for e in calls] == ["ask_operator", "find_process", "restart_process",
                                                 "status", "find_process", "list_tasks", "create_task", "events",
                                                 "emit_effect", "list_tasks", "finish"]
    begun = {e["data"]["call"]: e["id"] for e in every if e["data"].get("phase") == "begin"}
    assert all(begun[e["data"]["call"]] < e["id"] for e in calls[1:-1])  # each began (committed) before it ended
    restart = calls[2]["data"]
    assert restart["state_before"] == "READING" and restart["state"] == "VERIFYING" and restart["acted"]
    acting = [e["data"] for e in every if e["data"].get("phase") == "acting"]
    assert [a["call"] for a in acting] == [restart["call"], calls[8]["data"]["call"]]
    verify = calls[4]["data"]
    assert verify["verified"] == ["process:sleeper"] and verify["state"] == "READING"
    assert calls[6]["data"]["self_verified"] is True
    assert calls[8]["data"]["acted"] is False and calls[8]["data"]["state"] == "READING"
    assert calls[0]["data"]["state_before"] == "RESOLVING"     # ask_operator changed nothing

    agent_effects = [e for e in host.events("effect") if e["data"]["origin"] == "agent"]
    assert [e["data"]["kind"] for e in agent_effects] == ["restart-process", "exec"]
    failed = host.events("effect-failed")
    assert failed and failed[-1]["data"]["reason"] == "not-allowed"
    assert [e["target"] for e in host.events("task-created")] == ["task-1"]
    assert host.events("task-created")[0]["source"] == "agent"


def test_stdout_carries_json_rpc_only(host):
    """A raw session: every line pulsectl mcp writes on stdout is a JSON-RPC message."""
    proc = subprocess.Popen([PULSECTL, "--home", str(host.home), "mcp"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    host.tracker.add(proc.pid)
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        # sent together: the write begins first (still RESOLVING), the read alongside it
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "promote", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "status", "arguments": {}}},
    ]
    killer = threading.Timer(60, proc.kill)   # bounded: a hung server fails the test, never hangs it
    killer.start()
    lines: list[str] = []
    try:
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
        proc.stdin.flush()
        while not {1, 2, 3} <= {json.loads(line).get("id") for line in lines}:
            line = proc.stdout.readline()
            assert line, f"pulsectl mcp closed stdout early: {proc.stderr.read()}"
            lines.append(line)
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + proc.stdout.read()
    replies = [json.loads(line) for line in out.splitlines()]   # raises on anything that is not JSON
    assert all(r.get("jsonrpc") == "2.0" for r in replies)
    by_id = {r["id"]: r for r in replies if "id" in r}
    assert all("result" in r for r in by_id.values()) and set(by_id) == {1, 2, 3}, replies
    assert by_id[1]["result"]["serverInfo"]["name"] == "pulse"
    status = by_id[3]["result"]["structuredContent"]
    assert status["ok"] and {w["name"] for w in status["data"]["workers"]} >= {"watcher", "tick", "executor"}
    promote = by_id[2]["result"]
    assert promote["isError"] and promote["structuredContent"]["error"]["code"] == "FSM_BLOCKED"
    assert "FSM_BLOCKED" in promote["content"][0]["text"]


def test_mcp_refuses_a_missing_home(tmp_path):
    out = subprocess.run([PULSECTL, "--home", str(tmp_path / "none"), "mcp"], capture_output=True, text=True,
                         timeout=30, stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "no Pulse home" in out.stderr and out.stdout == ""


async def reset_session(host) -> dict:
    from mcp import Client
    seen: dict = {}
    async with Client(server_params(host.home), read_timeout_seconds=60, mode="legacy") as c:
        seen["ask"] = await c.call_tool("ask_operator", {"question": "anyone there?"})   # no elicitation here
        await c.call_tool("find_process", {"name": "sleeper"})
        seen["write"] = await c.call_tool("restart_process", {"name": "sleeper"})
        session = host.events("gate-call")[-1]["target"]
        seen["blocked"] = await c.call_tool("restart_process", {"name": "sleeper"})
        seen["keep"] = await asyncio.to_thread(host.ctl, "gate-reset", session, "--keep-progress")
        seen["finish"] = await c.call_tool("finish", {"summary": "reset by the operator"})
        seen["plain"] = await asyncio.to_thread(host.ctl, "gate-reset", session)
        seen["after"] = await c.call_tool("restart_process", {"name": "sleeper"})
        seen["session"] = session
    return seen


def test_the_operator_resets_a_live_session(host):
    seen = asyncio.run(asyncio.wait_for(reset_session(host), 120))
    assert code(seen["ask"]) == "NO_OPERATOR"
    assert not seen["write"].is_error and code(seen["blocked"]) == "FSM_BLOCKED"
    assert seen["keep"].returncode == 0
    assert seen["keep"].stdout.strip() == "operator-shell: VERIFYING → READING (forgot unverified process:sleeper)"
    assert not seen["finish"].is_error                          # the debt was dropped with the tracking
    assert seen["plain"].returncode == 0
    assert seen["plain"].stdout.strip() == "operator-shell: READING → RESOLVING (no unverified write)"
    assert envelope(seen["after"])["error"]["state"] == "RESOLVING"
    resets = [e["data"] for e in host.events("gate-call") if e["data"].get("tool") == "reset"]
    assert [r["keep_progress"] for r in resets] == [True, False]
    # written by the gate (it alone writes gate facts while it runs), not by pulsectl
    assert {e["source"] for e in host.events("gate-call") if e["data"].get("tool") == "reset"} == {"gate"}
    forged = host.ctl("gate-reset", seen["session"] + "0")         # a session id is matched whole, never in part
    assert forged.returncode == 1 and "no gate session" in forged.stderr
    assert host.ctl("gate-reset").returncode == 2 and host.ctl("gate-reset", "--agent", "nobody").returncode == 1
    assert len([e for e in host.events("gate-call") if e["data"].get("tool") == "reset"]) == 2   # nothing more


def test_gated_calls_that_fail_before_acting_change_nothing(tmp_path):
    """Without the SDK or a pulsed: the gate and the tools, on a real events.db."""
    from pulse.core.config import Config, Process
    from pulse.core.home import Paths
    from pulse.gate.tools import PulseTools, ToolSession
    from pulse.store import effectqueue, eventsdb

    home = tmp_path / "home"
    home.mkdir()
    paths = Paths.for_client(home)
    events = eventsdb.open_events(paths.events_db)
    config = Config(process=[Process(name="gw", match="^never-such-process$")])
    session = ToolSession(PulseTools(paths, config, events, asyncio.to_thread, asyncio.sleep), "mcp-1-0badcafe")

    async def calls():
        return [await session.call(name, args) for name, args in (
            ("find_process", {"name": "gw"}),                     # RESOLVING → READING: looked at (not alive)
            ("restart_process", {"name": "gw"}),                  # no pulsed: refused before any effect
            ("status", {}),                                       # no pulsed: a failed read
            ("no_such_tool", {}),                                 # a write by classification: on nothing looked at
            ("list_tasks", {"status": "pending", "all": True}),   # an unknown argument: a write; refused
            ("list_tasks", {}),
            ("create_task", {"project": "p", "title": "t"}),      # missing prompt
            ("finish", {"summary": "nothing changed"}),
        )]
    results = asyncio.run(calls())
    codes = [env["error"]["code"] if not env["ok"] else "ok" for env, _ in results]
    assert codes == ["ok", "EXECUTION_CONTEXT_UNAVAILABLE", "EXECUTION_CONTEXT_UNAVAILABLE", "FSM_BLOCKED",
                     "FSM_BLOCKED", "ok", "INVALID_INPUT", "ok"]
    assert all(text.startswith(code) for code, (_, text) in zip(codes, results) if code != "ok")
    assert session.gate.state.value == "READING" and effectqueue.list_effects(events) == []
    calls_ = [e.data for e in eventsdb.read_events(events, types=("gate-call",))
              if e.data["phase"] in ("end", "finish", "blocked")]
    assert [c["tool"] for c in calls_] == ["find_process", "restart_process", "status", "no_such_tool", "list_tasks",
                                          "list_tasks", "create_task", "finish"]
    blocked = [e.data for e in eventsdb.read_events(events, types=("gate-blocked",))]
    assert [b["classified"] for b in blocked] == ["unknown tool", "unrecognised arguments ['all']"]
    assert all(c.get("acted") is False for c in calls_ if c["kind"] == "write" and c["phase"] == "end")
    events.close()


def test_only_tools_that_can_work_are_offered():
    from pulse.core.config import Allow
    from pulse.gate import tools as toolserver
    everything = Allow(kinds=["noop", "restart-process", "signal", "restart-worker", "engine-promote",
                              "engine-rollback", "task-add"])
    assert {n for n, _, _ in toolserver.tool_list(everything)} == {n for n, _, _ in toolserver.tool_list()}
    narrow = Allow(kinds=["noop"])
    assert {n for n, _, _ in toolserver.tool_list(narrow)} & {"restart_process", "signal_process", "promote",
                                                               "create_task"} == set()
    assert 'restart_process (allow.kinds lacks "restart-process")' in toolserver.instructions(narrow)


def test_every_tool_advertises_exactly_the_arguments_the_gate_declares():
    """Arguments are declared once, in the gate's descriptors; the MCP schema is generated from them,
    so the gate classifies and the client sees the same names."""
    from pulse.gate import catalogue
    from pulse.gate import tools as toolserver
    listed = {name: schema for name, _, schema in toolserver.tool_list()}
    assert set(listed) == set(catalogue.TOOLS) | {"finish"}
    for name, descriptor in catalogue.TOOLS.items():
        assert set(listed[name]["properties"]) == set(descriptor.params), name
        assert set(listed[name]["required"]) == {n for n, a in descriptor.params.items() if a.required}, name

def test_finish_is_terminal_and_arguments_are_bounded_through_the_real_client(host):
    async def session():
        from mcp import Client
        async with Client(server_params(host.home), read_timeout_seconds=60, mode="legacy") as c:
            huge = await c.call_tool("find_process", {"name": "x" * (1024 * 1024)})
            found = await c.call_tool("find_process", {"name": "sleeper"})
            done = await c.call_tool("finish", {"summary": "looked"})
            after = await c.call_tool("find_process", {"name": "sleeper"})
            again = await c.call_tool("finish", {"summary": "again"})
            return huge, found, done, after, again
    huge, found, done, after, again = asyncio.run(asyncio.wait_for(session(), 60))
    assert code(huge) == "INVALID_INPUT" and not found.is_error and not done.is_error
    assert code(after) == "SESSION_FINISHED" and code(again) == "SESSION_FINISHED"
    oversized = [e for e in host.events("gate-call") if e["data"].get("blocked") == "INVALID_INPUT"]
    assert len(oversized) == 1 and oversized[0]["data"]["args_bytes"] > 1024 * 1024
    assert len(json.dumps(oversized[0]["data"])) < 1024            # a hash and a preview, never the argument


def logical_bytes(home) -> int:
    """What the events in events.db hold, column by column: the growth a caller can cause."""
    import sqlite3
    conn = sqlite3.connect(f"file:{home / 'events.db'}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT COALESCE(SUM(LENGTH(type) + LENGTH(source) + COALESCE(LENGTH(target), 0)"
                            " + LENGTH(data) + 24), 0) FROM events").fetchone()[0]
    finally:
        conn.close()


# 2,000 blocked calls, each ~1 KB recorded unbounded, would add ~2 MB: thirty times the bound
BLOCK_STORM = 2_000
STORM_BOUND = 64 * 1024     # 30 recorded blocks of ~1 KB, the huge names' facts, the session's own


def test_a_huge_tool_name_and_a_storm_of_blocked_calls_are_bounded(pulsed):
    """Five calls with a 4 MB tool name and BLOCK_STORM blocked writes, through the real client, add
    at most STORM_BOUND bytes to events.db (66 MB and 11.4 MB for 10,000 blocks before)."""
    init_home(pulsed.home)
    pulsed.start()
    before = logical_bytes(pulsed.home)

    async def storm():
        async with client(pulsed.home) as c:
            names = [await c.call_tool("x" * (4 * 1024 * 1024), {}) for _ in range(5)]
            write = {"kind": "noop", "target": "t"}
            blocked = [await c.call_tool("emit_effect", write) for _ in range(BLOCK_STORM)]
            looked = await c.call_tool("status", {})
            while code(looked) == "RATE_LIMITED":       # the look that carries the count, once the rate lets it
                await asyncio.sleep(envelope(looked)["error"]["details"]["retry_after_s"])
                looked = await c.call_tool("status", {})
            return names, blocked, looked
    began = time.monotonic()
    names, blocked, looked = asyncio.run(asyncio.wait_for(storm(), 300))
    windows = int((time.monotonic() - began) // 60) + 1      # the budget is per minute: a loaded machine takes more
    assert all(r.is_error or code(r) for r in names)
    # past [gate] call_burst and calls_per_min the calls are answered RATE_LIMITED before the gate: not blocks
    assert {code(r) for r in blocked} <= {"FSM_BLOCKED", "RATE_LIMITED"}
    blocks = len([r for r in blocked if code(r) == "FSM_BLOCKED"])
    assert blocks > 30
    grown = logical_bytes(pulsed.home) - before
    print(f"\n{BLOCK_STORM} blocked calls and five 4 MB tool names grew events.db by {grown} bytes")
    assert grown < STORM_BOUND * windows
    recorded = [e for e in pulsed.events("gate-blocked")]
    assert 0 < len(recorded) <= 30 * windows
    # the count rides on the session's next fact: a call's, or the next window's first recorded block
    told = sum(e["data"].get("blocks_not_recorded", 0) for e in pulsed.events("gate-call") + recorded)
    assert told + len([e for e in pulsed.events("gate-call") if e["data"].get("phase") == "blocked"]) \
        >= blocks + 5 - 30 * windows      # every block is recorded or counted (the last few may ride on no fact)


# -- the gate across sessions, restarts and agent runs --------------------------------------------------------

# The initialize handshake unless a test is about the era: it is what every agent CLI speaks, and a
# 2026-07-28 connection has `pulsectl mcp` import the SDK (~1 s of CPU a session, on a CPU-bound suite).
def client(home, agent: str | None = None, mode: str = "legacy"):
    from mcp import Client
    return Client(server_params(home, agent), read_timeout_seconds=60, mode=mode)


NAP = {"kind": "exec", "target": "napper", "params": {"argv": ["sleep", "1.5"]}}
# Long enough that a second session, started on a loaded machine, still finds it running.
LONG_NAP = {"kind": "exec", "target": "napper", "params": {"argv": ["sleep", "5"]}}


def facts(host, phase: str) -> list[dict]:
    return [e["data"] for e in host.events("gate-call") if e["data"].get("phase") == phase]


def test_restarting_the_server_forgets_nothing(host):
    """Closed cleanly, the next session of the same agent still owes the verification."""
    async def sessions():
        async with client(host.home) as c:
            await c.call_tool("find_process", {"name": "sleeper"})
            wrote = await c.call_tool("restart_process", {"name": "sleeper"})
        async with client(host.home) as c:
            finish = await c.call_tool("finish", {"summary": "done"})
            again = await c.call_tool("restart_process", {"name": "sleeper"})
            await c.call_tool("find_process", {"name": "sleeper"})
            done = await c.call_tool("finish", {"summary": "restarted and looked"})
        return wrote, finish, again, done
    wrote, finish, again, done = asyncio.run(asyncio.wait_for(sessions(), 120))
    assert not wrote.is_error and code(finish) == "UNVERIFIED_WRITE" and code(again) == "FSM_BLOCKED"
    assert envelope(again)["error"]["state"] == "VERIFYING" and not done.is_error
    opened = facts(host, "open")
    assert len(opened) == 2 and opened[0]["session"] != opened[1]["session"]


def test_a_server_killed_between_write_began_and_returned_leaves_the_write_to_verify(napper_host):
    host = napper_host

    async def killed():
        try:
            async with client(host.home) as c:
                await c.call_tool("events", {"target": "napper"})
                call = asyncio.ensure_future(c.call_tool("emit_effect", LONG_NAP))
                acting = await asyncio.to_thread(wait_for, lambda: facts(host, "acting"), 20, what="the write's effect")
                server = next(f["pid"] for f in facts(host, "open") if f["session"] == acting[0]["session"])
                os.kill(server, 9)
                await asyncio.gather(call, return_exceptions=True)   # its server is gone: the call fails
        except Exception:
            pass                                                       # however the client ends
        async with client(host.home) as c:
            in_flight = await c.call_tool("finish", {"summary": "done"})
            blocked = await c.call_tool("emit_effect", LONG_NAP)
            await asyncio.to_thread(wait_for, lambda: host.events("effect-acked", "napper"), 20,
                                    what="the nap's effect acked")
            owed = await c.call_tool("finish", {"summary": "done"})
            looked = await c.call_tool("events", {"target": "napper"})
            done = await c.call_tool("finish", {"summary": "napped and looked"})
        return in_flight, blocked, owed, looked, done
    in_flight, blocked, owed, looked, done = asyncio.run(asyncio.wait_for(killed(), 120))
    assert code(in_flight) == "UNVERIFIED_WRITE"            # in flight (or cancelled with its proxy): owed either way
    assert code(blocked) == "FSM_BLOCKED"
    assert code(owed) == "UNVERIFIED_WRITE"                      # settled from its effect: it acted
    # The call ran in the gate, which cancelled it when its proxy went away: settled from its effect.
    settled = facts(host, "settle")
    assert len(settled) == 1 and settled[0]["acted"] is True
    assert settled[0]["why"].startswith(("cancelled", "session gone")), settled
    assert not looked.is_error and not done.is_error
    assert len([e for e in host.events("effect") if e["data"]["kind"] == "exec"]) == 1


def test_two_agents_writing_one_process_at_once_exactly_one_acts(host):
    async def race():
        async with client(host.home, "alice") as a, client(host.home, "bob") as b:
            await a.call_tool("find_process", {"name": "sleeper"})
            await b.call_tool("find_process", {"name": "sleeper"})
            return await asyncio.gather(a.call_tool("restart_process", {"name": "sleeper"}),
                                        b.call_tool("restart_process", {"name": "sleeper"}))
    results = asyncio.run(asyncio.wait_for(race(), 120))
    assert sorted(code(r) or "ok" for r in results) == ["FSM_BLOCKED", "ok"]
    reason = envelope(next(r for r in results if r.is_error))["error"]["reason"]
    assert "being changed by" in reason or "was changed by" in reason
    restarts = [e for e in host.events("effect") if e["data"]["kind"] == "restart-process"]
    assert len(restarts) == 1, [(e["source"], e["data"]) for e in restarts]


def test_looks_are_per_resource_empty_reads_verify_nothing_and_finish_races_a_write(host):
    async def session():
        out = {}
        async with client(host.home, "reader") as c:
            await c.call_tool("vitals", {})
            out["unlooked"] = await c.call_tool("restart_process", {"name": "sleeper"})
            await c.call_tool("find_process", {"name": "sleeper"})
            out["wrote"] = await c.call_tool("restart_process", {"name": "sleeper"})
            out["empty"] = await c.call_tool("events", {"target": "sleeper", "type": "no-such-type"})
            out["star"] = await c.call_tool("events", {"target": "*"})
            out["owed"] = await c.call_tool("finish", {"summary": "done"})
        async with client(host.home, "racer") as c:
            await c.call_tool("find_process", {"name": "sleeper"})
            out["race"] = await asyncio.gather(c.call_tool("finish", {"summary": "done"}),
                                               c.call_tool("restart_process", {"name": "sleeper"}))
        return out
    out = asyncio.run(asyncio.wait_for(session(), 120))
    assert code(out["unlooked"]) == "FSM_BLOCKED"
    assert "process:sleeper has not been resolved or read" in envelope(out["unlooked"])["error"]["reason"]
    assert not out["wrote"].is_error and envelope(out["empty"])["data"]["events"] == []
    assert code(out["owed"]) == "UNVERIFIED_WRITE"             # neither empty read verified it
    assert sorted(code(r) or "ok" for r in out["race"]) in (["SESSION_FINISHED", "ok"], ["UNVERIFIED_WRITE", "ok"])


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_cancelled_write_is_recorded_and_settled_from_its_effect(napper_host, mode):
    host = napper_host

    async def session():
        async with client(host.home, mode=mode) as c:
            await c.call_tool("events", {"target": "napper"})
            call = asyncio.ensure_future(c.call_tool("emit_effect", NAP))
            await asyncio.to_thread(wait_for, lambda: facts(host, "acting"), 20, what="the write's effect")
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            ended = await asyncio.to_thread(wait_for, lambda: [f for f in facts(host, "end") if f.get("cancelled")],
                                            20, what="the cancelled call recorded")
            await asyncio.to_thread(wait_for, lambda: host.events("effect-acked", "napper"), 20, what="the nap acked")
            owed = await c.call_tool("finish", {"summary": "done"})
            await c.call_tool("events", {"target": "napper"})
            done = await c.call_tool("finish", {"summary": "napped and looked"})
        return ended, owed, done
    ended, owed, done = asyncio.run(asyncio.wait_for(session(), 120))
    assert ended[0]["tool"] == "emit_effect" and ended[0]["acted"] is None
    assert code(owed) == "UNVERIFIED_WRITE" and not done.is_error
    assert facts(host, "settle")[0]["why"].startswith("cancelled: its effect")


def test_sessions_are_listed_and_reset_by_agent(host):
    async def session():
        async with client(host.home, "lister") as c:
            await c.call_tool("find_process", {"name": "sleeper"})
            await c.call_tool("restart_process", {"name": "sleeper"})
    asyncio.run(asyncio.wait_for(session(), 60))
    listed = [json.loads(line) for line in host.ctl("gate", "sessions", "--json").stdout.splitlines()]
    row = next(r for r in listed if r["agent"] == "lister")
    assert row["state"] == "VERIFYING" and row["unverified"] == ["process:sleeper"] and row["calls"] == 2
    table = host.ctl("gate", "sessions").stdout
    assert "lister" in table and "process:sleeper" in table
    reset = host.ctl("gate-reset", "--agent", "lister")
    assert reset.returncode == 0 and "forgot unverified process:sleeper" in reset.stdout
    listed = [json.loads(line) for line in host.ctl("gate", "sessions", "--json").stdout.splitlines()]
    assert next(r for r in listed if r["agent"] == "lister")["state"] == "RESOLVING"


AGENT_SCRIPT = """
import asyncio, json, os, sys
from mcp import Client, StdioServerParameters

async def main(prompt):
    mode = prompt.split()[0]            # what follows is Pulse's (what earlier runs did)
    if os.environ.get("PROMPT_LOG"):
        with open(os.environ["PROMPT_LOG"], "a") as f:
            f.write(json.dumps(prompt) + "\\n")
    server = StdioServerParameters(command=sys.argv[1], args=["mcp"], env=dict(os.environ))
    async with Client(server, read_timeout_seconds=60, mode="legacy") as c:
        if mode == "refused":          # a write before any look: the gate refuses it; then "I restarted it"
            await c.call_tool("restart_process", {"name": "sleeper"})
            await c.call_tool("finish", {"summary": "I restarted the sleeper"})
            return
        await c.call_tool("find_process", {"name": "sleeper"})
        await c.call_tool("restart_process", {"name": "sleeper"})
        if mode == "verify":
            await c.call_tool("find_process", {"name": "sleeper"})
            await c.call_tool("finish", {"summary": "restarted the sleeper and looked at it again"})

asyncio.run(main(sys.argv[2]))
"""


def sessions_of(host, task: str) -> set[str]:
    return {f["session"] for f in facts(host, "open") if f["task"] == task}


def test_an_agent_run_is_acked_only_if_its_gate_session_ended_verified(pulsed, tracker, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT)
    agent = (f'[[agent]]\nname = "fixer"\nadapter = "command"\n'
             f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, {json.dumps(PULSECTL)}, "{{prompt}}"]\n'
             "timeout_s = 120\n[tasks]\nmax_failures = 1\n")
    host = next(with_sleeper(pulsed, tracker, SLEEPER + agent))
    try:
        def run(prompt: str) -> str:
            out = host.ctl("task", "add", "--project", "ops", "--title", prompt, "--prompt", prompt)
            assert out.returncode == 0, out.stderr
            task = out.stdout.strip().split()[0].rstrip(":")
            return wait_for(lambda: next((e for e in host.events(target=task)
                                          if e["type"] in ("task-acked", "task-failed")), None), 90,
                            what=f"the end of {task}")
        left = run("leave")
        assert left["type"] == "task-failed" and left["data"]["reason"] == "unverified-write"
        assert "process:sleeper" in left["data"]["error"]
        opened = [f for f in facts(host, "open") if f["agent"] == "fixer"]
        assert opened and opened[0]["task"] == left["target"]
        refused = run("refused")          # its only write refused, then finish: not acked
        assert refused["type"] == "task-failed" and refused["data"]["reason"] == "no-write", refused
        assert [f["blocked"] for f in facts(host, "blocked") if f["session"] in sessions_of(host, refused["target"])] \
            == ["FSM_BLOCKED"]
        done = run("verify")
        assert done["type"] == "task-acked", done
    finally:
        for p in sleepers():
            tracker.add(p.pid)


# -- in flight is the effect's, not the session's ------------------------------------------------------------

def test_a_frozen_session_holds_its_resource_no_longer_than_its_effect_runs(napper_host):
    """SIGSTOP a `pulsectl mcp` with a write in flight: its effect acks, and another agent's write on
    that resource passes once the effect has ended (it was refused until SIGCONT before). The call
    runs in the gate, not in the frozen proxy: the gate ends it itself when the effect does (or,
    were the gate slow to, the effect's outcome settles it)."""
    host = napper_host

    async def frozen():
        async with client(host.home, "alice") as a, client(host.home, "bob") as b:
            await a.call_tool("events", {"target": "napper"})
            call = asyncio.ensure_future(a.call_tool("emit_effect", NAP))
            acting = await asyncio.to_thread(wait_for, lambda: facts(host, "acting"), 20, what="alice's effect")
            alice = next(f["pid"] for f in facts(host, "open") if f["session"] == acting[0]["session"])
            os.kill(alice, signal.SIGSTOP)
            try:
                await asyncio.to_thread(wait_for, lambda: host.events("effect-acked", "napper"), 20,
                                        what="alice's effect acked while she is frozen")
                await b.call_tool("events", {"target": "napper"})
                passed = None
                for _ in range(100):                     # within OUTCOME_GRACE_S of the ack, not at SIGCONT
                    result = await b.call_tool("emit_effect", {"kind": "noop", "target": "napper"})
                    if code(result) != "FSM_BLOCKED":
                        passed = result
                        break
                    await b.call_tool("events", {"target": "napper"})
                    await asyncio.sleep(0.1)
                return passed, [f for f in facts(host, "settle") + facts(host, "end")
                                if f["session"] == acting[0]["session"] and f["call"] == acting[0]["call"]]
            finally:
                os.kill(alice, signal.SIGCONT)
                await asyncio.gather(call, return_exceptions=True)
    passed, settled = asyncio.run(asyncio.wait_for(frozen(), 120))
    assert passed is not None and not passed.is_error, passed
    assert len(settled) == 1 and settled[0]["acted"] is True


# The write tool waits effect_deadline_s + effect_timeout_s + 5 s (8 s here) for the run's outcome; the
# run takes 12 s. No pending-tasks sensed: no rule hands the task out besides the agents' writes.
AGENT_RUN_LONG = ('[timings]\neffect_deadline_s = 2\neffect_timeout_s = 1\n'
                  '[tick]\nsense = ["system-resource", "process-alive:*"]\n'
                  '[[agent]]\nname = "slow"\nargv = ["sleep", "12"]\ntimeout_s = 60\nmcp = false\n')


def test_an_agent_run_longer_than_the_tools_wait_stays_in_flight(pulsed):
    """The write tool gives up waiting (STILL_RUNNING); the agent-run goes on, and so does its write:
    another agent's write on that task is refused until the run has ended, then passes."""
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(AGENT_RUN_LONG)
    pulsed.start()
    task = pulsed.ctl("task", "add", "--project", "p", "--title", "nap", "--prompt", "sleep").stdout.split()[0]
    run = {"kind": "agent-run", "target": task, "params": {"agent": "slow"}}

    async def overlap():
        async with client(pulsed.home, "alice") as a, client(pulsed.home, "bob") as b:
            await a.call_tool("list_tasks", {})
            first = await a.call_tool("emit_effect", run)                 # returns after 8 s; the run takes 12
            await b.call_tool("list_tasks", {})
            during = await b.call_tool("emit_effect", {**run, "target": None, "params": {"task_id": task}})
            await asyncio.to_thread(wait_for, lambda: pulsed.events("task-acked", task), 30, what="the run's end")
            after = None
            for _ in range(100):
                await b.call_tool("list_tasks", {})
                after = await b.call_tool("emit_effect", run)           # admitted; the executor refuses it
                if code(after) != "FSM_BLOCKED":
                    break
                await asyncio.sleep(0.1)
            return first, during, after
    first, during, after = asyncio.run(asyncio.wait_for(overlap(), 120))
    assert code(first) == "STILL_RUNNING", envelope(first)
    assert code(during) == "FSM_BLOCKED" and "being changed by" in envelope(during)["error"]["reason"], envelope(during)
    assert code(after) != "FSM_BLOCKED", envelope(after)
    assert len([e for e in pulsed.events("task-executing") if e["target"] == task]) == 1    # one run, not two


# -- a run after an interrupted one ---------------------------------------------------------------------------

def test_a_run_after_its_executor_died_mid_write_waits_reads_and_does_not_restart_again(pulsed, tracker, tmp_path):
    """The executor is killed while a run's restart_process is in flight (the effect committed, the
    process already replaced, its grace not over: no outcome yet). The task waits retry_base_s like
    any failure; the next run is told what the last one did; its find_process finds the process
    changed since before that write, so the gate refuses to restart it again; it finishes, acked.
    The process was replaced once."""
    script, prompts = tmp_path / "agent.py", tmp_path / "prompts.jsonl"
    script.write_text(AGENT_SCRIPT)
    agent = (f'[[agent]]\nname = "fixer"\nadapter = "command"\n'
             f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, {json.dumps(PULSECTL)}, "{{prompt}}"]\n'
             f'timeout_s = 120\nenv = {{ PROMPT_LOG = {json.dumps(str(prompts))} }}\n'
             "[tasks]\nretry_base_s = 3\n")
    # its own process (other tests' sleepers are not its to restart); the restart's effect waits 30 s
    # after the start before its outcome
    mark = "779.375"
    pulsed.home.mkdir(parents=True)
    (pulsed.home / "config.toml").write_text(
        f'[[process]]\nname = "sleeper"\nmatch = "^sleep {mark.replace(".", "[.]")}$"\nrestart = ["sleep", "{mark}"]\n'
        "start_grace_s = 30\n" + agent)
    first = subprocess.Popen(["sleep", mark], start_new_session=True)
    tracker.add(first.pid)
    host = pulsed.start()

    def sleepers() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", mark]]
    try:
        out = host.ctl("task", "add", "--project", "ops", "--title", "restart", "--prompt", "verify")
        task = out.stdout.strip().split()[0].rstrip(":")
        wait_for(lambda: [p for p in sleepers() if p.pid != first.pid], 60, what="the restart's new process")
        assert not [e for e in host.events() if e["type"] in ("effect-acked", "effect-failed")
                    and e["data"].get("kind") == "restart-process"]
        executor = host.worker("executor").pid
        os.kill(executor, signal.SIGKILL)
        done = wait_for(lambda: next((e for e in host.events(target=task)
                                      if e["type"] in ("task-acked", "task-given-up")), None), 90,
                        what=f"the end of {task}")
        evs = host.events(target=task)
        assert done["type"] == "task-acked", [(e["type"], e["data"].get("reason")) for e in evs]
        failed = next((e for e in evs if e["type"] == "task-failed"), None)
        assert failed is not None, "\n".join(f"{e['type']} {e['data']}" for e in evs)
        assert failed["data"]["reason"] == "interrupted" and failed["data"]["retry_after_s"] == 3
        second = [e for e in evs if e["type"] == "task-executing"][1]
        assert second["ts"] - failed["ts"] >= 3, f"re-run {second['ts'] - failed['ts']:.3f} s after the failure"
        # one restart: the interrupted one; the next run's attempt at it was refused after its look
        restarts = [e for e in host.events("effect") if e["data"].get("kind") == "restart-process"]
        assert len(restarts) == 1, restarts
        retry = sessions_of(host, task) - {f["session"] for f in facts(host, "open")[:1]}
        refused = [f for f in facts(host, "blocked") if f["session"] in retry]
        assert [f["tool"] for f in refused] == ["restart_process"], refused
        reasons = [e["data"]["reason"] for e in host.events("gate-blocked") if e["data"]["session"] in retry]
        assert "acted" in reasons[0] and "changed since" in reasons[0], reasons
        looked = [f for f in facts(host, "end") if f["session"] in retry and f["tool"] == "find_process"]
        assert looked and looked[0]["found"], looked
        alive = [p.pid for p in sleepers()]
        assert len(alive) == 1 and alive[0] != first.pid, alive
        told = [json.loads(line) for line in prompts.read_text().splitlines()]
        assert len(told) == 2 and told[0] == "verify", told
        assert "restart_process on process:sleeper" in told[1] and "may have acted" in told[1], told[1]
    finally:
        for p in sleepers():
            tracker.add(p.pid)
        first.kill()
        first.wait(5)
