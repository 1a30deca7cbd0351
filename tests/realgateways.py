"""OpenClaw's gateway, Hermes' gateway and LiteLLM's proxy as [[process]]es that a real pulsed
starts, for tests/test_realcli_gateways.py.

Each is started by Pulse from an argv that begins with `env K=V ...` (exec'd: the process keeps
the pid Pulse started), and every one of them carries TAG=<the test's own value> in its
environment: that is how the test counts the copies of a gateway, and how teardown finds every
process the test caused, wherever it was reparented, and kills it by pid.

What the real tools need (pinned versions of scripts/install_realcli.sh), measured on 2 cores:

- OpenClaw 2026.9.6 (node >= 24.16): `openclaw gateway run --port P --bind loopback` with
  openclaw.json {"gateway": {"mode": "local"}} in $OPENCLAW_STATE_DIR (without gateway.mode it
  exits 78 before it listens). Ready (/readyz 200) 7-11 s after the start. Its title becomes
  `openclaw` after 0.2 s and `openclaw-gateway` after ~3-4.5 s. Its lock file
  $OPENCLAW_STATE_DIR/tmp/openclaw-<uid>/gateway.state.lock is JSON ({"pid": ..., "port": ...}
  then whitespace), written 5-9 s after the start (once node has loaded it), removed on a clean
  exit, left stale by kill -9. SIGTERM: drains and exits in ~3 s.
  It writes outside its state dir: the log in /tmp/openclaw (logging.file moves it), the node
  compile cache and terminal uploads in $TMPDIR, and three empty lock files in the hard-coded
  /tmp/openclaw-state-locks-<uid>/ (removed as the run ends: realtools.remove_openclaw_locks).
- Hermes 0.19.0: `hermes gateway run --external-supervisor` with HERMES_HOME; no messaging
  platform is needed. /health comes from its API server platform (API_SERVER_ENABLED, _HOST,
  _PORT and _KEY: it refuses to start without a key, even on loopback), ~1 s after the start.
  Its pidfile $HERMES_HOME/gateway.pid (JSON, "pid") appears 1.4-2 s after the start.
  SIGUSR1: drains and exits 75. Exit 78 (GATEWAY_FATAL_CONFIG_EXIT_CODE) offline: a profile
  multiplexer config error (gateway.multiplex_profiles with a profile enabling a platform whose
  dm_policy is "open" without an allow-all opt-in), ~1.1 s after the start.
- LiteLLM 1.108.7: /health/liveliness 200 ("I'm alive!") 8-10 s after the start.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import tomllib
from pathlib import Path

import psutil

import realtools
from realtools import free_port, http_get, require_tools
from support import wait_exited

TAG = "PULSE_REALGW_TAG"
HERMES_KEY = "sk-realgw-hermes-0123456789abcdef"


def env_argv(tag: str, env: dict[str, str]) -> list[str]:
    """`env -u SECRET... TAG=tag K=V ... ARGV`: the environment of the process Pulse starts
    (pulsed's, without any credential or tool setting of the developer's shell, plus `env`);
    `env` execs, so the process keeps the pid Pulse started."""
    unset = [a for k in sorted(os.environ) if k.startswith(realtools.SECRET_PREFIXES) for a in ("-u", k)]
    return ["/usr/bin/env", *unset, f"{TAG}={tag}", *(f"{k}={v}" for k, v in env.items())]


def base_env(home: Path) -> dict[str, str]:
    """What every gateway gets: its HOME in the tmp dir, no proxy for loopback, no package index."""
    return {"HOME": str(home), "NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1", **realtools.offline_env()}


# -- finding what a test started ---------------------------------------------------------------------

def tagged(tag: str) -> list[psutil.Process]:
    """Live processes with TAG=tag in their environment (zombies left out)."""
    found = []
    for p in psutil.process_iter(["status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(TAG) == tag:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def keepers(home: Path) -> list[psutil.Process]:
    """Pulse's keepers of this home ("pulse: keep NAME (HOME)")."""
    return [p for p in psutil.process_iter() if (c := cmdline(p)) and c[0].startswith("pulse: keep")
            and str(home) in " ".join(c)]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_all(tag: str, home: Path) -> None:
    """SIGKILL every tagged process and every keeper of `home`, by pid; wait for them to go."""
    victims = tagged(tag) + keepers(home)
    for p in victims:
        try:
            p.send_signal(signal.SIGCONT)
            p.kill()
        except psutil.NoSuchProcess:
            pass
    wait_exited(victims, timeout=10)


