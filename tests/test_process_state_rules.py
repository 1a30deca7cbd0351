"""The pure state projection of a guarded process and its crash-loop arithmetic
(pulse.rules.processstate), and processWatchdog's decisions from it, over hand-made snapshots."""

from __future__ import annotations

import asyncio

import pytest

from pulse.core import config as configmod
from pulse.core.config import Backoff, Config, Health, Process, Survival
from pulse.core.states import ProcessState, process_state_at
from pulse.core.wire.enginerpc import Outcome, ProcessExit, ProcessRuns, ProcessStart, Snapshot, Vital
from pulse.rules import guardview, processstate, survival

LIMITS = processstate.Limits(min_uptime_s=10, max_restarts=3, restart_window_s=300, backoff_base_s=1, backoff_max_s=8)


def start(ts, ok=True, origin="survival", why="dead", attempt=0, pid=0):
    return ProcessStart(ts, ok, origin, why, attempt, ts, pid or int(ts))


def exits(*deaths):
    """Exits of the processes that started at each start above (pid: the start's ts), at these times."""
    return [ProcessExit(pid=int(started), ts=at) for started, at in deaths]


def project(**facts):
    base = dict(now=1000.0, alive=True, started=900.0, died=None, restarting=False, guarded=True, stopped=False,
                paused_until=None, streak=[], held=False, limits=LIMITS, last_exit=None, probes_failing=0, failures=None,
                healthy_since_start=False, start_period_s=0.0, asked_not_to_restart=False)
    return processstate.project(**{**base, **facts})


def test_backoff_doubles_up_to_its_cap_and_the_first_start_waits_nothing():
    assert [processstate.backoff(n, 1, 8) for n in range(6)] == [0, 1, 2, 4, 8, 8]


def test_runs_shorter_than_min_uptime_are_a_crash_loop_and_a_long_run_ends_it():
    starts = [start(100), start(200), start(213), start(220)]
    # 50 s (long), then 3 s, 3 s and 4 s after their starts
    streak = processstate.failed_starts(starts, exits((100, 150.0), (200, 203.0), (213, 216.0), (220, 224.0)), None,
                                        230, LIMITS)
    assert [s.ts for s in streak] == [200, 213, 220]
    assert processstate.is_fatal(streak, LIMITS)
    assert processstate.next_start_at(streak[:1], 203.0, LIMITS) == 203.0     # after the first: at once
    assert processstate.next_start_at(streak, 224.0, LIMITS) == 226.0         # 3 failed: waits 2 s


def test_a_failed_restart_counts_and_a_young_run_is_not_judged_yet():
    streak = processstate.failed_starts([start(100, ok=False), start(102)], exits((100, 100.5)), None, 105, LIMITS)
    assert [s.ts for s in streak] == [100]     # the run started at 102 is 3 s old: neither failed nor good


def test_a_run_cut_short_by_a_restart_that_did_not_answer_its_death_is_not_judged():
    # restarted for its probes at 105 (asked at 104.5): its exit at 104.8 was Pulse stopping it
    starts = [start(90), start(100), start(105, why="unhealthy")]
    assert processstate.failed_starts(starts, exits((90, 93.0), (100, 104.8)), None, 106, LIMITS) == [starts[0]]
    # the watcher's death of the last one counts before its exit is recorded
    assert len(processstate.failed_starts(starts[:2], exits((90, 93.0)), 103.0, 104, LIMITS)) == 2


def test_the_window_and_an_operator_start_bound_the_loop():
    starts = [start(100), start(104), start(108)]
    deaths = exits((100, 103.0), (104, 107.0), (108, 111.0))
    assert len(processstate.failed_starts(starts, deaths, None, 112, LIMITS)) == 3
    assert len(processstate.failed_starts(starts, deaths, None, 112, LIMITS, since=104)) == 1
    narrow = processstate.Limits(10, 3, 6, 1, 8)
    assert len(processstate.failed_starts(starts, deaths, None, 112, narrow)) == 1


