"""pulsed's side of its event log: number each lifecycle event, hold it until the event
writer (pulse.workers.eventwriter, a process of its own) reports it committed, and send again
to a replacement writer whatever its predecessor never acknowledged.

Nothing here waits: `put()` and `send()` hand frames to zmq without blocking, and
what the writer's socket does not take now waits in memory, at most CAPACITY
events. Beyond that (the writer down or stuck for a long while) new events are
counted as dropped and said in the log, never waited for.
"""

from __future__ import annotations

import collections

import zmq

from pulse.core import logs
from pulse.core.wire import codec, eventmsgs, heartbeats

log = logs.Log("pulse.eventqueue")
CAPACITY = 10_000


class EventQueue:
    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.pending: collections.deque[eventmsgs.Event] = collections.deque()   # not yet committed, by seq
        self.unsent = 0      # how many at the tail of `pending` the current writer has not been sent
        self.seq = 0         # the last event numbered
        self.written = 0     # the last event the writer committed
        self.dropped = 0
        self.ending = False  # END_OF_EVENTS is due after the last event: pulsed stops its writer for good
        self.end_unsent = False

    def put(self, event: eventmsgs.Event) -> None:
        if len(self.pending) >= CAPACITY:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.error("the event writer is not keeping up: %d lifecycle events dropped so far", self.dropped)
            return
        self.seq += 1
        event.seq = self.seq
        self.pending.append(event)
        self.unsent += 1
        self.send()

    def send(self) -> None:
        """Send the writer what it has not had, while its socket takes them; the end last."""
        while self.unsent:
            try:
                self.sock.send(codec.encode(self.pending[-self.unsent]), zmq.NOBLOCK)
            except zmq.Again:
                return   # no writer connected, or it is behind: send() again when the socket is writable
            self.unsent -= 1
        if self.end_unsent:
            try:
                self.sock.send(codec.encode(eventmsgs.END_OF_EVENTS), zmq.NOBLOCK)
            except zmq.Again:
                return
            self.end_unsent = False

    def end(self) -> None:
        """Tell the writer nothing more comes (pulsed is stopping it last, every other worker down):
        it writes what it has and exits without waiting for the quiet a SIGTERM alone makes it wait."""
        self.ending = self.end_unsent = True
        self.send()

    @property
    def to_send(self) -> bool:
        return bool(self.unsent) or self.end_unsent

    def committed(self, message: heartbeats.Committed) -> None:
        self.written = max(self.written, message.seq)
        while self.pending and self.pending[0].seq <= message.seq:
            self.pending.popleft()
        self.unsent = len(self.pending) if message.resend else min(self.unsent, len(self.pending))
        self.send()

    def resend(self) -> None:
        """A new writer is up: it gets everything not committed (and skips what it already has)."""
        self.unsent = len(self.pending)
        self.end_unsent = self.ending
        self.send()
