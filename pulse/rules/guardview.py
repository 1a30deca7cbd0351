"""What the config and file guards look like from outside: a [[process]]'s config files against their
known-good copies, and each [[watch.file]] and [[watch.dir]] glob's latest sample and last trim. The tick computes
these from its snapshot and hands them to pulsed in its heartbeat; `pulsectl status`, the page and
/metrics show them. Pure functions over the snapshot; no I/O here.
"""

from __future__ import annotations

from typing import Sequence

from pulse.core import staleness
from pulse.core.config import DirWatch, FileWatch, FreshWatch, Process, Survival
from pulse.core.states import EffectState, ProcessState
from pulse.core.wire.controlmsgs import (
    ConfigFileStatus,
    ConfigStatus,
    DirWatchStatus,
    FileWatchStatus,
    FreshWatchStatus,
    HealthView,
    ProcessExitView,
    ProcessView,
)
from pulse.core.wire.enginerpc import Snapshot
from pulse.core.wire.eventmsgs import EffectKind
from pulse.rules import knowngood, processstate, survival

MB = 1024 * 1024
ENDED = (EffectState.ACKED, EffectState.FAILED, EffectState.EXPIRED)


def config_file_state(path: str, sampled: dict[str, dict] | None, good: dict[str, str]) -> str:
    """One config file, as ConfigFileStatus.state names it."""
    if sampled is None:
        return "unsampled"
    state = sampled.get(path)
    if state is None:
        return "unsampled"
    if "error" in state:
        return "unreadable"
    if state.get("missing"):
        return "missing" if path in good else "not-kept"
    if path not in good:
        return "not-kept"
    return "known-good" if state.get("sha256") == good[path] else "changed"


def config_status(curr: Snapshot, proc: Process) -> ConfigStatus | None:
    """A process's config files against its known-good copies; None when it has no `config`."""
    if not proc.config:
        return None
    sampled, known = knowngood.config_files(curr, proc.name), knowngood.known_of(curr, proc.name)
    files = [ConfigFileStatus(path, config_file_state(path, sampled, known.files)) for path in proc.config]
    return ConfigStatus(files=files, kept_at=known.kept_at, pinned=known.pinned, restored_at=known.restore_at,
                        restore_why=known.restore_why, restore_state=known.restore_state,
                        restore_summary=known.restore_summary)


def file_watch_status(curr: Snapshot, watch: FileWatch) -> FileWatchStatus:
    """A [[watch.file]] glob: its latest sample (files, bytes, the largest, how many over max_mb) and
    its last trim that ended, of any file it matched then."""
    view = FileWatchStatus(name=watch.name, path=watch.path, action=watch.action, max_mb=watch.max_mb)
    samples = curr.history.get(f"file:{watch.name}") or ()
    if not samples:
        return view
    found = [f for f in samples[-1].data.get("files", []) if isinstance(f.get("bytes"), int)]
    largest = max(found, key=lambda f: f["bytes"], default=None)
    trims = [o for f in found for o in curr.outcomes.get(f.get("path", ""), ())
             if o.kind == EffectKind.ROTATE_FILE and o.state in ENDED]
    last = max(trims, key=lambda o: o.ts, default=None)
    view.files, view.sampled_at = len(found), samples[-1].ts
    view.bytes = sum(f["bytes"] for f in found)
    view.over = sum(1 for f in found if f["bytes"] > watch.max_mb * MB)
    if largest is not None:
        view.largest, view.largest_bytes = largest.get("path"), largest["bytes"]
    if last is not None:
        view.last_trim_at, view.last_trim_state = last.ts, last.state
    return view


def fresh_watch_status(curr: Snapshot, watch: FreshWatch) -> FreshWatchStatus:
    """A [[watch.fresh]]: its latest sample, judged as freshWatch judges it."""
    view = FreshWatchStatus(name=watch.name, what=survival.proof_words(watch), within_s=watch.within_s,
                            restart=watch.restart)
    samples = curr.history.get(f"fresh:{watch.name}") or ()
    if not samples:
        return view
    latest = samples[-1]
    data = latest.data
    view.stale = staleness.is_stale(latest.ts, data, watch.within_s)
    view.changed_at = staleness.number(data.get("changed_at"))
    view.age_s = round(staleness.looked_at(latest.ts, data) - staleness.last_work(data), 1)
    view.value = data.get("value") if isinstance(data.get("value"), str) else None
    view.error = data.get("error") if isinstance(data.get("error"), str) else None
    view.sampled_at = latest.ts
    return view


def dir_watch_status(curr: Snapshot, watch: DirWatch) -> DirWatchStatus:
    """A [[watch.dir]] glob: its directories at the latest sample (files, bytes, the oldest, how many
    over a bound) and its last trim that ended, of any directory it matched then."""
    view = DirWatchStatus(name=watch.name, path=watch.path, oldest=watch.oldest, max_mb=watch.max_mb,
                          max_files=watch.max_files, max_age=watch.max_age)
    samples = curr.history.get(f"dir:{watch.name}") or ()
    if not samples:
        return view
    data = samples[-1].data
    found = data.get("dirs", [])           # every directory over a bound, and some of the others
    trims = [o for d in found for o in curr.outcomes.get(d.get("path", ""), ())
             if o.kind == EffectKind.TRIM_DIR and o.state in ENDED]
    last = max(trims, key=lambda o: o.ts, default=None)
    view.dirs, view.sampled_at = int(data.get("matched", len(found))), samples[-1].ts
    view.files, view.bytes = int(data.get("files", 0)), int(data.get("bytes", 0))
    view.oldest_mtime = data.get("oldest_mtime")
    view.over, view.refused = int(data.get("over", 0)), int(data.get("refused", 0))
    if last is not None:
        view.last_trim_at, view.last_trim_state = last.ts, last.state
    return view


