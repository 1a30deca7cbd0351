"""`pulsectl process list|status|config|restart|stop|start|logs` themselves, click-free:
pulse.cli.processcmd declares them to click, pulse.cli.fastpath runs them without it."""

from __future__ import annotations

import os
import sys
import time

from pulse.cli.context import Context, echo, fail
from pulse.core import clock
from pulse.core.home import process_log
from pulse.core.states import EffectState
from pulse.core.wire import controlmsgs

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host); the wire's event types (~14 ms with msgspec's structs) not for `process list`.


def state_of(p) -> str:
    """One word for a process as status reports it (its fuller states: pulsectl status)."""
    if p.stopped:
        return "stopped"
    if p.paused_until is not None:
        return "paused"
    return {True: "alive", False: "dead", None: "unsampled"}[p.alive]


def shown(ctx: Context) -> list:
    """Every [[process]] as pulsed's status shows it (pulsed not answering: exit 4, saying so)."""
    return ctx.request(controlmsgs.GetStatus()).status.processes


def list_all(ctx: Context, as_json: bool) -> None:
    """Every [[process]]: its state and pid."""
    rows = shown(ctx)
    if as_json:
        import json  # only --json prints it
        for p in rows:
            echo(json.dumps({"name": p.name, "state": state_of(p), "pid": p.pid, "rss_mb": p.rss_mb}))
        return
    if not rows:
        echo("no [[process]] in config.toml")
        return
    width = max(len(p.name) for p in rows)
    for p in rows:
        echo(f"{p.name:<{width}}  {state_of(p):<9}  " + (f"pid {p.pid}" if p.pid else "-")
             + (f"  {p.rss_mb:g} MiB" if p.rss_mb is not None else ""))


SHORT_HASH = 12                 # hex digits of a sha256 shown beside a file


def named(ctx: Context, name: str):
    """The [[process]] named `name`; exit 2 saying what is wrong otherwise."""
    processes = ctx.config().process
    proc = next((p for p in processes if p.name == name), None)
    if proc is None:
        echo(f"pulsectl: no [[process]] named {name!r} in config.toml "
             f"(known: {', '.join(p.name for p in processes) or 'none'})", err=True)
        sys.exit(2)
    return proc


def configured(ctx: Context, name: str):
    """The [[process]] named `name`, with config files; exit 2 saying what is wrong otherwise."""
    proc = named(ctx, name)
    if not proc.config:
        fail(f"[[process]] {name!r} lists no config files: add config = [\"/path/to/file\"]", 2)
    return proc


def when(ts: float | None) -> str:
    return "never" if ts is None else clock.iso(ts, ms=False)


def short(digest: str | None) -> str:
    return "-" if not digest else digest[:SHORT_HASH]


def file_report(path: str, good: str | None, state: dict, objects_root) -> dict:
    """One config file, known good against current: its verdict and, when they differ, a diff summary
    (known good → current)."""
    from pulse.effects import configfiles
    from pulse.store import objects
    if good is None:
        verdict = "never kept (never restored)"
    elif "error" in state:
        verdict = f"unreadable: {state['error']}"
    elif state.get("missing"):
        verdict = "missing (known good kept)"
    else:
        verdict = "known good" if state.get("sha256") == good else "changed since known good"
    out = {"path": path, "verdict": verdict, "known_good": good, "current": state}
    if good is not None and state.get("sha256") != good and "error" not in state:
        try:
            before = objects.get(objects_root, good)
            if not state.get("missing"):
                with open(path, "rb") as current:
                    out["diff"] = configfiles.diff_summary("known good → current", before,
                                                           current.read(objects.MAX_FILE_BYTES))
        except (OSError, ValueError) as err:
            out["diff"] = f"no diff: {getattr(err, 'strerror', None) or err}"
    return out


