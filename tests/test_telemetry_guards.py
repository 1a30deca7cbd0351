"""Guards on what a run reports while it runs: a run whose telemetry says it spent past its
agent's max_run_usd, or that it made more requests and tool calls a minute than its loop_per_min,
is ended at once, every process of it, with that reason (or, on_loop = "notice", the loop is only
said and the run goes on). The run is a stand-in for Claude Code that
exports its events as Claude Code does (the official OTel SDK, configured only by the environment
the adapter gave it) and never ends by itself; tests/test_realcli_telemetry.py does the same with
the real CLI."""

from __future__ import annotations

import json
import os
import sys

import psutil
import pytest

from pulse.agents import runfacts, runguards
from support import init_home, wait_for

FLUSH_S = 0.3

# Every 0.2 s one API request (costing FAKE_COST) and one tool call, as Claude Code's events say them,
# until it is killed (or a minute passes: then it prints a result, which the test would see as acked).
SPENDING_CLAUDE = r'''
import json, os, time
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
provider = LoggerProvider(resource=Resource.create({"service.name": "claude-code"}))
provider.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter()))
logger = provider.get_logger("com.anthropic.claude_code.events")
deadline = time.time() + float(os.environ.get("FAKE_FOR_S", "60"))
while time.time() < deadline:
    logger.emit(body="claude_code.api_request", attributes={
        "event.name": "api_request", "session.id": "s-loop", "input_tokens": 100, "output_tokens": 10,
        "cost_usd": float(os.environ["FAKE_COST"])})
    logger.emit(body="claude_code.tool_result", attributes={
        "event.name": "tool_result", "session.id": "s-loop", "tool_name": "Bash", "success": "true"})
    time.sleep(0.2)
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "ok", "session_id": "s-loop",
                  "num_turns": 1}))
'''


def agent_toml(name: str, script, cost: float, for_s: float = 60, **keys) -> str:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    return (f'[[agent]]\nname = "{name}"\nadapter = "claude-code"\nmcp = false\ntimeout_s = 90\n{extra}'
            f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}]\n'
            f'env = {{ FAKE_COST = "{cost}", FAKE_FOR_S = "{for_s}" }}\n\n')


def run_of_marked(run: str) -> list[int]:
    left = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get("PULSE_RUN") == run:
                left.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return left


@pytest.mark.daemon
def test_a_run_spending_past_max_run_usd_or_looping_is_ended_while_it_runs(pulsed, tmp_path):
    script = tmp_path / "spending_claude.py"
    script.write_text(SPENDING_CLAUDE)
    notes = tmp_path / "notes.jsonl"
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(
        f'[telemetry]\nenabled = true\nlisten = "127.0.0.1:0"\nflush_s = {FLUSH_S}\n\n'
        f'[tasks]\nmax_failures = 3\nretry_base_s = 0.2\n\n[[notify]]\nkind = "file"\npath = "{notes}"\n\n'
        + agent_toml("spender", script, 0.1, max_run_usd=0.35)
        + agent_toml("looper", script, 0, loop_per_min=12)
        # the same loop, only said: the run goes on to its own end (8 s of it) and is acked
        + agent_toml("noticer", script, 0, for_s=8, loop_per_min=12, on_loop="notice"))
    pulsed.start(env={"PULSE_TICK_MS": "200"})
    pulsed.wait_running(("watcher", "tick", "executor", "telemetry"))
    tasks = {}
    for agent in ("spender", "looper", "noticer"):
        out = pulsed.ctl("task", "add", "--project", "p", "--title", agent, "--prompt", "spend", "--agent", agent)
        assert out.returncode == 0, out.stderr
        tasks[agent] = out.stdout.strip().split()[0].rstrip(":")
    failed = {agent: wait_for(lambda t=task: next(iter(pulsed.events("task-failed", t)), None), 45, 0.1,
                              what=f"{agent}'s run to be ended")
              for agent, task in tasks.items() if agent != "noticer"}
    spent, looped = failed["spender"]["data"], failed["looper"]["data"]
    print(spent, looped, sep="\n")
    assert spent["reason"] == "over-budget" and "max_run_usd ($0.35)" in spent["error"], spent
    assert 0.35 <= spent["telemetry"]["cost_usd"] < 0.35 + 0.1 * 10, spent["telemetry"]
    assert looped["reason"] == "loop" and "loop_per_min (12)" in looped["error"], looped
    assert looped["telemetry"]["api_requests"] > 12, looped["telemetry"]
    for data in (spent, looped):
        assert data["run_ms"] < 30_000, data              # long before its timeout_s (90) or its own end (60 s)
        assert run_of_marked(data["run"]) == [], "a process of the ended run is left"
    # the run ended mid-turn printed no result: what its telemetry said it spent is what it cost
    settled = next(e["data"] for e in pulsed.events("spend-settled") if e["data"].get("effect_id") == spent["run"])
    assert settled["usd"] == spent["telemetry"]["cost_usd"], settled
    shown = pulsed.ctl("task", "show", tasks["spender"])
    assert "over-budget" in shown.stdout, shown.stdout
    assert f"${spent['telemetry']['cost_usd']:.4f}" in shown.stdout, shown.stdout   # what it reported, shown

    # ended the same way twice (same_end_max = 2 by default): given up, not retried a third time, saying why
    for agent, reason in (("spender", "over-budget"), ("looper", "loop")):
        gave_up = wait_for(lambda t=tasks[agent]: next(iter(pulsed.events("task-given-up", t)), None), 45, 0.1,
                           what=f"{agent}'s task given up")
        assert [e["data"]["reason"] for e in pulsed.events("task-failed", tasks[agent])] == [reason, reason]
        assert gave_up["data"]["same_end"] == reason and f"ended the same way ({reason})" in gave_up["data"]["reason"]
        shown = pulsed.ctl("task", "show", tasks[agent]).stdout
        assert f"given up:    its last 2 runs all ended the same way ({reason})" in shown, shown

    # on_loop = "notice": the loop is a fact on the task and a notification, once; the run goes on to its end
    task = tasks["noticer"]
    acked = wait_for(lambda: next(iter(pulsed.events("task-acked", task)), None), 45, 0.1, what="the noticer's end")
    assert not pulsed.events("task-failed", task)
    [noticed] = pulsed.events("loop-noticed", task)
    assert noticed["data"]["run"] == acked["data"]["run"] and noticed["data"]["api_requests"] > 12, noticed
    assert "loop_per_min (12)" in noticed["data"]["detail"]
    assert acked["data"]["notices"][0]["guard"] == "loop", acked["data"]
    assert acked["data"]["run_ms"] >= 7_000               # not ended: it ran its 8 s
    note = wait_for(lambda: next((json.loads(line) for line in notes.read_text().splitlines()
                                  if json.loads(line).get("rule") == "loop"), None) if notes.exists() else None,
                    20, 0.1, what="the loop's notification")
    assert task in note["title"] and "left running" in note["title"], note
    shown = pulsed.ctl("task", "show", task)
    assert "noticed, left running: loop:" in shown.stdout and "acked" in shown.stdout, shown.stdout


