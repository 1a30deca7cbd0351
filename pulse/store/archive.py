"""Archive segments: the events that left the live history, and reading them back.

A segment is one contiguous id range of events, written once by pulse.store.retention and never
rewritten: `<home>/archive/events-<first>-<last>.jsonl.zst`, one JSON array per event
(id, seq, ts, mono, type, source, target, data) in id order, one zstandard frame (level 3, with its
content size and its own XXH64 checksum besides). events.db's `history_moves` table is the manifest: a
segment is part of the history only once its row is committed, in the transaction that deleted
its events from events.db, and the row holds the file's sha256. A reader reads only segments the
manifest names, so a file left by an interrupted move is never read twice with the live rows, and
a file that fails its checksum is refused (SegmentError), never half-read.

The readers here serve what reaches past the live history (`pulsectl events`, `task show`, a
projection's rebuild, the report's window, the events page); each reads only the segments the
manifest says may hold what it asks for.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from pulse.core import digest
from pulse.core.wire.eventmsgs import GATE_CALL_EVENTS, TASK_EVENTS, Event, EventType

DIRECTORY = "archive"
LEVEL = 3         # zstd: ~4-6x on events, ~20 ms per 5,000 (xz's ratio: xz took 0.2-1 s, zlib gave 8% more bytes)

_decode_row = msgspec.json.Decoder(tuple[int, int, float, float, str, str, str | None, dict]).decode


class SegmentError(Exception):
    """A segment that cannot be read as what its manifest row says it is."""


class Segment(msgspec.Struct, kw_only=True):
    """A row of history_moves: one range that left the live history."""
    first_id: int
    last_id: int
    events: int
    first_ts: float
    last_ts: float
    segment: str | None           # its file under archive/; None: deleted (archive = false) or dropped
    sha256: str | None
    bytes: int
    counts: dict[str, int]
    tasks: list[str]
    objects: list[str]
    runs: list[float]
    moved_ts: float


_COLUMNS = "first_id, last_id, events, first_ts, last_ts, segment, sha256, bytes, counts, tasks, objects, runs, moved_ts"


def segment_name(first_id: int, last_id: int) -> str:
    return f"events-{first_id:012d}-{last_id:012d}.jsonl.zst"


def is_segment_name(name: str) -> bool:
    return name.startswith("events-") and name.endswith(".jsonl.zst")


def directory_of(conn: sqlite3.Connection) -> Path:
    """<home>/archive for the events.db `conn` is open on (readers get a connection, not a home)."""
    path = next(row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main")
    return Path(path).parent / DIRECTORY


def moves(conn: sqlite3.Connection) -> list[Segment]:
    """Every range that left the live history, oldest first ([] on a store not yet at schema 5)."""
    try:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM history_moves ORDER BY first_id").fetchall()
    except sqlite3.OperationalError:
        return []
    return [Segment(first_id=r[0], last_id=r[1], events=r[2], first_ts=r[3], last_ts=r[4], segment=r[5], sha256=r[6],
                    bytes=r[7], counts=json.loads(r[8]), tasks=json.loads(r[9]), objects=json.loads(r[10]),
                    runs=json.loads(r[11]), moved_ts=r[12]) for r in rows]


def archived(conn: sqlite3.Connection) -> list[Segment]:
    """The moves whose events are in a segment file (not deleted), oldest first."""
    return [m for m in moves(conn) if m.segment]


# -- writing (pulse.store.retention) -----------------------------------------------------------------

def encode_rows(rows: Sequence[tuple]) -> bytes:
    """Rows of (id, seq, ts, mono, type, source, target, data as JSON text) as a segment's plain text:
    the data is copied as it is stored, never re-encoded."""
    encode = msgspec.json.encode
    return b"".join(encode((*r[:7], msgspec.Raw(r[7].encode()))) + b"\n" for r in rows)


def compress(plain: bytes) -> bytes:
    import zstandard  # with platform, ~3-5 ms: only where a segment is written or read, not where none is
    return zstandard.ZstdCompressor(level=LEVEL, write_checksum=True, write_content_size=True).compress(plain)


# -- reading --------------------------------------------------------------------------------------------

def read_segment(directory: Path, seg: Segment) -> list[Event]:
    """The events of one segment, oldest first; SegmentError if its file is missing, fails its
    checksum, does not decompress, or does not hold exactly the range its row names."""
    path = directory / (seg.segment or "")
    plain = read_plain(path, seg.sha256)
    try:
        rows = [_decode_row(line) for line in plain.splitlines()]
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise SegmentError(f"{path} does not decode ({err})") from None
    ids = [r[0] for r in rows]
    if len(rows) != seg.events or not rows or ids[0] != seg.first_id or ids[-1] != seg.last_id:
        raise SegmentError(f"{path} does not hold events {seg.first_id}-{seg.last_id} as recorded")
    return [Event(id=r[0], seq=r[1], ts=r[2], mono=r[3], type=r[4], source=r[5], target=r[6], data=r[7]) for r in rows]


def read_plain(path: Path, sha256: str | None) -> bytes:
    """A segment file's text, once its bytes match `sha256`; SegmentError if not."""
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as f:
            packed = f.read()
    except OSError as err:
        raise SegmentError(f"{path} cannot be read ({err.strerror})") from None
    if digest.sha256(packed).hexdigest() != sha256:
        raise SegmentError(f"{path} fails its checksum (its sha256 is not the one recorded when it was written)")
    import zstandard  # as compress's
    try:
        return zstandard.ZstdDecompressor().decompress(packed)
    except zstandard.ZstdError as err:
        raise SegmentError(f"{path} does not decompress ({err})") from None


