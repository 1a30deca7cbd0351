"""The tick and the engine: the onion across processes, and survival that never waits on business."""

from __future__ import annotations

import os
import signal
import textwrap
import time

import msgspec
import psutil
import pytest

from pulse.core.wire import enginerpc, eventmsgs
from pulse.workers.tick import Projections
from support import engine_rule, init_home, wait_for

TICK_MS = 200
DEADLINE_MS = 250
TICKING = {"PULSE_TICK_MS": str(TICK_MS), "PULSE_ENGINE_RPC_DEADLINE_MS": str(DEADLINE_MS),
           "PULSE_HUNG_AFTER_MS": "2000"}


def ticks(pulsed) -> list[dict]:
    return pulsed.ticks()


def max_start_gap(events: list[dict]) -> float:
    starts = [e["data"]["started_mono"] for e in events]
    return max(b - a for a, b in zip(starts, starts[1:]))


def wait_ticks(pulsed, n: int, after: int = 0, timeout: float = 15) -> list[dict]:
    return wait_for(lambda: len(t := [e for e in ticks(pulsed) if e["id"] > after]) >= n and t, timeout,
                    what=f"{n} ticks")


EMIT = """
from pulse.engine.api import Effect

def emit(prev, curr, inner):
    return [Effect(kind="noop", target=f"tick-{curr.tick}", params={"saw": sorted(curr.vitals)})], 300

RULES = [emit]
"""


def test_healthy_engine_is_really_called(pulsed):
    engine_rule(pulsed, "emit", EMIT)
    pulsed.start(env=TICKING)
    wait_ticks(pulsed, 3)
    effects = wait_for(lambda: pulsed.events("effect"), 10, what="an effect from the engine's rule")
    assert effects[0]["data"]["origin"] == "engine" and effects[0]["data"]["kind"] == "noop"
    assert effects[0]["target"].startswith("tick-")
    called = [t for t in ticks(pulsed) if t["data"]["inner"] == "ok"]
    assert called and called[-1]["data"]["tick_ms"] == 300       # the engine's tick_ms is obeyed
    assert not pulsed.events("error")


@pytest.mark.parametrize("misbehaviour, body", [
    ("raising", """
        def boom(prev, curr, inner):
            raise ValueError("business logic bug")
        RULES = [boom]
        """),
    ("looping", """
        def spin(prev, curr, inner):
            while True:
                pass
        RULES = [spin]
        """),
    ("wrong-types", """
        def wrong(prev, curr, inner):
            return "effects", "soon"
        RULES = [wrong]
        """),
    ("unsendable", """
        from pulse.engine.api import Effect
        def odd(prev, curr, inner):
            return [Effect(kind="noop", params={"x": object()})], None
        RULES = [odd]
        """),
    ("megabytes", """
        from pulse.engine.api import Effect
        def flood(prev, curr, inner):
            return [Effect(kind="noop", params={"blob": "x" * 1024 * 1024}) for _ in range(8)], None
        RULES = [flood]
        """),
])
def test_misbehaving_engine_never_stops_the_tick(pulsed, misbehaviour, body):
    engine_rule(pulsed, "bad", body)
    (pulsed.home / "config.toml").write_text("[store]\nerror_repeat_s = 0.5\n")
    pulsed.start(env=TICKING)
    events = wait_ticks(pulsed, 12, timeout=20)
    assert max_start_gap(events) <= (TICK_MS + DEADLINE_MS) / 1000
    assert all(t["data"]["effects"] == 0 for t in events)
    errors = wait_for(lambda: pulsed.events("error"), 10, what="an error event")
    assert errors
    assert not pulsed.events("effect")
    # identical errors coalesce: the first is an event; the repeats are counted, and appended at most
    # once per error_repeat_s as an event with the count since the one before
    if misbehaviour == "raising":
        def run() -> list[dict]:
            return [e for e in pulsed.events("error", "engine") if "business logic bug" in e["data"]["message"]]
        repeat = wait_for(lambda: next((e for e in run() if e["data"]["count"] >= 2), None), 10,
                          what="a coalesced count")
        so_far = [e for e in run() if e["id"] <= repeat["id"]]
        assert so_far[0]["data"]["count"] == 1 and repeat["data"]["first_id"] == so_far[0]["id"]
        assert sum(e["data"]["count"] for e in so_far) == repeat["data"]["total"] > len(so_far)
        assert "ValueError: business logic bug at rules/bad.py:3" in so_far[0]["data"]["message"]


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_tick_keeps_cadence_when_the_engine_is_killed_or_frozen(pulsed, fault):
    engine_rule(pulsed, "emit", EMIT)
    pulsed.start(env=TICKING)
    before = wait_ticks(pulsed, 2)
    engine = pulsed.worker("engine").pid
    os.kill(engine, getattr(signal, fault))
    events = wait_ticks(pulsed, 10, after=before[-1]["id"])
    assert max_start_gap(before[-1:] + events) <= (TICK_MS + DEADLINE_MS) / 1000
    pulsed.wait_replaced("engine", engine, timeout=15)
    # and once the engine is back, it is called again
    wait_for(lambda: [t for t in ticks(pulsed) if t["id"] > events[-1]["id"] and t["data"]["inner"] == "ok"], 10,
             what="the new engine called")


