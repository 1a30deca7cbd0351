"""The arbiter: pulsed's one loop.

    wait (zmq poll on sockets, pidfds, pipes and the signal pipe; timeout = next deadline)
    → read signals (handlers only queue them) → learn of deaths (pidfds: the kernel says so)
    → read the forkserver, heartbeats, control requests, worker output
    → fire due timers: hung workers, backoffs, stop grace, slow retries of failed workers, watchdog
    → restore the wanted set of workers

A death is known when the worker's pidfd becomes readable: the kernel has
confirmed it, so a replacement can never run beside its predecessor.
"""

from __future__ import annotations

import os
import signal
import time
import traceback

import msgspec
import zmq

from pulse.core import client, clock, instances, logs, procs
from pulse.core import config as configmod
from pulse.core.childspecs import CHILD_SPECS, CORE_WORKERS, ENGINE, EVENT_WRITER, STEERABLE, WORKERS
from pulse.core.home import RUNTIME_FILES, SOCKETS, Paths, load_stopped, save_stopped
from pulse.core.sdnotify import Notifier
from pulse.core.states import (
    ALIVE_STATES,
    LATE,
    Exit,
    WorkerState,
    process_state_at,
)
from pulse.core.wire import codec, controlmsgs, eventmsgs, heartbeats, spawnmsgs
from pulse.core.wire.eventmsgs import EventType

from . import control
from .child import (
    ABANDON,
    BACKOFF_OVER,
    CANCEL,
    CRASH_BACKOFF,
    CRASH_FAIL,
    CRASH_RESTART,
    EXIT_IN_SHUTDOWN,
    FORKSERVER_STUCK,
    HANG,
    READY,
    RESPAWN,
    RESTART,
    RETRY,
    START,
    STOP,
    STOP_DONE,
    UNUSABLE,
    Child,
    Edge,
    Fail,
    IllegalTransition,
    check_transition,
    enter_state,
    forget_crashes,
    next_deadline,
    on_crash,
    runs,
)
from .eventqueue import EventQueue
from .forkserver import Forkserver

log = logs.Log("pulse.supervisor")
S = WorkerState
# A death is known from the pidfd; its status follows from the forkserver, within a millisecond when
# the machine is idle. A status not come by then is lost (the exit said as "unknown status", and an
# exit 78 taken for a crash), and on 2 loaded cores the forkserver once took longer than 50 ms: the
# wait ends as soon as the status arrives, so only a stalled forkserver makes pulsed wait this long.
EXIT_STATUS_WAIT_S = 0.5


