"""Tasks: the transition table, the folds (pure), check-and-append on real SQLite, and `pulsectl task`."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from pulse.agents import tasks
from pulse.core.wire import eventmsgs
from pulse.core.wire.eventmsgs import TASK_EVENTS, Event
from pulse.store import eventsdb
from support import PULSECTL

# The events that take a new task to each status (data as the writers give it).
PATHS = {
    "pending": [("task-created", {"project": "p", "title": "t", "prompt": "do"})],
    "assigned": [("task-assigned", {"agent": "a"})],
    "executing": [("task-executing", {"agent": "a"})],
    "acked": [("task-acked", {"result": {"ok": 1}})],
}
ORDER = ["pending", "assigned", "executing", "acked"]
DATA = {"task-created": {"project": "p", "title": "t", "prompt": "do"}, "task-assigned": {"agent": "a"},
        "task-executing": {"agent": "a"}, "task-acked": {"result": 1}, "task-failed": {"error": "boom"},
        "task-closed": {}, "task-given-up": {}, "task-retried": {"by": "operator"}}


def ev(type: str, ts: float = 0.0, target: str = "task-1", id: int | None = None, **data) -> Event:
    return Event(type=type, source="test", target=target, data=data, ts=ts, id=id)


def history_to(status: str, target: str = "task-1") -> list[Event]:
    if status in ("closed", "given_up"):
        return history_to("acked", target) + [ev("task-closed" if status == "closed" else "task-given-up",
                                                 target=target)]
    out = []
    for step in ORDER[:ORDER.index(status) + 1]:
        out += [ev(t, target=target, **d) for t, d in PATHS[step]]
    return out


def state_at(status: str) -> tasks.TaskState | None:
    return None if status == "new" else tasks.fold_tasks(history_to(status))["task-1"]


@pytest.fixture
def conn(tmp_path):
    c = eventsdb.open_events(tmp_path / "events.db")
    yield c
    c.close()


# -- the transition table -----------------------------------------------------------------------------

@pytest.mark.parametrize("status", list(tasks.TRANSITIONS))
@pytest.mark.parametrize("type", TASK_EVENTS)
def test_every_status_accepts_exactly_the_events_of_its_row(status, type):
    state = state_at(status)
    assert tasks.status_of(state) == status
    allowed = type in tasks.TRANSITIONS[status]
    if allowed:
        after = tasks.apply(state, type, DATA[type], 5.0, "task-1")
        assert after.status == tasks.TRANSITIONS[status][type]
        assert state is None or state.status == status      # apply never changes its input
    else:
        with pytest.raises(tasks.IllegalTransition) as refused:
            tasks.apply(state, type, DATA[type], 5.0, "task-1")
        assert "task-1" in str(refused.value)


def test_the_table_is_the_documented_lifecycle():
    t = tasks.TRANSITIONS
    assert t["new"] == {"task-created": "pending"}
    assert t["pending"]["task-assigned"] == "assigned"
    assert t["assigned"]["task-executing"] == "executing"
    assert t["executing"]["task-acked"] == "acked"
    assert t["acked"]["task-closed"] == "closed"
    assert t["assigned"]["task-failed"] == t["executing"]["task-failed"] == "pending"
    assert t["closed"] == {} and t["given_up"] == {"task-retried": "pending"}   # only the operator's retry
    assert all("task-given-up" in t[s] for s in ("pending", "assigned", "executing", "acked"))


def test_refusals_say_what_is_wrong_and_what_is_allowed():
    assert tasks.refusal(None, "task-closed", "task-9") == "task-9: no such task"
    running = tasks.refusal(state_at("executing"), "task-closed", "task-1")
    assert "while it is executing" in running and "give it up" in running and "task-acked" in running
    assert "nothing more can happen" in tasks.refusal(state_at("closed"), "task-assigned", "task-1")
    assert "allowed now: task-retried" in tasks.refusal(state_at("given_up"), "task-assigned", "task-1")


def test_a_retried_task_is_pending_again_with_its_failures_forgiven():
    failed = tasks.apply(state_at("executing"), "task-failed", {"error": "boom", "retry_after_s": 5}, 2.0, "task-1")
    given_up = tasks.apply(failed, "task-given-up", {}, 3.0, "task-1")
    again = tasks.apply(given_up, "task-retried", {"by": "operator"}, 4.0, "task-1")
    assert (again.status, again.failures, again.error, again.given_up, again.retry_at) == ("pending", 0, None, None, None)
    assert again.failed_on == [] and again.attempts == given_up.attempts      # its history is kept


def test_executing_must_be_the_assigned_agent_and_assigning_needs_one():
    with pytest.raises(tasks.IllegalTransition, match="assigned to a, not b"):
        tasks.apply(state_at("assigned"), "task-executing", {"agent": "b"}, 1.0, "task-1")
    with pytest.raises(tasks.IllegalTransition, match="needs an agent"):
        tasks.apply(state_at("pending"), "task-assigned", {}, 1.0, "task-1")


# -- folds ----------------------------------------------------------------------------------------------

def test_fold_tracks_fields_timestamps_and_failures():
    events = [ev("task-created", 1.0, project="web", title="T", prompt="P", priority=3),
              ev("task-assigned", 2.0, agent="claude"), ev("task-executing", 3.0, agent="claude"),
              ev("task-failed", 4.0, error="exit 1"),
              ev("task-assigned", 5.0, agent="codex"), ev("task-executing", 6.0),
              ev("task-acked", 7.5, result={"summary": "done"}), ev("task-closed", 8.0)]
    t = tasks.fold_tasks(events)["task-1"]
    assert (t.project, t.title, t.prompt, t.priority) == ("web", "T", "P", 3)
    assert (t.status, t.agent, t.last_agent, t.result) == ("closed", None, "codex", {"summary": "done"})
    assert (t.failures, t.attempts, t.error) == (0, 2, None)       # the ack reset the failure streak
    assert (t.created, t.assigned, t.started, t.acked, t.closed, t.updated) == (1.0, 5.0, 6.0, 7.5, 8.0, 8.0)


def test_fold_skips_events_the_table_refuses():
    events = [ev("task-acked", 1.0), ev("task-created", 2.0, project="p", title="t", prompt="x"),
              ev("task-closed", 3.0), ev("task-assigned", 4.0, agent="a")]
    t = tasks.fold_tasks(events)["task-1"]
    assert t.status == "closed" and t.agent is None
    assert "task-2" not in tasks.fold_tasks([ev("task-failed", target="task-2")])


def test_decide_gives_up_at_the_failure_limit_in_the_same_batch():
    history = history_to("executing")
    first = tasks.decide(history, "task-failed", "task-1", {"error": "x"}, 1.0, "executor", max_failures=2)
    assert [t for t, _ in first] == ["task-failed"]
    history += [ev("task-failed", error="x"), ev("task-assigned", agent="a")]
    second = tasks.decide(history, "task-failed", "task-1", {"error": "y"}, 2.0, "executor", max_failures=2)
    assert [t for t, _ in second] == ["task-failed", "task-given-up"]
    assert second[1][1]["reason"] == "failed 2 times in a row"


@pytest.mark.parametrize("reason", sorted(tasks.FINAL_REASONS))
def test_a_failure_that_cannot_fix_itself_gives_the_task_up_at_once(reason):
    """Not logged in, a missing key, an unknown option, a turn cap: the same run gives the same answer."""
    out = tasks.decide(history_to("executing"), "task-failed", "task-1", {"reason": reason, "error": "x"}, 1.0,
                       "executor", max_failures=3, retry=(10, 300))
    assert [t for t, _ in out] == ["task-failed", "task-given-up"]
    assert out[1][1]["reason"] == f"{reason}: retrying cannot fix it" and "retry_after_s" not in out[0][1]


def test_a_failed_run_waits_before_the_task_is_handed_out_again_doubling():
    history = history_to("executing")
    first = tasks.decide(history, "task-failed", "task-1", {"reason": "agent"}, 100.0, "executor", 5, (10, 25))
    assert first[0][1]["retry_after_s"] == 10
    history += [ev("task-failed", 100.0, **first[0][1])]
    state = tasks.fold_tasks(history)["task-1"]
    assert state.status == "pending" and state.retry_at == 110.0
    waiting = tasks.pending_tasks({"task-1": state}, now=105.0)
    assert waiting.tasks == [] and waiting.pending_count == 1 and waiting.waiting_retry == 1
    assert waiting.next_retry == 110.0
    assert [t.id for t in tasks.pending_tasks({"task-1": state}, now=110.0).tasks] == ["task-1"]
    history += [ev("task-assigned", 111.0, agent="a"), ev("task-executing", 111.0, agent="a")]
    second = tasks.decide(history, "task-failed", "task-1", {"reason": "agent"}, 112.0, "executor", 5, (10, 25))
    assert second[0][1]["retry_after_s"] == 20
    history += [ev("task-failed", 112.0, **second[0][1]), ev("task-assigned", 140.0, agent="a"),
                ev("task-executing", 140.0, agent="a")]
    third = tasks.decide(history, "task-failed", "task-1", {"reason": "agent"}, 141.0, "executor", 5, (10, 25))
    assert third[0][1]["retry_after_s"] == 25          # capped


def test_pending_tasks_orders_by_priority_then_age_and_counts_by_project():
    events = []
    for n, (project, prio, ts) in enumerate([("a", 0, 1.0), ("b", 5, 2.0), ("a", 5, 3.0), ("a", 1, 4.0)], 1):
        events.append(ev("task-created", ts, target=f"task-{n}", project=project, title="t", prompt="x",
                         priority=prio))
    events.append(ev("task-assigned", 5.0, target="task-4", agent="x"))
    pending = tasks.pending_tasks(tasks.fold_tasks(events), now=0.0, limit=2)
    assert pending.pending_count == 3
    assert [t.id for t in pending.tasks] == ["task-2", "task-3"]
    assert pending.by_project == {"a": 2, "b": 1}


def test_agent_stats_count_per_agent_with_durations_and_streaks():
    def run(task, agent, start, outcome, end):
        return [ev("task-assigned", start - 0.5, target=task, agent=agent),
                ev("task-executing", start, target=task, agent=agent),
                ev(outcome, end, target=task, **({"error": "x"} if outcome == "task-failed" else {}))]
    events = [ev("task-created", 0.0, target=f"task-{n}", project="p", title="t", prompt="x") for n in (1, 2, 3)]
    events += run("task-1", "fast", 1.0, "task-acked", 1.2) + [ev("task-closed", 2.0, target="task-1")]
    events += run("task-2", "fast", 3.0, "task-acked", 3.4)
    events += run("task-3", "flaky", 1.0, "task-failed", 2.0) + run("task-3", "flaky", 3.0, "task-failed", 4.0)
    events += [ev("task-given-up", 5.0, target="task-3")]
    events += [ev("task-created", 6.0, target="task-4", project="p", title="t", prompt="x"),
               ev("task-closed", 7.0, target="task-4")]          # closed by hand: counts for nobody
    stats = tasks.agent_capability_stats(events)
    assert set(stats) == {"fast", "flaky"}
    fast, flaky = stats["fast"], stats["flaky"]
    assert (fast.assigned, fast.acked, fast.closed, fast.failed, fast.consecutive_failures) == (2, 2, 1, 0, 0)
    assert fast.avg_duration_ms == pytest.approx(300.0)
    assert (flaky.assigned, flaky.failed, flaky.consecutive_failures, flaky.given_up) == (2, 2, 2, 1)
    assert flaky.avg_duration_ms is None


def test_task_ids_parse_from_a_number_or_the_full_id():
    assert tasks.parse_task_id("7") == tasks.parse_task_id("task-7") == "task-7"
    for bad in ("0", "x", "task-", "7a", "-1"):
        with pytest.raises(ValueError):
            tasks.parse_task_id(bad)


# -- on a real events.db --------------------------------------------------------------------------------

def test_record_appends_checked_events_and_refuses_without_writing(conn):
    t = tasks.create(conn, "web", "title", "prompt", priority=2)
    assert t.id == "task-1" and tasks.create(conn, "web", "two", "p").id == "task-2"
    tasks.record(conn, "task-1", "task-assigned", "test", agent="a")
    before = eventsdb.last_event_id(conn)
    with pytest.raises(tasks.IllegalTransition, match="while it is assigned"):
        tasks.record(conn, "task-1", "task-closed", "test")
    with pytest.raises(tasks.IllegalTransition, match="no such task"):
        tasks.record(conn, "task-99", "task-assigned", "test", agent="a")
    assert eventsdb.last_event_id(conn) == before
    assert tasks.record(conn, "task-1", "task-executing", "test", agent="a").status == "executing"
    assert [e.type for e in eventsdb.task_history(conn, "task-1")] == ["task-created", "task-assigned",
                                                                     "task-executing"]


def test_three_failures_in_a_row_give_the_task_up(conn):
    tasks.create(conn, "p", "t", "x")
    for n in range(1, 4):
        tasks.record(conn, "task-1", "task-assigned", "tick", agent="a")
        state = tasks.record(conn, "task-1", "task-failed", "executor", error=f"run {n} failed")
    assert state.status == "given_up" and state.failures == 3
    types = [e.type for e in eventsdb.task_history(conn, "task-1")]
    assert types[-2:] == ["task-failed", "task-given-up"] and types.count("task-failed") == 3


def test_racing_writers_move_a_task_once(tmp_path, conn):
    """Two connections (as two processes would have) assign the same pending task at once: one wins."""
    tasks.create(conn, "p", "t", "x")
    results: list[str] = []
    barrier = threading.Barrier(8)

    def assign(agent: str) -> None:
        own = eventsdb.open_events(tmp_path / "events.db")
        barrier.wait()
        try:
            tasks.record(own, "task-1", "task-assigned", "test", agent=agent)
            results.append(agent)
        except tasks.IllegalTransition:
            results.append("refused")
        finally:
            own.close()

    threads = [threading.Thread(target=assign, args=(f"agent-{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results).count("refused") == 7
    assigned = [e for e in eventsdb.task_history(conn, "task-1") if e.type == "task-assigned"]
    assert len(assigned) == 1 and assigned[0].data["agent"] in results


def test_snapshot_extras_fold_incrementally(conn):
    eventsdb.append_events(conn, [eventmsgs.now_event("wake", "test", "tick")])
    book = tasks.TaskBook()
    assert tasks.snapshot_extras(conn, book) == {"pending-tasks": tasks.PendingTasks(),
                                                 "agent-capability-stats": {}}
    tasks.create(conn, "p", "t", "x")
    tasks.create(conn, "q", "t", "x", priority=9)
    tasks.record(conn, "task-1", "task-assigned", "tick", agent="a")
    extras = tasks.snapshot_extras(conn, book)
    assert extras["pending-tasks"].pending_count == 1 and extras["pending-tasks"].tasks[0].id == "task-2"
    assert extras["agent-capability-stats"]["a"].assigned == 1
    assert book.last_id == eventsdb.last_event_id(conn)
    assert tasks.snapshot_extras(conn) == extras            # a fresh fold agrees with the incremental one


# -- pulsectl task ----------------------------------------------------------------------------------------

def ctl(home, *args, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PULSECTL, "--home", str(home), "task", *args], capture_output=True, text=True,
                          timeout=30, input=input)


def test_pulsectl_task_add_list_show_close_give_up(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert ctl(home, "add", "--project", "web", "--title", "Fix login", "--prompt", "look at auth",
               "--priority", "5").stdout.strip() == "task-1"
    assert ctl(home, "add", "--project", "ops", "--title", "Rotate logs", "--prompt", "-",
               input="from stdin\n").stdout.strip() == "task-2"
    listing = ctl(home, "list").stdout.splitlines()
    assert listing[0].split() == ["ID", "STATUS", "PRIO", "PROJECT", "AGENT", "TITLE"]
    assert listing[1].split()[:4] == ["task-1", "pending", "5", "web"] and listing[1].endswith("Fix login")
    rows = [json.loads(line) for line in ctl(home, "list", "--json").stdout.splitlines()]
    assert [(r["id"], r["status"], r["prompt"]) for r in rows] == [("task-1", "pending", "look at auth"),
                                                                   ("task-2", "pending", "from stdin\n")]
    assert ctl(home, "close", "1").stdout.strip() == "task-1: closed"
    again = ctl(home, "close", "task-1")
    assert again.returncode == 1 and "task-1 is closed: nothing more can happen" in again.stderr
    assert ctl(home, "give-up", "2", "--reason", "obsolete").stdout.strip() == "task-2: given_up"
    shown = ctl(home, "show", "2")
    assert "status:      given_up" in shown.stdout and "task-given-up" in shown.stdout and "obsolete" in shown.stdout
    detail = json.loads(ctl(home, "show", "2", "--json").stdout)
    assert detail["status"] == "given_up" and [e["type"] for e in detail["events"]] == ["task-created",
                                                                                         "task-given-up"]
    assert [json.loads(x)["id"] for x in ctl(home, "list", "--json", "--status", "closed").stdout.splitlines()] \
        == ["task-1"]


def test_pulsectl_task_refuses_unknown_and_malformed_ids(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    ctl(home, "add", "--project", "p", "--title", "t", "--prompt", "x")
    missing = ctl(home, "show", "42")
    assert missing.returncode == 1 and "task-42: no such task" in missing.stderr
    assert ctl(home, "give-up", "42").returncode == 1
    bad = ctl(home, "close", "latest")
    assert bad.returncode == 2 and "not a task id" in bad.stderr
    nohome = ctl(tmp_path / "nowhere", "add", "--project", "p", "--title", "t", "--prompt", "x")
    assert nohome.returncode == 1 and "no Pulse home" in nohome.stderr


def test_a_fold_that_forgot_a_given_up_task_has_it_back_from_its_retry():
    book = tasks.TaskBook(forget_ended=True)
    book.fold(history_to("given_up"))
    assert "task-1" not in book.agents.tasks                   # given up: forgotten, its memory freed
    book.fold([ev("task-retried", by="operator", project="p", title="t", prompt="do", priority=0)])
    assert book.agents.tasks["task-1"].status == "pending" and book.agents.tasks["task-1"].prompt == "do"
    with pytest.raises(tasks.IllegalTransition, match="no such task"):    # a retry without the task: refused
        tasks.apply(None, "task-retried", {"by": "operator"}, 1.0, "task-2")


def test_runs_that_keep_ending_the_same_way_give_the_task_up_saying_so():
    same_end = (2, tasks.PULSE_ENDS)
    history = history_to("executing")
    first = tasks.decide(history, "task-failed", "task-1", {"reason": "loop", "code": -9}, 1.0, "executor", 5,
                         (10, 300), same_end)
    assert [t for t, _ in first] == ["task-failed"] and first[0][1]["retry_after_s"] == 10
    history += [ev("task-failed", **first[0][1]), ev("task-assigned", agent="a"), ev("task-executing")]
    # a loop again (its kill's exit code does not matter): given up, not retried, saying why
    second = tasks.decide(history, "task-failed", "task-1", {"reason": "loop", "code": -15}, 2.0, "executor", 5,
                          (10, 300), same_end)
    assert [t for t, _ in second] == ["task-failed", "task-given-up"] and "retry_after_s" not in second[0][1]
    assert second[1][1]["same_end"] == "loop"
    assert second[1][1]["reason"].startswith("its last 2 runs all ended the same way (loop)"), second[1][1]
    # another way in between, an ack, or a reason not counted: retried as before
    other = tasks.decide(history, "task-failed", "task-1", {"reason": "over-budget"}, 2.0, "executor", 5, None, same_end)
    assert [t for t, _ in other] == ["task-failed"]
    assert [t for t, _ in tasks.decide(history, "task-failed", "task-1", {"reason": "agent", "code": 1}, 2.0,
                                       "executor", 5, None, same_end)] == ["task-failed"]
    # the agent's own failure, when listed, counts with its exit code
    own = (3, ("agent",))
    agent_history = history_to("executing") + [ev("task-failed", reason="agent", code=1), ev("task-assigned", agent="a"),
                                                ev("task-executing"), ev("task-failed", reason="agent", code=1),
                                                ev("task-assigned", agent="a"), ev("task-executing")]
    assert [t for t, _ in tasks.decide(agent_history, "task-failed", "task-1", {"reason": "agent", "code": 2}, 3.0,
                                       "executor", 5, None, own)] == ["task-failed"]
    out = tasks.decide(agent_history, "task-failed", "task-1", {"reason": "agent", "code": 1}, 3.0, "executor", 5,
                       None, own)
    assert out[1][1]["reason"].startswith("its last 3 runs all ended the same way (agent, exit code 1)")
    # 0: never
    assert [t for t, _ in tasks.decide(history, "task-failed", "task-1", {"reason": "loop"}, 2.0, "executor", 5, None,
                                       (0, tasks.PULSE_ENDS))] == ["task-failed"]
