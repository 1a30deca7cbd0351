"""The event writer: pulsed's lifecycle events into events.db, and out on the events socket.

pulsed itself keeps no SQLite: it stays small, and a locked database or a full
disk can never block its loop. It numbers its events and PUSHes them here
(eventlog socket), and holds each one until this process reports it committed
(heartbeats.Committed, over the heartbeat socket). A replaced writer gets again
whatever was not acknowledged; the writer takes events strictly in sequence,
picking up after what events.db already holds of this run of pulsed
(`eventsdb.pulsed_committed_seq`), so every event is written exactly once.

Lifecycle events come in bursts (a worker's exit, restart, start and ready
within ~20 ms), so a batch is written COALESCE_S after its first event: one
commit per burst, after it, instead of one per event competing for the disk
and the write lock with the very worker being restarted. A commit that fails
(a locked database, a full disk) keeps its batch and is retried with backoff
from the loop, so heartbeats go on; meanwhile pulsed holds what follows.
"""

from __future__ import annotations

import os
import sqlite3
import time

import msgspec
import zmq

from pulse.agents import spend
from pulse.core import clock
from pulse.core.childspecs import EVENT_WRITER
from pulse.core.wire import eventmsgs, heartbeats
from pulse.store import eventsdb, retention
from pulse.workers.harness import Worker

BATCH = 512
COALESCE_S = 0.05
RETRY_FIRST_S, RETRY_MAX_S = 0.05, 5.0
# After a SIGTERM the writer stays while pulsed may still send: until its inbox has been quiet this
# long and all it got is written, LINGER_MAX_S at most. A SIGTERM to every process at once reaches it
# first, and the other workers' exits, which pulsed records after, still get written. An ordered stop
# needs no wait: pulsed stops the writer last and says so (eventmsgs.END_OF_EVENTS after its last event).
LINGER_QUIET_S = 0.75
LINGER_MAX_S = 3.0


class EventWriter(Worker):
    name = EVENT_WRITER

    def open(self) -> None:
        self.conn: sqlite3.Connection | None = self.connect()
        self.committed = eventsdb.pulsed_committed_seq(self.conn, self.spec.run)
        self.reported: int | None = None      # the last `committed` pulsed was told
        self.gap_reported = False
        self.batch: list[eventmsgs.Event] = []
        self.write_at: float | None = None    # when the batch is due: coalescing, or a retry's backoff
        self.failures = 0                     # commits failed in a row, for the retry's backoff
        self.last_received = time.monotonic()
        self.stop_seen: float | None = None   # when the loop first asked stays_after_stop
        self.ended = False                    # pulsed said END_OF_EVENTS: nothing more comes
        self.inbox = self.socket(zmq.PULL, self.paths.endpoint("eventlog"), bind=True, handler=self.receive_events)
        self.pub = self.socket(zmq.PUB, self.paths.endpoint("events"), bind=True)
        # Retention runs here, off the survival path: a move step (one segment, 0.1-0.2 s) delays only
        # the commit of pulsed's lifecycle events, which pulsed holds until they are written.
        self.retention = retention.Pacer(self.retention_conn, self.paths.home, self.config.store, self.name,
                                         self.log, time.monotonic(), readers=spend.listing_projections())

    def connect(self) -> sqlite3.Connection:
        conn = eventsdb.open_events(self.paths.events_db)
        # Wait on a lock only briefly: longer ones are retried from the loop, which keeps heartbeating.
        conn.execute(f"PRAGMA busy_timeout = {self.config.timings.hung_after_ms // 4}")
        conn.execute("PRAGMA cache_size = -256")   # KiB: it only appends
        return conn

    def retention_conn(self) -> sqlite3.Connection:
        if self.conn is None:
            self.conn = self.connect()
        return self.conn

    def receive_events(self) -> None:
        for event in self.messages(self.inbox, eventmsgs.EventlogMessage, "eventlog"):
            self.last_received = time.monotonic()
            if event == eventmsgs.END_OF_EVENTS:
                self.ended = True
                continue
            expected = self.committed + len(self.batch) + 1
            if event.seq == expected:
                self.batch.append(event)
            elif event.seq > expected and not self.gap_reported:
                # Something before it never arrived (sent to a predecessor): ask for all of it again.
                self.gap_reported = self.to_pulsed(heartbeats.Committed(self.name, os.getpid(), self.committed, resend=True))
            # below `expected`: already written, sent again to be sure
            if len(self.batch) >= BATCH:
                self.handlers.pop(self.inbox, None)   # read on once this batch is in
                break
        if self.batch and (self.write_at is None or self.ended and not self.failures):
            # no burst is coming after the end: its batch is written now (a retry keeps its backoff)
            self.write_at = time.monotonic() + (0.0 if len(self.batch) >= BATCH or self.ended else COALESCE_S)

    def write(self) -> None:
        self.write_at = None
        if not self.batch:
            return
        try:
            if self.conn is None:
                self.conn = self.connect()
            eventsdb.append_events(self.conn, self.batch)
        except (sqlite3.Error, OSError) as err:
            self.failures += 1
            retry_s = clock.backoff(self.failures, RETRY_FIRST_S, RETRY_MAX_S)
            self.log.error("events.db: cannot commit %d lifecycle events (%s); retrying in %.2fs",
                           len(self.batch), err, retry_s)
            if self.conn is not None:
                self.conn.close()
                self.conn = None
            self.write_at = time.monotonic() + retry_s
            return
        self.failures = 0
        self.committed = self.batch[-1].seq
        self.gap_reported = False
        for event in self.batch:
            self.pub.send_multipart([event.type.encode(), msgspec.json.encode(event)])
        self.batch = []
        self.handlers[self.inbox] = self.receive_events
        self.report_committed()

    def report_committed(self) -> None:
        if self.reported != self.committed and self.to_pulsed(heartbeats.Committed(self.name, os.getpid(), self.committed)):
            self.reported = self.committed

    def on_timer(self, now: float) -> None:
        """Runs after every turn of the loop (at least once a heartbeat): writes and reports are due here."""
        if self.write_at is not None and now >= self.write_at:
            self.write()
        self.report_committed()
        if self.stop_seen is None and not self.batch:
            self.retention.on_timer(now)

    def stays_after_stop(self, now: float) -> bool:
        if self.stop_seen is None:
            self.stop_seen = now
            self.last_received = max(self.last_received, now)   # quiet is counted from the SIGTERM
        if now - self.stop_seen >= LINGER_MAX_S:
            return False
        if self.ended:
            return bool(self.batch)
        return bool(self.batch) or now - self.last_received < LINGER_QUIET_S

    def next_timer(self) -> float | None:
        if self.stop_seen is not None:     # lingering: wake to see the quiet out (or the batch written)
            quiet_at = None if self.ended else self.last_received + LINGER_QUIET_S
            return min((t for t in (self.write_at, quiet_at) if t is not None), default=None)
        return min(t for t in (self.write_at, self.retention.next_timer()) if t is not None)

    def close(self) -> None:
        self.receive_events()
        self.write()
        if self.conn is not None:
            self.conn.close()
        self.inbox.close()
        self.pub.close()
