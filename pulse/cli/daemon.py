"""`pulsectl daemon start`: run pulsed in the background without systemd.

pulsed is started in its own session and reports readiness the way it does to
systemd: a READY=1 datagram on a NOTIFY_SOCKET that pulsectl binds for the
occasion. pulsectl returns once that arrives, or fails with pulsed's own words
if it exits first. Outside systemd nothing restarts pulsed if it escalates.
"""

from __future__ import annotations

import os
import sys
import time

import click

from pulse.cli.context import fail
from pulse.cli.group import Context, pass_ctx

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


@click.group()
def daemon() -> None:
    """Run pulsed without systemd."""


@daemon.command("start")
@click.option("--wait", default=30.0, show_default=True, help="Seconds to wait for pulsed to be ready.")
@pass_ctx
def daemon_start(ctx: Context, wait: float) -> None:
    """Start pulsed in the background; return once it is ready."""
    import socket
    import subprocess
    import tempfile

    from pulse.core.client import daemon_pid
    pid = daemon_pid(ctx.paths)
    if pid:
        fail(f"pulsed is already running on {ctx.home} (pid {pid})", 2)
    with tempfile.TemporaryDirectory(prefix="pulsectl-") as tmp:
        address = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        sock.bind(address)
        errors = tempfile.TemporaryFile(dir=tmp)
        env = dict(os.environ, NOTIFY_SOCKET=address, PULSE_HOME=str(ctx.home))
        env.pop("WATCHDOG_USEC", None)
        proc = subprocess.Popen([sys.executable, "-P", "-m", "pulse.supervisor", "--no-log-stderr"],
                                env=env, cwd="/", start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=errors)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            sock.settimeout(0.1)
            try:
                if b"READY=1" in sock.recv(4096).split(b"\n"):
                    click.echo(f"pulsed running (pid {proc.pid}), home {ctx.home}; log {ctx.paths.log_file}")
                    return
            except socket.timeout:
                pass
            if proc.poll() is not None:
                errors.seek(0)
                reason = errors.read().decode(errors="replace").strip() or "no message"
                fail(f"pulsed exited with code {proc.returncode}: {reason}")
        fail(f"pulsed (pid {proc.pid}) not ready after {wait:g}s; see {ctx.paths.log_file}")


COMMANDS = [daemon]
