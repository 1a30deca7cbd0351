"""`pulsed`: the supervisor, in the foreground (systemd's ExecStart).

Exit codes: 0 stopped on request; 1 a core worker hit its restart intensity
limit (escalated: let the service manager restart us); 2 another pulsed holds
this home; 78 bad configuration (do not restart).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys

import click

from pulse import __version__
from pulse import config as configmod
from pulse import logs, procs
from pulse.home import HomeError, Paths, ensure_home, make_runtime_dir, resolve_home
from pulse.sdnotify import Notifier
from pulse.states import Exit
from pulse.store import StoreError


def fail(code: Exit, message: str) -> "NoReturn":  # noqa: F821
    click.echo(f"pulsed: {message}", err=True)
    sys.exit(int(code))


def take_lock(paths: Paths) -> int:
    """A POSIX lock on <home>/pulsed.lock, held for pulsed's life. Such a lock belongs
    to the process: no child inherits it (and the fd is O_CLOEXEC besides), and
    pulsectl can ask the kernel who holds it without taking it."""
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        fail(Exit.ALREADY_RUNNING, f"another pulsed (pid {holder}) is already running on {paths.home}")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--home", envvar="PULSE_HOME", type=click.Path(file_okay=False),
              help="Pulse home (default: $PULSE_HOME, else ~/.pulse).")
@click.option("--log-stderr/--no-log-stderr", default=True, show_default=True,
              help="Also write the log to stderr (journald under systemd).")
@click.version_option(__version__, prog_name="pulsed")
def main(home: str | None, log_stderr: bool) -> None:
    """Run the Pulse supervisor in the foreground."""
    home_path = resolve_home(home)
    try:
        home_path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        fail(Exit.CONFIG, f"cannot create home {home_path}: {err.strerror}")
    paths = Paths.for_daemon(home_path)
    lock_fd = take_lock(paths)
    try:
        config = configmod.load(paths.config)
        ensure_home(home_path)
        make_runtime_dir(paths)
    except (configmod.ConfigError, HomeError, StoreError) as err:
        fail(Exit.CONFIG, str(err))

    sink = logs.Sink(paths.log_file, to_stderr=log_stderr, max_bytes=config.log.max_bytes,
                     backups=config.log.backups)
    root = logging.getLogger()
    root.addHandler(logs.SinkHandler(sink))
    root.setLevel(config.log.level.upper())
    notifier = Notifier()
    logging.getLogger("pulse.supervisor").info("pulsed %s starting on %s", __version__, home_path)

    from .arbiter import Arbiter   # zmq and the rest only once the cheap checks passed
    code = Arbiter(paths, config, sink, notifier).run()
    sink.close()
    os.close(lock_fd)
    sys.exit(code)
