"""The source passes `ruff check` with the project's settings (pyproject.toml's [tool.ruff])."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).with_name("ruff")


def test_ruff_finds_nothing():
    assert RUFF.exists(), f"{RUFF} is missing: install the test extra (pip install -e '.[test]')"
    proc = subprocess.run([str(RUFF), "check", "--no-cache", "--output-format", "concise",
                           "pulse", "supervisor", "engine", "scripts", "tests"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
