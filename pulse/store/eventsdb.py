"""events.db's history: appending events and reading them back, and the task-* events a task is.

events.db is append-only. Its schema version is `PRAGMA user_version`; opening an older file
migrates it in one transaction. No event row ever changes: a trigger refuses it (schema 4). Rows
leave only from the oldest end, and only in the transaction that records where they went
(pulse.store.retention: into an archive segment, or deleted when archive = false): the trigger
refuses any other delete (schema 5), and tests/test_events_append_only.py keeps such statements
out of every other source file. So a reader that has folded the events up to an id (the metrics,
the tick) has read them for good, and ids are contiguous from the first live one. The same file
holds two mutable indexes, each changed in the transaction of the event it mirrors: the effect
queue (pulse.store.effectqueue) and the error runs (pulse.store.errorruns).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Iterable, Sequence

import msgspec

from pulse.core.wire.eventmsgs import TASK_EVENTS, Event, TaskEvent, now_event  # noqa: F401  (now_event: what callers append)
from pulse.store import eventindex
from pulse.store.connection import Transaction, connect, migrate

EVENTS_SCHEMA = 5

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
        # Few indexes: every one costs each append (the bench's ≥ 100,000 events/s).
        # Time ranges need none: ids grow with time, so first_id_since() bisects them.
        "CREATE INDEX events_type_id ON events(type, id)",
    ),
    2: (
        """CREATE TABLE effects (
               id         TEXT PRIMARY KEY,
               event_id   INTEGER NOT NULL,
               kind       TEXT NOT NULL,
               target     TEXT,
               origin     TEXT NOT NULL,
               idempotent INTEGER NOT NULL,
               created    REAL NOT NULL,
               deadline   REAL NOT NULL,
               state      TEXT NOT NULL CHECK (state IN ('pending','executing','acked','failed','expired')),
               claimer    TEXT,
               pgid       INTEGER,
               body       BLOB NOT NULL
           )""",
        "CREATE INDEX effects_open ON effects(state, created) WHERE state IN ('pending', 'executing')",
        "CREATE INDEX events_error ON events(source, target, id) WHERE type = 'error'",
    ),
    # why an effect failed or expired, beside its state, so listings need not search the history
    3: ("ALTER TABLE effects ADD COLUMN why TEXT",),
    4: (
        # The history is append-only, and SQLite itself says so to anyone who tries otherwise.
        "CREATE TRIGGER events_never_change BEFORE UPDATE ON events "
        "BEGIN SELECT RAISE(ABORT, 'events.db is append-only: an event never changes'); END",
        "CREATE TRIGGER events_never_go BEFORE DELETE ON events "
        "BEGIN SELECT RAISE(ABORT, 'events.db is append-only: an event is never deleted'); END",
        # The run each distinct error is in: what record_error counts between two of its events.
        """CREATE TABLE error_runs (
               fingerprint   TEXT PRIMARY KEY,    -- of (source, target, message)
               source        TEXT NOT NULL,
               target        TEXT,
               message       TEXT NOT NULL,
               first_id      INTEGER NOT NULL,    -- the run's first error event
               last_id       INTEGER NOT NULL,    -- its latest error event
               last_event_ts REAL NOT NULL,       -- when that one was appended
               last_ts       REAL NOT NULL,       -- the latest occurrence
               total         INTEGER NOT NULL,    -- occurrences in the run
               unrecorded    INTEGER NOT NULL     -- occurrences since last_id, in no event yet
           )""",
    ),
    5: (
        # The manifest of what left the live history: one row per moved range, written in the
        # transaction that deletes it. `segment` names its file under <home>/archive (NULL: deleted,
        # archive = false, or the segment dropped past archive_max_mb); the JSON columns are what
        # readers need without opening it: counts per type, task ids, object refs, pulsed's runs.
        """CREATE TABLE history_moves (
               first_id  INTEGER PRIMARY KEY,
               last_id   INTEGER NOT NULL,
               events    INTEGER NOT NULL,
               first_ts  REAL    NOT NULL,
               last_ts   REAL    NOT NULL,
               segment   TEXT,
               sha256    TEXT,
               bytes     INTEGER NOT NULL DEFAULT 0,
               counts    TEXT    NOT NULL DEFAULT '{}',
               tasks     TEXT    NOT NULL DEFAULT '[]',
               objects   TEXT    NOT NULL DEFAULT '[]',
               runs      TEXT    NOT NULL DEFAULT '[]',
               moved_ts  REAL    NOT NULL
           )""",
        "DROP TRIGGER events_never_go",
        # An event leaves only inside a range the manifest already records as moved.
        "CREATE TRIGGER events_never_go BEFORE DELETE ON events WHEN NOT EXISTS "
        "(SELECT 1 FROM history_moves WHERE first_id <= OLD.id AND last_id >= OLD.id) "
        "BEGIN SELECT RAISE(ABORT, 'events.db is append-only: an event leaves only by a recorded move'); END",
    ),
}


def open_events(path: Path, synchronous: str = "NORMAL") -> sqlite3.Connection:
    conn = connect(path, synchronous)
    migrate(conn, path, _MIGRATIONS, EVENTS_SCHEMA)
    return conn


_json = msgspec.json.Encoder(enc_hook=str)
_json_object = msgspec.json.Decoder()


def _json_data(text: str):
    """A JSON column as Python data: msgspec reads what Pulse writes, the stdlib's more lenient reader
    anything else (a NaN)."""
    try:
        return _json_object.decode(text)
    except msgspec.DecodeError:
        import json  # only for what msgspec refuses: ~1 ms of every command that opens events.db spared
        return json.loads(text)


_INSERT_EVENT = "INSERT INTO events (seq, ts, mono, type, source, target, data) VALUES (?, ?, ?, ?, ?, ?, ?)"
_EVENT_COLUMNS = "id, seq, ts, mono, type, source, target, data"


def _event_row(ev: Event) -> tuple:
    return (ev.seq, ev.ts, ev.mono, ev.type, ev.source, ev.target, _json.encode(ev.data).decode())


def _row_event(row) -> Event:
    """A row of _EVENT_COLUMNS as an Event."""
    return Event(id=row[0], seq=row[1], ts=row[2], mono=row[3], type=row[4], source=row[5], target=row[6],
                 data=_json_data(row[7]))


def insert_event(conn: sqlite3.Connection, ev: Event) -> Event:
    """Append one event inside the caller's transaction (pulse.store.connection.transaction)."""
    ev.id = conn.execute(_INSERT_EVENT, _event_row(ev)).lastrowid
    return ev


