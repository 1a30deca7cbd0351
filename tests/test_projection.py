"""Checkpointed projections (pulse.store.projection), on a real events.db: a restart folds only what
came after its checkpoint; a checkpoint of another version (the fold's code changed), of another
history, or torn, is ignored and the projection rebuilt; and the tick's own projections load from
their checkpoint exactly as a fold from the first event makes them. Pure: no daemon."""

from __future__ import annotations

import collections
import os

import pytest

from pulse.agents import tasks
from pulse.core.wire import enginerpc, eventmsgs
from pulse.store import effectqueue, eventsdb, projection
from pulse.workers import tick


def count_fold(state: dict, events) -> None:
    for ev in events:
        state["n"] = state.get("n", 0) + 1
        state["ids"] = state.get("ids", 0) + ev.id


def count_fold_changed(state: dict, events) -> None:
    for ev in events:
        state["n"] = state.get("n", 0) + 2          # a new meaning of the same name
        state["ids"] = state.get("ids", 0) + ev.id


def counting(fold=count_fold, folded: list | None = None) -> projection.Projection[dict]:
    def watched(state, events):
        if folded is not None:
            folded.extend(ev.id for ev in events)
        fold(state, events)
    return projection.Projection(name="count", new=dict, fold=watched, types=("note",), code=(fold,),
                                 state_type=dict)


@pytest.fixture
def events(tmp_path):
    conn = eventsdb.open_events(tmp_path / "events.db")
    yield conn
    conn.close()


def append(conn, n: int, type: str = "note") -> None:
    eventsdb.append_events(conn, [eventmsgs.now_event(type, "test", None, {"i": i}) for i in range(n)])


def folded_with(conn, directory, proj) -> projection.Folded:
    f = projection.Folded(proj, conn, directory, batch=7)
    f.catch_up()
    return f


def test_a_restart_folds_only_what_came_after_its_checkpoint(events, tmp_path):
    append(events, 50)
    append(events, 20, type="other")             # not of its types: skipped, yet its position moves past them
    first = folded_with(events, tmp_path / "ck", counting())
    assert first.rebuilt is None and first.state["n"] == 50        # rebuilt, then checkpointed at once
    append(events, 5)
    seen: list[int] = []
    second = folded_with(events, tmp_path / "ck", counting(folded=seen))
    assert second.rebuilt is None and len(seen) == 5 and min(seen) > 70
    assert second.state["n"] == 55


def test_a_changed_fold_discards_the_old_checkpoint_and_rebuilds(events, tmp_path):
    append(events, 30)
    folded_with(events, tmp_path / "ck", counting())
    assert counting().version != counting(count_fold_changed).version
    changed = projection.Folded(counting(count_fold_changed), events, tmp_path / "ck")
    assert changed.catch_up()["n"] == 60             # folded from the first event with the new code
    assert "another version" in (changed.rebuilt or "") or changed.rebuilt is None
    again = projection.Folded(counting(count_fold_changed), events, tmp_path / "ck")
    again.start()
    assert again.rebuilt is None and again.state["n"] == 60      # its own checkpoint, written after the rebuild


