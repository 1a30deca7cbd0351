"""sd_notify(3), spoken directly: one datagram per message to $NOTIFY_SOCKET.

Silent outside systemd (no NOTIFY_SOCKET). Reads and removes NOTIFY_SOCKET,
WATCHDOG_USEC and WATCHDOG_PID from the environment so no child inherits them.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, environ=os.environ):
        address = environ.pop("NOTIFY_SOCKET", None)
        usec = environ.pop("WATCHDOG_USEC", None)
        watchdog_pid = environ.pop("WATCHDOG_PID", None)
        self.address = None
        self.sock = None
        if address:
            self.address = "\0" + address[1:] if address.startswith("@") else address
            # Non-blocking: a manager that does not read (its queue holds a few datagrams) must never stall pulsed.
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        self.watchdog_s: float | None = None
        if self.sock and usec and usec.isdigit() and int(usec) > 0:
            if watchdog_pid is None or watchdog_pid == str(os.getpid()):
                self.watchdog_s = int(usec) / 1e6
        self.last_status = None

    def send(self, *fields: str) -> None:
        if self.sock is None:
            return
        try:
            self.sock.sendto("\n".join(fields).encode(), self.address)
        except OSError:
            pass   # the manager went away, or is not reading: nothing to tell, nothing to wait for

    def status(self, text: str) -> None:
        if text != self.last_status:
            self.last_status = text
            self.send(f"STATUS={text}")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