def problem(directory: Path, seg: Segment) -> str | None:
    """Why a segment is not sound, or None (store check)."""
    try:
        read_segment(directory, seg)
    except SegmentError as err:
        return str(err)
    return None


def task_history(conn: sqlite3.Connection, task: str) -> list[Event]:
    """The archived task-* events of one task, oldest first (only the segments that hold some are read)."""
    directory = directory_of(conn)
    return [ev for seg in archived(conn) if task in seg.tasks for ev in read_segment(directory, seg)
            if ev.target == task and ev.type in TASK_EVENTS]


def gate_events_of_sessions(conn: sqlite3.Connection, task: str) -> list[Event]:
    """The archived gate-call and gate-blocked events of `task`'s gate sessions, from the segments
    that hold the task's own events (a session lives within its task's run)."""
    directory = directory_of(conn)
    out: list[Event] = []
    for seg in archived(conn):
        if task not in seg.tasks or not set(GATE_CALL_EVENTS) & set(seg.counts):
            continue
        events = read_segment(directory, seg)
        sessions = {e.target for e in events if e.type == EventType.GATE_CALL and e.data.get("phase") == "open"
                    and e.data.get("task") == task}
        out += [e for e in events if e.type in GATE_CALL_EVENTS and e.target in sessions]
    return out


def last_events(conn: sqlite3.Connection, n: int, types: Sequence[str] = (), before_id: int | None = None) -> list[Event]:
    """The last `n` archived events (of `types`) before `before_id`, oldest first: newest segments first."""
    directory = directory_of(conn)
    wanted = frozenset(types)
    out: list[Event] = []
    for seg in reversed(archived(conn)):
        if len(out) >= n:
            break
        if (before_id is not None and seg.first_id >= before_id) or (wanted and not wanted.intersection(seg.counts)):
            continue
        found = [e for e in read_segment(directory, seg)
                 if (before_id is None or e.id < before_id) and (not wanted or e.type in wanted)]
        out = found[-(n - len(out)):] + out
    return out


def events_since(conn: sqlite3.Connection, since_ts: float, types: Sequence[str] = (),
                 limit: int = 10_000) -> list[Event]:
    """The archived events (of `types`) stamped at or after `since_ts`, oldest first, at most `limit`."""
    directory = directory_of(conn)
    wanted = frozenset(types)
    out: list[Event] = []
    for seg in archived(conn):
        if seg.last_ts < since_ts or (wanted and not wanted.intersection(seg.counts)):
            continue
        out += [e for e in read_segment(directory, seg) if e.ts >= since_ts and (not wanted or e.type in wanted)]
        if len(out) >= limit:
            return out[:limit]
    return out


def events_between(conn: sqlite3.Connection, start_ts: float, end_ts: float) -> list[Event]:
    """The archived events stamped within [start_ts, end_ts], oldest first (the report's window):
    only the segments whose span meets the window are read."""
    directory = directory_of(conn)
    return [e for seg in archived(conn) if seg.last_ts >= start_ts and seg.first_ts <= end_ts
            for e in read_segment(directory, seg) if start_ts <= e.ts <= end_ts]


def newest_matching(conn: sqlite3.Connection, match: Callable[[Event], bool], limit: int, *,
                    before_id: int | None = None, types: Sequence[str] = (), since_ts: float | None = None,
                    max_segments: int) -> tuple[list[Event], int | None]:
    """Up to `limit` archived events before `before_id` that `match`, newest first (the events
    page). Segments are read newest first, at most `max_segments` of them, so a search that finds
    little costs a bounded read rather than the whole archive; those the manifest shows hold none of
    `types`, or end before `since_ts`, are skipped unread. Also returns where a search cut short by
    `max_segments` stopped (the id below which it did not look: the next page goes on from there),
    else None."""
    directory = directory_of(conn)
    wanted = frozenset(types)
    out: list[Event] = []
    read = 0
    for seg in reversed(archived(conn)):
        if len(out) >= limit:
            break
        if before_id is not None and seg.first_id >= before_id:
            continue
        if since_ts is not None and seg.last_ts < since_ts:
            continue
        if wanted and not wanted.intersection(seg.counts):
            continue
        if read == max_segments:
            return out, seg.last_id + 1
        read += 1
        out += [e for e in reversed(read_segment(directory, seg))
                if (before_id is None or e.id < before_id) and match(e)][:limit - len(out)]
    return out, None


def event_by_id(conn: sqlite3.Connection, event_id: int) -> Event | None:
    """One archived event, from the segment whose range holds it, or None if none does."""
    seg = next((s for s in archived(conn) if s.first_id <= event_id <= s.last_id), None)
    if seg is None:
        return None
    return next((e for e in read_segment(directory_of(conn), seg) if e.id == event_id), None)