def test_states_from_facts():
    assert project(alive=None).state == ProcessState.UNKNOWN
    assert project().state == ProcessState.RUNNING
    assert project(started=995.0).state == ProcessState.STARTING                      # within min_uptime_s
    assert project(started=995.0).until == 1005.0
    assert project(failures=3, probes_failing=3).state == ProcessState.UNHEALTHY
    assert project(failures=3, probes_failing=2).state == ProcessState.RUNNING
    assert project(paused_until=2000.0).state == ProcessState.PAUSED
    dead = dict(alive=False, started=None, died=999.0)
    assert project(**dead, stopped=True).state == ProcessState.STOPPED
    assert project(**dead, guarded=False).state == ProcessState.DEAD
    assert project(**dead, asked_not_to_restart=True, last_exit="exit code 78").state == ProcessState.DEAD
    assert project(**dead).state == ProcessState.STARTING                               # restarted at once
    assert project(**dead, streak=[start(990)]).state == ProcessState.STARTING      # the first: at once
    backoff = project(alive=False, started=None, died=999.5, streak=[start(980), start(990)], last_exit="exit code 1")
    assert backoff.state == ProcessState.BACKOFF and backoff.until == 1000.5       # 2 failed starts: 1 s
    assert "exit code 1" in backoff.why
    fatal = project(**dead, streak=[start(970), start(980), start(990)], last_exit="exit code 1")
    assert fatal.state == ProcessState.FATAL and "exit code 1" in fatal.why


def test_a_start_past_its_until_reads_running():
    assert process_state_at("starting", 100.0, 101.0) == "running"
    assert process_state_at("starting", 100.0, 99.0) == "starting"
    assert process_state_at("backoff", 100.0, 101.0) == "backoff"


# -- processWatchdog and the status view, from a snapshot ----------------------------------------------

PROC = Process(name="gw", match="gw", restart=["gw"], min_uptime_s=10, max_restarts=3, restart_window_s=300,
               restart_backoff=Backoff(base_s=1, max_s=8))


def snapshot(now: float, runs: ProcessRuns, dead_since: float, **extra) -> Snapshot:
    vital = Vital(key="process-alive:gw", ts=dead_since, data={"alive": False, "dead_since": dead_since,
                                                               "looked_at": dead_since})
    return Snapshot(tick=1, ts=now, vitals={vital.key: vital}, runs={"gw": runs}, **extra)


def watchdog(curr: Snapshot, proc: Process = PROC):
    async def inner(prev, curr):
        return [], None
    rule = survival.process_watchdog(Config(process=[proc]))
    return asyncio.run(rule(None, curr, inner))


def test_the_watchdog_waits_out_the_backoff_then_restarts_with_the_attempt():
    runs = ProcessRuns(starts=[start(100), start(105)], exits=exits((100, 103.0), (105, 108.0)))
    effects, tick_ms = watchdog(snapshot(108.5, runs, 108.0))
    assert effects == [] and tick_ms == 501                    # 2 failed starts: waits 1 s after the death
    effects, _ = watchdog(snapshot(110.1, runs, 108.0))
    assert [(e.kind, e.params["why"], e.params["attempt"]) for e in effects] == [("restart-process", "dead", 3)]


def test_the_watchdog_holds_a_crash_loop_fatal_and_says_so_once_with_its_output():
    tail = "listening\nfatal: bad token"
    runs = ProcessRuns(starts=[start(100), start(105), start(112)],
                       exits=[*exits((100, 103.0), (105, 108.0)), ProcessExit(pid=112, ts=115.0, code=1, tail=tail)])
    curr = snapshot(116, runs, 115.0, exits={"gw": runs.exits[-1]})
    effects, _ = watchdog(curr)
    assert [e.kind for e in effects] == ["notify"]
    assert "fatal: bad token" in effects[0].params["message"] and effects[0].params["rule"] == "process-fatal"
    told = snapshot(120, runs, 115.0, exits={"gw": runs.exits[-1]}, notified={"process-fatal:gw": 116.0})
    assert watchdog(told)[0] == []                              # held, said once
    later = snapshot(1000, runs, 115.0, exits={"gw": runs.exits[-1]}, notified={"process-fatal:gw": 116.0})
    assert watchdog(later)[0] == []                             # still held when the window has passed
    assert guardview.process_view(later, PROC, Survival()).state == "fatal"
    view = guardview.process_view(told, PROC, Survival())
    assert view.state == "fatal" and view.last_exit.output[-1] == "fatal: bad token" and view.restarts == 0