def show(proc, known, restores, objects_root, as_json: bool) -> None:
    from pulse.store import objects
    files = [file_report(path, known.files.get(path), objects.file_state(path), objects_root) for path in proc.config]
    last = restores[-1] if restores else None
    if as_json:
        import json  # only --json prints it
        echo(json.dumps({"process": proc.name, "kept_at": known.kept_at, "pinned": known.pinned,
                         "files": files, "last_restore": None if last is None else
                         {"ts": last.ts, "type": last.type, **last.data}}, default=str))
        return
    by = "pinned by an operator" if known.pinned else "kept by survival"
    echo(f"{proc.name}: {len(proc.config)} config file(s); "
         + (f"known good {by} at {when(known.kept_at)}" if known.kept_at else "nothing kept as known good yet"))
    for f in files:
        state = f["current"]
        echo(f"  {f['path']}: {f['verdict']}")
        if f["known_good"]:
            echo(f"    known good  {short(f['known_good'])}")
        if "sha256" in state:
            echo(f"    current     {short(state['sha256'])}  {state['size']} bytes, changed {when(state['ctime'])}")
        elif state.get("missing"):
            echo("    current     missing")
        for line in (f.get("diff") or "").splitlines():
            echo(f"    {line}")
    if last is not None:
        outcome = last.type.removeprefix("effect-")
        echo(f"last restore: {when(last.ts)}, {outcome}" + (f": {last.data['error']}" if last.data.get("error") else ""))
        for f in last.data.get("files") or []:
            if f.get("restored"):
                replaced = (f"what it replaced is kept as {f.get('kept') or f['broken']}" if f.get("broken")
                            else "it was missing")
                echo(f"  {f['path']}: written back; {replaced}")


def config(ctx: Context, name: str, pin: bool, restore: bool, as_json: bool, wait: float) -> None:
    """NAME's config files: known good against current; --pin or --restore to act on them."""
    from pulse.cli.emitview import queue_effect
    from pulse.cli.eventsview import connect
    from pulse.core.wire import enginerpc
    from pulse.effects import configfiles
    from pulse.store import objects
    proc = configured(ctx, name)
    deadline_s = ctx.config().timings.effect_deadline_s
    if pin:
        sys.exit(queue_effect(ctx, enginerpc.Effect(kind=configfiles.KEEP, target=name, idempotent=True), deadline_s, wait))
    known, restores = configfiles.known_good_of(connect(ctx, "events.db"), name)
    if restore:
        files = {path: objects.ref(digest) for path, digest in sorted(known.files.items()) if path in proc.config}
        if not files:
            echo(f"pulsectl: nothing of {name} was kept as known good, so nothing can be restored "
                 "(Pulse never writes a file it did not keep); --pin keeps the current files", err=True)
            sys.exit(1)
        effect = enginerpc.Effect(kind=configfiles.RESTORE, target=name, params={"files": files, "why": "operator"})
        sys.exit(queue_effect(ctx, effect, deadline_s, wait))
    show(proc, known, restores, ctx.paths.objects, as_json)


# -- list, status --------------------------------------------------------------------------------------

def shown_one(ctx: Context, name: str):
    """`name` as pulsed's status shows it; exit 2 when pulsed runs without it (config.toml has it,
    but was not reloaded since)."""
    found = next((p for p in shown(ctx) if p.name == name), None)
    if found is None:
        echo(f"pulsectl: the running pulsed has no [[process]] {name!r} yet: `pulsectl reload` applies "
             "config.toml", err=True)
        sys.exit(2)
    return found


