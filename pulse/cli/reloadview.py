"""`pulsectl reload` itself, click-free (pulse.cli.workercmd declares it to click, pulse.cli.fastpath
runs it without it), and what it says once pulsed has reloaded: per worker and per [[process]], what came
of what the reload set in motion (controlmsgs.ReloadDone), as it actually ended, not as it was begun. A
worker that does not come back is said as failed, with its state and last exit; a [[process]] taken out
is said stopped once its stop-process effect ends; one added, running once the watcher sees it alive.
"""

from __future__ import annotations

import sys
import time

from pulse.cli.configview import unknown_kinds
from pulse.cli.context import Context, echo
from pulse.core import client
from pulse.core import config as configmod
from pulse.core.states import EffectState, StatusExit, WorkerState
from pulse.core.wire import controlmsgs, eventmsgs
from pulse.core.wire.eventmsgs import EffectEvent, EffectKind

# Imports inside functions below: events.db's modules (~2 ms), only for a reload that set something in motion.

# What a reload sets in motion ends in a commit: a worker's ready, exit or failure is an event, an
# effect's end too, and the watcher's sample of a started process a vital. So the wait looks again at
# each commit to events.db or vitals.db (pulse.store.commitwatch), and at least this often, for
# whatever no commit says.
LOOK_AT_LEAST_S = 1.0
STORES = ("events.db", "events.db-wal", "vitals.db", "vitals.db-wal")
REFUSED = "pulsectl: reload refused, pulsed keeps its running configuration: "


def reload(ctx: Context, wait: float) -> None:
    """Have pulsed re-read config.toml, then say what came of it; exit 78 when it is refused, 1 when
    anything it set in motion failed."""
    try:
        config = configmod.load(ctx.paths.config)
    except configmod.ConfigError:
        config = None              # pulsed refuses it (recording a failed `reload` event), and says why
    problems = unknown_kinds(ctx, config) if config is not None else []
    if problems:
        for problem in problems:
            echo(REFUSED + problem, err=True)
        sys.exit(78)
    try:
        reply = client.request(ctx.paths, controlmsgs.Reload(), ctx.timeout)
    except client.Unreachable as err:
        echo(f"pulsectl: {err}", err=True)
        sys.exit(StatusExit.UNKNOWN)
    if not reply.ok:
        echo(REFUSED + str(reply.error), err=True)
        sys.exit(78)
    if reply.reload is None or not wait:
        echo(reply.message)
        return
    lines, failed = outcome(ctx, config or ctx.config(), reply.reload, wait)
    echo("reloaded" + ("" if lines else "; nothing to restart, start or stop"))
    for line in lines:
        echo(f"  {line}")
    sys.exit(1 if failed else 0)


def worker_line(name: str, how: str, worker: controlmsgs.WorkerStatus | None, old_pid: int | None,
                final: bool) -> tuple[str, bool] | None:
    """(the line, failed) once the worker is where the reload sent it; None while it is on its way
    (`final`: the wait is over, so where it is now is the answer)."""
    if how == "stopped":
        if worker is None or worker.state == WorkerState.STOPPED:
            return f"{name}: stopped", False
    elif worker is not None and worker.state == WorkerState.RUNNING and (how == "started" or worker.pid != old_pid):
        return f"{name}: {how} (pid {worker.pid})", False
    elif worker is not None and worker.state == WorkerState.FAILED:
        return f"{name}: failed ({exit_words(worker)})", True
    if not final:
        return None
    state = worker.state if worker is not None else "not listed"
    return f"{name}: failed: not {'stopped' if how == 'stopped' else 'running'} after the wait ({state}" + (
        f", {exit_words(worker)})" if worker is not None and worker.last_exit else ")"), True


def exit_words(worker: controlmsgs.WorkerStatus) -> str:
    last = worker.last_exit
    if last is None:
        return f"state {worker.state}"
    how = f"exit code {last.code}" if last.code is not None else f"signal {last.signal}"
    return f"state {worker.state}, last exit {how} at {last.at}"


def effect_since(conn, kind: str, name: str, at: float) -> eventmsgs.Event | None:
    """The first effect of `kind` on `name` committed since `at` (the reload)."""
    from pulse.store import eventsdb
    found = [e for e in eventsdb.search_events(conn, types=[EffectEvent.COMMITTED], target=name, since_ts=at - 1, limit=50)
             if e.data.get("kind") == kind and e.ts >= at - 1]
    return found[-1] if found else None


