"""The keeper: the parent of each process that restart-process starts.

    python -m pulse.effects.keeper HOME NAME LOG [--user USER] -- ARGV...

Only a process's parent learns its exit code, and the executor that starts a [[process]] may be
restarted long before the process ends. So the executor starts this keeper instead (its own
session, outliving the executor and Pulse), which forks once (so the executor reaps its first
half at once and never holds a zombie), starts ARGV, and stays its parent:

- it reports {"pid", "since"} on its stdout once ARGV runs, and {"code", "signal", "tail"} when it
  exits (the executor reads both within its grace, then closes the pipe);
- ARGV's stdout and stderr are appended to LOG, between a line that says when it started and one
  that says how it ended, so a crash's own output is still there after the starts that follow;
  past LOG_MAX_BYTES the log is rotated as a [[watch.file]] is (gzipped copies LOG.1.gz, the
  newest, … LOG.<LOG_KEEP>.gz; pulse.effects.copytruncate), and its last TAIL_LINES lines are kept;
- when ARGV exits, it commits a `process-exited` event (target NAME: pid, code, signal, tail)
  to HOME's events.db and rings the tick: restart_exit_codes and stop_exit_codes are honoured
  from that fact, whichever executor started the process;
- SIGTERM, SIGINT and SIGHUP to the keeper are passed on to ARGV;
- with --user (the [[process]] `user`), ARGV runs as that account, with its groups.

Its title is "pulse: keep NAME (HOME)", so a `match` never takes it for the process it keeps,
and the executor finds what it keeps when it must stop it.
"""

from __future__ import annotations

import collections
import json
import os
import selectors
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

# Imports inside functions: a keeper started without the keepers' server is a fresh interpreter
# (python -m pulse.effects.keeper) on the way to starting a process: it imports what it needs when it
# needs it (the store, ~25-30 ms, only to record the exit; psutil and pwd only for --user).

TAIL_LINES = 20
LOG_MAX_BYTES = 8 * 1024 * 1024
LOG_KEEP = 3                    # gzipped copies of the log kept beside it when it is rotated
ROTATE_WITHIN_S = 30.0          # a rotation that takes longer leaves the log whole (copytruncate.rotate)
DRAIN_AFTER_EXIT_S = 0.2        # a daemonised grandchild may hold the pipe open: read this long, then stop
RECORD_TRIES_S = 30.0           # events.db locked or full: keep trying this long


def report(message: dict) -> None:
    try:
        os.write(1, (json.dumps(message) + "\n").encode())
    except OSError:
        pass                    # the executor stopped listening after its grace: that is fine


def main(argv: list[str]) -> int:
    home, name, log_path, *rest = argv
    user = None
    if rest[:1] == ["--user"] and len(rest) > 1:
        user, rest = rest[1], rest[2:]
    sep, *command = rest or [""]
    if sep != "--" or not command:
        print("usage: python -m pulse.effects.keeper HOME NAME LOG [--user USER] -- ARGV...", file=sys.stderr)
        return 2
    if os.fork() > 0:
        os._exit(0)             # the executor reaps this half now; the keeper lives on, reparented
    return keep(home, name, log_path, command, user=user)


def keep(home: str, name: str, log_path: str, command: list[str], env: dict | None = None,
         cwd: str | None = None, user: str | None = None) -> int:
    """Start `command` (as `user`, else as Pulse's own account) and keep it, reporting on fd 1, until
    it exits and its exit is recorded. The same whether this keeper was started on its own or forked
    by the keepers' server (pulse.effects.keepers), which gives the command's `env` and `cwd` here."""
    from pulse.core import guarded, procs
    procs.set_title(guarded.keeper_title(name, home))
    log = open_log(log_path)
    os.dup2(log.fileno(), 2)    # the keeper's own complaints land beside its process's output
    # An ignored SIGINT or SIGHUP (a worker ignores both) would stay ignored in ARGV across exec: the
    # defaults here, in the keeper, rather than in a pre-exec function, whose Python code between fork
    # and exec rules out vfork (a start then costs a fork of the keeper and waiting for its child).
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, cwd=cwd,
                                 stderr=subprocess.STDOUT, close_fds=True, **as_account(user))
    except (OSError, KeyError) as err:     # KeyError: no such account
        why = getattr(err, "strerror", None) or err
        log.write(f"[pulse] cannot start {name} ({command[0]!r}): {why}\n".encode())
        report({"code": 127, "signal": None, "tail": f"cannot start {command[0]!r}: {why}"})
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: _pass_on(child, signum))
    report({"pid": child.pid, "since": _started(child.pid)})
    log.write(f"[pulse] {name} started, pid {child.pid}, at {_now()}\n".encode())
    tail = _copy_output(child, log, log_path)
    code = child.wait()
    ended = {"pid": child.pid, "code": code if code >= 0 else None,
             "signal": signal.Signals(-code).name if code < 0 else None, "tail": tail}
    how = f"killed by {ended['signal']}" if code < 0 else f"exit code {code}"
    log.write(f"[pulse] {name} (pid {child.pid}) ended at {_now()}: {how}\n".encode())
    report(ended)
    _record(home, name, ended)
    return 0


