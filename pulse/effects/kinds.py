"""What the built-in kinds that start processes do (exec, restart-process, signal, noop), and the
process primitives every kind shares. Which kinds exist, their params and hooks: pulse.effects.registry.

An executor is `run(effect, ctx) -> dict`: the dict is the `effect-acked` event's
data; raising `EffectFailed(reason, error, **data)` records `effect-failed`
instead. Executors run in the executor process's worker threads, never in its
main loop, so they may block (up to the effect's timeout).

Processes. `exec` and `notify` commands run in their own process group, which is
recorded in the claim (ctx.started) before the executor waits on them, and die
with the thread that started them (PR_SET_PDEATHSIG): when the executor dies,
they die, and its successor kills whatever is left of the group before it
settles the effect. After the leader exits, what is left of its group is killed
too: an `exec` effect does not leave processes behind (start daemons with
restart-process). Children get SIGINT and SIGHUP back at their defaults (the
worker ignores both, and ignored signals survive exec).

restart-process. A restart stops what the process is now, waits for it to be gone, then starts
it: never two copies (a frozen gateway kept its lock and port, and each new copy died at start).
Stop: the [[process]] `stop` argv if given, else SIGTERM (and SIGCONT, for a stopped one) to every
process found by its pidfile or match, and to what its keeper keeps, with their children; SIGKILL
after `stop_timeout_s`. Start: the `restart` argv, under a keeper (pulse.effects.keeper) in its own
session, so it outlives the executor and Pulse and its exit is recorded whoever restarts later; the
keeper is forked by the home's keepers' server (pulse.effects.keepers), or, when none answers yet,
started in an interpreter of its own while a server is started for the next time;
its output is appended to <home>/logs/process-<name>.log (rotated by size: pulse.effects.keeper).
Both run in the process's `cwd`, by default the home (where config.toml is). The effect waits a short grace (params
`grace_s`, else the [[process]] `start_grace_s`, default 1 s): exited by then, its exit code
decides acked or failed, the failure naming
the process's own last lines; still running, it is acked {"pid", "since", "log", ...}. A one-shot
argv (`systemctl restart gw`) is acked on its exit 0 the same way.
Under systemd (INVOCATION_ID set) a process started from a raw argv would land in Pulse's cgroup
and die with Pulse's next restart, so when `systemd-run` is on PATH the keeper runs as
`systemd-run [--user] --scope --collect --unit=...`: a transient scope outside Pulse's cgroup.
--user when Pulse does not run as root: a user unit's processes belong to the user's manager.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import re
import selectors
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import msgspec
import psutil

from pulse.core import guarded, procs
from pulse.core.config import ExecutorConfig, Process
from pulse.core.home import Paths, process_log
from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import EventType, ProcessAction
from pulse.effects import keeper, keepers
from pulse.store import connection, eventsdb, objects

TAIL_BYTES = 2048                            # output kept in the event; the rest is in objects/
MAX_OUTPUT = 16 * 1024 * 1024                # output beyond this is counted, not kept
DRAIN_AFTER_EXIT_S = 0.2                     # a background child may hold the pipe open: read this long, then stop
KEEPER_START_S = 10.0                        # the keeper says it started the process within this
END_GROUP_WAIT_S = 2.0
DEFAULT_SIGNAL = "SIGTERM"
SCRUBBED_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "PULSE_TEST_INJECT")   # pulsed's, not theirs

SOURCE = "executor"

log = logging.getLogger("pulse.executor")


class EffectFailed(Exception):
    """The effect ran (or could not) and failed: `reason` is a stable code, `error` says what happened.

    What the effect asked for, or the host it acts on, can be wrong (bad params, a path it may not
    write, pulsed not answering): that is an EffectFailed, whose reason names what is wrong. Any other
    exception a kind raises is a bug in Pulse: the executor logs its traceback and fails the effect
    with reason `error`."""

    def __init__(self, reason: str, error: str, **data):
        super().__init__(error)
        self.reason, self.error, self.data = reason, error, data

    def __reduce__(self):       # whole across a pickle: a failure met with another account's rights (safepath)
        return _rebuilt_failure, (self.reason, self.error, self.data)


def _rebuilt_failure(reason: str, error: str, data: dict) -> EffectFailed:
    return EffectFailed(reason, error, **data)


# An OSError from acting on the host, by what is wrong with the host or the path the effect named.
OS_ERROR_REASONS = {
    errno.EACCES: "not-permitted", errno.EPERM: "not-permitted", errno.EROFS: "not-permitted",
    errno.ENOSPC: "no-space", errno.EDQUOT: "no-space",
    errno.ENOENT: "bad-path", errno.ENOTDIR: "bad-path", errno.EISDIR: "bad-path", errno.ELOOP: "bad-path",
    errno.ENAMETOOLONG: "bad-path",
}


def os_failure(what: str, err: OSError, **data) -> EffectFailed:
    """`err`, met while doing `what`, as the failure of the effect (never a bug of Pulse's): reason
    not-permitted, no-space, bad-path, else io; the error names the path and what the system said."""
    where = f" {err.filename}" if err.filename else ""
    return EffectFailed(OS_ERROR_REASONS.get(err.errno, "io"), f"{what}:{where}: {err.strerror or err}",
                        path=None if err.filename is None else str(err.filename), **data)


@dataclass
class EffectContext:
    """What an executor may use besides its effect."""
    config: ExecutorConfig
    objects: Path
    timeout_s: float                                            # this effect may run this long
    paths: Paths | None = None                                  # the home, for the repairs that act on it
    effect_id: str | None = None                                # marks the processes it starts (EFFECT_MARK)
    starting: Callable[[], None] = lambda: None                 # record in the claim that a process is being started
    started: Callable[[int], None] = lambda pgid: None          # record its process group in the claim
    # An effect that acts in steps records each step done as an event about it, committed at once,
    # and skips the steps recorded when it runs again (a retry, or after its executor died): a
    # notification is sent once per channel that took it.
    record: Callable[[str, dict], None] = lambda type, data: None     # append an event of `type` about it
    recorded: Callable[[str], list[dict]] = lambda type: []            # the data of those appended so far
    # The gate this executor serves, for the agent runs it starts (pulse.gate.runs.RunGate): a run's
    # pass to it, and its verdict on the run. None outside the executor: no run can start there.
    gate: Any = None
    deadline: float = field(init=False)                         # time.monotonic() by which it must be done

    def __post_init__(self):
        self.deadline = time.monotonic() + self.timeout_s

    @property
    def home(self) -> Path:
        """Pulse's home: objects/ lies in it when no paths were given."""
        return self.paths.home if self.paths is not None else self.objects.parent


def effect_timeout(effect: Effect, default_s: float) -> float:
    """params.timeout_s, at most effect_timeout_s ("one effect may run this long")."""
    asked = effect.params.get("timeout_s")
    if isinstance(asked, (int, float)) and not isinstance(asked, bool) and asked > 0:
        return min(float(asked), default_s)
    return default_s


# -- processes -----------------------------------------------------------------------------------------

procs.libc()   # loaded now: the pre-exec functions run between fork and exec, where nothing may be imported


def child_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env.update(extra or {})
    return env


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_process(argv: Sequence[str], ctx: EffectContext, *, env: dict | None = None, cwd: str | None = None,
                stdin_data: bytes | None = None, timeout_s: float | None = None,
                stderr: bytearray | None = None, account: tuple[int, int] | None = None,
                extra_groups: Sequence[int] = (),
                preexec: Callable[[], None] | None = None,
                on_output: Callable[[], None] | None = None) -> tuple[int | None, bytes, bool]:
    """Run argv in its own process group; (exit code or None, output, timed out).

    stderr is merged into the output unless a `stderr` buffer is given: then it is read into
    that, apart, bounded like the output (an agent's adapter reads the two apart: the result
    on stdout, the CLI's own complaint on stderr).

    `account` (uid, gid): the child runs as that account, with `extra_groups` only (none for an
    [[agent]] with `user`); switching needs root or CAP_SETUID and CAP_SETGID.

    `preexec`: run in the child before it execs, after the switch (an agent run joins its cgroup
    and sets its rlimits there, so nothing it starts is ever outside them).

    `on_output`: called whenever output arrives (an agent run's stall watch: output is a sign of life).

    That a process is being started is recorded (ctx.starting) before the fork, and its group
    (ctx.started) before waiting: the child may run before Popen returns. It carries the effect's id
    (EFFECT_MARK), by which a successor finds what it left when the group was never recorded. At the
    timeout, or once the leader has exited, whatever is left of the group is killed; the leader is
    reaped only after that, so until then the group id cannot have been reused."""
    timeout_s = ctx.timeout_s if timeout_s is None else timeout_s
    deadline = min(ctx.deadline, time.monotonic() + timeout_s)
    switch = {"user": account[0], "group": account[1], "extra_groups": list(extra_groups)} if account is not None else {}
    setup = procs.child_dies_with_parent if preexec is None else (lambda: (procs.child_dies_with_parent(), preexec()))
    ctx.starting()
    marked = {**(env or {}), EFFECT_MARK: ctx.effect_id} if ctx.effect_id is not None else env
    try:
        proc = subprocess.Popen(list(argv), env=child_env(marked), cwd=cwd, process_group=0, close_fds=True, **switch,
                                stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if stderr is None else subprocess.PIPE,
                                preexec_fn=setup)
    except FileNotFoundError as err:
        if err.filename == cwd:
            raise EffectFailed("spawn", f"cannot start {argv[0]!r}: no directory {cwd}") from None
        # no retry can install it: a reason of its own, which an agent's task gives up on at once
        raise EffectFailed("not-installed", f"cannot start {argv[0]!r}: no such program"
                           + ("" if "/" in argv[0] else " on the PATH Pulse runs with")) from None
    except OSError as err:
        raise EffectFailed("spawn", f"cannot start {argv[0]!r}: {err.strerror or err}") from None
    except subprocess.SubprocessError as err:     # the pre-exec failed: it did not start
        raise EffectFailed("spawn", f"cannot start {argv[0]!r}: {err}") from None
    try:
        ctx.started(proc.pid)
        if stdin_data is not None:
            try:
                proc.stdin.write(stdin_data)   # small (a notification): fits the pipe
                proc.stdin.close()
            except BrokenPipeError:
                pass
        output, timed_out = _collect(proc, deadline, stderr, on_output)
    finally:
        _kill_group(proc.pid)        # leftovers, or everything at the timeout
        proc.wait()
        proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
    return (None if timed_out else proc.returncode), output, timed_out


def _collect(proc: subprocess.Popen, deadline: float, err: bytearray | None = None,
             on_output: Callable[[], None] | None = None) -> tuple[bytes, bool]:
    """The output (stderr merged, or read into `err`), and whether the deadline came first.

    Done when the leader has exited (its pidfd says so, without reaping it) and the
    pipes reached EOF, or DRAIN_AFTER_EXIT_S after the exit if a background child
    still holds a pipe open."""
    out = bytearray()
    buffers = {proc.stdout.fileno(): out}
    if err is not None:
        buffers[proc.stderr.fileno()] = err
    for fd in buffers:
        os.set_blocking(fd, False)
    pidfd = os.pidfd_open(proc.pid)
    exited_at = None
    try:
        with selectors.DefaultSelector() as sel:
            for fd in buffers:
                sel.register(fd, selectors.EVENT_READ, "output")
            sel.register(pidfd, selectors.EVENT_READ, "exit")
            open_fds = set(buffers)
            while True:
                now = time.monotonic()
                if exited_at is not None and (not open_fds or now - exited_at >= DRAIN_AFTER_EXIT_S):
                    return bytes(out), False
                if now >= deadline:
                    return bytes(out), True
                wait = deadline - now if exited_at is None else min(deadline, exited_at + DRAIN_AFTER_EXIT_S) - now
                for key, _ in sel.select(wait):
                    if key.data == "exit":
                        exited_at = time.monotonic()
                        sel.unregister(pidfd)
                        continue
                    fd, buf = key.fd, buffers[key.fd]
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if chunk:
                        buf += chunk[:max(0, MAX_OUTPUT - len(buf))]
                        if on_output is not None:
                            on_output()
                    else:
                        open_fds.discard(fd)
                        sel.unregister(fd)
    finally:
        os.close(pidfd)


def tail(output: bytes) -> str:
    return output[-TAIL_BYTES:].decode("utf-8", "replace")


def store_output(root: Path, output: bytes) -> str:
    return objects.put(root, output)


def group_members(pgid: int, not_before: float) -> list[psutil.Process]:
    """Live processes of group `pgid` started at or after `not_before` (wall time).

    Older ones cannot be the effect's: the group id was reused."""
    out = []
    for proc, info in guarded.scan(["create_time", "status"]):     # not process_iter: see scan
        try:
            if (info["status"] != psutil.STATUS_ZOMBIE and (info["create_time"] or 0) >= not_before
                    and os.getpgid(proc.pid) == pgid):
                out.append(proc)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def end_group(pgid: int, not_before: float, wait_s: float = END_GROUP_WAIT_S) -> bool:
    """SIGKILL what is left of an effect's process group and await it; True once none is alive."""
    members = group_members(pgid, not_before)
    _signal_all(members, signal.SIGKILL)
    return not _wait_gone(members, wait_s)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# -- configured processes ------------------------------------------------------------------------------

def configured_process(config: ExecutorConfig, name: str | None) -> Process:
    for proc in config.process:
        if proc.name == name:
            return proc
    raise EffectFailed("bad-params", f"{name!r} is not a configured [[process]]")


def find_processes(process: Process, home: Path | None = None) -> list[psutil.Process]:
    """The running processes of a configured process: by its pidfile, or its match over the command line."""
    return guarded.find(process, home)[0]


def process_trees(roots: Sequence[psutil.Process]) -> list[psutil.Process]:
    """`roots` and all their descendants, each once."""
    seen: dict[int, psutil.Process] = {}
    for root in roots:
        for proc in [root, *_children(root)]:
            seen.setdefault(proc.pid, proc)
    return list(seen.values())


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _signal_all(victims: Sequence[psutil.Process], *signums: int) -> None:
    for proc in victims:
        for signum in signums:
            try:
                proc.send_signal(signum)    # psutil checks the pid still names the process it found
            except psutil.Error:
                pass


def stop_process(process: Process, ctx: EffectContext, home: Path) -> dict:
    """Stop what `process` is now (found, and kept by its keeper), and wait until it is gone:
    its `stop` argv, else SIGTERM and SIGCONT to each tree; SIGKILL after stop_timeout_s.
    {} when nothing runs; EffectFailed ("stop") if something outlives SIGKILL."""
    table = list(guarded.cmdlines())    # one look at every process serves both questions
    roots = {p.pid: p for p in [*guarded.find(process, home, table)[0], *guarded.kept(process.name, home, table)]}
    victims = process_trees(list(roots.values()))
    if not victims:
        return {}
    done: dict = {"stopped": sorted(roots)}
    if process.stop:
        code, output, timed_out = run_process(process.stop, ctx, env=process.env, cwd=process_cwd(process, home),
                                              timeout_s=process.stop_timeout_s)
        done["stop"] = {"code": code, "tail": tail(output)[-500:], "timed_out": timed_out}
    else:
        _signal_all(victims, signal.SIGTERM, signal.SIGCONT)
    alive = _wait_gone(victims, process.stop_timeout_s)
    if alive:
        _signal_all(alive, signal.SIGKILL)
        done["killed"] = sorted(p.pid for p in alive)
        alive = _wait_gone(alive, END_GROUP_WAIT_S)
    if alive:
        raise EffectFailed("stop", f"{process.name!r}: pid {', '.join(str(p.pid) for p in alive)} still runs "
                           "after SIGKILL; not starting a second copy", **done)
    return done


def _wait_gone(victims: Sequence[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until none of `victims` runs (a zombie has died: its parent may never reap it, and
    psutil's wait_procs would wait on it); those still running at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in victims if _alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)


RUN_MARK = "PULSE_RUN"    # in the environment of every process an agent run starts: the run's effect id
EFFECT_MARK = "PULSE_EFFECT"  # ... and of every process an effect starts (run_process): the effect's id


def stop_marked(run: str, timeout_s: float = 5.0, mark: str = RUN_MARK) -> int:
    """Kill every process that carries `mark`=`run` in its environment, and wait until it is gone:
    what a run left behind outside its process group (setsid, a double fork) once the run has ended,
    or what an effect left when its executor died before it recorded the group (EFFECT_MARK). How
    many there were. (A process that scrubbed its environment as well is out of reach here; the
    run's own account, [[agent]] user, is the boundary for that.)"""
    mine = os.getpid()
    marked = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == mine:
            continue
        try:
            if proc.environ().get(mark) == run:
                marked.append(proc)
        except psutil.Error:             # gone, a zombie, or another user's
            continue
    _signal_all(marked, signal.SIGKILL)
    left = _wait_gone(marked, timeout_s)
    if left:
        raise EffectFailed("stop", f"{len(left)} process(es) of run {run} outlived SIGKILL: "
                                   + ", ".join(str(p.pid) for p in left))
    return len(marked)


def process_cwd(process: Process, home: Path) -> str:
    """Where a process's restart and stop run: its `cwd` (relative: to the home), else the home,
    so `restart = ["python3", "server.py"]` finds server.py beside config.toml, not in /."""
    return str(home / process.cwd) if process.cwd else str(home)


def outside_pulse(argv: Sequence[str], unit: str, environ: dict, systemd_run: str | None, uid: int) -> list[str]:
    """argv, or under systemd its `systemd-run --scope` form, so it does not die with Pulse's cgroup."""
    if not environ.get("INVOCATION_ID") or not systemd_run:
        return list(argv)
    return [systemd_run, *([] if uid == 0 else ["--user"]), "--scope", "--collect", "--quiet",
            f"--unit={unit}", "--", *argv]


def unit_name(process: str, effect_id: str) -> str:
    return "pulse-restart-" + re.sub(r"[^A-Za-z0-9:_.-]", "-", process) + "-" + effect_id[:8]


# -- the executors ----------------------------------------------------------------------------------------

def run_noop(effect: Effect, ctx: EffectContext) -> dict:
    return {}


def run_exec(effect: Effect, ctx: EffectContext) -> dict:
    params = effect.params            # checked against registry.ExecParams before the claim
    code, output, timed_out = run_process(params["argv"], ctx, env=params.get("env"), cwd=params.get("cwd"))
    data = {"code": code, "tail": tail(output), "output": store_output(ctx.objects, output), "bytes": len(output)}
    if timed_out:
        raise EffectFailed("timeout", f"timed out after {ctx.timeout_s:g}s; its process group was killed", **data)
    if code != 0:
        what = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        raise EffectFailed("exit", what, **data)
    return data


def run_on_crash_loop(effect: Effect, ctx: EffectContext) -> dict:
    """A [[process]]'s on_crash_loop argv, once: as the process's `user` (with that account's groups,
    as its keeper starts it), in its cwd, with its env. Acked on exit 0; the event has the code and
    the last of its output either way (the whole output is in objects/)."""
    process = configured_process(ctx.config, effect.target)
    if not process.on_crash_loop:
        raise EffectFailed("bad-params", f"[[process]] {process.name!r} has no on_crash_loop argv")
    switch = keeper.as_account(process.user) if process.user is not None else {}
    code, output, timed_out = run_process(
        process.on_crash_loop, ctx, env=process.env, cwd=process_cwd(process, ctx.home),
        account=(switch["user"], switch["group"]) if switch else None, extra_groups=switch.get("extra_groups", ()))
    data = {"argv": list(process.on_crash_loop), "user": process.user, "code": code, "tail": tail(output),
            "output": store_output(ctx.objects, output), "bytes": len(output)}
    if timed_out:
        raise EffectFailed("timeout", f"on_crash_loop of {process.name!r} timed out after {ctx.timeout_s:g}s; "
                           "its process group was killed", **data)
    if code != 0:
        what = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        raise EffectFailed("exit", f"on_crash_loop of {process.name!r}: {what}", **data)
    return data


_steering = threading.Lock()
_steered: dict[str, threading.Lock] = {}


def steering(name: str) -> threading.Lock:
    """The lock one process is stopped or restarted under in this executor: a survival restart and an
    operator's stop of the same process run one after the other, never interleaved (two copies)."""
    with _steering:
        return _steered.setdefault(name, threading.Lock())


def run_restart(effect: Effect, ctx: EffectContext) -> dict:
    with steering(str(effect.target)):
        return _restart(effect, ctx)


def run_stop(effect: Effect, ctx: EffectContext) -> dict:
    """Stop a process as a restart stops it (its whole tree) and start nothing: an operator's
    `process stop`, or a [[process]] a reload took out (its table, as it was, in params.definition:
    honoured only from survival or an operator, and only for a name no longer configured)."""
    try:
        process = configured_process(ctx.config, effect.target)
    except EffectFailed:
        definition = effect.params.get("definition")
        if definition is None or effect.origin not in ("survival", "operator"):
            raise
        try:
            process = msgspec.convert({**definition, "name": effect.target}, Process)
        except msgspec.ValidationError as err:
            raise EffectFailed("bad-params", f"definition: {err}") from None
    with steering(process.name):
        done = stop_process(process, ctx, ctx.home)
    return done or {"stopped": []}


def held_down(events_db: Path, name: str) -> bool:
    """An operator's last word on the process is process-stop: it stays down until they start it."""
    try:
        conn = connection.open_readonly(events_db)
    except (connection.StoreError, sqlite3.Error, OSError):
        return False             # no history to read (a bare executor in a test): nothing holds it
    try:
        for ev in eventsdb.search_events(conn, types=[EventType.OPERATOR], target=name, limit=50):
            if ev.data.get("action") in tuple(ProcessAction):
                return ev.data["action"] == ProcessAction.STOP
    finally:
        conn.close()
    return False


def _restart(effect: Effect, ctx: EffectContext) -> dict:
    process = configured_process(ctx.config, effect.target)
    if not process.restart:
        raise EffectFailed("bad-params", f"[[process]] {process.name!r} has no restart argv")
    if effect.origin != "operator" and ctx.paths is not None and held_down(ctx.paths.events_db, process.name):
        # queued before the operator's stop was folded: the stop wins, never a copy started behind it
        raise EffectFailed("held", f"{process.name!r} was stopped by an operator: not restarted until "
                                   f"`pulsectl process start {process.name}`")
    home = ctx.home
    stopped = stop_process(process, ctx, home)
    log_path = process_log(home, process.name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    grace = effect.params.get("grace_s", process.start_grace_s)
    grace = min(float(grace) if isinstance(grace, (int, float)) else process.start_grace_s, ctx.timeout_s)
    started, ended, refused = None, None, True
    if ctx.paths is not None:
        conn = keepers.ask(str(ctx.paths.keepers_socket), {
            "version": keepers_version(), "home": str(home), "name": process.name, "log": str(log_path),
            "argv": list(process.restart), "env": child_env(process.env), "cwd": process_cwd(process, home),
            "user": process.user})
        if conn is None:
            _start_keepers(ctx.paths, home)
        else:
            with conn:
                started, ended, refused = _keeper_reports(conn.fileno(), grace)
    if refused:                       # no server (or one of other code): a keeper of its own, as before
        started, ended = _start_own_keeper(process, home, log_path, effect, grace)
    data = {"argv": list(process.restart), "log": str(log_path), **stopped}
    if started is None and ended is None:
        raise EffectFailed("spawn", f"restart of {process.name!r}: its keeper did not start it", **data)
    if ended is None:
        return {**data, "detached": True, "pid": started["pid"], "since": started.get("since")}
    code, said = ended.get("code"), ended.get("tail") or ""
    data.update(code=code, pid=ended.get("pid"), tail=said[-TAIL_BYTES:])
    if code is not None and code in process.restart_exit_codes:
        return {**data, "asked_restart": True}   # it started, then asked again: its exit fact answers it
    if code != 0:
        what = f"killed by {ended.get('signal')}" if code is None else f"exit code {code}"
        last = " | ".join(said.splitlines()[-3:])
        raise EffectFailed("exit", f"restart of {process.name!r}: {what}" + (f": {last}" if last else ""), **data)
    return data


def _start_own_keeper(process: Process, home: Path, log_path: Path, effect: Effect,
                      grace: float) -> tuple[dict | None, dict | None]:
    """A keeper in a fresh interpreter (no keepers' server answered): what it reports within grace."""
    keeper = [sys.executable, "-m", guarded.KEEPER_MODULE, str(home), process.name, str(log_path),
              *(["--user", process.user] if process.user is not None else []), "--", *process.restart]
    argv = outside_pulse(keeper, unit_name(process.name, effect.id), dict(os.environ),
                         shutil.which("systemd-run"), os.getuid())
    try:
        launcher = subprocess.Popen(argv, env=child_env(process.env), cwd=process_cwd(process, home),
                                    start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, close_fds=True, preexec_fn=procs.child_signal_defaults)
    except OSError as err:
        raise EffectFailed("spawn", f"cannot start {argv[0]!r}: {err.strerror or err}") from None
    try:
        started, ended, _ = _keeper_reports(launcher.stdout.fileno(), grace)
    finally:
        launcher.stdout.close()
        launcher.wait()                 # its first half exits at once: the keeper lives on, reparented
    return started, ended


@functools.cache
def keepers_version() -> str:
    return keepers.version()


def _start_keepers(paths: Paths, home: Path) -> None:
    """Start this home's keepers' server for the starts to come (outside Pulse's cgroup under
    systemd, as a keeper); a second one started at the same time ends at once (its lock)."""
    argv = outside_pulse(keepers.server_argv(str(home), str(paths.keepers_socket)), "pulse-keepers-"
                         + os.urandom(4).hex(), dict(os.environ), shutil.which("systemd-run"), os.getuid())
    try:
        subprocess.run(argv, env=child_env({}), cwd="/", start_new_session=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True, timeout=KEEPER_START_S,
                       preexec_fn=procs.child_signal_defaults)   # its first half exits at once
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("could not start the keepers' server: %s", err)


def _keeper_reports(fd: int, grace: float) -> tuple[dict | None, dict | None, bool]:
    """What the keeper says within `grace` after the process started: (started, ended, refused:
    the keepers' server said no, so nothing was started)."""
    started = ended = None
    buf = b""
    deadline = time.monotonic() + max(grace, 0.0)
    start_deadline = time.monotonic() + KEEPER_START_S
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while ended is None:
            now = time.monotonic()
            until = start_deadline if started is None else deadline
            if now >= until or not sel.select(until - now):
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            *lines, buf = (buf + chunk).split(b"\n")
            for line in lines:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if "refused" in message and started is None:
                    return None, None, True
                if "code" in message:
                    ended = message
                elif "pid" in message:
                    started, deadline = message, time.monotonic() + max(grace, 0.0)
    return started, ended, False


def run_signal(effect: Effect, ctx: EffectContext) -> dict:
    process = configured_process(ctx.config, effect.target)
    name = effect.params.get("signal", DEFAULT_SIGNAL)
    try:
        signum = signal.Signals[name] if isinstance(name, str) else None
    except KeyError:
        signum = None
    if signum is None:
        raise EffectFailed("bad-params", f"unknown signal {name!r}")
    found = find_processes(process, ctx.home)
    if not found:
        raise EffectFailed("not-running", f"{process.name!r} is not running")
    sent = []
    for proc in found:
        try:
            proc.send_signal(signum)   # psutil checks the pid still names the process it found
            sent.append(proc.pid)
        except psutil.Error:
            pass
    if not sent:
        raise EffectFailed("not-running", f"{process.name!r} exited before the signal")
    return {"signal": signum.name, "pids": sent}
