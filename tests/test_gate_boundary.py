"""The gate as a boundary: it decides inside Pulse (the executor's gate role), `pulsectl mcp` is a
proxy to its socket, and an agent run's sessions are who Pulse started (the run token), not who
they say they are. Through the real MCP client over stdio, against a running pulsed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time

import pytest

from support import PULSECTL, init_home, wait_for

pytest.importorskip("mcp")

# An agent the command adapter runs: it speaks MCP to `pulsectl mcp` the way an agent CLI does. Its
# write (an exec of `true`) is verified only by a later look.
# Its prompt says how it behaves:
#   impostor      starts `pulsectl mcp --agent other` with PULSE_AGENT/PULSE_TASK changed, writes,
#                 and leaves without verifying
#   wait:PATH     writes, then waits for PATH to exist (someone else's turn), and leaves unverified
#   linger:DIR    starts DIR/linger.py detached, out of the run's reach (no PULSE_RUN mark, its own
#                 session), waits for DIR/release, and leaves: that client outlives the run
AGENT_SCRIPT = """
import asyncio, json, os, subprocess, sys, time
from mcp import Client, StdioServerParameters

async def main(pulsectl, prompt):
    if prompt.startswith("linger:"):
        where = prompt[7:]
        env = {k: v for k, v in os.environ.items() if k != "PULSE_RUN"}
        with open(os.path.join(where, "linger.err"), "wb") as err:
            subprocess.Popen([sys.executable, os.path.join(where, "linger.py"), pulsectl, where], env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(where, "release")) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return
    env = dict(os.environ)
    args = ["mcp"]
    if prompt == "impostor":
        env.update(PULSE_AGENT="other", PULSE_TASK="task-999")
        args += ["--agent", "other"]
    # legacy: the initialize handshake, as the agent CLIs speak it (the proxy serves it by hand)
    async with Client(StdioServerParameters(command=pulsectl, args=args, env=env), read_timeout_seconds=60,
                      mode="legacy") as c:
        await c.call_tool("events", {"target": "boundary"})
        wrote = await c.call_tool("emit_effect", {"kind": "exec", "target": "boundary", "params": {"argv": ["true"]}})
        print(json.dumps({"wrote": wrote.structured_content}), flush=True)
        if prompt.startswith("wait:"):
            deadline = time.monotonic() + 60
            while not os.path.exists(prompt[5:]) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def agent_config(script, exec_argv: str = '[["true"]]') -> str:
    return (f'[[agent]]\nname = "alice"\nadapter = "command"\n'
            f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, {json.dumps(PULSECTL)}, "{{prompt}}"]\n'
            "timeout_s = 120\n[tasks]\nmax_failures = 1\n"
            f'[allow]\nkinds = ["noop", "exec", "agent-run", "task-add"]\nexec_argv = {exec_argv}\n')


def proxy(home, agent: str | None = None, mode: str = "legacy", **env_changes):
    from mcp import Client, StdioServerParameters
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "PULSE_AGENT",
                                                               "PULSE_TASK", "PULSE_RUN_TOKEN", "PULSE_GATE_SOCKET")}
    env.update(env_changes)
    args = ["--home", str(home), "mcp", *(["--agent", agent] if agent else [])]
    return Client(StdioServerParameters(command=PULSECTL, args=args, env=env), read_timeout_seconds=60, mode=mode)


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


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_proxy_fails_closed_without_the_gate(tmp_path, mode):
    """No gate on the socket: every call answers GATE_UNAVAILABLE (retry), nothing is decided elsewhere."""
    home = tmp_path / "home"
    init_home(home)

    async def calls():
        async with proxy(home, mode=mode, PULSE_GATE_SOCKET=str(tmp_path / "no-gate.sock")) as c:
            tools = [t.name for t in (await c.list_tools()).tools]
            return tools, await c.call_tool("status", {}), await c.call_tool("emit_effect", {"kind": "noop"})
    tools, read, write = asyncio.run(asyncio.wait_for(calls(), 60))
    assert "emit_effect" in tools and "finish" in tools
    for result in (read, write):
        assert code(result) == "GATE_UNAVAILABLE" and result.structured_content["error"]["details"]["retry"] is True
    assert not (home / "events.db").exists() or b"gate-call" not in (home / "events.db").read_bytes()


