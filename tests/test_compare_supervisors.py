"""scripts/compare_supervisors.py, in its shortest form against Pulse only (supervisord and PM2 are
installed and run by the script itself, not by the suite): one kill and two seconds of the crash
loop, and the table it prints from them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "compare_supervisors.py"

pytestmark = pytest.mark.daemon


def test_the_comparison_measures_pulse_kills_and_its_crash_loop_and_prints_the_table():
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "pulse", "--trials", "1", "--window", "2", "--json"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    text, document = done.stdout.rsplit("\n", 2)[0], json.loads(done.stdout.strip().splitlines()[-1])
    pulse = document["tools"]["pulse"]
    assert pulse["kill_ms"]["n"] == 1 and 0 < pulse["kill_ms"]["median"] < 30_000
    loop = pulse["crash_loop"]["defaults"]
    seen = [state for _, state in loop["states"] if state != "unknown"]   # unknown: not sampled yet
    assert loop["starts"] >= 1 and seen and seen[0] in ("starting", "backoff"), loop["states"]
    assert "kill -9 → restarted median ms" in text and "pulse pulsectl, version" in text
    assert "what the operator was told:" in text and document["machine"]["load_before"]
