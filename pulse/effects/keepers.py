"""The keepers' server: one process per home that forks a keeper (pulse.effects.keeper) for each
start of a [[process]], so a start pays for a fork, not a fresh interpreter and its imports (about
40-100 ms on a loaded 2-core host), and each keeper shares the server's pages instead of holding
its own interpreter (~20 MB each).

    python -m pulse.effects.keepers HOME SOCKET VERSION

The executor asks it (ask) over a Unix socket in the runtime directory (mode 0600 in a 0700
directory; a peer of another uid is refused): one JSON line {version, home, name, log, argv, env,
cwd}. The server forks the keeper, which makes a session of its own and runs with the connection as
its stdout, so the executor reads its reports ({"pid", "since"}, then the exit) as from a keeper it
started itself; the server ignores SIGCHLD, so the kernel reaps each keeper that ends (the server
never waits for one, and a start costs one fork, not two). A keeper so made outlives the server,
the executor and Pulse, as any keeper does.

It is started by the executor when the socket does not answer (that start goes the old way, a
keeper of its own), outside Pulse's cgroup under systemd like a keeper, and runs while this home's
pulsed runs: it ends within CHECK_S of pulsed's end, and at once when asked by an executor of
another VERSION of this code (after an upgrade), so a new one is started from the new code.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

from pulse.effects import keeper

CHECK_S = 2.0                     # how often an idle server checks that its pulsed still runs
MAX_REQUEST = 1024 * 1024         # bytes of one request, read before anything else is done
ASK_TIMEOUT_S = 1.0


def version() -> str:
    """This code's version, as the server and the executor that asks it both compute it: the keeper's
    and this module's sources (a server of other code says no, and ends)."""
    import hashlib  # ~8 ms (OpenSSL): the executor computes this only when it starts a server
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in ("keeper.py", "keepers.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


def server_title(home: str) -> str:
    return f"pulse: keepers ({home})"


# -- the executor's side -----------------------------------------------------------------------------

def ask(sock_path: str, request: dict) -> socket.socket | None:
    """A connection on which a keeper, forked for `request`, will report; None when no server
    answers (the caller starts its keeper the old way, and a server for next time)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    conn.settimeout(ASK_TIMEOUT_S)
    try:
        conn.connect(sock_path)
        conn.sendall(json.dumps(request).encode() + b"\n")
        conn.settimeout(None)
        return conn
    except OSError:
        conn.close()
        return None


def server_argv(home: str, sock_path: str) -> list[str]:
    return [sys.executable, "-m", "pulse.effects.keepers", home, sock_path, version()]


# -- the server ----------------------------------------------------------------------------------------

def serve(home: str, sock_path: str, own_version: str) -> int:
    if os.fork() > 0:
        os._exit(0)               # the executor reaps this half at once; the server lives on, reparented
    # What every keeper needs, loaded once here (after the fork that leaves the executor) and shared
    # by each keeper forked from it: its start and its exit's record
    import psutil  # noqa: F401

    from pulse.core import client, guarded, procs  # noqa: F401
    from pulse.core.home import Paths
    from pulse.store import connection, eventsdb  # noqa: F401

    procs.set_title(server_title(home))
    procs.libc()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # the keepers it forks are reaped by the kernel
    gc.freeze()                   # what is loaded now stays shared: no collection of a keeper writes to it
    lock = open(sock_path + ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0                  # another server of this home runs: it answers
    try:
        os.unlink(sock_path)      # a dead server's socket
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)
    try:
        server.bind(sock_path)
    finally:
        os.umask(old_umask)
    bound = os.stat(sock_path).st_ino   # the socket file's own inode (fstat of the socket is sockfs')
    server.listen(16)
    server.settimeout(CHECK_S)
    paths = Paths.for_client(Path(home))
    try:
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                if client.daemon_pid(paths) is None or not _still_bound(sock_path, bound):
                    return 0      # its pulsed is gone (or removed this socket at its stop): the next
                continue          # executor starts a server of its own
            with conn:
                request = _request(conn)
                if request is None:
                    continue
                if request.get("version") != own_version:
                    _say(conn, {"refused": "version"})
                    return 0      # an upgraded Pulse asks: end, so a server of the new code starts
                _fork_keeper(conn, request, keeper, inherited=(server, lock))
    finally:
        if _still_bound(sock_path, bound):
            os.unlink(sock_path)
        try:
            os.unlink(lock.name)  # ours while we hold it: no other server of this home uses it
        except FileNotFoundError:
            pass                  # pulsed removed it at its stop
        server.close()


def _still_bound(sock_path: str, bound: int) -> bool:
    """Is `sock_path` still the file this server bound (inode `bound`): not removed, nor another's since?"""
    try:
        return os.stat(sock_path).st_ino == bound
    except OSError:
        return False


def _request(conn: socket.socket) -> dict | None:
    """The request, from a peer of this uid only, one bounded JSON line; None otherwise."""
    uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
    if uid != os.getuid():
        return None
    conn.settimeout(ASK_TIMEOUT_S)
    data = b""
    try:
        while not data.endswith(b"\n") and len(data) <= MAX_REQUEST:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        request = json.loads(data)
    except (OSError, ValueError):
        return None
    conn.settimeout(None)
    return request if isinstance(request, dict) else None


def _say(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass


def _fork_keeper(conn: socket.socket, request: dict, keeper, inherited: tuple) -> None:
    """Fork a keeper for `request`; `inherited`: the server's socket and lock, closed in the keeper
    (a keeper holding the lock would keep every later server from starting)."""
    try:
        pid = os.fork()
    except OSError as err:
        _say(conn, {"refused": f"fork: {err}"})
        return
    if pid > 0:
        return                    # reaped by the kernel when it ends (SIGCHLD ignored)
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)   # the keeper waits for its own child's exit
        for held in inherited:
            held.close()
        os.setsid()
        os.dup2(conn.fileno(), 1)  # its reports go to the executor that asked
        conn.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        code = keeper.keep(request["home"], request["name"], request["log"], list(request["argv"]),
                           env=request.get("env"), cwd=request.get("cwd"), user=request.get("user"))
    except BaseException as err:  # a keeper never returns into the server's loop
        try:
            os.write(2, f"[pulse] keeper of {request.get('name')!r}: {err!r}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.exit(serve(*sys.argv[1:]))
