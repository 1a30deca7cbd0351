"""Agent adapters and the agent-run executor: real pulsed processes, the template's
assignment rule, and a fake agent that behaves like `claude -p ... --output-format json`.

The fake agent (written into tmp_path) logs start and end with its pid to a JSON Lines file, and
at start notes any earlier run still alive (an overlap); it can sleep (once, by a marker file),
leave a background child in its process group, dump its argv, and exit with a chosen code.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import psutil
import pytest

import support
from pulse.agents import adapters, agentrun
from pulse.core import config
from pulse.core.config import Agent, Config, ConfigError, agentwork
from pulse.core.wire.enginerpc import Effect
from pulse.effects import kinds
from pulse.store import objects
from support import wait_for

PY = sys.executable

FAKE_AGENT = r'''
import json, os, subprocess, sys, time

log = os.environ["FAKE_LOG"]

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False

def entries():
    try:
        with open(log) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []

def write(entry):
    with open(log, "a") as f:
        f.write(json.dumps(entry) + "\n")

seen = entries()
ended = {e["pid"] for e in seen if e["event"] == "end"}
overlap = [e["pid"] for e in seen if e["event"] == "start" and e["pid"] not in ended and alive(e["pid"])]
child = None
if os.environ.get("FAKE_CHILD"):
    child = subprocess.Popen(["sleep", "300"]).pid          # in our process group
write({"event": "start", "pid": os.getpid(), "pgid": os.getpgid(0), "child": child, "t": time.time(),
       "overlap": overlap, "cwd": os.getcwd(), "task": os.environ.get("PULSE_TASK_ID")})
if os.environ.get("FAKE_ARGV"):
    with open(os.environ["FAKE_ARGV"], "w") as f:
        json.dump(sys.argv, f)
marker = os.environ.get("FAKE_SLEEP_ONCE")
if marker and not os.path.exists(marker):
    open(marker, "w").close()
    time.sleep(float(os.environ.get("FAKE_SLEEP_S", "60")))
code = int(os.environ.get("FAKE_EXIT", "0"))
print("warning: a line on stderr before the result", file=sys.stderr, flush=True)
prompt = sys.argv[sys.argv.index("-p") + 1]
print(json.dumps({"type": "result", "subtype": "success" if code == 0 else "error_during_execution",
                  "is_error": code != 0, "result": "done: " + prompt, "session_id": "sess-%d" % os.getpid(),
                  "num_turns": 1, "duration_ms": 5, "total_cost_usd": 0.0}))
write({"event": "end", "pid": os.getpid(), "t": time.time()})
sys.exit(code)
'''

DANGEROUS = 'fix it; rm -rf {marker} && echo $(id) `whoami` "quoted" \'single\' | cat > /dev/null'


@pytest.fixture
def fake(tmp_path) -> Path:
    script = tmp_path / "fake_agent.py"
    script.write_text(FAKE_AGENT)
    return script


def agent_toml(script: Path, tmp_path: Path, name: str = "fake", **env) -> str:
    env = {"FAKE_LOG": str(tmp_path / "agent.log"), **env}
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    return (f'[[agent]]\nname = "{name}"\nadapter = "claude-code"\n'
            f'argv = [{json.dumps(PY)}, {json.dumps(str(script))}, "-p", "{{prompt}}", "--output-format", "json"]\n'
            f"env = {{{env_toml}}}\ntimeout_s = 60\n")


def start(pulsed, text: str, **env):
    pulsed.home.mkdir(exist_ok=True)
    (pulsed.home / "config.toml").write_text(text)
    pulsed.start(env={"PULSE_TICK_MS": "200", **env})   # the assignment rule gets many chances to err


def add_task(pulsed, prompt: str = "do the thing") -> str:
    out = pulsed.ctl("task", "add", "--project", "p", "--title", "t", "--prompt", prompt)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split()[0].rstrip(":")


def task_types(pulsed, task: str) -> list[str]:
    return [e["type"] for e in pulsed.events(target=task) if e["type"].startswith("task-")]


def agent_log(tmp_path: Path) -> list[dict]:
    path = tmp_path / "agent.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def group_alive(pgid: int) -> list[int]:
    out = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                out.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


# -- end to end ----------------------------------------------------------------------------------------

def test_a_task_goes_created_assigned_executing_acked_with_output_in_objects(pulsed, fake, tmp_path):
    marker = tmp_path / "must-survive"
    marker.write_text("x")
    argv_dump = tmp_path / "argv.json"
    start(pulsed, agent_toml(fake, tmp_path, FAKE_ARGV=str(argv_dump)))
    prompt = DANGEROUS.format(marker=marker)
    task = add_task(pulsed, prompt)
    assert task == "task-1"
    acked = wait_for(lambda: next(iter(pulsed.events("task-acked", task)), None), 20, what="task-acked")
    assert task_types(pulsed, task) == ["task-created", "task-assigned", "task-executing", "task-acked"]
    assigned = pulsed.events("task-assigned", task)[0]["data"]
    assert assigned["agent"] == "fake" and assigned["run"]
    assert acked["data"]["run"] == assigned["run"] and acked["data"]["agent"] == "fake"
    assert acked["data"]["result"]["result"] == "done: " + prompt
    assert acked["data"]["result"]["session_id"].startswith("sess-")
    output = objects.get(pulsed.home / "objects", acked["data"]["output"]).decode()
    assert '"is_error": false' in output and "a line on stderr" not in output      # stdout alone ...
    done_effect = wait_for(lambda: next((e for e in pulsed.events("effect-acked")     # after task-acked
                                         if e["data"]["effect_id"] == assigned["run"]), None), 20, what="effect-acked")
    assert "a line on stderr" in objects.get(pulsed.home / "objects", done_effect["data"]["stderr"]).decode()
    # The prompt reached the agent verbatim, as one argument; no shell ran any of it. Then Pulse's
    # gated tools: an MCP config, gone once the run ended.
    argv = json.loads(argv_dump.read_text())[1:]
    assert argv[:4] == ["-p", prompt, "--output-format", "json"] and argv[4] == "--mcp-config"
    assert argv[6:] == ["--allowedTools", "mcp__pulse"] and not os.path.exists(argv[5])
    assert marker.exists()
    # The effect: from the engine's rule, acked, with the task and the output.
    effect_ev = next(e for e in pulsed.events("effect") if e["data"]["kind"] == "agent-run")
    assert effect_ev["data"]["origin"] == "engine" and effect_ev["data"]["idempotent"] is False
    done = next(e for e in pulsed.events("effect-acked") if e["data"]["effect_id"] == assigned["run"])
    assert done["data"]["task_id"] == task and done["data"]["output"] == acked["data"]["output"]
    (run,) = agent_log(tmp_path)[::2]
    assert run["cwd"] == str(pulsed.home / "work" / task) and run["task"] == task
    pulsed.wait_ticks(5)                                       # no second run of an acked task
    assert len(pulsed.events("task-executing", task)) == 1


def test_a_failing_agent_puts_the_task_back_then_it_is_given_up(pulsed, fake, tmp_path):
    start(pulsed, agent_toml(fake, tmp_path, FAKE_EXIT="3") + "\n[tasks]\nmax_failures = 3\nretry_base_s = 0.5\n")
    task = add_task(pulsed)
    wait_for(lambda: pulsed.events("task-given-up", task), 30, what="task-given-up")
    failed = pulsed.events("task-failed", task)
    assert len(failed) == 3
    # Each retry waited out its backoff (0.5 s, then 1 s) before the next run began.
    executing = pulsed.events("task-executing", task)
    assert [f["data"]["retry_after_s"] for f in failed[:2]] == [0.5, 1.0]
    assert all(executing[i + 1]["ts"] >= failed[i]["ts"] + failed[i]["data"]["retry_after_s"] for i in range(2))
    assert all(f["data"]["reason"] == "agent" and "error_during_execution" in f["data"]["error"] for f in failed)
    assert len({f["data"]["run"] for f in failed}) == 3       # three runs, one effect each
    types = task_types(pulsed, task)
    assert types == ["task-created"] + ["task-assigned", "task-executing", "task-failed"] * 3 + ["task-given-up"]
    failed_effects = wait_for(lambda: len(f := [e for e in pulsed.events("effect-failed")   # the task ends first
                                                if e["data"].get("kind") == "agent-run"]) >= 3 and f, 10,
                              what="the third run's effect ended")
    assert len(failed_effects) == 3 and all(e["data"]["reason"] == "agent" for e in failed_effects)
    pulsed.wait_ticks(5)
    assert len(pulsed.events("task-executing", task)) == 3    # given up: not handed out again
    shown = json.loads(pulsed.ctl("task", "show", task, "--json").stdout)
    assert shown.get("status", shown.get("task", {}).get("status")) == "given_up"
    # the operator retries it: pending again, its failures forgiven, and an agent takes it again
    out = pulsed.ctl("task", "retry", task)
    assert out.returncode == 0 and out.stdout.strip() == f"{task}: pending", out.stderr
    wait_for(lambda: len(pulsed.events("task-executing", task)) == 4, 15, what="a fourth run after the retry")
    assert pulsed.ctl("task", "retry", task).returncode == 1       # not given up (any more): refused


def test_an_agent_whose_program_is_not_installed_is_given_up_at_once_saying_so(pulsed, tmp_path):
    start(pulsed, '[[agent]]\nname = "bot"\nadapter = "command"\nmcp = false\nargv = ["no-such-agent-cli-i36"]\n'
                  '\n[tasks]\nmax_failures = 3\nretry_base_s = 0.5\n')
    task = add_task(pulsed)
    wait_for(lambda: pulsed.events("task-given-up", task), 30, what="task-given-up")
    [failed] = pulsed.events("task-failed", task)          # no retry can install it
    assert failed["data"]["reason"] == "not-installed"
    assert "cannot start 'no-such-agent-cli-i36': no such program on the PATH Pulse runs with" in failed["data"]["error"]


def test_kill_9_mid_run_loses_no_task_and_never_runs_it_twice_at_once(pulsed, fake, tmp_path, tracker):
    start(pulsed, agent_toml(fake, tmp_path, FAKE_SLEEP_ONCE=str(tmp_path / "slept"), FAKE_SLEEP_S="60",
                             FAKE_CHILD="1"))
    task = add_task(pulsed)
    first = wait_for(lambda: next(iter(agent_log(tmp_path)), None), 20, what="the agent's first start")
    tracker.add(first["pid"], first["child"])
    assert first["pgid"] == first["pid"]                       # its own process group
    run = pulsed.events("task-executing", task)[0]["data"]["run"]
    executor = pulsed.worker("executor").pid
    claim = wait_for(lambda: pulsed.events("effect-executing") and pulsed.events("effect-executing")[0], 5)
    assert claim["data"]["effect_id"] == run
    assert list(support.CHILD_TMPDIR.glob(f"pulse-run-{run}-*"))    # the run's scratch directory
    os.kill(executor, signal.SIGKILL)

    interrupted = wait_for(lambda: next((e for e in pulsed.events("task-failed", task)
                                         if e["data"].get("reason") == "interrupted"), None), 20,
                           what="task-failed interrupted")
    assert interrupted["data"]["run"] == run
    settled = wait_for(lambda: next((e for e in pulsed.events("effect-failed")
                                     if e["data"]["effect_id"] == run), None), 10, what="the orphan settled")
    assert settled["data"]["reason"] == "interrupted-after-start"
    assert interrupted["id"] < settled["id"]                   # the task first, then the effect
    assert not group_alive(first["pgid"])                      # the leader and its background child: gone
    assert not psutil.pid_exists(first["child"]) or psutil.Process(first["child"]).status() == psutil.STATUS_ZOMBIE
    # its scratch directory (MCP config, usage file), which its own cleanup never reached: removed
    assert not list(support.CHILD_TMPDIR.glob(f"pulse-run-{run}-*"))

    acked = wait_for(lambda: next(iter(pulsed.events("task-acked", task)), None), 20, what="the retry acked")
    assert acked["data"]["run"] != run
    assert task_types(pulsed, task) == ["task-created", "task-assigned", "task-executing", "task-failed",
                                        "task-assigned", "task-executing", "task-acked"]
    log = agent_log(tmp_path)
    starts = [e for e in log if e["event"] == "start"]
    assert len(starts) == 2 and all(not e["overlap"] for e in starts)     # never two at once
    assert [e["pid"] for e in log if e["event"] == "end"] == [starts[1]["pid"]]
    tracker.add(starts[1]["pid"])


# -- adapters and configuration ------------------------------------------------------------------------

def test_adapters_are_found_by_name_through_entry_points(monkeypatch):
    declared = {ep.name: ep.value for ep in entry_points(group="pulse.adapters")}
    assert declared["command"] == "pulse.agents.adapters.command:CommandAdapter"
    assert declared["claude-code"] == "pulse.agents.adapters.claude_code:ClaudeCodeAdapter"
    for name, cls in adapters.BUILTIN.items():                 # every built-in, registered like a third party's
        module, _, attr = declared[name].partition(":")
        assert getattr(__import__(module, fromlist=[attr]), attr) is cls
    assert isinstance(adapters.load_adapter("command"), adapters.CommandAdapter)
    assert isinstance(adapters.load_adapter("claude-code"), adapters.ClaudeCodeAdapter)
    # config knows each built-in's argv without importing it: the adapters take theirs from there
    assert {name: cls.default_argv for name, cls in adapters.BUILTIN.items()} == config.ADAPTER_ARGV

    # A third-party adapter: registered under the group, loaded by name.
    third = EntryPoint(name="mine", value="pulse.agents.adapters:CommandAdapter", group="pulse.adapters")
    monkeypatch.setattr(agentwork, "adapter_entry_points", lambda: [*entry_points(group="pulse.adapters"), third])
    assert "mine" in adapters.adapter_names()
    assert isinstance(adapters.load_adapter("mine"), adapters.CommandAdapter)
    config.validate(Config(agent=[Agent(name="x", adapter="mine", argv=["true"])]), "test")
    with pytest.raises(LookupError):
        adapters.load_adapter("nope")


@pytest.mark.parametrize("table, where", [
    ('name = "a"\nadapter = "nope"\nargv = ["x"]', "$.agent[0].adapter: no adapter 'nope'"),
    ('name = "a"\nargv = ["x", "-p", "{prompt}", "{secret}"]', "$.agent[0].argv[3]: unknown placeholder {secret}"),
    ('name = "a"\nargv = ["x", "{prompt.__class__}"]', "$.agent[0].argv[1]: unknown placeholder"),
    ('name = "a"\nargv = ["x", "{prompt"]', "$.agent[0].argv[1]: malformed template"),
    ('name = "a"\nargv = ["x"]\ncwd = "/w/{prompt}"', "$.agent[0].cwd: unknown placeholder {prompt}"),
    ('name = "a"\nargv = ["x"]\nenv = {K = "{nope}"}', "$.agent[0].env.K: unknown placeholder {nope}"),
    ('name = "a"', "$.agent[0].argv: adapter 'command' needs an argv"),
    ('name = "a"\nargv = ["x"]\nconcurrency = 0', "$.agent[0].concurrency must be at least 1"),
    ('name = "a"\nargv = ["x"]\nshell = "sh -c"', "unknown key $.agent[0].shell"),
])
def test_agent_config_errors_name_the_key(tmp_path, table, where):
    path = tmp_path / "config.toml"
    path.write_text("[[agent]]\n" + table + "\n")
    with pytest.raises(ConfigError) as err:
        config.load(path, {})
    assert where in str(err.value)


def test_agent_config_defaults_and_round_trip(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[[agent]]\nname = "claude"\nadapter = "claude-code"\n\n[tasks]\nmax_failures = 5\n')
    loaded = config.load(path, {})
    assert loaded.tasks.max_failures == 5 and loaded.agent[0].concurrency == 1 and loaded.agent[0].argv is None
    assert "agent-run" in loaded.allow.kinds and "pending-tasks" in loaded.tick.sense
    again = tmp_path / "again.toml"
    again.write_text(config.to_toml(loaded))
    assert config.load(again, {}) == loaded
    assert "# [[agent]]" in config.default_toml()
    assert config.decode(config.default_toml(), "default") == Config()
    executor = config.slice_of(loaded, "executor")
    assert executor.agent == loaded.agent and executor.tasks.max_failures == 5


def test_placeholders_are_substituted_per_element_and_never_reach_a_shell(tmp_path, fake):
    marker = tmp_path / "must-survive"
    marker.write_text("x")
    prompt = DANGEROUS.format(marker=marker) + " {task_id} {{"
    agent = Agent(name="a", adapter="claude-code",
                  argv=[PY, str(fake), "--id={task_id}", "-p", "{prompt}", "{{literal}}"],
                  env={"FAKE_LOG": str(tmp_path / "agent.log"), "FAKE_ARGV": str(tmp_path / "argv.json"),
                       "WHERE": "{workdir}"})
    inv = adapters.load_adapter("claude-code").invocation(agent, adapters.Task("task-9", prompt), str(tmp_path),
                                                          home=tmp_path)
    assert inv.argv == [PY, str(fake), "--id=task-9", "-p", prompt, "{literal}"]   # the prompt's braces stay as is
    assert inv.env["WHERE"] == str(tmp_path) and inv.env["PULSE_TASK_ID"] == "task-9"
    assert (inv.env["PULSE_TASK"], inv.env["PULSE_AGENT"], inv.env["PULSE_HOME"]) == ("task-9", "a", str(tmp_path))
    ctx = kinds.EffectContext(Config(), tmp_path / "objects", 10)
    code, output, timed_out = kinds.run_process(inv.argv, ctx, env=inv.env, cwd=inv.cwd)
    assert code == 0 and not timed_out
    assert json.loads((tmp_path / "argv.json").read_text())[1:] == ["--id=task-9", "-p", prompt, "{literal}"]
    assert marker.exists()
    result = adapters.ClaudeCodeAdapter().parse(adapters.RunOutput(code, output, b"", timed_out, inv))
    assert result.ok and result.summary(code)["result"] == "done: " + prompt


def test_adapters_parse_results():
    inv = adapters.Invocation([], {}, "/")
    run = lambda code, out, timed_out=False, err=b"": adapters.RunOutput(code, out, err, timed_out, inv)
    claude = adapters.ClaudeCodeAdapter()
    ok = json.dumps({"type": "result", "is_error": False, "result": "fine", "session_id": "s"}).encode()
    assert claude.parse(run(0, ok)).ok
    assert not claude.parse(run(1, ok)).ok                                   # exit code wins
    bad = json.dumps({"is_error": True, "subtype": "error_max_turns", "result": "", "num_turns": 4}).encode()
    capped = claude.parse(run(0, bad))
    assert capped.reason == "turn-cap" and "error_max_turns" in capped.error and capped.turns == 4
    assert claude.parse(run(0, b"not json")).error == "no JSON result in the output"
    assert "timed out" in claude.parse(run(None, b"", True)).error
    command = adapters.CommandAdapter()
    assert command.parse(run(0, b"hello")).summary(0) == {"code": 0, "tail": "hello"}
    assert command.parse(run(2, b"", err=b"boom\n")).error == "boom; exit code 2"


def test_agent_slots_hold_each_agent_to_its_concurrency():
    cfg = Config(agent=[Agent(name="a", argv=["x"], concurrency=2), Agent(name="b", argv=["x"])])
    slots = agentrun.AgentSlots()
    run = lambda i, agent=None: Effect(kind="agent-run", id=f"e{i}",
                                       params={"task_id": f"task-{i}", **({"agent": agent} if agent else {})})
    assert slots.admit(run(1, "a"), cfg) and slots.admit(run(2, "a"), cfg)
    assert not slots.admit(run(3, "a"), cfg)                  # a runs 2 already: stays pending
    assert slots.admit(run(4), cfg) and slots.reserved("e4") == "b"   # no agent named: the first with a slot
    assert not slots.admit(run(5), cfg)
    slots.release("e1")
    assert slots.admit(run(3, "a"), cfg)
    assert slots.admit(run(6, "ghost"), cfg)                  # not configured: run, and fail bad-params
    assert slots.admit(Effect(kind="noop", id="n"), cfg)


ESCAPER = """
import os, subprocess, sys, time
# a grandchild that leaves the run's process group (setsid) and would act 30 s after the run ended
subprocess.Popen([sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
                  "time.sleep(30); open(sys.argv[2], 'w').write('acted')", sys.argv[1], sys.argv[2]],
                 start_new_session=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
print("done")
"""


def test_a_setsid_grandchild_is_gone_before_the_task_is_acked(pulsed, tmp_path, tracker):
    """A run ends when all of it ends: a descendant that left the run's process group is found by
    the run's mark and stopped before the verdict, so nothing of the run acts after task-acked."""
    script, pid_file, acted = tmp_path / "escaper.py", tmp_path / "grandchild.pid", tmp_path / "acted"
    script.write_text(ESCAPER)
    start(pulsed, f'[[agent]]\nname = "esc"\nargv = [{json.dumps(PY)}, {json.dumps(str(script))}, '
                  f'{json.dumps(str(pid_file))}, {json.dumps(str(acted))}]\ntimeout_s = 60\n')
    task = add_task(pulsed)
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), 20, what="the grandchild")
    grandchild = int(pid_file.read_text())
    tracker.add(grandchild)
    acked = wait_for(lambda: next(iter(pulsed.events("task-acked", task)), None), 20, what="task-acked")
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    done = wait_for(lambda: next((e for e in pulsed.events("effect-acked")
                                  if e["data"]["effect_id"] == acked["data"]["run"]), None), 20, what="effect-acked")
    assert done["data"]["escaped"] == 1 and not acted.exists()
