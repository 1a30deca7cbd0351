"""ZMTP 3.0 over a unix socket, as much of it as talking to pulsed's libzmq sockets from outside takes.

pulsectl's requests (DEALER → pulsed's ROUTER, control) and rings (PUSH → a worker's PULL, wake and
doorbell) are one message each way at most. Importing pyzmq for them (libzmq and its Cython backend)
cost ~18 ms of CPU, more than the rest of a `pulsectl status`; this module costs well under one.
Workers keep pyzmq: their sockets live long, poll together and reconnect, which libzmq does better.

The wire (rfc.zeromq.org/spec/23, NULL mechanism, spec 37 for the commands): each side sends a
64-byte greeting, then a READY command naming its socket type; then messages, as frames of a flags
byte (MORE, LONG, COMMAND) and a size of one byte, or eight when LONG. libzmq 4.x accepts a 3.0 peer.

What a peer may make us do is bounded: it is checked (SO_PEERCRED: the account that owns the
runtime directory, or root) before anything is read from it; a command may be MAX_COMMAND bytes
and a message `limit` bytes, checked on each frame's declared size before its bytes are read, and
read as they come, so a declared 2^63 is refused and a lying size allocates nothing; one deadline
covers connecting, the handshake and the reply.
"""

from __future__ import annotations

import _socket  # the C module alone: `socket` adds selectors, array and its enums, ~3 ms of a 50 ms budget
import os
import struct
import time

