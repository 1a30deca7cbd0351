"""Is a run still alive in any way that shows? ([[agent]] stall_s)

A run is silent while it prints nothing (stdout or stderr) and, when it reports to Pulse's telemetry
receiver, the receiver heard nothing of it either (its `telemetry` facts, whose `last_at` says when
the receiver last got a record of the run). A run silent for stall_s is stalled: the run's watch
(pulse.agents.runlimits.Watch) ends it at once, every process of it, reason `stalled`, instead of
waiting out timeout_s (a headless CLI hung on an API that accepts and never answers).

The telemetry facts are read from events.db at most every TELEMETRY_READ_S, from a connection of the
watch's own thread, and only the ones written since the last read (the type's index by id): the
cost of a check does not grow with the run's length.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

log = logging.getLogger("pulse.executor")

TELEMETRY_READ_S = 1.0


class Stall:
    def __init__(self, stall_s: float, run: str, events_db: Path | None, after_id: int = 0):
        """`events_db`: where the run's telemetry facts appear (None: it reports to no receiver);
        `after_id`: the last event id before the run started."""
        self.stall_s, self.run, self.events_db, self.after_id = stall_s, run, events_db, after_id
        self.heard_mono = time.monotonic()      # output, or the run's start
        self.heard_wall = 0.0                   # the receiver's last record of the run (wall clock)
        self.next_read = 0.0
        self.conn: sqlite3.Connection | None = None

    def output(self) -> None:
        """Called by the run's reader whenever output arrives."""
        self.heard_mono = time.monotonic()

    def silent_s(self) -> float:
        self._read_telemetry()
        since_output = time.monotonic() - self.heard_mono
        since_telemetry = time.time() - self.heard_wall if self.heard_wall else since_output
        return min(since_output, since_telemetry)

    def check(self) -> str | None:
        """Why the run is stalled, or None. Called from the watch's thread only."""
        silent = self.silent_s()
        if silent < self.stall_s:
            return None
        what = "no output and no telemetry" if self.events_db is not None else "no output"
        return f"the run was silent for {silent:.0f} s ({what}), past its stall_s ({self.stall_s:g} s)"

    def _read_telemetry(self) -> None:
        if self.events_db is None or time.monotonic() < self.next_read:
            return
        self.next_read = time.monotonic() + TELEMETRY_READ_S
        try:
            if self.conn is None:
                self.conn = sqlite3.connect(f"file:{self.events_db}?mode=ro", uri=True, timeout=1)
            last_id, heard = self.conn.execute(
                "SELECT max(id), max(CASE WHEN target = ? THEN json_extract(data, '$.last_at') END) "
                "FROM events WHERE type = 'telemetry' AND id > ?", (self.run, self.after_id)).fetchone()
        except sqlite3.Error as err:          # a busy store: the output alone decides until the next read
            log.debug("run %s: telemetry facts not read: %s", self.run, err)
            return
        if last_id is not None:
            self.after_id = last_id
        if isinstance(heard, (int, float)):
            self.heard_wall = max(self.heard_wall, float(heard))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
