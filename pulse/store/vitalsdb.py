"""vitals.db: the latest samples of every sensor, kept for [store] retention, collected in batches.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Iterable, Sequence

from pulse.core.wire.enginerpc import Vital
from pulse.store.connection import Transaction, connect, migrate

VITALS_SCHEMA = 1

_VITALS_MIGRATIONS: dict[int, Sequence[str]] = {
    1: (
        """CREATE TABLE vitals (
               id   INTEGER PRIMARY KEY,
               key  TEXT NOT NULL,
               ts   REAL NOT NULL,
               data TEXT NOT NULL CHECK (json_valid(data))
           )""",
        "CREATE INDEX vitals_key_ts ON vitals(key, ts)",   # latest per key; the last minute of a key
        "CREATE INDEX vitals_ts ON vitals(ts)",            # garbage collection by age
    ),
}


# -- vitals.db ---------------------------------------------------------------------------------------

def open_vitals(path: Path) -> sqlite3.Connection:
    conn = connect(path, "NORMAL")
    migrate(conn, path, _VITALS_MIGRATIONS, VITALS_SCHEMA)
    return conn


def append_vitals(conn: sqlite3.Connection, vitals: Iterable[Vital]) -> None:
    with Transaction(conn):
        conn.executemany("INSERT INTO vitals (key, ts, data) VALUES (?, ?, ?)",
                         [(v.key, v.ts, json.dumps(v.data, default=str)) for v in vitals])


def _key_clause(patterns: Sequence[str]) -> tuple[str, list[str]]:
    parts, args = [], []
    for p in patterns:
        if p.endswith("*"):
            parts.append("(key >= ? AND key < ?)")
            prefix = p[:-1]
            args += [prefix, prefix + "\U0010ffff"]
        else:
            parts.append("key = ?")
            args.append(p)
    return " OR ".join(parts) or "0", args


def latest_vitals(conn: sqlite3.Connection, patterns: Sequence[str]) -> dict[str, Vital]:
    """The newest vital of each key matching `patterns` (exact keys, or prefixes ending in *)."""
    clause, args = _key_clause(patterns)
    rows = conn.execute(
        f"SELECT key, ts, data FROM vitals AS v WHERE ({clause}) AND ts = "
        "(SELECT MAX(ts) FROM vitals WHERE key = v.key) GROUP BY key", args)
    return {r[0]: Vital(r[0], r[1], json.loads(r[2])) for r in rows}


def vitals_window(conn: sqlite3.Connection, key: str, since_ts: float) -> list[Vital]:
    rows = conn.execute("SELECT key, ts, data FROM vitals WHERE key = ? AND ts >= ? ORDER BY ts", (key, since_ts))
    return [Vital(r[0], r[1], json.loads(r[2])) for r in rows]


def gc_vitals(conn: sqlite3.Connection, older_than_ts: float, batch: int = 5_000) -> int:
    """Delete old vitals in small transactions, so writers never wait long."""
    total = 0
    while True:
        n = gc_vitals_step(conn, older_than_ts, batch)
        total += n
        if n < batch:
            return total


def gc_vitals_step(conn: sqlite3.Connection, older_than_ts: float, batch: int = 1_000) -> int:
    """One short transaction of vitals gc: deletes at most `batch` rows older than `older_than_ts`.

    The caller paces the steps (the watcher pauses between them), so a writer in another
    process (the engine's watchers) gets the lock in between instead of waiting out a whole gc."""
    with Transaction(conn):
        return conn.execute("DELETE FROM vitals WHERE id IN (SELECT id FROM vitals WHERE ts < ? LIMIT ?)",
                            (older_than_ts, batch)).rowcount


def tick_durations(conn: sqlite3.Connection, after_row: int) -> list[tuple[int, float]]:
    """(row, duration_ms) of every tick the tick recorded after `after_row` (its vitals)."""
    return list(conn.execute("SELECT id, json_extract(data, '$.duration_ms') FROM vitals WHERE key = 'tick' AND id > ? "
                             "AND json_extract(data, '$.duration_ms') IS NOT NULL ORDER BY id", (after_row,)))


def vitals_keys(conn: sqlite3.Connection) -> list[str]:
    """Each key vitals.db holds (a skip scan of the key index: one step per key)."""
    out, last = [], ""
    while (row := conn.execute("SELECT key FROM vitals WHERE key > ? ORDER BY key LIMIT 1", (last,)).fetchone()):
        last = row[0]
        out.append(last)
    return out


def vitals_buckets(conn: sqlite3.Connection, key: str, since_ts: float, bucket_s: float) -> list[tuple[float, dict]]:
    """One sample of `key` per `bucket_s` since `since_ts` (the last of each bucket), oldest first:
    downsampled in SQLite, so a week of samples reaches the page as a few hundred points."""
    rows = conn.execute("SELECT MAX(ts), data FROM vitals WHERE key = ? AND ts >= ? GROUP BY CAST(ts / ? AS INTEGER) "
                        "ORDER BY 1", (key, since_ts, bucket_s))
    return [(ts, json.loads(data)) for ts, data in rows]


def recent_vitals(conn: sqlite3.Connection, key: str, n: int, since_ts: float | None = None) -> list[Vital]:
    """The last `n` samples of `key` (of those since `since_ts`, if given), oldest first: for rules that
    count failures in a row, and for a trend over a window."""
    rows = conn.execute("SELECT key, ts, data FROM vitals WHERE key = ? AND ts >= ? ORDER BY ts DESC LIMIT ?",
                        (key, float("-inf") if since_ts is None else since_ts, n))
    return [Vital(r[0], r[1], json.loads(r[2])) for r in rows][::-1]
