"""What of the tools Pulse has presets for is on this host, and how `pulsectl guard` would guard each.

Looked at, read-only: OpenClaw's and Hermes' state directories in each account's home (the account
running this in its $HOME, honouring OPENCLAW_STATE_DIR / OPENCLAW_CONFIG_PATH / HERMES_HOME as the
tools do; every other account in the home pwd gives it), a LiteLLM config (a running proxy's
--config, else the usual places), their gateways running (one process scan) and their systemd user
units, and the agent CLIs on PATH. Each find says its preset and the keys that differ from it on
this host (`overrides`): what `pulsectl guard TOOL` writes. Nothing is guarded here.

Files in other accounts' homes are read as root: only small ones, never through a final link, and
only a port number or a key is taken from them.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

# Imports inside functions: psutil (~14 ms) only when the host's processes are scanned.

AGENT_CLIS = ("claude", "codex", "openclaw", "hermes")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"   # a service's PATH under systemd
MAX_READ = 64 * 1024
OPENCLAW_PORT, HERMES_PORT, LITELLM_PORT = 18789, 8642, 4000
LITELLM_CONFIG = "/etc/litellm/config.yaml"


@dataclass
class Account:
    name: str
    uid: int
    home: str
    own: bool                  # the account running this (its $HOME, its environment)


@dataclass
class Found:
    guard: str                 # the word of `pulsectl guard WORD`
    preset: str
    account: Account
    where: str                 # its state directory, or its config file
    config: str | None         # its config file, if there is one
    running: list[int] = field(default_factory=list)
    units: list[str] = field(default_factory=list)
    overrides: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        state = f"running (pid {', '.join(map(str, self.running))})" if self.running else "not running"
        return f"{self.preset} of {self.account.name}: {self.where}, {state}"


@dataclass
class Scan:
    found: list[Found]
    clis: dict[str, str | None]


def accounts(environ: dict) -> list[Account]:
    """The account running this first (with its $HOME), then every other with a home directory."""
    uid = os.getuid()
    try:
        me = pwd.getpwuid(uid)
        name, pw_home = me.pw_name, me.pw_dir
    except KeyError:
        name, pw_home = str(uid), "/"
    out = [Account(name, uid, environ.get("HOME") or pw_home, True)]
    for entry in pwd.getpwall():
        if entry.pw_uid == uid or entry.pw_dir in ("", "/") or any(a.name == entry.pw_name for a in out):
            continue
        if os.path.isdir(entry.pw_dir):
            out.append(Account(entry.pw_name, entry.pw_uid, entry.pw_dir, False))
    return out


def small_text(path: str) -> str | None:
    """A small regular file's text, never through a final link; None if it is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000) or st.st_size > MAX_READ:
            return None
        return os.read(fd, MAX_READ).decode(errors="replace")
    finally:
        os.close(fd)


def program(name: str, environ: dict) -> tuple[str, bool]:
    """(what restart's argv[0] should be, whether it needs this shell's PATH): the bare name when a
    service's default PATH finds it, else its absolute path on this shell's PATH."""
    if shutil.which(name, path=DEFAULT_PATH):
        return name, False
    found = shutil.which(name, path=environ.get("PATH", DEFAULT_PATH))
    return (found, True) if found else (name, False)


def processes() -> list[tuple[int, int, list[str]]]:
    """(pid, real uid, cmdline) of every process, one scan."""
    import psutil
    out = []
    for p in psutil.process_iter(["cmdline", "uids"]):
        try:
            if p.info["cmdline"] and p.info["uids"] is not None:
                out.append((p.pid, p.info["uids"].real, p.info["cmdline"]))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def is_openclaw_gateway(cmdline: list[str]) -> bool:
    first = cmdline[0].split()[0] if cmdline else ""
    if first.startswith("openclaw-gateway"):
        return True
    words = [os.path.basename(a) for a in cmdline[:3]]
    return any(w in ("openclaw", "openclaw.mjs") for w in words) and "gateway" in cmdline and "worker" not in " ".join(cmdline)


def is_hermes_gateway(cmdline: list[str]) -> bool:
    return any(os.path.basename(a) == "hermes" for a in cmdline[:2]) and "gateway" in cmdline


def litellm_config_of(cmdline: list[str]) -> str | None:
    if not any(os.path.basename(a) == "litellm" for a in cmdline[:2]) or "--config" not in cmdline[:-1]:
        return None
    return cmdline[cmdline.index("--config") + 1]