class Arbiter:
    def __init__(self, paths: Paths, config: configmod.Config, sink: logs.Sink, notifier: Notifier,
                 forkserver: Forkserver | None = None):
        """`forkserver`: one started already (pulsed starts it first thing, so its preload runs while
        pulsed checks its home), taken over at open(); else open() starts one."""
        self.paths, self.sink, self.notifier = paths, sink, notifier
        self.set_config(config)
        self.children = {name: Child(spec) for name, spec in CHILD_SPECS.items()}   # in start order
        self.stopped_by_operator = load_stopped(paths.workers_state) & set(STEERABLE)
        self.started_mono = time.monotonic()
        self.ready_sent = False
        self.last_reload: controlmsgs.ReloadDone | None = None
        self.shutting_down = False
        self.shutdown_deadline: float | None = None
        self.shutdown_overtime = False   # past stop_grace_ms: only the event writer may still finish
        self.exit_code = Exit.OK
        self.next_watchdog: float | None = None
        self.forkserver: Forkserver | None = forkserver
        self.forkserver_restarts: list[float] = []
        self.outputs: list[logs.PipeReader] = []   # output pipes, read until EOF (which may outlive the process)
        self.early_ready: dict[int, tuple] = {}           # Ready seen before Spawned, by pid: (sent, commit)

    def set_config(self, config: configmod.Config) -> None:
        """pulsed reads its own slice (`settings`); the whole config it only cuts the workers' slices from."""
        self.config = config
        self.settings: configmod.SupervisorConfig = configmod.slice_of(config, "supervisor")
        self.timings = self.settings.timings

    def supervised(self, settings: configmod.SupervisorConfig | None = None) -> tuple[str, ...]:
        """What runs (under `settings`, else the running ones), in start order."""
        return tuple(n for n, spec in CHILD_SPECS.items() if runs(spec, settings or self.settings))

    def listed(self) -> tuple[str, ...]:
        """The workers status lists and operators steer: what runs, but for pulsed's own (the event writer)."""
        return tuple(n for n in self.supervised() if CHILD_SPECS[n].listed)

    # -- setup and teardown ------------------------------------------------------------------------

    def open(self) -> None:
        self.ctx = zmq.Context()
        self.control = self._socket(zmq.ROUTER, "control", bind=True)
        self.heartbeats = self._socket(zmq.PULL, "heartbeat", bind=True)
        # IMMEDIATE: frames wait in EventQueue, not in a pipe to a writer that may be gone.
        self.events = EventQueue(self._socket(zmq.PUSH, "eventlog", bind=False, IMMEDIATE=1, RECONNECT_IVL=20))
        self.signal_r, signal_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda s, f: None)   # handlers only queue: the number lands in the pipe
        signal.set_wakeup_fd(signal_w, warn_on_full_buffer=False)
        started = self.record(EventType.SUPERVISOR_STARTED, None, pid=os.getpid(), home=str(self.paths.home),
                              runtime=str(self.paths.runtime), stopped=sorted(self.stopped_by_operator))
        self.run_mono = started.mono   # names this run to its event writers
        self.start_forkserver(self.forkserver)
        if self.notifier.watchdog_s:
            self.next_watchdog = time.monotonic()

    def _socket(self, kind: int, name: str, *, bind: bool, **options: int) -> zmq.Socket:
        return client.open_socket(self.ctx, kind, self.paths.endpoint(name), bind=bind, **options)

    def close(self) -> None:
        if self.forkserver is not None:
            self.forkserver.close()
            if self.forkserver.wait(timeout=1) is None:
                self.forkserver.kill()
                self.forkserver.wait()
        for reader in self.outputs:
            reader.read(self.sink)
            reader.close()
        if self.events.pending:   # the writer could not take them: keep them in the log at least
            log.error("%d lifecycle events were not written to events.db; here they are:",
                      len(self.events.pending))
            for event in self.events.pending:
                log.error("unwritten event: %r", event)
        self.events.sock.close()
        self.control.close()
        self.heartbeats.close()
        self.ctx.term()
        for name in SOCKETS:
            try:
                self.paths.socket_file(name).unlink()
            except FileNotFoundError:
                pass
        for name in RUNTIME_FILES:
            (self.paths.runtime / name).unlink(missing_ok=True)

    # -- events and notifications ------------------------------------------------------------------

    def record(self, type: str, target: str | None, **data) -> eventmsgs.Event:
        event = eventmsgs.now_event(type, "pulsed", target, **data)
        self.events.put(event)
        return event

    def update_notify(self) -> None:
        running = [n for n in WORKERS if self.children[n].state is S.RUNNING]
        wanted = [n for n in CORE_WORKERS if n not in self.stopped_by_operator]
        if not self.ready_sent and all(n in running for n in wanted):
            self.ready_sent = True
            self.notifier.send("READY=1", f"MAINPID={os.getpid()}")
            log.info("ready: %s running", ", ".join(wanted))
        others = [f"{c.name} {c.state}" for c in self.children.values() if c.state is not S.RUNNING]
        self.notifier.status(f"{len(running)}/{len(WORKERS)} workers running" +
                             (f"; {', '.join(others)}" if others else ""))

    # -- the loop ----------------------------------------------------------------------------------

    def run(self) -> int:
        self.open()
        try:
            for name in self.supervised():
                if name in self.stopped_by_operator:
                    log.info("%s stays stopped (stopped by an operator; `pulsectl start %s`)", name, name)
                else:
                    self.spawn(self.children[name], START)
            self.update_notify()
            while not (self.shutting_down and self.all_down()):
                self.step()
        finally:
            self.close()
        log.info("stopped (exit %d)", self.exit_code)
        return int(self.exit_code)

    def all_down(self) -> bool:
        return all(c.state not in ALIVE_STATES for c in self.children.values())

    def step(self) -> None:
        poller = zmq.Poller()
        poller.register(self.control, zmq.POLLIN)
        if self.events.pending or any(c.state is S.STARTING for c in self.children.values()):
            poller.register(self.heartbeats, zmq.POLLIN)   # a Ready or a Committed is awaited: read at once
        if self.events.to_send:
            poller.register(self.events.sock, zmq.POLLOUT)
        poller.register(self.signal_r, zmq.POLLIN)     # wakes the poll; read below whether or not it says so
        fds = {}
        if self.forkserver is not None:
            fds[self.forkserver.sock.fileno()] = self.read_forkserver
            fds[self.forkserver.pidfd] = self.forkserver_died
        for child in self.children.values():
            if child.pidfd is not None:
                fds[child.pidfd] = lambda c=child: self.died(c)
        for reader in self.outputs:
            fds[reader.fd] = lambda r=reader: self.read_output(r)
        for fd in fds:
            poller.register(fd, zmq.POLLIN)

        deadline = self.next_deadline()
        timeout = None if deadline is None else clock.poll_ms(deadline - time.monotonic())
        ready = dict(poller.poll(timeout))
        # Signals first, read whether or not the poll said so: a SIGTERM that woke the poll as a worker
        # died (init's final kill signals every process at once) reaches its handler after the kernel
        # has gathered the poll's answer, which then holds the death alone; read after it, the
        # worker's exit would be taken for a crash and the worker restarted in the shutdown.
        self.read_signals()
        # Then deaths, so a Ready or a request never acts on a process that is already gone.
        for fd in ready:
            if fd in fds:
                fds[fd]()
        if self.heartbeats in ready:
            self.read_heartbeats()
        if self.events.sock in ready:
            self.events.send()
        if self.control in ready:
            self.read_control()
        self.fire_timers(time.monotonic())
        self.take_spawned()

    def next_deadline(self) -> float | None:
        times = [next_deadline(c, self.timings) for c in self.children.values()]
        times += [self.next_watchdog, self.shutdown_deadline]
        times = [t for t in times if t is not None]
        return min(times) if times else None

    # -- inputs ------------------------------------------------------------------------------------

    def read_signals(self) -> None:
        try:
            data = os.read(self.signal_r, 64)
        except BlockingIOError:
            return
        for signum in data:
            if signum in (signal.SIGTERM, signal.SIGINT):
                log.info("%s: stopping", signal.Signals(signum).name)
                self.begin_shutdown(Exit.OK, f"signal {signal.Signals(signum).name}")
            elif signum == signal.SIGHUP:
                log.info("SIGHUP: reloading configuration")
                self.reload()

    def read_heartbeats(self) -> None:
        now = time.monotonic()
        while True:
            try:
                frame = self.heartbeats.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message = codec.decode(frame, heartbeats.WorkerMessage)
            except codec.Malformed as err:
                log.warning("dropped a malformed frame on the heartbeat socket: %s", err)
                continue
            child = self.children.get(message.name)
            if child is None:
                continue
            sent = now if isinstance(message, heartbeats.Committed) else min(message.mono, now)
            if child.pid is None and child.state is S.STARTING and isinstance(message, heartbeats.Ready):
                self.early_ready[message.pid] = (sent, message.commit)   # it beat the forkserver's Spawned to us
                continue
            if child.pid != message.pid:
                continue   # from a predecessor, already replaced
            child.heartbeat_at = max(sent, child.heartbeat_at or 0.0)
            if isinstance(message, heartbeats.Heartbeat) and message.extras is not None:
                child.extras = message.extras
            if isinstance(message, heartbeats.Committed):
                self.events.committed(message)
            elif isinstance(message, heartbeats.Ready) and child.state is S.STARTING:
                child.commit = message.commit
                self.became_ready(child, sent)

    def read_control(self) -> None:
        while True:
            try:
                frames = self.control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) < 2:
                log.warning("dropped a malformed frame on the control socket: %d frames", len(frames))
                continue
            identity, payload = frames[0], frames[-1]
            try:
                request = codec.decode(payload, controlmsgs.ControlRequest)
            except codec.Malformed as err:
                log.warning("dropped a malformed frame on the control socket: %s", err)
                reply = controlmsgs.Reply(ok=False, error=f"malformed request: {err}")
            else:
                reply = control.handle(self, request)
            self.control.send_multipart([identity, codec.encode(reply)])

    def read_forkserver(self) -> None:
        try:
            self.forkserver.receive()
        except codec.Malformed as err:
            log.error("forkserver sent a malformed message: %s", err)
        self.take_spawned()

    def take_spawned(self) -> None:
        """Spawned messages may be read while waiting for an exit status: take them all here."""
        while self.forkserver is not None and self.forkserver.spawned:
            message = self.forkserver.spawned.pop(0)
            self.spawned(self.children[message.name], message)

    def read_output(self, reader: logs.PipeReader) -> None:
        if not reader.read(self.sink):
            reader.close()
            self.outputs.remove(reader)

    # -- the forkserver ----------------------------------------------------------------------------

    def start_forkserver(self, started: Forkserver | None = None) -> None:
        self.forkserver = started or Forkserver.start()
        self.outputs.append(logs.PipeReader(self.forkserver.output_fd, "forkserver", self.forkserver.pid))
        self.record(EventType.WORKER_STARTED, "forkserver", pid=self.forkserver.pid)
        log.info("forkserver started (pid %d)", self.forkserver.pid)

    def forkserver_died(self) -> None:
        fs = self.forkserver
        code = fs.wait()
        os.close(fs.pidfd)
        fs.sock.close()
        self.forkserver = None
        signal_num = -code if code < 0 else None
        self.record(EventType.WORKER_EXITED, "forkserver", pid=fs.pid, code=None if code < 0 else code, signal=signal_num)
        how = f"signal {signal_num}" if signal_num else f"code {code}"
        if self.shutting_down:
            log.info("forkserver (pid %d) exited (%s) while pulsed stops", fs.pid, how)
            return
        log.error("forkserver (pid %d) exited (%s); its workers die with it and are restarted", fs.pid, how)
        now = time.monotonic()
        self.forkserver_restarts = [t for t in self.forkserver_restarts if now - t <= self.timings.intensity_period_s]
        if len(self.forkserver_restarts) >= self.timings.intensity_restarts:
            self.record(EventType.WORKER_FAILED, "forkserver", restarts=len(self.forkserver_restarts))
            log.critical("forkserver restarted too often; escalating")
            self.begin_shutdown(Exit.ESCALATED, "forkserver restart intensity reached")
            return
        self.forkserver_restarts.append(now)
        self.start_forkserver()
        self.record(EventType.WORKER_RESTARTED, "forkserver", reason="crash", pid=self.forkserver.pid)
        for child in self.children.values():   # spawns it never answered: ask the new one
            if child.state is S.STARTING and child.pid is None:
                self.spawn(child, RESPAWN)

    # -- one worker's lifecycle --------------------------------------------------------------------

    def _transition(self, child: Child, edge: Edge, *, now: float | None = None, due: float | None = None,
                    **event) -> None:
        """The one way a worker's state changes: along `edge`, from a state it leaves, into the
        new state with its timer (or `due`), recording the edge's lifecycle event with `event`.

        An edge taken from a state it does not leave is a bug in pulsed: said loudly (a CRITICAL
        line with the stack, an `error` event; the tests fail on it), never raised. pulsed has
        already acted (signalled, spawned), so the new state is the truest account of the
        process there is; and pulsed is the last thing standing: it must not die of its own
        bookkeeping."""
        try:
            check_transition(child.state, edge)
        except IllegalTransition as bug:
            self.illegal_transition(child, bug)
        enter_state(child, edge, time.monotonic() if now is None else now, self.timings, due)
        if edge.event is not None:
            self.record(edge.event, child.name, **event)

    def illegal_transition(self, child: Child, bug: IllegalTransition) -> None:
        log.critical("BUG: illegal transition of %s: %s; taken anyway. Please report it with this stack:\n%s",
                     child.name, bug, "".join(traceback.format_stack()[:-1]).rstrip())
        self.record(EventType.ERROR, child.name, message=f"illegal transition: {bug}")

    def spawn(self, child: Child, edge: Edge, **event) -> None:
        """`edge` → STARTING: ask the forkserver for a process."""
        if self.forkserver is None:
            self.start_forkserver()
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        if edge is not RESPAWN:   # the same start, asked of the next forkserver
            child.starts += 1
        spec = spawnmsgs.Spawn(child.name, child.starts, configmod.encode_slice(self.config, child.name),
                          str(self.paths.runtime), str(self.paths.home), self.run_mono,
                          self.settings.pulse.name or instances.default_name(self.paths.home))
        child.spawned_at = time.monotonic()   # before the request: a spare may be told to go before it returns
        sent = self.forkserver.spawn(spec, out_w)
        child.forkserver = self.forkserver
        os.close(out_w)
        child.output = logs.PipeReader(out_r, child.name, None)
        self.outputs.append(child.output)
        child.pid = None
        child.ready_at = child.heartbeat_at = None
        self._transition(child, edge, now=child.spawned_at, **event)
        if not sent:
            log.error("could not reach the forkserver to start %s; restarting the forkserver", child.name)
            self.forkserver.kill()

    def spawned(self, child: Child, message: spawnmsgs.Spawned) -> None:
        pid = message.pid
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            pidfd = None
        if child.state not in (S.STARTING, S.STOPPING) or child.pid is not None:
            log.error("forkserver started %s (pid %d) that pulsed no longer wants; killing it", child.name, pid)
            if pidfd is not None:
                procs.signal_pidfd(pidfd, signal.SIGKILL)
                os.close(pidfd)
            return
        child.pid, child.pidfd = pid, pidfd
        child.output.pid = pid
        # fork_ms: spawn request → the forkserver had its process (a share of start_to_ready_ms in its worker-ready)
        self.record(EventType.WORKER_STARTED, child.name, pid=pid, start=child.starts,
                    fork_ms=round((message.mono - child.spawned_at) * 1000, 2))
        ready_at, child.commit = self.early_ready.pop(pid, (None, None))
        if pidfd is None:
            self.died(child)
        elif child.state is S.STOPPING:
            self.signal(child, signal.SIGTERM)
        elif ready_at is not None:
            child.heartbeat_at = ready_at
            self.became_ready(child, ready_at)

    def became_ready(self, child: Child, now: float) -> None:
        """STARTING → RUNNING."""
        child.ready_at = now
        ms = round((now - child.spawned_at) * 1000, 2)
        self._transition(child, READY, now=now, pid=child.pid, start_to_ready_ms=ms,
                         **({"commit": child.commit} if child.commit else {}))
        log.info("%s ready (pid %d, %.1f ms after spawn)", child.name, child.pid, ms)
        if child.spec.writes_events:
            self.events.resend()
        self.update_notify()

    def signal(self, child: Child, signum: int, main_thread: bool = False) -> None:
        if child.pidfd is not None:
            procs.signal_pidfd(child.pidfd, signum, main_thread)

    def died(self, child: Child) -> None:
        """The kernel says the process is gone. Decide what follows."""
        now = time.monotonic()
        pid = child.pid
        parent = child.forkserver
        if parent is not None and parent is self.forkserver:
            status = parent.wait_exit(pid, EXIT_STATUS_WAIT_S)
        else:   # its forkserver is gone: the status went with it, unless it was already told
            status = parent.exits.pop(pid, None) if parent is not None else None
        child.forkserver = None
        if child.pidfd is not None:
            os.close(child.pidfd)
        child.pid = child.pidfd = None
        code = status.code if status else None
        signum = status.signal if status else None
        was = child.state
        child.last_exit = controlmsgs.LastExit(code, signum, clock.iso(time.time(), ms=False),
                                        "hung" if was is S.HUNG else None)
        uptime = round(now - child.spawned_at, 3) if child.spawned_at else None
        if not (child.spec.writes_events and self.shutting_down):   # nobody would write that one
            self.record(EventType.WORKER_EXITED, child.name, pid=pid, code=code, signal=signum, state=str(was),
                        uptime_s=uptime)
        how = f"signal {signal.Signals(signum).name}" if signum else f"code {code}" if code is not None else "unknown status"
        if was is S.STOPPING or self.shutting_down:
            log.info("%s (pid %s) stopped (%s)", child.name, pid, how)
            if child.restart_after_stop and not self.shutting_down:
                self.restart_now(child)
            else:
                self._transition(child, STOP_DONE if was is S.STOPPING else EXIT_IN_SHUTDOWN, now=now)
            self.update_notify()
            return
        if code == Exit.CONFIG:
            self.unusable(child)
            return
        log.warning("%s (pid %s) exited unexpectedly (%s) while %s", child.name, pid, how, was)
        self.crashed(child, now, "hung" if was is S.HUNG else "crash")

    def unusable(self, child: Child) -> None:
        """A worker exits 78 when a store cannot be used (its one line is in the log just before): every
        restart would fail the same way, so none is tried. Core: pulsed exits 78 as at a damaged start."""
        self._transition(child, UNUSABLE, reason="store unusable", code=int(Exit.CONFIG))
        if child.spec.core:
            log.critical("%s cannot use a store (its line above says which and what to do): restarting it "
                         "cannot help; stopping (exit %d)", child.name, Exit.CONFIG)
            self.begin_shutdown(Exit.CONFIG, f"{child.name} cannot use a store")
        else:
            log.error("%s cannot use a store (its line above says which): failed until %s", child.name,
                      f"`pulsectl restart {child.name}`" if child.spec.listed else "pulsed restarts")
        self.update_notify()

    def crashed(self, child: Child, now: float, reason: str) -> None:
        decision = on_crash(child, now, self.timings)
        if isinstance(decision, Fail):
            retry_in = decision.retry_in_s
            self._transition(child, CRASH_FAIL, now=now, due=None if retry_in is None else now + retry_in,
                             restarts=len(child.recent), period_s=self.timings.intensity_period_s, retry_in_s=retry_in)
            if child.spec.core:
                log.critical("%s crashed more than %d times in %gs: stopping everything (exit %d) so the "
                             "service manager can act", child.name, self.timings.intensity_restarts,
                             self.timings.intensity_period_s, Exit.ESCALATED)
                self.begin_shutdown(Exit.ESCALATED, f"{child.name} restart intensity reached")
            else:
                operator = f"`pulsectl restart {child.name}`" if child.spec.listed else None
                then = (f"retrying in {retry_in:g}s" + (f" (or now: {operator})" if operator else "")
                        if retry_in is not None else f"until {operator or 'pulsed restarts'}")
                log.error("%s crashed more than %d times in %gs: failed; %s", child.name,
                          self.timings.intensity_restarts, self.timings.intensity_period_s, then)
            self.update_notify()
            return
        child.restarts += 1
        child.crash_restarts += 1
        restarted = dict(reason=reason, delay_ms=round(decision.delay_s * 1000), streak=child.streak)
        if decision.delay_s == 0:
            self.spawn(child, CRASH_RESTART, **restarted)
        else:
            self._transition(child, CRASH_BACKOFF, now=now, due=now + decision.delay_s, **restarted)
            log.info("%s restarts in %.0f ms (crash %d in a row)", child.name, decision.delay_s * 1000, child.streak)
        self.update_notify()

    def hung(self, child: Child, now: float) -> None:
        """STARTING/RUNNING → HUNG: SIGABRT (faulthandler traceback), SIGCONT, SIGKILL after the grace."""
        silent = now - (child.heartbeat_at or child.spawned_at)
        hung = dict(pid=child.pid, silent_ms=round(silent * 1000), before_ready=child.state is S.STARTING)
        log.error("%s (pid %s) silent for %.1fs: aborting it for a traceback, then killing it",
                  child.name, child.pid, silent)
        if child.pid is None:
            # The forkserver never answered this spawn: it is the one that is stuck. Its death
            # asks the next one for this spawn (RESPAWN); until then the spawn waits again.
            log.error("the forkserver did not start %s; killing the forkserver", child.name)
            if self.forkserver is not None:
                self.forkserver.kill()
            self._transition(child, FORKSERVER_STUCK, now=now, **hung)
            return
        self._transition(child, HANG, now=now, **hung)
        # To the main thread: a stopped process's signal is taken, once it runs again, by whichever
        # thread comes first, and faulthandler dumping from a libzmq thread read the main thread's
        # frames as they changed (a SIGSEGV, the traceback lost). The main loop is what stopped.
        self.signal(child, signal.SIGABRT, main_thread=True)
        self.signal(child, signal.SIGCONT)

    def restart_now(self, child: Child) -> None:
        """An operator's restart (or a reload's): not a crash, never counted toward the limit."""
        child.restart_after_stop = False
        child.restarts += 1
        child.operator_restarts += 1
        self.spawn(child, RESTART, reason="operator", delay_ms=0)

    def stop(self, child: Child, *, restart: bool = False, until: float | None = None) -> None:
        """Operator stop/restart, reload, or shutdown (whose deadline is `until`; else stop_grace_ms)."""
        child.restart_after_stop = restart
        if child.state in (S.STOPPED, S.FAILED, S.BACKOFF):
            if restart:
                self.restart_now(child)
            else:
                self._transition(child, CANCEL)
            return
        if child.state is S.STOPPING:
            return
        self._transition(child, STOP, due=until)
        self.signal(child, signal.SIGTERM)
        self.signal(child, signal.SIGCONT)   # a stopped process cannot act on SIGTERM

    def fire_timers(self, now: float) -> None:
        if any(c.state is S.RUNNING and (next_deadline(c, self.timings) or now + 1) <= now
               for c in self.children.values()):
            self.read_heartbeats()   # heartbeats are read lazily: look before calling anyone hung
        for child in self.children.values():
            due = next_deadline(child, self.timings)
            if due is None or due > now:
                continue
            if child.state in (S.STARTING, S.RUNNING):
                self.hung(child, now)
            elif child.state in (S.HUNG, S.STOPPING):
                log.warning("%s (pid %s) still alive after %d ms: SIGKILL", child.name, child.pid,
                            self.timings.stop_grace_ms)
                self.signal(child, signal.SIGKILL)
                child.deadline = None
            elif child.state is S.BACKOFF:
                self.spawn(child, BACKOFF_OVER)
            elif child.state is S.FAILED:
                log.info("retrying failed %s", child.name)
                forget_crashes(child)
                child.restarts += 1
                child.crash_restarts += 1
                self.spawn(child, RETRY, reason="retry-after-failed", delay_ms=0)
        if self.next_watchdog is not None and now >= self.next_watchdog:
            self.notifier.send("WATCHDOG=1")
            self.next_watchdog = now + self.notifier.watchdog_s / 2
        if self.shutting_down:
            self.continue_shutdown(now)

    # -- operator actions --------------------------------------------------------------------------

    def operator_start(self, child: Child) -> None:
        self.set_stopped(child.name, False)
        forget_crashes(child)
        if child.state in (S.STOPPED, S.FAILED, S.BACKOFF):
            self.spawn(child, START)

    def operator_stop(self, child: Child) -> None:
        self.set_stopped(child.name, True)
        self.stop(child)

    def operator_restart(self, child: Child) -> None:
        self.set_stopped(child.name, False)
        forget_crashes(child)
        self.stop(child, restart=True)

    def set_stopped(self, name: str, stopped: bool) -> None:
        before = set(self.stopped_by_operator)
        (self.stopped_by_operator.add if stopped else self.stopped_by_operator.discard)(name)
        if before != self.stopped_by_operator:
            save_stopped(self.paths.workers_state, self.stopped_by_operator)

    def reload(self) -> tuple[bool, str]:
        try:
            new = configmod.load(self.paths.config)
        except configmod.ConfigError as err:
            log.error("reload refused, keeping the running configuration: %s", err)
            self.record(EventType.RELOAD, None, ok=False, error=str(err))
            return False, str(err)
        before, after = self.supervised(), self.supervised(configmod.slice_of(new, "supervisor"))
        # A worker a flag turns on or off is started or stopped, never restarted as well.
        affected = [n for n in configmod.changed_slices(self.config, new) if n in before and n in after]
        turned = {**{n: "started" for n in after if n not in before}, **{n: "stopped" for n in before if n not in after}}
        processes = process_changes(self.config.process, new.process)
        self.record(EventType.RELOAD, None, ok=True, changed=configmod.changed_tables(self.config, new), restarted=affected,
                    **turned, **processes)
        self.last_reload = controlmsgs.ReloadDone(
            at=time.time(), pids={name: self.children[name].pid for name in self.listed()}, restarted=affected,
            started=[n for n, how in turned.items() if how == "started"],
            stopped=[n for n, how in turned.items() if how == "stopped"],
            **{k: v for k, v in processes.items() if k != "removed_definitions"})
        self.set_config(new)
        logs.Log.level = logs.LEVELS[self.settings.log.level]
        for name in affected:
            child = self.children[name]
            if child.state in ALIVE_STATES or child.state is S.BACKOFF:
                self.stop(child, restart=True)
        for name, how in turned.items():
            child = self.children[name]
            if how == "stopped":
                self.stop(child)
            elif name not in self.stopped_by_operator and child.state not in ALIVE_STATES:
                self.spawn(child, START)
        turned_text = "".join(f"{name} {how}; " for name, how in turned.items())
        gone = "".join(f"[[process]] {name} removed, to be stopped; " for name in processes["processes_removed"])
        message = f"reloaded; {turned_text}{gone}restarting: {', '.join(affected) or 'none'}"
        log.info(message)
        return True, message

    def begin_shutdown(self, code: Exit, reason: str) -> None:
        if self.shutting_down:
            return
        self.shutting_down, self.exit_code = True, code
        self.shutdown_deadline = time.monotonic() + self.timings.stop_grace_ms / 1000
        self.notifier.send("STOPPING=1")
        self.record(EventType.SUPERVISOR_STOPPING, None, reason=reason, exit_code=int(code))
        for child in self.children.values():
            if child.state in (S.BACKOFF, S.FAILED):
                self._transition(child, CANCEL)
        self.continue_shutdown(time.monotonic())

    def continue_shutdown(self, now: float) -> None:
        """Stop workers one by one in reverse start order; SIGKILL what is left at the deadline.

        A running event writer is spared at the deadline: it gets one more second to write the
        workers' last events (their exits included) and is stopped as usual, or killed then."""
        if now >= self.shutdown_deadline:
            writer = self.children[EVENT_WRITER]
            spare = writer if not self.shutdown_overtime and writer.state is S.RUNNING else None
            for child in self.children.values():
                if child.pidfd is not None and child is not spare:
                    self.signal(child, signal.SIGKILL)
            self.shutdown_overtime = True
            for child in self.children.values():
                if child.state in ALIVE_STATES and child.pid is None:
                    self._transition(child, ABANDON, now=now)   # a spawn the forkserver never answered
            self.shutdown_deadline = now + 1.0
            return
        for name in reversed(self.children):   # start order, the web worker last
            child = self.children[name]
            if child.state in ALIVE_STATES:
                if child.spec.writes_events and self.events.pending and child.state in (S.STARTING, S.RUNNING):
                    return   # the last lifecycle events are being written (or will be, once it is ready)
                if child.state is not S.STOPPING:
                    self.stop(child, until=self.shutdown_deadline)
                    if child.spec.writes_events:
                        self.events.end()   # stopped last: nothing is recorded for it to write after this
                return

    # -- status ------------------------------------------------------------------------------------

    def status(self) -> controlmsgs.Status:
        self.read_heartbeats()
        now, wall = time.monotonic(), time.time()
        workers = []
        for c in (self.children[name] for name in self.listed()):
            alive = c.pid is not None
            heartbeat_age = round(now - c.heartbeat_at, 3) if alive and c.heartbeat_at else None
            workers.append(controlmsgs.WorkerStatus(
                name=c.name, pid=c.pid, state=shown_state(c, heartbeat_age, self.timings), restarts=c.restarts,
                uptime_s=round(now - c.spawned_at, 3) if alive and c.spawned_at else None,
                heartbeat_age_s=heartbeat_age,
                last_exit=c.last_exit,
                crashes=c.crash_restarts, operator_restarts=c.operator_restarts,
                started_at=clock.iso(wall - (now - c.spawned_at)) if alive and c.spawned_at else None,
                heartbeat_at=clock.iso(wall - heartbeat_age) if heartbeat_age is not None else None))
        return controlmsgs.Status(
            version=controlmsgs.STATUS_VERSION,
            supervisor=controlmsgs.SupervisorStatus(pid=os.getpid(), uptime_s=round(now - self.started_mono, 3),
                                             home=str(self.paths.home),
                                             started_at=clock.iso(wall - (now - self.started_mono))),
            workers=workers, engine_commit=self.children[ENGINE].commit, processes=self.processes(),
            files=self.watched_files(), fresh=self.fresh_watches(), dirs=self.watched_dirs(),
            **{c.spec.status: shown_extras(c) for c in self.children.values() if c.spec.status})

    def processes(self) -> list[controlmsgs.ProcessStatus]:
        """The configured critical processes: alive as the watcher last saw them, paused, and their
        state, as the tick knows (pulse.rules.processstate; a start past its `until` is running now)."""
        seen = (self.children["watcher"].extras or {}).get("processes", {})
        tick = self.children["tick"].extras or {}
        paused, configs, states = tick.get("paused", {}), tick.get("configs", {}), tick.get("states", {})
        now = time.time()
        out = []
        for p in self.settings.process:
            sample = seen.get(p.name) or {}
            view = from_extras(states.get(p.name), controlmsgs.ProcessView)
            out.append(controlmsgs.ProcessStatus(p.name, sample.get("alive"), sample.get("pid"), paused.get(p.name),
                                          sample.get("matches"), sample.get("rss_mb"),
                                          p.memory.max_mb if p.memory is not None else None,
                                          from_extras(configs.get(p.name), controlmsgs.ConfigStatus),
                                          stopped=p.name in tick.get("stopped", ()),
                                          **(process_view_fields(view, now) if view is not None else {})))
        return out

    def watched_files(self) -> list[controlmsgs.FileWatchStatus]:
        """Each [[watch.file]] as the tick last saw it (from_extras drops a view it cannot read)."""
        views = (self.children["tick"].extras or {}).get("files") or []
        return [v for v in (from_extras(view, controlmsgs.FileWatchStatus) for view in views) if v is not None]

    def fresh_watches(self) -> list[controlmsgs.FreshWatchStatus]:
        """Each [[watch.fresh]] as the tick last saw it."""
        views = (self.children["tick"].extras or {}).get("fresh") or []
        return [v for v in (from_extras(view, controlmsgs.FreshWatchStatus) for view in views) if v is not None]

    def watched_dirs(self) -> list[controlmsgs.DirWatchStatus]:
        """Each [[watch.dir]] as the tick last saw it."""
        views = (self.children["tick"].extras or {}).get("dirs") or []
        return [v for v in (from_extras(view, controlmsgs.DirWatchStatus) for view in views) if v is not None]


