"""The engine directory's lifecycle: promote (merge staging into main behind the promote checks), rollback.

    <home>/engine    branch main: what the engine process runs
    <home>/staging   branch staging (a git worktree): where the agent edits

Every git mutation goes through one lock (<home>/engine.lock), whoever makes it:
`pulsectl promote`, a rollback by hand or by a survival rule.

The promote checks run on a candidate, never on main: staging is merged into a temporary
worktree of main; every file must compile, the engine must import in a
throwaway process within a timeout, and the engine's own tests must pass. Only
then is main fast-forwarded to the candidate, so a failed check leaves main, and
the running engine, exactly as they were.
"""

from __future__ import annotations

import fcntl
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from pulse.core import clock, procs
from pulse.core.home import Paths, dev_marker_text
from pulse.core.wire import eventmsgs
from pulse.store import connection, eventsdb, objects

GATE_TIMEOUT_S = 120
IMPORT_TIMEOUT_S = 30
LOCK_TIMEOUT_S = 300


class EngineDirError(Exception):
    """A promote or rollback that did not happen, and why (main is untouched)."""

    def __init__(self, check: str, reason: str, file: str | None = None, line: int | None = None):
        self.check, self.reason, self.file, self.line = check, reason, file, line
        where = f" ({file}{f':{line}' if line else ''})" if file else ""
        super().__init__(f"{check} failed{where}: {reason}")


class Change(NamedTuple):
    """A promote or rollback that happened. (Not a dataclass: `pulsectl engine log` would import
    dataclasses, and inspect with it, ~5 ms.)"""
    kind: str                 # promote | rollback
    before: str
    after: str
    snapshot: str | None
    event_id: int | None = None


def git(repo: Path, *args: str, check: bool = True) -> str:
    if not check:
        return procs.run_git(repo, *args).stdout.strip()
    try:
        return procs.git(repo, *args)
    except procs.GitError as err:
        raise EngineDirError("git", str(err)) from None


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD")


def is_ancestor(repo: Path, older: str, newer: str) -> bool:
    return procs.run_git(repo, "merge-base", "--is-ancestor", older, newer).returncode == 0


@contextmanager
def locked(paths: Paths, timeout_s: float = LOCK_TIMEOUT_S):
    """The one lock every engine git mutation takes."""
    fd = os.open(paths.home / "engine.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise EngineDirError("lock", f"another promote or rollback held the engine for {timeout_s:g}s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)   # releases the lock


# -- dev mode --------------------------------------------------------------------------------------

def enter_dev(paths: Paths, pid: int) -> None:
    paths.dev_marker.write_text(dev_marker_text(pid))


def leave_dev(paths: Paths) -> None:
    paths.dev_marker.unlink(missing_ok=True)


def dev_filter(change, path: str) -> bool:
    parts = Path(path).parts
    return ".git" not in parts and "__pycache__" not in parts and not path.endswith((".pyc", ".swp", "~"))


# -- the promote checks ---------------------------------------------------------------------------

def check_compiles(tree: Path) -> None:
    for path in sorted(tree.rglob("*.py")):
        if ".git" in path.parts:
            continue
        try:
            compile(path.read_bytes(), str(path), "exec")
        except (SyntaxError, ValueError) as err:
            raise EngineDirError("compile", f"{type(err).__name__}: {getattr(err, 'msg', err)}",
                                 str(path.relative_to(tree)), getattr(err, "lineno", None)) from None


_IMPORT_PROBE = """
import json, sys
from pathlib import Path
from pulse.engine import loader
engine = loader.load(Path(sys.argv[1]))
print(json.dumps({"errors": [{"file": e.file, "line": e.line, "error": e.error} for e in engine.errors],
                  "kinds": sorted(engine.executors)}))
"""


