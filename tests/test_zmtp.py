"""pulse.core.zmtp against real libzmq sockets (pyzmq's, and a real pulsed's), and against peers that
misbehave on purpose (a raw unix socket speaking the greeting, then lying or hanging up)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
import zmq

from pulse.core import client, zmtp
from pulse.core.wire import codec, controlmsgs, doorbells
from support import init_home, wait_for


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def bound(ctx, kind: int, path) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"ipc://{path}")
    return sock


def serve_once(sock: zmq.Socket, reply: list[bytes]) -> threading.Thread:
    """A ROUTER that answers one request with `reply` (frames after the caller's routing id)."""
    def run():
        if sock.poll(10_000):
            identity, _ = sock.recv_multipart()
            sock.send_multipart([identity, *reply])
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# -- real libzmq sockets ----------------------------------------------------------------------------------

def test_a_request_to_a_libzmq_router_gets_its_reply_whole_however_many_frames_and_bytes(ctx, tmp_path):
    path = tmp_path / "control.ipc"
    router = bound(ctx, zmq.ROUTER, path)
    big = os.urandom(3 * zmtp.CHUNK + 17)                       # a long frame, read in several pieces
    for reply in ([b"short"], [b"first part", big], [big]):
        thread = serve_once(router, reply)
        assert zmtp.request(str(path), b"hello", 5.0) == reply[-1]
        thread.join(10)


def test_the_router_sees_one_frame_from_a_dealer_and_answers_it(ctx, tmp_path):
    path = tmp_path / "control.ipc"
    router = bound(ctx, zmq.ROUTER, path)
    seen = []

    def run():
        if router.poll(10_000):
            frames = router.recv_multipart()
            seen.append(frames[1:])
            router.send_multipart([frames[0], frames[1][::-1]])
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    payload = b"x" * 300 + b"end"                               # long enough for an 8-byte size
    assert zmtp.request(str(path), payload, 5.0) == payload[::-1]
    thread.join(10)
    assert seen == [[payload]]


def test_pushes_that_hang_up_at_once_each_reach_a_libzmq_pull(ctx, tmp_path):
    path = tmp_path / "wake.ipc"
    pull = bound(ctx, zmq.PULL, path)
    sent = [f"ring {i}".encode() * (i + 1) for i in range(20)]
    for payload in sent:
        zmtp.push(str(path), payload, 5.0)
    got = []
    while len(got) < len(sent) and pull.poll(10_000):
        got.append(pull.recv())
    assert got == sent


def test_a_reply_that_is_not_timely_is_a_timeout_within_the_deadline(ctx, tmp_path):
    path = tmp_path / "control.ipc"
    router = bound(ctx, zmq.ROUTER, path)                       # takes the request, never answers
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        zmtp.request(str(path), b"hello", 0.3)
    assert time.monotonic() - t0 < 2.0
    assert router.poll(0), "the request arrived; the reply did not"


def test_a_reply_over_the_limit_is_refused_by_its_declared_size(ctx, tmp_path):
    path = tmp_path / "control.ipc"
    thread = serve_once(bound(ctx, zmq.ROUTER, path), [b"y" * 5000])
    with pytest.raises(zmtp.ProtocolError, match="frame of 5000 bytes, more than the 4096"):
        zmtp.request(str(path), b"hello", 5.0, limit=4096)
    thread.join(10)


def test_a_socket_of_the_wrong_type_is_named(ctx, tmp_path):
    path = tmp_path / "wake.ipc"
    pull = bound(ctx, zmq.PULL, path)
    with pytest.raises(zmtp.ProtocolError, match=r"closed the connection during the handshake \(is it a ROUTER"):
        zmtp.request(str(path), b"hello", 5.0)
    assert not pull.poll(0), "nothing reached the PULL"


def test_a_path_nobody_listens_on_is_a_timeout_after_retrying(tmp_path):
    missing = tmp_path / "missing.ipc"
    with pytest.raises(TimeoutError):
        zmtp.request(str(missing), b"hello", 0.1)
    stale = tmp_path / "stale.ipc"                              # bound, never listening: refused
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(str(stale))
    try:
        with pytest.raises(TimeoutError):
            zmtp.push(str(stale), b"ring", 0.1)
    finally:
        leftover.close()


def test_a_peer_that_binds_late_is_reached_within_the_deadline(ctx, tmp_path):
    """As libzmq's reconnect: a ring to a worker that is rebinding its socket gets there."""
    path = tmp_path / "wake.ipc"
    got = []

    def late():
        time.sleep(0.1)             # a rebinding worker (the point: the push is already waiting)
        pull = bound(ctx, zmq.PULL, path)
        if pull.poll(10_000):
            got.append(pull.recv())
        pull.close()
    thread = threading.Thread(target=late, daemon=True)
    thread.start()
    zmtp.push(str(path), b"late ring", 5.0)
    thread.join(10)
    assert got == [b"late ring"]


# -- peers that misbehave ---------------------------------------------------------------------------------

READY_ROUTER = zmtp.command(b"READY", {b"Socket-Type": b"ROUTER"})


def raw_peer(path, script) -> threading.Thread:
    """A listening unix socket that runs `script(conn)` on its one connection."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def run():
        conn, _ = listener.accept()
        try:
            script(conn)
        finally:
            conn.close()
            listener.close()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def handshake(conn) -> None:
    """Greet as a ROUTER and take the DEALER's greeting, READY and request (b"hello")."""
    conn.sendall(zmtp.GREETING + READY_ROUTER)
    expected = zmtp.GREETING + zmtp.command(b"READY", {b"Socket-Type": b"DEALER"}) + zmtp.frame(b"hello")
    got = b""
    while len(got) < len(expected) and (chunk := conn.recv(len(expected) - len(got))):
        got += chunk
    assert got == expected


def hang_on(conn) -> None:
    """Until the client hangs up."""
    try:
        while conn.recv(1 << 16):
            pass
    except ConnectionResetError:     # it hung up with our bytes unread
        pass


def test_a_hostile_frame_size_is_refused_before_anything_is_allocated(tmp_path):
    path = tmp_path / "control.ipc"
    thread = raw_peer(path, lambda conn: (handshake(conn), conn.sendall(b"\x02" + struct.pack(">Q", 2**63)),
                                          hang_on(conn)))
    with pytest.raises(zmtp.ProtocolError, match=f"frame of {2**63} bytes"):
        zmtp.request(str(path), b"hello", 5.0)
    thread.join(10)


def test_a_peer_that_closes_mid_reply_is_an_error_not_a_short_reply(tmp_path):
    path = tmp_path / "control.ipc"
    thread = raw_peer(path, lambda conn: (handshake(conn), conn.sendall(b"\x02" + struct.pack(">Q", 1000) + b"z" * 10)))
    with pytest.raises(zmtp.ProtocolError, match=r"closed the connection during a message \(10 of 1000 bytes read\)"):
        zmtp.request(str(path), b"hello", 5.0)
    thread.join(10)


def test_a_peer_that_does_not_speak_zmtp_is_named(tmp_path):
    path = tmp_path / "control.ipc"
    thread = raw_peer(path, lambda conn: (conn.sendall(b"HTTP/1.1 400 Bad Request\r\n" + b" " * 64),
                                          hang_on(conn)))
    with pytest.raises(zmtp.ProtocolError, match="does not speak ZMTP"):
        zmtp.request(str(path), b"hello", 5.0)
    thread.join(10)


def test_a_peer_that_refuses_with_an_error_command_says_why(tmp_path):
    path = tmp_path / "control.ipc"
    thread = raw_peer(path, lambda conn: (conn.sendall(zmtp.GREETING + zmtp.frame(b"\x05ERROR\x06denied",
                                                                                   zmtp.COMMAND)),
                                          hang_on(conn)))
    with pytest.raises(zmtp.ProtocolError, match="refused us: denied"):
        zmtp.request(str(path), b"hello", 5.0)
    thread.join(10)


# A listener as another account (nobody), in a directory of ours: what it would say is never read.
OTHER_ACCOUNT = """\
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
os.setgid(65534); os.setuid(65534)
s.listen(1)                       # SO_PEERCRED: the credentials in force at listen()
print("listening", flush=True)
conn, _ = s.accept()
conn.sendall(bytes.fromhex(sys.argv[2]))        # a ROUTER's greeting
sys.stdin.read()
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to listen as another account")
def test_a_listener_of_another_account_is_refused_before_anything_is_read(tmp_path, tracker):
    path = tmp_path / "control.ipc"
    greeting = (zmtp.GREETING + READY_ROUTER).hex()
    proc = subprocess.Popen([sys.executable, "-c", OTHER_ACCOUNT, str(path), greeting],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    tracker.add(proc.pid)
    try:
        assert proc.stdout.readline() == "listening\n"
        with pytest.raises(zmtp.ProtocolError, match="served by uid 65534, not by uid 0"):
            zmtp.request(str(path), b"hello", 5.0)
    finally:
        proc.stdin.close()
        proc.wait(10)


# -- a real pulsed ----------------------------------------------------------------------------------------

def test_requests_and_rings_reach_a_real_pulsed_and_say_when_it_is_frozen_or_gone(pulsed):
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text('[log]\nlevel = "debug"\n')     # the tick logs who woke it
    pulsed.start()
    paths = pulsed.paths
    status = client.request(paths, controlmsgs.GetStatus(), 5.0).status
    assert status.supervisor.pid == pulsed.proc.pid
    assert {w.name for w in status.workers} >= {"watcher", "tick", "executor", "engine"}
    # what pulsed cannot decode is answered as such: the request reached its ROUTER whole
    reply = codec.decode(zmtp.request(str(paths.socket_file("control")), b"\xc1", 5.0), controlmsgs.Reply)
    assert not reply.ok and "malformed request" in reply.error
    # a ring reaches the tick's PULL, though the ringing side hangs up at once
    client.ring(paths, "wake", doorbells.Wake("test", "a zmtp ring"))
    wait_for(lambda: "woken by test (a zmtp ring)" in pulsed.log_text(), 10, what="the tick woken by the ring")
    os.kill(pulsed.proc.pid, signal.SIGSTOP)       # connects (the kernel's backlog), never answers
    try:
        t0 = time.monotonic()
        with pytest.raises(client.Unreachable, match="did not answer within 0.3s"):
            client.request(paths, controlmsgs.GetStatus(), 0.3)
        assert time.monotonic() - t0 < 2.0
    finally:
        os.kill(pulsed.proc.pid, signal.SIGCONT)
    assert pulsed.terminate() == 0
    with pytest.raises(client.Unreachable, match="pulsed is not running"):
        client.request(paths, controlmsgs.GetStatus(), 1.0)
    t0 = time.monotonic()
    client.ring(paths, "wake", doorbells.Wake("test", "nobody"))     # no pulsed: dropped at once
    assert time.monotonic() - t0 < client.RING_S
