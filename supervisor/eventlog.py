"""pulsed's lifecycle events: committed by a thread, so the loop never waits on SQLite.

`put()` never blocks: the queue is bounded, and when it is full (a locked or full
disk for a long while) the event is counted as dropped and said in the log,
never waited for. A failed commit keeps its batch and retries with backoff.
Committed events are published on the events PUB socket.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from pathlib import Path

import msgspec
import zmq

from pulse import store
from pulse.wire import Event

log = logging.getLogger("pulse.eventlog")
CAPACITY = 10_000
BATCH = 512


class EventWriter:
    def __init__(self, path: Path, ctx: zmq.Context, pub_endpoint: str):
        self.path, self.ctx, self.pub_endpoint = path, ctx, pub_endpoint
        self.queue: queue.Queue[Event | None] = queue.Queue(CAPACITY)
        self.dropped = 0
        self.seq = 0
        self.thread = threading.Thread(target=self._run, name="eventlog", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, event: Event) -> None:
        self.seq += 1
        event.seq = self.seq
        try:
            self.queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.error("events.db is not keeping up: %d lifecycle events dropped so far", self.dropped)

    def close(self, timeout: float) -> bool:
        """Commit what is queued, then stop; False if that took longer than `timeout`."""
        try:
            self.queue.put(None, timeout=timeout)
        except queue.Full:
            return False
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _run(self) -> None:
        pub = self.ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(self.pub_endpoint)
        conn = None
        stopping = False
        while not stopping:
            batch = [self.queue.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            if None in batch:
                stopping = True
                batch = [e for e in batch if e is not None]
            delay = 0.05
            while batch:
                try:
                    if conn is None:
                        conn = store.open_events(self.path)
                        conn.execute("PRAGMA cache_size = -256")   # KiB: it only appends; keep pulsed small
                    store.append_events(conn, batch)
                    break
                except (sqlite3.Error, OSError) as err:
                    log.error("events.db: cannot commit %d events (%s); retrying in %.1fs", len(batch), err, delay)
                    conn = None
                    if stopping:
                        return
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
            for event in batch:
                pub.send_multipart([event.type.encode(), msgspec.json.encode(event)])
        if conn is not None:
            conn.close()
        pub.close()
