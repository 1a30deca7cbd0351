"""Every SQL statement Pulse runs.

events.db is append-only and never compacted. Its schema version is
`PRAGMA user_version`; opening an older file migrates it in one transaction.

synchronous levels, and why:
- events.db, NORMAL by default: in WAL mode a commit survives a crash of any
  process; only power loss can drop the last commits. The executor opens it
  FULL: the claim of a non-idempotent effect must survive power loss, or the
  effect could run twice.
- vitals.db, NORMAL: samples are replaced every few seconds; losing the last
  ones to power loss costs nothing.

Effects live in events.db as events (effect, effect-executing, effect-acked,
effect-failed, effect-expired) plus one mutable row per effect in `effects`,
the queue's index, changed in the same transaction as the event it mirrors.

No event row ever changes or goes away: triggers refuse both (schema 4), and
tests/test_events_append_only.py keeps such statements out of the source. So a
reader that has folded the events up to an id (the metrics, the tick) has read
them for good. Errors coalesce without changing a row: a run of identical errors
appends its first occurrence as an `error` event, then at most one `error` event
per error_repeat_s carrying the count since the run's previous one; in between,
the repeats are counted in `error_runs`, a mutable index like `effects` (see
record_error), so a rule that raises every tick cannot fill the disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import msgspec

from pulse.core.states import EFFECT_OPEN, EffectState
from pulse.core.wire import EFFECT_END_EVENTS, TASK_EVENTS, Effect, EffectEvent, Event, Vital, now_event

EVENTS_SCHEMA = 4
VITALS_SCHEMA = 1
# How long a statement waits for another process's write lock. A worker waiting on it does not
# heartbeat, so config requires hung_after_ms to exceed it (timings.sqlite_busy_timeout_ms; the
# harness sets it in each worker); a lock held by a frozen process stalls a writer this long at most.
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
}

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


def busy_timeout_s() -> float:
    return BUSY_TIMEOUT_MS / 1000


class StoreError(sqlite3.DatabaseError):
    """A store that cannot be used as it is; the message names the file and what to do."""


SQLITE_MAGIC = b"SQLite format 3\x00"


def unusable(err: sqlite3.DatabaseError) -> str | None:
    """What a store error says when no retry can help (damaged, not a database, read-only), in one
    line; None for the errors that pass (locked, busy, a full disk)."""
    if isinstance(err, StoreError):
        return str(err)
    if type(err) is sqlite3.DatabaseError:          # SQLITE_CORRUPT, SQLITE_NOTADB
        return f"a store is damaged ({err}); `pulsectl store check` names it. Restore it from a backup"
    if isinstance(err, sqlite3.OperationalError) and "readonly" in str(err):
        return f"a store is read-only ({err}); pulsed must be able to write its home"
    return None


def header_problem(path: Path) -> str | None:
    """What its first bytes already say is wrong with the database at `path` (cheap: every open
    asks); None if it looks like SQLite or is not made yet."""
    try:
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot be read ({err.strerror}); give the user pulsed runs as access to it"
    if not header:
        return ("is an empty file: its history is gone. Restore it from a backup (see `pulsectl store "
                "backup`), or move it away to start a new history")
    if header != SQLITE_MAGIC:
        return "is not an SQLite database (its header is damaged). Restore it from a backup, or move it away"
    return None


def store_problem(path: Path, latest: int | None = None) -> str | None:
    """What makes the database at `path` unusable, said so an operator can act on it; None if it
    is fine or not made yet. Reads only: a damaged file is never written, truncated or replaced."""
    if not path.exists():
        return None                              # not made yet: ensure_home makes it
    if problem := header_problem(path):
        return problem
    if not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
        return "is read-only (file or file system); pulsed must be able to write it and its directory"
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=busy_timeout_s())
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            found = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
        finally:
            conn.close()
    except sqlite3.DatabaseError as err:
        return f"is damaged ({err}). Restore it from a backup, or move it away"
    if found != ["ok"]:
        return f"is damaged ({'; '.join(found)}). Restore it from a backup, or move it away"
    if latest is not None and version > latest:
        return f"has schema {version}, and this Pulse knows up to {latest}: a newer Pulse wrote it"
    return None


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    if path.exists() and (problem := header_problem(path)):
        raise StoreError(f"{path} {problem}")
    conn = sqlite3.connect(path, timeout=busy_timeout_s(), isolation_level=None,
                           check_same_thread=True)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s() * 1000)}")
        # WAL is persistent: only a new file needs the switch, and pulse.store.provision.ensure_home makes every
        # store before the workers start. The switch takes a lock that SQLite refuses without waiting.
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    except sqlite3.OperationalError:
        conn.close()
        raise                                   # locked, or busy: the caller may retry
    except sqlite3.DatabaseError as err:        # not a database, or damaged: no retry helps
        conn.close()
        raise StoreError(f"{path} {store_problem(path) or err}") from None
    return conn


def _migrate(conn: sqlite3.Connection, path: Path, migrations: dict[int, Sequence[str]], latest: int) -> None:
    if conn.execute("PRAGMA user_version").fetchone()[0] == latest:
        return   # current: no write transaction, so a store opens even on a full disk
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if latest is not None and version > latest:
            raise StoreError(f"{path} has schema {version}; this Pulse knows up to {latest}")
        for step in range(version + 1, latest + 1):
            for statement in migrations[step]:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {latest}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def open_events(path: Path, synchronous: str = "NORMAL") -> sqlite3.Connection:
    conn = _connect(path, synchronous)
    _migrate(conn, path, _MIGRATIONS, EVENTS_SCHEMA)
    return conn


class _Tx:
    """`with _Tx(conn):` BEGIN IMMEDIATE … COMMIT, ROLLBACK on any error."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.conn.execute("COMMIT")
        elif self.conn.in_transaction:   # SQLite may have rolled back itself (a full disk does)
            self.conn.execute("ROLLBACK")


