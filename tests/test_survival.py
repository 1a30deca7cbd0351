"""The survival rules as pure functions of snapshots (their end-to-end tests start real processes
elsewhere). Memory is in the snapshot, so these are the cases a killed tick must also get right."""

from __future__ import annotations

import asyncio
import re

import pytest

from pulse.core import config as configmod
from pulse.core.wire.enginerpc import Effect, EngineHealth, Lifecycle, Outcome, ProcessExit, Snapshot, Vital
from pulse.rules import onion, survival

CONFIG = configmod.validate(configmod.decode(b"""
[[process]]
name = "gw"
match = "gw"
restart = ["true"]

[[process]]
name = "model"
match = "model-proxy"
restart = ["model-proxy", "--port", "4000"]

[[watch.network]]
name = "api"
url = "http://127.0.0.1:1/"

[[watch.network]]
name = "model"
url = "http://127.0.0.1:2/health"

[[watch.error_log]]
name = "app"
path = "/tmp/app.log"

[survival]
archive_from = "/tmp/sessions"
archive_to = "/tmp/archive"
[survival.llm]
target = "model"
process = "model"
""", "test"), "test")


def run(rule, curr: Snapshot, prev: Snapshot | None = None, inner=onion.nothing, cfg=CONFIG):
    return asyncio.run(onion.compose([rule(cfg)], inner)(prev, curr))


def kinds(effects):
    return [(e.kind, e.target) for e in effects]


def snap(**fields) -> Snapshot:
    return Snapshot(tick=1, ts=fields.pop("ts", 1000.0), **fields)


def business(*effects):
    async def inner(prev, curr):
        return list(effects), None
    return inner


PROMOTED = Lifecycle(promote_id=7, promote_ts=900.0, before="aaa", after="bbb", last_known_good="aaa")


def test_panic_rollback_fires_once_per_promote_and_bypasses_business():
    called = []

    async def inner(prev, curr):
        called.append(1)
        return [Effect(kind="noop")], None
    life = \
        Lifecycle(promote_id=7, promote_ts=900.0, before="aaa", after="bbb", last_known_good="aaa", corrective_streak=3)
    effects, _ = run(survival.panic_rollback, snap(lifecycle=life), inner=inner)
    assert kinds(effects) == [("engine-rollback", "engine"), ("notify", "engine")]
    assert effects[0].params["to"] == "aaa" and not called
    # already rolled back since this promote, or one pending: the business chain runs again
    done = Lifecycle(promote_id=7, promote_ts=900.0, before="aaa", after="bbb", last_known_good="aaa",
                     corrective_streak=5, rolled_back=True)
    assert kinds(run(survival.panic_rollback, snap(lifecycle=done), inner=inner)[0]) == [("noop", None)]
    # the engine is the last known good: nothing to roll back to
    same = Lifecycle(promote_id=7, promote_ts=900.0, before="aaa", after="bbb", last_known_good="bbb",
                     corrective_streak=5)
    assert kinds(run(survival.panic_rollback, snap(lifecycle=same), inner=inner)[0]) == [("noop", None)]


def test_auto_rollback_within_the_window_only():
    errors = snap(lifecycle=PROMOTED, engine=EngineHealth("running", errors=5))
    effects, _ = run(survival.auto_rollback, errors)
    assert kinds(effects) == [("engine-rollback", "engine"), ("notify", "engine")] and effects[0].params["to"] == "aaa"
    crashes = snap(lifecycle=Lifecycle(promote_id=7, promote_ts=900.0, before="aaa", after="bbb", crashes=3))
    assert kinds(run(survival.auto_rollback, crashes)[0])[0] == ("engine-rollback", "engine")
    late = snap(ts=900.0 + 601, lifecycle=PROMOTED, engine=EngineHealth("running", errors=50))
    assert run(survival.auto_rollback, late) == ([], None)
    fine = snap(lifecycle=PROMOTED, engine=EngineHealth("running", errors=4))
    assert run(survival.auto_rollback, fine) == ([], None)


