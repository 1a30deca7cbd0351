"""The fleet's events outbox: every event of events.db after the cursor, to the PULSE_EVENTS stream.

Each event goes to `pulse.events.<host>.<type>` with Nats-Msg-Id <host>:<event id>, in windows of
WINDOW, up to IN_FLIGHT windows unacknowledged at once, on one connection (which keeps their order).
The cursor (pulse.store.fleetcursor) moves only past events the stream acknowledged, oldest window
first; a crash in between republishes a few, which the stream drops by their id. Any event of a
window left unacknowledged ends the connection, and a new one resumes from it: the stream holds a
host's events in events.db's order (unless the server refused one event and stored a later one:
a refused event, such as one over the server's max_payload, stops the outbox, whose status says which).

Why not nats-py's publish_async: it awaits a semaphore per message, so its flusher wakes and writes
one message per send() (a system call per event: 1,600-2,700 events/s here). Published back to back
without yielding, a window leaves in one write; the acknowledgements come to one subscription of
this connection's own, each named by its event id. The event's data goes on as events.db stores it
(JSON text), never decoded and encoded again; and the cursor's commit (synchronous=FULL: an fsync,
~6 ms here) runs in a thread of its own, so publishing never waits on the disk.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time
from dataclasses import dataclass, field

import msgspec

from pulse.core import fleetnames as names
from pulse.store import connection, eventsdb, fleetcursor
from pulse.store.commitwatch import CommitWatch

IDLE_LOOK_S = 2.0            # the outbox wakes on each commit (pulse.store.commitwatch); looks this often anyway
PUBLISH_TIMEOUT_S = 2.0      # a window not acknowledged this long after it was sent ends the connection
WINDOW = 256                 # events published back to back, in one write
IN_FLIGHT = 4                # windows sent and not yet acknowledged, at most
STATUS = "Status"            # the header of a server's own answer (503: no stream listens, e.g. no leader)


class Published(msgspec.Struct):
    """An event as the stream holds it: `data` as events.db stores it (JSON), passed on undecoded."""
    host: str
    id: int
    seq: int
    ts: float
    type: str
    source: str
    target: str | None
    data: msgspec.Raw


class PubAnswer(msgspec.Struct):
    """The stream's answer to a publish: stored (a duplicate too), or an error."""
    stream: str | None = None
    seq: int | None = None
    error: dict | None = None


_encode = msgspec.json.Encoder().encode
_answer = msgspec.json.Decoder(PubAnswer).decode


def event_body(host: str, row: tuple) -> bytes:
    """One row of eventsdb.event_rows_after as the stream's message."""
    event_id, seq, ts, type_, source, target, data = row
    return _encode(Published(host, event_id, seq, ts, type_, source, target, msgspec.Raw(data.encode())))