def process_view_fields(view: controlmsgs.ProcessView, now: float) -> dict:
    """A process's state as the tick projected it, read now: a start past its `until` is running, and
    the tick's why no longer holds once its state has moved on."""
    state = process_state_at(view.state, view.until, now)
    return {"state": state, "why": view.why if state == view.state else "", "until": view.until,
            "started_at": view.started_at, "restarts": view.restarts, "last_exit": view.last_exit,
            "health": view.health,
            "uptime_s": round(now - view.started_at, 1) if view.started_at is not None else None}


def process_changes(old: list[configmod.Process], new: list[configmod.Process]) -> dict:
    """The [[process]] tables a reload adds and takes out: those taken out are stopped by survival
    (from the table as it was, in the reload event: the workers' new config no longer has it) unless
    keep_on_remove says to leave them running."""
    names = {p.name for p in new}
    gone = [p for p in old if p.name not in names]
    was = {p.name for p in old}
    return {"processes_added": [p.name for p in new if p.name not in was],
            "processes_removed": [p.name for p in gone if not p.keep_on_remove],
            "processes_kept": [p.name for p in gone if p.keep_on_remove],
            "removed_definitions": {p.name: configmod.removed_definition(p) for p in gone if not p.keep_on_remove}}


def shown_extras(child: Child):
    """What a worker's heartbeat adds to status (its spec's `status` field): its extras, or the one
    key of them its spec names, while it runs; None when it does not."""
    if child.pid is None:
        return None
    if child.spec.status_key is None:
        return child.extras
    return (child.extras or {}).get(child.spec.status_key)


def from_extras(data, type_):
    """A view a worker's heartbeat carried, as `type_`; None if it has none or it does not fit (a
    worker of another version: status shows less, never fails)."""
    if data is None:
        return None
    try:
        return msgspec.convert(data, type_)
    except msgspec.ValidationError:
        return None

def late_after_s(timings) -> float:
    """A running worker whose heartbeat is older than this is shown `late`: half of hung_after_ms
    (5 s of 10 by default), and never less than three heartbeats. Earlier would call a worker
    merely slowed by a loaded host late; later leaves too little of the wait before it is hung."""
    return max(3 * timings.heartbeat_ms, timings.hung_after_ms / 2) / 1000


def shown_state(child: Child, heartbeat_age_s: float | None, timings) -> str:
    """The state status shows: the state machine's, except `late` for a running worker whose
    heartbeat is overdue (a frozen worker read `running` until it was found hung)."""
    if child.state is S.RUNNING and heartbeat_age_s is not None and heartbeat_age_s > late_after_s(timings):
        return LATE
    return str(child.state)