def test_process_watchdog_leaves_a_paused_process_alone():
    dead = {"process-alive:gw": Vital("process-alive:gw", 999.0, {"alive": False})}
    assert kinds(run(survival.process_watchdog, snap(vitals=dead))[0]) == [("restart-process", "gw")]
    assert run(survival.process_watchdog, snap(vitals=dead, paused={"gw": 2000.0})) == ([], None)


@pytest.mark.parametrize("rule, curr, kind, target", [
    (survival.process_watchdog, snap(vitals={"process-alive:gw": Vital("process-alive:gw", 999.0, {"alive": False})}),
     "restart-process", "gw"),
    (survival.resource_guard, snap(vitals={"system-resource": Vital("system-resource", 999.0, {"disk_pct": 95})}),
     "cleanup", "disk"),
    (survival.network_watchdog, snap(vitals={"network:api": Vital("network:api", 999.0, {"ok": False})}),
     "notify", "api:down"),
    (survival.error_escalate, snap(history={"error-log:app": [Vital("error-log:app", 999.0, {"matches": 2})]}),
     "notify", "app"),
])
def test_decorating_rules_act_after_inner_and_only_where_it_did_not(rule, curr, kind, target):
    effects, _ = run(rule, curr)
    assert (kind, target) in kinds(effects)
    mine = Effect(kind=kind, target=target, origin="engine")
    effects, _ = run(rule, curr, inner=business(mine))
    assert [e for e in effects if (e.kind, e.target) == (kind, target)] == [mine]


def test_resource_guard_archives_cleans_and_cools_down():
    full = {"system-resource": Vital("system-resource", 999.0, {"memory_pct": 95, "disk_pct": 10})}
    effects, _ = run(survival.resource_guard, snap(vitals=full))
    assert kinds(effects) == [("archive", "memory"), ("cleanup", "memory")]
    assert effects[0].params == {"from": "/tmp/sessions", "to": "/tmp/archive", "older_than_h": 72}
    recent = {"memory": [Outcome("x", "cleanup", "acked", 900.0)]}
    assert run(survival.resource_guard, snap(vitals=full, outcomes=recent)) == ([], None)


def test_network_watchdog_notifies_once_down_and_once_up():
    down = {"network:api": Vital("network:api", 999.0, {"ok": False, "error": "refused"})}
    up = {"network:api": Vital("network:api", 999.0, {"ok": True})}
    assert kinds(run(survival.network_watchdog, snap(vitals=down))[0]) == [("notify", "api:down")]
    said_down = {"network-watchdog:api:down": 990.0}
    assert run(survival.network_watchdog, snap(vitals=down, notified=said_down)) == ([], None)
    assert kinds(run(survival.network_watchdog, snap(vitals=up, notified=said_down))[0]) == [("notify", "api:up")]
    both = {"network-watchdog:api:down": 990.0, "network-watchdog:api:up": 995.0}
    assert run(survival.network_watchdog, snap(vitals=up, notified=both)) == ([], None)
    # the LLM endpoint is llmWatchdog's, not networkWatchdog's
    model_down = {"network:model": Vital("network:model", 999.0, {"ok": False})}
    assert run(survival.network_watchdog, snap(vitals=model_down)) == ([], None)


def test_error_escalate_shortens_the_tick_and_rate_limits():
    # the errors are in a sample the tick did not see as the latest: a quiet one came after it
    errs = {"error-log:app": [Vital("error-log:app", 998.0, {"matches": 3, "lines": ["ERROR x"]}),
                              Vital("error-log:app", 999.0, {"matches": 0, "lines": []})]}
    effects, tick_ms = run(survival.error_escalate, snap(history=errs), prev=snap(ts=990.0))
    assert kinds(effects) == [("notify", "app")] and tick_ms == 1000
    assert effects[0].params["message"] == "3 matching lines" and effects[0].params["lines"] == ["ERROR x"]
    effects, tick_ms = run(survival.error_escalate, snap(history=errs, notified={"error-escalate:app": 950.0}),
                           prev=snap(ts=990.0))
    assert effects == [] and tick_ms == 1000
    assert run(survival.error_escalate, snap(history=errs), prev=snap(ts=999.5)) == ([], None)   # nothing new


