"""Errors, coalesced without changing a row of the history.

A run of identical errors appends its first occurrence as an `error` event, then at most one
`error` event per error_repeat_s carrying the count since the run's previous one; in between,
the repeats are counted in `error_runs`, a mutable index like the effect queue's, so a rule that
raises every tick cannot fill the disk.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time

import msgspec

from pulse.core.wire.eventmsgs import EventType, now_event
from pulse.store.connection import Transaction
from pulse.store.eventsdb import insert_event

# -- errors ------------------------------------------------------------------------------------------
# A run of an error: its occurrences (same source, target and message), each within coalesce_s of the one
# before. Its first occurrence is an `error` event {count: 1, total: 1}; its repeats are `error` events
# too, appended at most once per repeat_s, {count: occurrences since the run's previous event, total: in
# the run so far, first_id: the run's first event, repeat: true}. Summing `count` over error events counts
# every occurrence they hold; the rest (at most repeat_s of them per run) wait in error_runs.unrecorded
# until the next occurrence, or the tick's settle_error_runs, appends them.

ENGINE_ERRORS = "source IN ('engine', 'tick') AND target LIKE 'engine%'"   # errors counted against the engine


class ErrorRun(msgspec.Struct, frozen=True):
    """One row of error_runs."""
    fingerprint: str
    source: str
    target: str | None
    message: str
    first_id: int
    last_id: int
    last_event_ts: float
    last_ts: float
    total: int
    unrecorded: int


_RUN_COLUMNS = "fingerprint, source, target, message, first_id, last_id, last_event_ts, last_ts, total, unrecorded"


def error_fingerprint(source: str, target: str | None, message: str) -> str:
    """What makes two errors identical, as a key (long enough that two different errors never share one)."""
    return hashlib.sha256("\0".join((source, str(target), message)).encode()).hexdigest()[:16]


def _error_run(conn: sqlite3.Connection, fingerprint: str) -> ErrorRun | None:
    row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM error_runs WHERE fingerprint = ?", (fingerprint,)).fetchone()
    return ErrorRun(*row) if row else None


def _save_run(conn: sqlite3.Connection, run: ErrorRun) -> None:
    conn.execute(f"INSERT OR REPLACE INTO error_runs ({_RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 msgspec.structs.astuple(run))


def _append_repeats(conn: sqlite3.Connection, run: ErrorRun, now: float) -> ErrorRun:
    """The run's unrecorded occurrences as one `error` event; the run, with nothing left unrecorded."""
    ev = insert_event(conn, now_event(EventType.ERROR, run.source, run.target, message=run.message,
                                       fingerprint=run.fingerprint, count=run.unrecorded, total=run.total,
                                       first_id=run.first_id, last_ts=run.last_ts, repeat=True))
    run = msgspec.structs.replace(run, last_id=ev.id, last_event_ts=now, unrecorded=0)
    _save_run(conn, run)
    return run


def record_error(conn: sqlite3.Connection, source: str, target: str | None, message: str,
                 coalesce_s: float = 3600, repeat_s: float = 60, now: float | None = None, **data) -> int:
    """One occurrence of an error; how many its run has had, this one included (1: the first, appended
    as an `error` event with `data`; a repeat is counted, and appended once repeat_s has passed since
    the run's last event). The one transaction reads the run, so concurrent recorders count each once."""
    fingerprint = error_fingerprint(source, target, message)
    now = time.time() if now is None else now
    with Transaction(conn):
        run = _error_run(conn, fingerprint)
        if run is not None and now - run.last_ts > coalesce_s:     # the run ended: a new one begins
            if run.unrecorded:
                _append_repeats(conn, run, now)
            run = None
        if run is None:
            ev = insert_event(conn, now_event(EventType.ERROR, source, target, dict(
                data, message=message, fingerprint=fingerprint, count=1, total=1, last_ts=now)))
            _save_run(conn, ErrorRun(fingerprint, source, target, message, first_id=ev.id, last_id=ev.id,
                                     last_event_ts=now, last_ts=now, total=1, unrecorded=0))
            return 1
        run = msgspec.structs.replace(run, last_ts=now, total=run.total + 1, unrecorded=run.unrecorded + 1)
        if now - run.last_event_ts >= repeat_s:
            _append_repeats(conn, run, now)
        else:
            _save_run(conn, run)
        return run.total


def settle_error_runs(conn: sqlite3.Connection, coalesce_s: float = 3600, repeat_s: float = 60,
                      now: float | None = None) -> int:
    """Append the repeats of every run whose last event is repeat_s old (so the count of an error that
    stopped reaches the history too), and forget the runs that ended with nothing unrecorded; how many
    events it appended. Reads first, and writes only when something is due."""
    now = time.time() if now is None else now
    due = "(unrecorded > 0 AND last_event_ts <= ?) OR (unrecorded = 0 AND last_ts < ?)"
    args = (now - repeat_s, now - coalesce_s)
    if conn.execute(f"SELECT 1 FROM error_runs WHERE {due} LIMIT 1", args).fetchone() is None:
        return 0
    with Transaction(conn):
        runs = [ErrorRun(*row) for row in conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM error_runs WHERE unrecorded > 0 AND last_event_ts <= ?", args[:1])]
        for run in runs:
            _append_repeats(conn, run, now)
        conn.execute("DELETE FROM error_runs WHERE unrecorded = 0 AND last_ts < ?", args[1:])
    return len(runs)


def error_runs(conn: sqlite3.Connection) -> list[ErrorRun]:
    """Every run error_runs holds (the ended ones until settle_error_runs forgets them)."""
    return [ErrorRun(*row) for row in conn.execute(f"SELECT {_RUN_COLUMNS} FROM error_runs ORDER BY first_id")]


def engine_errors_since(conn: sqlite3.Connection, after_id: int) -> int:
    """Occurrences of errors counted against the engine since event `after_id`: those its error events
    hold, and those still unrecorded of the runs whose last event is after it (one statement: one
    snapshot, so an occurrence moving from a run into an event is counted once)."""
    row = conn.execute(
        f"SELECT (SELECT COALESCE(SUM(json_extract(data, '$.count')), 0) FROM events "
        f"        WHERE type = 'error' AND {ENGINE_ERRORS} AND id > ?)"
        f"     + (SELECT COALESCE(SUM(unrecorded), 0) FROM error_runs WHERE {ENGINE_ERRORS} AND last_id > ?)",
        (after_id, after_id)).fetchone()
    return row[0]


def unrecorded_engine_errors(conn: sqlite3.Connection) -> int:
    """Occurrences of errors counted against the engine that no error event holds yet (see engine_errors_since)."""
    return conn.execute(f"SELECT COALESCE(SUM(unrecorded), 0) FROM error_runs WHERE {ENGINE_ERRORS}").fetchone()[0]
