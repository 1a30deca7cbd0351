"""Making a home and checking it before pulsed starts: what is missing is made, a damaged store
is refused with what to do, never written, truncated or replaced. Here, above the stores, so
that pulse.core.home (which every process imports) knows the home's layout and nothing of SQLite;
pulsed runs this in a short-lived child, `pulsectl init` and `pulsectl check-store` directly.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import msgspec

from pulse.core import config as configmod
from pulse.core import procs
from pulse.core.home import HomeError, Paths, write_web_token
from pulse.store import connection, eventsdb, vitalsdb


def _git(cwd: Path, *args: str) -> None:
    try:
        procs.git(cwd, *args)
    except procs.GitError as err:
        raise HomeError(f"in {cwd}: {err}") from None


def _copy_template(dest: Path) -> None:
    import shutil  # with importlib.resources, ~6 ms: init alone copies the template; pulsed and store check read
    from importlib import resources
    template = resources.files("pulse.engine") / "template"
    with resources.as_file(template) as src:
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)


def check_home(paths: Paths) -> list[str]:
    """What keeps pulsed from starting on this home, one line each: the file, what is wrong, what to
    do. Reads only: a damaged store is never written, truncated or replaced."""
    if paths.home.exists() and not os.access(paths.home, os.W_OK | os.X_OK):
        return [f"{paths.home} is read-only (file or file system); pulsed must be able to write its home"]
    problems = [f"{path} {problem}" for path, latest in ((paths.events_db, eventsdb.EVENTS_SCHEMA),
                                                         (paths.vitals_db, vitalsdb.VITALS_SCHEMA))
                if (problem := connection.store_problem(path, latest))]
    if paths.objects.exists() and not os.access(paths.objects, os.W_OK | os.X_OK):
        problems.append(f"{paths.objects}/ is not writable; pulsed must be able to write it")
    return problems or _history_problem(paths)


def _history_problem(paths: Paths) -> list[str]:
    """events.db replaced by an empty or new file, or rewound behind the events this home had."""
    try:
        mark = msgspec.json.decode(paths.history_mark.read_bytes())
    except (OSError, ValueError):
        return []
    had = int(mark.get("events", 0))
    holds = 0
    if paths.events_db.exists():
        conn = connection.open_readonly(paths.events_db)
        try:
            holds = eventsdb.last_event_id(conn)
        except sqlite3.OperationalError:       # a database, but not Pulse's: no events table
            holds = 0
        finally:
            conn.close()
    if holds >= had:
        return []
    return [f"{paths.events_db} holds {holds} events, but this home had {had} when pulsed last started: "
            f"its history was replaced or rewound. Put the right file back; to start from this one on "
            f"purpose, delete {paths.history_mark}"]


def mark_history(paths: Paths) -> None:
    """Record how many events events.db holds now (written whole, then renamed into place)."""
    conn = connection.open_readonly(paths.events_db)
    try:
        events = eventsdb.last_event_id(conn)
    finally:
        conn.close()
    write_history_mark(paths.history_mark, events)


def write_history_mark(mark: Path, events: int) -> None:
    """`events`, the count _history_problem compares events.db against, at `mark`: written whole, then
    renamed into place (a home's, or a backup's beside its copy)."""
    tmp = mark.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode({"events": events}) + b"\n")
    os.replace(tmp, mark)


def home_is_complete(paths: Paths) -> bool:
    """Everything ensure_home() makes is there (the stores migrate themselves when opened)."""
    return all(p.exists() for p in (paths.config, paths.events_db, paths.vitals_db, paths.home / "objects",
                                    paths.logs, paths.engine / ".git", paths.staging, paths.web_token))


def ensure_home(home: Path) -> list[str]:
    """Create whatever of the home is missing; returns what it made. Idempotent."""
    made: list[str] = []
    if not home.exists():
        home.mkdir(mode=0o700, parents=True)
        made.append(f"{home}/")
    paths = Paths.for_daemon(home)
    if not paths.config.exists():
        fd = os.open(paths.config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(configmod.default_toml())
        made.append(str(paths.config))
    if not paths.web_token.exists():
        write_web_token(paths)
        made.append(str(paths.web_token))
    for folder in (home / "objects", paths.logs):
        if not folder.exists():
            folder.mkdir(mode=0o700)
            made.append(f"{folder}/")
    # Every store is made here, before any worker opens it: workers that create the same new file
    # at once race for its switch to WAL, and SQLite refuses the loser without waiting.
    for store, open_store in ((paths.events_db, eventsdb.open_events), (paths.vitals_db, vitalsdb.open_vitals)):
        if not store.exists():
            made.append(str(store))
        open_store(store).close()
    if not (paths.engine / ".git").exists():
        paths.engine.mkdir(exist_ok=True)
        _copy_template(paths.engine)
        _git(paths.engine, "init", "-q", "-b", "main")
        _git(paths.engine, "add", "-A")
        _git(paths.engine, "commit", "-q", "-m", "engine: initial template")
        made.append(f"{paths.engine}/ (git, branch main)")
    if not paths.staging.exists():
        _git(paths.engine, "worktree", "prune")
        branch = procs.run_git(paths.engine, "rev-parse", "--verify", "-q", "refs/heads/staging").returncode == 0
        _git(paths.engine, "worktree", "add", "-q", *([] if branch else ["-b", "staging"]),
             str(paths.staging), *(["staging"] if branch else []))
        made.append(f"{paths.staging}/ (git worktree, branch staging)")
    return made
