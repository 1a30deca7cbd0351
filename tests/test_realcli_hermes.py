"""Hermes Agent through a real pulsed (tests/realagents.py): a task acked with the session Hermes
kept in its own state database, and its failures in its own words."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from realagents import (
    acked,
    add_task,
    clean_env,  # noqa: F401 (autouse: no credential of the shell reaches a CLI)
    first_failure,
    given_up_at_once,
    hermes_env,
    start,
)
from realtools import (
    ANSWER,
    CHAT_MODEL,
    require_tools,
)

pytestmark = pytest.mark.realcli


def test_hermes_acks_pong_with_its_session_cost_and_tokens(pulsed, litellm, tmp_path):
    require_tools("hermes")
    env = hermes_env(tmp_path, litellm.url)
    start(pulsed, "hermes", env, timeout_s=90)
    task = add_task(pulsed)
    result = acked(pulsed, task, 120)["result"]
    assert result["result"] == ANSWER
    assert re.fullmatch(r"\d{8}_\d{6}_[0-9a-f]+", result["session_id"]), result
    # the session is Hermes' own, with these counts, in its state database
    db = sqlite3.connect(f"file:{Path(env['HERMES_HOME']) / 'state.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, estimated_cost_usd,"
                         " model FROM sessions WHERE id = ?", (result["session_id"],)).fetchone()
    finally:
        db.close()
    assert row is not None, f"no session {result['session_id']} in Hermes' state.db"
    tokens = result["tokens"]
    assert (tokens["input"], tokens["output"], tokens["cache_read"], tokens["cache_write"]) == row[:4]
    assert tokens["input"] > 0 and tokens["total"] == tokens["input"] + tokens["output"]
    assert result["cost_usd"] == row[4] == 0.0        # estimated_cost_usd: the mock model has no price
    assert (result["model"], result["provider"], result["api_calls"]) == (CHAT_MODEL, "custom", 1) == (row[5], "custom", 1)


def test_hermes_endpoint_down_says_what_hermes_printed(pulsed, tmp_path, closed_port):
    """Hermes exits 0 with its failure as the answer; the usage file says failed, with no message."""
    require_tools("hermes")
    start(pulsed, "hermes", hermes_env(tmp_path, f"http://127.0.0.1:{closed_port}"), timeout_s=90, max_failures=1)
    task = add_task(pulsed)
    failed = first_failure(pulsed, task, 120)
    assert re.search(r"API call failed after \d+ retries: Connection error", failed["error"]), failed


def test_hermes_without_a_provider_says_so_and_is_given_up_at_once(pulsed, tmp_path):
    require_tools("hermes")
    start(pulsed, "hermes", hermes_env(tmp_path, None), timeout_s=90)
    task = add_task(pulsed)
    failed = given_up_at_once(pulsed, task, 120)            # a missing key: retrying cannot fix it
    assert "No inference provider configured" in failed["error"], failed