def facts_of(*facts: dict) -> runfacts.RunFacts:
    run = runfacts.RunFacts("eff-1", None)
    for fact in facts:
        run.add(fact)
    return run


def test_the_spend_cap_is_the_least_of_max_run_usd_and_what_the_budget_left():
    assert runguards.spend_cap(None, None) is None
    assert runguards.spend_cap(2.0, None)[0] == 2.0
    assert runguards.spend_cap(2.0, 0.5)[0] == 0.5 and "spend limits" in runguards.spend_cap(2.0, 0.5)[1]
    facts = facts_of({"cost_usd": 0.2, "last_at": 1.0}, {"cost_usd": 0.3, "last_at": 2.0})
    facts.read = lambda now=False: None            # no store: the facts are what was added
    assert runguards.SpendGuard(facts, (0.6, "x")).check() is None
    assert runguards.SpendGuard(facts, (0.5, "x")).check()[0] == "over-budget"
    # a cap of 0 ends a run that spends anything, not one that reports nothing spent
    free = facts_of({"cost_usd": 0, "api_requests": 3, "last_at": 1.0})
    free.read = lambda now=False: None
    assert runguards.SpendGuard(free, (0.0, "x")).check() is None


def test_the_loop_rate_counts_only_the_last_minute():
    facts = facts_of({"api_requests": 50, "tool_calls": 1, "last_at": 100.0},
                     {"api_requests": 5, "tool_calls": 40, "last_at": 150.0})
    assert facts.rate(155.0) == (55, 41)
    assert facts.rate(170.0) == (5, 40)               # the first fact is older than a minute
    assert facts.totals()["api_requests"] == 55


def test_a_loop_guard_that_notices_says_it_once_and_never_ends_the_run():
    facts = facts_of({"api_requests": 30, "tool_calls": 2, "last_at": 0.0})
    facts.read = lambda now=False: None
    facts.rate = lambda now: (30, 2)
    said = []
    guard = runguards.LoopGuard(facts, 12, said.append)
    assert guard.check() is None and guard.check() is None
    assert len(said) == 1 and said[0]["guard"] == "loop" and "loop_per_min (12)" in said[0]["detail"]
    assert runguards.LoopGuard(facts, 12).check()[0] == "loop"      # without a notice: ended


def test_on_loop_notice_needs_a_loop_per_min(tmp_path):
    from pulse.core import config
    path = tmp_path / "config.toml"
    path.write_text('[[agent]]\nname = "a"\non_loop = "notice"\nargv = ["true"]\n')
    with pytest.raises(config.ConfigError, match=r'on_loop = "notice" needs loop_per_min'):
        config.load(path)
    path.write_text('[[agent]]\nname = "a"\non_loop = "warn"\nargv = ["true"]\n')
    with pytest.raises(config.ConfigError, match="on_loop"):
        config.load(path)
