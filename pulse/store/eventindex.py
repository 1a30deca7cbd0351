"""Reads of events.db that decode no event, and so need no msgspec (`pulsectl status` runs in loops):
which events are still live, when one was appended, which of some types came last."""

from __future__ import annotations

import sqlite3
from typing import Sequence


def first_live_id(conn: sqlite3.Connection) -> int:
    """The oldest event still in events.db (those before it moved to the archive), or 1 if none is."""
    return conn.execute("SELECT COALESCE(MIN(id), 1) FROM events").fetchone()[0]


def event_ts(conn: sqlite3.Connection, event_id: int) -> float | None:
    """When event `event_id` was appended, or None if there is none: which history a checkpoint is of."""
    row = conn.execute("SELECT ts FROM events WHERE id = ?", (event_id,)).fetchone()
    return row[0] if row else None


def last_type(conn: sqlite3.Connection, types: Sequence[str]) -> str | None:
    """Which of `types` the last event of any of them has, or None if there is none."""
    row = conn.execute(f"SELECT type FROM events WHERE type IN ({','.join('?' * len(types))}) ORDER BY id DESC LIMIT 1",
                       tuple(types)).fetchone()
    return row[0] if row else None
