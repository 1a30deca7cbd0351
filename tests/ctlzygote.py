"""`pulsectl` for the tests, forked from a process that has imported it already.

A test's `pulsectl` runs were ~1,200 a run at ~0.1 s of CPU each, nearly all of it the interpreter's
start and pulsectl's imports, on a run that is CPU-bound. This process (one per test worker, started
at its first request, ended by pid with the worker's session, ending at its socket's EOF) imports
pulse.cli and what its commands import, then forks one child per request: the child takes the
request's stdout and stderr, environment, working directory and argv, and runs pulsectl's own entry
point (pulse.cli.main), as the console script does, exit code and all. What stays the console
script's alone (its imports, the interpreter's start) is tested by the tests that run it by path.

Protocol over a SOCK_SEQPACKET socketpair, one request at a time: the client sends JSON
{"argv", "env", "cwd", "entry"} (cwd null: the caller's was removed; entry "main", pulsectl's entry
point, or "click", its click group alone) with its stdout and stderr pipes as fds;
the zygote answers {"pid"} once forked, then {"code"} once it has reaped the child (a negative code:
killed by that signal). EOF on the socket, idle or mid-run, ends the zygote and its run: the worker
died, or cut an exchange short. Not PR_SET_PDEATHSIG towards the worker: that fires when the worker's
*thread* that started the zygote ends, and tests start it from threads (asyncio.to_thread).
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import select
import signal
import socket
import sys
import traceback

import pulse.cli
from pulse.core import procs
from pulse.core.leanimport import import_msgspec

MAX_REQUEST = 1 << 20


def preload() -> None:
    """pulsectl's modules, and what its commands import inside their functions."""
    import_msgspec()
    for module in pkgutil.iter_modules(pulse.cli.__path__, "pulse.cli."):
        if module.name != "pulse.cli.mcp":          # the MCP SDK: only `pulsectl mcp`, long-lived
            importlib.import_module(module.name)
    for name in ("pulse.core.client", "pulse.core.zmtp", "pulse.core.config", "pulse.core.instances",
                 "pulse.core.wire.controlmsgs", "pulse.core.wire.eventmsgs", "pulse.core.wire.plainmsgpack",
                 "pulse.store.eventsdb", "pulse.store.connection", "pulse.agents.tasks"):
        importlib.import_module(name)


def child(request: dict, zygote: int, out: int, err: int) -> None:
    """In the fork: become that pulsectl run; never returns. It dies with the zygote, which its client
    kills when an exchange is cut short (a test's timeout firing mid-run)."""
    code = 1
    try:
        procs.die_with_parent(zygote)
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        if request["cwd"] is not None:
            os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = request["argv"]
        if request["entry"] == "click":
            from pulse.cli.group import cli
            cli()
        else:
            pulse.cli.main()
        code = 0
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            code = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
        os._exit(code)


def serve(sock: socket.socket) -> None:
    while True:
        packet, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 2)
        if not packet:
            return                                      # the test worker is done
        request = json.loads(packet)
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:
            sock.close()
            child(request, zygote, *fds)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
        code = reaped(pid, sock)
        if code is None:
            return
        sock.send(json.dumps({"code": code}).encode())


def reaped(pid: int, sock: socket.socket) -> int | None:
    """The run's exit code once it has ended; None, with the run killed, if the socket reached EOF
    first (no request comes mid-run, so the socket is readable then only at its end)."""
    pidfd = os.pidfd_open(pid)
    try:
        readable, _, _ = select.select([pidfd, sock], [], [])
    finally:
        os.close(pidfd)
    ended = pidfd in readable
    if not ended:
        os.kill(pid, signal.SIGKILL)                    # not reaped yet: still our child
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if ended else None


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    preload()
    serve(sock)
    os._exit(0)


if __name__ == "__main__":
    main()