def test_llm_watchdog_restarts_then_notifies():
    def samples(*oks):
        return {"network:model": [Vital("network:model", 990.0 + i, {"ok": ok}) for i, ok in enumerate(oks)]}
    assert run(survival.llm_watchdog, snap(history=samples(True, False, False))) == ([], None)
    effects, _ = run(survival.llm_watchdog, snap(history=samples(True, False, False, False)))
    # the [[process]] that serves it is restarted as processWatchdog restarts one: stop, then start
    assert kinds(effects) == [("restart-process", "model")] and effects[0].params["why"] == "endpoint-down"
    restarted = {"model": [Outcome("r", "restart-process", "acked", 993.5)]}
    effects, _ = run(survival.llm_watchdog, snap(history=samples(True, False, False, False, False),
                                                 outcomes=restarted))
    assert kinds(effects) == [("notify", "model")]


def test_engine_failed_is_notified_once():
    failed = snap(engine=EngineHealth("failed", restarts=6, failed_at=990.0))
    assert kinds(run(survival.engine_failed_notice, failed)[0]) == [("notify", "engine")]
    told = snap(engine=EngineHealth("failed", restarts=6, failed_at=990.0), notified={"engine-failed:engine": 991.0})
    assert run(survival.engine_failed_notice, told) == ([], None)


def test_an_escalation_is_notified_once_by_the_next_pulsed():
    escalated = snap(escalated=900.0, escalation="tick restart intensity reached")
    effects, _ = run(survival.escalation_notice, escalated)
    assert kinds(effects) == [("notify", "pulse")] and "tick restart intensity" in effects[0].params["message"]
    told = snap(escalated=900.0, escalation="x", notified={"escalation:pulse": 950.0})
    assert run(survival.escalation_notice, told) == ([], None)
    assert run(survival.escalation_notice, snap()) == ([], None)


def test_llm_watchdog_restarts_again_after_fail_after_new_failures_backing_off():
    def samples(*oks):
        return {"network:model": [Vital("network:model", 990.0 + i, {"ok": ok}) for i, ok in enumerate(oks)]}
    restarted = {"model": [Outcome("r", "restart-process", "acked", 993.5)]}
    told = {"llm-watchdog:model": 994.5}
    # three failures after the restart: again, once the backoff (1 s after one unhelped restart) is over
    effects, _ = run(survival.llm_watchdog, snap(ts=997.5, history=samples(True, False, False, False, False, False,
                                                                            False), outcomes=restarted, notified=told))
    assert kinds(effects) == [("restart-process", "model")]
    effects, tick_ms = run(survival.llm_watchdog, snap(ts=994.2, history=samples(True, False, False, False, False,
                                                                                  False, False),
                                                       outcomes=restarted, notified=told))
    assert effects == [] and 0 < tick_ms <= 301              # backing off: again at 994.5


def test_process_watchdog_restarts_an_unhealthy_process_after_failures_probes():
    cfg = configmod.validate(configmod.decode(
        '[[process]]\nname = "gw"\nmatch = "gw"\nrestart = ["true"]\n'
        'health = { url = "http://127.0.0.1:1/readyz", failures = 3 }\n', "test"), "test")
    alive = {"process-alive:gw": Vital("process-alive:gw", 999.0, {"alive": True, "pid": 5})}

    def probes(*oks, start=990.0):
        return {"health:gw": [Vital("health:gw", start + i, {"ok": ok}) for i, ok in enumerate(oks)]}
    assert run(survival.process_watchdog, snap(vitals=alive, history=probes(True, False, False)), cfg=cfg)[0] == []
    effects, _ = run(survival.process_watchdog, snap(vitals=alive, history=probes(True, False, False, False)), cfg=cfg)
    assert kinds(effects) == [("restart-process", "gw")] and effects[0].params["why"] == "unhealthy"
    # a restart starts the count again
    after = {"gw": [Outcome("r", "restart-process", "acked", 993.5)]}
    assert run(survival.process_watchdog, snap(vitals=alive, history=probes(True, False, False, False, False, False),
                                               outcomes=after), cfg=cfg)[0] == []


HERMES = configmod.validate(configmod.decode(
    b'[[process]]\nname = "hermes"\nmatch = "hermes gateway"\nrestart = ["hermes", "gateway", "run"]\n'
    b'restart_exit_codes = [75]\nstop_exit_codes = [78]\n'
    b'health = { url = "http://127.0.0.1:1/health", failures = 2, start_period_s = 10 }\n', "test"), "test")


