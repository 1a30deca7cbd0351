"""What `pulsectl status` prints, and its exit code, without click (see pulse.cli).

Exit codes (LSB): 0 every worker running; 3 something not running; 4 pulsed unreachable.
"""

from __future__ import annotations

from pulse.cli import request_or_exit
from pulse.core import clock, wire
from pulse.core.home import Paths, dev_pid
from pulse.core.states import LATE, StatusExit, WorkerState


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}d {text}" if days else text


def last_exit(exit: wire.LastExit | None) -> str:
    if exit is None:
        return "-"
    import signal
    if exit.signal:
        try:
            how = signal.Signals(exit.signal).name
        except ValueError:
            how = f"signal {exit.signal}"
    elif exit.code is not None:
        how = f"exit {exit.code}"
    else:
        how = "exit ?"
    return f"{how} at {exit.at[11:19]}Z"


def columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def process_state(p: wire.ProcessStatus) -> str:
    state = "unknown" if p.alive is None else "alive" if p.alive else "dead"
    if p.paused_until is not None:
        state += f", paused until {clock.iso(p.paused_until, ms=False)}"
    if p.matches is not None and p.matches > 1:
        state += f", {p.matches} processes match (the oldest is watched)"
    return state


def memory(p: wire.ProcessStatus) -> str:
    """Its tree's RSS, and its ceiling when it has one: "812 MB of 4096"."""
    if p.rss_mb is None:
        return "-"
    return f"{p.rss_mb:.0f} MB" + (f" of {p.max_mb:g}" if p.max_mb is not None else "")


def table(status: wire.Status, engine_commit: str | None = None, events_unwritten: int = 0) -> str:
    # Crashes (automatic restarts) apart from the operator's restarts and reloads: a reload is not
    # a crash, and one column counting both hid which was which (issue 23).
    rows = [("NAME", "STATE", "PID", "UPTIME", "CRASHES", "RESTARTED", "LAST EXIT", "HEARTBEAT")]
    for w in status.workers:
        rows.append((w.name, w.state, str(w.pid or "-"), duration(w.uptime_s), str(w.crashes),
                     str(w.operator_restarts), last_exit(w.last_exit),
                     "-" if w.heartbeat_age_s is None else f"{w.heartbeat_age_s:.1f}s ago"))
    lines = columns(rows)
    if status.processes:
        lines.append("")
        lines += columns([("PROCESS", "STATE", "PID", "MEMORY")] +
                         [(p.name, process_state(p), str(p.pid or "-"), memory(p)) for p in status.processes])
    s = status.supervisor
    lines.append(f"pulsed pid {s.pid}, up {duration(s.uptime_s)}, home {s.home}"
                 + (f", engine at {engine_commit[:12]}{'+dirty' if engine_commit.endswith('+dirty') else ''}"
                    if engine_commit else "")
                 + (f", {events_unwritten} lifecycle events not yet in events.db" if events_unwritten else ""))
    if events_unwritten:
        # Said once more after a second look (see show()): pulsed holds them, none is lost (issue 23).
        lines.append(f"({events_unwritten} lifecycle events are held by pulsed until its event writer commits them: "
                     "it is behind or being replaced; `pulsectl events` shows them once written)")
    return "\n".join(lines)


def show(paths: Paths, timeout: float, as_json: bool) -> int:
    reply = request_or_exit(paths, wire.GetStatus(), timeout)
    if not as_json and reply.events_recorded > reply.events_written:
        # Right after a kill the restart's own events are a few milliseconds from being committed:
        # look again once before saying so, so a passing moment is not reported as a backlog.
        import time
        time.sleep(0.3)
        reply = request_or_exit(paths, wire.GetStatus(), timeout)
    if as_json:
        print(status_json(reply.status))
    else:
        print(table(reply.status, reply.engine_commit, reply.events_recorded - reply.events_written))
        if dev_pid(paths) is not None:
            print(f"the engine runs staging ({paths.home / 'staging'}): pulsectl dev is running")
        rolled = rolled_back_note(paths)
        if rolled:
            print(rolled)
    running = all(w.state in (WorkerState.RUNNING, LATE) for w in reply.status.workers)
    return StatusExit.RUNNING if running else StatusExit.NOT_RUNNING


def rolled_back_note(paths: Paths) -> str | None:
    """After a rollback (survival's autoRollback most of all), staging still holding the rolled-back
    tree is said here, or the next promote would ship it again unnoticed (issue 23)."""
    if not (paths.engine / ".git").exists():
        return None
    from pulse.engine import repo
    held = repo.rolled_back_in_staging(paths)
    if held is None:
        return None
    return (f"engine: {repo.rolled_back_words(held)}; `pulsectl engine` says more, and a promote "
            "refuses it without --again")


def status_json(status: wire.Status) -> str:
    """`status --json`: the document pulsed sent, with a process's `paused_until` (epoch seconds on
    the wire, which the page reads) as ISO 8601 like every other time in it (issue 23)."""
    import json
    document = json.loads(wire.status_json(status))
    for process in document.get("processes", []):
        if isinstance(process.get("paused_until"), (int, float)):
            process["paused_until"] = clock.iso(process["paused_until"])
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)
