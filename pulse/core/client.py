"""Talking to a running pulsed over its control socket (pulsectl, and later the agent's tools)."""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from pulse.core.home import Paths

if TYPE_CHECKING:
    import zmq

    from pulse.core.wire import controlmsgs

# Imports inside functions: what only a request, a ring or a worker's own socket needs (libzmq ~18 ms,
# python -X importtime): pulsectl's commands that ask pulsed nothing import this module and load none;
# and the codec (msgspec, ~30 ms), which `pulsectl status` does without (exchange).

DEFAULT_TIMEOUT_S = 3.0


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
    import zmq  # here: pulsectl's commands that ask pulsed nothing never load libzmq
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    for key, value in options.items():
        sock.setsockopt(getattr(zmq, key), value)
    (sock.bind if bind else sock.connect)(endpoint)
    return sock


RING_S = 0.5    # how long a ring may wait for a worker that is rebinding (restarting) its doorbell


def ring(paths: Paths, socket: str, message) -> None:
    """Ring a worker's doorbell (wake, doorbell, fleet) from outside Pulse: dropped if nobody
    listens, since the receiver finds the work at its next scan anyway. Over pulse.core.zmtp, not
    libzmq: the message is handed over (or dropped) before this returns, so a process that rings
    and exits loses nothing, and pulsectl does not load libzmq for one message. A ring waits at most
    RING_S, for a worker that is restarting (its socket refused or missing for a moment)."""
    if not paths.socket_file(socket).exists() or daemon_pid(paths) is None:
        return          # nobody to wake (a worker stopped, no pulsed): not even RING_S
    from pulse.core import zmtp
    from pulse.core.wire import codec
    try:
        zmtp.push(str(paths.socket_file(socket)), codec.encode(message), RING_S)
    except (OSError, zmtp.ProtocolError):
        pass


def _denied(paths: Paths) -> Unreachable:
    return Unreachable(f"pulsed's control socket {paths.socket_file('control')}: permission denied "
                       "(this account may not steer pulsed)")


def request(paths: Paths, message, timeout: float = DEFAULT_TIMEOUT_S) -> controlmsgs.Reply:
    from pulse.core.wire import codec, controlmsgs  # its ~30 Structs: a ring (task add) needs none of them
    return codec.decode(exchange(paths, codec.encode(message), timeout), controlmsgs.Reply)


def exchange(paths: Paths, frame: bytes, timeout: float = DEFAULT_TIMEOUT_S) -> bytes:
    """A request's frame to pulsed's control socket, and the frame of its reply."""
    if daemon_pid(paths) is None:
        raise Unreachable(f"pulsed is not running on {paths.home}")
    try:
        present = Path(paths.socket_file("control")).exists()
    except PermissionError:     # an account Pulse keeps out (an agent run's own user): say so, not a traceback
        raise _denied(paths) from None
    if not present:
        raise Unreachable(f"pulsed on {paths.home} has no control socket at {paths.socket_file('control')}")
    from pulse.core import zmtp  # not pyzmq: ~18 ms of import, more than the rest of `pulsectl status`
    try:
        return zmtp.request(str(paths.socket_file("control")), frame, timeout)
    except TimeoutError:
        raise Unreachable(f"pulsed on {paths.home} did not answer within {timeout:g}s") from None
    except PermissionError:
        raise _denied(paths) from None
    except (OSError, zmtp.ProtocolError) as err:
        raise Unreachable(f"pulsed on {paths.home} did not answer on {paths.socket_file('control')}: {err}") from None