def ended(conn, effect: eventmsgs.Event | None) -> tuple[str, dict, str | None] | None:
    """(state, the ending event's data, why) once the effect has ended; None while it is open."""
    if effect is None:
        return None
    effect_id = effect.data.get("id")
    from pulse.store import effectqueue, eventsdb
    state = effectqueue.effect_state(conn, effect_id)
    if state not in (EffectState.ACKED, EffectState.FAILED, EffectState.EXPIRED):
        return None
    end = eventsdb.effect_end(conn, effect_id)
    return state, end.data if end is not None else {}, effectqueue.effect_why(conn, effect_id)


def removed_line(conn, name: str, at: float, final: bool) -> tuple[str, bool] | None:
    result = ended(conn, effect_since(conn, eventmsgs.STOP_PROCESS, name, at))
    if result is None:
        return (f"[[process]] {name}: removed; failed: its stop was not done within the wait", True) if final else None
    state, data, why = result
    if state != EffectState.ACKED:
        return f"[[process]] {name}: removed; failed to stop it: {why}", True
    pids = data.get("stopped") or []
    return (f"[[process]] {name}: removed, stopped (pid {', '.join(map(str, pids))})" if pids
            else f"[[process]] {name}: removed (it was not running)"), False


def added_line(conn, process: controlmsgs.ProcessStatus | None, name: str, at: float, has_restart: bool,
               final: bool) -> tuple[str, bool] | None:
    if process is not None and process.alive:
        return f"[[process]] {name}: added, running (pid {process.pid})", False
    if not has_restart:                 # nothing for the reload to start: said at once, not waited on
        return f"[[process]] {name}: added, watched (it has no restart argv: Pulse does not start it)", False
    result = ended(conn, effect_since(conn, EffectKind.RESTART_PROCESS, name, at))
    if result is not None and result[0] != EffectState.ACKED:
        return f"[[process]] {name}: added; failed to start: {result[2]}", True
    if not final:
        return None
    return f"[[process]] {name}: added; failed: not running after the wait", True


def outcome(ctx: Context, config, done: controlmsgs.ReloadDone, wait_s: float) -> tuple[list[str], bool]:
    """The lines to print, in the order of the reload, and whether anything failed."""
    workers = {**{n: "restarted" for n in done.restarted}, **{n: "started" for n in done.started},
               **{n: "stopped" for n in done.stopped}}
    if not (workers or done.processes_removed or done.processes_added or done.processes_kept):
        return [], False          # nothing set in motion: nothing to wait for
    before = done.pids
    restartable = {p.name for p in config.process if p.restart}
    said: dict[str, tuple[str, bool]] = {f"[[process]] {n}": (f"[[process]] {n}: removed, left running "
                                                              "(keep_on_remove)", False) for n in done.processes_kept}
    deadline = time.monotonic() + wait_s
    from pulse.store import eventsdb
    from pulse.store.commitwatch import CommitWatch
    watch = CommitWatch(ctx.paths.events_db, names=STORES)    # before the first look: no commit falls between
    conn = eventsdb.open_events(ctx.paths.events_db)
    try:
        while True:
            final = time.monotonic() >= deadline
            status = client.request(ctx.paths, controlmsgs.GetStatus(), ctx.timeout).status
            listed = {w.name: w for w in status.workers}
            processes = {p.name: p for p in status.processes}
            for name, how in workers.items():
                if name not in said and how == "restarted" and name not in before:
                    said[name] = (f"{name}: restart begun (status does not list it)", False)   # the event writer
                elif name not in said:
                    line = worker_line(name, how, listed.get(name), before.get(name), final)
                    if line:
                        said[name] = line
            for name in done.processes_removed:
                if f"[[process]] {name}" not in said and (line := removed_line(conn, name, done.at, final)):
                    said[f"[[process]] {name}"] = line
            for name in done.processes_added:
                if f"[[process]] {name}" not in said and (
                        line := added_line(conn, processes.get(name), name, done.at, name in restartable, final)):
                    said[f"[[process]] {name}"] = line
            if final or len(said) == len(workers) + len(done.processes_removed) + len(done.processes_added) \
                    + len(done.processes_kept):
                break
            watch.wait_blocking(min(LOOK_AT_LEAST_S, max(0.0, deadline - time.monotonic())))
    finally:
        conn.close()
        watch.close()
    order = [*workers, *(f"[[process]] {n}" for n in [*done.processes_removed, *done.processes_kept,
                                                       *done.processes_added])]
    lines = [said[key] for key in order if key in said]
    return [line for line, _ in lines], any(failed for _, failed in lines)
