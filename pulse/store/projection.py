"""Projections of events.db: folds whose cost at a start does not grow with the history.

A projection is a name, a fold of events into a state, the event types it reads, and the code its
meaning rests on. Its version is a hash of that code's source, so a changed fold (or state type)
never misreads a checkpoint written by the old one: the checkpoint is foreign, and the projection
is rebuilt from the history. A worker keeps a `Folded` per projection: the first `catch_up` loads
the newest valid checkpoint and folds only what came after it; later ones fold what is new. It
writes a checkpoint every CHECKPOINT_EVENTS folded events or CHECKPOINT_S seconds, and when asked
(a clean stop).

Checkpoints are files, one per projection, under <home>/checkpoints: written whole to a temporary
file, fsynced, renamed over the old one, and the directory fsynced. So a crash leaves the old
checkpoint or the new one, never a mix; a file damaged anyway (a torn write on a file system that
does not order them, a disk error, an edit) fails its checksum and is ignored, as is one of another
version or of another history (its last event is not the one events.db holds under that id, as
after a restore from a backup). Ignored means rebuilt: a checkpoint is derived data, never the truth.

Rebuilding is the one path allowed to read the history from its first event
(tests/test_projection_reads.py keeps every other fold off it). When the oldest events moved to
archive segments (pulse.store.retention), a rebuild folds those segments first, then the live rows.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import sys
import time
from pathlib import Path
from types import FunctionType, MethodType
from typing import TYPE_CHECKING, Any, Callable, Generic, Sequence, TypeVar

import msgspec

from pulse.core.digest import sha256
from pulse.store import eventindex, eventsdb

if TYPE_CHECKING:
    from pulse.core.wire.eventmsgs import Event

# Not imported here: inspect, dataclasses, logging and pulse.store.archive (zstandard) were ~20 ms of
# `pulsectl task list`, which reads a projection's checkpoint and folds a few events after it. The
# archive is read only when events moved there, and log lines are written through say().

S = TypeVar("S")

PROTOCOL = 1                 # the checkpoint file's own layout; part of every version
CHECKPOINT_EVENTS = 20_000   # events folded since the last checkpoint that call for a new one
CHECKPOINT_S = 30.0          # …or this long since it, if anything was folded
FOLD_BATCH = 500             # events read per query: a worker's RSS keeps what one batch needed
DIRECTORY = "checkpoints"

INFO, WARNING, ERROR = 20, 30, 40     # logging's levels


def say(level: int, message: str, *args: Any) -> None:
    """A line of the log "pulse.projection". Below WARNING, only where logging was set up: a process
    that never imported logging (pulsectl) has no handler that would show it, so logging need not
    load for it (WARNING and above reach logging's last-resort handler, stderr, as before)."""
    if level < WARNING and "logging" not in sys.modules:
        return
    import logging  # ~4 ms that a pulsectl read which has nothing to warn of never pays
    logging.getLogger("pulse.projection").log(level, message, *args)


def source_of(obj: Any) -> str:
    """The source text an object's meaning rests on: a function's; a class's fields and the source of
    each of its methods (cheap: inspect.getsource of a class parses its whole module, and a
    restarted worker computes its projections' versions before it folds); a constant's value."""
    if isinstance(obj, (set, frozenset)):
        return repr(sorted(obj, key=repr))    # a set's order varies between processes (hash seeds)
    if isinstance(obj, type):
        return _class_source(obj)
    if isinstance(obj, (FunctionType, MethodType)):
        return _function_source(obj)
    return repr(obj)                          # a constant: its value is its meaning


@functools.lru_cache(maxsize=None)
def _class_source(cls: type) -> str:
    parts = [cls.__qualname__, repr(sorted(getattr(cls, "__annotations__", {}).items(), key=repr))]
    for name, member in sorted(vars(cls).items()):
        function = getattr(member, "__func__", getattr(member, "fget", member))
        if isinstance(function, FunctionType):
            parts.append(_function_source(function))
        elif not name.startswith("__") and isinstance(member, (int, float, str, bytes, tuple, frozenset)):
            parts.append(f"{name} = {source_of(member)}")
    return "\n".join(parts)


def _function_source(function) -> str:
    # Kept per code object: a closure made anew at each call (a projection's `new`) shares its
    # def's code, and so what the forkserver computed (pulse.workers.tick) serves every restart.
    code = getattr(function, "__code__", None)
    if code is None or hasattr(function, "__wrapped__"):
        return _read_source(function)
    source = _SOURCES.get(code)
    if source is None:
        source = _SOURCES[code] = _read_source(function)
    return source


_SOURCES: dict[object, str] = {}


def _read_source(function) -> str:
    """Its lines, from its first (a decorator's) to the last any of its code (nested code too) spans:
    read from the code's positions, not by tokenizing the module as inspect.getsource does, which
    cost every pulsectl command that reads a projection (`task list`) a tenth of its time."""
    code = getattr(unwrapped(function), "__code__", None)
    lines = source_lines(code.co_filename) if code is not None else []
    if not lines:
        return function.__qualname__
    return "".join(lines[code.co_firstlineno - 1:_last_line(code)])


@functools.lru_cache(maxsize=None)
def source_lines(filename: str) -> list[str]:
    """A source file's lines (as linecache.getlines, whose tokenize import was ~1 ms of `task list`);
    [] if it cannot be read (a class made by code, a module without its source)."""
    try:
        with open(filename, encoding="utf-8") as f:
            return f.readlines()
    except (OSError, UnicodeDecodeError):
        return []


def unwrapped(function):
    """What a decorator wrapped (its __wrapped__, as functools.wraps records it), as inspect.unwrap."""
    seen = {id(function)}
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
        if id(function) in seen:
            raise ValueError(f"wrapper loop in {function!r}")
        seen.add(id(function))
    return function


def _last_line(code) -> int:
    last = max((end for _, end, _, _ in code.co_positions() if end is not None), default=code.co_firstlineno)
    nested = (_last_line(const) for const in code.co_consts if hasattr(const, "co_positions"))
    return max([last, *nested])


class Projection(Generic[S]):
    """What a fold is. `fold(state, events)` folds in place; `code` lists the functions and types the
    fold calls (its state type, helpers in other modules): a change to any of them changes the version.

    `dump`: state → what msgspec encodes; `load`: what msgspec decoded → state, or None to decode
    into `state_type`. `rebuild(conn, upto_id) → state`: how to fold from the first event when no
    checkpoint serves, when something faster than event by event exists (counts by one GROUP BY);
    None folds event by event. `types`: the event types it folds; () is every event."""

    def __init__(self, name: str, new: Callable[[], S], fold: Callable[[S, Sequence[Event]], None],
                 types: tuple[str, ...] = (), code: tuple = (), dump: Callable[[S], Any] = lambda state: state,
                 load: Callable[[Any], S] | None = None, state_type: Any = None,
                 rebuild: Callable[[sqlite3.Connection, int], S] | None = None):
        self.name, self.new, self.fold, self.types, self.code = name, new, fold, types, code
        self.dump, self.load, self.state_type, self.rebuild = dump, load, state_type, rebuild
        parts = [f"{PROTOCOL}\0{self.name}\0{sorted(self.types)}"]
        parts += [source_of(obj) for obj in (self.fold, self.new, self.dump, self.load, self.state_type, self.rebuild,
                                             *self.code) if obj is not None]
        self.version = sha256("\0".join(parts).encode()).hexdigest()[:16]

    def decode(self, body: bytes) -> S:
        if self.load is not None:
            return self.load(msgspec.msgpack.decode(body))
        return msgspec.msgpack.decode(body, type=self.state_type)


class Checkpoint(msgspec.Struct, array_like=True):
    protocol: int
    name: str
    version: str
    last_id: int         # the last event folded (or skipped: not of the projection's types)
    anchor_ts: float     # that event's ts: names which history the state is of (0 with last_id 0)
    written: float
    digest: str          # sha256 of body
    body: bytes


def checkpoint_path(directory: Path, name: str) -> Path:
    return directory / f"{name}.ckpt"


def write_checkpoint(directory: Path, projection: Projection[S], state: S, last_id: int, anchor_ts: float) -> Path:
    """Replace the projection's checkpoint atomically (temporary file, fsync, rename, fsync of the directory)."""
    body = msgspec.msgpack.encode(projection.dump(state))
    record = Checkpoint(PROTOCOL, projection.name, projection.version, last_id, anchor_ts, time.time(),
                        sha256(body).hexdigest(), body)
    directory.mkdir(mode=0o700, exist_ok=True)
    path = checkpoint_path(directory, projection.name)
    # imported here: most readers of a projection (pulsectl task list) never write one
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{projection.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.msgpack.encode(record))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        with _suppress_oserror():
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


class _suppress_oserror:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, OSError)