def test_an_operator_stop_leaves_it_down_and_an_operator_start_counts_afresh():
    runs = ProcessRuns(starts=[start(100), start(105), start(112)], exits=exits((100, 103.0), (105, 108.0), (112, 115.0)))
    stopped = ProcessRuns(starts=runs.starts, exits=runs.exits, stopped=True, operator_at=115.5)
    assert watchdog(snapshot(116, stopped, 115.0))[0] == []
    assert guardview.process_view(snapshot(116, stopped, 115.0), PROC, Survival()).state == "stopped"
    started = ProcessRuns(starts=[*runs.starts, start(117, origin="operator")],
                          exits=[*runs.exits, *exits((117, 118.0))], operator_at=117)
    effects, _ = watchdog(snapshot(118.1, started, 118.0))
    assert [e.params["attempt"] for e in effects] == [1]        # the operator's start began a new count


def test_unhealthy_restarts_back_off_by_the_attempt_they_carry():
    proc = Process(name="gw", match="gw", restart=["gw"], health=Health(argv=["false"], failures=2),
                   restart_backoff=Backoff(base_s=1, max_s=60))
    alive = Vital(key="process-alive:gw", ts=200.0, data={"alive": True, "pid": 7, "since": 150.0})
    probes = [Vital(key="health:gw", ts=190.0 + i, data={"ok": False}) for i in range(8)]
    runs = ProcessRuns(starts=[start(190, why="unhealthy", attempt=4)])

    def curr(now):
        return Snapshot(tick=1, ts=now, vitals={alive.key: alive}, runs={"gw": runs}, history={"health:gw": probes})
    effects, tick_ms = watchdog(curr(195), proc)
    assert effects == [] and tick_ms == 3001                      # the 5th waits 8 s after the 4th (at 190)
    effects, _ = watchdog(curr(198.5), proc)
    assert [(e.params["why"], e.params["attempt"]) for e in effects] == [("unhealthy", 5)]


def test_unhealthy_restarts_that_never_saw_a_passing_probe_name_the_start_period():
    """Three restarts for failed probes and no probe passed since: the notification says that a
    start period too short for the host would look like this, and which value it has."""
    proc = Process(name="gw", match="gw", restart=["gw"], health=Health(argv=["false"], failures=2, start_period_s=15))
    alive = Vital(key="process-alive:gw", ts=300.0, data={"alive": True, "pid": 7, "since": 250.0})
    probes = [Vital(key="health:gw", ts=200.0 + i * 10, data={"ok": False, "error": "connection refused"})
              for i in range(11)]
    runs = ProcessRuns(starts=[start(ts, why="unhealthy", attempt=n) for n, ts in enumerate((210, 230, 250), 1)])
    restarted = {"gw": tuple(Outcome(f"r{ts}", "restart-process", "acked", ts) for ts in (210.0, 230.0, 250.0))}
    effects, _ = watchdog(Snapshot(tick=1, ts=301.0, vitals={alive.key: alive}, runs={"gw": runs},
                                   history={"health:gw": probes}, outcomes=restarted), proc)
    (told,) = [e for e in effects if e.kind == "notify"]
    assert told.params["title"] == "gw stays unhealthy" and told.params["last_error"] == "connection refused"
    assert "no health probe has passed since" in told.params["message"], told.params
    assert "lengthen its health start_period_s (15 s now)" in told.params["message"], told.params


