"""One message to a ZeroMQ socket over ipc://, in ZMTP 3.0 (rfc.zeromq.org/spec/23), without libzmq.

pulsectl sends one request and reads one reply (a DEALER to pulsed's ROUTER), or rings a worker's
doorbell (a PUSH to its PULL): importing pyzmq, starting a context's I/O thread and ending it cost
more than the exchange itself, about a fifth of a `pulsectl` command. The peer is libzmq, which
speaks 3.0 to a peer that greets with 3.0. The NULL mechanism only: Pulse's sockets are unix
sockets in its own runtime directory, never on a network.
"""

from __future__ import annotations

import struct
import time

# The socket module's low-level half: socket.py adds selectors, enums and sendfile, a few ms of
# every command, and nothing used here.
from _socket import AF_UNIX, SOCK_CLOEXEC, SOCK_STREAM
from _socket import socket as Socket
from _socket import timeout as SocketTimeout

GREETING = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" + bytes(31)
MORE, LONG, COMMAND = 1, 2, 4
RETRY_S = 0.01   # while the peer's socket refuses connections (not yet bound, or being replaced)


class Timeout(Exception):
    """No answer within the deadline."""


class Refused(Exception):
    """Nobody accepts connections on the socket (or the peer broke the exchange off)."""


def ipc_path(endpoint: str) -> str:
    if not endpoint.startswith("ipc://"):
        raise ValueError(f"not an ipc:// endpoint: {endpoint}")
    return endpoint[len("ipc://"):]


class Peer:
    """A connected, greeted ZMTP peer; `kind` is our socket type (DEALER, PUSH)."""

    def __init__(self, endpoint: str, kind: str, timeout: float, *, retry: bool):
        self.deadline = time.monotonic() + timeout
        self.sock = self._connect(ipc_path(endpoint), retry)
        try:
            self.sock.sendall(GREETING + frame(b"\x05READY" + prop(b"Socket-Type", kind.encode()), COMMAND))
            greeting = self._read(64)
            if greeting[0] != 0xFF or greeting[9] != 0x7F or greeting[10] < 3:
                raise Refused(f"{endpoint} does not speak ZMTP 3")
            while True:             # the peer's READY (or ERROR); nothing else comes before it
                flags, body = self._frame()
                if not flags & COMMAND:
                    raise Refused(f"{endpoint} sent a message before its READY")
                if body.startswith(b"\x05ERROR"):
                    raise Refused(f"{endpoint} refused the handshake: {body[7:].decode(errors='replace')}")
                if body.startswith(b"\x05READY"):
                    break
        except BaseException:
            self.sock.close()
            raise

    def _connect(self, path: str, retry: bool) -> Socket:
        while True:
            sock = Socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC)
            try:
                sock.settimeout(self._left())
                sock.connect(path)
                return sock
            except (ConnectionRefusedError, FileNotFoundError) as err:
                sock.close()
                # libzmq reconnects the same way: a peer that binds within the deadline is reached
                if not retry or self.deadline - time.monotonic() <= RETRY_S:
                    raise Refused(f"{path}: {err.strerror}") from None
                time.sleep(RETRY_S)
            except BaseException:
                sock.close()
                raise

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Timeout()
        return left

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            self.sock.settimeout(self._left())
            try:
                chunk = self.sock.recv(n - len(data))
            except SocketTimeout:
                raise Timeout() from None
            if not chunk:
                raise Refused("the peer closed the connection")
            data += chunk
        return data

    def _frame(self) -> tuple[int, bytes]:
        flags = self._read(1)[0]
        size = struct.unpack(">Q", self._read(8))[0] if flags & LONG else self._read(1)[0]
        return flags, self._read(size)

    def send(self, message: bytes) -> None:
        self.sock.settimeout(self._left())
        self.sock.sendall(frame(message))

    def receive(self) -> bytes:
        """The next message (its frames joined; Pulse sends one frame), skipping commands."""
        parts = []
        while True:
            flags, body = self._frame()
            if flags & COMMAND:
                continue            # a PING (heartbeats are off in Pulse; harmless if one comes)
            parts.append(body)
            if not flags & MORE:
                return b"".join(parts)

    def close(self) -> None:
        self.sock.close()


def frame(body: bytes, flags: int = 0) -> bytes:
    if len(body) > 255:
        return bytes([flags | LONG]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def prop(name: bytes, value: bytes) -> bytes:
    return bytes([len(name)]) + name + struct.pack(">I", len(value)) + value


def request(endpoint: str, message: bytes, timeout: float) -> bytes:
    """Send `message` as a DEALER and return the reply (Timeout, Refused)."""
    peer = Peer(endpoint, "DEALER", timeout, retry=True)
    try:
        peer.send(message)
        return peer.receive()
    finally:
        peer.close()


def push(endpoint: str, message: bytes, timeout: float) -> None:
    """Hand `message` to a PULL socket (Timeout, Refused, OSError when nobody takes it)."""
    peer = Peer(endpoint, "PUSH", timeout, retry=False)
    try:
        peer.send(message)
    finally:
        peer.close()