def read_checkpoint(directory: Path, projection: Projection[S],
                    conn: sqlite3.Connection) -> tuple[S, int] | str:
    """(state, last_id) from the projection's checkpoint, or why there is none to use."""
    path = checkpoint_path(directory, projection.name)
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as f:
            raw = f.read()
    except FileNotFoundError:
        return "no checkpoint"
    except OSError as err:
        return f"checkpoint {path} cannot be read ({err.strerror})"
    try:
        record = msgspec.msgpack.decode(raw, type=Checkpoint)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return f"checkpoint {path} is torn or damaged"
    if record.protocol != PROTOCOL or record.name != projection.name or record.version != projection.version:
        return f"checkpoint {path} is of another version of {projection.name} ({record.version})"
    if sha256(record.body).hexdigest() != record.digest:
        return f"checkpoint {path} fails its checksum"
    if record.last_id and anchor_ts(conn, record.last_id) != record.anchor_ts:
        return f"checkpoint {path} is of another history (event {record.last_id} is not the one it folded)"
    try:
        return projection.decode(record.body), record.last_id
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError, KeyError) as err:
        return f"checkpoint {path} does not load ({err})"


def anchor_ts(conn: sqlite3.Connection, event_id: int) -> float | None:
    """The ts of the event a checkpoint was taken at: live, else in the archive segment that holds it
    (retention moved it: the checkpoint of a reader left idle, which no longer holds a move back, is
    still this history's, and its reader folds what moved after it from the archive, not all of it).
    None if no event has that id, or its segment was dropped or fails its checksum."""
    ts = eventindex.event_ts(conn, event_id)
    if ts is not None or event_id >= eventindex.first_live_id(conn):
        return ts
    from pulse.store import archive  # its compression only when a read reaches past the live events
    try:
        event = archive.event_by_id(conn, event_id)
    except (archive.SegmentError, OSError):
        return None
    return event.ts if event is not None else None


