"""sd_notify through a real NOTIFY_SOCKET datagram socket, as systemd would listen."""

from __future__ import annotations

import select
import socket
import threading
import time

import pytest

from support import wait_for


class NotifySocket:
    """Listens as systemd does: a thread reads each datagram as it comes (the kernel queues
    only net.unix.max_dgram_qlen of them, 10 by default, and pulsed drops what does not fit)."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.messages: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.listening = True
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def _listen(self) -> None:
        while self.listening:
            if select.select([self.sock], [], [], 0.05)[0]:
                self.drain()

    def drain(self) -> list[str]:
        """Everything received so far, reading what is queued first."""
        with self.lock:
            while True:
                try:
                    data = self.sock.recv(4096)
                except BlockingIOError:
                    break
                self.messages.extend((time.monotonic(), line) for line in data.decode().split("\n"))
            return [m for _, m in self.messages]

    def first(self, line: str) -> float | None:
        self.drain()
        return next((t for t, m in self.messages if m == line), None)

    def close(self) -> None:
        self.listening = False
        self.thread.join()
        self.sock.close()


@pytest.fixture
def notify(tmp_path):
    n = NotifySocket(tmp_path / "notify")
    yield n
    n.close()


def test_ready_after_core_workers_then_stopping(pulsed, notify):
    pulsed.start(env={"NOTIFY_SOCKET": notify.path}, wait=False)
    ready_at = wait_for(lambda: notify.first("READY=1"), 15, what="READY=1")
    core = ("watcher", "tick", "executor")
    ready_events = wait_for(lambda: (found := {e["target"]: e for e in pulsed.events("worker-ready")}).keys()
                            >= set(core) and found, 10, what="the core workers' worker-ready events")
    for name in core:
        assert ready_events[name]["mono"] <= ready_at
    assert any(m.startswith("STATUS=") for m in notify.drain())
    assert f"MAINPID={pulsed.proc.pid}" in notify.drain()
    assert "WATCHDOG=1" not in notify.drain()        # no WATCHDOG_USEC: no pings
    assert "STOPPING=1" not in notify.drain()
    assert pulsed.terminate() == 0
    assert "STOPPING=1" in notify.drain()
    assert "WATCHDOG=1" not in notify.drain()
    assert notify.drain().count("READY=1") == 1


def test_ready_even_when_the_engine_cannot_start(pulsed, notify):
    pulsed.start(env={"NOTIFY_SOCKET": notify.path, "PULSE_TEST_INJECT": "engine:crash-before-ready*99"},
                 wait=False)
    wait_for(lambda: notify.first("READY=1"), 15, what="READY=1 with a broken engine")
    assert not pulsed.events("worker-ready", "engine")
    status = wait_for(lambda: next((m for m in reversed(notify.drain()) if "engine failed" in m), None), 15,
                      what="STATUS= naming the failed engine")
    assert status.startswith("STATUS=3/4 workers running")


def test_watchdog_pings_only_with_watchdog_usec(pulsed, notify):
    pulsed.start(env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000"})
    wait_for(lambda: notify.drain().count("WATCHDOG=1") >= 4, 5, what="WATCHDOG=1 every WATCHDOG_USEC/2")
    times = [t for t, m in notify.messages if m == "WATCHDOG=1"]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(g < 0.2 for g in gaps), gaps


def test_watchdog_pid_of_another_process_means_no_pings(pulsed, notify):
    pulsed.start(env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"})
    assert pulsed.terminate() == 0
    assert "STOPPING=1" in notify.drain() and "WATCHDOG=1" not in notify.drain()


def test_a_manager_that_does_not_read_never_stalls_pulsed(pulsed, tmp_path):
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)   # bound, never read: its queue fills at once
    deaf.bind(str(tmp_path / "deaf"))
    try:
        pulsed.start(env={"NOTIFY_SOCKET": str(tmp_path / "deaf")})
        old = pulsed.worker("engine").pid
        for _ in range(3):                    # every restart changes STATUS=: more than the queue holds
            assert pulsed.ctl("restart", "engine").returncode == 0
            old = pulsed.wait_replaced("engine", old, heartbeat=False).pid
        assert pulsed.terminate() == 0
    finally:
        deaf.close()
