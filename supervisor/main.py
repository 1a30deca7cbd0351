"""`pulsed`: the supervisor, in the foreground (systemd's ExecStart).

Exit codes: 0 stopped on request; 1 a core worker hit its restart intensity
limit (escalated: let the service manager restart us); 2 another pulsed holds
this home; 78 bad configuration (do not restart).

argparse, not click: pulsed's two options do not need click, and every MiB
pulsed keeps resident is paid for as long as the host runs.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import sys
from typing import NoReturn

from pulse import __version__
from pulse import config as configmod
from pulse import logs
from pulse.home import HomeError, Paths, ensure_home, home_is_complete, make_runtime_dir, resolve_home
from pulse.sdnotify import Notifier
from pulse.states import Exit
from pulse.store import StoreError


def fail(code: Exit, message: str) -> NoReturn:
    print(f"pulsed: {message}", file=sys.stderr, flush=True)
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


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pulsed", description="Run the Pulse supervisor in the foreground.")
    parser.add_argument("--home", default=os.environ.get("PULSE_HOME"),
                        help="Pulse home (default: $PULSE_HOME, else ~/.pulse)")
    parser.add_argument("--no-log-stderr", dest="log_stderr", action="store_false",
                        help="write the log to <home>/logs only, not also to stderr (journald under systemd)")
    parser.add_argument("--version", action="version", version=f"pulsed, version {__version__}")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    home_path = resolve_home(args.home)
    try:
        home_path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        fail(Exit.CONFIG, f"cannot create home {home_path}: {err.strerror}")
    paths = Paths.for_daemon(home_path)
    lock_fd = take_lock(paths)
    try:
        config = configmod.load(paths.config)
        if not home_is_complete(paths):
            ensure_home(home_path)
        make_runtime_dir(paths)
    except (configmod.ConfigError, HomeError, StoreError) as err:
        fail(Exit.CONFIG, str(err))

    sink = logs.Sink(paths.log_file, to_stderr=args.log_stderr, max_bytes=config.log.max_bytes,
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
