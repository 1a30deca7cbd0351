"""What `pulsectl status` prints, and its exit code, without click (see pulse.cli).

Exit codes (LSB): 0 every worker running; 3 something not running; 4 pulsed unreachable.
"""

from __future__ import annotations

from pulse.cli import request_or_exit
from pulse.core import wire
from pulse.core.home import Paths, dev_pid
from pulse.core.states import StatusExit, WorkerState


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
        import time
        state += f", paused until {time.strftime('%H:%M:%S', time.gmtime(p.paused_until))}Z"
    if p.matches is not None and p.matches > 1:
        state += f", {p.matches} processes match (the oldest is watched)"
    return state


def memory(p: wire.ProcessStatus) -> str:
    """Its tree's RSS, and its ceiling when it has one: "812 MB of 4096"."""
    if p.rss_mb is None:
        return "-"
    return f"{p.rss_mb:.0f} MB" + (f" of {p.max_mb:g}" if p.max_mb is not None else "")


def table(status: wire.Status, engine_commit: str | None = None, events_unwritten: int = 0) -> str:
    rows = [("NAME", "STATE", "PID", "UPTIME", "RESTARTS", "LAST EXIT", "HEARTBEAT")]
    for w in status.workers:
        rows.append((w.name, w.state, str(w.pid or "-"), duration(w.uptime_s), str(w.restarts), last_exit(w.last_exit),
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
    if status.fleet is not None:
        lines.append(fleet_line(status.fleet))
    return "\n".join(lines)


def fleet_line(fleet: dict) -> str:
    """The fleet worker's link: "fleet: connected as gw@node-3 to nats://10.0.0.5:4222, events through #812"."""
    line = f"fleet: {fleet.get('state')} as {fleet.get('host')} to {', '.join(fleet.get('servers') or [])}"
    line += f", events through #{fleet.get('published_through', 0)}"
    return line + (f" ({fleet['reason']})" if fleet.get("reason") else "")


def show(paths: Paths, timeout: float, as_json: bool) -> int:
    reply = request_or_exit(paths, wire.GetStatus(), timeout)
    if as_json:
        print(wire.status_json(reply.status).decode())
    else:
        print(table(reply.status, reply.engine_commit, reply.events_recorded - reply.events_written))
        if dev_pid(paths) is not None:
            print(f"the engine runs staging ({paths.home / 'staging'}): pulsectl dev is running")
    running = all(w.state == WorkerState.RUNNING for w in reply.status.workers)
    return StatusExit.RUNNING if running else StatusExit.NOT_RUNNING
