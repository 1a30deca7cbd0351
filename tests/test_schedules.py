"""[[schedule]]: slots, catch-up, the fold of what ran, and the tick that runs them through kills.

The pure part checks pulse.core.schedule and pulse.store.schedulerun on their own; the daemon part
runs a real pulsed with schedules every 2 s, kills its tick, executor and pulsed itself, stops it
across slots, and reads events.db for what ran. scripts/schedule_chaos.py is the 60 s version.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time

import psutil
import pytest

from pulse.core import config as configmod
from pulse.core import schedule
from pulse.core.config import Schedule, ScheduleEffect, ScheduleTask
from pulse.core.wire import eventmsgs
from pulse.store import eventsdb, schedulerun
from support import wait_for

TASK = ScheduleTask(project="p", title="t", prompt="do it")


def every(seconds: str, **kw) -> Schedule:
    return Schedule(name=kw.pop("name", "s"), every=seconds, task=TASK, **kw)


# -- reading a schedule --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("2s", 2), ("15m", 900), ("1h30m", 5400), ("1d", 86400), ("1500ms", 1.5)])
def test_every_reads_durations(text, seconds):
    assert schedule.parse_every(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "m", "15 minutes", "1x", "500ms", "-1s"])
def test_every_refuses_what_is_not_a_duration_of_a_second_or_more(text):
    with pytest.raises(ValueError):
        schedule.parse_every(text)


def load(tmp_path, text: str) -> configmod.Config:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return configmod.load(path, environ={})


@pytest.mark.parametrize("cron, field", [("61 * * * *", "minute"), ("0 25 * * *", "hour"), ("0 3 32 * *", "day of month"),
                                         ("0 3 * 13 *", "month"), ("0 3 * * 9", "day of week")])
def test_a_bad_cron_expression_is_a_config_error_naming_the_schedule_and_the_field(tmp_path, cron, field):
    with pytest.raises(configmod.ConfigError) as err:
        load(tmp_path, f'[[schedule]]\nname = "nightly"\ncron = "{cron}"\neffect = {{ kind = "noop" }}\n')
    assert "schedule 'nightly'" in str(err.value) and ".cron" in str(err.value)
    assert f"the {field} field" in str(err.value)


@pytest.mark.parametrize("body, says", [
    ('cron = "0 3 * *"', "has 4 fields"),
    ('every = "soon"', ".every: 'soon' is not a duration"),
    ('cron = "0 3 * * *"\nevery = "1h"', "exactly one of cron or every"),
    ('every = "1h"\ntask = { project = "p", title = "t", prompt = "x" }', "exactly one of task or effect"),
    ('every = "1m"\njitter_s = 60', "jitter_s must be shorter than every"),
])
def test_other_mistakes_are_named_too(tmp_path, body, says):
    with pytest.raises(configmod.ConfigError, match="schedule 'n'") as err:
        load(tmp_path, f'[[schedule]]\nname = "n"\n{body}\neffect = {{ kind = "noop" }}\n')
    assert says in str(err.value)


def test_a_task_for_an_agent_that_is_not_configured_is_refused(tmp_path):
    with pytest.raises(configmod.ConfigError, match=r"task\.agent: no \[\[agent\]\] named 'ghost'"):
        load(tmp_path, '[[schedule]]\nname = "n"\nevery = "1h"\n'
                       'task = { project = "p", title = "t", prompt = "x", agent = "ghost" }\n')


def test_defaults_are_as_stated_and_the_tick_reads_the_schedules(tmp_path):
    config = load(tmp_path, '[[schedule]]\nname = "n"\ncron = "0 3 * * *"\n'
                            'task = { project = "p", title = "t", prompt = "x" }\n')
    s = config.schedule[0]
    assert (s.catch_up, s.grace_s, s.jitter_s, s.notify_after) == (True, 60, 0, 2)
    assert configmod.slice_of(config, "tick").schedule == config.schedule
    assert "[[schedule]]" in configmod.default_toml()


# -- slots and steps -----------------------------------------------------------------------------------

def test_every_slots_are_multiples_of_the_period_since_the_epoch():
    s = every("15m")
    assert schedule.slot_at_or_before(s, 900 * 10 + 5) == 9000
    assert schedule.slot_at_or_before(s, 9000) == 9000
    assert schedule.slot_after(s, 9000) == 9900


def test_cron_slots_are_host_local_time_and_a_slot_at_now_is_due_now():
    s = Schedule(name="c", cron="30 * * * *", effect=ScheduleEffect(kind="noop"))
    now = time.time()
    slot = schedule.slot_at_or_before(s, now)
    assert time.localtime(slot).tm_min == 30 and 0 <= now - slot < 3600
    assert schedule.slot_at_or_before(s, slot) == slot            # exactly at the slot: that slot
    assert schedule.slot_after(s, slot) - slot == 3600


def test_a_new_schedule_is_armed_not_run_and_its_first_run_is_its_next_slot():
    s = every("10s")
    assert schedule.next_step(s, None, 105.0) == schedule.Step("arm", 100.0, 5.0)
    assert schedule.next_step(s, 100.0, 109.9) is None
    assert schedule.next_step(s, 100.0, 110.2).action == "run"
    assert schedule.next_due(s, 100.0, 105.0) == 110.0


def test_after_downtime_catch_up_runs_the_latest_missed_slot_once():
    s = every("10s")
    step = schedule.next_step(s, 100.0, 163.0)          # slots 110 … 160 were missed
    assert step == schedule.Step("run", 160.0, 3.0)
    assert schedule.next_step(s, 160.0, 163.0) is None  # once run, nothing more until 170
    assert schedule.next_due(s, 160.0, 163.0) == 170.0


def test_without_catch_up_a_slot_later_than_grace_is_skipped():
    s = every("10s", catch_up=False, grace_s=2)
    assert schedule.next_step(s, 100.0, 161.5).slot == 160.0   # within grace: on time
    assert schedule.next_step(s, 100.0, 163.0) is None         # missed while down: skipped
    assert schedule.next_due(s, 100.0, 163.0) == 170.0


def test_jitter_is_fixed_per_slot_within_its_bound_and_delays_the_run():
    s = every("60s", name="j", jitter_s=30)
    delays = [schedule.jitter("j", slot, 30) for slot in range(0, 6000, 60)]
    assert all(0 <= d < 30 for d in delays) and len(set(delays)) > 50
    assert schedule.jitter("j", 600.0, 30) == schedule.jitter("j", 600.0, 30)
    d = schedule.jitter("j", 600.0, 30)
    assert schedule.next_step(s, 540.0, 600 + d - 0.01) is None
    assert schedule.next_step(s, 540.0, 600 + d + 0.01).slot == 600.0
    assert schedule.next_due(s, 540.0, 600.0) == pytest.approx(600 + d)


# -- the fold ------------------------------------------------------------------------------------------

def ev(type_: str, target: str | None, ts: float = 0.0, **data) -> eventmsgs.Event:
    return eventmsgs.Event(type=type_, source="test", target=target, data=data, ts=ts)


def test_the_fold_knows_the_last_slot_and_counts_runs_that_keep_failing():
    book = schedule.ScheduleBook()
    book.fold([ev("schedule-armed", "s", slot=100.0),
               ev("schedule-run", "s", slot=110.0, task="task-1"),
               ev("schedule-run", "s", task="task-2", manual=True),            # the operator's: no slot
               ev("task-given-up", "task-1", ts=5.0),
               ev("task-failed", "task-2"),                                      # retried: not an end
               ev("task-given-up", "task-2", ts=6.0)])
    state = book.states["s"]
    assert (state.last_slot, state.runs, state.manual_runs, state.last_run) == (110.0, 1, 1, "task-2")
    assert (state.failures_in_row, state.last_failure_ts, state.last_outcome) == (2, 6.0, "failed")
    assert schedule.failing(state, 2) and not schedule.failing(state, 3) and not schedule.failing(state, 0)
    book.fold([ev("schedule-run", "s", slot=120.0, effect="e1"),
               ev("effect-failed", None, effect_id="e1", requeued=True),       # going round again
               ev("effect-acked", None, effect_id="e1")])
    assert (state.failures_in_row, state.last_outcome, state.last_slot) == (0, "ok", 120.0)
    assert book.open == {}


# -- committing a run ----------------------------------------------------------------------------------

def test_a_run_is_its_task_and_its_fact_in_one_transaction_and_a_slot_runs_once(tmp_path):
    conn = eventsdb.open_events(tmp_path / "events.db")
    s = every("10s")

    def make(n):
        return eventmsgs.now_event("task-created", "tick", f"task-{n}", schedule.task_fields(s, 110.0))
    assert schedulerun.commit_run(conn, "s", "tick", slot=100.0) .type == "schedule-armed"
    fact = schedulerun.commit_run(conn, "s", "tick", slot=110.0, make_task=make)
    assert fact.type == "schedule-run" and fact.data["task"] == "task-1"
    assert schedulerun.commit_run(conn, "s", "tick", slot=110.0, make_task=make) is None   # refused: ran
    assert schedulerun.commit_run(conn, "s", "tick", slot=100.0, make_task=make) is None   # refused: passed
    manual = schedulerun.commit_run(conn, "s", "pulsectl", slot=None, make_task=make, by="operator")
    assert manual.data == {"manual": True, "by": "operator", "task": "task-2"}
    assert schedulerun.latest_slot(conn, "s") == 110.0                                       # manual: no slot
    created = eventsdb.read_events(conn, types=["task-created"])
    assert [e.target for e in created] == ["task-1", "task-2"] and created[0].data["schedule"] == "s"


def test_a_failed_commit_writes_neither_the_task_nor_the_fact(tmp_path):
    conn = eventsdb.open_events(tmp_path / "events.db")

    def broken(n):
        raise RuntimeError("disk trouble")
    with pytest.raises(RuntimeError):
        schedulerun.commit_run(conn, "s", "tick", slot=110.0, make_task=broken)
    assert eventsdb.read_events(conn) == [] and schedulerun.latest_slot(conn, "s") is None


# -- the tick, through kills -----------------------------------------------------------------------------

PERIOD_S = 2
CHAOS_S = 20


def schedule_toml(name: str, extra: str = "",
                  makes: str = 'task = { project = "sched", title = "NAME", prompt = "run NAME" }') -> str:
    # no agent runs these tasks: overlap lets each slot make its own (the one-open-run rule has its own test)
    return f'[[schedule]]\nname = "{name}"\nevery = "{PERIOD_S}s"\n{makes.replace("NAME", name)}\noverlap = true\n{extra}\n'


def runs(pulsed, name: str) -> list[dict]:
    return [e for e in pulsed.events("schedule-run", name) if not e["data"].get("manual")]


def check_runs(pulsed, name: str, downtimes: list[tuple[float, float]]) -> dict:
    """Each slot ran at most once, always the latest due one (so after a gap, one catch-up run),
    with its task; every slot that did not run fell within a downtime. Returns the figures."""
    events = pulsed.events()
    done = [e for e in events if e["type"] == "schedule-run" and e["target"] == name and not e["data"].get("manual")]
    armed = next(e for e in events if e["type"] == "schedule-armed" and e["target"] == name)
    created = {e["target"]: e for e in events if e["type"] == "task-created"}
    slots = [e["data"]["slot"] for e in done]
    assert len(slots) == len(set(slots)), "a slot ran twice"
    assert slots == sorted(slots)
    for e in done:
        task = created[e["data"]["task"]]
        assert task["id"] == e["id"] - 1 and task["data"]["slot"] == e["data"]["slot"]   # one transaction
        assert 0 <= e["data"]["late_s"] < PERIOD_S, f"slot {e['data']['slot']} ran when a later one was due"
    expected = range(int(armed["data"]["slot"]) + PERIOD_S, int(slots[-1]) + 1, PERIOD_S)
    missed = sorted(set(expected) - set(slots))
    for slot in missed:
        assert any(down - PERIOD_S <= slot <= up for down, up in downtimes), f"slot {slot} was missed while up"
    errors = sorted(created[e["data"]["task"]]["ts"] - e["data"]["slot"] for e in done)
    return {"runs": len(done), "missed": len(missed), "errors": errors}


def p(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def kill_at_random(pulsed, seconds: float, seed: int) -> list[tuple[float, float]]:
    """SIGKILL the tick, the executor or pulsed itself, at random for `seconds`; (killed, back) of each."""
    rng, downtimes = random.Random(seed), []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        deadline = time.monotonic() + rng.uniform(0.5, 3.0)
        wait_for(lambda: time.monotonic() >= deadline, 5, what="the next kill")
        victim = rng.choice(["tick", "tick", "executor", "pulsed"])
        killed = time.time()
        if victim == "pulsed":
            tree = pulsed.tree()
            os.kill(pulsed.proc.pid, signal.SIGKILL)
            pulsed.proc.wait(5)
            wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree), 5,
                     what="pulsed's workers gone with it")
            pulsed.start()
        else:
            old = pulsed.worker(victim).pid
            os.kill(old, signal.SIGKILL)
            pulsed.wait_replaced(victim, old, heartbeat=False)
        downtimes.append((killed, time.time()))
    return downtimes


def test_kills_of_the_tick_executor_and_pulsed_never_run_a_slot_twice_nor_miss_one_while_up(pulsed, tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "config.toml").write_text(schedule_toml("chaos"))
    pulsed.start()
    wait_for(lambda: len(runs(pulsed, "chaos")) >= 1, 10, what="the first run")
    downtimes = kill_at_random(pulsed, CHAOS_S, seed=22)
    count = len(runs(pulsed, "chaos"))
    wait_for(lambda: len(runs(pulsed, "chaos")) >= count + 2, 10, what="two more runs after the last kill")
    figures = check_runs(pulsed, "chaos", downtimes)
    assert figures["runs"] >= CHAOS_S / PERIOD_S / 2
    on_time = [e for e in figures["errors"] if e < 0.5]
    print(f"\nschedule every {PERIOD_S}s, {len(downtimes)} kills in {CHAOS_S}s: {figures['runs']} runs, "
          f"{figures['missed']} slots missed while down; slot → task-created: "
          f"median {p(figures['errors'], 0.5) * 1000:.1f} ms, max {figures['errors'][-1] * 1000:.0f} ms")
    assert len(on_time) >= figures["runs"] / 2


def test_stopped_across_three_slots_catch_up_runs_once_on_start_and_without_it_none(pulsed, tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "config.toml").write_text(
        schedule_toml("eager") + schedule_toml("lazy", "catch_up = false\ngrace_s = 0.5")
        + schedule_toml("broken", "notify_after = 2", makes='effect = { kind = "exec", params = { argv = ["false"] } }'))
    pulsed.start()
    wait_for(lambda: len(runs(pulsed, "eager")) >= 2, 10, what="two runs")
    # the failing schedule notifies, once its runs failed twice in a row
    notice = wait_for(lambda: next((e for e in pulsed.events("effect") if e["data"]["kind"] == "notify"
                                    and e["data"]["params"].get("rule") == "schedule-failing"), None), 15,
                      what="the failing schedule's notification")
    assert notice["target"] == "broken" and "keeps failing" in notice["data"]["params"]["title"]
    pulsed.terminate()
    stopped = time.time()
    last = runs(pulsed, "eager")[-1]["data"]["slot"]
    wait_for(lambda: time.time() >= last + 4 * PERIOD_S + 0.3, 15, what="three slots passing while stopped")
    restarting = time.time()
    pulsed.start()
    wait_for(lambda: any(e["data"]["slot"] > restarting for e in runs(pulsed, "eager")), 10,
             what="a slot after the start")
    eager = [e["data"] for e in runs(pulsed, "eager") if e["data"]["slot"] > last]
    assert eager[0]["slot"] >= last + 4 * PERIOD_S                         # one run for the three or more missed
    assert [d["slot"] for d in eager] == [eager[0]["slot"] + i * PERIOD_S for i in range(len(eager))]
    assert eager[0]["late_s"] > 0                                          # ... run when pulsed was back
    lazy = [e["data"] for e in runs(pulsed, "lazy")]
    assert not [d for d in lazy if stopped < d["slot"] < restarting - 0.5]   # missed while down: skipped
    assert all(d["late_s"] <= 0.5 for d in lazy)

    # the operator: list shows next and last runs, and run runs one now, outside the slots
    listed = {r["name"]: r for r in map(json.loads, pulsed.ctl("schedule", "list", "--json").stdout.splitlines())}
    assert set(listed) == {"eager", "lazy", "broken"}
    assert listed["eager"]["next_run"] > listed["eager"]["last_run_ts"] - PERIOD_S
    assert listed["broken"]["failing"] and listed["broken"]["failures_in_row"] >= 2
    out = pulsed.ctl("schedule", "run", "eager")
    assert out.returncode == 0, out.stderr
    manual = wait_for(lambda: [e for e in pulsed.events("schedule-run", "eager") if e["data"].get("manual")], 5)
    assert manual[0]["data"]["by"] == "operator" and manual[0]["source"] == "pulsectl"
    task = manual[0]["data"]["task"]
    assert json.loads(pulsed.ctl("task", "show", task, "--json").stdout)["status"] == "pending"
    text = pulsed.ctl("schedule", "list").stdout
    assert "eager" in text and "every 2s" in text
    assert pulsed.ctl("schedule", "run", "nope").returncode == 1

    # the tick owns the schedules: with the engine stopped, they still run
    assert pulsed.ctl("stop", "engine").returncode == 0
    pulsed.wait_state("engine", "stopped")
    stopped_engine = time.time()
    wait_for(lambda: len([e for e in runs(pulsed, "eager") if e["data"]["slot"] > stopped_engine]) >= 2, 10,
             what="two runs with the engine stopped")


def test_a_scheduled_task_for_an_agent_is_pinned_to_it_as_task_add_agent_pins():
    from pulse.agents import tasks
    s = Schedule(name="nightly", every="1h", task=ScheduleTask(project="p", title="t", prompt="do it", agent="claude"))
    created = eventmsgs.now_event("task-created", "tick", "task-1", schedule.task_fields(s, 3600.0))
    (task,) = tasks.fold_tasks([created]).values()
    assert task.pin == "claude" and "agent" not in created.data


# -- one open run at a time ------------------------------------------------------------------------------

def test_one_run_is_open_at_a_time_a_due_slot_waits_with_catch_up_and_is_skipped_without():
    s = every("10s")
    assert schedule.next_step(s, 100.0, 110.2, open_run="task-1") is None      # held behind task-1
    assert schedule.next_due(s, 100.0, 110.2, "task-1") == 120.0               # no timer wakes for it
    assert schedule.next_step(s, 100.0, 133.0) == schedule.Step("run", 130.0, 3.0)   # ended: one run for 110…130
    lazy = every("10s", catch_up=False)
    step = schedule.next_step(lazy, 100.0, 110.2, open_run="task-1")
    assert (step.action, step.slot) == ("skip", 110.0)
    assert schedule.next_step(every("10s", overlap=True), 100.0, 110.2, open_run="task-1").action == "run"
    book = schedule.ScheduleBook()
    book.fold([ev("schedule-armed", "s", slot=100.0), ev("schedule-run", "s", slot=110.0, task="task-1"),
               ev("schedule-run", "s", ts=7.0, slot=120.0, skipped=True, open_run="task-1")])
    state = book.states["s"]
    assert (state.open_run, state.skipped, state.last_skipped_ts, state.last_slot, state.runs) == ("task-1", 1, 7.0, 120.0, 1)
    book.fold([ev("task-closed", "task-1")])        # closed by the operator: ended, no verdict
    assert (state.open_run, state.last_outcome, state.failures_in_row) == (None, None, 0) and book.open == {}


def test_a_schedule_behind_a_pending_task_makes_no_second_one_and_says_why(pulsed, tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "config.toml").write_text(
        '[[schedule]]\nname = "eager"\nevery = "1s"\ntask = { project = "p", title = "eager", prompt = "x" }\n\n'
        '[[schedule]]\nname = "lazy"\nevery = "1s"\ncatch_up = false\ntask = { project = "p", title = "lazy", prompt = "x" }\n')
    pulsed.start()    # no [[agent]]: each schedule's first task stays pending

    def listed():
        return {r["name"]: r for r in map(json.loads, pulsed.ctl("schedule", "list", "--json").stdout.splitlines())}
    wait_for(lambda: listed()["lazy"]["skipped"] >= 3, 15, what="three slots of lazy skipped")
    made = {s: [e["data"]["task"] for e in runs(pulsed, s) if e["data"].get("task")] for s in ("eager", "lazy")}
    assert len(made["eager"]) == 1 and len(made["lazy"]) == 1, made       # one pending run each, never a pile
    rows = listed()
    assert rows["eager"]["open_run"] == made["eager"][0] and rows["eager"]["skipped"] == 0   # eager waits, uncounted
    text = pulsed.ctl("schedule", "list").stdout
    assert f"after {made['eager'][0]}" in text and "SKIPPED" in text, text
    # its run ends (closed by the operator): the next slot makes one new task, once
    assert pulsed.ctl("task", "close", made["eager"][0]).returncode == 0
    wait_for(lambda: len([e for e in runs(pulsed, "eager") if e["data"].get("task")]) == 2, 10,
             what="eager's next run once its first ended")
    assert listed()["eager"]["open_run"] not in (None, made["eager"][0])