def test_an_agent_cannot_archive_the_home(pulsed, tmp_path):
    """An `archive` of the home (or of what holds it) emitted through the gate, with archive allowed:
    the effect is refused, and the home, events.db included, stays where it is."""
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text('[allow]\nkinds = ["archive"]\n')
    pulsed.start()
    kept = tmp_path / "kept"

    async def archive():
        results = []
        async with proxy(pulsed.home, "archivist") as c:
            for source in (pulsed.home, pulsed.home.parent):
                await c.call_tool("events", {"target": "home"})
                results.append(await c.call_tool("emit_effect", {
                    "kind": "archive", "target": "home",
                    "params": {"from": str(source), "to": str(kept), "older_than_h": 0}}))
        return results
    results = asyncio.run(asyncio.wait_for(archive(), 90))
    failed = [e["data"] for e in pulsed.events("effect-failed") if e["data"].get("kind") == "archive"]
    assert len(failed) == 2 and all(f["reason"] == "refused" for f in failed), (failed, [r.structured_content for r in results])
    assert "is Pulse's home" in failed[0]["error"] and "holds Pulse's home" in failed[1]["error"], failed
    assert not kept.exists() and (pulsed.home / "events.db").exists()
    origins = {e["data"]["origin"] for e in pulsed.events("effect") if e["data"]["kind"] == "archive"}
    assert origins == {"agent"}, origins


# -- a run that ended: its sessions end with it ----------------------------------------------------------------

# Started by a run (linger:DIR) and left behind: through the real MCP client and `pulsectl mcp`, with
# the run's token, it looks, then writes (an exec that naps 5 s) and keeps waiting past the run's end.
LINGER_SCRIPT = """
import asyncio, json, os, sys, time
from mcp import Client, StdioServerParameters
pulsectl, where = sys.argv[1:3]

async def main():
    out = {}
    params = StdioServerParameters(command=pulsectl, args=["mcp"], env=dict(os.environ))
    async with Client(params, read_timeout_seconds=60, mode="legacy") as c:
        out["look"] = (await c.call_tool("events", {"target": "linger"})).structured_content
        write = asyncio.ensure_future(c.call_tool("emit_effect", {"kind": "exec", "target": "linger",
                                                                  "params": {"argv": ["sleep", "5"]}}))
        with open(os.path.join(where, "ready"), "w") as f:
            f.write(str(os.getpid()))
        began = time.monotonic()
        out["write"] = (await write).structured_content
        out["write_s"] = time.monotonic() - began
        out["next"] = (await c.call_tool("events", {"target": "linger"})).structured_content
    with open(os.path.join(where, "result.tmp"), "w") as f:
        json.dump(out, f)
    os.rename(os.path.join(where, "result.tmp"), os.path.join(where, "result.json"))

asyncio.run(main())
"""


