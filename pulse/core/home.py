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
over 107 bytes) and private (0700).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

# Only what every pulsectl call needs is imported here: `pulsectl status` must start fast.

SOCKETS = ("control", "heartbeat", "eventlog", "wake", "doorbell", "engine", "events")
# Files a worker keeps in the runtime directory, removed by pulsed at a clean stop with the sockets,
# so the directory itself can go: the fleet as the fleet worker last saw it.
FLEET_VIEW_FILE = "fleet-view.json"
RUNTIME_FILES = (FLEET_VIEW_FILE,)


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


def derived_runtime_dir(home: Path) -> Path:
    """PULSE_RUNTIME_DIR, else a short per-home directory under XDG_RUNTIME_DIR or /tmp."""
    import zlib  # not hashlib: it maps 3 MiB of OpenSSL into pulsed for one short tag
    if os.environ.get("PULSE_RUNTIME_DIR"):
        return Path(os.environ["PULSE_RUNTIME_DIR"])
    tag = format(zlib.crc32(str(home).encode()), "08x")
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base) and os.access(base, os.W_OK):
        return Path(base) / f"pulse-{tag}"
    return Path(os.environ.get("TMPDIR") or "/tmp") / f"pulse-{os.getuid()}-{tag}"


class Paths(NamedTuple):   # not a dataclass: that imports inspect, a tenth of `pulsectl status`
    home: Path
    runtime: Path

    @classmethod
    def for_daemon(cls, home: Path) -> "Paths":
        return cls(home, derived_runtime_dir(home))

    @classmethod
    def for_client(cls, home: Path) -> "Paths":
        """Find the runtime directory the running daemon recorded, else derive it."""
        try:
            runtime = Path((home / "runtime-dir").read_text().strip())
        except OSError:
            runtime = derived_runtime_dir(home)
        return cls(home, runtime)

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
        """Holds the pid of the `pulsectl dev` that has the engine run staging."""
        return self.home / "dev"

    @property
    def web_token(self) -> Path:
        """The web page's token (mode 0600; `pulsectl web rotate-token` replaces it)."""
        return self.home / "web.token"

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

    # -- the gate's socket (pulse.agents.gateserver): a plain unix socket, not a zmq endpoint --
    @property
    def gate_socket(self) -> Path:
        return self.runtime / "gate.sock"

    # -- the keepers' server (pulse.effects.keepers): forks a keeper for each start of a [[process]] --
    @property
    def keepers_socket(self) -> Path:
        return self.runtime / "keepers.sock"


def make_runtime_dir(paths: Paths) -> None:
    longest = len(paths.endpoint("heartbeat")) - len("ipc://")
    if longest > 107:
        raise HomeError(f"runtime directory {paths.runtime} is too long for ipc sockets "
                        f"({longest} > 107 bytes); set PULSE_RUNTIME_DIR to a shorter path")
    paths.runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(paths.runtime, 0o700)
    st = paths.runtime.stat()
    if st.st_uid != os.getuid():
        raise HomeError(f"runtime directory {paths.runtime} belongs to uid {st.st_uid}, not to us")
    (paths.home / "runtime-dir").write_text(f"{paths.runtime}\n")


def remove_runtime_dir(runtime: Path) -> bool:
    """After a clean stop: remove the runtime directory if it is a real directory of ours (never a
    symlink: rmdir of a link fails, and lstat says so first) and empty (rmdir removes nothing else,
    and nothing that appeared in it since). True when it was removed."""
    import stat
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


def dev_pid(paths: Paths) -> int | None:
    """The pid of a live `pulsectl dev` on this home, or None."""
    try:
        pid = int(paths.dev_marker.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def write_web_token(paths: Paths) -> str:
    """A new web token, written whole (mode 0600) and renamed into place; returns it."""
    import secrets
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
