"""What `pulsectl status` prints, and its exit code, without click (see pulse.cli).

Exit codes (LSB): 0 every worker running and every guarded process up; 3 a worker not running; 4
pulsed unreachable; 5 every worker running, but a guarded process is down, held fatal or unhealthy
(an operator's stop or pause is not a failure). `--json` says which in its "exit".
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pulse.cli.launch import request_or_exit
from pulse.core import clock
from pulse.core.home import Paths, dev_pid
from pulse.core.states import LATE, PROCESS_FAILING, ProcessState, StatusExit, WorkerState

if TYPE_CHECKING:
    from pulse.core.wire import controlmsgs

# Imports inside functions: the plain status path (pulse.cli.main, without click) imports this module:
# what only some statuses show is imported when shown: pulse.store.retention ~27 ms, pulse.engine.repo
# ~26 ms (python -X importtime, this 2-core host).
#
# Without msgspec (~30 ms): status asks with GET_STATUS and reads pulsed's reply as plain data
# (pulse.core.wire.plainmsgpack), whose maps read as attributes like the Structs they were written
# from; the status document has every field (only the Reply around it leaves defaults out).
GET_STATUS = b"\x81\xa4type\xa6status"    # controlmsgs.GetStatus(), as msgspec writes it (tests/test_wire.py)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}d {text}" if days else text


def last_exit(exit: controlmsgs.LastExit | None) -> str:
    if exit is None:
        return "-"
    import signal
    if exit.why == "hung":   # the signal is pulsed's own abort, not what went wrong
        how = "hung"
    elif exit.signal:
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


def process_state(p: controlmsgs.ProcessStatus) -> str:
    state = p.state
    if state == ProcessState.PAUSED:   # "paused, paused until …" would hide whether it lives
        state = "running" if p.alive else "dead" if p.alive is False else "unknown"
    if p.state in (ProcessState.BACKOFF, ProcessState.STARTING) and p.until is not None:
        state += f" until {clock.iso(p.until, ms=False)[11:19]}Z"
    if p.paused_until is not None:
        state += f", paused until {clock.iso(p.paused_until, ms=False)}"
    if p.matches is not None and p.matches > 1:
        state += f", {p.matches} processes match (the oldest is watched)"
    return state


def process_exit(exit: controlmsgs.ProcessExitView | None) -> str:
    if exit is None:
        return "-"
    how = f"killed by {exit.signal}" if exit.code is None else f"exit {exit.code}"
    return f"{how} at {clock.iso(exit.at, ms=False)[11:19]}Z"


def health(h: controlmsgs.HealthView | None) -> str:
    """Its last probe: "ok 12 ms", "failing 3 (timed out)"."""
    if h is None:
        return "-"
    took = f" {h.latency_ms:.0f} ms" if h.latency_ms is not None else ""
    return f"ok{took}" if h.ok else f"failing {h.failing}{took}" + (f" ({h.error})" if h.error else "")


def memory(p: controlmsgs.ProcessStatus) -> str:
    """Its tree's RSS, and its ceiling when it has one: "812 MB of 4096"."""
    if p.rss_mb is None:
        return "-"
    return f"{p.rss_mb:.0f} MB" + (f" of {p.max_mb:g}" if p.max_mb is not None else "")


def config_state(p: controlmsgs.ProcessStatus) -> str:
    """Its config files against the known-good copies: "known good", "2 changed of 3", with its last
    restore when it had one."""
    c = p.config
    if c is None:
        return "-"
    states = [f.state for f in c.files]
    off = [s for s in states if s in ("changed", "missing")]
    said = (f"{len(off)} changed of {len(states)}" if off else "known good" if c.kept_at is not None and
            all(s == "known-good" for s in states) else "not kept yet" if c.kept_at is None else
            ", ".join(sorted(set(states))))
    if c.pinned:
        said += " (pinned)"
    if c.restored_at is not None:
        said += f"; restored {clock.iso(c.restored_at, ms=False)} ({c.restore_why}, {c.restore_state or 'running'})"
    return said