def test_a_session_that_outlives_its_run_is_ended_with_it(pulsed, tracker, tmp_path):
    """A client the run left behind (no PULSE_RUN mark, its own session) with its `pulsectl mcp` and a
    write in flight does not outlive the run: the run's cgroup is frozen and killed as the run ends,
    client and proxy alike, so none of its calls is ever answered (where the host gives a run no
    cgroup, its calls answer RUN_ENDED: test_an_ended_runs_token_is_refused_run_ended_and_the_gate_hears_of_it).
    The write's effect, committed before the run ended, settles on its own."""
    import psutil
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT)
    where = tmp_path / "linger"
    where.mkdir()
    (where / "linger.py").write_text(LINGER_SCRIPT)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(agent_config(script, exec_argv='[["sleep", "5"]]'))
    pulsed.start()
    task = add_task(pulsed, f"linger:{where}")
    pid = int(wait_for(lambda: (where / "ready").exists() and (where / "ready").read_text(), 60,
                       what="the lingering client's write"))
    lingering = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    tracker.add(*(p.pid for p in lingering))
    ours = wait_for(lambda: {s["session"] for s in opened(pulsed) if s["task"] == task}, 30, what="its session")
    wait_for(lambda: [e for e in pulsed.events("gate-call") if e["data"].get("session") in ours
                      and e["data"].get("phase") == "begin" and e["data"].get("tool") == "emit_effect"],
             30, what="its write in flight")
    (where / "release").touch()                 # the run's own process leaves: the run ends
    ended = task_end(pulsed, task)
    assert ended["type"] == "task-failed", ended
    # killed with the run, by its cgroup: nothing of it is alive (by pid), and it never heard an answer
    assert not [p for p in lingering if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], lingering
    assert not (where / "result.json").exists()
    wait_for(lambda: [e for e in pulsed.events() if e["type"] in ("effect-acked", "effect-failed")
                      and e["data"].get("kind") == "exec"], 30, what="the nap's outcome")


# -- how many connections the gate holds ---------------------------------------------------------------------

def hello(path: str):
    """A raw connection to the gate that says hello as the operator's shell: (socket, first reply)."""
    import socket
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    sock.connect(path)
    try:
        sock.sendall(json.dumps({"op": "hello", "token": None, "agent": "counter"}).encode() + b"\n")
    except (BrokenPipeError, ConnectionResetError):
        pass                    # refused before its hello was read: the refusal is there to read
    return sock, json.loads(sock.makefile("rb").readline())


def test_the_gate_refuses_connections_past_its_limits_and_open_sessions_go_on(pulsed):
    """[gate] max_sessions_per_pid = 2, max_sessions = 3: a third connection of this process and a
    fourth in all are refused GATE_BUSY (retry); the session already open keeps working, and a
    refused proxy's next call, once a slot is free, goes through."""
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text("[gate]\nmax_sessions = 3\nmax_sessions_per_pid = 2\nhello_timeout_s = 1\n")
    pulsed.start()
    path = str(pulsed.paths.gate_socket)

    async def scenario():
        out = {}
        async with proxy(pulsed.home, "first") as first:        # one connection, its proxy's
            out["first"] = await first.call_tool("status", {})
            held = [hello(path) for _ in range(3)]              # this process: two, then one too many
            async with proxy(pulsed.home, "late") as late:      # the fourth in all
                out["busy"] = await late.call_tool("status", {})
                out["first_again"] = await first.call_tool("status", {})
                held[0][0].close()
                deadline = asyncio.get_running_loop().time() + 30
                while True:
                    out["retried"] = await late.call_tool("status", {})
                    if not out["retried"].is_error or asyncio.get_running_loop().time() > deadline:
                        break
                    await asyncio.sleep(0.05)
        for sock, _ in held:
            sock.close()
        return out, [reply for _, reply in held]
    out, replies = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert not out["first"].is_error, out["first"].structured_content
    assert [r["op"] for r in replies] == ["welcome", "welcome", "refused"], replies
    assert replies[2]["code"] == "GATE_BUSY" and replies[2]["retry"] is True, replies[2]
    assert "max_sessions_per_pid" in replies[2]["message"], replies[2]
    assert code(out["busy"]) == "GATE_BUSY", out["busy"].structured_content
    assert out["busy"].structured_content["error"]["details"]["retry"] is True
    assert "[gate] max_sessions)" in out["busy"].structured_content["error"]["message"]
    assert not out["first_again"].is_error, out["first_again"].structured_content
    assert not out["retried"].is_error, out["retried"].structured_content
    # a connection that never says hello is closed after [gate] hello_timeout_s: it holds no slot for long
    import socket
    silent = socket.socket(socket.AF_UNIX)
    silent.settimeout(20)
    silent.connect(path)
    began = time.monotonic()
    try:
        assert silent.recv(1) == b"" and time.monotonic() - began < 10
    finally:
        silent.close()


