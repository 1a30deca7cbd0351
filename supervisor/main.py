"""`pulsed`: the supervisor, in the foreground (systemd's ExecStart).

Exit codes: 0 stopped on request; 1 a core worker hit its restart intensity
limit (escalated: let the service manager restart us); 2 another pulsed holds
this home; 78 bad configuration or command line (do not restart).

No click, no argparse: pulsed's three options need neither, and every MiB
pulsed keeps resident is paid for as long as the host runs.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import NoReturn

from pulse import __version__
from pulse.core import config as configmod
from pulse.core import instances, logs
from pulse.core.home import (
    HomeError,
    Paths,
    make_runtime_dir,
    remove_runtime_dir,
    resolve_home,
)
from pulse.core.sdnotify import Notifier
from pulse.core.states import Exit

from .forkserver import Forkserver

# Imports inside functions: pulsed stays small (tests/test_docs.py, test_pulsed_imports_only_the_core_at_module_level):
# the store, ~25 ms, only in the child that makes the home; the rest only on the paths that use them.


def fail(code: Exit, message: str) -> NoReturn:
    print(f"pulsed: {message}", file=sys.stderr, flush=True)
    sys.exit(int(code))


def take_lock(paths: Paths) -> int:
    """A POSIX lock on <home>/pulsed.lock, held for pulsed's life. Such a lock belongs
    to the process: no child inherits it (and the fd is O_CLOEXEC besides), and
    pulsectl can ask the kernel who holds it without taking it."""
    try:
        fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as err:
        fail(Exit.CONFIG, f"{paths.lock}: cannot open ({err.strerror}); pulsed must be able to write its home")
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        fail(Exit.ALREADY_RUNNING, f"another pulsed (pid {holder}) is already running on {paths.home}")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def prepare_home(paths: Paths) -> list[str]:
    """In a short-lived child, so what it takes (git, shutil, SQLite) never stays resident in
    pulsed (which has no thread yet: fork is safe): check the stores, reading only, and refuse a
    damaged, unreadable or read-only one, or a history that went missing (HomeError: one line a
    problem); make what is missing (returned, one item a line); record how long the history is."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            from pulse.store.provision import check_home, ensure_home, home_is_complete, mark_history
            problems = check_home(paths)
            if problems:
                raise HomeError("\n".join(problems))
            made = ensure_home(paths.home) if not home_is_complete(paths) else []
            mark_history(paths)
            if made:
                made.append(DETECTED + detected())
            os.write(w, "\n".join(made).encode())
            code = 0
        except Exception as err:
            import traceback

            from pulse.store.connection import StoreError
            known = isinstance(err, (configmod.ConfigError, HomeError, StoreError))
            os.write(w, (str(err) if known else traceback.format_exc()).encode())
        finally:
            os._exit(code)   # never return into pulsed's code
    os.close(w)
    with os.fdopen(r, "rb") as reader:
        message = reader.read().decode(errors="replace").strip()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise HomeError(message or f"preparing the home {paths.home} failed (wait status {status})")
    return message.splitlines()


DETECTED = "detected: "        # the line of prepare_home's answer that is what detect found, not a thing made


def detected() -> str:
    """What `pulsectl guard --detect` would find, in one line (a first run only, in the short-lived
    child: psutil's scan never stays in pulsed); a scan that fails costs the line, never the start."""
    try:
        from pulse.core import toolscan
        return toolscan.one_line(toolscan.scan())
    except Exception as err:
        return f"could not look for the tools to guard: {err} (`pulsectl guard --detect`)"


def say_what_was_made(log: logs.Log, home: Path, fresh: bool, made: list[str], ballast_mb: int) -> None:
    """pulsed's first run says what it created, as `pulsectl init` does: a new user otherwise
    finds a home, an engine repository and a 32 MiB file they never asked for."""
    if not made and not fresh:
        return
    if fresh:
        log.info("first run: made the home %s/ (mode 0700)", home)
    for item in made:
        if item.startswith(DETECTED):
            log.info("first run: %s", item.removeprefix(DETECTED))
        else:
            log.info("first run: made %s", item)
    if ballast_mb > 0:
        log.info("the tick keeps a ballast file %s of %d MiB, freed first when the disk is full so Pulse "
                 "can still act ([survival] ballast_mb; 0: none)", home / "ballast", ballast_mb)