def test_the_version_of_a_fold_is_the_same_in_every_process():
    # a set's order follows the hash seed: the version must not, or every restart would rebuild
    import subprocess
    import sys
    code = "from pulse.workers.tick import tick_projection; print(tick_projection(60.0).version)"
    versions = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(versions) == 1


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_a_torn_or_damaged_checkpoint_is_ignored_and_rebuilt(events, tmp_path, damage):
    append(events, 40)
    folded_with(events, tmp_path / "ck", counting())
    path = projection.checkpoint_path(tmp_path / "ck", "count")
    raw = path.read_bytes()
    broken = {"truncate": raw[: len(raw) // 2], "flip": raw[:-3] + bytes([raw[-3] ^ 0xFF]) + raw[-2:],
              "garbage": os.urandom(len(raw)), "empty": b""}[damage]
    path.write_bytes(broken)
    seen: list[int] = []
    f = projection.Folded(counting(folded=seen), events, tmp_path / "ck")
    assert f.catch_up()["n"] == 40
    assert f.rebuilt is None and len(seen) == 40       # rebuilt from the history, and checkpointed again
    assert projection.read_checkpoint(tmp_path / "ck", counting(), events)[1] == 40


def test_a_checkpoint_of_another_history_is_ignored(tmp_path):
    one = eventsdb.open_events(tmp_path / "one.db")
    append(one, 40)
    folded_with(one, tmp_path / "ck", counting())
    one.close()
    other = eventsdb.open_events(tmp_path / "other.db")        # a restored backup, a new events.db
    append(other, 45)
    why = projection.read_checkpoint(tmp_path / "ck", counting(), other)
    assert isinstance(why, str) and "another history" in why
    assert projection.Folded(counting(), other, tmp_path / "ck").catch_up()["n"] == 45
    other.close()


def test_checkpoints_are_written_every_n_events(events, tmp_path):
    append(events, 10)
    f = projection.Folded(counting(), events, tmp_path / "ck", every_events=25, every_s=3600)
    f.catch_up()
    append(events, 20)
    f.catch_up()
    assert projection.read_checkpoint(tmp_path / "ck", counting(), events)[1] == 10     # 20 < 25: not yet
    append(events, 10)
    f.catch_up()
    assert projection.read_checkpoint(tmp_path / "ck", counting(), events)[1] == 40
    assert not [p for p in (tmp_path / "ck").iterdir() if p.suffix == ".tmp"]


def busy_history(conn) -> None:
    """Effects committed and ended, a promote, a pause, a process's exit, tasks: what the tick folds."""
    for round_ in range(3):
        effects = [effectqueue.new_effect(enginerpc.Effect(kind=k, target=f"p{i % 3}", idempotent=True,
                                                      params={"rule": "process-watchdog"}), o, 600)
                   for i, (k, o) in enumerate([("restart-process", "survival"), ("notify", "survival"),
                                               ("noop", "engine"), ("noop", "operator")] * 3)]
        effectqueue.commit_effects(conn, effects, "test")
        end = ["effect-acked", "effect-failed"]
        eventsdb.append_events(conn, [eventmsgs.now_event(end[i % 2], "executor", e.target, {"effect_id": e.id})
                                      for i, e in enumerate(effects[:8])])
        eventsdb.append_events(conn, [
            eventmsgs.now_event("promote", "engine", None, {"before": f"b{round_}", "after": f"a{round_}"}),
            eventmsgs.now_event("worker-exited", "pulsed", "engine", {"state": "backoff"}),
            eventmsgs.now_event("pause", "operator", "p1", {"until": 9e9}),
            eventmsgs.now_event("process-exited", "keeper", "p2", {"pid": 10 + round_, "code": 1, "tail": "x"})])
        task = tasks.create(conn, "proj", "a task", "do it", source="test")
        if round_:
            tasks.record(conn, task.id, "task-closed", "test")


def test_the_ticks_projections_load_from_a_checkpoint_as_a_fold_from_the_start_makes_them(events, tmp_path):
    def book() -> projection.Projection:
        return tasks.book_projection("tick.tasks", ["claude"], forget_ended=True)
    busy_history(events)
    projection.Folded(tick.tick_projection(60.0), events, tmp_path / "ck").catch_up()
    projection.Folded(book(), events, tmp_path / "ck").catch_up()
    busy_history(events)
    whole = projection.Folded(tick.tick_projection(60.0), events, tmp_path / "whole").catch_up()
    resumed = projection.Folded(tick.tick_projection(60.0), events, tmp_path / "ck")
    resumed.start()
    assert resumed.rebuilt is None and 0 < resumed.last_id < eventsdb.last_event_id(events)
    resumed.catch_up()
    assert tick.dump_projections(resumed.state) == tick.dump_projections(whole)
    assert resumed.state.outcomes and all(q.maxlen == tick.OUTCOMES_PER_TARGET for q in resumed.state.outcomes.values())
    assert isinstance(resumed.state.engine_recent, collections.deque) and resumed.state.pending
    assert resumed.state.promotes and resumed.state.paused and resumed.state.exits
    books = projection.Folded(book(), events, tmp_path / "ck")
    books.start()
    assert books.rebuilt is None
    from_checkpoint = books.catch_up()
    from_start = tasks.catch_up(events, tasks.TaskBook(["claude"], forget_ended=True))
    assert from_checkpoint.states and from_checkpoint.states == from_start.states
    assert from_checkpoint.agents.stats == from_start.agents.stats


def test_every_task_listed_from_its_checkpoint_equals_the_fold_from_the_start(events, tmp_path):
    (tmp_path / "home").mkdir()
    directory = tmp_path / "home" / projection.DIRECTORY
    busy_history(events)
    for _ in range(400):                           # enough task events that the listing leaves a checkpoint
        task = tasks.create(events, "proj", "a task", "do it", source="test")
        tasks.record(events, task.id, "task-closed", "test")
    first = tasks.load_all(events, directory)
    assert projection.checkpoint_path(directory, tasks.ALL_TASKS).exists()
    busy_history(events)
    assert tasks.load_all(events, directory) == tasks.catch_up(events, tasks.TaskBook()).states != first
