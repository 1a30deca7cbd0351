"""The hermes-gateway preset's way out of a crash loop (pulse/core/presets/hermes_unstick.py) on a
Hermes home laid out as Hermes 0.19 leaves it: its routing index in state.db (gateway_routing) and
the sessions.json mirror. The real Hermes acting on it: tests/test_realcli_guard.py."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

from pulse.core import presets
from pulse.core.presets import hermes_unstick


def entry(key: str, **flags) -> dict:
    return {"session_key": key, "session_id": f"id-{key}", "resume_pending": False, "suspended": False, **flags}


def hermes_home(tmp_path):
    home = tmp_path / ".hermes"
    (home / "sessions").mkdir(parents=True)
    conn = sqlite3.connect(home / "state.db")
    conn.execute("CREATE TABLE gateway_routing (scope TEXT NOT NULL DEFAULT '', session_key TEXT NOT NULL, "
                 "entry_json TEXT NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY (scope, session_key))")
    rows = [entry("a:stuck", resume_pending=True, resume_reason="restart_interrupted"),
            entry("a:idle"), entry("a:set-aside", resume_pending=True, suspended=True)]
    conn.executemany("INSERT INTO gateway_routing VALUES (?, ?, ?, 0)",
                     [(str(home / "sessions"), e["session_key"], json.dumps(e)) for e in rows])
    conn.commit()
    conn.close()
    mirror = {"_README": "LEGACY MIRROR", "b:only-in-mirror": entry("b:only-in-mirror", resume_pending=True)}
    (home / "sessions" / "sessions.json").write_text(json.dumps(mirror))
    (home / ".restart_failure_counts").write_text(json.dumps({"a:stuck": 1, "c:other": 2}))
    return home


def test_every_session_hermes_would_resume_is_counted_stuck_and_nothing_else_changes(tmp_path):
    home = hermes_home(tmp_path)
    state_before = (home / "state.db").read_bytes()
    table = presets.applied({"preset": "hermes-gateway", "env": {"HOME": str(tmp_path), "API_SERVER_KEY": "k"}})
    assert table["on_crash_loop"] == [sys.executable, "-m", "pulse.core.presets.hermes_unstick"]
    ran = subprocess.run(table["on_crash_loop"], env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert "the 2 session(s) it would resume" in ran.stdout and "a:stuck, b:only-in-mirror" in ran.stdout
    counts = json.loads((home / ".restart_failure_counts").read_text())
    assert counts == {"a:stuck": 3, "b:only-in-mirror": 3, "c:other": 2}       # Hermes' threshold; others kept
    assert (home / "state.db").read_bytes() == state_before                    # Hermes' own store: read only
    assert sorted(p.name for p in home.iterdir()) == [".restart_failure_counts", "sessions", "state.db"]


def test_nothing_to_resume_changes_nothing_and_no_home_is_said(tmp_path):
    home = tmp_path / "hermes-home"
    (home / "sessions").mkdir(parents=True)
    assert hermes_unstick.main({"HERMES_HOME": str(home)}) == 0
    assert not (home / ".restart_failure_counts").exists()
    assert hermes_unstick.main({"HERMES_HOME": str(tmp_path / "nowhere")}) == 1
