"""The worker harness: what every worker process does around its own loop.

A worker is started by the forkserver, which calls `run()`. The harness
  1. makes the process a good child: dies with its parent, ignores SIGINT (Ctrl-C
     reaches the whole process group; pulsed decides), stops cleanly on SIGTERM,
     dumps its main thread's traceback on SIGABRT (faulthandler);
  2. opens the worker (its databases and sockets), then says Ready;
  3. runs one loop: poll the worker's sockets, run its timers, and heartbeat to
     pulsed from this loop, never from a thread, so a worker stuck in its own
     code stops heartbeating and is found hung.

Test-only switch, documented in docs/testing.md: PULSE_TEST_INJECT="tick:crash-before-ready,engine:hang-before-ready*3"
injects a fault into the first N starts (default 1) of a worker. Faults:
crash-before-ready, hang-before-ready, exit-0 / exit-1 (right after ready),
grandchild (start a `sleep` that must die with the worker).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Callable

import zmq

from pulse.core import client, clock, logs, procs
from pulse.core import config as configmod
from pulse.core.home import Paths
from pulse.core.states import Exit
from pulse.core.wakepipe import drain
from pulse.core.wire import codec, heartbeats, spawnmsgs
from pulse.store import connection

log = logging.getLogger("pulse.harness")

FAULTS = ("crash-before-ready", "hang-before-ready", "exit-0", "exit-1", "grandchild")


def injected_faults(name: str, start: int, spec: str | None) -> set[str]:
    """The faults PULSE_TEST_INJECT asks for on this start of this worker."""
    out = set()
    for item in filter(None, (spec or "").split(",")):
        target, _, fault = item.strip().partition(":")
        fault, _, times = fault.partition("*")
        if target == name and fault in FAULTS and start <= int(times or 1):
            out.add(fault)
    return out


class Worker:
    """A worker's own part. Subclasses open sockets in `open()` and register handlers."""

    name = "worker"
    commit: str | None = None   # reported in Ready: what code this worker runs, where that varies

    def __init__(self, ctx: zmq.Context, paths: Paths, config, spec: spawnmsgs.Spawn):
        # config: this worker's slice (pulse.core.config.SLICES), never the whole Config
        self.ctx, self.paths, self.config, self.spec = ctx, paths, config, spec
        self.handlers: dict[object, Callable[[], None]] = {}   # zmq socket or fd → called when readable
        self.log = logging.getLogger(f"pulse.{self.name}")
        self.to_pulsed: Callable[[object], bool] = lambda message: False   # over the heartbeat socket, once ready
        # Called by a long job of the main loop between its steps (the tick folding a long history,
        # batch by batch): heartbeats when one is due. Each call is progress, so a worker stuck inside
        # one step is still found hung; a job whose length follows the history is not.
        self.progress: Callable[[], None] = lambda: None
        # Set by the harness: the fd a SIGTERM makes readable, and whether one came (see poll).
        self.signal_fd: int | None = None
        self.stop_requested: Callable[[], bool] = lambda: False

    def status_extras(self) -> dict | None:
        """What this worker adds to `pulsectl status`, sent with each heartbeat (keep it small)."""
        return None

    def healthy(self) -> bool:
        """False withholds the heartbeat: a worker whose real work runs elsewhere (the web server's
        event loop) says here whether that work still moves, so pulsed sees it hang."""
        return True

    def socket(self, kind: int, endpoint: str, *, bind: bool, handler: Callable[[], None] | None = None,
               **options) -> zmq.Socket:
        sock = client.open_socket(self.ctx, kind, endpoint, bind=bind, **options)
        if handler is not None:
            self.handlers[sock] = handler
        return sock

    def poll(self, sock: zmq.Socket, timeout_ms: int, flags: int = zmq.POLLIN) -> bool:
        """`sock.poll` for a wait inside one step of the loop, ended early (False) by a SIGTERM:
        pulsed stops the workers one by one, and one waiting on a peer stopped before it (the tick
        on the engine) would otherwise hold its own stop up for the whole wait."""
        if self.signal_fd is None:
            return bool(sock.poll(timeout_ms, flags))
        poller = zmq.Poller()
        poller.register(sock, flags)
        poller.register(self.signal_fd, zmq.POLLIN)
        deadline = time.monotonic() + timeout_ms / 1000
        while not self.stop_requested():
            ready = dict(poller.poll(clock.poll_ms(deadline - time.monotonic())))
            if sock in ready:
                return True
            if not ready:
                return False
            if not self.stop_requested():
                drain(self.signal_fd)       # another signal's wake-up: wait on
        return False

    def receive(self, frame: bytes, kind: type, where: str):
        """Decode a frame, or log it as malformed and return None."""
        try:
            return codec.decode(frame, kind)
        except codec.Malformed as err:
            self.log.warning("dropped a malformed frame on the %s socket: %s", where, err)
            return None

    def messages(self, sock: zmq.Socket, kind: type, where: str):
        """The messages waiting on `sock`, decoded, without blocking (malformed ones logged and
        dropped). Lazy: what the caller does not take stays queued on the socket."""
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            message = self.receive(frame, kind, where)
            if message is not None:
                yield message

    def open(self) -> None:
        """Open databases and sockets. Ready is sent when this returns."""

    def on_ready(self) -> None:
        """Called right after Ready is sent, before the loop's first turn: what need not hold Ready
        up (its results are used only from the loop)."""

    def next_timer(self) -> float | None:
        """Monotonic time of this worker's next timed duty, or None."""
        return None

    def on_timer(self, now: float) -> None:
        pass

    def stays_after_stop(self, now: float) -> bool:
        """Asked after a SIGTERM, on every turn of the loop: True keeps the loop going a little
        longer (the event writer, for events pulsed still sends). It must turn False by itself."""
        return False

    def close(self) -> None:
        pass


