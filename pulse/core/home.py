"""The pulse home and its runtime directory: where everything lives.

    <home>/config.toml   mode 0600: it may hold webhook tokens
    <home>/events.db     append-only history (lifecycle, effects, ...)
    <home>/vitals.db     the watcher's samples
    <home>/objects/      content-addressed blobs
    <home>/logs/         pulse.log (+ rotated pulse.log.N), written by pulsed alone
    <home>/engine/       the agent's engine, a git repo on branch main
    <home>/staging/      a git worktree of the engine on branch staging
    <home>/workers.json  workers an operator stopped (kept across pulsed restarts)
    <home>/pulsed.lock   held by the running pulsed; holds its pid
    <home>/runtime-dir   where the running pulsed put its sockets

The runtime directory holds the ipc sockets. It is short (zmq refuses ipc paths
over 107 bytes) and private (0700). Unless PULSE_RUNTIME_DIR names it (the units
set it under systemd's RuntimeDirectory), it is `pulse-<uid>-<random>` under
$XDG_RUNTIME_DIR or /tmp: its name is recorded in the home, which only Pulse's
account can read, and is nothing an agent that knows the home could guess and
take first. pulsed makes it with mkdir, never through a link, and refuses one
that is there and that it did not make (another owner, a link, a wider mode).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

from pulse.core.procs import proc_start

# Imports inside functions: only what every pulsectl call needs is imported above, `pulsectl status`
# must start fast; json (it compiles six regular expressions as it loads) where a file of it is read
# or written.

SOCKETS = ("control", "heartbeat", "eventlog", "wake", "doorbell", "engine", "events")
# Files a worker keeps in the runtime directory, removed by pulsed at a clean stop with the sockets,
# so the directory itself can go: the fleet as the fleet worker last saw it.
FLEET_VIEW_FILE = "fleet-view.json"
# ... and where the telemetry receiver listens, for the runs the executor starts (pulse.agents.otel)
TELEMETRY_FILE = "telemetry.json"
# ... and the keepers' server's socket and lock (pulse.effects.keepers): the server outlives pulsed by
# up to its CHECK_S, and ends at once when it finds its socket gone
KEEPERS_FILES = ("keepers.sock", "keepers.sock.lock")
RUNTIME_FILES = (FLEET_VIEW_FILE, TELEMETRY_FILE, *KEEPERS_FILES)
# What an agent run's environment tells its `pulsectl mcp` (pulse.gate): the run's capability, which
# alone says which run a session is, and where the gate's socket is (the home may be out of its reach)
RUN_TOKEN_ENV = "PULSE_RUN_TOKEN"
GATE_SOCKET_ENV = "PULSE_GATE_SOCKET"


class HomeError(Exception):
    pass


def inside(path: str | Path, directory: str | Path) -> bool:
    """Is `path` `directory` or under it, with every symlink of either resolved? (A file reached
    through a symlinked directory is where the link points.)"""
    real, top = os.path.realpath(path), os.path.realpath(directory)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def resolve_home(option: str | None) -> Path:
    """--home, else PULSE_HOME, else ~/.pulse."""
    raw = option or os.environ.get("PULSE_HOME") or "~/.pulse"
    return Path(raw).expanduser().absolute()


RUNTIME_RECORD = "runtime-dir"


def runtime_base() -> Path:
    """Where a runtime directory is made when PULSE_RUNTIME_DIR does not name one."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base) and os.access(base, os.W_OK):
        return Path(base)
    return Path(os.environ.get("TMPDIR") or "/tmp")


def is_made_name(runtime: Path) -> bool:
    """A name pulsed gives its runtime directory: pulse-<uid>-<16 hex digits>, in runtime_base()."""
    prefix = f"pulse-{os.getuid()}-"
    tag = runtime.name.removeprefix(prefix)
    return (runtime.parent == runtime_base() and runtime.name.startswith(prefix) and len(tag) == 16
            and all(c in "0123456789abcdef" for c in tag))


def recorded_runtime_dir(home: Path) -> Path | None:
    try:
        return Path((home / RUNTIME_RECORD).read_text().strip())
    except OSError:
        return None