def test_a_sigterm_ends_the_ticks_wait_on_the_engine_and_is_no_error_of_the_engine(pulsed):
    """pulsed stops the engine before the tick: a tick waiting on the engine's answer stops at its
    SIGTERM, not at the RPC deadline (20 s here), and records nothing against the engine."""
    pulsed.start(env={"PULSE_TICK_MS": "100", "PULSE_ENGINE_RPC_DEADLINE_MS": "20000", "PULSE_HUNG_AFTER_MS": "60000"})
    wait_ticks(pulsed, 2)
    engine, tick = pulsed.worker("engine").pid, psutil.Process(pulsed.worker("tick").pid)
    os.kill(engine, signal.SIGSTOP)
    try:
        # ticking every 0.1 s, it is in its wait on the frozen engine once no tick started for a second
        wait_for(lambda: time.monotonic() - ticks(pulsed)[-1]["data"]["started_mono"] > 1.0, 15,
                 what="the tick waiting on the frozen engine")
        tick.send_signal(signal.SIGTERM)
        tick.wait(timeout=10)
        assert not [e for e in pulsed.events("error") if e["target"] == "engine"], pulsed.events("error")
    finally:
        os.kill(engine, signal.SIGCONT)


def test_broken_module_is_an_error_naming_file_and_line_and_the_rest_loads(pulsed):
    engine_rule(pulsed, "a_broken", "x = 1\ndef f(:\n    pass\n")
    engine_rule(pulsed, "b_fails", "import os\nraise RuntimeError('at import')\n")
    engine_rule(pulsed, "emit", EMIT)
    pulsed.start(env=TICKING)
    wait_for(lambda: pulsed.events("effect"), 10, what="the good module's effect")
    messages = {e["target"]: e["data"] for e in pulsed.events("error")}
    assert messages["engine:rules/a_broken.py"]["line"] == 2
    assert "SyntaxError" in messages["engine:rules/a_broken.py"]["message"]
    assert messages["engine:rules/b_fails.py"]["line"] == 2
    assert "RuntimeError: at import" in messages["engine:rules/b_fails.py"]["message"]


def test_engine_watchers_write_vitals_and_wake_the_tick(pulsed):
    init_home(pulsed.home)
    (pulsed.home / "engine" / "watchers" / "queue.py").write_text(textwrap.dedent("""
        from pulse.engine.api import Watcher

        class QueueDepth(Watcher):
            name = "queue-depth"
            key = "engine:queue-depth"
            interval_ms = 100

            def collect(self):
                return {"depth": 42}

            def should_wake(self, window):
                return len(window) == 1      # the first sample rings the tick

        WATCHERS = [QueueDepth()]
    """))
    (pulsed.home / "config.toml").write_text('[log]\nlevel = "debug"\n')
    pulsed.start(env={"PULSE_TICK_MS": "60000", "PULSE_TICK_MS_MAX": "60000"})
    import sqlite3
    def sample():
        conn = sqlite3.connect(f"file:{pulsed.home / 'vitals.db'}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT data FROM vitals WHERE key = 'engine:queue-depth'").fetchone()
        finally:
            conn.close()
    import json
    assert json.loads(wait_for(sample, 10, what="the engine watcher's vital")[0]) == {"depth": 42}
    wait_for(lambda: "woken by engine (engine:queue-depth)" in pulsed.log_text(), 10, what="the tick woken")


