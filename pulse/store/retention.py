"""Retention of events.db: the oldest events move into archive segments (pulse.store.archive).

[store] bounds the live history by age (keep_days), by size (max_mb) and by the disk's free space
(keep_free_mb). Events past a bound move, oldest first, in segments of at most SEGMENT_EVENTS,
and never past what is still needed live: an open effect's event, any event of an open task, the
last event each fresh projection's checkpoint folded (so its reader restarts from live rows; not under
the size bounds, nor for a checkpoint a day old: that reader folds what moved from the archive, its
checkpoint's event found there), what the fleet worker has not yet published, pulsed's newest
event (where a restarted event writer picks up), and the newest event (ids go on from it).

One move, each step durable before the next, so a kill -9 anywhere loses nothing and doubles
nothing:

  selected   the range's rows are read (one statement: one snapshot)
  written    compressed into archive/.tmp-<name>
  synced     fsynced, renamed to <name>, the directory fsynced
  verified   read back: its sha256 and its decompressed text are the ones written
  recorded   one transaction: the manifest row (history_moves), a history-moved event, and the
             delete of the range from events (the trigger refuses any delete the manifest does not cover)

Until `recorded` commits, the live rows are the truth and the file is no one's: `recover()`, run
under the lock before every move, deletes any segment file the manifest does not name (an
interrupted move, undone). After it, the segment is. `archive = false` records and deletes
without a file. Past archive_max_mb, the oldest segment files go: the manifest row keeps its counts
and loses its file (recorded, then unlinked, so an interrupted drop is an unnamed file, deleted).

One mover at a time: an flock on archive/.lock (the event writer's pacer and `pulsectl store
compact` both take it; the loser tries later). PULSE_TEST_MOVE_KILL=<step> SIGKILLs the mover
right after that step, PULSE_TEST_RETENTION_S paces the event writer's mover (tests only).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import signal
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from pulse.core import config as configmod
from pulse.core import fleetnames
from pulse.core.wire.eventmsgs import TASK_EVENTS, EventType, TaskEvent, now_event
from pulse.store import archive, effectqueue, eventindex, eventsdb, projection
from pulse.store.connection import DurableTransaction, Transaction
from pulse.store.historysize import live_bytes
from pulse.store.objects import fsync_dir

SEGMENT_EVENTS = 5_000        # events per segment: ~1 MB of text, ~0.1 s to compress and move (one pacer step)
MIN_EVENTS = 1_000            # the pacer waits for this many due events (store compact moves any)
STALE_CHECKPOINT_S = 86_400   # a checkpoint not rewritten for a day is of a reader idle or gone: it does not
                              # hold the move back (its reader folds what moved from the archive)
STEPS = ("selected", "written", "synced", "verified", "recorded")
KILL_ENV = "PULSE_TEST_MOVE_KILL"
PACE_ENV = "PULSE_TEST_RETENTION_S"   # tests: the pacer plans this often, from this soon, and moves any due event
MIB = 1024 * 1024
ENDED_TASK_EVENTS = (TaskEvent.CLOSED, TaskEvent.GIVEN_UP)

log = logging.getLogger("pulse.retention")


@dataclass
class Plan:
    """What the bounds ask to move and what holds it back: ids first..upto move (none if upto < first)."""
    first: int                       # the oldest live event
    last: int                        # the newest
    due: int                         # the last id the bounds want gone
    upto: int                        # … and the last that may go (due, held back)
    why: list[str] = field(default_factory=list)      # which bounds ask
    held: list[str] = field(default_factory=list)     # what holds the move back, if it does
    live_bytes: int = 0

    @property
    def count(self) -> int:
        return max(0, self.upto - self.first + 1) if self.last else 0

    def segments(self) -> list[tuple[int, int]]:
        return [(a, min(a + SEGMENT_EVENTS - 1, self.upto)) for a in range(self.first, self.upto + 1, SEGMENT_EVENTS)]


def plan(conn: sqlite3.Connection, home: Path, store: configmod.Store, now: float | None = None) -> Plan:
    """What should move now under `store`'s bounds, and how far it may."""
    now = time.time() if now is None else now
    last = eventsdb.last_event_id(conn)
    first = eventindex.first_live_id(conn)
    p = Plan(first=first, last=last, due=first - 1, upto=first - 1, live_bytes=live_bytes(conn))
    if not last:
        return p
    if store.keep_days > 0:
        upto = eventsdb.first_id_since(conn, now - store.keep_days * 86_400) - 1
        if upto >= first:
            p.due = max(p.due, upto)
            p.why.append(f"{upto - first + 1} events older than {store.keep_days:g} days")
    per_event = p.live_bytes / (last - first + 1)
    pressed = False          # a bound on the disk asks: a reader's checkpoint does not hold the move back
    if store.max_mb > 0 and p.live_bytes > store.max_mb * MIB:
        pressed = True
        # down to 90% of the bound, so the next move is not due at the next event
        n = int((p.live_bytes - 0.9 * store.max_mb * MIB) / per_event) + 1
        p.due = max(p.due, first + n - 1)
        p.why.append(f"the live history is {p.live_bytes / MIB:.0f} MiB, over max_mb = {store.max_mb:g}")
    if store.keep_free_mb > 0 and (free := disk_free(home)) < store.keep_free_mb * MIB:
        pressed = True
        p.due = max(p.due, first + SEGMENT_EVENTS - 1)
        p.why.append(f"{free / MIB:.0f} MiB free on the home's disk, under keep_free_mb = {store.keep_free_mb:g}")
    p.upto = min(p.due, last)
    if p.upto < first:
        return p
    for limit, reason in holds(conn, home, first, p.upto, now, checkpoints=not pressed):
        if limit - 1 < p.upto:
            p.upto = limit - 1
            p.held.append(reason)
    return p