GREETING = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" + bytes(31)
MORE, LONG, COMMAND = 1, 2, 4
MAX_COMMAND = 64 * 1024              # READY: a socket type, a routing id (≤ 255 bytes), metadata
MAX_MESSAGE = 16 * 1024 * 1024       # a reply: pulsed's status or its whole config is a few KiB
PEER_TYPE = {b"DEALER": b"ROUTER", b"PUSH": b"PULL"}
CONNECT_RETRY_S = 0.01               # a peer binding (or rebinding after a restart): libzmq retries too
CHUNK = 256 * 1024
_UCRED = struct.Struct("3i")         # struct ucred: pid, uid, gid
_SIZE = struct.Struct(">Q")
_PROPERTY_SIZE = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer is not what we asked for, broke ZMTP, said too much, or closed mid-way."""


def request(path: str, payload: bytes, timeout: float, limit: int = MAX_MESSAGE) -> bytes:
    """As a DEALER: send `payload` to the ROUTER at `path`, return its reply (the last frame of the
    first message back). TimeoutError past `timeout`, counting from here."""
    with Link(path, b"DEALER", time.monotonic() + timeout) as link:
        link.send(payload)
        return link.receive(limit)[-1]


def push(path: str, payload: bytes, timeout: float) -> None:
    """As a PUSH: hand `payload` to the PULL at `path`, then hang up (libzmq delivers what it read
    before the hang-up)."""
    with Link(path, b"PUSH", time.monotonic() + timeout) as link:
        link.send(payload)


class Link:
    """One connection, handshake done: to a libzmq socket of the type that pairs with `kind`."""

    def __init__(self, path: str, kind: bytes, deadline: float):
        self.path, self.deadline = path, deadline
        self.stage = f"the handshake (is it a {PEER_TYPE[kind].decode()} socket?)"   # libzmq hangs up on a mismatch
        self.sock = connect(path, deadline)
        try:
            check_peer(self.sock, path)
            self.sock.settimeout(self.remaining())
            self.sock.sendall(GREETING + command(b"READY", {b"Socket-Type": kind}))
            check_greeting(self.read_exact(len(GREETING)))
            name, body = self.read_command()
            if name == b"ERROR":
                raise ProtocolError(f"{path} refused us: {error_reason(body)}")
            if name != b"READY":
                raise ProtocolError(f"{path} sent {name!r} where READY belongs")
            theirs = properties(body).get(b"socket-type")
            if theirs != PEER_TYPE[kind]:
                raise ProtocolError(f"{path} is a {(theirs or b'?').decode(errors='replace')} socket, "
                                    f"not a {PEER_TYPE[kind].decode()}")
        except BaseException:
            self.sock.close()
            raise
        self.stage = "a message"

    def __enter__(self) -> "Link":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{self.path}: no answer in time")
        return left

    def send(self, payload: bytes) -> None:
        self.sock.settimeout(self.remaining())
        self.sock.sendall(frame(payload))

    def receive(self, limit: int) -> list[bytes]:
        """The next message's frames (commands between messages, a heartbeat's, are skipped),
        at most `limit` bytes in all."""
        frames: list[bytes] = []
        while True:
            flags, body = self.read_frame(limit - sum(map(len, frames)))
            if flags & COMMAND:
                if frames:
                    raise ProtocolError(f"{self.path} sent a command inside a message")
                continue
            frames.append(body)
            if not flags & MORE:
                return frames

    def read_command(self) -> tuple[bytes, bytes]:
        flags, body = self.read_frame(MAX_COMMAND)
        if not flags & COMMAND:
            raise ProtocolError(f"{self.path} sent a message before its handshake")
        if not body or len(body) < 1 + body[0]:
            raise ProtocolError(f"{self.path} sent a truncated command")
        return body[1:1 + body[0]], body[1 + body[0]:]

    def read_frame(self, limit: int) -> tuple[int, bytes]:
        flags = self.read_exact(1)[0]
        if flags & ~(MORE | LONG | COMMAND) or flags & (MORE | COMMAND) == (MORE | COMMAND):
            raise ProtocolError(f"{self.path} sent a frame with flags {flags:#04x}")
        size = _SIZE.unpack(self.read_exact(8))[0] if flags & LONG else self.read_exact(1)[0]
        if size > limit:
            raise ProtocolError(f"{self.path} sent a frame of {size} bytes, more than the {limit} it may")
        return flags, self.read_exact(size)

    def read_exact(self, n: int) -> bytes:
        """`n` bytes, read as they come (nothing allocated ahead of what arrived)."""
        data = bytearray()
        while len(data) < n:
            self.sock.settimeout(self.remaining())
            chunk = self.sock.recv(min(n - len(data), CHUNK))
            if not chunk:
                raise ProtocolError(f"{self.path} closed the connection during {self.stage} "
                                    f"({len(data)} of {n} bytes read)")
            data += chunk
        return bytes(data)


def connect(path: str, deadline: float) -> _socket.socket:
    """A connected unix stream socket; while the path is refused or missing (a peer binding, or
    rebinding after a restart), tried again until `deadline`, as libzmq reconnects."""
    while True:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(path)
            return sock
        except (ConnectionRefusedError, FileNotFoundError):
            sock.close()
            if time.monotonic() + CONNECT_RETRY_S >= deadline:
                raise TimeoutError(f"{path}: nobody listening") from None
            time.sleep(CONNECT_RETRY_S)
        except BaseException:
            sock.close()
            raise


def check_peer(sock: _socket.socket, path: str) -> None:
    """The process listening at `path` runs as the account that owns its directory (the runtime
    directory pulsed made), or as root: nothing is read from anyone else."""
    _, uid, _ = _UCRED.unpack(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED.size))
    owner = os.stat(os.path.dirname(path) or ".").st_uid
    if uid not in (0, owner):
        raise ProtocolError(f"{path} is served by uid {uid}, not by uid {owner} that owns its directory")


def check_greeting(greeting: bytes) -> None:
    if greeting[0] != 0xFF or not greeting[9] & 1:
        raise ProtocolError("the peer does not speak ZMTP")
    if greeting[10] < 3:
        raise ProtocolError(f"the peer speaks ZMTP {greeting[10]}.x, not 3")
    if greeting[12:32].rstrip(b"\0") != b"NULL":
        raise ProtocolError(f"the peer asks for the {greeting[12:32].rstrip(bytes(1))!r} mechanism, not NULL")


def frame(body: bytes, flags: int = 0) -> bytes:
    if len(body) < 256:
        return bytes([flags, len(body)]) + body
    return bytes([flags | LONG]) + _SIZE.pack(len(body)) + body


def command(name: bytes, props: dict[bytes, bytes]) -> bytes:
    body = bytes([len(name)]) + name + b"".join(bytes([len(k)]) + k + _PROPERTY_SIZE.pack(len(v)) + v
                                                 for k, v in props.items())
    return frame(body, COMMAND)


def properties(body: bytes) -> dict[bytes, bytes]:
    """READY's metadata: name (1-byte size, any case) and value (4-byte size) pairs."""
    found, i = {}, 0
    while i < len(body):
        name_end = i + 1 + body[i]
        if name_end + 4 > len(body):
            raise ProtocolError("a truncated READY")
        value_end = name_end + 4 + _PROPERTY_SIZE.unpack_from(body, name_end)[0]
        if value_end > len(body):
            raise ProtocolError("a truncated READY")
        found[body[i + 1:name_end].lower()] = body[name_end + 4:value_end]
        i = value_end
    return found


def error_reason(body: bytes) -> str:
    return body[1:1 + body[0]].decode(errors="replace") if body else "(no reason)"