def dead(ts: float, last_pid: int | None = 41) -> dict:
    return {"process-alive:hermes": Vital("process-alive:hermes", ts, {"alive": False, "pid": None,
                                                                       "dead_since": ts, "last_pid": last_pid})}


def test_process_watchdog_decides_from_the_recorded_exit():
    """75 asks for a restart (why exit-code), 78 asks to be left down (said once), anything else is a crash."""
    asked = run(survival.process_watchdog, snap(vitals=dead(999.0), exits={"hermes": ProcessExit(41, 999.0, 75)}),
                cfg=HERMES)[0]
    assert kinds(asked) == [("restart-process", "hermes")]
    assert asked[0].params == {"why": "exit-code", "code": 75, "pid": 41}
    crashed = run(survival.process_watchdog, snap(vitals=dead(999.0),
                                                  exits={"hermes": ProcessExit(41, 999.0, None, "SIGKILL")}), cfg=HERMES)[0]
    assert crashed[0].params == {"why": "dead", "attempt": 1, "signal": "SIGKILL", "pid": 41}
    fatal = snap(vitals=dead(999.0), exits={"hermes": ProcessExit(41, 999.0, 78, tail="bad config: no token")})
    told = run(survival.process_watchdog, fatal, cfg=HERMES)[0]
    assert kinds(told) == [("notify", "hermes")] and "stop_exit_codes" in told[0].params["message"]
    assert told[0].params["last_error"] == "bad config: no token"
    fatal.notified["process-watchdog:hermes"] = 999.5
    assert run(survival.process_watchdog, fatal, cfg=HERMES) == ([], None)      # said once, left down


def test_process_watchdog_waits_briefly_for_the_exit_fact_of_a_process_whose_codes_matter():
    waiting, tick_ms = run(survival.process_watchdog, snap(ts=999.5, vitals=dead(999.0)), cfg=HERMES)
    assert waiting == [] and 0 < tick_ms <= 1501
    # an exit of another pid is not this death's
    other = snap(ts=999.5, vitals=dead(999.0), exits={"hermes": ProcessExit(7, 998.0, 75)})
    assert run(survival.process_watchdog, other, cfg=HERMES)[0] == []
    # no fact within the wait (not started by Pulse, or its keeper died too): a crash
    late = run(survival.process_watchdog, snap(ts=1001.1, vitals=dead(999.0)), cfg=HERMES)[0]
    assert late[0].params == {"why": "dead", "attempt": 1}
    # a process whose exit codes do not matter is restarted at once
    plain = run(survival.process_watchdog, snap(ts=999.01, vitals={"process-alive:gw": Vital(
        "process-alive:gw", 999.0, {"alive": False, "dead_since": 999.0})}))[0]
    assert kinds(plain) == [("restart-process", "gw")]


def test_a_death_looked_for_before_a_restart_was_acked_is_not_news_however_late_its_sample():
    """The watcher stamps a sample when its collect returns; on a loaded host the scans that found
    nothing began before the gate's restart started the process and ended after it was acked. That
    sample (ts after the ack) drove a second restart-process (test_mcp's two-agent race, under load)."""
    acked = {"gw": [Outcome("r", "restart-process", "acked", 1000.0)]}

    def dead_gw(ts: float, looked: float | None) -> dict:
        data = {"alive": False, "pid": None, "dead_since": looked or ts, "last_pid": 41}
        return {"process-alive:gw": Vital("process-alive:gw", ts, data if looked is None else {**data, "looked_at": looked})}
    assert run(survival.process_watchdog, snap(ts=1001.0, vitals=dead_gw(1000.8, 999.2), outcomes=acked))[0] == []
    # a look that began after the ack: a new death
    again = run(survival.process_watchdog, snap(ts=1001.0, vitals=dead_gw(1000.8, 1000.2), outcomes=acked))[0]
    assert kinds(again) == [("restart-process", "gw")]
    # a sample without looked_at (an older watcher) is judged by its ts, as before
    assert kinds(run(survival.process_watchdog, snap(ts=1001.0, vitals=dead_gw(1000.8, None), outcomes=acked))[0]) \
        == [("restart-process", "gw")]