def probe(tree: Path) -> dict:
    """Load the engine in a throwaway process (agent code never runs in ours): its load errors and
    the effect kinds its executors declare."""
    try:
        proc = subprocess.run([sys.executable, "-P", "-B", "-c", _IMPORT_PROBE, str(tree)], cwd=tree,
                              capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise EngineDirError("import", f"importing the engine took longer than {IMPORT_TIMEOUT_S}s") from None
    if proc.returncode != 0:
        raise EngineDirError("import", f"the import probe exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_imports(tree: Path) -> None:
    errors = probe(tree)["errors"]
    if errors:
        first = errors[0]
        raise EngineDirError("import", first["error"], first["file"], first["line"])


# pytest's settings in the environment are those of whoever started pulsed (a CI job's --junitxml, a
# profiler's -p plugin), not the engine's: the gate would write their reports, or refuse every promote
# for a plugin the engine never asked for. The engine's own configuration, in its tree, still applies.
CALLERS_PYTEST_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")


def check_tests(tree: Path) -> None:
    if not any((tree / "tests").glob("test_*.py")):
        return
    require_pytest()
    env = {k: v for k, v in os.environ.items() if k not in CALLERS_PYTEST_ENV}
    try:
        proc = subprocess.run([sys.executable, "-P", "-B", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "--tb=short", "--rootdir", str(tree), "tests"], cwd=tree, capture_output=True, text=True,
                              timeout=GATE_TIMEOUT_S, env={**env, "PYTHONPATH": str(tree)})
    except subprocess.TimeoutExpired:
        raise EngineDirError("tests", f"the engine's tests took longer than {GATE_TIMEOUT_S}s") from None
    if proc.returncode != 0:
        raise EngineDirError("tests", failure_summary(proc.stdout, proc.stderr))


# pytest is not one of Pulse's own dependencies: only an engine with tests needs it, at promote time.
PYTEST_EXTRA = "engine-tests"


def require_pytest() -> None:
    """The engine has tests, so the interpreter that runs them must have pytest: say so, and how to
    install it into this very environment, rather than report a test failure that is not one."""
    if importlib.util.find_spec("pytest") is None:
        raise EngineDirError("tests", f"the engine has tests but pytest is not installed in Pulse's environment "
                                      f"({sys.executable}): install it with `{sys.executable} -m pip install "
                                      f"'pytest>=8'` (or Pulse with its extra: pip install "
                                      f"'pulse-supervisor[{PYTEST_EXTRA}]'), then promote again")


def failure_summary(output: str, errors: str = "", most: int = 20) -> str:
    """The failed test's name, then its traceback's lines (--tb=short: file:line, the source line,
    and the assertion's `E` lines), at most `most` lines; when pytest ran none (a usage error, a
    plugin it could not load: said on stderr, not stdout), what it said."""
    lines = output.splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    said = [line for line in errors.splitlines() if line.startswith("ERROR")] or errors.strip().splitlines()[-1:]
    head_line = failed[0] if failed else lines[-1] if lines else said[0] if said else "the engine's tests failed"
    start = next((i for i, line in enumerate(lines) if line.startswith("_") and line.endswith("_")), None)
    if start is None:
        return head_line
    body = []
    for line in lines[start + 1:]:
        if line.startswith(("=", "_")) and body:
            break
        if line.strip():
            body.append(line.rstrip())
    return "\n".join([head_line, *body[:most]])


def check_types(tree: Path, argv: list[str] | None) -> None:
    if not argv:
        return
    proc = subprocess.run(argv, cwd=tree, capture_output=True, text=True, timeout=GATE_TIMEOUT_S)
    if proc.returncode != 0:
        raise EngineDirError("typecheck", (proc.stdout.strip() or proc.stderr.strip()).splitlines()[0][:500])


def diff_summary(paths: Paths, before: str, after: str) -> str:
    """`git diff --shortstat` between two commits of main ("2 files changed, 9 insertions(+)"), or
    what kept git from saying."""
    out = procs.run_git(paths.engine, "diff", "--shortstat", before, after)
    if out.returncode != 0:
        return f"no diff ({(out.stderr.strip().splitlines() or ['git failed'])[-1]})"
    return out.stdout.strip() or "no change to the tree"


def promote_checks(tree: Path, typecheck: list[str] | None = None) -> list[str]:
    """Every check in order; raises EngineDirError at the first that fails."""
    check_compiles(tree)
    check_imports(tree)
    check_tests(tree)
    check_types(tree, typecheck)
    return ["compile", "import", "tests"] + (["typecheck"] if typecheck else [])


# -- snapshots --------------------------------------------------------------------------------------

def snapshot(paths: Paths, commit: str) -> str:
    """The tree of `commit` as a tar in objects/ (kept as long as an event names it)."""
    tar = procs.run_git(paths.engine, "archive", "--format=tar", commit, text=False).stdout
    return objects.put(paths.home / "objects", tar)


def restore_snapshot(paths: Paths, ref: str) -> None:
    """Replace the engine tree (not .git) with a snapshot: for when git itself is damaged."""
    data = objects.get(paths.home / "objects", ref)
    for entry in paths.engine.iterdir():
        if entry.name == ".git":
            continue
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    import tarfile  # ~3 ms: only a restore from a snapshot
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(paths.engine, filter="data")


# -- promote and rollback ---------------------------------------------------------------------------

def _record(paths: Paths, type_: str, source: str, **data) -> int:
    conn = eventsdb.open_events(paths.events_db)
    try:
        return eventsdb.append_events(conn, [eventmsgs.now_event(type_, source, "engine", **data)])[0].id
    finally:
        conn.close()


def promote(paths: Paths, *, deploy: bool = False, typecheck: list[str] | None = None,
            source: str = "pulsectl", message: str | None = None, again: bool = False) -> Change:
    """Merge staging into main behind the promote checks. deploy: staging must already be committed.

    The merge commit's tree is staging's committed tree, exactly: what passed the checks in
    staging is what runs. (A plain merge would let a rollback's revert on main win, and drop
    files staging still has.)"""
    with locked(paths):
        if git(paths.engine, "status", "--porcelain"):
            raise EngineDirError("main", "the main engine tree has uncommitted changes; promote only from staging")
        dirty = git(paths.staging, "status", "--porcelain")
        if dirty and deploy:
            raise EngineDirError("staging", "deploy takes a committed staging tree; commit or use promote")
        if dirty:
            git(paths.staging, "add", "-A")
            git(paths.staging, "commit", "-q", "-m", message or "staging: changes to promote")
        try:
            if not again:
                refuse_rolled_back(paths)
            return _promote(paths, typecheck, source, message)
        except EngineDirError:
            if dirty:       # refused: staging as it was, its changes uncommitted again
                git(paths.staging, "reset", "-q", "--soft", "HEAD~1")
                git(paths.staging, "reset", "-q")
            raise


def _promote(paths: Paths, typecheck: list[str] | None, source: str, message: str | None) -> Change:
    """Merge committed staging into main behind the checks (the engine lock is held)."""
    before = head(paths.engine)
    staged = head(paths.staging)
    if is_ancestor(paths.engine, staged, before):
        raise EngineDirError("staging", "nothing to promote: staging has no commits main lacks")
    import tempfile  # with random, ~2 ms: only a promote
    with tempfile.TemporaryDirectory(prefix="pulse-candidate-") as tmp:
        candidate = Path(tmp) / "engine"
        git(paths.engine, "worktree", "add", "-q", "--detach", str(candidate), before)
        try:
            merge = procs.run_git(candidate, "merge", "-q", "--no-ff", "--no-commit", "-s", "ours", staged)
            if merge.returncode != 0:
                raise EngineDirError("merge", (merge.stdout.strip() or merge.stderr.strip())[:500])
            git(candidate, "read-tree", "-u", "--reset", staged)     # the tree: staging's, exactly
            git(candidate, "commit", "-q", "--allow-empty", "-m", message or f"promote staging {staged[:12]}")
            checks = promote_checks(candidate, typecheck)
            after = head(candidate)
        finally:
            git(paths.engine, "worktree", "remove", "--force", str(candidate), check=False)
            git(paths.engine, "worktree", "prune", check=False)
    git(paths.engine, "merge", "-q", "--ff-only", after)
    ref = snapshot(paths, after)
    event_id = _record(paths, eventmsgs.EventType.PROMOTE, source, before=before, after=after, staging=staged, snapshot=ref,
                       checks=checks)
    return Change("promote", before, after, ref, event_id)


# -- what staging still holds after a rollback ------------------------------------------
# A rollback (survival's autoRollback most of all) returns main to an earlier tree, but staging
# keeps the tree that was rolled back: nothing said so, and the next promote shipped it again.

def rolled_back_in_staging(paths: Paths) -> tuple[eventmsgs.Event, list[str]] | None:
    """The last rollback, when it is the engine's latest change, and the files it undid that
    staging's committed tree still holds as they were rolled back (None when there are none:
    staging was fixed, or dropped). A new commit in staging that keeps the broken file is caught
    too: that is how it used to ship again."""
    try:
        conn = connection.open_readonly(paths.events_db)
    except connection.StoreError:
        return None
    try:
        changes = eventsdb.read_events(conn, types=[eventmsgs.EventType.PROMOTE, eventmsgs.EventType.ROLLBACK])
    finally:
        conn.close()
    if not changes or changes[-1].type != eventmsgs.EventType.ROLLBACK or not changes[-1].data.get("before"):
        return None
    last = changes[-1]
    rolled, now = last.data["before"], last.data.get("after") or "HEAD"
    undone = procs.run_git(paths.engine, "diff", "--name-only", "--no-renames", now, rolled)
    if undone.returncode:
        return None
    held = [name for name in undone.stdout.splitlines() if name and _blob(paths, rolled, name) is not None
            and _blob(paths, rolled, name) == _blob(paths, "staging", name)]
    return (last, held) if held else None


def _blob(paths: Paths, commit: str, name: str) -> str | None:
    out = procs.run_git(paths.engine, "rev-parse", "--verify", "-q", f"{commit}:{name}")
    return out.stdout.strip() if out.returncode == 0 else None


def rolled_back_words(held: tuple[eventmsgs.Event, list[str]]) -> str:
    """"staging still holds what the rollback at 2026-12-03T10:00:00Z (autoRollback) undid: rules/x.py"."""
    event, files = held
    why = event.data.get("reason") or "no reason recorded"
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    return (f"staging still holds what the rollback at {clock.iso(event.ts, ms=False)} by {event.source} "
            f"({why}) undid: {shown}")


def refuse_rolled_back(paths: Paths) -> None:
    """A promote that would ship again what a rollback undid is refused unless asked for again."""
    held = rolled_back_in_staging(paths)
    if held is not None:
        raise EngineDirError("rolled-back", rolled_back_words(held) + "; fix or drop it in staging and promote, "
                             "or `pulsectl promote --again` to ship it as it is")


def staging_differs(paths: Paths) -> list[str]:
    """What staging's committed tree has that main's has not, as `git diff --name-status` lines
    (A added, D deleted, M modified: what a promote would change)."""
    return [line for line in git(paths.engine, "diff", "--name-status", "HEAD", "staging").splitlines() if line]


def last_promote(paths: Paths) -> eventmsgs.Event | None:
    conn = connection.open_readonly(paths.events_db)
    try:
        promotes = eventsdb.read_events(conn, types=[eventmsgs.EventType.PROMOTE])
    finally:
        conn.close()
    return promotes[-1] if promotes else None


def rollback(paths: Paths, to: str | None = None, *, source: str = "pulsectl", reason: str = "operator") -> Change:
    """Make main's tree that of `to` (default: main before the last promote), as a new commit."""
    with locked(paths):
        promoted = last_promote(paths)
        if to is None:
            if promoted is None:
                raise EngineDirError("rollback", "no promote to roll back; name a commit with --to")
            to = promoted.data["before"]
        try:
            before = head(paths.engine)
            target = git(paths.engine, "rev-parse", "--verify", f"{to}^{{commit}}")
            git(paths.engine, "read-tree", "-u", "--reset", target)
            if git(paths.engine, "status", "--porcelain"):
                git(paths.engine, "commit", "-q", "-m", f"rollback to {target[:12]} ({reason})")
            after = head(paths.engine)
            restored = None
        except EngineDirError as err:
            if procs.run_git(paths.engine, "rev-parse", "--verify", "HEAD").returncode == 0:
                raise EngineDirError("rollback", f"{to!r} is no commit of the engine's history") from None
            # git is damaged: restore the tree from the snapshot the promote kept
            ref = promoted.data.get("snapshot") if promoted and to == promoted.data["before"] else None
            snapshots = _snapshots_by_commit(paths)
            ref = snapshots.get(to, ref)
            if ref is None:
                raise EngineDirError("rollback", f"git failed ({err.reason}) and no snapshot of {to} exists") from None
            restore_snapshot(paths, ref)
            before = after = target = to
            restored = ref
        event_id = _record(paths, eventmsgs.EventType.ROLLBACK, source, before=before, after=after, to=target, reason=reason,
                           restored_snapshot=restored)
        return Change("rollback", before, after, restored, event_id)


def _snapshots_by_commit(paths: Paths) -> dict[str, str]:
    conn = connection.open_readonly(paths.events_db)
    try:
        return {e.data["after"]: e.data["snapshot"] for e in eventsdb.read_events(conn, types=[eventmsgs.EventType.PROMOTE])
                if e.data.get("snapshot")}
    finally:
        conn.close()