class Harness:
    def __init__(self, worker: Worker, spec: spawnmsgs.Spawn):
        self.worker, self.spec = worker, spec
        self.stop_requested = False
        self.heartbeat_s = worker.config.timings.heartbeat_ms / 1000
        self.seq = 0
        self.beat = worker.socket(zmq.PUSH, worker.paths.endpoint("heartbeat"), bind=False,
                                  SNDHWM=16)
        worker.to_pulsed = self.send
        self.last_beat = time.monotonic()
        worker.progress = self.beat_if_due

    def send(self, message) -> bool:
        try:
            self.beat.send(codec.encode(message), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False   # pulsed is not there (or busy): it must never stall us

    def beat_if_due(self) -> None:
        if time.monotonic() - self.last_beat >= self.heartbeat_s and self.worker.healthy():
            self.heartbeat()

    def heartbeat(self) -> None:
        self.last_beat = time.monotonic()
        self.seq += 1
        self.send(heartbeats.Heartbeat(self.worker.name, os.getpid(), self.seq, time.monotonic(), self.worker.status_extras()))

    def loop(self, wakeup_fd: int, after_ready: Callable[[], None]) -> None:
        if self.stop_requested:
            return   # told to stop while starting: never ready
        self.send(heartbeats.Ready(self.worker.name, os.getpid(), time.monotonic(), self.worker.commit))
        self.heartbeat()          # its extras (a web address, the processes seen) reach status now
        self.worker.on_ready()
        after_ready()
        poller, registered = None, None
        next_beat = time.monotonic() + self.heartbeat_s
        while not self.stop_requested or self.worker.stays_after_stop(time.monotonic()):
            now = time.monotonic()
            if now >= next_beat:
                if self.worker.healthy():
                    self.heartbeat()
                next_beat = now + self.heartbeat_s
            if registered != self.worker.handlers.keys():   # a worker may add or drop fds as it goes
                registered = set(self.worker.handlers)
                poller = zmq.Poller()
                poller.register(wakeup_fd, zmq.POLLIN)
                for item in registered:
                    poller.register(item, zmq.POLLIN)
            wake_at = min(t for t in (next_beat, self.worker.next_timer()) if t is not None)
            for item, _ in poller.poll(clock.poll_ms(wake_at - time.monotonic())):
                if item == wakeup_fd:
                    drain(wakeup_fd)
                elif item in self.worker.handlers:
                    self.worker.handlers[item]()
            self.worker.on_timer(time.monotonic())


def setup_logging(level: str) -> None:
    """In a worker: plain lines on stderr (the pipe to pulsed)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)   # whatever the forkserver had: a worker writes only to its pipe
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(logs.WORKER_FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())


def run(spec: spawnmsgs.Spawn, worker_class: type[Worker], forkserver_pid: int) -> int:
    """The body of a worker process; returns its exit code: Exit.CONFIG (78) with one line when a
    store cannot be used, since every restart would fail the same way."""
    try:
        return _run(spec, worker_class, forkserver_pid)
    except sqlite3.DatabaseError as err:
        if (problem := connection.unusable(err)) is None:
            raise
        log.critical("%s", problem)
        return Exit.CONFIG


def _run(spec: spawnmsgs.Spawn, worker_class: type[Worker], forkserver_pid: int) -> int:
    procs.die_with_parent(forkserver_pid)
    # the instance in ps tells the Pulses of one host apart; comm keeps the worker alone (15 bytes).
    # Short (the name cut to 24), so the title fits where the forkserver's argv was and ps reads it whole.
    procs.set_title(f"pulse: {spec.name} [{spec.instance[:24]}]" if spec.instance else f"pulse: {spec.name}",
                    comm=f"pulse: {spec.name}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # The main thread's stack alone: the loop that heartbeats is what a hang stopped, and pulsed aborts
    # that thread (supervisor/arbiter.py, hung). Walking the other threads' frames while they run
    # (after the SIGCONT that follows) could crash the dump part-way.
    faulthandler.enable(file=sys.stderr, all_threads=False)
    config = configmod.decode_slice(spec.name, spec.config)   # all this worker may read
    connection.BUSY_TIMEOUT_MS = config.timings.sqlite_busy_timeout_ms
    setup_logging(config.log.level)
    faults = injected_faults(spec.name, spec.start, os.environ.get("PULSE_TEST_INJECT"))
    if faults:
        log.warning("test faults injected into start %d: %s", spec.start, ", ".join(sorted(faults)))
    grandchild = procs.start_child(["sleep", "3600"]) if "grandchild" in faults else None
    if "crash-before-ready" in faults:
        raise RuntimeError("injected crash before ready (PULSE_TEST_INJECT)")
    if "hang-before-ready" in faults:
        while True:
            time.sleep(3600)

    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    harness: Harness | None = None
    stop_requested = False

    def on_term(signum, frame):
        # Only flags; the loop sees it through the wakeup fd. Raising SystemExit here would land in
        # whatever runs at the moment, and the engine's loader rightly survives an agent module that
        # raises it: a SIGTERM during its start was swallowed and pulsed waited out stop_grace_ms.
        nonlocal stop_requested
        stop_requested = True
        if harness is not None:
            harness.stop_requested = True

    signal.signal(signal.SIGTERM, on_term)
    signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)

    ctx = zmq.Context()
    paths = Paths(home=Path(spec.home), runtime=Path(spec.runtime))
    worker = worker_class(ctx, paths, config, spec)
    worker.open()
    harness = Harness(worker, spec)
    harness.stop_requested = stop_requested   # a SIGTERM that came while it opened
    worker.signal_fd, worker.stop_requested = rfd, lambda: harness.stop_requested

    def after_ready() -> None:
        for code in (0, 1):
            if f"exit-{code}" in faults:
                harness.heartbeat()
                log.warning("injected exit %d after ready (PULSE_TEST_INJECT)", code)
                raise SystemExit(code)

    try:
        harness.loop(rfd, after_ready)
        log.info("stopping on request")
    finally:
        worker.close()
        harness.beat.close()
        ctx.term()
        if grandchild is not None:
            grandchild.kill()
    return 0