def test_process_alive_says_when_its_look_began():
    import time

    from pulse.sensing.builtin import ProcessAlive
    before = time.time()
    watcher = ProcessAlive(configmod.Process(name="nobody", match="^no such process 8f3e1c$", restart=["true"]), 1000)
    data = watcher.collect()
    assert data["alive"] is False and before <= data["looked_at"] <= time.time()
    assert data["dead_since"] == data["looked_at"]


def test_failed_probes_within_the_start_period_do_not_count():
    alive = {"process-alive:hermes": Vital("process-alive:hermes", 999.0, {"alive": True, "pid": 5, "since": 990.0})}
    probes = {"health:hermes": [Vital("health:hermes", ts, {"ok": False}) for ts in (995.0, 998.0, 999.0)]}
    assert run(survival.process_watchdog, snap(vitals=alive, history=probes), cfg=HERMES)[0] == []
    probes["health:hermes"].append(Vital("health:hermes", 1000.5, {"ok": False}))
    assert run(survival.process_watchdog, snap(ts=1000.6, vitals=alive, history=probes), cfg=HERMES)[0] == []
    probes["health:hermes"].append(Vital("health:hermes", 1001.0, {"ok": False}))
    effects = run(survival.process_watchdog, snap(ts=1001.1, vitals=alive, history=probes), cfg=HERMES)[0]
    assert kinds(effects) == [("restart-process", "hermes")] and effects[0].params["why"] == "unhealthy"


def test_a_passing_probe_ends_the_start_period_so_a_freeze_after_it_counts_at_once():
    """As Docker's start period: ready once (at 993), then failing, it is restarted after `failures`
    probes, not given the rest of its 10 s; the status and the watchdog agree it is unhealthy."""
    alive = {"process-alive:hermes": Vital("process-alive:hermes", 999.0, {"alive": True, "pid": 5, "since": 990.0})}
    probes = {"health:hermes": [Vital("health:hermes", 992.0, {"ok": False}), Vital("health:hermes", 993.0, {"ok": True}),
                                Vital("health:hermes", 994.0, {"ok": False})]}
    assert run(survival.process_watchdog, snap(ts=994.1, vitals=alive, history=probes), cfg=HERMES)[0] == []
    probes["health:hermes"].append(Vital("health:hermes", 995.0, {"ok": False}))
    effects = run(survival.process_watchdog, snap(ts=995.1, vitals=alive, history=probes), cfg=HERMES)[0]
    assert kinds(effects) == [("restart-process", "hermes")] and effects[0].params["why"] == "unhealthy"
    assert survival.counted_probes(probes["health:hermes"], 0.0, alive["process-alive:hermes"], 10.0) \
        == probes["health:hermes"][2:]
    # Restarted at 993.5, its sample not yet the new copy's: the pass at 993 was the old copy's.
    assert survival.counted_probes(probes["health:hermes"], 993.5, alive["process-alive:hermes"], 10.0) == []


# -- memory ceilings ([[process]] memory) ---------------------------------------------------------------

LEAKY = configmod.validate(configmod.decode(
    b'[[process]]\nname = "gw"\nmatch = "gw"\nrestart = ["true"]\n'
    b'memory = { max_mb = 100, for_samples = 3, growth_mb_per_h = 360, growth_window_s = 60 }\n', "test"), "test")
ALIVE = {"process-alive:gw": Vital("process-alive:gw", 999.0, {"alive": True, "pid": 41})}


def rss(*figures, start=1000.0, every=1.0, pid=41, since=900.0) -> list[Vital]:
    """Memory samples of process-memory:gw, `every` seconds apart from `start`."""
    return [Vital("process-memory:gw", start + i * every, {"pid": pid, "since": since, "rss_mb": mb})
            for i, mb in enumerate(figures)]


def memory_snap(samples: list[Vital], **fields) -> Snapshot:
    return snap(ts=fields.pop("ts", samples[-1].ts + 0.1), vitals=ALIVE, history={"process-memory:gw": samples}, **fields)