def open_log(path: str):
    """The log, for appending (never truncated at a start: the last crash's output stays); a link
    placed at its path is refused, not followed. Read-write: a rotation reads what it copies."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "wb", buffering=0)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _rotate(log, log_path: str) -> None:
    """Rotate the log (only the keeper writes it, so copy-then-truncate loses nothing); a rotation
    that fails leaves it whole, to grow, rather than losing what it holds."""
    from pulse.core import safepath
    from pulse.effects import copytruncate
    try:
        parent, name = safepath.open_parent(log_path)
        try:
            copytruncate.rotate(parent, name, log.fileno(), LOG_KEEP, time.monotonic() + ROTATE_WITHIN_S)
        finally:
            os.close(parent.fd)
    except (OSError, copytruncate.TooSlow, safepath.Refused) as err:
        print(f"[pulse] the log {log_path} was not rotated: {err}", file=sys.stderr)


def as_account(user: str | None) -> dict:
    """Popen's arguments that start a process as `user` with its groups ({} for Pulse's own)."""
    if user is None:
        return {}
    import pwd
    account = pwd.getpwnam(user)         # KeyError: no such account, said as a start that failed
    return {"user": account.pw_uid, "group": account.pw_gid,
            "extra_groups": os.getgrouplist(account.pw_name, account.pw_gid)}


def _pass_on(child: subprocess.Popen, signum: int) -> None:
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass


def _started(pid: int) -> float | None:
    try:
        import psutil
        return psutil.Process(pid).create_time()
    except Exception:           # gone already: its exit says the rest
        return None


def _copy_output(child: subprocess.Popen, log, log_path: str) -> str:
    """Copy the child's output to the log until it exits (and a moment after); its last lines."""
    lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    partial, written = b"", os.fstat(log.fileno()).st_size
    fd = child.stdout.fileno()
    pidfd = os.pidfd_open(child.pid)
    exited_at = None
    # Done at the exit once the pipe is at its end (the usual case: the exit closed it, and the exit's
    # record must not wait), else DRAIN_AFTER_EXIT_S after the exit, for what a grandchild holds.
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ, "out")
        sel.register(pidfd, selectors.EVENT_READ, "exit")
        drained = False
        while not (drained and exited_at is not None):
            wait = None if exited_at is None else DRAIN_AFTER_EXIT_S - (time.monotonic() - exited_at)
            if wait is not None and wait <= 0:
                break
            events = sel.select(wait)
            if not events and exited_at is not None:
                break
            for key, _ in events:
                if key.data == "exit":
                    exited_at = time.monotonic()
                    sel.unregister(pidfd)
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    drained = True
                    if exited_at is None:
                        child.wait()   # the pipe ended first: its exit is at most a moment away
                        exited_at = time.monotonic()
                    continue
                if written + len(chunk) > LOG_MAX_BYTES:
                    _rotate(log, log_path)
                    written = os.fstat(log.fileno()).st_size
                log.write(chunk)
                written += len(chunk)
                *done, partial = (partial + chunk).split(b"\n")
                lines.extend(line.decode("utf-8", "replace").rstrip() for line in done if line.strip())
    os.close(pidfd)
    if partial.strip():
        lines.append(partial.decode("utf-8", "replace").rstrip())
    return "\n".join(lines)


def _record(home: str, name: str, ended: dict) -> None:
    """The exit as a fact in events.db, then a wake for the tick: processWatchdog decides from it."""
    from pulse.core import client
    from pulse.core import home as homes
    from pulse.core.wire import doorbells, eventmsgs
    from pulse.store import connection, eventsdb
    deadline = time.monotonic() + RECORD_TRIES_S
    while True:
        if not (Path(home) / "events.db").exists():
            print(f"keeper of {name}: {home} has no events.db any more; its exit ({ended}) is not recorded",
                  file=sys.stderr)
            return
        try:
            # NORMAL, as events.db's writers but the executor's claims: a commit survives any process's
            # crash, and the power cut that could take it ends the process and its restart's need too
            # (an fsync here, several ms on a busy disk, was on the path of every restart)
            conn = eventsdb.open_events(Path(home) / "events.db")
            try:
                eventsdb.append_events(conn, [eventmsgs.now_event(eventmsgs.EventType.PROCESS_EXITED, "keeper", name, ended)])
            finally:
                conn.close()
            break
        except (sqlite3.Error, connection.StoreError, OSError) as err:
            if time.monotonic() >= deadline:
                print(f"keeper of {name}: its exit ({ended}) was not recorded: {err}", file=sys.stderr)
                return
            time.sleep(0.5)
    # Sent before ring returns (it terminates a context of its own), so the os._exit by which a keeper
    # forked by the keepers' server leaves drops nothing (the tick would then decide EXIT_FACT_WAIT_S late).
    client.ring(homes.Paths.for_client(Path(home)), "wake", doorbells.Wake("keeper", f"process-exited:{name}"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