def test_connection_limits_count_in_all_per_account_and_per_process():
    from types import SimpleNamespace

    from pulse.gate.server import Connections, over_limit
    limits = SimpleNamespace(max_sessions=5, max_sessions_per_uid=3, max_sessions_per_pid=2)
    open_ = Connections()
    for pid, uid in ((10, 1000), (10, 1000), (11, 1000)):
        assert over_limit(open_, pid, uid, limits) is None
        open_.add(pid, uid)
    assert "max_sessions_per_pid" in over_limit(open_, 10, 1000, limits)
    assert "max_sessions_per_uid" in over_limit(open_, 12, 1000, limits)
    assert over_limit(open_, 20, 2000, limits) is None
    open_.add(20, 2000)
    open_.add(21, 2000)
    assert "[gate] max_sessions)" in over_limit(open_, 30, 3000, limits)
    open_.remove(10, 1000)
    assert over_limit(open_, 30, 3000, limits) is None and open_.per_pid == {10: 1, 11: 1, 20: 1, 21: 1}
    for pid, uid in ((10, 1000), (11, 1000), (20, 2000), (21, 2000)):
        open_.remove(pid, uid)
    assert (open_.total, open_.per_uid, open_.per_pid) == (0, {}, {})


def test_an_ended_runs_token_is_refused_run_ended_and_the_gate_hears_of_it():
    from pulse.gate import server as gateserver
    from pulse.gate.protocol import Hello
    from pulse.gate.runs import ENDED_KEPT, RunTokens
    tokens = RunTokens()
    heard = []
    tokens.listeners.append(heard.append)
    token = tokens.register("run-1", "alice", "task-1")
    assert gateserver.identify(Hello(token=token), 1000, 0, tokens)[:2] == ("alice", "task-1")
    tokens.revoke(token)
    tokens.revoke(token)                        # a second revoke (the run's finally) is heard once
    assert heard == ["run-1"] and not tokens.is_live("run-1")
    with pytest.raises(gateserver.Refused) as refused:
        gateserver.identify(Hello(token=token), 1000, 0, tokens)
    assert refused.value.code == "RUN_ENDED"
    with pytest.raises(gateserver.Refused) as refused:
        gateserver.identify(Hello(token="never-issued"), 1000, 0, tokens)
    assert refused.value.code == "RUN_UNKNOWN"
    for n in range(ENDED_KEPT):       # bounded: the oldest ended runs are forgotten
        tokens.revoke(tokens.register(f"later-{n}", "alice", "t"))
    assert len(tokens.ended) == ENDED_KEPT and tokens.is_live("run-1")


# -- a run under its own account ([[agent]] user) ------------------------------------------------------------