def may_write(home: Path) -> bool:
    """Whether a reader (pulsectl) may leave checkpoints under `home`: only as the home's owner. A
    root pulsectl must not leave files that a pulsed running as the home's user cannot replace;
    a reader that may not write still reads the checkpoints there."""
    directory = home / DIRECTORY
    try:
        return home.stat().st_uid == os.geteuid() and os.access(directory if directory.exists() else home, os.W_OK)
    except OSError:
        return False


class Folded(Generic[S]):
    """One projection kept up to date in one process: `catch_up()` returns its state with every
    committed event folded."""

    def __init__(self, projection: Projection[S], conn: sqlite3.Connection, directory: Path, *,
                 progress: Callable[[], None] = lambda: None, every_events: int = CHECKPOINT_EVENTS,
                 every_s: float = CHECKPOINT_S, batch: int = FOLD_BATCH, save: bool = True):
        self.projection, self.conn, self.directory = projection, conn, directory
        self.saves = save                 # False: a reader that may not write the home (reads checkpoints only)
        self.progress, self.every_events, self.every_s, self.batch = progress, every_events, every_s, batch
        self.state: S | None = None
        self.last_id = 0
        self.saved_id = 0                 # last_id of the newest checkpoint written or loaded
        self.saved_at = time.monotonic()
        self.rebuilt: str | None = None   # why the last start rebuilt, or None if it loaded a checkpoint

    def start(self) -> None:
        found = read_checkpoint(self.directory, self.projection, self.conn)
        if isinstance(found, str):
            self.rebuilt = found
            say(INFO, "%s: %s; rebuilding it from the history", self.projection.name, found)
            self.state, self.last_id = self.projection.new(), 0
        else:
            self.rebuilt = None
            self.state, self.last_id = found
            say(INFO, "%s: from its checkpoint at event %d", self.projection.name, self.last_id)
        self.saved_id, self.saved_at = self.last_id, time.monotonic()

    def catch_up(self, conn: sqlite3.Connection | None = None, save: bool = True) -> S:
        """The state with every committed event folded; `conn`: read on it from now on (a worker
        whose requests each open their own). `save`: write the checkpoint if it is due (False: the
        caller holds a write transaction, and saves after it)."""
        if conn is not None:
            self.conn = conn
        if self.state is None:
            self.start()
        upto = eventsdb.last_event_id(self.conn)
        moved = eventindex.first_live_id(self.conn) - 1 if upto else 0
        if self.last_id < moved:
            # What it has not folded left events.db: at a rebuild, or for a reader left idle past
            # the day after which retention no longer waits for its checkpoint. Fold those first.
            self.last_id = self.fold_archive(moved)
        elif self.last_id == 0 and self.projection.rebuild is not None and upto:
            self.state, self.last_id = self.projection.rebuild(self.conn, upto), upto
        while self.last_id < upto:
            batch = eventsdb.events_after(self.conn, self.last_id, upto, self.projection.types, self.batch)
            self.projection.fold(self.state, batch)
            self.last_id = batch[-1].id if len(batch) == self.batch else upto
            if self.last_id < upto:
                self.progress()        # a long catch-up (a rebuild) outlasts hung_after_ms
        if save and self.due():
            self.save()
        return self.state

    def fold_archive(self, upto: int) -> int:
        """The events after last_id through `upto`, which moved to archive segments (pulse.store.archive),
        folded segment by segment: a rebuild's first part, or what moved while a reader was idle. A
        segment that cannot be read (it fails its checksum) is said in the log and skipped: the worker
        keeps running on what the rest holds."""
        from pulse.store import archive  # its compression only when a read reaches past the live events
        wanted, after = frozenset(self.projection.types), self.last_id
        directory = archive.directory_of(self.conn)
        for seg in archive.archived(self.conn):
            if seg.first_id > upto or seg.last_id <= after or (wanted and not wanted.intersection(seg.counts)):
                continue
            try:
                events = [e for e in archive.read_segment(directory, seg)
                          if e.id > after and (not wanted or e.type in wanted)]
            except archive.SegmentError as err:
                say(ERROR, "%s: rebuilt without events %d-%d: %s", self.projection.name, seg.first_id, seg.last_id, err)
                continue
            for i in range(0, len(events), self.batch):
                self.projection.fold(self.state, events[i:i + self.batch])
            self.progress()
        return upto

    def due(self) -> bool:
        if self.last_id == self.saved_id:
            return False
        return (self.last_id - self.saved_id >= self.every_events or self.rebuilt is not None
                or time.monotonic() - self.saved_at >= self.every_s)

    def save(self) -> None:
        """Write the checkpoint now (after a rebuild, periodically, at a clean stop). A failure (a full
        disk) costs only the next start's time, so it is logged, not raised."""
        if self.state is None or self.last_id == self.saved_id or not self.saves:
            return
        try:
            anchor = eventindex.event_ts(self.conn, self.last_id) or 0.0
            write_checkpoint(self.directory, self.projection, self.state, self.last_id, anchor)
        except (OSError, sqlite3.Error) as err:
            say(WARNING, "%s: could not write its checkpoint: %s", self.projection.name, err)
            self.saved_at = time.monotonic()   # try again after every_s, not at every call
            return
        self.saved_id, self.saved_at, self.rebuilt = self.last_id, time.monotonic(), None
