"""A long history does not make the tick hung (issue 25): its first fold reads every event of
events.db in the main loop, batch by batch, which on 40 MiB takes seconds (on 80 MiB, longer than
the default hung_after_ms, 10 s, on a busy 2-core machine). It
heartbeats between batches, so it is not killed as hung, restarted to fold again and killed again
until pulsed gives up. Real pulsed, FAST timings, real SQLite."""

from __future__ import annotations

from test_web_memory import grow_history

from support import init_home

HISTORY_MIB = 40


def test_the_tick_folds_a_long_history_without_being_taken_for_hung(pulsed):
    init_home(pulsed.home)
    grow_history(pulsed.home, HISTORY_MIB)
    # hung after 0.5 s (the shortest config allows over a 0.3 s busy timeout): folding 40 MiB takes longer
    pulsed.start(env={"PULSE_HUNG_AFTER_MS": "500", "PULSE_SQLITE_BUSY_TIMEOUT_MS": "300"})
    pulsed.wait_ticks(3, timeout=90)          # it folded the whole history and ticked since
    tick = pulsed.worker("tick")
    assert tick.state == "running" and tick.restarts == 0, tick
    assert "silent for" not in pulsed.log_text()