def test_a_critical_death_gives_a_frozen_engine_the_short_deadline(pulsed, tracker, tmp_path):
    """The tick the death wakes waits engine_urgent_deadline_ms for the engine, not the usual deadline,
    so survival's restart is not held up by a frozen engine."""
    import subprocess
    argv = ["sleep", "3600.5252"]
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [[process]]
        name = "svc"
        match = "^sleep 3600.5252$"
        restart = ["touch", "{tmp_path / 'restarted'}"]
    """))
    victim = subprocess.Popen(argv, start_new_session=True)
    tracker.add(victim.pid)
    pulsed.start(env={"PULSE_TICK_MS": "60000", "PULSE_TICK_MS_MAX": "60000", "PULSE_ENGINE_RPC_DEADLINE_MS": "2000",
                      "PULSE_ENGINE_URGENT_DEADLINE_MS": "50", "PULSE_HUNG_AFTER_MS": "30000"})
    wait_for(lambda: pulsed.vital("process-alive:svc", lambda d: d["alive"]), 10, what="watched")
    pulsed.wait_running()
    engine = pulsed.worker("engine").pid
    assert pulsed.ctl("emit", "noop", "--wait", "10").returncode == 0    # its outcome wakes a tick ...
    wait_for(lambda: any(t["data"]["inner"] == "ok" for t in pulsed.ticks()), 10, what="... that reaches the engine")
    os.kill(engine, signal.SIGSTOP)
    try:
        victim.kill()
        victim.wait(5)
        wait_for((tmp_path / "restarted").exists, 10, what="the restart run")
        urgent = [t["data"] for t in pulsed.ticks() if t["data"]["effects"]]
        assert urgent and urgent[0]["inner"] == "engine did not answer within 50 ms", urgent
    finally:
        os.kill(engine, signal.SIGCONT)



def test_a_death_the_snapshot_shows_before_its_wake_is_news():
    """A tick already due reads the watcher's sample before the watcher's wake arrives: the snapshot
    alone makes its engine call urgent, once (the next snapshot shows the same death)."""
    from pulse.workers.tick import news_of_a_death

    def snap(alive: bool | None = None, exited: float | None = None) -> enginerpc.Snapshot:
        vitals = {} if alive is None else {"process-alive:svc": enginerpc.Vital("process-alive:svc", 1.0, {"alive": alive})}
        exits = {} if exited is None else {"svc": enginerpc.ProcessExit(pid=7, code=1, ts=exited)}
        return enginerpc.Snapshot(tick=1, ts=2.0, vitals=vitals, exits=exits)
    assert news_of_a_death(snap(True), snap(False))
    assert news_of_a_death(snap(), snap(False))                    # its first sample says dead
    assert not news_of_a_death(snap(False), snap(False))           # the same death: its restart is out
    assert not news_of_a_death(snap(False), snap(True))
    assert not news_of_a_death(None, snap(False))                  # the first tick: no wake to miss
    assert news_of_a_death(snap(True), snap(True, exited=5.0))     # its keeper's exit fact
    assert news_of_a_death(snap(True, exited=5.0), snap(True, exited=9.0))
    assert not news_of_a_death(snap(True, exited=5.0), snap(True, exited=5.0))


def test_a_critical_death_is_decided_at_once_not_tick_ms_min_after_the_last_tick(pulsed, tracker, tmp_path):
    """A death's wake (the watcher's pidfd, the keeper's exit fact) runs the tick at once: tick_ms_min
    paces the other wakes, and a death comes once (one that keeps coming is paced by its backoff)."""
    import subprocess
    import time
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [[process]]
        name = "svc"
        match = "^sleep 3600.6161$"
        restart = ["touch", "{tmp_path / 'restarted'}"]
    """))
    victim = subprocess.Popen(["sleep", "3600.6161"], start_new_session=True)
    tracker.add(victim.pid)
    pulsed.start(env={"PULSE_TICK_MS": "60000", "PULSE_TICK_MS_MAX": "60000", "PULSE_TICK_MS_MIN": "40000"})
    wait_for(lambda: pulsed.vital("process-alive:svc", lambda d: d["alive"]), 10, what="watched")
    wait_for(pulsed.ticks, 10, what="the tick that runs at the start")
    killed_at = time.time()
    victim.kill()
    victim.wait(5)
    decided = wait_for(lambda: [t for t in pulsed.ticks() if t["ts"] > killed_at and t["data"]["effects"]], 30,
                       what="the tick that restarts it")[0]
    before = [t for t in pulsed.ticks() if t["id"] < decided["id"]][-1]
    assert decided["data"]["started_mono"] - before["data"]["started_mono"] < 40
    assert [e["data"]["kind"] for e in pulsed.events("effect", "svc")] == ["restart-process"]