def why_refused(msg) -> str | None:
    """None if `msg` (the answer to one publish) says the event is stored, else why it is not."""
    if msg.headers and msg.headers.get(STATUS):
        return f"no stream answered (status {msg.headers[STATUS]}: no stream leader, or no stream)"
    try:
        answer = _answer(msg.data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return f"an answer that is not the stream's: {bytes(msg.data[:100])!r}"
    if answer.error is not None:
        return str(answer.error.get("description") or answer.error)
    return None if answer.seq is not None else f"an answer without a sequence: {bytes(msg.data[:100])!r}"


@dataclass
class Window:
    """Events sent together, and what the stream answered for each (by event id)."""
    ids: list[int]
    sent_at: float
    answered: asyncio.Future
    answers: dict[int, str | None] = field(default_factory=dict)
    sent: int = 0                      # how many of `ids` went out (sending stops at the first it cannot send)
    unsent_why: str | None = None      # why the rest of `ids` was never sent

    def __post_init__(self):
        self.sent = len(self.ids)

    def hear(self, event_id: int, why: str | None) -> None:
        if event_id in self.answers or self.answered.done():
            return
        self.answers[event_id] = why
        self.check()

    def check(self) -> None:
        if len(self.answers) >= self.sent and not self.answered.done():
            self.answered.set_result(None)

    def cut(self, at: int, why: str) -> None:
        """Sending stopped at `ids[at]`: the window is answered once the ones before it are."""
        self.sent, self.unsent_why = at, why
        self.check()

    def outcome(self) -> tuple[int, str | None]:
        """How many from its front the stream stored, and why the next one is not (None: all were)."""
        for i, event_id in enumerate(self.ids[:self.sent]):
            if event_id not in self.answers:
                return i, "no acknowledgement within the publish timeout"
            if self.answers[event_id] is not None:
                return i, self.answers[event_id]
        return self.sent, self.unsent_why


class Acks:
    """The answers to one connection's publishes: each one's reply subject is <prefix>.<event id>."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.cut = len(prefix) + 1
        self.windows: dict[int, Window] = {}      # event id → the window it was sent in

    def reply_to(self, event_id: int) -> str:
        return f"{self.prefix}.{event_id}"

    async def heard(self, msg) -> None:
        try:
            event_id = int(msg.subject[self.cut:])
        except ValueError:
            return
        window = self.windows.pop(event_id, None)
        if window is not None:
            window.hear(event_id, why_refused(msg))

    def forget(self, window: Window) -> None:
        for event_id in window.ids:
            self.windows.pop(event_id, None)


class CursorKeeper:
    """The outbox's cursor in fleet-cursor.db, read and committed in a thread of its own (the
    connection lives there): the loop hands a commit over and goes on publishing; while one is on
    disk the next waits, so commits come as often as the disk allows and never more than wanted."""

    def __init__(self, path):
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fleet-cursor")
        self.conn = self.pool.submit(fleetcursor.open_cursor, path).result()
        self.committed = self.pool.submit(fleetcursor.read_cursor, self.conn, names.EVENTS_STREAM).result()
        self.writing: concurrent.futures.Future | None = None
        self.wanted = self.committed

    def commit_soon(self, last: int) -> None:
        """Commit `last` once the commit on disk now (if any) is done."""
        self.wanted = last
        if self.writing is None or self.writing.done():
            self.start()

    def start(self) -> None:
        if self.wanted != self.committed:
            last = self.wanted
            self.writing = self.pool.submit(self.write, last)

    def write(self, last: int) -> None:
        fleetcursor.commit_cursor(self.conn, names.EVENTS_STREAM, last)
        self.committed = last

    def settle(self) -> None:
        """Wait for the commit on disk, then commit what is wanted (blocking: at the end)."""
        if self.writing is not None:
            self.writing.result()
        self.start()
        if self.writing is not None:
            self.writing.result()

    def close(self) -> None:
        try:
            self.settle()
        finally:
            self.pool.submit(self.conn.close).result()
            self.pool.shutdown()


class Outbox:
    def __init__(self, worker):
        self.w = worker
        self.host = worker.host
        self.batch = worker.config.fleet.events_batch
        self.subjects: dict[str, str] = {}        # event type → its subject
        self.link_errors = worker.link_errors      # what the link retries (pulse.workers.fleet.link_errors)

    def subject(self, event_type: str) -> str:
        subject = self.subjects.get(event_type)
        if subject is None:
            subject = self.subjects[event_type] = names.event_subject(self.host, event_type)
        return subject

    async def run(self, nc) -> None:
        cursor = CursorKeeper(self.w.paths.home / names.CURSOR_FILE)
        last = sent = cursor.committed            # acknowledged through; sent through
        self.w.set_published(last, 0)
        inflight: collections.deque[Window] = collections.deque()
        rows: list[tuple] = []
        events = commits = sub = None
        try:
            events = connection.open_readonly(self.w.paths.events_db)
            commits = CommitWatch(self.w.paths.events_db)
            acks = Acks(nc.new_inbox())
            sub = await nc.subscribe(f"{acks.prefix}.*", cb=acks.heard)
            while True:
                while len(inflight) < IN_FLIGHT and not (inflight and inflight[-1].unsent_why):
                    if not rows:
                        rows = eventsdb.event_rows_after(events, sent, self.batch)
                        if not rows:
                            break
                    window, rows = rows[:WINDOW], rows[WINDOW:]
                    inflight.append(await self.send(nc, acks, window))
                    sent = window[-1][0]
                if not inflight:
                    cursor.commit_soon(last)
                    await commits.wait(IDLE_LOOK_S)
                    continue
                oldest = inflight[0]
                left = oldest.sent_at + PUBLISH_TIMEOUT_S - time.monotonic()
                if left > 0:
                    await asyncio.wait([oldest.answered], timeout=left)   # never wait_for: it can lose a cancel (3.11)
                stored, why = oldest.outcome()
                if stored:
                    last = oldest.ids[stored - 1]
                    self.w.set_published(last, stored)
                    if last - cursor.committed >= self.batch or why is not None:
                        cursor.commit_soon(last)
                if why is not None:   # a fresh connection resumes from the first unacknowledged one
                    raise ConnectionError(f"event {oldest.ids[stored]} not acknowledged ({why}); publishing again")
                acks.forget(inflight.popleft())
        finally:
            cursor.commit_soon(last)              # what was acknowledged of a cut window
            cursor.close()
            if commits is not None:
                commits.close()
            if events is not None:
                events.close()
            if sub is not None:
                try:
                    await sub.unsubscribe()
                except self.link_errors:          # the connection is gone: so is the subscription
                    pass

    async def send(self, nc, acks: Acks, rows: list[tuple]) -> Window:
        """Publish `rows` back to back (nothing here yields to the loop, so they leave in one write)."""
        window = Window(ids=[row[0] for row in rows], sent_at=time.monotonic(),
                        answered=asyncio.get_running_loop().create_future())
        for i, row in enumerate(rows):
            event_id = row[0]
            acks.windows[event_id] = window
            try:
                await nc.publish(self.subject(row[3]), event_body(self.host, row), reply=acks.reply_to(event_id),
                                 headers={"Nats-Msg-Id": names.event_msg_id(self.host, event_id)})
            except self.link_errors as err:       # closed, or refused here (max_payload): never sent
                for unsent in window.ids[i:]:
                    acks.windows.pop(unsent, None)
                window.cut(i, names.describe(err))
                break
        return window