def test_crash_loop_settings_are_checked_and_named():
    def check(line: str) -> str:
        with pytest.raises(configmod.ConfigError) as err:
            configmod.validate(configmod.decode(f"[[process]]\nname='a'\nmatch='a'\n{line}\n", "config.toml"), "config.toml")
        return str(err.value)
    assert "$.process[0]" in check("max_restarts = 99") and "max_restarts must lie within 0 … 50, got 99" in check("max_restarts = 99")
    assert "$.process[0].restart_backoff: base_s" in check("restart_backoff = { base_s = 5, max_s = 1 }")
    assert "min_uptime_s must be at least 0" in check("min_uptime_s = -1")
    defaults = configmod.Config(process=[Process(name="a", match="a")]).process[0]
    assert (defaults.min_uptime_s, defaults.max_restarts, defaults.restart_window_s, defaults.restart_backoff) == (10, 5, 300, None)


def test_the_fleet_counts_a_frozen_process_as_not_healthy():
    from pulse.core.fleetnames import host_row
    processes = [{"name": "a", "alive": True, "state": "running"}, {"name": "b", "alive": True, "state": "unhealthy"},
                 {"name": "c", "alive": True}]          # c: from a Pulse older than process states
    row = host_row({"processes": processes, "at": 100.0}, 101.0, True)
    assert (row["processes_healthy"], row["processes_total"]) == (2, 3)


# -- a way out of a crash loop (on_crash_loop) ---------------------------------------------------------

WAY_OUT = Process(name="gw", match="gw", restart=["gw"], min_uptime_s=10, max_restarts=3, restart_window_s=300,
                  restart_backoff=Backoff(base_s=1, max_s=8), on_crash_loop=["clear-session"])
HELD = [start(100), start(105), start(112)]
HELD_EXITS = exits((100, 103.0), (105, 108.0), (112, 115.0))


def test_held_fatal_runs_on_crash_loop_once_then_one_more_start_then_holds_again():
    held = ProcessRuns(starts=HELD, exits=HELD_EXITS)
    effects, _ = watchdog(snapshot(116, held, 115.0), WAY_OUT)
    assert [e.kind for e in effects] == ["on-crash-loop", "notify"]
    assert "running its on_crash_loop (clear-session) once" in effects[1].params["message"]
    told = {"process-fatal:gw": 116.0}
    running = ProcessRuns(starts=HELD, exits=HELD_EXITS, way_out_at=116.0)
    assert watchdog(snapshot(117, running, 115.0, notified=told), WAY_OUT)[0] == []        # it runs: wait
    assert "its on_crash_loop runs" in guardview.process_view(snapshot(117, running, 115.0, notified=told),
                                                              WAY_OUT, Survival()).why
    done = ProcessRuns(starts=HELD, exits=HELD_EXITS, way_out_at=116.0, way_out_ended=118.0,
                       way_out_said="exit code 0: cleared")
    effects, _ = watchdog(snapshot(118.1, done, 115.0, notified=told), WAY_OUT)
    assert [(e.kind, e.params["why"], e.params["attempt"]) for e in effects] == [("restart-process", "on-crash-loop", 4)]
    # that start dies too: held again, said again (with what the argv said), and never a second run
    again = ProcessRuns(starts=[*HELD, start(119, why="on-crash-loop")], exits=[*HELD_EXITS, *exits((119, 121.0))],
                        way_out_at=116.0, way_out_ended=118.0, way_out_said="exit code 0: cleared")
    effects, _ = watchdog(snapshot(121.5, again, 121.0, notified=told), WAY_OUT)
    assert [e.kind for e in effects] == ["notify"]
    assert "its on_crash_loop ran (exit code 0: cleared) and the start after it died too" in effects[0].params["message"]
    for now in (125, 5000):                       # held, however long: until an operator starts it
        assert watchdog(snapshot(now, again, 121.0, notified={"process-fatal:gw": 121.6}), WAY_OUT)[0] == []
    # an operator's start, and a new crash loop after it: the way out is tried again
    operator = ProcessRuns(starts=[*again.starts, start(200, origin="operator"), start(205), start(212), start(219)],
                           exits=[*again.exits, *exits((200, 203.0), (205, 208.0), (212, 215.0), (219, 222.0))],
                           operator_at=200, way_out_at=116.0, way_out_ended=118.0)
    effects, _ = watchdog(snapshot(223, operator, 222.0, notified={"process-fatal:gw": 121.6}), WAY_OUT)
    assert [e.kind for e in effects] == ["on-crash-loop", "notify"]