def append_events(conn: sqlite3.Connection, events: Sequence[Event]) -> list[Event]:
    """Append in one transaction; returns the events with their ids.

    One executemany: inside BEGIN IMMEDIATE no other writer can interleave, so the
    ids are the consecutive run after the largest one before.
    """
    rows = [_event_row(ev) for ev in events]
    with Transaction(conn):
        first = last_event_id(conn) + 1
        conn.executemany(_INSERT_EVENT, rows)
    for i, ev in enumerate(events):
        ev.id = first + i
    return list(events)


def gate_facts(conn: sqlite3.Connection, after_id: int) -> list[Event]:
    """Every gate-call event after `after_id`: the facts the gate folds (pulse.gate.policy.HostLedger)."""
    rows = conn.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE type = 'gate-call' AND id > ? ORDER BY id",
                        (after_id,))
    return [_row_event(r) for r in rows]


def pulsed_committed_seq(conn: sqlite3.Connection, run: float) -> int:
    """The highest seq of pulsed's events in events.db from the run whose supervisor-started
    event is stamped `run` (its mono), or 0: where that run's event writer picks up."""
    row = conn.execute(
        "SELECT seq FROM events WHERE source = 'pulsed' AND id >= "
        "(SELECT id FROM events WHERE type = 'supervisor-started' AND source = 'pulsed' AND mono = ? "
        " ORDER BY id DESC LIMIT 1) ORDER BY id DESC LIMIT 1", (run,)).fetchone()
    if row:
        return row[0]
    # The run's start moved to the archive (a long run): the mover keeps pulsed's newest event
    # live, and that is this run's, since its start is older.
    if any(run in _json_data(runs) for (runs,) in _moves(conn, "runs")):
        row = conn.execute("SELECT seq FROM events WHERE source = 'pulsed' ORDER BY id DESC LIMIT 1").fetchone()
        return row[0] if row else 0
    return 0


def _moves(conn: sqlite3.Connection, columns: str) -> list[tuple]:
    """`columns` of every history_moves row, oldest first ([] on a file not yet migrated to schema 5:
    pulsectl reads without migrating)."""
    try:
        return conn.execute(f"SELECT {columns} FROM history_moves ORDER BY first_id").fetchall()
    except sqlite3.OperationalError:
        return []