def derived_runtime_dir(home: Path) -> Path:
    """PULSE_RUNTIME_DIR, else the one recorded in the home (a pulsed made it), else a name no daemon
    has used: random, so nobody can make it first."""
    if os.environ.get("PULSE_RUNTIME_DIR"):
        return Path(os.environ["PULSE_RUNTIME_DIR"])
    recorded = recorded_runtime_dir(home)
    if recorded is not None and is_made_name(recorded):
        return recorded
    # os.urandom is what secrets.token_hex reads; secrets itself brings hmac and random (~6 ms), and
    # every pulsectl command on a home no pulsed has run comes here
    return runtime_base() / f"pulse-{os.getuid()}-{os.urandom(8).hex()}"


class Paths(NamedTuple):   # not a dataclass: that imports inspect, a tenth of `pulsectl status`
    home: Path
    runtime: Path

    @classmethod
    def for_daemon(cls, home: Path) -> "Paths":
        return cls(home, derived_runtime_dir(home))

    @classmethod
    def for_client(cls, home: Path) -> "Paths":
        """Find the runtime directory the running daemon recorded, else derive it."""
        return cls(home, recorded_runtime_dir(home) or derived_runtime_dir(home))

    @property
    def config(self) -> Path:
        return self.home / "config.toml"

    @property
    def events_db(self) -> Path:
        return self.home / "events.db"

    @property
    def vitals_db(self) -> Path:
        return self.home / "vitals.db"

    @property
    def objects(self) -> Path:
        return self.home / "objects"

    @property
    def dev_marker(self) -> Path:
        """Holds the pid and start time of the `pulsectl dev` that has the engine run staging."""
        return self.home / "dev"

    @property
    def web_token(self) -> Path:
        """The web page's token (mode 0600; `pulsectl web rotate-token` replaces it)."""
        return self.home / "web.token"

    @property
    def telemetry_token(self) -> Path:
        """The telemetry receiver's token (mode 0600): needed by every request when it listens beyond loopback."""
        return self.home / "telemetry.token"

    @property
    def telemetry_file(self) -> Path:
        return self.runtime / TELEMETRY_FILE

    @property
    def history_mark(self) -> Path:
        """How many events events.db held when pulsed last started: a history that went missing shows."""
        return self.home / "events.mark"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def log_file(self) -> Path:
        return self.logs / "pulse.log"

    @property
    def lock(self) -> Path:
        return self.home / "pulsed.lock"

    @property
    def workers_state(self) -> Path:
        return self.home / "workers.json"

    @property
    def engine(self) -> Path:
        return self.home / "engine"

    @property
    def staging(self) -> Path:
        return self.home / "staging"

    def endpoint(self, socket: str) -> str:
        assert socket in SOCKETS, socket
        return f"ipc://{self.runtime / socket}.ipc"

    def socket_file(self, socket: str) -> Path:
        return self.runtime / f"{socket}.ipc"

    # -- the gate's socket (pulse.gate.server): a plain unix socket, not a zmq endpoint --
    @property
    def gate_socket(self) -> Path:
        return self.runtime / "gate.sock"

    # -- the keepers' server (pulse.effects.keepers): forks a keeper for each start of a [[process]] --
    @property
    def keepers_socket(self) -> Path:
        return self.runtime / KEEPERS_FILES[0]


def make_runtime_dir(paths: Paths) -> None:
    longest = len(paths.endpoint("heartbeat")) - len("ipc://")
    if longest > 107:
        raise HomeError(f"runtime directory {paths.runtime} is too long for ipc sockets "
                        f"({longest} > 107 bytes); set PULSE_RUNTIME_DIR to a shorter path")
    if os.environ.get("PULSE_RUNTIME_DIR"):           # the operator's (or the unit's) own choice
        paths.runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(paths.runtime, 0o700)
        st = paths.runtime.stat()
        if st.st_uid != os.getuid():
            raise HomeError(f"runtime directory {paths.runtime} belongs to uid {st.st_uid}, not to us")
    else:
        make_private_dir(paths.runtime)
    (paths.home / RUNTIME_RECORD).write_text(f"{paths.runtime}\n")