def environ_of(pid: int) -> dict[str, str] | None:
    """A process's environment, or None where it cannot be read (gone, another account's)."""
    import psutil
    try:
        return psutil.Process(pid).environ()
    except (psutil.Error, OSError):
        return None


def serves(pid: int, state: str, state_of) -> bool:
    """Whether the gateway `pid` runs on the state directory `state`: the one its own environment
    names (`state_of(environ)`), so another install's gateway of the same account (another HOME or
    state dir) does not make this one look running. Counted when its environment cannot be read."""
    env = environ_of(pid)
    return env is None or os.path.realpath(state_of(env)) == os.path.realpath(state)


def openclaw_state(env: dict) -> str:
    return env.get("OPENCLAW_STATE_DIR") or os.path.join(env.get("OPENCLAW_HOME") or env.get("HOME", ""), ".openclaw")


def hermes_state(env: dict) -> str:
    return env.get("HERMES_HOME") or os.path.join(env.get("HOME", ""), ".hermes")


def units(home: str, prefix: str) -> list[str]:
    where = Path(home) / ".config" / "systemd" / "user"
    try:
        return sorted(p.name for p in where.glob(f"{prefix}*.service"))
    except OSError:
        return []


def ours(account: Account, overrides: dict) -> None:
    """Who the process runs as, and its HOME: pinned, so pulsed (whatever its own HOME) starts it
    where its state is."""
    if not account.own:
        overrides["user"] = account.name
    overrides.setdefault("env", {})["HOME"] = account.home


def openclaw(account: Account, environ: dict, procs: list) -> Found | None:
    env = environ if account.own else {}
    default_state = os.path.join(env.get("OPENCLAW_HOME") or account.home, ".openclaw")
    state = env.get("OPENCLAW_STATE_DIR") or default_state
    config = env.get("OPENCLAW_CONFIG_PATH") or os.path.join(state, "openclaw.json")
    if not os.path.isdir(state) and not os.path.isfile(config):
        return None
    found = Found("openclaw", "openclaw-gateway", account, state, config if os.path.exists(config) else None)
    o = found.overrides
    ours(account, o)
    if state != os.path.join(account.home, ".openclaw"):
        o["env"]["OPENCLAW_STATE_DIR"] = state
        o["pidfile"] = {"path": os.path.join(state, "tmp", f"openclaw-{account.uid}", "gateway.state.lock"), "key": "pid"}
        o["config"] = [config]
    if config != os.path.join(state, "openclaw.json"):
        o["env"]["OPENCLAW_CONFIG_PATH"] = config
        o["config"] = [config]
    port = OPENCLAW_PORT
    try:
        port = int(json.loads(small_text(config) or "{}").get("gateway", {}).get("port") or OPENCLAW_PORT)
    except (ValueError, AttributeError, TypeError):
        found.notes.append(f"its config {config} is not plain JSON: port {OPENCLAW_PORT} assumed")
    argv0, needs_path = program("openclaw", environ) if account.own else ("openclaw", False)
    if port != OPENCLAW_PORT or argv0 != "openclaw":
        o["restart"] = [argv0, "gateway", "run", "--port", str(port), "--bind", "loopback"]
    if port != OPENCLAW_PORT:
        o["health"] = {"url": f"http://127.0.0.1:{port}/readyz"}
    if needs_path:                 # its launcher runs `node` from PATH
        o["env"]["PATH"] = environ["PATH"]
    found.running = [pid for pid, uid, cmd in procs
                     if uid == account.uid and is_openclaw_gateway(cmd) and serves(pid, state, openclaw_state)]
    found.units = units(account.home, "openclaw-gateway")
    return found


def env_file(path: str) -> dict[str, str]:
    out = {}
    for line in (small_text(path) or "").splitlines():
        m = re.match(r"\s*(?:export\s+)?([A-Z_][A-Z0-9_]*)\s*=\s*(.*?)\s*$", line)
        if m:
            out[m[1]] = m[2].strip("'\"")
    return out