def status(ctx: Context, name: str, as_json: bool) -> None:
    """NAME: state, pid, its last exit and the end of its output. Exits 0 while it is alive, 3 if not."""
    from pulse.core.wire.eventmsgs import EventType
    from pulse.store import eventsdb
    proc = named(ctx, name)
    p = shown_one(ctx, name)
    conn = eventsdb.open_events(ctx.paths.events_db)
    try:
        exits = eventsdb.search_events(conn, types=[EventType.PROCESS_EXITED], target=name, limit=1)
    finally:
        conn.close()
    last = exits[0] if exits else None
    log_path = process_log(ctx.paths.home, name)
    out = {"name": name, "state": state_of(p), "pid": p.pid, "rss_mb": p.rss_mb, "log": str(log_path),
           "last_exit": None if last is None else {"at": clock.iso(last.ts), "pid": last.data.get("pid"),
                                                    "code": last.data.get("code"), "signal": last.data.get("signal")},
           "restart": proc.restart}
    if as_json:
        import json  # only --json prints it
        echo(json.dumps(out))
    else:
        echo(f"{name}: {out['state']}" + (f", pid {p.pid}" if p.pid else ""))
        if last is not None:
            how = f"signal {last.data.get('signal')}" if last.data.get("signal") else f"exit code {last.data.get('code')}"
            echo(f"last exit: pid {last.data.get('pid')}, {how}, at {clock.iso(last.ts, ms=False)}")
        echo(f"log: {log_path}")
        for line in read_tail(log_path, 5):
            echo(f"  {line}")
    sys.exit(0 if p.alive and not p.stopped else 3)


# -- restart, stop, start -------------------------------------------------------------------------------

def steer(ctx: Context, name: str, action: str, wait: float) -> dict | None:
    """The operator event (`action`, an eventmsgs.ProcessAction), then the effect (origin operator) that
    acts on it; its outcome within
    `wait`: the ack's data, or exit 1 saying why it failed or that it is still open."""
    from pulse.cli.emitview import await_effect
    from pulse.core import client
    from pulse.core.wire import doorbells
    from pulse.store import effectqueue, eventsdb
    conn = eventsdb.open_events(ctx.paths.events_db)
    try:
        effect = effectqueue.commit_process_action(conn, name, action, ctx.config().timings.effect_deadline_s, "pulsectl")
    finally:
        conn.close()
    client.ring(ctx.paths, "wake", doorbells.Wake("pulsectl", action))     # the tick folds the hold now
    client.ring(ctx.paths, "doorbell", doorbells.Doorbell("pulsectl"))
    if not wait:
        echo(f"{name}: {action} asked ({effect.id})")
        return None
    state = await_effect(ctx, effect.id, wait)
    if state is None:
        sys.exit(1)
    conn = eventsdb.open_events(ctx.paths.events_db)
    try:
        end = eventsdb.effect_end(conn, effect.id)
        why = effectqueue.effect_why(conn, effect.id)
    finally:
        conn.close()
    if state != EffectState.ACKED:
        fail(f"{name}: {action} {state}: {why or 'no reason recorded'} ({effect.id})")
    return end.data if end is not None else {}


def startable(ctx: Context, name: str):
    proc = named(ctx, name)
    if not proc.restart:
        echo(f"pulsectl: [[process]] {name!r} has no restart argv, so Pulse cannot start it: "
             "add restart = [\"/path/to/program\", ...]", err=True)
        sys.exit(2)
    return proc


def restart(ctx: Context, name: str, wait: float) -> None:
    """Restart NAME as survival does: stop its tree, then start it (never two copies); ends a stop."""
    from pulse.core.wire.eventmsgs import ProcessAction
    startable(ctx, name)
    done = steer(ctx, name, ProcessAction.RESTART, wait)
    if done is not None:
        echo(f"{name}: restarted, pid {done.get('pid')}" + stopped_words(done))


def stop(ctx: Context, name: str, wait: float) -> None:
    """Stop NAME (its whole tree) and keep it down, across restarts of pulsed, until `start`."""
    from pulse.core.wire.eventmsgs import ProcessAction
    named(ctx, name)
    done = steer(ctx, name, ProcessAction.STOP, wait)
    if done is not None:
        ran = done.get("stopped") or []
        echo(f"{name}: stopped" + (stopped_words(done) if ran else " (it was not running)")
             + f"; held down until `pulsectl process start {name}`")