def size(n: int) -> str:
    return f"{n / 1048576:.1f} MB" if n >= 104858 else f"{n / 1024:.0f} KB"


def file_rows(files: list[controlmsgs.FileWatchStatus]) -> list[tuple[str, ...]]:
    rows = [("WATCHED FILE", "MATCHES", "LARGEST", "MAX", "ACTION", "LAST TRIM")]
    for f in files:
        largest = "-" if f.largest is None else f"{size(f.largest_bytes)} {f.largest}"
        trim = "-" if f.last_trim_at is None else f"{f.last_trim_state} {clock.iso(f.last_trim_at, ms=False)}"
        rows.append((f.name, "-" if f.files is None else f"{f.files} ({size(f.bytes)})" + (f", {f.over} over" if f.over else ""),
                     largest, f"{f.max_mb:g} MB", f.action, trim))
    return rows


def fresh_rows(proofs: list[controlmsgs.FreshWatchStatus]) -> list[tuple[str, ...]]:
    rows = [("PROOF OF WORK", "STATE", "LAST WORK", "WITHIN", "RESTART", "LOOKS AT")]
    for f in proofs:
        state = "-" if f.stale is None else "stale" if f.stale else "fresh"
        if f.error:
            state += f" ({f.error})"
        last = ("-" if f.age_s is None else f"{duration(f.age_s)} ago" if f.changed_at is not None
                else f"none in {duration(f.age_s)}")
        rows.append((f.name, state, last, duration(f.within_s), f.restart or "-",
                     f.what + (f" = {f.value}" if f.value is not None else "")))
    return rows


def bounds(d: controlmsgs.DirWatchStatus) -> str:
    """Its bounds in words: "1000 files, 512 MB, 14d"."""
    said = [f"{d.max_files} files" if d.max_files is not None else "", f"{d.max_mb:g} MB" if d.max_mb is not None else "",
            d.max_age or ""]
    return ", ".join(s for s in said if s)


def dir_rows(dirs: list[controlmsgs.DirWatchStatus]) -> list[tuple[str, ...]]:
    rows = [("WATCHED DIR", "DIRS", "FILES", "OLDEST FILE", "BOUNDS", "OLDEST", "LAST TRIM")]
    for d in dirs:
        trim = "-" if d.last_trim_at is None else f"{d.last_trim_state} {clock.iso(d.last_trim_at, ms=False)}"
        matched = "-" if d.dirs is None else str(d.dirs) + (f", {d.over} over" if d.over else "") + \
            (f", {d.refused} refused" if d.refused else "")
        rows.append((d.name, matched, "-" if d.dirs is None else f"{d.files} ({size(d.bytes)})",
                     "-" if d.oldest_mtime is None else clock.iso(d.oldest_mtime, ms=False), bounds(d), d.oldest, trim))
    return rows


