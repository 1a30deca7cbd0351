"""Every SQL statement Pulse runs, and the small files it keeps beside them.

events.db is append-only and never compacted. Its schema version is
`PRAGMA user_version`; opening an older file migrates it in one transaction.

synchronous levels, and why:
- events.db, NORMAL by default: in WAL mode a commit survives a crash of any
  process; only power loss can drop the last commits. Writers whose commit must
  survive power loss (the claim of a non-idempotent effect) open with FULL.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Iterable, Sequence

from pulse.wire import Event

EVENTS_SCHEMA = 1
BUSY_TIMEOUT_MS = 5_000

_MIGRATIONS: dict[int, Sequence[str]] = {
    1: (
        """CREATE TABLE events (
               id     INTEGER PRIMARY KEY AUTOINCREMENT,
               seq    INTEGER NOT NULL,
               ts     REAL    NOT NULL,
               mono   REAL    NOT NULL,
               type   TEXT    NOT NULL,
               source TEXT    NOT NULL,
               target TEXT,
               data   TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(data))
           )""",
        "CREATE INDEX events_type_id ON events(type, id)",
        "CREATE INDEX events_target_id ON events(target, id)",
        "CREATE INDEX events_ts ON events(ts)",
    ),
}


class StoreError(Exception):
    pass


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                           check_same_thread=True)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


def _migrate(conn: sqlite3.Connection, path: Path, migrations: dict[int, Sequence[str]], latest: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > latest:
            raise StoreError(f"{path} has schema {version}; this Pulse knows up to {latest}")
        for step in range(version + 1, latest + 1):
            for statement in migrations[step]:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {latest}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def open_events(path: Path, synchronous: str = "NORMAL") -> sqlite3.Connection:
    conn = _connect(path, synchronous)
    _migrate(conn, path, _MIGRATIONS, EVENTS_SCHEMA)
    return conn


def append_events(conn: sqlite3.Connection, events: Iterable[Event]) -> list[Event]:
    """Append in one transaction; returns the events with their ids."""
    out = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        for ev in events:
            cur = conn.execute(
                "INSERT INTO events (seq, ts, mono, type, source, target, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (ev.seq, ev.ts, ev.mono, ev.type, ev.source, ev.target, json.dumps(ev.data)))
            ev.id = cur.lastrowid
            out.append(ev)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return out


def read_events(conn: sqlite3.Connection, *, after_id: int = 0, types: Sequence[str] = (),
                since_ts: float | None = None, limit: int = 10_000) -> list[Event]:
    sql = "SELECT id, seq, ts, mono, type, source, target, data FROM events WHERE id > ?"
    args: list = [after_id]
    if types:
        sql += f" AND type IN ({','.join('?' * len(types))})"
        args += list(types)
    if since_ts is not None:
        sql += " AND ts >= ?"
        args.append(since_ts)
    sql += " ORDER BY id LIMIT ?"
    args.append(limit)
    return [Event(id=r[0], seq=r[1], ts=r[2], mono=r[3], type=r[4], source=r[5], target=r[6],
                  data=json.loads(r[7])) for r in conn.execute(sql, args)]


def now_event(type: str, source: str, target: str | None = None, seq: int = 0, **data) -> Event:
    return Event(type=type, source=source, target=target, data=data, ts=time.time(),
                 mono=time.monotonic(), seq=seq)


# -- workers.json: the workers an operator stopped -------------------------------------------------

def load_stopped(path: Path) -> set[str]:
    try:
        return set(json.loads(path.read_text()).get("stopped", []))
    except FileNotFoundError:
        return set()
    except (OSError, ValueError) as err:
        raise StoreError(f"{path}: unreadable ({err}); fix or remove it") from None


def save_stopped(path: Path, stopped: set[str]) -> None:
    """Atomic: write a temporary file, fsync, rename."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump({"stopped": sorted(stopped)}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