def read_events(conn: sqlite3.Connection, *, after_id: int = 0, types: Sequence[str] = (),
                since_ts: float | None = None, limit: int = 10_000) -> list[Event]:
    sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE id > ?"
    args: list = [after_id]
    if types:
        sql += f" AND type IN ({','.join('?' * len(types))})"
        args += list(types)
    if since_ts is not None:
        args[0] = max(after_id, first_id_since(conn, since_ts) - 1)
        sql += " AND ts >= ?"
        args.append(since_ts)
    sql += " ORDER BY id LIMIT ?"
    args.append(limit)
    return [_row_event(r) for r in conn.execute(sql, args)]


def event_rows_after(conn: sqlite3.Connection, after_id: int, limit: int) -> list[tuple]:
    """(id, seq, ts, type, source, target, data) of the events after `after_id`, oldest first, at most
    `limit`, with data as stored (JSON text): the fleet outbox passes it on without decoding it."""
    return conn.execute("SELECT id, seq, ts, type, source, target, data FROM events WHERE id > ? ORDER BY id LIMIT ?",
                        (after_id, limit)).fetchall()


def events_after(conn: sqlite3.Connection, after_id: int, upto_id: int, types: Sequence[str] = (),
                 limit: int = 500) -> list[Event]:
    """The events (of `types`; every type if none) with after_id < id <= upto_id, oldest first, at most
    `limit`: what a projection folds next (pulse.store.projection; by the (type, id) index)."""
    sql, args = f"SELECT {_EVENT_COLUMNS} FROM events WHERE id > ? AND id <= ?", [after_id, upto_id]
    if types:
        sql += f" AND type IN ({','.join('?' * len(types))})"
        args += list(types)
    rows = conn.execute(sql + " ORDER BY id LIMIT ?", (*args, limit))
    data = _json_object.decode
    return [Event(id=r[0], seq=r[1], ts=r[2], mono=r[3], type=r[4], source=r[5], target=r[6], data=data(r[7]))
            for r in rows]


def last_events(conn: sqlite3.Connection, n: int, types: Sequence[str] = ()) -> list[Event]:
    """The last `n` events (of `types`, over the whole history), oldest first."""
    sql = f"SELECT {_EVENT_COLUMNS} FROM events"
    if types:
        sql += f" WHERE type IN ({','.join('?' * len(types))})"
    rows = conn.execute(sql + " ORDER BY id DESC LIMIT ?", (*types, n)).fetchall()
    return [_row_event(r) for r in reversed(rows)]


def events_between(conn: sqlite3.Connection, start_ts: float, end_ts: float) -> list[Event]:
    """Every event stamped within [start_ts, end_ts], oldest first (the report's window). The lower
    bound is found by bisection over ids, so a window at the end of a long history reads only itself."""
    first = first_id_since(conn, start_ts)
    rows = conn.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE id >= ? AND ts >= ? AND ts <= ? ORDER BY id",
                        (first, start_ts, end_ts))
    data = _json_object.decode        # msgspec's decoder: a day of events is read in one go (bench_report)
    return [Event(id=r[0], seq=r[1], ts=r[2], mono=r[3], type=r[4], source=r[5], target=r[6], data=data(r[7]))
            for r in rows]


def event_type_counts(conn: sqlite3.Connection, upto_id: int) -> dict[str, int]:
    """How many events of each type, through id `upto_id` (the metrics' starting point)."""
    return dict(conn.execute("SELECT type, COUNT(*) FROM events WHERE id <= ? GROUP BY type", (upto_id,)))


def events_of_types(conn: sqlite3.Connection, types: Sequence[str], upto_id: int) -> Iterable[Event]:
    """Every event of `types` through id `upto_id`, oldest first, read as it goes (the type index finds them)."""
    rows = conn.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE type IN ({','.join('?' * len(types))}) "
                        "AND id <= ? ORDER BY id", (*types, upto_id))
    return (_row_event(r) for r in rows)


