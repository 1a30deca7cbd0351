"""The forkserver: a clean, preloaded process that forks the workers.

pulsed runs threads (zmq's I/O threads), and keeps only what it needs itself
resident (no SQLite, none of the workers' modules). Forking a worker straight
from it could hand the child a mutex another thread held, and the child would
import its modules on every start. So pulsed execs this process once, before it
needs a worker; it imports everything a worker needs, then forks workers on
request in milliseconds, single-threaded. A request takes the spare if there is
one: a fork made ahead, idle until told to be a worker, so a restart waits on no
fork; the next spare is forked once the forkserver has been idle SPARE_AFTER_S.
One spare costs about 1.5 MiB of private memory (its page tables and the pages
its own start wrote); its exit, if it never became a worker, is not reported.

Protocol, over a SOCK_SEQPACKET socketpair (one message per packet):
    pulsed → forkserver   Spawn, with the worker's output pipe passed as an fd
    forkserver → pulsed   Spawned(name, pid, mono); Exited(pid, code, signal) when it reaps a worker
EOF at pulsed's end makes it exit. It dies with pulsed (PDEATHSIG), and its
workers die with it, so nothing outlives pulsed.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import socket
import sys
import time
import traceback
from typing import NamedTuple

from pulse.core.childspecs import CHILD_SPECS
from pulse.core.wire import codec, spawnmsgs

# Imports inside functions: the forkserver's own imports (every worker's module) run in the forkserver,
# never in pulsed, which imports this module to start it.

# Each worker's module and class, from its child spec's entry: every module imported before any fork.
PRELOAD = {name: tuple(spec.entry.split(":", 1)) for name, spec in CHILD_SPECS.items()}
# Modules a worker imports only as it starts (the executor's gate): imported here once, not in every
# fork (tests/test_preload.py runs each worker's way to Ready to keep this true).
LATE_IMPORTS = ("pulse.gate.server", "pulse.gate.sockets", "pulse.gate.tools", "pulse.gate.durable")
TITLE = "pulse: forkserver"
SPARE_TITLE = "pulse: spare"
SPARE_AFTER_S = 0.2     # idle this long after a start, the forkserver forks the next spare
MAX_PACKET = 1 << 20


# -- pulsed's side ------------------------------------------------------------------------------------

SOCKET_FD = 3   # where the forkserver finds its end of the socketpair


class Forkserver:
    def __init__(self, pid: int, sock: socket.socket, output_fd: int):
        self.pid, self.sock, self.output_fd = pid, sock, output_fd
        self.pidfd = os.pidfd_open(pid)
        self.returncode: int | None = None
        self.exits: dict[int, spawnmsgs.Exited] = {}     # reaped, not yet claimed by pulsed's loop
        self.spawned: list[spawnmsgs.Spawned] = []       # started, not yet claimed by pulsed's loop

    @classmethod
    def start(cls) -> "Forkserver":
        """posix_spawn (no subprocess module in pulsed: it stays small) a fresh interpreter."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                   (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, out_w, 2),
                   (os.POSIX_SPAWN_DUP2, theirs.fileno(), SOCKET_FD)]   # dup2 clears close-on-exec
        # Its own process group, which the workers it forks inherit: a signal to pulsed's group
        # (`kill -- -PGID`, `timeout`, a terminal's ^C) reaches pulsed alone, which then stops the
        # workers in order, the event writer last, so none of their lifecycle events is lost.
        pid = os.posix_spawn(sys.executable, [sys.executable, "-P", "-m", "pulse.supervisor.forkserver",
                                              str(SOCKET_FD), str(os.getpid())], os.environ, file_actions=actions,
                             setpgroup=0)
        theirs.close()
        os.close(out_w)
        ours.setblocking(False)
        return cls(pid, ours, out_r)

    def spawn(self, spec: spawnmsgs.Spawn, output_fd: int) -> bool:
        try:
            socket.send_fds(self.sock, [codec.encode(spec)], [output_fd])
            return True
        except (BlockingIOError, BrokenPipeError, ConnectionResetError):
            return False

    def receive(self) -> bool:
        """Queue what the forkserver has said (`spawned`, `exits`); False if it said nothing."""
        said = False
        while True:
            try:
                packet = self.sock.recv(MAX_PACKET)
            except OSError:   # BlockingIOError: nothing more for now; others: it is gone
                return said
            if not packet:
                return said
            said = True
            message = codec.decode(packet, spawnmsgs.ForkserverMessage)
            if isinstance(message, spawnmsgs.Exited):
                self.exits[message.pid] = message
            elif isinstance(message, spawnmsgs.Spawned):
                self.spawned.append(message)

    def wait_exit(self, pid: int, timeout: float) -> spawnmsgs.Exited | None:
        """The exit status of `pid`, waiting briefly for the forkserver to reap it."""
        deadline = time.monotonic() + timeout
        while pid not in self.exits:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                break
            if not self.receive():
                break
        return self.exits.pop(pid, None)

    def close(self) -> None:
        self.sock.close()          # EOF: the forkserver exits

    def discard(self) -> None:
        """End one that never forked a worker (pulsed refused to start): nothing of it to wait for."""
        self.kill()
        self.wait()
        self.close()
        os.close(self.output_fd)
        os.close(self.pidfd)

    def kill(self) -> None:
        signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int | None:
        """Reap it; its exit code (negative: killed by that signal), or None if still alive at the timeout."""
        if self.returncode is None and select.select([self.pidfd], [], [], timeout)[0]:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


# -- the forkserver process ---------------------------------------------------------------------------