def register(paths: Paths, settings: configmod.SupervisorConfig) -> Path | None:
    """This instance's entry in the registry of running Pulses (pulse.core.instances): one small
    file. A registry we cannot write costs `pulsectl instances` this entry, never the start."""
    name = settings.pulse.name or instances.default_name(paths.home)
    try:
        return instances.register(instances.registry_dir(paths.runtime), name, paths.home, paths.runtime)
    except OSError as err:
        logs.Log("pulse.supervisor").warning("not listed among the running Pulses: %s", err)
        return None


def release_runtime_dir(paths: Paths, entry: Path | None) -> None:
    """On a clean stop, after the sockets are gone and our entry is removed: remove the runtime
    directory we made, if empty and no other live pulsed uses it (PULSE_RUNTIME_DIR may be shared
    by mistake; the registry says who runs where). Left in place on any doubt."""
    registry = entry.parent if entry is not None else instances.registry_dir(paths.runtime)
    try:
        if instances.runtime_in_use(registry, paths.runtime, os.getpid()):
            return
    except OSError:
        return
    if remove_runtime_dir(paths.runtime):
        logs.Log("pulse.supervisor").info("removed the runtime directory %s", paths.runtime)


USAGE = """usage: pulsed [--home DIR] [--no-log-stderr] [--version] [-h]

Run the Pulse supervisor in the foreground.

options:
  --home DIR       Pulse home (default: $PULSE_HOME, else ~/.pulse)
  --no-log-stderr  write the log to <home>/logs only, not also to stderr (journald under systemd)
  --version        print the version and exit
  -h, --help       print this help and exit
"""


def parse(argv: list[str]) -> tuple[str | None, bool]:
    """(home, log to stderr). Three options need no parser module: argparse and what it
    imports would stay resident in pulsed for its whole life."""
    home, log_stderr = os.environ.get("PULSE_HOME"), True
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            print(USAGE, end="")
            sys.exit(0)
        elif arg == "--version":
            print(f"pulsed, version {__version__}")
            sys.exit(0)
        elif arg == "--no-log-stderr":
            log_stderr = False
        elif arg == "--home" and args:
            home = args.pop(0)
        elif arg.startswith("--home="):
            home = arg.removeprefix("--home=")
        else:
            problem = "--home needs a directory" if arg == "--home" else f"unrecognized argument {arg!r}"
            print(USAGE.splitlines()[0], file=sys.stderr)
            fail(Exit.CONFIG, problem)
    return home, log_stderr


def main(argv: list[str] | None = None) -> None:
    home, log_stderr = parse(sys.argv[1:] if argv is None else argv)
    home_path = resolve_home(home)
    fresh = not home_path.exists()
    try:
        home_path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        fail(Exit.CONFIG, f"cannot create home {home_path}: {err.strerror}")
    if not os.access(home_path, os.W_OK | os.X_OK):
        fail(Exit.CONFIG, f"{home_path} is read-only (file or file system); pulsed must be able to write its home")
    paths = Paths.for_daemon(home_path)
    lock_fd = take_lock(paths)
    # The forkserver's preload (~0.3 s of imports) needs nothing of the home or the config: it runs
    # while pulsed checks them, and a pulsed that refuses to start takes it down with it.
    forkserver = Forkserver.start()
    try:
        config = configmod.load(paths.config)
        made = prepare_home(paths)
        make_runtime_dir(paths)
    except (configmod.ConfigError, HomeError) as err:
        forkserver.discard()
        *before, last = str(err).splitlines() or [type(err).__name__]
        for line in before:                  # one line a problem, each said as pulsed's
            print(f"pulsed: {line}", file=sys.stderr)
        fail(Exit.CONFIG, last)

    settings = configmod.slice_of(config, "supervisor")   # pulsed's own part; the rest is the workers'
    sink = logs.Sink(paths.log_file, to_stderr=log_stderr, max_bytes=settings.log.max_bytes,
                     backups=settings.log.backups)
    logs.Log.sink, logs.Log.level = sink, logs.LEVELS[settings.log.level]
    notifier = Notifier()
    logs.Log("pulse.supervisor").info("pulsed %s starting on %s", __version__, home_path)
    say_what_was_made(logs.Log("pulse.supervisor"), home_path, fresh, made, config.survival.ballast_mb)

    entry = register(paths, settings)
    from .arbiter import Arbiter  # zmq and the rest only once the cheap checks passed
    try:
        arbiter = Arbiter(paths, config, sink, notifier, forkserver)
    except HomeError as err:
        forkserver.discard()
        instances.unregister(entry)
        fail(Exit.CONFIG, str(err))
    try:
        code = arbiter.run()
    finally:
        instances.unregister(entry)
    if code == 0:
        release_runtime_dir(paths, entry)
    sink.close()
    os.close(lock_fd)
    sys.exit(code)