def search_events(conn: sqlite3.Connection, *, types: Sequence[str] = (), source: str | None = None,
                  target: str | None = None, since_ts: float | None = None, text: str | None = None,
                  after_id: int = 0, before_id: int | None = None, limit: int = 200) -> list[Event]:
    """The newest `limit` events that match, over the whole history, newest first (`before_id`: of
    those older than it, a page further back). `text` is a case-insensitive substring of the type,
    source, target or data."""
    sql, args = f"SELECT {_EVENT_COLUMNS} FROM events WHERE id > ?", [after_id]
    if before_id is not None:
        sql += " AND id < ?"
        args.append(before_id)
    if since_ts is not None:
        args[0] = max(after_id, first_id_since(conn, since_ts) - 1)
        sql += " AND ts >= ?"
        args.append(since_ts)
    if types:
        sql += f" AND type IN ({','.join('?' * len(types))})"
        args += list(types)
    for column, value in (("source", source), ("target", target)):
        if value:
            sql += f" AND {column} = ?"
            args.append(value)
    if text:
        sql += " AND instr(lower(type || ' ' || source || ' ' || COALESCE(target, '') || ' ' || data), lower(?)) > 0"
        args.append(text)
    sql += " ORDER BY id DESC LIMIT ?"
    args.append(limit)
    return [_row_event(r) for r in conn.execute(sql, args)]


def search_match(*, types: Sequence[str] = (), source: str | None = None, target: str | None = None,
                 since_ts: float | None = None, text: str | None = None) -> Callable[[Event], bool]:
    """search_events' filters as a test of one event (the archived events, which SQL cannot see)."""
    wanted, needle = frozenset(types), (text or "").lower()

    def match(ev: Event) -> bool:
        return ((not wanted or ev.type in wanted) and (not source or ev.source == source)
                and (not target or ev.target == target) and (since_ts is None or ev.ts >= since_ts)
                and (not needle or needle in f"{ev.type} {ev.source} {ev.target or ''} "
                                             f"{_json.encode(ev.data).decode()}".lower()))
    return match


def event_by_id(conn: sqlite3.Connection, event_id: int) -> Event | None:
    row = conn.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE id = ?", (event_id,)).fetchone()
    return _row_event(row) if row else None


def effect_end(conn: sqlite3.Connection, effect_id: str) -> Event | None:
    """The event that ended an effect (acked, failed not requeued, expired), or None while it is open."""
    row = conn.execute(
        f"SELECT {_EVENT_COLUMNS} FROM events WHERE id > (SELECT event_id FROM effects WHERE id = ?) "
        "AND type IN ('effect-acked', 'effect-failed', 'effect-expired') AND json_extract(data, '$.effect_id') = ? "
        "AND json_extract(data, '$.requeued') IS NOT 1 ORDER BY id DESC LIMIT 1", (effect_id, effect_id)).fetchone()
    return _row_event(row) if row else None


def effect_facts(conn: sqlite3.Connection, effect_id: str, type_: str) -> list[dict]:
    """The data of every event of `type_` about one effect (its data's effect_id), oldest first: the
    steps it recorded as done (a channel that took a notification). Read from the effect's own
    commit on, by the (type, id) index."""
    rows = conn.execute(
        "SELECT data FROM events WHERE type = ? AND id > (SELECT event_id FROM effects WHERE id = ?) "
        "AND json_extract(data, '$.effect_id') = ? ORDER BY id", (type_, effect_id, effect_id))
    return [_json_data(r[0]) for r in rows]


def first_id_since(conn: sqlite3.Connection, ts: float) -> int:
    """The first live event id stamped at or after `ts`, by bisection over ids (events leave only
    from the oldest end, so live ids are contiguous and grow with time; a wall-clock jump back
    makes this a little early, and the ts filter in read_events keeps the result right)."""
    lo, hi = eventindex.first_live_id(conn), last_event_id(conn) + 1
    while lo < hi:
        mid = (lo + hi) // 2
        row = conn.execute("SELECT ts FROM events WHERE id = ?", (mid,)).fetchone()
        if row is not None and row[0] < ts:
            lo = mid + 1
        else:
            hi = mid
    return lo


def last_event_id(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]


# -- objects/ references -----------------------------------------------------------------------------

_OBJECT_REF = r"sha256:([0-9a-f]{64})"   # compiled at first use (re caches it)


def referenced_objects(conn: sqlite3.Connection) -> set[str]:
    """Every blob an event names (as "sha256:<hex>"), live or in an archive segment."""
    out: set[str] = set()
    for (data,) in conn.execute("SELECT data FROM events WHERE data LIKE '%sha256:%'"):
        out.update(re.findall(_OBJECT_REF, data))
    for (refs,) in _moves(conn, "objects"):
        out.update(_json_data(refs))
    return out