def disk_free(home: Path) -> int:
    st = os.statvfs(home)
    return st.f_bavail * st.f_frsize


def holds(conn: sqlite3.Connection, home: Path, first: int, upto: int, now: float,
          checkpoints: bool = True) -> list[tuple[int, str]]:
    """(id, why) of each event in first..upto that must stay live, so nothing from it on moves.
    `checkpoints`: the projections' fresh checkpoints hold too (so their readers restart from live
    rows); not when the live history is over max_mb or the disk under keep_free_mb: a reader whose
    checkpoint the move passes folds what moved from the archive (projection.anchor_ts)."""
    out: list[tuple[int, str]] = []
    row = conn.execute("SELECT event_id, id FROM effects WHERE state IN ('pending', 'executing') "
                       "ORDER BY event_id LIMIT 1").fetchone()
    if row:
        out.append((row[0], f"open effect {row[1]} (event {row[0]})"))
    if (task := oldest_open_task(conn, first, upto)) is not None:
        out.append((task[0], f"open task {task[1]} (event {task[0]})"))
    for name, last_id in checkpoint_anchors(home / projection.DIRECTORY, now) if checkpoints else ():
        out.append((last_id, f"projection {name}'s checkpoint (at event {last_id})"))
    for stream, last_id in fleet_cursors(home, now):
        out.append((last_id + 1, f"the fleet's {stream} cursor (events after {last_id} are not yet published)"))
    row = conn.execute("SELECT id FROM events WHERE source = 'pulsed' ORDER BY id DESC LIMIT 1").fetchone()
    if row:
        out.append((row[0], f"pulsed's newest event ({row[0]})"))
    last = eventsdb.last_event_id(conn)
    out.append((last, f"the newest event ({last})"))
    return out


def oldest_open_task(conn: sqlite3.Connection, first: int, upto: int) -> tuple[int, str] | None:
    """(id of its first live event, task id) of the oldest task with an event in first..upto whose
    latest event does not end it."""
    marks = ",".join("?" * len(TASK_EVENTS))
    first_seen: dict[str, int] = {}
    latest: dict[str, str] = {}
    for id_, target, type_ in conn.execute(f"SELECT id, target, type FROM events WHERE type IN ({marks}) AND id >= ? "
                                           "ORDER BY id", (*TASK_EVENTS, first)):
        if id_ <= upto:
            first_seen.setdefault(target, id_)
        if target in first_seen:
            latest[target] = type_
    open_ = [(first_seen[t], t) for t, type_ in latest.items() if type_ not in ENDED_TASK_EVENTS]
    return min(open_) if open_ else None