def stop_pulsed(pulsed) -> None:
    """pulsed first (so nothing restarts what teardown kills): SIGTERM, so that it removes its
    sockets; SIGKILL if it does not go within 10 s. Then its runtime directory, if left empty."""
    if pulsed.proc is None:
        return
    runtime = pulsed.paths.runtime
    if pulsed.proc.poll() is None:
        try:
            pulsed.terminate(timeout=10)
        except Exception:
            pulsed.proc.kill()
            pulsed.proc.wait(10)
    try:
        runtime.rmdir()
    except OSError:
        pass


# -- OpenClaw ----------------------------------------------------------------------------------------

class OpenClaw:
    """OpenClaw's gateway as a [[process]]: state in `root`, a free loopback port."""

    def __init__(self, root: Path, tag: str, tmpdir: Path, config: dict | None = None):
        require_tools("openclaw", "node24")
        self.root, self.tag = root, tag
        self.state = realtools.openclaw_state(root / "openclaw-state")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/readyz"
        self.config_path = self.state / "openclaw.json"
        self.write_config(config if config is not None else {
            "gateway": {"mode": "local", "auth": {"mode": "token", "token": "realgw-gateway-token"}},
            "plugins": {"enabled": False},          # 1-2 s sooner ready; the gateway itself is the same
        })
        self.env = {**base_env(root / "user-home"), "OPENCLAW_STATE_DIR": str(self.state),
                    "OPENCLAW_CONFIG_PATH": str(self.config_path), "TMPDIR": str(tmpdir),
                    "PATH": f"{realtools.node24_bin()}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        (root / "user-home").mkdir(exist_ok=True)

    def write_config(self, config: dict) -> None:
        config = {**config, "logging": {**config.get("logging", {}), "file": str(self.root / "openclaw.log")}}
        self.config_path.write_text(json.dumps(config, indent=2))

    @property
    def lock(self) -> Path:
        """Its JSON lock file: {"pid": ..., "port": ...}. The pidfile Pulse reads."""
        return self.state / "tmp" / f"openclaw-{os.getuid()}" / "gateway.state.lock"

    def argv(self) -> list[str]:
        launcher = realtools.tool("openclaw").resolve()          # .bin/openclaw -> openclaw.mjs
        return [*env_argv(self.tag, self.env), str(realtools.node24_bin() / "node"), str(launcher),
                "gateway", "run", "--port", str(self.port), "--bind", "loopback"]

    def copies(self) -> list[psutil.Process]:
        """The gateways (not the node workers they start, not Pulse's keeper)."""
        def gateway(c: list[str]) -> bool:
            return bool(c) and (c[0].startswith("openclaw") or "gateway" in c) and not any("worker" in a for a in c)
        return [p for p in tagged(self.tag) if gateway(cmdline(p))]

    def ready(self) -> bool:
        got = http_get(self.url, timeout=1.0)
        return got is not None and got[0] == 200 and b'"ready":true' in got[1].replace(b" ", b"")


# -- Hermes --------------------------------------------------------------------------------------------

class Hermes:
    """Hermes' gateway as a [[process]]: HERMES_HOME in `root`, its API server (for /health) on a
    free loopback port."""

    def __init__(self, root: Path, tag: str):
        require_tools("hermes")
        self.root, self.tag = root, tag
        self.home = root / "hermes-home"
        self.home.mkdir(parents=True, exist_ok=True)
        # tirith (its shell-command scanner) would try to download itself at every start.
        (self.home / "config.yaml").write_text("security:\n  tirith_enabled: false\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/health"
        (root / "user-home").mkdir(exist_ok=True)
        self.env = {**base_env(root / "user-home"), "HERMES_HOME": str(self.home),
                    "API_SERVER_ENABLED": "true", "API_SERVER_HOST": "127.0.0.1",
                    "API_SERVER_PORT": str(self.port), "API_SERVER_KEY": HERMES_KEY}

    @property
    def pidfile(self) -> Path:
        return self.home / "gateway.pid"          # JSON: {"pid": ..., "kind": "hermes-gateway", ...}

    def argv(self) -> list[str]:
        return [*env_argv(self.tag, self.env), str(realtools.tool("hermes")), "gateway", "run", "--external-supervisor"]

    def break_config(self) -> None:
        """A fatal config error (exit 78 at the next start): a multiplexed profile that opens
        WhatsApp DMs to anyone without the allow-all opt-in."""
        (self.home / "config.yaml").write_text("gateway:\n  multiplex_profiles: true\n"
                                               "security:\n  tirith_enabled: false\n")
        profile = self.home / "profiles" / "bad"
        profile.mkdir(parents=True, exist_ok=True)
        (profile / "config.yaml").write_text("platforms:\n  whatsapp:\n    enabled: true\n    extra:\n"
                                             "      dm_policy: open\nsecurity:\n  tirith_enabled: false\n")

    def copies(self) -> list[psutil.Process]:
        return [p for p in tagged(self.tag) if any(a.endswith("/hermes") for a in cmdline(p)[:2])
                and "gateway" in cmdline(p)]

    def ready(self) -> bool:
        got = http_get(self.url, timeout=1.0)
        return got is not None and got[0] == 200


# -- LiteLLM ----------------------------------------------------------------------------------------------

class Proxy:
    """LiteLLM's proxy as a [[process]]: every model a mock answering "PONG", on a free port."""

    def __init__(self, root: Path, tag: str):
        require_tools("litellm")
        self.root, self.tag = root, tag
        self.port = free_port()
        self.config = root / "litellm.yaml"
        self.config.write_text(realtools.LiteLLM(root, self.port).config())
        (root / "user-home").mkdir(exist_ok=True)
        self.env = {**base_env(root / "user-home"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        self.url = f"http://127.0.0.1:{self.port}/health/liveliness"

    @property
    def match(self) -> str:
        return re.escape(f"litellm --config {self.config}")

    def argv(self) -> list[str]:
        return [*env_argv(self.tag, self.env), str(realtools.tool("litellm")), "--config", str(self.config),
                "--host", "127.0.0.1", "--port", str(self.port)]

    def copies(self) -> list[psutil.Process]:
        return [p for p in tagged(self.tag) if str(self.config) in " ".join(cmdline(p))
                and not cmdline(p)[0].startswith("pulse:")]

    def ready(self) -> bool:
        got = http_get(self.url, timeout=1.0)
        return got is not None and got[0] == 200


def readme_process(name: str) -> dict:
    """The [[process]] `name` as docs/gateways.md ("Watching OpenClaw, Hermes and LiteLLM") gives it
    (a test takes its health and env settings from there, so what it proves is what is documented)."""
    text = (realtools.ROOT / "docs" / "gateways.md").read_text()
    for block in re.findall(r"^```toml\n(.*?)^```", text, re.S | re.M):
        for process in tomllib.loads(block).get("process", []):
            if process.get("name") == name:
                return process
    raise LookupError(f"docs/gateways.md shows no [[process]] named {name!r}")


def toml_inline(table: dict) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + " }"


def toml_argv(argv: list[str]) -> str:
    return "[" + ", ".join(json.dumps(a) for a in argv) + "]"


def elapsed(t0: float) -> float:
    return round(time.monotonic() - t0, 2)