def make_private_dir(path: Path) -> None:
    """mkdir `path` 0700; one already there only if it is a directory of ours that no other account
    can write or enter (one an earlier pulsed of this home made and left), never through a link.
    HomeError naming what is there otherwise."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        what = "a symbolic link" if os.path.islink(path) else f"not a directory ({err.strerror})"
        raise HomeError(f"runtime directory {path} is {what}: pulsed did not make it, and uses nothing "
                        "another account may have placed; remove it (or set PULSE_RUNTIME_DIR)") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise HomeError(f"runtime directory {path} belongs to uid {st.st_uid} with mode "
                            f"{stat.S_IMODE(st.st_mode):o}: pulsed did not make it, and uses nothing another "
                            "account may have placed; remove it (or set PULSE_RUNTIME_DIR)")
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def remove_runtime_dir(runtime: Path) -> bool:
    """After a clean stop: remove the runtime directory if it is a real directory of ours (never a
    symlink: rmdir of a link fails, and lstat says so first) and empty (rmdir removes nothing else,
    and nothing that appeared in it since). True when it was removed."""
    try:
        st = os.lstat(runtime)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    try:
        os.rmdir(runtime)
    except OSError:                 # not empty (a socket someone still uses, a file left), or gone
        return False
    return True


def dev_marker_text(pid: int) -> str:
    """What `pulsectl dev` writes in the home's dev marker: its pid and start time (procs.proc_start)."""
    return f"{pid} {proc_start(pid)}\n"


def dev_pid(paths: Paths) -> int | None:
    """The pid of the live `pulsectl dev` on this home, or None. The marker names it by pid and start
    time, so a process that took the pid of a dev killed with -9 (whose marker stays) is not taken for
    it; nor is a dev that has exited while its parent has yet to reap it (kill(pid, 0) finds a zombie:
    an engine started then loaded staging again, saw the end at once and asked for a second restart)."""
    marked = _dev_marked(paths)
    return marked[0] if marked is not None and proc_start(marked[0]) == marked[1] else None


def dev_pidfd(paths: Paths) -> int | None:
    """A pidfd of the live `pulsectl dev` on this home (dev_pid's judgement; the caller closes it), or
    None. The start is read after the pidfd is open, so it is of the process the marker names."""
    marked = _dev_marked(paths)
    if marked is None:
        return None
    try:
        pidfd = os.pidfd_open(marked[0])
    except OSError:
        return None
    if proc_start(marked[0]) != marked[1]:
        os.close(pidfd)
        return None
    return pidfd


def _dev_marked(paths: Paths) -> tuple[int, str] | None:
    try:
        pid, _, started = paths.dev_marker.read_text().strip().partition(" ")
        return int(pid), started
    except (OSError, ValueError):
        return None


def write_web_token(paths: Paths) -> str:
    """A new web token, written whole (mode 0600) and renamed into place; returns it."""
    import secrets  # ~16 ms: only a new web token
    token = secrets.token_urlsafe(32)
    tmp = paths.web_token.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, paths.web_token)
    return token


# -- which workers an operator stopped: kept across pulsed restarts until a start ---------------------

def load_stopped(path: Path) -> set[str]:
    import json
    try:
        return set(json.loads(path.read_text()).get("stopped", []))
    except FileNotFoundError:
        return set()
    except (OSError, ValueError) as err:
        raise HomeError(f"{path}: unreadable ({err}); fix or remove it") from None


def save_stopped(path: Path, stopped: set[str]) -> None:
    """Atomic: write a temporary file, fsync, rename."""
    import json
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump({"stopped": sorted(stopped)}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)   # the rename itself survives a power cut
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def process_log(home: Path, name: str) -> Path:
    """Where a started [[process]]'s output goes (appended; its keeper rotates it by size): its name
    with anything but ASCII letters, digits and _ . - made a dash."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "-" for c in name)
    return home / "logs" / f"process-{safe}.log"
