"""The registry of running Pulses: several instances on one host, each findable by name.

Each pulsed, while it runs, keeps one small JSON file in a registry directory:

    {"name", "home", "runtime", "pid", "proc_start", "started"}

    PULSE_INSTANCES_DIR            if set (tests; a unit that wants its own)
    /run/pulsed/instances          for system units (their runtime directory is under /run/pulsed)
    <runtime dir's parent>/pulse-instances       a private parent ($XDG_RUNTIME_DIR)
    <runtime dir's parent>/pulse-<uid>-instances a shared one (/tmp)

`pulsectl instances` lists this user's registry and the system one (if readable); an entry
whose pid is gone, or now belongs to another process (its start time or boot differs), is removed
as it is read, and each pulsed removes such entries from its registry when it starts, so the
entries of SIGKILLed Pulses do not pile up where nobody lists them. Writing an entry is one small
file: pulsed stays small (stdlib only here).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import msgspec  # pulsed has it loaded already; the stdlib json would be ~2.5 ms and more resident code

from pulse.core.procs import proc_start

SYSTEM_RUNTIME = Path("/run/pulsed")
SYSTEM_REGISTRY = SYSTEM_RUNTIME / "instances"
NAME_CHARS = "letters, digits and _ . @ -"


def registry_dir(runtime: Path) -> Path:
    """Where a pulsed whose runtime directory is `runtime` registers."""
    if os.environ.get("PULSE_INSTANCES_DIR"):
        return Path(os.environ["PULSE_INSTANCES_DIR"])
    if runtime == SYSTEM_RUNTIME or SYSTEM_RUNTIME in runtime.parents:
        return SYSTEM_REGISTRY
    parent = runtime.parent
    try:
        st = parent.stat()
        private = st.st_uid == os.getuid() and not st.st_mode & 0o022
    except OSError:
        private = False
    return parent / ("pulse-instances" if private else f"pulse-{os.getuid()}-instances")


def default_name(home: Path) -> str:
    """An instance's name when `[pulse] name` is unset: its home's folder name."""
    return home.name.lstrip(".") or "pulse"


def boot_id() -> str | None:
    """This boot's id: a start time counts from boot, so an entry left from an earlier boot (a
    registry on a disk, not a tmpfs) must not pass for the process that has its pid now."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def is_live(entry: dict) -> bool:
    """Is the pulsed an entry names still running: its pid alive, started when the entry says, in
    this boot (an entry written before boot_id was recorded is judged by its start time alone)."""
    try:
        pid = int(entry["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    start = proc_start(pid)
    if start is None or start != entry.get("proc_start"):
        return False
    recorded = entry.get("boot_id")
    return recorded is None or recorded == boot_id()


def _read(path: Path) -> dict | None:
    """An entry file's contents, None when it cannot be read as one (being written, or not ours)."""
    try:
        entry = msgspec.json.decode(path.read_bytes())
        int(entry["pid"])
    except (OSError, ValueError, KeyError, TypeError, msgspec.DecodeError):
        return None
    return entry if isinstance(entry, dict) else None


def trusted_dir(directory: Path) -> bool:
    """A registry worth reading or writing: a real directory (not a link) of ours or root's that no
    other account may write. In a shared /tmp another account could make `pulse-<uid>-instances`
    first, to plant entries naming homes of its own or links where pulsed writes its entry."""
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid in (0, os.getuid())
            and not stat.S_IMODE(st.st_mode) & 0o022)


def prune(directory: Path) -> list[dict]:
    """Remove the entries of `directory` whose pulsed is gone (where we may); returns the live ones."""
    if not trusted_dir(directory):
        return []
    try:
        files = sorted(directory.glob("*.json"))
    except OSError:
        return []
    live = []
    for path in files:
        entry = _read(path)
        if entry is None:
            continue                # left alone
        if is_live(entry):
            live.append(entry)
        else:
            unregister(path)        # its pulsed is gone (SIGKILL, power loss) or the pid was reused
    return live


def runtime_in_use(directory: Path, runtime: Path, but: int) -> bool:
    """Does a live pulsed other than pid `but` registered in `directory` use `runtime`?"""
    return any(e.get("runtime") == str(runtime) and int(e["pid"]) != but for e in prune(directory))


def register(directory: Path, name: str, home: Path, runtime: Path) -> Path:
    """Write this process's entry (atomically), first removing the entries of Pulses that are gone;
    returns its path. Raises OSError."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not trusted_dir(directory):
        raise OSError(f"{directory} is not a directory of ours that only we may write: not registering there")
    prune(directory)
    pid = os.getpid()
    entry = {"name": name, "home": str(home), "runtime": str(runtime), "pid": pid,
             "proc_start": proc_start(pid), "boot_id": boot_id(), "started": time.time()}
    path = directory / f"{pid}.json"
    tmp = directory / f".{pid}.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.encode(entry))
    os.replace(tmp, path)
    return path


def unregister(path: Path | None) -> None:
    if path is None:
        return
    try:
        path.unlink()
    except OSError:
        pass


def live_entries(directories: list[Path]) -> list[dict]:
    """Every live entry in `directories`, by name then pid; dead ones are removed (where we may)."""
    out, seen = [], set()
    for directory in directories:
        for entry in prune(directory):
            pid = int(entry["pid"])
            if (str(directory), pid) not in seen:
                seen.add((str(directory), pid))
                out.append({**entry, "registry": str(directory)})
    return sorted(out, key=lambda e: (e["name"], e["pid"]))


def find(directories: list[Path], name: str) -> dict:
    """The one live instance called `name`; LookupError naming what there is otherwise."""
    entries = live_entries(directories)
    found = [e for e in entries if e["name"] == name]
    if len(found) == 1:
        return found[0]
    if not found:
        known = ", ".join(sorted({e["name"] for e in entries}))
        raise LookupError(f"no running Pulse instance named {name!r} "
                          + (f"(running: {known})" if known else "(none is running)"))
    homes = ", ".join(e["home"] for e in found)
    raise LookupError(f"{len(found)} running Pulse instances are named {name!r} ({homes}): use --home")
