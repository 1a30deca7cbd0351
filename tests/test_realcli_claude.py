"""Claude Code through a real pulsed (tests/realagents.py): a task acked with PONG and what the CLI
reported, its failures in its own words, and Pulse's tools called, or denied, through the gate."""

from __future__ import annotations

import json
import subprocess

import pytest

from realagents import (
    DASH_PROMPT,
    acked,
    add_task,
    claude_env,
    clean_env,  # noqa: F401 (autouse: no credential of the shell reaches a CLI)
    cli_json,
    first_failure,
    gate_opened_before_the_answer,
    given_up_at_once,
    output,
    settled,
    start,
)
from realtools import (
    ANSWER,
    FakeAnthropic,
    ScriptedAnthropic,
    require_tools,
)

pytestmark = pytest.mark.realcli


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


# -- Pulse's tools through the gate ----------------------------------------------------------------------

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
