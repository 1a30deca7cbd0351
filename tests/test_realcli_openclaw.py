"""OpenClaw through a real pulsed (tests/realagents.py): through its real gateway, one session per
task; the gateway down, in OpenClaw's words."""

from __future__ import annotations

from pathlib import Path

import pytest

from realagents import (
    acked,
    add_task,
    clean_env,  # noqa: F401 (autouse: no credential of the shell reaches a CLI)
    cli_json,
    first_failure,
    openclaw_env,
    output,
    start,
)
from realtools import (
    ANSWER,
    OpenClawGateway,
    free_port,
    require_tools,
)

pytestmark = pytest.mark.realcli


def test_openclaw_through_its_gateway_acks_pong_in_a_session_per_task(pulsed, litellm, tmp_path, tracker):
    require_tools("openclaw", "node24")
    port = free_port()
    env = openclaw_env(tmp_path, litellm.url, port)
    with OpenClawGateway(tmp_path / "gateway", Path(env["OPENCLAW_STATE_DIR"]),
                         Path(env["HOME"]), port) as gateway:
        try:
            gateway.start()
        except (RuntimeError, TimeoutError) as err:
            pytest.fail(str(err))
        tracker.add(gateway.proc.pid)
        start(pulsed, "openclaw", env, timeout_s=90)           # the default argv: through the gateway
        first, second = add_task(pulsed), add_task(pulsed)
        runs = {task: acked(pulsed, task, 120) for task in (first, second)}
    for task, data in runs.items():
        said = cli_json(output(pulsed, data))
        assert said["status"] == "ok", said
        meta = said["result"]["meta"]
        agent_meta, usage = meta["agentMeta"], meta["agentMeta"]["usage"]
        result = data["result"]
        assert result["result"] == ANSWER
        assert result["session_id"] == agent_meta["sessionId"]
        assert task in meta["systemPromptReport"]["sessionKey"], meta["systemPromptReport"]["sessionKey"]
        assert result["tokens"] == {"input": usage["input"], "output": usage["output"], "cache_read": usage["cacheRead"],
                                    "cache_write": usage["cacheWrite"], "total": usage["total"]}
        assert result["cost_usd"] == usage["cost"]["total"] == 0
    assert runs[first]["result"]["session_id"] != runs[second]["result"]["session_id"]


def test_openclaw_gateway_down_says_not_reachable(pulsed, tmp_path, closed_port):
    require_tools("openclaw", "node24")
    start(pulsed, "openclaw", openclaw_env(tmp_path, f"http://127.0.0.1:{closed_port}", closed_port), timeout_s=60,
          max_failures=1)
    task = add_task(pulsed)
    failed = first_failure(pulsed, task, 70)
    assert f"Gateway not reachable at ws://127.0.0.1:{closed_port} (ECONNREFUSED)" in failed["error"], failed
