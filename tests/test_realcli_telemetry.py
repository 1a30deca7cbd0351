"""A real Claude Code run reports to Pulse's telemetry receiver while it runs: its API requests, tokens
and tool calls become facts of its run before the run ends. Against a scripted model endpoint on
127.0.0.1 (tests/realtools.py); the CLI from scripts/install_realcli.sh, as the other realcli tests."""

from __future__ import annotations

import os

import psutil
import pytest

from realagents import add_task, claude_env, clean_env, codex_env, settled, start  # noqa: F401 (autouse)
from realtools import ScriptedAnthropic, require_tools
from support import wait_for

pytestmark = pytest.mark.realcli

# Three tool calls that take a while each: the run lasts long enough for Claude Code's exporters
# (events every 2 s, as the adapter sets) to report while it runs.
SLOW_STEPS = [("Bash", {"command": "sleep 2", "description": "wait"})] * 3
TELEMETRY = '[telemetry]\nenabled = true\nlisten = "127.0.0.1:0"\nflush_s = 0.5\n\n'


def test_claude_code_reports_tokens_requests_and_tool_calls_while_it_runs(pulsed, tmp_path):
    require_tools("claude")
    with ScriptedAnthropic(SLOW_STEPS, "PONG") as model:
        start(pulsed, "claude-code", claude_env(tmp_path, model.url, key="sk-scripted"), timeout_s=120, mcp=False,
              before=TELEMETRY, argv=["claude", "-p", "--output-format", "json", "--allowedTools", "Bash", "--",
                                      "{prompt}"])
        task = add_task(pulsed)
        run = wait_for(lambda: next(iter(pulsed.events("task-executing", task)), None), 60, 0.2,
                       what="the run to start")["data"]["run"]
        first = wait_for(lambda: next(iter(pulsed.events("telemetry", run)), None), 90, 0.2,
                         what="a telemetry fact of the run")
        evs = settled(pulsed, task, 120)
    ended = next(e for e in evs if e["type"] in ("task-acked", "task-failed", "task-given-up"))
    assert first["id"] < ended["id"], "the run's first telemetry fact came only after its end"
    # Claude Code's last export comes as it exits, and the receiver records it a flush later: the
    # run may be acked first. Every request and tool call is counted once that export is in.
    facts = lambda: [e["data"] for e in pulsed.events("telemetry", run)]
    counted = lambda: (sum(f["api_requests"] for f in facts()), sum(f["tool_calls"] for f in facts()))
    wait_for(lambda: min(counted()) >= len(SLOW_STEPS), 30, 0.2,
             what=f"the run's facts to count {len(SLOW_STEPS)} requests and tool calls")
    print(f"{len(facts())} facts of run {run}: {facts()}")
    assert {(f["task"], f["agent"]) for f in facts()} == {(task, "claude-code")}
    assert sum(f["tokens"].get("input", 0) for f in facts()) > 0
    assert ended["type"] == "task-acked", ended
    # it sent its run's token (x-pulse-token and x-pulse-run in OTEL_EXPORTER_OTLP_HEADERS), as the adapter set it
    assert pulsed.status().telemetry["requests"].get("with_token", 0) >= 1, pulsed.status().telemetry
    # once its last export is in, the run's facts add up to what the CLI itself reported at its end
    said = ended["data"]["result"]
    summed = lambda: {"input": sum(f["data"]["tokens"].get("input", 0) for f in pulsed.events("telemetry", run)),
                      "cost": round(sum(f["data"]["cost_usd"] for f in pulsed.events("telemetry", run)), 6)}
    want = {"input": said["tokens"]["input"], "cost": round(said["cost_usd"], 6)}
    wait_for(lambda: summed() == want, 30, 0.2, what=f"the run's facts to add up to its own report {want}")


def test_codex_reports_its_tokens_through_its_otel_exporter(pulsed, litellm, tmp_path):
    """The adapter's `-c otel.exporter=…` is a config Codex takes (a wrong one would keep every Codex
    run from starting), and its sse_event token counts reach the run's facts."""
    require_tools("codex")
    start(pulsed, "codex", codex_env(tmp_path, litellm.url), before=TELEMETRY, mcp=False)
    task = add_task(pulsed)
    evs = settled(pulsed, task, 90)
    ended = evs[-1]
    assert ended["type"] == "task-acked", [e["data"].get("error") for e in evs if e["type"] == "task-failed"]
    run = ended["data"]["run"]
    said = ended["data"]["result"]["tokens"]
    summed = lambda: sum(f["data"]["tokens"].get("input", 0) for f in pulsed.events("telemetry", run))
    wait_for(lambda: summed() == said["input"] > 0, 30, 0.2, what=f"the run's facts to count its {said['input']} input tokens")
    facts = [e["data"] for e in pulsed.events("telemetry", run)]
    print(f"{len(facts)} facts of run {run}: {facts}")
    assert {(f["task"], f["agent"]) for f in facts} == {(task, "codex")}
    assert sum(f["api_requests"] for f in facts) >= 1
    # Codex's exporter takes the token from OTEL_EXPORTER_OTLP_HEADERS (never on its command line)
    assert pulsed.status().telemetry["requests"].get("with_token", 0) >= 1, pulsed.status().telemetry