def fleet_cursors(home: Path, now: float) -> list[tuple[str, int]]:
    """(stream, last_id) of the fleet worker's cursors ([fleet]: events it has not published yet stay
    live), unless the file is stale as a checkpoint would be (the fleet worker no longer runs)."""
    path = home / fleetnames.CURSOR_FILE
    try:
        if now - max(p.stat().st_mtime for p in (path, Path(f"{path}-wal")) if p.exists()) > STALE_CHECKPOINT_S:
            return []
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    except (ValueError, OSError, sqlite3.Error):
        return []                       # no fleet worker ever ran here
    try:
        return list(conn.execute("SELECT stream, last_id FROM cursor"))
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def checkpoint_anchors(directory: Path, now: float) -> list[tuple[str, int]]:
    """(name, last_id) of each checkpoint written within STALE_CHECKPOINT_S."""
    out = []
    for path in sorted(directory.glob("*.ckpt")):
        try:
            if now - path.stat().st_mtime > STALE_CHECKPOINT_S:
                continue
            record = msgspec.msgpack.decode(path.read_bytes(), type=projection.Checkpoint)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            continue                 # torn or foreign: it will be rebuilt, it holds nothing back
        if record.last_id:
            out.append((record.name, record.last_id))
    return out


# -- the move ------------------------------------------------------------------------------------------

class Busy(Exception):
    """Another mover holds the lock."""


class MoveLock:
    """archive/.lock, flocked: one mover at a time (the pacer in the event writer, store compact)."""

    def __init__(self, home: Path):
        self.directory = home / archive.DIRECTORY
        self.fd: int | None = None

    def __enter__(self) -> "MoveLock":
        make_directory(self.directory)
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Busy(f"another move holds {self.directory / '.lock'}") from None
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)     # releases the flock
            self.fd = None


def make_directory(directory: Path) -> None:
    """archive/, owned as the home is (a root `pulsectl store compact` must not leave what pulsed,
    running as the home's user, cannot write)."""
    if directory.is_dir() and not directory.is_symlink():
        return
    directory.mkdir(mode=0o700)
    owner = directory.parent.stat()
    if os.geteuid() == 0 and owner.st_uid != 0:
        os.chown(directory, owner.st_uid, owner.st_gid, follow_symlinks=False)


def step(name: str) -> None:
    """A step of a move is durable: tests may kill the mover here (PULSE_TEST_MOVE_KILL)."""
    if os.environ.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def recover(conn: sqlite3.Connection, home: Path) -> list[str]:
    """Undo interrupted moves and drops (under the lock): delete every segment file, finished or
    not, that the manifest does not name. Returns the names deleted."""
    directory = home / archive.DIRECTORY
    if not directory.is_dir():
        return []
    named = {m.segment for m in archive.archived(conn)}
    gone = []
    for entry in os.scandir(directory):
        unnamed = entry.name.startswith(".tmp-") or (archive.is_segment_name(entry.name) and entry.name not in named)
        if unnamed and entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)
            gone.append(entry.name)
    if gone:
        fsync_dir(directory)
        log.warning("history: removed %s, left by an interrupted move (its events are still live)", ", ".join(gone))
    return gone