_json = msgspec.json.Encoder(enc_hook=str)
_json_object = msgspec.json.Decoder()
_INSERT_EVENT = "INSERT INTO events (seq, ts, mono, type, source, target, data) VALUES (?, ?, ?, ?, ?, ?, ?)"
_EVENT_COLUMNS = "id, seq, ts, mono, type, source, target, data"


def _event_row(ev: Event) -> tuple:
    return (ev.seq, ev.ts, ev.mono, ev.type, ev.source, ev.target, _json.encode(ev.data).decode())


def _row_event(row) -> Event:
    """A row of _EVENT_COLUMNS as an Event."""
    return Event(id=row[0], seq=row[1], ts=row[2], mono=row[3], type=row[4], source=row[5], target=row[6],
                 data=json.loads(row[7]))


def _insert_event(conn: sqlite3.Connection, ev: Event) -> Event:
    ev.id = conn.execute(_INSERT_EVENT, _event_row(ev)).lastrowid
    return ev


def append_events(conn: sqlite3.Connection, events: Sequence[Event]) -> list[Event]:
    """Append in one transaction; returns the events with their ids.

    One executemany: inside BEGIN IMMEDIATE no other writer can interleave, so the
    ids are the consecutive run after the largest one before.
    """
    rows = [_event_row(ev) for ev in events]
    with _Tx(conn):
        first = last_event_id(conn) + 1
        conn.executemany(_INSERT_EVENT, rows)
    for i, ev in enumerate(events):
        ev.id = first + i
    return list(events)


def transaction(conn: sqlite3.Connection) -> _Tx:
    """`with db.transaction(conn):` one BEGIN IMMEDIATE for a caller that reads, decides and writes."""
    return _Tx(conn)


def insert_event(conn: sqlite3.Connection, ev: Event) -> Event:
    """Append one event inside the caller's transaction (`transaction`)."""
    return _insert_event(conn, ev)


def gate_facts(conn: sqlite3.Connection, after_id: int) -> list[Event]:
    """Every gate-call event after `after_id`: the facts the gate folds (pulse.agents.gate.Ledger)."""
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
    return row[0] if row else 0


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
                  after_id: int = 0, limit: int = 200) -> list[Event]:
    """The newest `limit` events that match, over the whole history, newest first. `text` is a
    case-insensitive substring of the type, source, target or data."""
    sql, args = f"SELECT {_EVENT_COLUMNS} FROM events WHERE id > ?", [after_id]
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


def event_by_id(conn: sqlite3.Connection, event_id: int) -> Event | None:
    row = conn.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE id = ?", (event_id,)).fetchone()
    return _row_event(row) if row else None