def start(ctx: Context, name: str, wait: float) -> None:
    """Start NAME (after a stop, or when it is down); one already alive is left as it is."""
    from pulse.core.wire import eventmsgs
    from pulse.core.wire.eventmsgs import EventType, ProcessAction
    startable(ctx, name)
    p = shown_one(ctx, name)
    if p.alive:                  # started by hand meanwhile, or never stopped: left as it is, no longer held
        from pulse.store import eventsdb
        conn = eventsdb.open_events(ctx.paths.events_db)
        try:
            eventsdb.append_events(conn, [eventmsgs.now_event(EventType.OPERATOR, "pulsectl", name, action=ProcessAction.START)])
        finally:
            conn.close()
        echo(f"{name}: already running, pid {p.pid}" + ("; no longer held down" if p.stopped else ""))
        return
    done = steer(ctx, name, ProcessAction.START, wait)
    if done is not None:
        echo(f"{name}: started, pid {done.get('pid')}")


def stopped_words(done: dict) -> str:
    ran = done.get("stopped") or []
    if not ran:
        return ""
    killed = done.get("killed") or []
    return f" (stopped pid {', '.join(map(str, ran))}" + (f"; SIGKILL to {', '.join(map(str, killed))}" if killed else "") + ")"


# -- logs -----------------------------------------------------------------------------------------------

def log_files(path) -> list:
    """The log's rotated copies, oldest first, then the log itself (those that exist)."""
    from pulse.core import safepath
    from pulse.effects.copytruncate import numbered_copies
    try:
        parent, name = safepath.open_parent(str(path))
    except (OSError, safepath.Refused):
        return []
    try:
        copies = numbered_copies(parent, name)
    finally:
        os.close(parent.fd)
    return ([os.path.join(str(path.parent), copies[n]) for n in sorted(copies, reverse=True)]
            + ([str(path)] if path.exists() else []))


def read_lines(name: str, upto: int | None = None) -> list[str]:
    """Its lines (a gzipped copy decompressed); of the log itself, only its first `upto` bytes."""
    import gzip
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(name, "rb") as f:
            data = f.read() if upto is None else f.read(upto)
    except (OSError, EOFError):       # a copy being written, or one cut short: what it holds is lost to us
        return []
    return data.decode("utf-8", "replace").splitlines()


def read_tail(path, n: int, upto: int | None = None) -> list[str]:
    """The last `n` lines of the log (its first `upto` bytes: what a follower has not yet to print),
    reaching into its rotated copies when it holds fewer."""
    lines: list[str] = []
    for name in reversed(log_files(path)):
        lines = read_lines(name, upto if name == str(path) else None) + lines
        if len(lines) >= n:
            break
    return lines[-n:] if n > 0 else []


def logs(ctx: Context, name: str, follow: bool, lines: int) -> None:
    """NAME's own output, as its keeper kept it, across its restarts."""
    path = process_log(ctx.paths.home, name)
    if not log_files(path):
        if name not in [p.name for p in ctx.config().process]:
            named(ctx, name)
        if not follow:
            echo(f"pulsectl: {name} has no output kept yet ({path}: Pulse keeps the output of what it starts)",
                 err=True)
            sys.exit(1)
    f, pos = None, None
    if follow and path.exists():          # opened first: what is appended while the tail prints is followed
        f = open(path, "rb")
        pos = f.seek(0, 2)
    for line in read_tail(path, lines, upto=pos):
        echo(line)
    if follow:
        follow_log(path, f, pos or 0)


def follow_log(path, f, pos: int) -> None:
    """Print what is appended to `path` (open as `f` at `pos`, or not yet there) until interrupted;
    a rotation empties it (from its start again) or replaces it (reopened)."""
    try:
        while True:
            chunk = f.read(65536) if f is not None else b""
            if chunk:
                pos += len(chunk)
                echo(chunk.decode("utf-8", "replace"), nl=False)
                continue
            time.sleep(0.2)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            if f is None or st.st_ino != os.fstat(f.fileno()).st_ino:
                if f is not None:
                    f.close()
                f, pos = open(path, "rb"), 0
            elif st.st_size < pos:
                f.seek(0)
                pos = 0
    except KeyboardInterrupt:
        pass

