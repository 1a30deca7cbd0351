"""Readers of events.db that start from a projection's checkpoint, not from the first event: the gate's
ledger (the executor's gate after a kill, an agent run's verdict), an agent's task tools, the
report's task titles, and the web's task board. Each test checkpoints, then makes the history before the checkpoint's last event
unavailable (deleted, as an archive would move it): a reader that folded from the first event answers
without what it can no longer see, one that starts from the checkpoint answers as before. Pure: no daemon."""

from __future__ import annotations

import asyncio
import time

import pytest

from pulse.agents import tasks
from pulse.core.config import Agent, Config
from pulse.core.home import Paths
from pulse.gate import durable, policy
from pulse.gate.policy import CallKind, Descriptor
from pulse.gate.runs import run_verdict
from pulse.gate.tools import PulseTools
from pulse.report import reportrun
from pulse.store import connection, eventsdb, projection

TOOLS = {d.name: d for d in (
    Descriptor("lookup", CallKind.RESOLVE, frozenset({"name"}), covers=("x:{name}",)),
    Descriptor("read_one", CallKind.READ, frozenset({"name"}), covers=("x:{name}",)),
    Descriptor("poke", CallKind.WRITE, frozenset({"name"}), touches=("x:{name}",), verified_by="read_one of it"),
)}
FOUND = {"found": "something"}


@pytest.fixture
def home(tmp_path):
    conn = eventsdb.open_events(tmp_path / "events.db")
    yield tmp_path, conn
    conn.close()


def forget_before(conn, last_id: int) -> None:
    """Every event before `last_id` gone (this test's own store: the append-only trigger dropped)."""
    with connection.transaction(conn):
        conn.execute("DROP TRIGGER events_never_go")
        conn.execute("DELETE FROM events WHERE id < ?", (last_id,))
    assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 1


def always_alive(pid, started) -> bool:
    return True


def test_the_gates_ledger_starts_from_its_checkpoint(home):
    path, conn = home
    checkpoints = path / projection.DIRECTORY
    store = durable.DurableStore(conn, "executor", alive=always_alive, checkpoints=checkpoints)
    s = policy.GateSession("s1", TOOLS, clock=time.time, agent="alice", task="task-1", store=store)
    s.open()
    s.end(s.begin("lookup", {"name": "a"}), True, FOUND)
    s.end(s.begin("poke", {"name": "a"}), True, {"done": True}, True)         # acted, not verified: a debt
    assert isinstance(s.begin("poke", {"name": "b"}), policy.Blocked)           # a block, recorded
    s.begin("lookup", {"name": "c"})                                           # in flight
    store.folded.save()
    folded = store.ledger
    assert folded.pending(("alice", "task-1")) == ["x:a"] and folded.flights and folded.blocks
    forget_before(conn, eventsdb.last_event_id(conn))

    again = durable.DurableStore(conn, "executor", alive=always_alive, checkpoints=checkpoints)
    ledger = again.catch_up()
    assert again.folded.rebuilt is None
    assert durable.dump_ledger(ledger) == durable.dump_ledger(folded)     # every part, through msgpack
    # the executor's verdict on the run reads the same ledger
    verdict = run_verdict(conn, Agent(name="alice"), "task-1", 0.0, checkpoints)
    assert verdict is not None and verdict[0] == "unverified-write"
    # without the checkpoint the same store knows nothing of it: what this test would see of a fold from id 0
    assert "s1" not in durable.DurableStore(conn, alive=always_alive).catch_up().sessions


def test_the_ledgers_own_facts_move_its_position_and_a_later_start_folds_only_what_came_after(home):
    path, conn = home
    checkpoints = path / projection.DIRECTORY
    store = durable.DurableStore(conn, alive=always_alive, checkpoints=checkpoints)
    s = policy.GateSession("s1", TOOLS, clock=time.time, agent="alice", store=store)
    s.open()
    s.end(s.begin("lookup", {"name": "a"}), True, FOUND)
    assert store.folded.last_id == eventsdb.last_event_id(conn)      # its own facts: never folded twice
    store.folded.save()
    s.end(s.begin("read_one", {"name": "a"}), True, FOUND)          # after the checkpoint
    later = durable.DurableStore(conn, alive=always_alive, checkpoints=checkpoints)
    from_start = durable.DurableStore(conn, alive=always_alive).catch_up()
    assert durable.dump_ledger(later.catch_up()) == durable.dump_ledger(from_start)
    assert later.folded.rebuilt is None and later.ledger.sessions["s1"].calls == 2