def task_titles(conn: sqlite3.Connection) -> dict[str, tuple[str, str]]:
    """task id → (project, title), from every task-created event (by the (type, id) index)."""
    rows = conn.execute("SELECT target, json_extract(data, '$.project'), json_extract(data, '$.title') "
                        "FROM events WHERE type = 'task-created'")
    return {r[0]: (str(r[1] or ""), str(r[2] or "")) for r in rows if r[0]}


def effect_end(conn: sqlite3.Connection, effect_id: str) -> Event | None:
    """The event that ended an effect (acked, failed not requeued, expired), or None while it is open."""
    row = conn.execute(
        f"SELECT {_EVENT_COLUMNS} FROM events WHERE id > (SELECT event_id FROM effects WHERE id = ?) "
        "AND type IN ('effect-acked', 'effect-failed', 'effect-expired') AND json_extract(data, '$.effect_id') = ? "
        "AND json_extract(data, '$.requeued') IS NOT 1 ORDER BY id DESC LIMIT 1", (effect_id, effect_id)).fetchone()
    return _row_event(row) if row else None


def first_id_since(conn: sqlite3.Connection, ts: float) -> int:
    """The first event id stamped at or after `ts`, by bisection over ids (events are never
    deleted, so ids are contiguous and grow with time; a wall-clock jump back makes this a
    little early, and the ts filter in read_events keeps the result right)."""
    lo, hi = 1, last_event_id(conn) + 1
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
    ev = _insert_event(conn, now_event("error", run.source, run.target, message=run.message,
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
    with _Tx(conn):
        run = _error_run(conn, fingerprint)
        if run is not None and now - run.last_ts > coalesce_s:     # the run ended: a new one begins
            if run.unrecorded:
                _append_repeats(conn, run, now)
            run = None
        if run is None:
            ev = _insert_event(conn, now_event("error", source, target, dict(
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
    with _Tx(conn):
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


@contextlib.contextmanager
def read_snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """`with db.read_snapshot(conn):` the reads inside see one state of the store (one read
    transaction), so what two of them read adds up (the error events, and what error_runs still counts)."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


# -- effects -----------------------------------------------------------------------------------------

def new_effect(effect: Effect, origin: str, deadline_s: float, now: float | None = None) -> Effect:
    """Give an effect its id, times and origin (it is committed next)."""
    now = time.time() if now is None else now
    return msgspec.structs.replace(effect, id=effect.id or os.urandom(16).hex(), created=now,
                                   deadline=effect.deadline or now + deadline_s, origin=origin)


def commit_effects(conn: sqlite3.Connection, effects: Sequence[Effect], source: str,
                   events: Sequence[Event] = (), observe_only: bool = False) -> list[Effect]:
    """Commit effects (and any other events) in one transaction. observe_only: record each as
    effect-expired with reason observe-only in the same transaction, so nothing runs it."""
    with _Tx(conn):
        for ev in events:
            _insert_event(conn, ev)
        for eff in effects:
            ev = _insert_event(conn, now_event(EffectEvent.COMMITTED, source, eff.target, msgspec.to_builtins(eff)))
            conn.execute(
                "INSERT INTO effects (id, event_id, kind, target, origin, idempotent, created, deadline, state, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
                (eff.id, ev.id, eff.kind, eff.target, eff.origin, int(eff.idempotent), eff.created, eff.deadline,
                 msgspec.msgpack.encode(eff)))
            if observe_only:
                conn.execute("UPDATE effects SET state = 'expired', why = 'observe-only' WHERE id = ?", (eff.id,))
                _insert_event(conn, now_event(EffectEvent.EXPIRED, source, eff.target, effect_id=eff.id, kind=eff.kind,
                                              reason="observe-only"))
    return list(effects)


def _effect(body: bytes) -> Effect:
    return msgspec.msgpack.decode(body, type=Effect)


def open_effects(conn: sqlite3.Connection, state: str | None = None,
                 limit: int = 1000) -> list[tuple[Effect, str, str | None, int | None]]:
    """(effect, state, claimer, pgid) of effects not yet ended, oldest first."""
    states = (state,) if state else EFFECT_OPEN
    rows = conn.execute(
        f"SELECT body, state, claimer, pgid FROM effects WHERE state IN ({','.join('?' * len(states))}) "
        "ORDER BY created LIMIT ?", (*states, limit))
    return [(_effect(r[0]), r[1], r[2], r[3]) for r in rows]


def claim_effect(conn: sqlite3.Connection, effect_id: str, claimer: str, source: str) -> Effect | None:
    """pending → executing, atomically: None if someone else claimed it first."""
    with _Tx(conn):
        cur = conn.execute("UPDATE effects SET state = 'executing', claimer = ? WHERE id = ? AND state = 'pending'",
                           (claimer, effect_id))
        if cur.rowcount != 1:
            return None
        body, target = conn.execute("SELECT body, target FROM effects WHERE id = ?", (effect_id,)).fetchone()
        effect = _effect(body)
        _insert_event(conn, now_event(EffectEvent.EXECUTING, source, target, effect_id=effect_id, kind=effect.kind,
                                      claimer=claimer))
        return effect


def record_pgid(conn: sqlite3.Connection, effect_id: str, pgid: int) -> None:
    """The process group an executing effect started, so a successor can kill or await it."""
    with _Tx(conn):
        conn.execute("UPDATE effects SET pgid = ? WHERE id = ? AND state = 'executing'", (pgid, effect_id))


def _move_effect(conn: sqlite3.Connection, effect_id: str, source: str, *, where: str, args: Sequence,
                 state: str, event: str, release: bool = False, **data) -> bool:
    """One effect whose row matches `where` → `state`, with its event, in one transaction; False if
    it does not match (someone else moved it first). release: forget its claimer and process group."""
    with _Tx(conn):
        row = conn.execute(f"SELECT target, kind FROM effects WHERE id = ? AND {where}", (effect_id, *args)).fetchone()
        if row is None:
            return False
        why = data.get("error") or data.get("reason") if state != EffectState.ACKED else None
        conn.execute("UPDATE effects SET state = ?, why = ?" + (", claimer = NULL, pgid = NULL" if release else "")
                     + " WHERE id = ?", (state, why, effect_id))
        _insert_event(conn, now_event(event, source, row[0], effect_id=effect_id, kind=row[1], **data))
        return True


def finish_effect(conn: sqlite3.Connection, effect_id: str, state: str, source: str,
                  from_states: Sequence[str] = (EffectState.EXECUTING,), **data) -> bool:
    """executing (or pending, for expiry) → acked | failed | expired, with its event; False if not in from_states."""
    return _move_effect(conn, effect_id, source, where=f"state IN ({','.join('?' * len(from_states))})",
                        args=from_states, state=state, event=EFFECT_END_EVENTS[state], **data)


def finish_claimed_effect(conn: sqlite3.Connection, effect_id: str, claimer: str, state: str, source: str,
                          **data) -> bool:
    """executing under `claimer` → acked | failed, with its event; False if it is not (or no longer) that
    claimer's: an executor only ever ends its own claims, or a dead claimer's when it settles an orphan."""
    return _move_effect(conn, effect_id, source, where="state = 'executing' AND claimer = ?", args=(claimer,),
                        state=state, event=EFFECT_END_EVENTS[state], **data)


def requeue_claimed_effect(conn: sqlite3.Connection, effect_id: str, claimer: str, source: str,
                           reason: str) -> bool:
    """executing under `claimer` → pending (it runs again), with an effect-failed event marked requeued."""
    return _move_effect(conn, effect_id, source, where="state = 'executing' AND claimer = ?", args=(claimer,),
                        state=EffectState.PENDING, event=EffectEvent.FAILED, release=True, reason=reason, requeued=True)


def effect_state(conn: sqlite3.Connection, effect_id: str) -> str | None:
    row = conn.execute("SELECT state FROM effects WHERE id = ?", (effect_id,)).fetchone()
    return row[0] if row else None


def effect_why(conn: sqlite3.Connection, effect_id: str) -> str | None:
    """Why it failed or expired (the error, else the reason code); None while open or acked."""
    row = conn.execute("SELECT why FROM effects WHERE id = ?", (effect_id,)).fetchone()
    return row[0] if row else None


# -- vitals.db ---------------------------------------------------------------------------------------

def open_vitals(path: Path) -> sqlite3.Connection:
    conn = _connect(path, "NORMAL")
    _migrate(conn, path, _VITALS_MIGRATIONS, VITALS_SCHEMA)
    return conn


def append_vitals(conn: sqlite3.Connection, vitals: Iterable[Vital]) -> None:
    with _Tx(conn):
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
    with _Tx(conn):
        return conn.execute("DELETE FROM vitals WHERE id IN (SELECT id FROM vitals WHERE ts < ? LIMIT ?)",
                            (older_than_ts, batch)).rowcount


# -- objects/ references -----------------------------------------------------------------------------

_OBJECT_REF = re.compile(r"sha256:([0-9a-f]{64})")


def referenced_objects(conn: sqlite3.Connection) -> set[str]:
    """Every blob an event names (as "sha256:<hex>")."""
    out: set[str] = set()
    for (data,) in conn.execute("SELECT data FROM events WHERE data LIKE '%sha256:%'"):
        out.update(_OBJECT_REF.findall(data))
    return out


# -- workers.json: the workers an operator stopped -------------------------------------------------

def list_effects(conn: sqlite3.Connection, states: Sequence[str] = (),
                 limit: int = 100) -> list[tuple[Effect, str, str | None]]:
    """(effect, state, why it failed or expired), newest first; all states unless `states` is given."""
    where = f"WHERE state IN ({','.join('?' * len(states))})" if states else ""
    rows = conn.execute(f"SELECT body, state, why FROM effects {where} ORDER BY created DESC LIMIT ?",
                        (*states, limit))
    return [(_effect(r[0]), r[1], r[2]) for r in rows]


def open_readonly(path: Path) -> sqlite3.Connection:
    """For pulsectl: never writes, never migrates, never creates."""
    if not path.exists():
        raise StoreError(f"{path} does not exist (has pulsed run on this home?)")
    if problem := header_problem(path):
        raise StoreError(f"{path} {problem}")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=busy_timeout_s())
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s() * 1000)}")
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")   # a damaged header shows here, not later
    except sqlite3.DatabaseError as err:
        raise StoreError(f"{path} {store_problem(path) or err}") from None
    return conn


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


def recent_vitals(conn: sqlite3.Connection, key: str, n: int) -> list[Vital]:
    """The last `n` samples of `key`, oldest first (for rules that count failures in a row)."""
    rows = conn.execute("SELECT key, ts, data FROM vitals WHERE key = ? ORDER BY ts DESC LIMIT ?", (key, n))
    return [Vital(r[0], r[1], json.loads(r[2])) for r in rows][::-1]


# -- tasks -------------------------------------------------------------------------------------------
# A task is its task-* events (target = the task id). The transition table lives in pulse.agents.tasks;
# these functions run it inside the transaction that appends, so a check and its write are one.

from collections.abc import Callable  # noqa: E402  (kept with the section it serves)


def _task_type_clause() -> str:
    return f"type IN ({','.join('?' * len(TASK_EVENTS))})"


def task_events(conn: sqlite3.Connection, after_id: int = 0, limit: int = 10_000) -> list[Event]:
    """Every task-* event after `after_id`, oldest first (by the (type, id) index)."""
    return read_events(conn, after_id=after_id, types=TASK_EVENTS, limit=limit)


def task_history(conn: sqlite3.Connection, task: str) -> list[Event]:
    """The task-* events of one task, oldest first."""
    rows = conn.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE {_task_type_clause()} AND target = ? ORDER BY id",
                        (*TASK_EVENTS, task))
    return [_row_event(r) for r in rows]


def append_task_events(conn: sqlite3.Connection, task: str,
                       decide: Callable[[list[Event]], Sequence[Event]]) -> list[Event]:
    """Check-and-append in one BEGIN IMMEDIATE transaction: `decide(history)` sees the task's
    committed events and returns the events to append, or raises (and nothing is written)."""
    with _Tx(conn):
        new = list(decide(task_history(conn, task)))
        for ev in new:
            _insert_event(conn, ev)
    return new


def create_task_event(conn: sqlite3.Connection, make: Callable[[int], Event]) -> Event:
    """Append the task-created event `make(n)` returns, n being the next task number, allocated
    inside the transaction (events are never deleted, so the count only grows)."""
    with _Tx(conn):
        count = conn.execute("SELECT COUNT(*) FROM events WHERE type = 'task-created'").fetchone()[0]
        return _insert_event(conn, make(count + 1))