def move(conn: sqlite3.Connection, home: Path, first: int, last: int, keep_archive: bool, source: str) -> archive.Segment:
    """Move events first..last (all live, the oldest first) out of events.db, into a segment if
    `keep_archive`. The caller holds the MoveLock and has run recover()."""
    rows = conn.execute("SELECT id, seq, ts, mono, type, source, target, data FROM events WHERE id BETWEEN ? AND ? "
                        "ORDER BY id", (first, last)).fetchall()
    if not rows or rows[0][0] != first or rows[-1][0] != last or len(rows) != last - first + 1:
        raise ValueError(f"events {first}-{last} are not all live (a move raced another?)")
    step("selected")
    seg = describe(rows)
    if keep_archive:
        seg.segment, seg.sha256, seg.bytes = write_segment(home / archive.DIRECTORY, rows)
    with Transaction(conn):
        if eventindex.first_live_id(conn) != first:
            raise ValueError(f"event {first} is no longer the oldest live one")
        conn.execute("INSERT INTO history_moves (first_id, last_id, events, first_ts, last_ts, segment, sha256, bytes, "
                     "counts, tasks, objects, runs, moved_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (seg.first_id, seg.last_id, seg.events, seg.first_ts, seg.last_ts, seg.segment, seg.sha256,
                      seg.bytes, json.dumps(seg.counts), json.dumps(seg.tasks), json.dumps(seg.objects),
                      json.dumps(seg.runs), seg.moved_ts))
        effects = effectqueue.forget_ended(conn, first, last)
        eventsdb.insert_event(conn, now_event(EventType.HISTORY_MOVED, source, seg.segment, first_id=first, last_id=last,
                                              events=seg.events, archived=keep_archive, sha256=seg.sha256,
                                              bytes=seg.bytes, effects=effects))
        # The one delete of events in the source: the manifest row above covers it (the trigger checks).
        conn.execute("DELETE FROM events WHERE id BETWEEN ? AND ?", (first, last))
    step("recorded")
    return seg


def describe(rows: list[tuple]) -> archive.Segment:
    """The manifest row of a range, but for its file."""
    counts: dict[str, int] = {}
    tasks: dict[str, None] = {}
    objects: set[str] = set()
    runs = []
    for r in rows:
        counts[r[4]] = counts.get(r[4], 0) + 1
        if r[4] in TASK_EVENTS and r[6]:
            tasks[r[6]] = None
        objects.update(eventsdb.object_refs(r[7]))
        if r[4] == EventType.SUPERVISOR_STARTED and r[5] == "pulsed":
            runs.append(r[3])
    return archive.Segment(first_id=rows[0][0], last_id=rows[-1][0], events=len(rows), first_ts=rows[0][2],
                           last_ts=rows[-1][2], segment=None, sha256=None, bytes=0, counts=counts, tasks=list(tasks),
                           objects=sorted(objects), runs=runs, moved_ts=time.time())


def write_segment(directory: Path, rows: list[tuple]) -> tuple[str, str, int]:
    """Write, sync and verify a segment of `rows`: (its name, its sha256, its size)."""
    name = archive.segment_name(rows[0][0], rows[-1][0])
    plain = archive.encode_rows(rows)
    packed = archive.compress(plain)
    digest = hashlib.sha256(packed).hexdigest()
    temporary = directory / f".tmp-{name}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        owner = directory.parent.stat()
        if os.geteuid() == 0 and owner.st_uid != 0:
            os.fchown(fd, owner.st_uid, owner.st_gid)
        view = memoryview(packed)
        while view:
            view = view[os.write(fd, view):]
        step("written")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, directory / name)
    fsync_dir(directory)
    step("synced")
    if archive.read_plain(directory / name, digest) != plain:   # SegmentError too: the rows stay live
        raise archive.SegmentError(f"{directory / name} does not read back as written")
    step("verified")
    return name, digest, len(packed)


def drop_over(conn: sqlite3.Connection, home: Path, max_mb: float, source: str) -> list[str]:
    """Drop the oldest segment files while the archive is over `max_mb` (0: no bound): recorded, then
    unlinked. The record is synced first: events.db's commits are otherwise durable only at the next
    sync, and a later move's directory sync could make the unlink durable before it, leaving the
    manifest naming a file a power cut took."""
    if max_mb <= 0:
        return []
    segs = archive.archived(conn)
    total = sum(s.bytes for s in segs)
    dropped = []
    for seg in segs:
        if total <= max_mb * MIB:
            break
        with DurableTransaction(conn):
            conn.execute("UPDATE history_moves SET segment = NULL, sha256 = NULL, bytes = 0 WHERE first_id = ?",
                         (seg.first_id,))
            eventsdb.insert_event(conn, now_event(EventType.HISTORY_DROPPED, source, seg.segment, first_id=seg.first_id,
                                                  last_id=seg.last_id, events=seg.events, bytes=seg.bytes,
                                                  max_mb=max_mb))
        try:
            os.unlink(home / archive.DIRECTORY / str(seg.segment))
        except FileNotFoundError:
            pass
        total -= seg.bytes
        dropped.append(str(seg.segment))
    return dropped