def test_a_process_over_its_ceiling_for_samples_in_a_row_is_restarted_with_the_figures():
    assert run(survival.process_watchdog, memory_snap(rss(90, 120, 130)), cfg=LEAKY)[0] == []        # two above
    assert run(survival.process_watchdog, memory_snap(rss(120, 130, 95, 120, 130)), cfg=LEAKY)[0] == []   # not in a row
    assert run(survival.process_watchdog, memory_snap(rss(90, 100, 100, 100)), cfg=LEAKY)[0] == []   # at is not above
    effects, _ = run(survival.process_watchdog, memory_snap(rss(90, 120, 130, 140.5)), cfg=LEAKY)
    assert kinds(effects) == [("restart-process", "gw")]
    params = effects[0].params
    assert {k: params[k] for k in ("why", "rss_mb", "max_mb", "samples", "pid")} == {
        "why": "memory", "rss_mb": 140.5, "max_mb": 100, "samples": 3, "pid": 41}
    assert "140.5 MB" in params["reason"] and "max_mb 100" in params["reason"] and "3 samples" in params["reason"]


def test_only_samples_of_the_process_as_it_runs_now_count_toward_the_ceiling():
    # samples before the last restart's outcome were of what it replaced
    restarted = {"gw": [Outcome("r", "restart-process", "acked", 1001.5)]}
    assert run(survival.process_watchdog, memory_snap(rss(120, 130, 140, 150), outcomes=restarted), cfg=LEAKY)[0] == []
    # nor do another pid's, nor a sample that measured nothing (the pid was gone)
    mixed = rss(120, 130, pid=7) + rss(140, 150, start=1002.0) + [Vital("process-memory:gw", 1004.0,
                                                                         {"pid": 41, "rss_mb": None, "reason": "gone"})]
    assert run(survival.process_watchdog, memory_snap(mixed), cfg=LEAKY)[0] == []
    mixed.append(rss(160, start=1005.0)[0])
    assert kinds(run(survival.process_watchdog, memory_snap(mixed), cfg=LEAKY)[0]) == [("restart-process", "gw")]
    # a restart already pending, or a paused process: nothing
    pending = [Effect(kind="restart-process", target="gw", id="x")]
    assert run(survival.process_watchdog, memory_snap(mixed, pending=pending), cfg=LEAKY)[0] == []
    assert run(survival.process_watchdog, memory_snap(mixed, paused={"gw": 9e9}), cfg=LEAKY)[0] == []


def test_memory_restarts_that_do_not_help_back_off_and_are_notified():
    """Three restarts, and every copy climbed above the ceiling again without a sample below it."""
    samples = (rss(150, 150, 150, start=990.0, pid=1) + rss(150, 150, 150, start=1001.0, pid=2)
               + rss(150, 150, 150, start=1011.0, pid=3) + rss(150, 150, 150, start=1021.0, pid=4))
    outcomes = {"gw": [Outcome(f"r{i}", "restart-process", "acked", ts) for i, ts in enumerate((1000.0, 1010.0, 1020.0))]}
    effects, tick_ms = run(survival.process_watchdog, memory_snap(samples, outcomes=outcomes), cfg=LEAKY)
    assert kinds(effects) == [("notify", "gw")] and effects[0].params["title"] == "gw stays over its memory ceiling"
    assert "above max_mb 100" in effects[0].params["last_error"]
    assert 0 < tick_ms <= 2001                                   # the fourth waits backoff(3) = 4 s after the third
    later = run(survival.process_watchdog, memory_snap(samples, outcomes=outcomes, ts=1024.5,
                                                       notified={"process-watchdog:gw": 1023.2}), cfg=LEAKY)[0]
    assert kinds(later) == [("restart-process", "gw")]
    # a copy that was once below the ceiling was helped: no backoff
    helped = samples[:-3] + rss(80, 150, 150, 150, start=1021.0, pid=4)
    assert kinds(run(survival.process_watchdog, memory_snap(helped, outcomes=outcomes), cfg=LEAKY)[0]) == [
        ("restart-process", "gw")]


def climbing(mb_per_s: float, seconds: int, start=1000.0, base=50.0, **kw) -> list[Vital]:
    return rss(*[base + mb_per_s * i for i in range(seconds + 1)], start=start, **kw)