# Run as the run's own account by the system's python3.11, in a venv made for it (tests/accountvenv.py:
# the test venv's interpreter may be out of that account's reach): through the real MCP client it
# starts the real `pulsectl mcp`, looks and writes, and leaves its write unverified; then it tries
# every side door with the real pulsectl and by hand. What became of each goes to RESULTS.
JAILED_SCRIPT = r"""
import asyncio, json, os, socket, sqlite3, subprocess, sys
from mcp import Client, StdioServerParameters
home, runtime, pulsectl, results = sys.argv[1:5]
out = {"uid": os.getuid()}

def proxy(env):
    return Client(StdioServerParameters(command=pulsectl, args=["mcp", "--agent", "operator-shell"], env=env),
                  read_timeout_seconds=60, mode="legacy")

async def sessions():
    async with proxy(dict(os.environ)) as c:
        out["look"] = (await c.call_tool("events", {"target": "boundary"})).structured_content
        out["write"] = (await c.call_tool("emit_effect", {"kind": "exec", "target": "boundary",
                                                          "params": {"argv": ["true"]}})).structured_content
    without_token = {k: v for k, v in os.environ.items() if k != "PULSE_RUN_TOKEN"}
    async with proxy(without_token) as c:
        out["tokenless"] = (await c.call_tool("status", {})).structured_content

asyncio.run(sessions())

def run(*argv):      # told where pulsed's sockets are, as an agent that knows the host would be
    env = {**os.environ, "PULSE_RUNTIME_DIR": runtime}
    done = subprocess.run([pulsectl, "--home", home, *argv], capture_output=True, text=True, timeout=60, env=env)
    return {"code": done.returncode, "stderr": done.stderr[-600:]}

out["emit"] = run("emit", "exec", "--target", "boundary", "--param", 'argv=["true"]')
out["gate_reset"] = run("gate-reset", "--agent", "jailed")
out["task_add"] = run("task", "add", "--project", "ops", "--title", "forged", "--prompt", "x")
out["web_url"] = run("web", "url")
out["config"] = run("config", "--effective")
out["stop"] = run("stop", "executor")
out["status"] = run("status")

def attempt(name, fn):
    try:
        out[name] = {"ok": True, "value": repr(fn())[:200]}
    except Exception as err:
        out[name] = {"ok": False, "error": type(err).__name__ + ": " + str(err)[:300]}

def forge():
    conn = sqlite3.connect(os.path.join(home, "events.db"))
    conn.execute("INSERT INTO events (seq, ts, mono, type, source, target, data) VALUES (0, 0, 0, 'gate-call', 'x', 'x', '{}')")
    conn.commit()

def control():
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.path.join(runtime, "control.ipc"))
attempt("events_db", forge)
attempt("web_token", lambda: open(os.path.join(home, "web.token")).read())
attempt("config_toml", lambda: open(os.path.join(home, "config.toml")).read())
attempt("control_socket", control)
with open(results, "w") as r:
    json.dump(out, r)
"""


@pytest.fixture
def account():
    """A real second account, made for this test and removed after it. Needs root, useradd and the
    system's python3.11 (CI has them: there a missing one fails the test)."""
    import shutil
    import subprocess
    import uuid

    from accountvenv import SYSTEM_PYTHON
    if os.geteuid() != 0 or shutil.which("useradd") is None or not os.path.exists(SYSTEM_PYTHON):
        why = f"needs root, useradd and the system's python ({SYSTEM_PYTHON})"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    name = f"pt20{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


@pytest.fixture
def shared_dir():
    """A directory every account can traverse (tmp_path is under a 0700 one), removed after the test."""
    import shutil
    import tempfile
    shared = tempfile.mkdtemp(prefix="pulse-t20-", dir="/tmp")
    os.chmod(shared, 0o711)                                    # traversable, not listable
    try:
        yield shared
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def denied(attempt: dict) -> bool:
    """A pulsectl run that failed because the home is out of its account's reach (78: config.toml
    unreadable, 77: another file of the home)."""
    return attempt["code"] in (77, 78) and "permission denied" in attempt["stderr"].lower()