@dataclass
class Outcome:
    plan: Plan
    moved: list[archive.Segment] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)


def compact(conn: sqlite3.Connection, home: Path, store: configmod.Store, source: str, *, max_segments: int | None = None,
            min_events: int = 0, readers: Sequence[projection.Projection] = ()) -> Outcome:
    """Move what the bounds ask (at most `max_segments` segments; nothing if fewer than `min_events`
    are due), then drop archive segments past archive_max_mb. `readers`: projections whose
    checkpoints no worker keeps (pulsectl's listings), folded up to now first. Raises Busy if
    another mover runs."""
    refresh(conn, home, readers)
    if not (home / archive.DIRECTORY).exists():     # never moved here: nothing to recover or drop
        p = plan(conn, home, store)
        if not p.count or p.count < min_events:
            return Outcome(plan=p)
    with MoveLock(home):
        recovered = recover(conn, home)
        p = plan(conn, home, store)
        out = Outcome(plan=p, recovered=recovered)
        if p.count and p.count >= min_events:
            for a, b in p.segments()[:max_segments]:
                out.moved.append(move(conn, home, a, b, store.archive, source))
        out.dropped = drop_over(conn, home, store.archive_max_mb, source)
        return out


def refresh(conn: sqlite3.Connection, home: Path, readers: Sequence[projection.Projection]) -> None:
    """Fold each reader's checkpoint (one a listing left, `pulsectl task list`'s) up to now: else a
    checkpoint written long ago holds the move back, or, once stale and its event moved, costs the
    next listing a rebuild over the archive. One that does not load is left to its reader."""
    directory = home / projection.DIRECTORY
    for reader in readers:
        if not projection.checkpoint_path(directory, reader.name).exists():
            continue
        folded = projection.Folded(reader, conn, directory, every_s=float("inf"))
        folded.start()
        if folded.rebuilt is None:
            folded.catch_up()
            folded.save()


class Pacer:
    """Runs retention from a worker's loop (the event writer's): one segment per step, a step every
    PAUSE_S while more is due, a new plan every EVERY_S. A step costs one segment's compression
    (~70 ms) and one short transaction; a failure is logged and retried later, never raised."""

    EVERY_S = 60.0
    PAUSE_S = 0.5
    RETRY_S = 30.0

    def __init__(self, conn_of, home: Path, store: configmod.Store, source: str, log: logging.Logger, now: float,
                 readers: Sequence[projection.Projection] = ()):
        self.conn_of, self.home, self.store, self.source, self.log = conn_of, home, store, source, log
        self.readers = readers
        self.every_s, self.min_events = self.EVERY_S, MIN_EVENTS
        if os.environ.get(PACE_ENV):
            self.every_s, self.min_events = float(os.environ[PACE_ENV]), 1
        self.due = now + min(5.0, self.every_s)        # not in the way of the start
        self.moved = 0

    def next_timer(self) -> float:
        return self.due

    def on_timer(self, now: float) -> None:
        if now < self.due:
            return
        self.due = now + self.every_s
        try:
            out = compact(self.conn_of(), self.home, self.store, self.source, max_segments=1,
                          min_events=0 if self.moved else self.min_events, readers=self.readers)
        except Busy:
            return
        except (sqlite3.Error, OSError, ValueError, archive.SegmentError) as err:
            self.log.warning("history: a move failed (%s); the events stay live, retrying in %.0f s", err, self.RETRY_S)
            self.due = now + self.RETRY_S
            return
        for seg in out.moved:
            self.log.info("history: moved events %d-%d (%d) %s", seg.first_id, seg.last_id, seg.events,
                          f"to {seg.segment}" if seg.segment else "out (deleted: archive = false)")
        if out.moved and out.plan.upto > out.moved[-1].last_id:
            self.moved += 1
            self.due = now + self.PAUSE_S       # more is due: the next segment soon, not in one go
        else:
            self.moved = 0