def table(status: controlmsgs.Status, engine_commit: str | None = None, events_unwritten: int = 0) -> str:
    # Crashes (automatic restarts) apart from the operator's restarts and reloads: a reload is not
    # a crash, and one column counting both hid which was which.
    rows = [("NAME", "STATE", "PID", "UPTIME", "CRASHES", "RESTARTED", "LAST EXIT", "HEARTBEAT")]
    for w in status.workers:
        rows.append((w.name, w.state, str(w.pid or "-"), duration(w.uptime_s), str(w.crashes),
                     str(w.operator_restarts), last_exit(w.last_exit),
                     "-" if w.heartbeat_age_s is None else f"{w.heartbeat_age_s:.1f}s ago"))
    lines = columns(rows)
    if status.processes:
        lines.append("")
        configs = any(p.config is not None for p in status.processes)   # the column only when one has `config`
        lines += columns([("PROCESS", "STATE", "PID", "UPTIME", "RESTARTS", "LAST EXIT", "HEALTH", "MEMORY")
                          + (("CONFIG",) if configs else ())] +
                         [(p.name, process_state(p), str(p.pid or "-"), duration(p.uptime_s), str(p.restarts),
                           process_exit(p.last_exit), health(p.health), memory(p)) + ((config_state(p),) if configs else ())
                          for p in status.processes])
        for p in status.processes:        # why a process is not up, and a fatal one's last words
            if p.state in PROCESS_FAILING or p.state == ProcessState.STOPPED:
                lines.append(f"  {p.name}: {p.state}: {p.why}")
                if p.state == ProcessState.FATAL and p.last_exit is not None:
                    lines += [f"    | {line}" for line in p.last_exit.output]
    if status.files:
        lines.append("")
        lines += columns(file_rows(status.files))
    if status.fresh:
        lines.append("")
        lines += columns(fresh_rows(status.fresh))
    if status.dirs:
        lines.append("")
        lines += columns(dir_rows(status.dirs))
    s = status.supervisor
    lines.append(f"pulsed pid {s.pid}, up {duration(s.uptime_s)}, home {s.home}"
                 + (f", engine at {engine_commit[:12]}{'+dirty' if engine_commit.endswith('+dirty') else ''}"
                    if engine_commit else "")
                 + (f", {events_unwritten} lifecycle events not yet in events.db" if events_unwritten else ""))
    if events_unwritten:
        # Said once more after a second look (see show()): pulsed holds them, none is lost.
        lines.append(f"({events_unwritten} lifecycle events are held by pulsed until its event writer commits them: "
                     "it is behind or being replaced; `pulsectl events` shows them once written)")
    if status.fleet is not None:
        lines.append(fleet_line(status.fleet))
    return "\n".join(lines)


def fleet_line(fleet: dict) -> str:
    """The fleet worker's link: "fleet: connected as gw@node-3 to nats://10.0.0.5:4222, events through #812"."""
    # connected: the server of the cluster it is connected to; else every server it tries
    to = fleet.get("server") or ", ".join(fleet.get("servers") or [])
    line = f"fleet: {fleet.get('state')} as {fleet.get('host')} to {to}"
    line += f", events through #{fleet.get('published_through', 0)}"
    return line + (f" ({fleet['reason']})" if fleet.get("reason") else "")


def show(paths: Paths, timeout: float, as_json: bool) -> int:
    reply = request_or_exit(paths, GET_STATUS, timeout)
    unwritten = reply.get("events_recorded", 0) - reply.get("events_written", 0)
    if not as_json and unwritten > 0:
        # Right after a kill the restart's own events are a few milliseconds from being committed:
        # look again once before saying so, so a passing moment is not reported as a backlog.
        time.sleep(0.3)
        reply = request_or_exit(paths, GET_STATUS, timeout)
        unwritten = reply.get("events_recorded", 0) - reply.get("events_written", 0)
    code, why = exit_of(reply.status)
    history = history_of(paths, reply.get("store"))
    if as_json:
        print(status_json(reply.status, code, why, history))
    else:
        print(table(reply.status, reply.get("engine_commit"), unwritten))
        if history is not None:
            from pulse.store.historysize import summary_words
            print(summary_words(history))
        if dev_pid(paths) is not None:
            print(f"the engine runs staging ({paths.home / 'staging'}): pulsectl dev is running")
        rolled = rolled_back_note(paths)
        if rolled:
            print(rolled)
        from pulse.store.ballast import disk_full_note
        if note := disk_full_note(paths.home, paths.home / "ballast"):
            print(note)
    return code


