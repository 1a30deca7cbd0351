"""Memory ceilings (`[[process]] memory`), for real: a process whose child leaks ~10 MB a second is
sampled as a tree (the parent itself stays small, so only its descendants can take it over the
ceiling), notified of its growth, then restarted (stopped, then started) after `for_samples`
samples above `max_mb`. Real pulsed, real processes, a [[notify]] file channel.

`pytest -s` prints the time from the first sample above the ceiling to the restart."""

from __future__ import annotations

import json
import re
import sys
import textwrap

import psutil

from pulse.sensing.builtin import measure_tree
from support import init_home, notifications, wait_for

FAST = {"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "250", "PULSE_EXECUTOR_SCAN_INTERVAL_MS": "100"}
MAX_MB = 60

# The parent allocates nothing; its child touches 1 MiB every 0.1 s (up to 300 MiB: a Pulse that
# never restarts it must not take the host down with the test).
LEAKER = """
import subprocess, sys, time
if sys.argv[2] == "parent":
    subprocess.Popen([sys.executable, sys.argv[0], sys.argv[1], "child"]).wait()
else:
    hoard = []
    while True:
        if len(hoard) < 300:
            hoard.append(b"x" * (1 << 20))
        time.sleep(0.1)
"""


def memory_restarts(pulsed) -> list[dict]:
    return [e for e in pulsed.events("effect", "leaky") if e["data"]["kind"] == "restart-process"
            and e["data"]["params"].get("why") == "memory"]


def test_a_leaking_tree_is_notified_of_its_growth_then_restarted_at_its_ceiling(pulsed, tmp_path, tracker):
    script = tmp_path / "leaker.py"
    script.write_text(LEAKER)
    notes = tmp_path / "notes.jsonl"
    argv = [sys.executable, str(script), str(tmp_path), "parent"]
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [[process]]
        name = "leaky"
        match = {json.dumps(re.escape(f"{script} {tmp_path} parent"))}
        restart = {json.dumps(argv)}
        memory = {{ max_mb = {MAX_MB}, for_samples = 3, growth_mb_per_h = 3600, growth_window_s = 2 }}

        [[notify]]
        kind = "file"
        path = "{notes}"
    """))
    pulsed.start(env=FAST)          # nothing runs yet: processWatchdog starts the first copy (why dead)
    first = wait_for(lambda: pulsed.vital("process-alive:leaky", lambda d: d["alive"]), 15, what="the first copy")
    tracker.add(first["pid"])

    restart = wait_for(lambda: memory_restarts(pulsed), 30, what="a restart at the ceiling")[0]
    params = restart["data"]["params"]
    assert params["pid"] == first["pid"] and params["max_mb"] == MAX_MB and params["samples"] == 3
    assert params["rss_mb"] > MAX_MB and f"{params['rss_mb']:g} MB" in params["reason"]
    assert restart["data"]["origin"] == "survival"

    # not before for_samples samples of that pid above the ceiling, and they were of the tree
    old = [s for s in pulsed.vitals_of("process-memory:leaky") if s["pid"] == first["pid"] and s["rss_mb"] is not None]
    over = [s for s in old if s["rss_mb"] > MAX_MB and s["ts"] < restart["ts"]]
    assert len(over) >= 3, over
    assert all(s["processes"] == 2 for s in over)
    crossed = over[0]["ts"]

    # the growth was notified before, with its slope
    grown = notifications(notes, "process-memory")
    assert grown and grown[0]["target"] == "leaky" and grown[0]["growth_mb_per_h"] > 3600
    told = [e for e in pulsed.events("effect", "leaky") if e["data"]["kind"] == "notify"
            and e["data"]["params"].get("rule") == "process-memory"]
    assert told[0]["ts"] < restart["ts"], "the growth notice comes before the restart"

    # the restart stopped that copy (its keeper recorded the exit), then started another
    acked = wait_for(lambda: [e for e in pulsed.events("effect-acked", "leaky")
                              if e["data"]["effect_id"] == restart["data"]["id"]], 15, what="the restart acked")[0]
    exited = [e for e in pulsed.events("process-exited", "leaky") if e["data"]["pid"] == first["pid"]]
    assert len(exited) == 1 and exited[0]["data"]["signal"] == "SIGTERM" and restart["ts"] < exited[0]["ts"] < acked["ts"]
    assert not psutil.pid_exists(first["pid"]) or psutil.Process(first["pid"]).status() == psutil.STATUS_ZOMBIE
    again = wait_for(lambda: pulsed.vital("process-alive:leaky", lambda d: d["alive"] and d["pid"] != first["pid"]),
                     10, what="the new copy")
    tracker.add(again["pid"])
    seen = next(s["ts"] for s in pulsed.vitals_of("process-alive:leaky") if s.get("pid") == again["pid"])

    # status says how much it holds, and of what ceiling
    status = wait_for(lambda: [p for p in json.loads(pulsed.ctl("status", "--json").stdout)["processes"]
                               if p["rss_mb"] is not None], 10, what="status with the RSS")[0]
    assert status["name"] == "leaky" and status["max_mb"] == MAX_MB
    # the table is a second look: the leaker may be between samples or restarts then, so it is waited for
    wait_for(lambda: re.search(rf"^leaky\s+(running|starting until \S+)\s+\d+\s.*\s\d+ MB of {MAX_MB}$",
                               pulsed.ctl("status").stdout, re.M), 10, what="status's line for leaky, its RSS of its ceiling")

    print(f"\ngrowth notice committed {crossed - told[0]['ts']:.3f} s before the ceiling was crossed; "
          f"ceiling crossed (first sample above {MAX_MB} MB) → restart committed {restart['ts'] - crossed:.3f} s, "
          f"→ new pid seen {seen - crossed:.3f} s, → restart acked {acked['ts'] - crossed:.3f} s "
          f"(3 samples at 250 ms; start_grace_s 1)")


def test_the_tree_is_measured_with_its_descendants(tracker, tmp_path):
    """measure_tree counts a child's memory in its parent's figure (and says how many it counted)."""
    script = tmp_path / "leaker.py"
    script.write_text(LEAKER)
    import subprocess
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path), "parent"], start_new_session=True)
    tracker.add(parent.pid)
    proc = psutil.Process(parent.pid)
    child = wait_for(lambda: proc.children(), 10, what="the child")[0]
    tracker.add(child.pid)
    wait_for(lambda: child.memory_info().rss > 40 * 2**20, 15, what="the child holding 40 MB")
    tree = measure_tree(parent.pid, proc.create_time())
    alone = proc.memory_info().rss / 2**20
    assert tree["processes"] == 2 and tree["rss_mb"] > alone + 35
    # a pid that now names another process (its start time differs) is not measured
    assert measure_tree(parent.pid, proc.create_time() - 1)["rss_mb"] is None
    parent.kill()
    parent.wait(5)
    child.kill()
    assert measure_tree(parent.pid, None)["reason"] == "gone"


def test_the_watcher_rings_the_tick_once_on_the_sample_that_makes_for_samples():
    from pulse.core import config as configmod
    from pulse.core.wire.enginerpc import Vital
    from pulse.sensing.builtin import ProcessAlive, ProcessMemory
    process = configmod.decode(b'[[process]]\nname = "gw"\nmatch = "gw"\nrestart = ["true"]\n'
                               b'memory = { max_mb = 100, for_samples = 3 }\n', "test").process[0]
    watcher = ProcessMemory(ProcessAlive(process, 1000), 1000)
    window = lambda *mbs, pid=41: [Vital("process-memory:gw", i, {"pid": pid, "rss_mb": mb}) for i, mb in enumerate(mbs)]
    assert not watcher.should_wake(window(120, 130))
    assert watcher.should_wake(window(90, 120, 130, 140))
    assert not watcher.should_wake(window(90, 120, 130, 140, 150))             # an edge, not a level
    assert not watcher.should_wake(window(120, 130) + window(140, pid=42))     # another pid starts over
    assert not watcher.should_wake(window(120, 130, None, 140))                # a sample that measured nothing
    assert watcher.collect() == {"pid": None, "rss_mb": None, "reason": "not running"}   # nothing found yet
