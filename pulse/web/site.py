"""What the operator's page's routes share: `Web` (the home, the token, the metrics' counts, the task
board, the one watch of events.db's commits), the read-only connections each request opens, and the
pages of the nav, each declared where its JSON route is defined (`page`)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from pulse.core import client, clock
from pulse.core.config import Agent, SpendLimits
from pulse.core.home import Paths
from pulse.core.wire import controlmsgs
from pulse.store import connection, projection
from pulse.store.commitwatch import CommitWatch
from pulse.web import taskboard
from pulse.web.metrics import Counts, MetricsFold


class Page(NamedTuple):
    """A page of the nav, as the module that feeds it declares it. pulse.web.pages makes the nav, the
    page's route (`/<name>`, the overview `/`) and `/api/<name>` from it; static/app.js draws it."""
    name: str
    order: int                      # its place in the nav, lowest first
    api: Callable | None = None     # GET /api/<name>; None for a page fed by its stream
    first: Callable[[Any, Any], Any] | None = None   # (web, request) → its data as the page first draws it


PAGES: dict[str, Page] = {}       # every declared page, by name: declared as the modules that feed them are imported


def declare(row: Page) -> Page:
    """Add `row` to PAGES: a name or a place in the nav that another page has is refused, naming both."""
    for other in PAGES.values():
        if other.name == row.name or other.order == row.order:
            raise ValueError(f"page {row.name!r} (order {row.order}) clashes with page {other.name!r} "
                             f"(order {other.order}): each page has its own name and its own place in the nav")
    PAGES[row.name] = row
    return row


def page(name: str, order: int, first: Callable[[Any, Any], Any] | None = None) -> Callable:
    """Declare the page `name`, at `order` in the nav, fed by the decorated route (GET /api/<name>)."""
    def declared(api: Callable) -> Callable:
        declare(Page(name, order, api, first))
        return api
    return declared


def in_nav_order() -> list[Page]:
    return sorted(PAGES.values(), key=lambda row: row.order)


TAIL_S = 1.0                      # the events tail looks at least this often (it wakes on each commit)


class Commits:
    """One watch of events.db's commits for every stream of the page (pulse.store.commitwatch), fanned
    out: each client's stream waits on it, none polls on a timer of its own."""

    def __init__(self, db: Path):
        self.db, self.count = db, 0
        self.changed: asyncio.Condition | None = None
        self.task: asyncio.Task | None = None

    async def after(self, seen: int, timeout_s: float) -> int:
        """Once a commit newer than `seen` (a count this returned before) came, or `timeout_s` passed."""
        if self.task is None:       # the first stream starts the one watch, on the server's loop
            self.changed = asyncio.Condition()
            self.task = asyncio.create_task(self.watch())
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: self.count != seen), timeout_s)
            except TimeoutError:
                pass
        return self.count

    async def watch(self) -> None:
        watch = CommitWatch(self.db)
        try:
            while True:
                await watch.wait(TAIL_S)
                async with self.changed:
                    self.count += 1
                    self.changed.notify_all()
        finally:
            watch.close()


class Web:
    """What the routes share: the home, the token file, the metrics' counts."""

    def __init__(self, paths: Paths, token_file: Path, effect_deadline_s: float):
        self.paths, self.token_file = paths, token_file
        self.effect_deadline_s = effect_deadline_s   # from the web worker's slice, never config.toml on disk
        self._token: tuple[float, str] | None = None
        self.counts: Counts | None = None
        self.metrics = MetricsFold(paths.home / projection.DIRECTORY)
        self.counting = threading.Lock()     # one fold at a time: the warm-up, or a scrape
        self.diffs: dict[tuple[str, str], str] = {}   # (before, after) → diff summary: commits never change
        self.agents: list[Agent] = []        # set by make_app
        self.board: Any = None               # the tasks page's Folded projection, made at its first request (task_board)
        self.boarding = threading.Lock()
        self.commits = Commits(paths.events_db)
        self.store: Any = None               # the [store] table (make_app)

    def token(self) -> str:
        """The current token; re-read when the file changes (`pulsectl web rotate-token`)."""
        mtime = self.token_file.stat().st_mtime
        if self._token is None or self._token[0] != mtime:
            self._token = (mtime, self.token_file.read_text().strip())
        return self._token[1]

    def events(self):
        return read_connection(self.paths.events_db)

    def vitals(self):
        return read_connection(self.paths.vitals_db)

    def status(self) -> controlmsgs.Status | None:
        try:
            return client.request(self.paths, controlmsgs.GetStatus(), 2.0).status
        except client.Unreachable:
            return None

    def count(self) -> Counts:
        """The metrics' counts, caught up with the stores (the first call loads their checkpoint, or
        folds the whole history once when there is none)."""
        with self.counting:
            events, vitals = self.events(), self.vitals()
            try:
                self.counts = self.metrics.catch_up(events, vitals)
            finally:
                events.close()
                vitals.close()
            return self.counts

    def save_checkpoints(self) -> None:
        """Write the counts' and the task board's checkpoints now (a clean stop): the next start folds
        only what comes after."""
        for lock, folded in ((self.counting, lambda: self.metrics.folded), (self.boarding, lambda: self.board)):
            with lock:
                if folded() is None:
                    continue
                events = self.events()
                try:
                    folded().conn = events
                    folded().save()
                finally:
                    events.close()

    def task_board(self, conn):
        """The tasks page's fold (pulse.web.taskboard), caught up on `conn`: at the first request from
        its checkpoint, then by what is new; a copy to read outside the lock."""
        with self.boarding:
            if self.board is None:
                self.board = projection.Folded(taskboard.PROJECTION, conn, self.paths.home / projection.DIRECTORY)
            return taskboard.view(self.board.catch_up(conn))

    spend_limits: tuple[list, Any] = ([], None)
    schedules: Sequence[Any] = ()

    def spend_overview(self, conn) -> list[dict]:
        """Each agent's spend and the host's against their limits (pulse.agents.spend), for /metrics."""
        from pulse.agents import spend  # ~9 ms: only the budget's page
        agents, host = self.spend_limits
        now = clock.now()
        return spend.overview(spend.load(conn, now), agents, host or SpendLimits(), now)

    def sessions_overview(self, conn) -> list[dict]:
        """What sessions Pulse did not start spent (pulse.agents.spend.sessions_overview)."""
        from pulse.agents import spend  # ~9 ms: only the budget's page
        now = clock.now()
        return spend.sessions_overview(spend.load(conn, now), now)

    def read(self, what: Callable[[Any], Any], store: str = "events") -> Any:
        conn = self.events() if store == "events" else self.vitals()
        try:
            return what(conn)
        finally:
            conn.close()


# Each request opens its own read-only connection, in one of the server's threads; SQLite's page cache
# (2 MiB by default) is filled as a read goes and freed when the connection closes, but into that thread's
# malloc arena, which keeps it. With the default cache the web worker kept ~2.5 MiB per thread that had read
# much, more as the history grew until the cache was full. A request here reads one indexed range (the OS
# page cache keeps the file warm), so a small cache costs no speed and bounds what a thread can keep.
READ_CACHE_KIB = 512


def read_connection(path: Path):
    """A read-only connection (pulse.store.connection.open_readonly) with a page cache of READ_CACHE_KIB."""
    conn = connection.open_readonly(path)
    conn.execute(f"PRAGMA cache_size = -{READ_CACHE_KIB}")
    return conn