def history_of(paths: Paths, bounds: dict | None = None) -> dict | None:
    """events.db's size against [store]'s bounds, and its archive (pulse.store.historysize), read from
    the home; None if events.db cannot be read (status says the rest all the same). `bounds`: the
    [store] table pulsed said it keeps; None (a pulsed older than that): read from the config file."""
    import sqlite3

    from pulse.store import connection, historysize
    if bounds is None:
        bounds = bounds_in_config(paths)
    try:
        conn = connection.open_readonly(paths.events_db)
    except (connection.StoreError, sqlite3.Error):
        return None
    try:
        return historysize.summary(conn, bounds)
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def bounds_in_config(paths: Paths) -> dict | None:
    """[store]'s bounds as the home's config file says them; None if it does not load (check-config
    says what is wrong; the sizes are still worth showing)."""
    from pulse.core import config as configmod
    from pulse.store import historysize
    try:
        return historysize.bounds(configmod.load(paths.config).store)
    except configmod.ConfigError:
        return None


def exit_of(status: controlmsgs.Status) -> tuple[StatusExit, list[str]]:
    """The exit code, and why not 0: a worker not running (3) before a guarded process failing (5)."""
    down = [f"worker {w.name} is {w.state}" for w in status.workers if w.state not in (WorkerState.RUNNING, LATE)]
    if down:
        return StatusExit.NOT_RUNNING, down
    failing = [f"process {p.name} is {p.state}" + (f": {p.why}" if p.why else "")
               for p in status.processes if p.state in PROCESS_FAILING]
    return (StatusExit.PROCESS_DOWN, failing) if failing else (StatusExit.RUNNING, [])


def rolled_back_note(paths: Paths) -> str | None:
    """After a rollback (survival's autoRollback most of all), staging still holding the rolled-back
    tree is said here, or the next promote would ship it again unnoticed."""
    if not (paths.engine / ".git").exists():
        return None
    from pulse.core.wire.eventtypes import EventType
    from pulse.store import connection, eventindex
    try:
        conn = connection.open_readonly(paths.events_db)
    except connection.StoreError:
        return None
    try:
        last = eventindex.last_type(conn, [EventType.PROMOTE, EventType.ROLLBACK])
    finally:
        conn.close()
    if last != EventType.ROLLBACK:
        return None      # as nearly always: said without loading the engine's repo (tarfile, git, ...)
    from pulse.engine import repo
    held = repo.rolled_back_in_staging(paths)
    if held is None:
        return None
    return (f"engine: {repo.rolled_back_words(held)}; `pulsectl engine` says more, and a promote "
            "refuses it without --again")


WIRE_TIMES = ("paused_until", "kept_at", "restored_at", "sampled_at", "last_trim_at", "until",
              "started_at", "at", "changed_at", "oldest_mtime")   # epoch seconds on the wire


def iso_times(item: dict) -> dict:
    """`item` with each of WIRE_TIMES it has as ISO 8601."""
    return {k: clock.iso(v) if k in WIRE_TIMES and isinstance(v, (int, float)) else v for k, v in item.items()}


def status_json(status: dict, code: int | None = None, why: list[str] | None = None,
                history: dict | None = None) -> str:
    """`status --json`: the document pulsed sent (as plain data), with the times of processes, their
    configs and the watched files (epoch seconds on the wire, which the page reads) as ISO 8601 like
    every other time in it, and the exit code with why it is not 0."""
    import json  # here: the text status does without it (json compiles six regular expressions as it loads)
    document = dict(status)
    document["processes"] = [iso_times({**p, "config": p.get("config") and iso_times(p["config"]),
                                        "last_exit": p.get("last_exit") and iso_times(p["last_exit"]),
                                        "health": p.get("health") and iso_times(p["health"])})
                             for p in document.get("processes", [])]
    if code is not None:
        document["exit"] = {"code": int(code), "why": why or []}
    document["files"] = [iso_times(f) for f in document.get("files", [])]
    document["fresh"] = [iso_times(f) for f in document.get("fresh", [])]
    document["dirs"] = [iso_times(d) for d in document.get("dirs", [])]
    if history is not None:          # events.db against [store]'s bounds, and what moved to the archive
        document["history"] = {k: clock.iso(v) if k.endswith("_ts") and isinstance(v, (int, float)) else v
                               for k, v in history.items()}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)