def object_refs(data: str) -> list[str]:
    """The blobs one event's data (as JSON text) names."""
    return re.findall(_OBJECT_REF, data) if "sha256:" in data else []


# -- tasks -------------------------------------------------------------------------------------------
# A task is its task-* events (target = the task id). The transition table lives in pulse.agents.tasks;
# these functions run it inside the transaction that appends, so a check and its write are one.

def _task_type_clause() -> str:
    return f"type IN ({','.join('?' * len(TASK_EVENTS))})"


def task_events(conn: sqlite3.Connection, after_id: int = 0, limit: int = 10_000) -> list[Event]:
    """Every task-* event after `after_id`, oldest first (by the (type, id) index)."""
    return read_events(conn, after_id=after_id, types=TASK_EVENTS, limit=limit)


def task_history(conn: sqlite3.Connection, task: str) -> list[Event]:
    """The task-* events of one task, oldest first, archived ones too (pulse.store.archive raises
    SegmentError if a segment that holds some fails its checksum)."""
    rows = conn.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE {_task_type_clause()} AND target = ? ORDER BY id",
                        (*TASK_EVENTS, task))
    live = [_row_event(r) for r in rows]
    if live and live[0].type == TaskEvent.CREATED:
        return live         # a task's events leave from its first: all of them are live
    return _archived_task_history(conn, task) + live


def _archived_task_history(conn: sqlite3.Connection, task: str) -> list[Event]:
    from pulse.store import archive  # only a read that reaches into archive/
    return archive.task_history(conn, task)


def append_task_events(conn: sqlite3.Connection, task: str,
                       decide: Callable[[list[Event]], Sequence[Event]]) -> list[Event]:
    """Check-and-append in one BEGIN IMMEDIATE transaction: `decide(history)` sees the task's
    committed events and returns the events to append, or raises (and nothing is written)."""
    with Transaction(conn):
        new = list(decide(task_history(conn, task)))
        for ev in new:
            insert_event(conn, ev)
    return new


def create_task_event(conn: sqlite3.Connection, make: Callable[[int], Event]) -> Event:
    """Append the task-created event `make(n)` returns, n being the next task number, allocated
    inside the transaction (events are never deleted, so the count only grows)."""
    with Transaction(conn):
        return insert_event(conn, make(next_task_number(conn)))


def next_task_number(conn: sqlite3.Connection) -> int:
    """The number of the next task, inside the caller's transaction (those moved out count too)."""
    moved = sum(n or 0 for (n,) in _moves(conn, f"""json_extract(counts, '$."{TaskEvent.CREATED}"')"""))
    return conn.execute("SELECT COUNT(*) FROM events WHERE type = 'task-created'").fetchone()[0] + moved + 1


# -- a task's gate calls (the task page, `pulsectl task show`) ------------------------------------------

def gate_events_of_task(conn: sqlite3.Connection, task: str, limit: int = 500) -> list[Event]:
    """The gate-call and gate-blocked events of the gate sessions opened for `task` (a session's
    "open" fact names its task; its other events have the session as target), oldest first."""
    archived = [] if _has_live_start(conn, task) else _archived_gate_events(conn, task)
    sessions = [r[0] for r in conn.execute(
        "SELECT DISTINCT target FROM events WHERE type = 'gate-call' AND json_extract(data, '$.phase') = 'open' "
        "AND json_extract(data, '$.task') = ?", (task,))]
    sessions += sorted({e.target for e in archived if e.target})
    if not sessions:
        return archived[-limit:]
    marks = ",".join("?" * len(sessions))
    rows = conn.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE type IN ('gate-call', 'gate-blocked') "
                        f"AND target IN ({marks}) ORDER BY id DESC LIMIT ?", (*sessions, limit)).fetchall()
    return (archived + [_row_event(r) for r in reversed(rows)])[-limit:]


def _archived_gate_events(conn: sqlite3.Connection, task: str) -> list[Event]:
    from pulse.store import archive  # only a read that reaches into archive/ (zstandard, hashlib: ~5 ms)
    return archive.gate_events_of_sessions(conn, task)


def _has_live_start(conn: sqlite3.Connection, task: str) -> bool:
    """Whether a task's task-created event is live (then so is every later event of it)."""
    return conn.execute("SELECT 1 FROM events WHERE type = 'task-created' AND target = ? LIMIT 1",
                        (task,)).fetchone() is not None