# -- the projections the snapshot carries, folded from events (pure: no daemon) --------------------------

def committed(id: int, kind: str, origin: str = "survival", target: str = "gw", **params) -> eventmsgs.Event:
    effect = enginerpc.Effect(kind=kind, target=target, origin=origin, id=f"e{id}", params=params)
    return eventmsgs.Event(type="effect", source="tick", target=target, data=msgspec.to_builtins(effect), ts=1.0, id=id)


def ended(id: int, state: str) -> eventmsgs.Event:
    return eventmsgs.Event(type=f"effect-{state}", source="executor", target="gw", data={"effect_id": f"e{id}"}, ts=2.0,
                      id=100 + id)


def folded(*events: eventmsgs.Event) -> Projections:
    p = Projections()
    p.fold(list(events))
    return p


def test_panic_rollback_counts_failed_repairs_of_the_host_only():
    # survival's restart and cleanup not working: the streak panicRollback answers
    p = folded(committed(1, "restart-process"), ended(1, "failed"), committed(2, "cleanup"), ended(2, "expired"))
    assert p.corrective_streak == 2
    # its own answer failing (a rollback, a repair of the engine) must not ask for another; nor do a
    # notification, or the engine's and an agent's effects, whatever their kind
    p.fold([committed(3, "engine-rollback", target="engine"), ended(3, "failed"),
            committed(4, "notify"), ended(4, "failed"),
            committed(5, "restart-process", origin="engine"), ended(5, "failed"),
            committed(6, "exec", origin="agent"), ended(6, "failed")])
    assert p.corrective_streak == 2
    p.fold([committed(7, "archive"), ended(7, "acked")])   # a repair that worked ends the streak
    assert p.corrective_streak == 0


def test_the_snapshot_remembers_when_each_rule_last_told_a_person():
    p = folded(committed(1, "notify", rule="process-watchdog"), committed(2, "report", target="day", rule="daily"),
               committed(3, "restart-process", target="db", rule="process-watchdog"), committed(4, "notify", target="x"))
    assert p.notified == {"process-watchdog:gw": 1.0, "daily:day": 1.0}


def test_the_snapshot_carries_a_memory_ceilings_whole_window(tmp_path):
    """A counted key brings its last HISTORY_SAMPLES samples; a trend window brings every sample of it
    when they are more (at most MAX_MEMORY_WINDOW_SAMPLES, the newest), never fewer than the last few."""
    from pulse.core.config import MAX_MEMORY_WINDOW_SAMPLES
    from pulse.store import vitalsdb
    from pulse.workers.tick import HISTORY_SAMPLES, read_history
    conn = vitalsdb.open_vitals(tmp_path / "vitals.db")
    key = "process-memory:gw"
    vitalsdb.append_vitals(conn, [enginerpc.Vital(key, 1000.0 + i, {"rss_mb": i}) for i in range(1000)])
    vitalsdb.append_vitals(conn, [enginerpc.Vital("health:gw", 1000.0 + i, {"ok": True}) for i in range(50)])
    now = 2000.0                                              # the newest sample is at 1999
    history = read_history(conn, ["health:gw", key], {key: 600}, now)
    assert len(history["health:gw"]) == HISTORY_SAMPLES
    assert [v.ts for v in history[key]] == [1000.0 + i for i in range(400, 1000)]     # the last 600 s
    assert len(read_history(conn, [key], {key: 5}, now)[key]) == HISTORY_SAMPLES      # a short window: the last few
    longest = read_history(conn, [key], {key: 3600}, now)[key]
    assert len(longest) == MAX_MEMORY_WINDOW_SAMPLES and longest[-1].ts == 1999.0
    conn.close()
