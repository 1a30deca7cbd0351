"""Codex through a real pulsed (tests/realagents.py): a task acked with its thread and tokens, its
failures in its own words, and an endpoint that comes back (Codex's recoverable errors)."""

from __future__ import annotations

import json
import re

import pytest

from realagents import (
    DASH_PROMPT,
    CmdlineWatch,
    acked,
    add_task,
    clean_env,  # noqa: F401 (autouse: no credential of the shell reaches a CLI)
    codex_env,
    codex_events,
    first_failure,
    gate_opened_before_the_answer,
    given_up_at_once,
    output,
    start,
)
from realtools import (
    ANSWER,
    ClosedPort,
    LiteLLM,
    Outage,
    require_tools,
)
from support import wait_for

pytestmark = pytest.mark.realcli


def test_codex_acks_pong_with_its_thread_and_tokens(pulsed, litellm, tmp_path):
    require_tools("codex")
    start(pulsed, "codex", codex_env(tmp_path, litellm.url))
    task = add_task(pulsed)
    data = acked(pulsed, task, 60)
    events = [json.loads(line) for line in output(pulsed, data).splitlines() if line.startswith("{")]
    thread = next(e["thread_id"] for e in events if e["type"] == "thread.started")
    usage = next(e["usage"] for e in events if e["type"] == "turn.completed")
    result = data["result"]
    assert result["result"] == ANSWER and result["session_id"] == thread and result["turns"] == 1
    assert usage["input_tokens"] > 0 and "cost_usd" not in result        # Codex reports no money
    assert {k: result["tokens"].get(k) for k in ("input", "output", "cache_read")} == \
        {"input": usage["input_tokens"], "output": usage["output_tokens"], "cache_read": usage["cached_input_tokens"]}


def test_codex_missing_env_key_is_said_and_given_up_at_once(pulsed, tmp_path, closed_port):
    require_tools("codex")
    start(pulsed, "codex", codex_env(tmp_path, f"http://127.0.0.1:{closed_port}", key=None), timeout_s=30)
    task = add_task(pulsed)
    failed = given_up_at_once(pulsed, task, 40)
    assert "Missing environment variable: `LITELLM_API_KEY`" in failed["error"], failed


def test_codex_endpoint_down_says_so_when_it_times_out(pulsed, tmp_path, closed_port):
    """Codex waits for the network with no end: Pulse's timeout ends it, and the reason keeps
    what Codex said while it waited."""
    require_tools("codex")
    start(pulsed, "codex", codex_env(tmp_path, f"http://127.0.0.1:{closed_port}"), timeout_s=6, max_failures=1)
    task = add_task(pulsed)
    failed = first_failure(pulsed, task, 30)
    assert failed["reason"] == "timeout", failed
    assert "Reconnecting" in failed["error"] or "waiting for network" in failed["error"], failed


def test_codex_prompt_starting_with_a_dash_is_acked(pulsed, litellm, tmp_path):
    """Its `pulsectl mcp` session is the run's (the token reached it by env_vars, from Codex's own
    environment), and no process of the host had the token in its command line meanwhile."""
    require_tools("codex")
    start(pulsed, "codex", codex_env(tmp_path, litellm.url))              # default argv, Pulse's MCP on
    with CmdlineWatch(b"PULSE_RUN_TOKEN=") as watch:
        task = add_task(pulsed, DASH_PROMPT)
        assert acked(pulsed, task, 60)["result"]["result"] == ANSWER
    problem = gate_opened_before_the_answer(pulsed, task)
    assert problem is None, f"the run's -c mcp_servers.pulse.* (required) were not honoured: {problem}"
    assert watch.tokens and not watch.seen, f"a run token was in a command line: {watch.seen[:3]}"


def test_codex_waiting_for_network_then_litellm_started_is_acked(pulsed, litellm, tmp_path, tracker):
    """LiteLLM is down when the run starts (its port refuses) and is started once the run is: Codex
    prints {"type":"error","message":"Reconnecting... waiting for network (...)"}, waits, and
    completes the turn once the proxy answers; one run, acked. (LiteLLM takes several seconds to
    listen, Codex tries within a second of starting: its first try always meets a closed port.)"""
    require_tools("codex", "litellm")
    down = ClosedPort()
    late = LiteLLM(tmp_path / "litellm-late", port=down.port)
    try:
        start(pulsed, "codex", codex_env(tmp_path, late.url), timeout_s=50)
        task = add_task(pulsed)
        wait_for(lambda: pulsed.events("task-executing", task), 20, 0.05, what=f"{task} executing")
        down.close()                                 # the port is free for the proxy, which binds it seconds later
        late.start(wait=False)
        tracker.add(late.proc.pid)
        data = acked(pulsed, task, 60)
    finally:
        down.close()
        late.stop()
    assert data["result"]["result"] == ANSWER
    events = codex_events(pulsed, data)
    assert events[-1]["type"] == "turn.completed", events[-1]
    errors = [e for e in events if e.get("type") == "error"]
    assert errors and all(e["message"].startswith("Reconnecting... waiting for network") for e in errors), errors


def test_codex_stream_reconnecting_then_completed_is_acked(pulsed, litellm, tmp_path):
    """The first POST /v1/responses is reset after it was sent, then the endpoint is back: Codex
    prints {"type":"error","message":"Reconnecting... 1/3 (stream disconnected before completion:
    ...)"}, retries, completes the turn; one run, acked."""
    require_tools("codex")
    outage = Outage(litellm.port, path="/responses")
    try:
        start(pulsed, "codex", codex_env(tmp_path, f"http://127.0.0.1:{outage.port}", stream_retries=3), timeout_s=45)
        task = add_task(pulsed)
        data = acked(pulsed, task, 60)
    finally:
        outage.stop()
    assert data["result"]["result"] == ANSWER
    assert outage.refused and outage.forwarded, (outage.refused, outage.forwarded)
    events = codex_events(pulsed, data)
    assert events[-1]["type"] == "turn.completed", events[-1]
    errors = [e for e in events if e.get("type") == "error"]
    assert errors and all(re.match(r"Reconnecting\.\.\. \d+/3 \(stream disconnected", e["message"]) for e in errors), \
        errors
