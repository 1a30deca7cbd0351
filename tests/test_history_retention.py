"""Retention of events.db (pulse.store.retention, pulse.store.archive): `pulsectl store compact` moves
the events past [store]'s bounds into checksummed archive segments, never an open task's, and every
reader named for it (`pulsectl events`, `task show`, a projection's rebuild, store check) still sees
them; a move SIGKILLed after any of its steps leaves each event exactly once, live or archived; a
segment that fails its checksum is refused and said; `archive = false` deletes instead. Mostly pure
(pulsectl on a home no pulsed runs on); one daemon test compacts under a running pulsed."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import msgspec
import pytest

from pulse.agents import tasks
from pulse.core import config as configmod
from pulse.core.wire import enginerpc, eventmsgs
from pulse.store import archive, effectqueue, eventindex, eventsdb, projection, retention
from support import init_home, pulsectl, wait_for

OLD = 1200            # events before the open task: due to move (keep_days is a moment), and past MIN_EVENTS
AFTER = 300           # events from the open task on: held live


def make_home(home: Path, keep_archive: bool = True) -> dict:
    """A home no pulsed runs on: a closed task, OLD notes, an open task, AFTER notes. Returns the ids."""
    home.mkdir()
    (home / "config.toml").write_text(f"[store]\nkeep_days = 1e-9\narchive = {str(keep_archive).lower()}\n")
    conn = eventsdb.open_events(home / "events.db")
    try:
        closed = tasks.create(conn, "proj", "an old task", "do it", source="test")
        tasks.record(conn, closed.id, "task-closed", "test")
        (ended,) = effectqueue.commit_effects(conn, [effectqueue.new_effect(enginerpc.Effect(kind="noop"), "operator", 60)],
                                              "test")
        effectqueue.finish_effect(conn, ended.id, "acked", "executor", from_states=("pending",))
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i, "out": "sha256:" + "ab" * 32}
                                                     if i == 7 else {"i": i}) for i in range(OLD)])
        opened = tasks.create(conn, "proj", "an open task", "do it", source="test")
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(AFTER)])
        (pending,) = effectqueue.commit_effects(conn, [effectqueue.new_effect(enginerpc.Effect(kind="noop"), "operator",
                                                                              60)], "test")
        held = eventsdb.task_history(conn, opened.id)[0].id
        return {"closed": closed.id, "open": opened.id, "held": held, "last": eventsdb.last_event_id(conn),
                "rows": all_rows(conn), "ended": ended.id, "pending": pending.id}
    finally:
        conn.close()


def all_rows(conn) -> dict[int, tuple]:
    return {r[0]: r[1:] for r in conn.execute("SELECT id, type, source, target, data FROM events")}


def ctl(home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return pulsectl(["--home", str(home), *args], timeout=60, env={**os.environ, **(env or {})})


def every_event(home: Path) -> dict[int, tuple]:
    """Each event of the history, live or in a segment the manifest names; fails on one held twice."""
    conn = sqlite3.connect(home / "events.db")
    try:
        live = all_rows(conn)
        held: dict[int, tuple] = {}
        for seg in archive.archived(conn):
            for e in archive.read_segment(home / archive.DIRECTORY, seg):
                assert e.id not in held and e.id not in live, f"event {e.id} is held twice"
                held[e.id] = (e.type, e.source, e.target, json.dumps(e.data, separators=(",", ":")))
    finally:
        conn.close()
    return {**held, **live}


def assert_whole(home: Path, before: dict[int, tuple]) -> None:
    """Nothing lost, nothing doubled, nothing changed: every event before, as it was; ids contiguous."""
    found = every_event(home)
    assert sorted(found) == list(range(1, max(found) + 1))
    for id_, (type_, source, target, data) in before.items():
        assert found[id_][:3] == (type_, source, target) and json.loads(found[id_][3]) == json.loads(data), id_


def unnamed_files(home: Path) -> list[str]:
    conn = sqlite3.connect(home / "events.db")
    try:
        named = {s.segment for s in archive.archived(conn)}
    finally:
        conn.close()
    directory = home / archive.DIRECTORY
    return sorted(n for n in os.listdir(directory) if n != ".lock" and n not in named) if directory.exists() else []


def test_compact_moves_what_is_past_the_bounds_and_the_readers_still_see_it(tmp_path):
    home = tmp_path / "home"
    ids = make_home(home)
    dry = ctl(home, "store", "compact", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would move events 1-{ids['held'] - 1}" in dry.stdout
    assert f"open task {ids['open']}" in dry.stdout                 # what holds the rest back, said
    assert not (home / archive.DIRECTORY).exists()                   # a dry run moves nothing

    done = ctl(home, "store", "compact")
    assert done.returncode == 0, done.stderr
    assert f"moved events 1-{ids['held'] - 1}" in done.stdout
    conn = sqlite3.connect(home / "events.db")
    try:
        assert eventindex.first_live_id(conn) == ids["held"]           # the open task's events stay live
        moved = eventsdb.last_events(conn, 1, ["history-moved"])[0]
        assert moved.data["first_id"] == 1 and moved.data["last_id"] == ids["held"] - 1 and moved.data["archived"]
        assert eventsdb.referenced_objects(conn) == {"ab" * 32}     # objects/ gc still sees the archived refs
        assert moved.data["effects"] == 1                             # the ended effect's queue row left with it
        assert effectqueue.effect_state(conn, ids["ended"]) is None
        assert effectqueue.effect_state(conn, ids["pending"]) == "pending"
    finally:
        conn.close()
    assert_whole(home, ids["rows"])

    listed = ctl(home, "events", "-n", "100000", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == list(range(1, ids["last"] + 2))
    since = ctl(home, "events", "--since", "1h", "--type", "tick", "--json")
    assert len(since.stdout.splitlines()) == OLD + AFTER
    shown = ctl(home, "task", "show", ids["closed"], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "closed"
    listing = ctl(home, "task", "list", "--json")                   # a rebuild: the archive, then the live rows
    assert {json.loads(line)["id"] for line in listing.stdout.splitlines()} == {ids["closed"], ids["open"]}
    checked = ctl(home, "store", "check")
    assert checked.returncode == 0, checked.stderr
    assert "1 segments" in checked.stdout
    conn = eventsdb.open_events(home / "events.db")
    try:
        assert tasks.create(conn, "proj", "next", "x", source="test").id == "task-3"   # numbers go on
        with pytest.raises(sqlite3.IntegrityError, match="leaves only by a recorded move"):
            conn.execute("DELETE FROM events WHERE id = ?", (ids["held"],))
    finally:
        conn.close()
    again = ctl(home, "store", "compact")
    assert "nothing may move yet" in again.stdout or "moved" not in again.stdout


@pytest.mark.parametrize("step", retention.STEPS)
def test_a_move_killed_after_any_step_loses_nothing_and_doubles_nothing(tmp_path, step):
    home = tmp_path / "home"
    ids = make_home(home)
    killed = ctl(home, "store", "compact", env={retention.KILL_ENV: step})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert_whole(home, ids["rows"])                     # as the kill left it: each event once
    resumed = ctl(home, "store", "compact")             # the next move undoes or keeps what the kill left
    assert resumed.returncode == 0, resumed.stderr
    assert_whole(home, ids["rows"])
    assert unnamed_files(home) == []
    conn = sqlite3.connect(home / "events.db")
    try:
        assert eventindex.first_live_id(conn) == ids["held"]
        assert len(eventsdb.last_events(conn, 5, ["history-moved"])) == 1
    finally:
        conn.close()
    assert ctl(home, "store", "check").returncode == 0


def test_a_segment_that_fails_its_checksum_is_refused_and_said(tmp_path):
    home = tmp_path / "home"
    ids = make_home(home)
    assert ctl(home, "store", "compact").returncode == 0
    (segment,) = (home / archive.DIRECTORY).glob("events-*")
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    checked = ctl(home, "store", "check")
    assert checked.returncode == 1 and f"{segment} fails its checksum" in checked.stderr
    listed = ctl(home, "events", "-n", "100000")
    assert listed.returncode == 1 and "fails its checksum" in listed.stderr
    shown = ctl(home, "task", "show", ids["closed"])
    assert shown.returncode == 1 and "fails its checksum" in shown.stderr
    assert ctl(home, "events", "-n", "10").returncode == 0          # a range within the live history still reads


def test_archive_false_deletes_instead(tmp_path):
    home = tmp_path / "home"
    ids = make_home(home, keep_archive=False)
    done = ctl(home, "store", "compact")
    assert done.returncode == 0, done.stderr
    assert "out: deleted" in done.stdout
    assert [p.name for p in (home / archive.DIRECTORY).iterdir()] == [".lock"]
    conn = eventsdb.open_events(home / "events.db")
    try:
        assert eventindex.first_live_id(conn) == ids["held"]
        (move,) = archive.moves(conn)
        assert (move.first_id, move.last_id, move.segment) == (1, ids["held"] - 1, None)
        assert eventsdb.last_events(conn, 1, ["history-moved"])[0].data["archived"] is False
        assert tasks.create(conn, "proj", "next", "x", source="test").id == "task-3"
    finally:
        conn.close()
    listed = ctl(home, "events", "-n", "100000", "--json")
    assert json.loads(listed.stdout.splitlines()[0])["id"] == ids["held"]


def test_the_event_writers_pacer_moves_a_segment_per_step(tmp_path):
    home = tmp_path / "home"
    ids = make_home(home)
    conn = eventsdb.open_events(home / "events.db")
    try:
        store = configmod.load(home / "config.toml").store
        pacer = retention.Pacer(lambda: conn, home, store, "eventlog", logging.getLogger("test"), now=0.0)
        pacer.on_timer(1.0)                                     # not yet: it leaves the start alone
        assert eventindex.first_live_id(conn) == 1
        pacer.on_timer(pacer.next_timer())
        assert eventindex.first_live_id(conn) == ids["held"]
        assert pacer.next_timer() >= pacer.EVERY_S              # nothing more is due: back in a minute
    finally:
        conn.close()


@pytest.mark.daemon
def test_the_event_writer_moves_by_itself_under_a_running_pulsed(pulsed):
    """The event writer's pacer moves what its projections' checkpoints are past; the readers see it,
    `store compact` beside it is refused or finds nothing left, a killed tick comes back on its
    checkpoint, and pulsed goes on acking effects."""
    pulsed.home.mkdir(parents=True)
    (pulsed.home / "config.toml").write_text("[store]\nkeep_days = 1e-9\n")
    pulsed.start()
    for _ in range(3):
        assert pulsed.ctl("emit", "noop", "--wait", "20").returncode == 0
    assert pulsed.terminate() == 0                      # a clean stop: every projection checkpointed at its last fold
    pulsed.start(env={retention.PACE_ENV: "0.2"})
    moved = wait_for(lambda: pulsed.events("history-moved"), 15, what="the event writer's first move")
    assert moved[0]["source"] == "eventlog" and moved[0]["data"]["first_id"] == 1
    assert pulsed.ctl("store", "compact").returncode in (0, 75)     # 75: the pacer held the lock

    def listed(*args: str) -> list[dict]:
        return [json.loads(line) for line in pulsed.ctl("events", "-n", "1000", *args, "--json").stdout.splitlines()]
    status = json.loads(pulsed.ctl("status", "--json").stdout)["history"]
    assert status["moved_events"] > 0 and status["segments"] >= 1
    # The listings read the archive too (how far the first move went is where the tick's checkpoint
    # was, its last fold before the stop): the first event moved, and so did the first of its type.
    first = listed()[0]
    assert first["id"] == 1 < status["first_live_id"], (first, status)
    assert listed("--type", first["type"])[0]["id"] == 1
    assert len(listed("--type", "effect-acked")) == 3
    rebuilt = pulsed.log_text().count("rebuilding it from the history")
    loaded = pulsed.log_text().count("tick: from its checkpoint")
    tick = pulsed.worker("tick").pid
    os.kill(tick, signal.SIGKILL)
    pulsed.wait_replaced("tick", tick)
    assert pulsed.ctl("emit", "noop", "--wait", "20").returncode == 0
    wait_for(lambda: pulsed.log_text().count("tick: from its checkpoint") > loaded,
             what="the restarted tick loads its checkpoint: its event is still live")
    assert pulsed.log_text().count("rebuilding it from the history") == rebuilt
    assert pulsed.ctl("store", "check").returncode == 0


def test_a_rebuild_folds_the_archive_then_the_live_rows_and_metrics_count_what_moved(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from pulse.web import metrics
    home = tmp_path / "home"
    make_home(home)
    assert ctl(home, "store", "compact").returncode == 0
    conn = sqlite3.connect(home / "events.db")
    try:
        counts = metrics.MetricsFold(home / "checkpoints").catch_up(conn, None)   # no checkpoint: a rebuild
    finally:
        conn.close()
    assert counts.types["tick"] == OLD + AFTER and counts.types["history-moved"] == 1
    found = {s.name: s.value for f in text_string_to_metric_families(metrics.exposition(counts, None, {}).decode())
             for s in f.samples if s.name.startswith("pulse_history")}
    assert found["pulse_history_moved_events_total"] == OLD + 4       # the notes, the closed task, the acked effect
    assert found["pulse_history_archive_segments"] == 1 and found["pulse_history_archive_bytes"] > 0


def test_a_restarted_event_writer_picks_up_after_a_run_whose_start_was_moved(tmp_path):
    """pulsed's newest event stays live, and the manifest names the runs whose start moved: the
    writer of a long run goes on from the right seq, not from 0 (which would write its events twice)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[store]\nkeep_days = 1e-9\n")
    run = 1234.5
    conn = eventsdb.open_events(home / "events.db")
    try:
        now = time.time()
        eventsdb.append_events(conn, [eventmsgs.Event(type="supervisor-started", source="pulsed", ts=now, mono=run, seq=1)] +
                               [eventmsgs.Event(type="worker-started", source="pulsed", target="tick", ts=now, mono=run, seq=i)
                                for i in range(2, 6)])
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(50)])
        eventsdb.append_events(conn, [eventmsgs.Event(type="worker-ready", source="pulsed", target="tick", ts=now,
                                                 mono=run + 1, seq=6)])
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(5)])
        assert eventsdb.pulsed_committed_seq(conn, run) == 6
    finally:
        conn.close()
    assert ctl(home, "store", "compact").returncode == 0
    conn = eventsdb.open_events(home / "events.db")
    try:
        assert eventindex.first_live_id(conn) == 56                    # the run's start moved; its newest event did not
        assert eventsdb.pulsed_committed_seq(conn, run) == 6
        assert eventsdb.pulsed_committed_seq(conn, run + 99) == 0    # another run's: nothing of it yet
    finally:
        conn.close()


