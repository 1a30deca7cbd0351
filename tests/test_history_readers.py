"""The readers of a window or a page of the history past what events.db still holds: `pulsectl
report --from/--to` (and so its analyst, which is given the same events) and the web's events page
read the archive segments a window reaches into (pulse.store.archive), so a report of an archived
day is the report it was before the move, and the events page pages back into the archive. Pure:
pulsectl and the page's code on a home no pulsed runs on, whose old events `pulsectl store compact`
moved."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from starlette.requests import Request

from pulse.core.home import Paths
from pulse.core.wire import eventmsgs
from pulse.report import analysis as analysismod
from pulse.store import archive, eventindex, eventsdb
from reportfixture import fixture_history, write
from support import pulsectl

FILLER = 6_000         # events after the fixture's window: with it, more than one segment moves


def ctl(home: Path, *args: str) -> subprocess.CompletedProcess:
    return pulsectl(["--home", str(home), *args], timeout=60)


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """A home whose report fixture (a minute in 2026) and FILLER events after it moved to the archive,
    an open task holding the rest live; (home, the fixture, its window as --from/--to, the report of
    that window as it was before the move)."""
    home = tmp_path_factory.mktemp("readers") / "home"
    home.mkdir()
    (home / "config.toml").write_text("[store]\nkeep_days = 1e-9\n")
    h = fixture_history()
    for task in ("task-1", "task-2"):                 # ended: an open task's events never move
        h.add("task-closed", "pulsectl", task)
    write(home / "events.db", h.events)
    conn = eventsdb.open_events(home / "events.db")
    try:
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(FILLER)])
        eventsdb.append_events(conn, [eventmsgs.now_event("task-created", "pulsectl", "task-99", {
            "project": "p", "title": "open", "prompt": "x", "priority": 0})])
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(10)])
    finally:
        conn.close()
    window = ["--from", iso(h.events[0].ts - 1), "--to", iso(h.t + 1)]
    before = ctl(home, "report", *window, "--json")
    assert before.returncode == 0, before.stderr
    done = ctl(home, "store", "compact")
    assert done.returncode == 0, done.stderr
    return home, h, window, analysismod.decode(before.stdout)


def first_live(home: Path) -> int:
    conn = sqlite3.connect(home / "events.db")
    try:
        return eventindex.first_live_id(conn)
    finally:
        conn.close()


def test_the_report_of_an_archived_window_is_the_report_it_was_before_the_move(moved):
    home, h, window, before = moved
    live = first_live(home)
    assert live > len(h.events) + 5_000      # the window and more than a segment moved
    out = ctl(home, "report", *window, "--json")
    assert out.returncode == 0, out.stderr
    after = analysismod.decode(out.stdout)
    assert after == before and after.window.events == before.window.events > 20
    cites = analysismod.cited(after)
    assert cites and max(cites) < live                           # every citation an archived event
    assert "[fail] agent bad" in ctl(home, "report", *window).stdout


def test_an_agent_analyst_is_shown_the_archived_events_of_its_window(moved):
    from pulse.report import reportrun
    home, h, window, before = moved
    conn = sqlite3.connect(home / "events.db")
    try:
        events, tasks = reportrun.read(conn, h.events[0].ts - 1, h.t + 1, checkpoints=home / "checkpoints")
    finally:
        conn.close()
    text = reportrun.prompt(events, before, 1_000)
    assert all(f"\n#{i} " in text for i in analysismod.cited(before)) and "cannot reach the vault" in text


def test_a_report_whose_window_meets_a_damaged_segment_refuses_it_and_says_so(moved, tmp_path):
    home, _, window, _ = moved
    copy = tmp_path / "home"
    subprocess.run(["cp", "-a", str(home), str(copy)], check=True)
    conn = sqlite3.connect(copy / "events.db")
    try:
        first = archive.archived(conn)[0].segment
    finally:
        conn.close()
    path = copy / archive.DIRECTORY / first
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    out = ctl(copy, "report", *window)
    assert out.returncode == 1 and f"{path} fails its checksum" in out.stderr and "store check" in out.stderr


# -- the events page ------------------------------------------------------------------------------------

def web_of(home: Path):
    from pulse.web import site
    return site.Web(Paths.for_daemon(home), home / "web-token", 60.0)


def request(query: str = "", path_params: dict | None = None, app=None) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "query_string": query.encode(), "headers": [],
                    "path_params": path_params or {}, "app": app})


def test_the_events_page_pages_back_from_the_live_history_into_the_archive(moved, monkeypatch):
    from pulse.web import reads
    home, _, _, _ = moved
    web, live = web_of(home), first_live(home)
    newest = reads.events_view(web, request())                      # the live few, then the archived
    ids = [e["id"] for e in newest["events"]]
    assert ids == list(range(newest["last_id"], newest["last_id"] - reads.EVENTS_PAGE, -1)) and ids[-1] < live
    assert newest["older"] == ids[-1]

    back = reads.events_view(web, request(f"before={live}"))       # the page after the oldest live event
    ids = [e["id"] for e in back["events"]]
    assert ids == list(range(live - 1, live - 1 - reads.EVENTS_PAGE, -1)) and back["older"] == ids[-1]
    assert all(e["type"] == "tick" for e in back["events"]) and "error" not in back

    given_up = reads.events_view(web, request("type=task-given-up"))  # found only in the archive
    assert [e["type"] for e in given_up["events"]] == ["task-given-up"] and given_up["older"] is None
    assert given_up["events"][0]["target"] == "task-3" and given_up["events"][0]["id"] < live
    vault = reads.events_view(web, request("q=VAULT&source=executor"))
    assert {e["type"] for e in vault["events"]} == {"task-failed", "effect-failed"}

    # a rare match costs at most ARCHIVE_SEGMENTS_PER_PAGE segments, and says where to go on from
    monkeypatch.setattr(reads, "ARCHIVE_SEGMENTS_PER_PAGE", 1)
    cut = reads.events_view(web, request("q=vault"))                # the newest segment holds no such event
    assert cut["events"] == [] and cut["older"] and cut["older"] < live
    rest = reads.events_view(web, request(f"q=vault&before={cut['older']}"))
    assert len(rest["events"]) == 6 and rest["older"] is None


def test_an_archived_events_own_page_shows_it(moved):
    from starlette.datastructures import State

    from pulse.web import pages
    home, _, _, _ = moved

    class App:
        state = State({"web": web_of(home)})
    text = asyncio.run(pages.event_page(request(path_params={"id": "3"}, app=App()))).body.decode()
    assert "No such event" not in text and "task-created" in text and "task-3" in text
    text = asyncio.run(pages.event_page(request(path_params={"id": "999999999"}, app=App()))).body.decode()
    assert "No such event" in text


# -- a long-lived reader --------------------------------------------------------------------------------

def test_a_reader_left_idle_while_the_events_after_it_moved_folds_them_from_the_archive(tmp_path):
    """A long-lived reader (the web's task board, kept between requests) whose checkpoint is a day old
    holds no move back: the events after its position may move while it is not asked. Its next
    catch-up folds them from the archive, then the live rows, as a rebuild would."""
    from pulse.agents import tasks
    from pulse.store import projection
    from pulse.web import taskboard
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[store]\nkeep_days = 1e-9\n")
    conn = eventsdb.open_events(home / "events.db")
    try:
        tasks.create(conn, "p", "one", "x")
        tasks.record(conn, "task-1", "task-closed", "test")
        board = projection.Folded(taskboard.PROJECTION, conn, home / projection.DIRECTORY, save=False)
        board.catch_up()                                              # kept in memory; no checkpoint
        tasks.create(conn, "p", "two", "x")
        tasks.record(conn, "task-2", "task-closed", "test")
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(1_200)])
        tasks.create(conn, "p", "open", "x")                          # holds the rest live
    finally:
        conn.close()
    assert ctl(home, "store", "compact").returncode == 0
    assert first_live(home) > 1_200
    conn = sqlite3.connect(home / "events.db")
    try:
        shown = {t.id: t.status for t in board.catch_up(conn).agents.shown()}
        rebuilt = projection.Folded(taskboard.PROJECTION, conn, home / projection.DIRECTORY, save=False).catch_up()
    finally:
        conn.close()
    assert shown == {"task-1": "closed", "task-2": "closed", "task-3": "pending"}
    assert taskboard.view(board.state) == taskboard.view(rebuilt)


def _board_checkpointed(home: Path, config: str, n: int) -> int:
    """A home whose web.tasks checkpoint was written after a closed task, then `n` events more; its anchor."""
    from pulse.agents import tasks
    from pulse.store import projection
    from pulse.web import taskboard
    home.mkdir()
    (home / "config.toml").write_text(config)
    conn = eventsdb.open_events(home / "events.db")
    try:
        tasks.create(conn, "p", "one", "x")
        tasks.record(conn, "task-1", "task-closed", "test")
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(n // 2)])
        board = projection.Folded(taskboard.PROJECTION, conn, home / projection.DIRECTORY)
        board.catch_up()
        board.save()
        tasks.create(conn, "p", "two", "x")
        tasks.record(conn, "task-2", "task-closed", "test")
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(n - n // 2)])
        return board.saved_id
    finally:
        conn.close()


def _board_from_its_checkpoint(home: Path):
    """(why it rebuilt or None, its view, a rebuild's view) of the board a web worker starting now keeps."""
    from pulse.store import projection
    from pulse.web import taskboard
    conn = sqlite3.connect(home / "events.db")
    try:
        board = projection.Folded(taskboard.PROJECTION, conn, home / projection.DIRECTORY, save=False)
        board.start()
        why = board.rebuilt
        view = taskboard.view(board.catch_up())
        (home / projection.DIRECTORY / "web.tasks.ckpt").unlink()
        rebuilt = taskboard.view(projection.Folded(taskboard.PROJECTION, conn, home / projection.DIRECTORY,
                                                   save=False).catch_up())
    finally:
        conn.close()
    return why, view, rebuilt


def test_an_idle_readers_checkpoint_does_not_hold_the_disk_bounds_back_and_is_still_loaded(tmp_path):
    """The disk's bounds (max_mb, keep_free_mb) win over a reader's fresh checkpoint (the web's task board
    when nobody opens the page): the move passes it, and the reader, restarting, loads that checkpoint
    (its event found in the archive) and folds what moved after it from there, not the whole history."""
    home = tmp_path / "home"
    anchor = _board_checkpointed(home, "[store]\nkeep_days = 0\nmax_mb = 0\nkeep_free_mb = 1e12\n", 6_000)
    done = ctl(home, "store", "compact")
    assert done.returncode == 0, done.stderr
    assert first_live(home) > anchor + 1, done.stdout        # one segment moved, past the board's checkpoint
    why, view, rebuilt = _board_from_its_checkpoint(home)
    assert why is None
    assert view == rebuilt and {t.id: t.status for t in view.shown} == {"task-1": "closed", "task-2": "closed"}


def test_a_checkpoint_a_day_old_no_longer_holds_the_age_bound_back_and_is_still_loaded(tmp_path):
    from pulse.store import retention
    home = tmp_path / "home"
    anchor = _board_checkpointed(home, "[store]\nkeep_days = 1e-9\n", 1_200)
    old = time.time() - retention.STALE_CHECKPOINT_S - 60
    os.utime(home / "checkpoints" / "web.tasks.ckpt", (old, old))
    done = ctl(home, "store", "compact")
    assert done.returncode == 0, done.stderr
    assert first_live(home) > anchor + 1, done.stdout
    why, view, rebuilt = _board_from_its_checkpoint(home)
    assert why is None
    assert view == rebuilt and {t.id: t.status for t in view.shown} == {"task-1": "closed", "task-2": "closed"}