def test_a_run_under_its_own_account_reaches_the_gate_and_nothing_else(pulsed, account, shared_dir):
    import pwd
    from pathlib import Path

    import accountvenv
    pulsectl = str(accountvenv.build(Path(shared_dir) / "venv"))
    scripts = os.path.join(shared_dir, "scripts")
    os.mkdir(scripts, 0o755)
    script = os.path.join(scripts, "jailed.py")
    with open(script, "w") as f:
        f.write(JAILED_SCRIPT)
    os.chmod(script, 0o644)
    work = os.path.join(shared_dir, "work")
    os.mkdir(work)
    uid = pwd.getpwnam(account).pw_uid
    os.chown(work, uid, -1)
    results = os.path.join(work, "results.json")
    python = os.path.join(shared_dir, "venv", "bin", "python")
    init_home(pulsed.home)
    from pulse.core.home import Paths, write_web_token
    write_web_token(Paths.for_client(pulsed.home))
    (pulsed.home / "config.toml").write_text(
        f'[[agent]]\nname = "jailed"\nadapter = "command"\nmcp = false\nuser = "{account}"\ncwd = "{work}"\n'
        f'argv = ["{python}", "{script}", "{pulsed.home}", "{pulsed.paths.runtime}", "{pulsectl}", "{results}"]\n'
        "timeout_s = 90\n[tasks]\nmax_failures = 1\n"
        f'[gate]\nsocket_dir = "{shared_dir}"\n'
        '[allow]\nkinds = ["noop", "exec", "agent-run", "task-add"]\nexec_argv = [["true"]]\n')
    pulsed.start()
    before = len(pulsed.events("effect"))
    task = add_task(pulsed, "try the side doors")
    ended = task_end(pulsed, task)
    assert os.path.exists(results), (ended, pulsed.log_text()[-3000:])
    with open(results) as f:
        seen = json.load(f)
    assert seen["uid"] == uid
    # its sessions through the real `pulsectl mcp` were its run's: a look and a write, both through the gate
    sessions = [s for s in opened(pulsed) if s["task"] == task]
    assert sessions and all(s["agent"] == "jailed" for s in sessions), opened(pulsed)
    assert seen["look"]["ok"] and seen["write"]["ok"], seen
    assert seen["tokenless"]["error"]["code"] == "NOT_OPERATOR", seen["tokenless"]
    # every side door is shut by the boundary (the home's mode, the gate's peer check), not by a missing tool
    for door in ("emit", "task_add", "config"):          # config.toml is read first, and refused
        assert denied(seen[door]), (door, seen[door])
    for door in ("web_url", "stop", "status"):            # they ask pulsed first, over its control socket
        assert seen[door]["code"] == 4 and "control socket" in seen[door]["stderr"] \
            and "permission denied" in seen[door]["stderr"], (door, seen[door])
    assert seen["gate_reset"]["code"] == 1 and "the gate refused the reset" in seen["gate_reset"]["stderr"] \
        and f"uid {uid} is not the operator's" in seen["gate_reset"]["stderr"], seen["gate_reset"]
    assert "unable to open database file" in seen["events_db"]["error"], seen["events_db"]
    for door in ("web_token", "config_toml", "control_socket"):
        assert seen[door]["error"].startswith("PermissionError"), (door, seen[door])
    # the write it made through the gate stays unverified: nothing it tried outside the gate changed that
    assert ended["type"] == "task-failed" and ended["data"]["reason"] == "unverified-write", ended
    assert sorted(e["data"]["kind"] for e in pulsed.events("effect")[before:]) == ["agent-run", "exec"]
    assert not [e for e in pulsed.events("effect") if e["data"].get("origin") == "operator"]


@pytest.mark.parametrize("line, named", [("max_sessions = 0", "$.gate.max_sessions"),
                                         ("max_sessions_per_pid = -1", "$.gate.max_sessions_per_pid"),
                                         ("hello_timeout_s = 0", "$.gate.hello_timeout_s")])
def test_a_bad_connection_limit_is_named(tmp_path, line, named):
    from pulse.core import config as configmod
    path = tmp_path / "config.toml"
    path.write_text(f"[gate]\n{line}\n")
    with pytest.raises(configmod.ConfigError, match=re.escape(named)):
        configmod.load(path)
    defaults = configmod.load(tmp_path / "absent.toml").gate
    assert (defaults.max_sessions, defaults.max_sessions_per_uid, defaults.max_sessions_per_pid,
            defaults.hello_timeout_s) == (256, 64, 4, 10.0)
