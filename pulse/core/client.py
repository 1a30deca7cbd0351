"""Talking to a running pulsed over its control socket (pulsectl, and later the agent's tools)."""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from pulse.core import wire
from pulse.core.home import Paths

if TYPE_CHECKING:
    import zmq

DEFAULT_TIMEOUT_S = 3.0
RING_S = 0.5


class Unreachable(Exception):
    """No pulsed answered: not running, or not responding within the deadline."""


_FLOCK = "hhqqi4x"   # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid


def daemon_pid(paths: Paths) -> int | None:
    """The pid of the pulsed holding this home's lock, or None when none does.

    Asks the kernel (F_GETLK) without taking the lock, so it never races a starting
    pulsed, and a dead or zombie pulsed (which holds no lock) reads as gone at once.
    """
    try:
        fd = os.open(paths.lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except PermissionError:
        return -1    # another user's home: cannot tell, let the socket decide
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        l_type, _, _, _, l_pid = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, query))
    finally:
        os.close(fd)
    return None if l_type == fcntl.F_UNLCK else l_pid


# A worker's doorbell to another worker (wake, doorbell): IMMEDIATE, so a ring while the peer is
# away fails at once instead of queueing; and a fast reconnect (10 ms, backing off to 200 ms), so a
# peer that binds later, or restarts, hears the next ring within milliseconds, not zmq's 100 ms.
DOORBELL = {"SNDHWM": 4, "IMMEDIATE": 1, "RECONNECT_IVL": 10, "RECONNECT_IVL_MAX": 200}


def open_socket(ctx: zmq.Context, kind: int, endpoint: str, *, bind: bool, **options: int) -> zmq.Socket:
    """A socket as every Pulse process makes them: LINGER 0 (closing never waits on a missing
    peer), further options by name (`SNDHWM=16`), bound or connected."""
    # the workers' (preloaded); pulsectl's requests need none (pulse.core.zmtp)
    import zmq

    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    for key, value in options.items():
        sock.setsockopt(getattr(zmq, key), value)
    (sock.bind if bind else sock.connect)(endpoint)
    return sock


def ring(paths: Paths, socket: str, message) -> None:
    """Ring a worker's doorbell (wake, doorbell) from outside Pulse: dropped if nobody listens,
    since the receiver finds the work at its next scan anyway. Half a second at most, as the
    LINGER it had when it went through libzmq."""
    from pulse.core import zmtp
    try:
        zmtp.push(paths.endpoint(socket), wire.encode(message), RING_S)
    except (zmtp.Timeout, zmtp.Refused, OSError):
        pass


def request(paths: Paths, message, timeout: float = DEFAULT_TIMEOUT_S) -> wire.Reply:
    """One request to pulsed's control socket, over pulse.core.zmtp: a pulsectl command pays for
    no libzmq (its import and its context's I/O thread were a fifth of `pulsectl status`)."""
    from pulse.core import zmtp
    if daemon_pid(paths) is None:
        raise Unreachable(f"pulsed is not running on {paths.home}")
    denied = Unreachable(f"pulsed's control socket {paths.socket_file('control')}: permission denied "
                         "(this account may not steer pulsed)")
    try:
        present = Path(paths.socket_file("control")).exists()
    except PermissionError:     # an account Pulse keeps out (an agent run's own user): say so, not a traceback
        raise denied from None
    if not present:
        raise Unreachable(f"pulsed on {paths.home} has no control socket at {paths.socket_file('control')}")
    try:
        answer = zmtp.request(paths.endpoint("control"), wire.encode(message), timeout)
    except PermissionError:
        raise denied from None
    except (zmtp.Timeout, zmtp.Refused, OSError):
        # as libzmq did: a socket nobody serves, or a pulsed that is stopped, is waited on to the deadline
        raise Unreachable(f"pulsed on {paths.home} did not answer within {timeout:g}s") from None
    return wire.decode(answer, wire.Reply)
