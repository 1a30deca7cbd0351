"""A long history (40 MiB of a busy host's events, grown once per session: the long_history fixture).

The tick's first fold of it, without a checkpoint, reads every event in the main loop, batch by
batch; on a busy 2-core machine that outlasts hung_after_ms, so it heartbeats between batches and is
not killed as hung, restarted to fold again and killed again until pulsed gives up.

Once it has a checkpoint, a killed tick's replacement folds only what came after it: the tick and a
critical process killed together, the restart is committed as fast as on a young home.
Real pulsed, FAST timings, real SQLite."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import textwrap
import time

import psutil

from support import copy_home, wait_for

# The bound at 1 GiB is 100 ms median on an idle machine; a test shares two cores with the
# rest of the suite, so it allows ten times that. The old code folded the whole history here.
RESTART_COMMITTED_S = 1.0
CRITICAL = ["sleep", "3600.6262"]


def test_the_tick_folds_a_long_history_without_being_taken_for_hung(pulsed, long_history):
    copy_home(long_history, pulsed.home)
    # hung after 0.5 s (the shortest config allows over a 0.3 s busy timeout): folding 40 MiB takes longer
    pulsed.start(env={"PULSE_HUNG_AFTER_MS": "500", "PULSE_SQLITE_BUSY_TIMEOUT_MS": "300"})
    pulsed.wait_ticks(3, timeout=90)          # it folded the whole history and ticked since
    tick = pulsed.worker("tick")
    assert tick.state == "running" and tick.restarts == 0, tick
    assert "silent for" not in pulsed.log_text()


def first_mono(home, sql: str, args: tuple) -> float | None:
    """The mono of the first event that `sql` (a WHERE clause) finds."""
    conn = sqlite3.connect(f"file:{home / 'events.db'}?mode=ro", uri=True, timeout=5)
    try:
        row = conn.execute(f"SELECT mono FROM events WHERE {sql} ORDER BY id LIMIT 1", args).fetchone()
        return row[0] if row else None
    finally:
        conn.close()


def test_a_tick_killed_with_a_critical_process_restarts_it_from_its_checkpoint(pulsed, long_history, tracker):
    copy_home(long_history, pulsed.home)
    with open(pulsed.home / "config.toml", "a") as f:
        f.write(textwrap.dedent(f"""
            [[process]]
            name = "crit"
            match = "^sleep 3600[.]6262$"
            restart = {json.dumps(CRITICAL)}
        """))
    victim = psutil.Popen(CRITICAL, start_new_session=True)
    tracker.add(victim.pid)
    pulsed.start(env={"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "100"})
    pulsed.wait_ticks(3, timeout=90)          # its first fold is done (and, since, its checkpoint written)
    wait_for(lambda: pulsed.vital("process-alive:crit", lambda d: d["alive"]), 30, what="the process watched")
    n = len(pulsed.ticks())
    wait_for(lambda: len(pulsed.ticks()) >= n + 2, 30, what="two more ticks")
    old_tick = pulsed.worker("tick").pid
    conn = sqlite3.connect(pulsed.home / "events.db")
    after = conn.execute("SELECT MAX(id) FROM events").fetchone()[0]
    conn.close()
    started = time.monotonic()              # CLOCK_MONOTONIC: the events' mono is the same clock
    os.kill(old_tick, signal.SIGKILL)
    os.kill(victim.pid, signal.SIGKILL)
    committed = wait_for(lambda: first_mono(pulsed.home, "id > ? AND type = 'effect' AND target = 'crit' AND "
                                            "json_extract(data, '$.kind') = 'restart-process'", (after,)),
                         60, what="the restart committed")
    # the one the restart started, found by its unique argv once it runs, so that none outlives the test
    started_again = wait_for(lambda: [p.pid for p in psutil.process_iter(["cmdline"])
                                      if p.info["cmdline"] == CRITICAL and p.pid != victim.pid], 30,
                             what="the process started again")
    tracker.add(*started_again)
    new_tick = pulsed.wait_replaced("tick", old_tick).pid
    # Counted from the new tick's Ready: how long pulsed takes to notice and spawn it does not follow
    # the history (and on a loaded machine it alone can take a second); the tick's first fold does.
    ready = first_mono(pulsed.home, "id > ? AND type = 'worker-ready' AND target = 'tick'", (after,))
    assert ready is not None and started < ready
    assert committed - ready < RESTART_COMMITTED_S, \
        f"{committed - ready:.3f} s after Ready, {committed - started:.3f} s after the kill"
    log = pulsed.log_text()
    assert f"tick[{new_tick}] INFO pulse.projection: tick: from its checkpoint" in log, log[-3000:]
    assert f"tick[{new_tick}] INFO pulse.projection: tick: no checkpoint" not in log