def test_growth_faster_than_growth_mb_per_h_is_notified_with_the_slope_before_the_ceiling():
    samples = climbing(0.2, 50)                                  # 720 MB/h over 50 s: 3/4 of the 60 s window is 45
    effects, _ = run(survival.process_watchdog, memory_snap(samples), cfg=LEAKY)
    assert kinds(effects) == [("notify", "gw")]
    note = effects[0].params
    assert note["rule"] == "process-memory" and note["growth_mb_per_h"] == pytest.approx(720, abs=0.5)
    assert note["rss_mb"] == 60 and note["max_mb"] == 100
    assert "720 MB/h" in note["message"] and "reaches max_mb 100 in 3 min" in note["message"]
    # not yet a trend: too short a span (a process's start-up climb), or too few samples
    assert run(survival.process_watchdog, memory_snap(climbing(0.2, 40)), cfg=LEAKY)[0] == []
    assert run(survival.process_watchdog, memory_snap(climbing(2, 3, every=20)), cfg=LEAKY)[0] == []
    # slower than the threshold, or flat with noise
    assert run(survival.process_watchdog, memory_snap(climbing(0.09, 50)), cfg=LEAKY)[0] == []
    noisy = rss(*[50 + (5 if i % 2 else -5) for i in range(51)])
    assert run(survival.process_watchdog, memory_snap(noisy), cfg=LEAKY)[0] == []


def test_growth_is_notified_once_per_process_and_at_most_every_notify_every_s():
    told = {"process-memory:gw": 1040.0}                          # this pid (started at 900) was told already
    assert run(survival.process_watchdog, memory_snap(climbing(0.2, 50), notified=told), cfg=LEAKY)[0] == []
    # a new copy that grows again is told, once notify_every_s (300 s) has passed since the last notice
    again = climbing(0.2, 50, start=1250.0, pid=42, since=1240.0)
    assert run(survival.process_watchdog, memory_snap(again, notified=told), cfg=LEAKY)[0] == []
    later = climbing(0.2, 50, start=1400.0, pid=42, since=1240.0)
    assert kinds(run(survival.process_watchdog, memory_snap(later, notified=told), cfg=LEAKY)[0]) == [("notify", "gw")]


def test_a_memory_ceiling_is_configured_with_every_default_and_checked():
    process = configmod.decode(b'[[process]]\nname = "gw"\nmatch = "gw"\nrestart = ["true"]\nmemory = {}\n',
                               "test").process[0]
    assert (process.memory.max_mb, process.memory.for_samples, process.memory.growth_mb_per_h,
            process.memory.growth_window_s) == (4096, 3, 500, 600)
    assert configmod.decode(b'[[process]]\nname = "gw"\nmatch = "gw"\n', "test").process[0].memory is None
    for table, says in (("max_mb = 0", "memory.max_mb must be greater than 0"),
                        ("for_samples = 0", "memory.for_samples must lie within 1"),
                        ("growth_mb_per_h = -1", "memory.growth_mb_per_h must be at least 0"),
                        ("growth_window_s = 0", "memory.growth_window_s must be greater than 0"),
                        ("max_mb = \"4G\"", "$.process[0].memory.max_mb")):
        text = f'[[process]]\nname = "gw"\nmatch = "gw"\nrestart = ["true"]\nmemory = {{ {table} }}\n'
        with pytest.raises(configmod.ConfigError, match=re.escape(says)):
            configmod.validate(configmod.decode(text, "test"), "test")
    with pytest.raises(configmod.ConfigError, match=r"\$\.process\[0\]\.memory: a memory ceiling restarts the process"):
        configmod.validate(configmod.decode(b'[[process]]\nname = "gw"\nmatch = "gw"\nmemory = {}\n', "test"), "test")


def test_the_tick_carries_a_memory_window_for_each_ceiling():
    tick = configmod.slice_of(LEAKY, "tick")
    assert survival.trend_windows(tick) == {"process-memory:gw": 60}
    assert "process-memory:gw" in survival.counted_keys(tick)
    assert survival.trend_windows(configmod.slice_of(CONFIG, "tick")) == {}