def test_an_agents_task_tools_and_the_report_read_every_task_from_the_checkpoint(home):
    path, conn = home
    for n in range(3):
        tasks.create(conn, "proj", f"title {n}", "do it")
    tasks.load_all(conn, path / projection.DIRECTORY)                 # a reader rebuilt it: checkpointed
    forget_before(conn, eventsdb.last_event_id(conn))

    tools = PulseTools(Paths.for_client(path), Config(), conn, asyncio.to_thread, asyncio.sleep)
    listed = asyncio.run(tools.tool_list_tasks())
    assert [t["title"] for t in listed["tasks"]] == ["title 0", "title 1", "title 2"]
    _, titles = reportrun.read(conn, 0.0, time.time() + 1, checkpoints=path / projection.DIRECTORY)
    assert titles == {f"task-{n + 1}": ("proj", f"title {n}") for n in range(3)}


def test_the_fleet_tasks_this_host_offered_are_listed_from_the_checkpoint(home):
    from pulse.agents import taskview
    from pulse.core.wire import eventmsgs
    path, conn = home
    checkpoints = path / projection.DIRECTORY
    eventsdb.append_events(conn, [
        eventmsgs.now_event(eventmsgs.FLEET_TASK_OFFERED, "fleet", "f-1", {"project": "p", "title": "one", "prompt": "x"}),
        eventmsgs.now_event(eventmsgs.FLEET_TASK_OFFERED, "fleet", "f-2", {"project": "p", "title": "two", "prompt": "x"}),
        eventmsgs.now_event(eventmsgs.FLEET_TASK_UPDATE, "fleet", "f-1", {"host": "b@h", "task": "task-4", "attempt": 1,
                                                               "status": "executing"})])
    history = eventsdb.read_events(conn, after_id=0, limit=9)
    by_events = [taskview.fleet_task_view([e for e in history if e.target == fid]) for fid in ("f-1", "f-2")]
    assert taskview.fleet_views(conn, checkpoints) == by_events      # a rebuild, checkpointed
    forget_before(conn, eventsdb.last_event_id(conn))
    assert taskview.fleet_views(conn, checkpoints) == by_events
    assert [v["status"] for v in by_events] == ["executing", "offered"]


def test_the_web_task_board_starts_from_its_checkpoint_and_saves_one_at_a_clean_stop(home):
    from pulse.web import site, taskboard
    path, conn = home
    for n in range(3):
        tasks.create(conn, "proj", f"title {n}", "do it")
    tasks.record(conn, "task-1", "task-assigned", "test", agent="alice")
    tasks.record(conn, "task-2", "task-closed", "test")
    web = site.Web(Paths.for_daemon(path), path / "web-token", 60.0)
    first = web.task_board(conn)                                     # no checkpoint yet: a rebuild
    assert {t.id: t.status for t in first.shown} == {"task-1": "assigned", "task-2": "closed", "task-3": "pending"}
    web.save_checkpoints()                                           # the web worker's clean stop
    assert projection.checkpoint_path(path / projection.DIRECTORY, taskboard.NAME).exists()
    forget_before(conn, eventsdb.last_event_id(conn))
    from pulse.core.wire import eventmsgs
    eventsdb.append_events(conn, [eventmsgs.now_event("task-closed", "test", "task-3", {})])     # after the checkpoint

    again = site.Web(Paths.for_daemon(path), path / "web-token", 60.0).task_board(conn)
    assert {t.id: t.status for t in again.shown} == {"task-1": "assigned", "task-2": "closed", "task-3": "closed"}
    assert again.counts == {"assigned": 1, "closed": 2} and again.stats == first.stats