def hermes(account: Account, environ: dict, procs: list) -> Found | None:
    env = environ if account.own else {}
    state = env.get("HERMES_HOME") or os.path.join(account.home, ".hermes")
    if not os.path.isdir(state):
        return None
    config = os.path.join(state, "config.yaml")
    found = Found("hermes", "hermes-gateway", account, state, config if os.path.exists(config) else None)
    o = found.overrides
    ours(account, o)
    if state != os.path.join(account.home, ".hermes"):
        o["env"]["HERMES_HOME"] = state
        o["pidfile"] = {"path": os.path.join(state, "gateway.pid"), "key": "pid"}
        o["config"] = [config]
    dotenv = env_file(os.path.join(state, ".env"))
    if dotenv.get("API_SERVER_KEY"):
        o["env"]["API_SERVER_KEY"] = dotenv["API_SERVER_KEY"]
        found.notes.append(f"its API server's key from {state}/.env")
    else:
        o["env"]["API_SERVER_KEY"] = "sk-pulse-" + secrets.token_hex(16)
        found.notes.append("a new key for its API server (its /health needs one)")
    port = dotenv.get("API_SERVER_PORT", "")
    if port.isdigit() and int(port) != HERMES_PORT:
        o["env"]["API_SERVER_PORT"] = port
        o["health"] = {"url": f"http://127.0.0.1:{port}/health"}
    argv0, _ = program("hermes", environ) if account.own else ("hermes", False)
    if argv0 != "hermes":
        o["restart"] = [argv0, "gateway", "run", "--external-supervisor"]
    found.running = [pid for pid, uid, cmd in procs
                     if uid == account.uid and is_hermes_gateway(cmd) and serves(pid, state, hermes_state)]
    found.units = units(account.home, "hermes-gateway")
    return found


def litellm_configs(accounts_: list[Account], procs: list) -> list[tuple[str, Account | None, list[int], list[str]]]:
    """(config, its account (None: Pulse's own), pids, the running argv) of each LiteLLM config found."""
    by_uid = {a.uid: a for a in accounts_}
    out: dict[str, tuple] = {}
    for pid, uid, cmd in procs:
        path = litellm_config_of(cmd)
        if path and os.path.isabs(path):
            _, account, pids, _ = out.get(path, (path, by_uid.get(uid), [], cmd))
            out[path] = (path, account, [*pids, pid], cmd)
    candidates = [(LITELLM_CONFIG, None)] + [(os.path.join(a.home, rel), a) for a in accounts_
                                             for rel in ("litellm_config.yaml", ".litellm/config.yaml", "litellm/config.yaml")]
    for path, account in candidates:
        if path not in out and os.path.isfile(path):
            out[path] = (path, account, [], [])
    return list(out.values())


def litellm(path: str, account: Account | None, pids: list[int], argv: list[str], environ: dict, me: Account) -> Found:
    found = Found("litellm", "litellm", account or me, path, path, running=pids)
    o = found.overrides
    if account is not None and not account.own:
        o["user"] = account.name
    argv0, _ = program("litellm", environ)
    if argv and "--config" in argv:
        port = argv[argv.index("--port") + 1] if "--port" in argv[:-1] else str(LITELLM_PORT)
        restart = argv                            # as it runs now
    else:
        port = str(LITELLM_PORT)
        restart = [argv0, "--config", path, "--host", "127.0.0.1", "--port", port]
    if path != LITELLM_CONFIG:
        o["match"] = "litellm --config " + re.escape(path)
        o["config"] = [path]
    if path != LITELLM_CONFIG or argv0 != "litellm" or argv:
        o["restart"] = restart
    if port != str(LITELLM_PORT):
        o["health"] = {"url": f"http://127.0.0.1:{port}/health/liveliness"}
    return found


def scan(environ: dict | None = None) -> Scan:
    environ = dict(os.environ if environ is None else environ)
    everyone = accounts(environ)
    procs = processes()
    found = []
    for account in everyone:
        found += [f for f in (openclaw(account, environ, procs), hermes(account, environ, procs)) if f]
    for path, account, pids, argv in litellm_configs(everyone, procs):
        found.append(litellm(path, account, pids, argv, environ, everyone[0]))
    clis = {name: shutil.which(name, path=environ.get("PATH", DEFAULT_PATH)) for name in AGENT_CLIS}
    return Scan(found, clis)


def one_line(result: Scan) -> str:
    """What `pulsectl init` and pulsed's first run say of it: one line."""
    if not result.found:
        return "found no OpenClaw, Hermes or LiteLLM to guard (`pulsectl guard --detect` says where it looked)"
    words = sorted({f.guard for f in result.found})
    return (f"found {'; '.join(f.summary() for f in result.found)}; guard with: "
            + " / ".join(f"pulsectl guard {w}" for w in words) + " (`pulsectl guard --detect` for how)")