def test_claude_code_against_an_endpoint_that_never_answers_ends_as_stalled(pulsed, tmp_path):
    """The model endpoint accepts connections (the kernel's backlog) and never answers: Claude Code
    waits on it, printing nothing, its telemetry quiet; stall_s ends the run long before timeout_s,
    every process of it gone."""
    import socket
    import time
    require_tools("claude")
    with socket.create_server(("127.0.0.1", 0), backlog=64) as hole:      # listens, never accepts
        url = f"http://127.0.0.1:{hole.getsockname()[1]}"
        start(pulsed, "claude-code", claude_env(tmp_path, url, key="sk-never"), timeout_s=300, mcp=False, stall_s=10,
              before=TELEMETRY, max_failures=1)
        task = add_task(pulsed)
        began = wait_for(lambda: next(iter(pulsed.events("task-executing", task)), None), 60, 0.2, what="the run")
        run = began["data"]["run"]
        evs = settled(pulsed, task, 120)
    failed = next(e for e in evs if e["type"] == "task-failed")
    print(f"{task}: {failed['data'].get('reason')}: {failed['data'].get('error')}")
    assert failed["data"]["reason"] == "stalled", failed["data"]
    assert failed["ts"] - began["ts"] < 60                     # its timeout_s is 300
    left = [p.pid for p in psutil.process_iter() if p.pid != os.getpid() and run_mark(p) == run]
    assert left == [], f"processes of the run outlived it: {left}"
    assert time.time() - began["ts"] < 120


def run_mark(proc) -> str | None:
    try:
        return proc.environ().get("PULSE_RUN")
    except (psutil.Error, OSError):
        return None


def ended_run(pulsed, task: str) -> tuple[dict, dict]:
    """(the run's task-executing, its task-failed) once the task is given up."""
    began = wait_for(lambda: next(iter(pulsed.events("task-executing", task)), None), 60, 0.2, what="the run")
    evs = settled(pulsed, task, 120)
    return began, next((e for e in evs if e["type"] == "task-failed"), evs[-1])


def ended_by_a_guard(pulsed, tmp_path, steps, **limits) -> tuple[dict, int]:
    """A real Claude Code run of `steps` under an agent with `limits`, to its end: the data of the
    task-failed it ended with, and how many requests the model was asked."""
    require_tools("claude")
    with ScriptedAnthropic(steps, "PONG") as model:
        start(pulsed, "claude-code", claude_env(tmp_path, model.url, key="sk-scripted"), timeout_s=120, mcp=False,
              before=TELEMETRY, max_failures=1, **limits,
              argv=["claude", "-p", "--output-format", "json", "--allowedTools", "Bash", "--", "{prompt}"])
        task = add_task(pulsed)
        _, failed = ended_run(pulsed, task)
        asked = model.requests
    data = failed["data"]
    print(f"{task}: {data.get('reason')}: {data.get('error')} after {asked} requests; {data.get('telemetry')}")
    return data, asked


def test_claude_code_spending_past_max_run_usd_is_ended_mid_run(pulsed, tmp_path):
    """Thirty 1-second tool calls, each a request the CLI prices itself (its api_request events'
    cost_usd); max_run_usd is a few requests' worth: the run is ended while it runs, over-budget,
    every process of it gone, and its reported cost is what it is charged."""
    steps = [("Bash", {"command": "sleep 1", "description": "wait"})] * 30
    data, asked = ended_by_a_guard(pulsed, tmp_path, steps, max_run_usd=0.0003)
    assert data.get("reason") == "over-budget", data
    assert asked < len(steps), "the run went to its end"
    assert data["telemetry"]["cost_usd"] >= 0.0003
    assert [p.pid for p in psutil.process_iter() if p.pid != os.getpid() and run_mark(p) == data["run"]] == []
    settled_cost = next(e["data"]["usd"] for e in pulsed.events("spend-settled") if e["data"]["effect_id"] == data["run"])
    assert settled_cost >= 0.0003


def test_claude_code_in_a_loop_of_tool_calls_is_ended_by_the_loop_guard(pulsed, tmp_path):
    """A model that keeps asking for a tool (sixty calls of 0.2 s: at least 12 s of them, so the run
    cannot end before its telemetry is read): past loop_per_min tool calls in a minute the run is
    ended, reason loop, long before it would have ended by itself."""
    steps = [("Bash", {"command": "sleep 0.2", "description": "again"})] * 60
    data, asked = ended_by_a_guard(pulsed, tmp_path, steps, loop_per_min=8)
    assert data.get("reason") == "loop", data
    assert asked < len(steps), "the run went to its end"
    assert [p.pid for p in psutil.process_iter() if p.pid != os.getpid() and run_mark(p) == data["run"]] == []
