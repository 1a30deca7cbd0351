"""The fleet outbox's cursor: the last event of events.db the PULSE_EVENTS stream acknowledged.

events.db is the outbox and stays append-only; the cursor lives in its own small file
(fleet-cursor.db in the home), written only by the fleet worker, at synchronous=FULL so a cursor
once committed survives power loss. It is moved only after the stream acknowledged every event up
to it, so a crash between the two republishes a few events, which the stream drops by Nats-Msg-Id.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from pulse.store.connection import connect, migrate

CURSOR_SCHEMA = 3
_MIGRATIONS = {
    1: ("CREATE TABLE cursor (stream TEXT PRIMARY KEY, last_id INTEGER NOT NULL)",),
    # the fleet tasks this host took: a restarted worker takes up its own claim's task, not a copy
    2: ("CREATE TABLE fleet_tasks (fleet_id TEXT PRIMARY KEY, task TEXT NOT NULL)",),
    # the taking in progress (JSON: the message's reply subject, origin, agent, attempts, offer; NULL
    # once it ended): a restarted worker renews and acknowledges it instead of leaving it to lapse
    3: ("ALTER TABLE fleet_tasks ADD COLUMN taking TEXT",),
}


def open_cursor(path: Path) -> sqlite3.Connection:
    conn = connect(path, "FULL")
    migrate(conn, path, _MIGRATIONS, CURSOR_SCHEMA)
    return conn


def read_cursor(conn: sqlite3.Connection, stream: str) -> int:
    row = conn.execute("SELECT last_id FROM cursor WHERE stream = ?", (stream,)).fetchone()
    return row[0] if row else 0


def commit_cursor(conn: sqlite3.Connection, stream: str, last_id: int) -> None:
    conn.execute("INSERT INTO cursor (stream, last_id) VALUES (?, ?) "
                 "ON CONFLICT(stream) DO UPDATE SET last_id = excluded.last_id", (stream, last_id))


def task_of(conn: sqlite3.Connection, fleet_id: str) -> str | None:
    row = conn.execute("SELECT task FROM fleet_tasks WHERE fleet_id = ?", (fleet_id,)).fetchone()
    return row[0] if row else None


def remember_task(conn: sqlite3.Connection, fleet_id: str, task: str) -> None:
    conn.execute("INSERT OR REPLACE INTO fleet_tasks (fleet_id, task) VALUES (?, ?)", (fleet_id, task))


def remember_taking(conn: sqlite3.Connection, fleet_id: str, taking: dict) -> None:
    conn.execute("UPDATE fleet_tasks SET taking = ? WHERE fleet_id = ?", (json.dumps(taking), fleet_id))


def end_taking(conn: sqlite3.Connection, fleet_id: str) -> None:
    conn.execute("UPDATE fleet_tasks SET taking = NULL WHERE fleet_id = ?", (fleet_id,))


def open_takings(conn: sqlite3.Connection) -> dict[str, tuple[str, dict]]:
    """fleet id → (this host's task, its taking) for every taking not ended."""
    rows = conn.execute("SELECT fleet_id, task, taking FROM fleet_tasks WHERE taking IS NOT NULL")
    return {fleet_id: (task, json.loads(taking)) for fleet_id, task, taking in rows}


def taken_tasks(path) -> dict[str, str]:
    """fleet id → this host's task, read only (the web's fleet page): {} before the fleet worker made the file."""
    if not Path(path).exists():
        return {}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    try:
        return dict(conn.execute("SELECT fleet_id, task FROM fleet_tasks"))
    except sqlite3.OperationalError:    # a file of schema 1, before fleet_tasks
        return {}
    finally:
        conn.close()
