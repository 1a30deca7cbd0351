"""A schedule's run, committed whole: the task or effect it makes and the `schedule-run` fact that
names it (or the `schedule-armed` fact of a schedule seen for the first time), in one BEGIN
IMMEDIATE transaction. A slot already run (or armed at, or passed) is refused inside that same
transaction, so even two writers could not both run it; pulse.core.schedule folds the facts.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable

from pulse.core.schedule import ARMED, FOLDED, RUN, ScheduleBook, ScheduleState
from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import Event, now_event
from pulse.store import projection
from pulse.store.connection import Transaction
from pulse.store.effectqueue import insert_effect
from pulse.store.eventsdb import events_after, insert_event, next_task_number, read_events


def rebuild_book(conn: sqlite3.Connection, upto_id: int) -> ScheduleBook:
    """The schedule book from the first event: what came before a schedule's first fact is no
    schedule's, so the ends of older tasks and effects are skipped."""
    book = ScheduleBook()
    first = read_events(conn, types=[ARMED, RUN], limit=1)
    after = first[0].id - 1 if first else upto_id
    while after < upto_id and (batch := events_after(conn, after, upto_id, sorted(FOLDED), 5_000)):
        book.fold(batch)
        after = batch[-1].id
    return book


def schedules_projection() -> projection.Projection[ScheduleBook]:
    """The schedule book as a checkpointed projection (the tick keeps its own inside its projections)."""
    return projection.Projection(name="schedules", new=ScheduleBook, fold=ScheduleBook.fold,
                                 types=tuple(sorted(FOLDED)), state_type=ScheduleBook,
                                 rebuild=rebuild_book, code=(ScheduleBook, ScheduleState))


def book_of(conn: sqlite3.Connection, home: Path) -> ScheduleBook:
    """Every schedule's state, for pulsectl schedule list and the schedules page: from the
    checkpoint under `home`, folding what came after (left for the next reader when it may write)."""
    return projection.Folded(schedules_projection(), conn, home / projection.DIRECTORY, every_events=1_000,
                             every_s=float("inf"), save=projection.may_write(home)).catch_up()


def latest_slot(conn: sqlite3.Connection, name: str) -> float | None:
    """The latest slot `name` ran or was armed at (manual runs have none). Slots only grow with ids
    (commit_run refuses any other), so the newest fact of each type is read, backwards along the
    (type, id) index: never the whole history."""
    slots = []
    for kind in (RUN, ARMED):
        row = conn.execute(
            "SELECT json_extract(data, '$.slot') FROM events WHERE type = ? AND target = ? "
            "AND json_extract(data, '$.manual') IS NOT 1 ORDER BY id DESC LIMIT 1", (kind, name)).fetchone()
        if row is not None and row[0] is not None:
            slots.append(row[0])
    return max(slots, default=None)


def commit_run(conn: sqlite3.Connection, name: str, source: str, *, slot: float | None,
               make_task: Callable[[int], Event] | None = None, effect: Effect | None = None,
               observe_only: bool = False, **data) -> Event | None:
    """Commit one run of schedule `name`: the task `make_task(n)` returns (n, the next task number)
    or `effect`, and its schedule-run event; with neither, the schedule-armed event at `slot` (or,
    with data `skipped`, the schedule-run event of a slot skipped: it ran nothing).
    slot None: a manual run, outside the slots. Returns the fact, or None (nothing written) when
    `slot` is not later than the latest slot already recorded."""
    with Transaction(conn):
        if slot is not None:
            last = latest_slot(conn, name)
            if last is not None and slot <= last:
                return None
            data["slot"] = slot
        else:
            data["manual"] = True
        kind = RUN
        if make_task is not None:
            data["task"] = insert_event(conn, make_task(next_task_number(conn))).target
        elif effect is not None:
            insert_effect(conn, effect, source, observe_only)
            data["effect"] = effect.id
        elif not data.get("skipped"):
            kind = ARMED
        return insert_event(conn, now_event(kind, source, name, data))