EXIT_OUTPUT_LINES = 5          # of a process's last output, in status


def health_view(curr: Snapshot, proc: Process, since: float) -> tuple[HealthView | None, int, bool]:
    """(its last probe, its counted probes failed in a row, whether one passed since its start)."""
    probes = curr.history.get(f"health:{proc.name}", [])
    if proc.health is None or not probes:
        return None, 0, False
    alive = curr.vitals.get(f"process-alive:{proc.name}")
    counted = survival.counted_probes(probes, since, alive, proc.health.start_period_s)
    started = alive.data.get("since") if alive is not None and alive.data.get("alive") else None
    last = probes[-1].data
    latency = last.get("latency_ms")
    view = HealthView(ok=bool(last.get("ok", True)), at=probes[-1].ts, failing=survival.failing_in_a_row(counted),
                      latency_ms=latency if isinstance(latency, (int, float)) else None, error=last.get("error"))
    return view, view.failing, any(survival.probe_ok(v) for v in probes if started is None or v.ts > started)


def process_view(curr: Snapshot, proc: Process, s: Survival) -> ProcessView:
    """One [[process]]'s state (pulse.rules.processstate) from the tick's snapshot, as processWatchdog sees it."""
    name = proc.name
    vital = curr.vitals.get(f"process-alive:{name}")
    data = vital.data if vital is not None else {}
    alive = None if vital is None else bool(data.get("alive", False))
    started = data.get("started") or data.get("since") if alive else None
    died = (data.get("dead_since") or vital.ts) if alive is False else None
    runs = curr.runs.get(name)
    ended = curr.exits.get(name)
    limits = survival.crash_limits(proc, s)
    last_restart = max((o.ts for o in curr.outcomes.get(name, ()) if o.kind == EffectKind.RESTART_PROCESS), default=0.0)
    started_pid = runs.starts[-1].pid if runs is not None and runs.starts else 0
    if (known := survival.fresh_exit(ended, last_restart, started_pid)) is not None:
        alive, started, died = False, None, known.ts     # its keeper saw it die before the watcher looked again
    health, failing, healthy = health_view(curr, proc, last_restart)
    words = survival.exit_words(ended)
    streak = survival.crash_loop(curr, proc, died, limits) if alive is False else []
    view = processstate.project(
        now=curr.ts, alive=alive, started=started, died=died,
        restarting=survival.pending_or_handled(curr, (), EffectKind.RESTART_PROCESS, name), guarded=bool(proc.restart),
        stopped=runs is not None and runs.stopped, paused_until=curr.paused.get(name), streak=streak,
        held=alive is False and survival.held_fatal(curr, name), limits=limits,
        last_exit=words, probes_failing=failing, failures=proc.health.failures if proc.health else None,
        healthy_since_start=healthy, start_period_s=proc.health.start_period_s if proc.health else 0.0,
        asked_not_to_restart=ended is not None and ended.code in proc.stop_exit_codes and died is not None
        and ended.ts >= died - survival.EXIT_FACT_WAIT_S)
    if view.state == ProcessState.FATAL and (step := survival.way_out_step(curr, proc, streak)) is not None:
        view.why = {"run": f"{view.why}; its on_crash_loop runs next, then one more start",
                    "wait": "held: its on_crash_loop runs; one more start after it",
                    "start": "held: its on_crash_loop ended; one more start next",
                    "held": f"{view.why}; its on_crash_loop ran ({runs.way_out_said}) and the start after it "
                            "died too"}[step]
    last_exit = None if ended is None else ProcessExitView(
        at=ended.ts, pid=ended.pid, code=ended.code, signal=ended.signal,
        output=ended.tail.splitlines()[-EXIT_OUTPUT_LINES:])
    return ProcessView(state=view.state, why=view.why, until=view.until, started_at=view.started,
                       restarts=runs.restarts if runs is not None else 0, last_exit=last_exit, health=health)


def guards(curr: Snapshot, processes: Sequence[Process], watches: Sequence[FileWatch], s: Survival,
           proofs: Sequence[FreshWatch] = (), dirs: Sequence[DirWatch] = ()) -> dict:
    """The tick's heartbeat extras for status: every process's state, config per process that has
    any, and every watched file glob and directory glob."""
    configs = {p.name: view for p in processes if (view := config_status(curr, p)) is not None}
    return {"states": {p.name: process_view(curr, p, s) for p in processes},
            "configs": configs, "files": [file_watch_status(curr, w) for w in watches],
            "fresh": [fresh_watch_status(curr, w) for w in proofs],
            "dirs": [dir_watch_status(curr, d) for d in dirs]}