def test_a_start_after_on_crash_loop_that_runs_ends_the_loop_and_a_later_loop_may_use_it_again():
    starts = [*HELD, start(119, why="on-crash-loop"), start(900), start(905)]
    runs = ProcessRuns(starts=starts, exits=[*HELD_EXITS, *exits((119, 800.0), (900, 903.0), (905, 908.0))],
                       way_out_at=116.0, way_out_ended=118.0)
    curr = snapshot(909, runs, 908.0, notified={"process-fatal:gw": 116.0})
    assert processstate.way_out(runs.starts, survival.crash_loop(curr, WAY_OUT, 908.0, LIMITS), 116.0, 118.0, 0.0) \
        == "run"


def test_on_crash_loop_is_checked_and_named():
    def check(body: str) -> str:
        with pytest.raises(configmod.ConfigError) as err:
            configmod.validate(configmod.decode(f"[[process]]\nname='a'\nmatch='a'\n{body}\n", "config.toml"), "config.toml")
        return str(err.value)
    assert "$.process[0].on_crash_loop: an argv list needs at least the program" in check(
        "restart = ['a']\non_crash_loop = []")
    assert "needs a restart argv and max_restarts above 0" in check("on_crash_loop = ['x']")
    assert "needs a restart argv and max_restarts above 0" in check("restart = ['a']\nmax_restarts = 0\non_crash_loop = ['x']")


def test_a_death_its_keeper_recorded_after_the_start_is_answered_without_waiting_for_a_sample():
    from pulse.core.states import EffectState
    from pulse.core.wire.enginerpc import Outcome
    # started (pid 777) and acked at 110; it died at 111; the watcher's last look (105) predates the start
    runs = ProcessRuns(starts=[start(110, pid=777)], exits=[ProcessExit(pid=777, ts=111.0, code=1)])
    acked = {"gw": [Outcome("r", "restart-process", EffectState.ACKED, 110.0)]}
    effects, _ = watchdog(snapshot(111.2, runs, 105.0, outcomes=acked, exits={"gw": runs.exits[-1]}))
    assert [(e.kind, e.params["why"], e.params["attempt"], e.params["pid"]) for e in effects] \
        == [("restart-process", "dead", 2, 777)]
    # a clean exit (a launcher's) or another pid's (the restart's stop of the old copy) is no such death
    for ended in (ProcessExit(pid=777, ts=111.0, code=0), ProcessExit(pid=600, ts=111.0, code=1)):
        assert watchdog(snapshot(111.2, ProcessRuns(starts=runs.starts, exits=[ended]), 105.0, outcomes=acked,
                                 exits={"gw": ended}))[0] == []
    # status says it too, though the watcher's last sample still saw pid 777 alive
    seen_alive = Vital(key="process-alive:gw", ts=110.5, data={"alive": True, "pid": 777, "since": 109.9,
                                                               "looked_at": 110.5})
    curr = Snapshot(tick=1, ts=111.2, vitals={seen_alive.key: seen_alive}, runs={"gw": runs}, outcomes=acked,
                    exits={"gw": runs.exits[-1]})
    view = guardview.process_view(curr, PROC, Survival())
    assert view.state == "starting" and view.why.startswith("dead; being restarted"), view
