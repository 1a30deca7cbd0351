"""The watcher process: built-in watchers sense the host (Percept).

It runs the built-in watchers (pulse.sensing.builtin) through a WatcherRunner, which
writes their samples to vitals.db and rings the tick's wake socket when a
watcher's should_wake says so. It also garbage-collects vitals.db by age.

Startup stays fast: open() only opens the two databases and the wake socket and
builds the watcher objects; every collect starts from the loop, after Ready.
No subprocess is ever started here (nothing to orphan).
"""

from __future__ import annotations

import logging
import sqlite3
import time

import zmq

from pulse.core import client
from pulse.sensing.builtin import ProcessAlive, ProcessMemory, builtin_watchers
from pulse.sensing.freshness import FreshWatch
from pulse.sensing.runner import WatcherRunner
from pulse.store import eventsdb, vitalsdb
from pulse.workers.harness import Worker


class VitalsGc:
    """Deletes vitals older than the retention, once at start and then every EVERY_S.

    It deletes STEP_ROWS per transaction from the main loop and pauses between
    steps: each step holds the write lock for milliseconds, and the pause lets
    other writers (the engine's watchers, this process's own runner) in between,
    so nobody waits out a whole collection; the loop keeps heartbeating."""

    EVERY_S = 600
    STEP_ROWS = 1_000
    PAUSE_S = 0.02
    RETRY_S = 5           # after a failed step (e.g. the database stayed locked)

    def __init__(self, conn: sqlite3.Connection, retention_s: float, log: logging.Logger, now: float):
        self.conn, self.retention_s, self.log = conn, retention_s, log
        self.due = now
        self.cutoff: float | None = None   # wall time: rows older than this go, fixed for one collection
        self.deleted = 0

    def next_timer(self) -> float:
        return self.due

    def on_timer(self, now: float) -> None:
        if now < self.due:
            return
        if self.cutoff is None:
            self.cutoff, self.deleted = time.time() - self.retention_s, 0
        try:
            n = vitalsdb.gc_vitals_step(self.conn, self.cutoff, self.STEP_ROWS)
        except sqlite3.Error as err:
            self.log.warning("vitals gc: %s; retrying in %d s", err, self.RETRY_S)
            self.due = now + self.RETRY_S
            return
        self.deleted += n
        if n == self.STEP_ROWS:
            self.due = now + self.PAUSE_S
            return
        if self.deleted:
            self.log.info("vitals gc: deleted %d vitals older than %.1f h", self.deleted, self.retention_s / 3600)
        self.cutoff, self.due = None, now + self.EVERY_S


class WatcherWorker(Worker):
    name = "watcher"

    def open(self) -> None:
        self.vitals = vitalsdb.open_vitals(self.paths.vitals_db)
        self.events = eventsdb.open_events(self.paths.events_db)
        # Until the connection to the tick is up, a wake fails, and the runner offers it again.
        self.wake = self.socket(zmq.PUSH, self.paths.endpoint("wake"), bind=False, **client.DOORBELL)
        watchers = builtin_watchers(self.config, self.paths.home)
        self.processes = {w.process.name: w for w in watchers if isinstance(w, ProcessAlive)}
        self.memory = {w.alive.process.name: w for w in watchers if isinstance(w, ProcessMemory)}
        # A [[watch.fresh]] carries on from its last sample: a restarted watcher must not take an
        # answer that stopped changing an hour ago for news.
        fresh = [w for w in watchers if isinstance(w, FreshWatch)]
        for key, vital in vitalsdb.latest_vitals(self.vitals, [w.key for w in fresh]).items() if fresh else ():
            next(w for w in fresh if w.key == key).resume(vital.data)
        self.runner = WatcherRunner(watchers, vitals_conn=self.vitals, events_conn=self.events,
                                    ballast_path=self.paths.home / "ballast",
                                    wake_sock=self.wake, source=self.name, config=self.config, log=self.log)
        # The runner adds and drops fds as they come and go (a pidfd per live critical process);
        # sharing its dict keeps the harness's poll set exact at every turn of the loop.
        self.runner.handlers.update(self.handlers)
        self.handlers = self.runner.handlers
        self.gc = VitalsGc(self.vitals, self.config.store.vitals_retention_h * 3600, self.log, time.monotonic())

    def status_extras(self) -> dict:
        return {"processes": {name: w.seen and {**w.seen, "rss_mb": self.memory[name].rss_mb if w.seen["alive"] else None}
                              for name, w in self.processes.items()}}

    def next_timer(self) -> float | None:
        return min(t for t in (self.runner.next_timer(), self.gc.next_timer()) if t is not None)

    def on_timer(self, now: float) -> None:
        self.runner.on_timer(now)
        self.gc.on_timer(now)

    def close(self) -> None:
        self.runner.close()
        self.wake.close()
        self.vitals.close()
        self.events.close()