def test_past_archive_max_mb_the_oldest_segment_is_dropped_and_said(tmp_path):
    home = tmp_path / "home"
    ids = make_home(home)
    with open(home / "config.toml", "a") as f:
        f.write("archive_max_mb = 1e-9\n")               # [store] is the file's last table
    done = ctl(home, "store", "compact")
    assert done.returncode == 0, done.stderr
    assert "dropped events-000000000001-" in done.stdout
    assert not list((home / archive.DIRECTORY).glob("events-*"))
    conn = sqlite3.connect(home / "events.db")
    try:
        (move,) = archive.moves(conn)
        assert (move.first_id, move.last_id, move.segment, move.counts["task-created"]) == (1, ids["held"] - 1, None, 1)
        assert eventsdb.last_events(conn, 1, ["history-dropped"])[0].data["first_id"] == 1
    finally:
        conn.close()
    assert ctl(home, "store", "check").returncode == 0


def test_a_listings_checkpoint_is_folded_forward_not_left_to_hold_the_move_back(tmp_path):
    """`task list` leaves a checkpoint no worker keeps: the mover folds it up to now before it plans,
    so it neither holds the move back nor, its event moved, costs the next listing a rebuild."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[store]\nkeep_days = 1e-9\n")
    conn = eventsdb.open_events(home / "events.db")
    try:
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(1200)])
        assert ctl(home, "task", "list").returncode == 0
        anchor = msgspec.msgpack.decode((home / "checkpoints" / "tasks.ckpt").read_bytes(), type=projection.Checkpoint)
        assert anchor.last_id == 1200
        eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(1200)])
    finally:
        conn.close()
    done = ctl(home, "store", "compact")
    assert done.returncode == 0, done.stderr
    assert "moved events 1-2399" in done.stdout                 # up to the newest event, past the old anchor
    anchor = msgspec.msgpack.decode((home / "checkpoints" / "tasks.ckpt").read_bytes(), type=projection.Checkpoint)
    assert anchor.last_id == 2400


def test_a_web_worker_started_again_leaves_a_checkpoint_of_its_warm_up_with_nothing_scraping(pulsed):
    """The web worker folds /metrics' counts at its start (off the request path) and leaves a checkpoint
    of that fold: with nothing scraping /metrics, each start after a kill folded again all that came
    after the first one (from the archive once retention moved it), more at every start."""
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text('[web]\nenabled = true\nlisten = "127.0.0.1:0"\n')

    def append(n: int) -> int:
        conn = eventsdb.open_events(pulsed.home / "events.db")
        try:
            eventsdb.append_events(conn, [eventmsgs.now_event("tick", "tick", None, {"i": i}) for i in range(n)])
            return eventsdb.last_event_id(conn)
        finally:
            conn.close()
    # a history before the first start: pulsed's own first events may be committed after the web
    # worker's first fold, which then has nothing to leave a checkpoint of
    append(10)
    pulsed.start()
    path = pulsed.home / projection.DIRECTORY / "web.metrics.ckpt"

    def anchor() -> int:
        try:
            return msgspec.msgpack.decode(path.read_bytes(), type=projection.Checkpoint).last_id
        except (OSError, msgspec.DecodeError):
            return 0
    first = wait_for(anchor, 20, what="the first warm-up's checkpoint (a rebuild)")
    appended = append(500)
    web = pulsed.worker("web").pid
    os.kill(web, signal.SIGKILL)
    pulsed.wait_replaced("web", web, timeout=20)
    wait_for(lambda: anchor() >= appended > first, 20, what="the warm-up's checkpoint past the events appended")
