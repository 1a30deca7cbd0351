"""How large the history is against its bounds: a line of `pulsectl status`, the page, /metrics.

Apart from pulse.store.retention, which moves events out, because every `pulsectl status` reads it:
retention's own imports (logging, dataclasses, the mover's machinery) were ~20 ms of a command that
has 50.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from pulse.store import eventindex

if TYPE_CHECKING:
    from pulse.core import config as configmod

MIB = 1024 * 1024

# [store]'s keys that bound the history, said beside its size. pulsed sends its [store] in its status
# reply (controlmsgs.Reply.store), so that `pulsectl status` need not load the config to say them.
BOUNDS = ("max_mb", "keep_days", "keep_free_mb", "archive", "archive_max_mb")


def bounds(store: configmod.Store | None) -> dict | None:
    """[store]'s bounds on the history, as plain data (summary's `bounds`); None: not known."""
    return None if store is None else {key: getattr(store, key) for key in BOUNDS}


def live_bytes(conn: sqlite3.Connection) -> int:
    """The bytes events.db's pages in use hold (freed pages are reused by new events: the file does
    not shrink, it stops growing)."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
    return pages * conn.execute("PRAGMA page_size").fetchone()[0]


def archive_totals(conn: sqlite3.Connection) -> dict:
    """What left the live history: events moved (archived or deleted), segments, the archive's bytes
    (one aggregate over the manifest: the page asks several times a second)."""
    try:
        row = conn.execute("SELECT COALESCE(SUM(events), 0), COALESCE(SUM(CASE WHEN segment IS NULL THEN 0 ELSE events END), 0), "
                           "COUNT(segment), COALESCE(SUM(bytes), 0), MIN(CASE WHEN segment IS NULL THEN NULL ELSE first_ts END) "
                           "FROM history_moves").fetchone()
    except sqlite3.OperationalError:
        row = (0, 0, 0, 0, None)
    return {"moved_events": row[0], "archived_events": row[1], "segments": row[2], "archive_bytes": row[3],
            "oldest_archived_ts": row[4]}


def summary(conn: sqlite3.Connection, bounds: dict | None) -> dict:
    """The history's size against its bounds (status, the page, /metrics): cheap, the manifest and
    three PRAGMAs. `bounds`: [store]'s bounds in force (bounds(), or the whole table as plain data),
    or None if unknown."""
    totals = archive_totals(conn)
    first = eventindex.first_live_id(conn)
    out = {"live_bytes": live_bytes(conn), "first_live_id": first, "oldest_live_ts": eventindex.event_ts(conn, first),
           **totals}
    if bounds is not None:
        out.update({key: bounds[key] for key in BOUNDS})
    return out


def summary_words(h: dict) -> str:
    """One line of it: "history: 312.4 MiB live of 512 MiB (events since 2026-11-05), archive 40.1 MiB of 2048 MiB
    (1,204,000 events moved)"."""
    from pulse.core import clock  # only for the words: /metrics and the page read the figures alone
    line = f"history: {h['live_bytes'] / MIB:.1f} MiB live"
    if h.get("max_mb"):
        line += f" of {h['max_mb']:g} MiB"
    if h.get("oldest_live_ts"):
        line += f" (events since {clock.iso(h['oldest_live_ts'])[:10]}"
        line += f", keep_days = {h['keep_days']:g})" if h.get("keep_days") else ")"
    if h["moved_events"]:
        line += f", archive {h['archive_bytes'] / MIB:.1f} MiB"
        if h.get("archive_max_mb"):
            line += f" of {h['archive_max_mb']:g} MiB"
        line += f" ({h['moved_events']:,} events moved)"
    return line
