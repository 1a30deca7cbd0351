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


# An import inside a function says why it is not at the module's top (a start-up cost it spares
# someone, measured; an optional dependency; what must load only in a child): a comment on its
# line, or on the line above the run of imports it is in, or, for a reason the module's imports
# share, once in the module as a comment that starts with this.
MODULE_REASON = "# Imports inside functions"


def unexplained_imports(source: str) -> list[int]:
    """The lines of the imports inside functions of `source` that give no reason."""
    import ast
    import io
    import re
    import tokenize
    if any(line.lstrip().startswith(MODULE_REASON) for line in source.splitlines()):
        return []
    commented = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                 if tok.type == tokenize.COMMENT and re.sub(r"#\s*noqa(:\s*[\w, ]+)?", "", tok.string).strip("# ")}
    lines = source.splitlines()
    found = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for block in ast.walk(func):
            for field in ("body", "orelse", "finalbody"):
                stmts = getattr(block, field, None)
                run: list[ast.stmt] = []
                for stmt in [*stmts, None] if isinstance(stmts, list) else ():
                    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                        run.append(stmt)
                        continue
                    if run:
                        said = any(line in commented for s in run for line in range(s.lineno, s.end_lineno + 1)) \
                            or lines[run[0].lineno - 2].lstrip().startswith("#")
                        found += [] if said else [s.lineno for s in run]
                        run = []
    return sorted(set(found))


def test_every_import_inside_a_function_says_why():
    # the check finds what it is for
    assert unexplained_imports("def f():\n    import zmq\n    return zmq\n") == [2]
    assert unexplained_imports("def f():\n    import zmq  # ~20 ms: only f sends\n    import json\n"
                               "    return zmq\n") == []
    assert unexplained_imports("def f():\n    x = 1\n    # only here: ...\n    import zmq\n    return zmq\n") == []
    assert unexplained_imports("# Imports inside functions below: pulsectl's ...\ndef f():\n    import zmq\n") == []
    assert unexplained_imports("def f():\n    if x:\n        import zmq\n        zmq.go()\n") == [3]
    assert unexplained_imports("def f():\n    import zmq  # noqa: F401\n") == [2]      # a linter's word is no reason
    found = {}
    for base in ("pulse", "supervisor", "engine"):
        for path in sorted((ROOT / base).rglob("*.py")):
            if "template" not in path.relative_to(ROOT).parts and (lines := unexplained_imports(path.read_text())):
                found[str(path.relative_to(ROOT))] = lines
    assert found == {}
