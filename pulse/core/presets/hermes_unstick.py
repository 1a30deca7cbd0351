"""The hermes-gateway preset's way out of a crash loop (`on_crash_loop`): have Hermes set aside, at its
next start, the sessions it would resume.

Hermes resumes a session interrupted by a restart at its next start ("resume_pending"). When that
session is what kills it, every restart crashes again. Hermes' own way out is its stuck-loop
counter: at startup it suspends each session that `$HERMES_HOME/.restart_failure_counts` counts
active across 3 restarts (the user then gets a fresh session; the transcript stays in state.db).
But Hermes counts only at a graceful stop, so a gateway that crashes never reaches 3. This marks
every session Hermes would resume (its routing index: the gateway_routing table of state.db, and
the sessions.json mirror) as having reached it; Hermes does the rest at the start Pulse gives it
after this. Nothing of Hermes' is deleted or rewritten but that counter file.

Run by Pulse as the gateway's account, with its environment (HERMES_HOME, else HOME/.hermes), while
the gateway is held down. Tested on Hermes Agent 0.19.0 (the preset's `tested`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

STUCK_AFTER = 3                             # Hermes' _STUCK_LOOP_THRESHOLD
COUNTS = ".restart_failure_counts"          # Hermes' _STUCK_LOOP_FILE, in HERMES_HOME
MAX_READ = 16 * 1024 * 1024


def hermes_home(environ: dict) -> Path:
    if environ.get("HERMES_HOME"):
        return Path(environ["HERMES_HOME"])
    return Path(environ.get("HOME") or os.path.expanduser("~")) / ".hermes"


def resumable(entry: object) -> bool:
    return isinstance(entry, dict) and bool(entry.get("resume_pending")) and not entry.get("suspended")


def from_state_db(path: Path) -> set[str]:
    """The keys of the sessions Hermes' routing index (state.db) marks to be resumed."""
    if not path.is_file():
        return set()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute("SELECT session_key, entry_json FROM gateway_routing").fetchall()
    except sqlite3.DatabaseError:
        return set()                # no routing table yet: nothing routed, nothing to resume
    finally:
        conn.close()
    keys = set()
    for key, entry_json in rows:
        try:
            if resumable(json.loads(entry_json)):
                keys.add(key)
        except (TypeError, ValueError):
            continue
    return keys


def from_mirror(path: Path) -> set[str]:
    """The same from the sessions.json mirror (an older gateway's, or one the table lacks)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(MAX_READ))
    except (OSError, ValueError):
        return set()
    return {k for k, v in data.items() if resumable(v)} if isinstance(data, dict) else set()


def counts_of(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int)} if isinstance(data, dict) else {}


def write_atomically(path: Path, data: dict) -> None:
    tmp = path.with_name(f"{path.name}.pulse-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def unstick(home: Path) -> list[str]:
    """Mark every session Hermes would resume as stuck; the keys marked."""
    keys = sorted(from_state_db(home / "state.db") | from_mirror(home / "sessions" / "sessions.json"))
    if keys:
        counts = counts_of(home / COUNTS)
        counts.update({k: max(counts.get(k, 0), STUCK_AFTER) for k in keys})
        write_atomically(home / COUNTS, counts)
    return keys


def main(environ: dict | None = None) -> int:
    home = hermes_home(dict(os.environ if environ is None else environ))
    if not home.is_dir():
        print(f"no Hermes home at {home} (HERMES_HOME, else ~/.hermes): nothing to set aside", file=sys.stderr)
        return 1
    keys = unstick(home)
    if keys:
        print(f"Hermes suspends at its next start the {len(keys)} session(s) it would resume "
              f"(marked stuck in {home / COUNTS}): {', '.join(keys)}")
    else:
        print(f"no session of {home} is waiting to be resumed: its crash loop is not a stuck session")
    return 0


if __name__ == "__main__":
    sys.exit(main())
