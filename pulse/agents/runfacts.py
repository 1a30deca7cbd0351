"""What a running run has reported to Pulse's telemetry receiver, as it arrives.

The receiver (pulse.workers.telemetry) writes one `telemetry` fact per run and flush: what happened
since the previous one (tokens, cost, API requests, tool calls) and when it last heard of the run
(`last_at`). A run's watch (pulse.agents.runlimits.Watch) reads them here, from a connection of its
own thread, at most every READ_S and only the facts written since its last read (the type's index
by id): a read costs the same at the run's first minute and its last. The run's totals are the sum;
the facts of the last WINDOW_S are kept for the rate of its requests and tool calls.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections import deque
from pathlib import Path

log = logging.getLogger("pulse.executor")

READ_S = 1.0
WINDOW_S = 60.0               # how far back the rate of requests and tool calls looks


class RunFacts:
    def __init__(self, run: str, events_db: Path, after_id: int = 0):
        """`after_id`: the last event id before the run started."""
        self.run, self.events_db, self.after_id = run, events_db, after_id
        self.cost_usd = 0.0
        self.api_requests = 0
        self.tool_calls = 0
        self.tokens: dict[str, int] = {}
        self.heard_at = 0.0                    # the receiver's last record of the run (wall clock); 0: none
        self.recent: deque[tuple[float, int, int]] = deque()     # (last_at, api_requests, tool_calls)
        self.next_read = 0.0
        self.conn: sqlite3.Connection | None = None

    def read(self, now: bool = False) -> None:
        """Take in the facts written since the last read (at most every READ_S unless `now`; a busy
        store: next time)."""
        if not now and time.monotonic() < self.next_read:
            return
        self.next_read = time.monotonic() + READ_S
        try:
            if self.conn is None:
                self.conn = sqlite3.connect(f"file:{self.events_db}?mode=ro", uri=True, timeout=1)
            rows = self.conn.execute("SELECT id, target, data FROM events WHERE type = 'telemetry' AND id > ? "
                                     "ORDER BY id", (self.after_id,)).fetchall()
        except sqlite3.Error as err:
            log.debug("run %s: telemetry facts not read: %s", self.run, err)
            return
        for event_id, target, data in rows:
            self.after_id = event_id
            if target == self.run:
                self.add(fact_of(data))

    def add(self, fact: dict) -> None:
        self.cost_usd += number(fact.get("cost_usd"))
        requests, calls = int(number(fact.get("api_requests"))), int(number(fact.get("tool_calls")))
        self.api_requests += requests
        self.tool_calls += calls
        for kind, n in (fact.get("tokens") or {}).items():
            self.tokens[kind] = self.tokens.get(kind, 0) + int(number(n))
        at = number(fact.get("last_at"))
        if at:
            self.heard_at = max(self.heard_at, at)
            self.recent.append((at, requests, calls))

    def rate(self, now: float) -> tuple[int, int]:
        """(API requests, tool calls) the run reported in the last WINDOW_S."""
        while self.recent and self.recent[0][0] < now - WINDOW_S:
            self.recent.popleft()
        return sum(r for _, r, _ in self.recent), sum(c for _, _, c in self.recent)

    def totals(self) -> dict:
        """What the run reported so far (for its end's facts); {} when it reported nothing."""
        if not self.heard_at:
            return {}
        return {"cost_usd": round(self.cost_usd, 6), "tokens": dict(self.tokens),
                "api_requests": self.api_requests, "tool_calls": self.tool_calls}

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except sqlite3.Error as err:      # another thread's (a watch that outlived its stop)
                log.debug("run %s: telemetry facts' connection not closed here: %s", self.run, err)
            self.conn = None


def fact_of(data) -> dict:
    try:
        fact = json.loads(data) if isinstance(data, (str, bytes)) else data
    except ValueError:
        return {}
    return fact if isinstance(fact, dict) else {}


def number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