class Spare(NamedTuple):
    """A fork made ahead of need, waiting for one Spawn: a start then costs no fork."""
    pid: int
    go: socket.socket       # our end: one Spawn with its output fd makes it that worker; EOF ends it


def _detach(server: socket.socket, wakeup: tuple[int, int]) -> None:
    """In any fork: drop the forkserver's own ends and its SIGCHLD handling."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    server.close()
    for fd in wakeup:
        os.close(fd)


def _worker_body(spec: spawnmsgs.Spawn, output_fd: int) -> None:
    """In the forked worker (detached): never returns."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # the forkserver's immunity is not the worker's
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(output_fd)
        from pulse.workers import harness
        module, cls = PRELOAD[spec.name]
        worker_class = getattr(sys.modules[module], cls)
        code = harness.run(spec, worker_class, forkserver_pid=os.getppid())
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _spare_body(go: socket.socket, forkserver: int) -> None:
    """In the spare (detached): wait for one Spawn, then be that worker; never returns. Like the
    forkserver it ignores SIGTERM and SIGINT while it waits, and dies with it."""
    from pulse.core import procs
    spec = None
    try:
        procs.die_with_parent(forkserver)
        procs.set_title(SPARE_TITLE)
        packet, fds, _, _ = socket.recv_fds(go, MAX_PACKET, 1)
        go.close()
        if packet and len(fds) == 1:
            spec = codec.decode(packet, spawnmsgs.Spawn)
    except BaseException:
        traceback.print_exc()
    if spec is None:            # EOF: let go (the forkserver stops), or nothing it could be
        os._exit(0)
    _worker_body(spec, fds[0])


def fork_spare(server: socket.socket, wakeup: tuple[int, int]) -> Spare:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        ours.close()
        _detach(server, wakeup)
        _spare_body(theirs, os.getppid())
    theirs.close()
    return Spare(pid, ours)


def hand_over(spare: Spare, packet: bytes, output_fd: int) -> bool:
    """Tell the spare to go; False if it is gone (killed as it waited)."""
    try:
        socket.send_fds(spare.go, [packet], [output_fd])
        return True
    except OSError:
        return False
    finally:
        spare.go.close()        # one Spawn only: it is never two workers


def preload() -> None:
    """What every fork inherits: the workers' modules (and what they compute as they are imported,
    such as the tick's projection versions), and what the workers import late."""
    for module, _ in PRELOAD.values():
        importlib.import_module(module)
    for module in LATE_IMPORTS:
        importlib.import_module(module)
    import pulse.workers.harness  # noqa: F401  (preloaded for the workers)


def serve(server: socket.socket, parent: int) -> int:
    from pulse.core import procs
    procs.die_with_parent(parent)
    os.chdir("/")   # hold no directory busy
    procs.set_title(TITLE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A SIGTERM to every process (`pkill`, an init system's final round) must not end the forkserver
    # before pulsed has stopped the workers: its death SIGKILLs them all, the event writer with
    # pulsed's last events unwritten. pulsed ends it (closing its socket), or its death does.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    preload()

    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    def send(message) -> None:
        try:
            server.send(codec.encode(message))
        except OSError:
            pass

    spare: Spare | None = None
    unreported: set[int] = set()     # spares never handed over: their exits are nobody's news
    next_spare = time.monotonic() + SPARE_AFTER_S
    while True:
        wait = None if spare is not None else max(0.0, next_spare - time.monotonic())
        readable, _, _ = select.select([server, wake_r], [], [], wait)
        if not readable:
            spare = fork_spare(server, (wake_r, wake_w))
            unreported.add(spare.pid)
            continue
        if wake_r in readable:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                if pid in unreported:
                    unreported.discard(pid)
                    if spare is not None and spare.pid == pid:
                        spare.go.close()
                        spare, next_spare = None, time.monotonic() + SPARE_AFTER_S
                elif os.WIFSIGNALED(status):
                    send(spawnmsgs.Exited(pid, None, os.WTERMSIG(status)))
                else:
                    send(spawnmsgs.Exited(pid, os.waitstatus_to_exitcode(status), None))
        if server in readable:
            try:
                packet, fds, _, _ = socket.recv_fds(server, MAX_PACKET, 1)
            except ConnectionResetError:
                return 0
            if not packet:
                return 0   # pulsed closed its end (a spare sees EOF on its own, and dies with us anyway)
            try:
                spec = codec.decode(packet, spawnmsgs.Spawn)
                if spec.name not in PRELOAD or len(fds) != 1:
                    raise codec.Malformed(f"spawn of {spec.name!r} with {len(fds)} fds")
            except codec.Malformed as err:
                print(f"ERROR pulse.forkserver: dropped a malformed request: {err}", file=sys.stderr, flush=True)
                for fd in fds:
                    os.close(fd)
                continue
            if spare is not None and hand_over(spare, packet, fds[0]):
                pid = spare.pid
                unreported.discard(pid)
            else:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _detach(server, (wake_r, wake_w))
                    _worker_body(spec, fds[0])
            # The next spare is forked once we have been idle a while, not now: the worker just
            # started needs the CPU more.
            spare, next_spare = None, time.monotonic() + SPARE_AFTER_S
            started = time.monotonic()
            os.close(fds[0])
            send(spawnmsgs.Spawned(spec.name, pid, started))


def main() -> None:
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    server = socket.socket(fileno=fd)
    server.setblocking(True)
    code = serve(server, parent)
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: nothing of ours needs it (the workers are gone, a spare dies with
    # us), and tearing down every worker's modules held pulsed's stop up by ~50 ms.
    os._exit(code)


if __name__ == "__main__":
    main()
