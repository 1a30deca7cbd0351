"""`pulsectl guard --detect` and `pulsectl guard TOOL` on a fake host: HOME pointed at a directory laid
out as OpenClaw, Hermes and LiteLLM leave one (~/.openclaw/openclaw.json, ~/.hermes/config.yaml and
.env, a LiteLLM config, a systemd user unit), agent CLIs on PATH. And docs/guard.md's newcomer lines,
run as written: the fake OpenClaw gateway they guard is started and seen alive by a real pulsed."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import psutil
import pytest
from test_doc_snippets import fenced_blocks

from realtools import free_port
from support import FAST, init_home, kill_keepers, pulsectl, wait_for

ROOT = Path(__file__).resolve().parent.parent
ME = pwd.getpwuid(os.getuid()).pw_name
TOOL_ENV = ("OPENCLAW_STATE_DIR", "OPENCLAW_CONFIG_PATH", "OPENCLAW_HOME", "OPENCLAW_PROFILE", "HERMES_HOME")

# OpenClaw's gateway as Pulse sees it: `openclaw gateway run --port P --bind loopback` writes its JSON
# lock file (pid, port) under its state dir and answers /readyz.
FAKE_OPENCLAW = r'''
import http.server, json, os, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
state = os.environ.get("OPENCLAW_STATE_DIR") or os.path.join(os.environ["HOME"], ".openclaw")
lock = os.path.join(state, "tmp", f"openclaw-{os.getuid()}", "gateway.state.lock")
os.makedirs(os.path.dirname(lock), exist_ok=True)
with open(lock, "w") as f:
    json.dump({"pid": os.getpid(), "port": port}, f)

class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"ready":true}')

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Ready).serve_forever()
'''


class Host:
    """A fake host: an account's home with the tools' state, a bin directory on PATH, a Pulse home."""

    def __init__(self, tmp_path: Path):
        self.home = tmp_path / "agent-home"
        self.pulse = tmp_path / "pulse"
        self.bin = tmp_path / "bin"
        self.port = free_port()
        openclaw = self.home / ".openclaw"
        (openclaw / "agents" / "main" / "sessions").mkdir(parents=True)
        (openclaw / "openclaw.json").write_text(json.dumps({"gateway": {"mode": "local", "port": self.port}}))
        hermes = self.home / ".hermes"
        (hermes / "sessions").mkdir(parents=True)
        (hermes / "config.yaml").write_text("security:\n  tirith_enabled: false\n")
        (hermes / ".env").write_text("API_SERVER_KEY=sk-from-hermes-dotenv\n")
        self.litellm = self.home / "litellm_config.yaml"
        self.litellm.write_text("model_list: []\n")
        units = self.home / ".config" / "systemd" / "user"
        units.mkdir(parents=True)
        (units / "hermes-gateway.service").write_text("[Service]\nExecStart=hermes gateway run\n")
        self.bin.mkdir()
        self.tool("openclaw", FAKE_OPENCLAW)
        self.tool("claude", "import sys; sys.exit(0)")
        self.env = {k: v for k, v in os.environ.items() if k not in TOOL_ENV}
        self.env.update(HOME=str(self.home), PULSE_HOME=str(self.pulse), PATH=f"{self.bin}:{os.environ['PATH']}")

    def tool(self, name: str, source: str) -> None:
        path = self.bin / name
        path.write_text(f"#!{sys.executable}\n{source}")
        path.chmod(0o755)

    def ctl(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return pulsectl(list(args), timeout=60, env={**self.env, **(env or {})})

    @property
    def config(self) -> Path:
        return self.pulse / "config.toml"


def test_detect_finds_the_tools_and_says_how_it_would_guard_them_and_changes_nothing(tmp_path):
    host = Host(tmp_path)
    out = host.ctl("guard", "--detect")
    assert out.returncode == 0, out.stderr
    said = out.stdout
    assert f"OpenClaw: openclaw-gateway of {ME}: {host.home}/.openclaw, not running" in said
    assert "would guard it with: pulsectl guard openclaw" in said
    assert f'"--port", "{host.port}"' in said and f"http://127.0.0.1:{host.port}/readyz" in said    # its port
    assert f"Hermes: hermes-gateway of {ME}: {host.home}/.hermes" in said and "pulsectl guard hermes" in said
    assert f"its API server's key from {host.home}/.hermes/.env" in said and "sk-from-hermes-dotenv" not in said
    assert "hermes-gateway.service restarts it too" in said
    assert f"LiteLLM: litellm of {ME}: {host.litellm}" in said and "pulsectl guard litellm" in said
    assert re.search(r"agent CLIs on PATH: .*claude \(" + re.escape(str(host.bin)), said)
    assert "Nothing is guarded until" in said
    assert not host.pulse.exists()                        # nothing made, nothing written


def test_a_gateway_running_on_another_state_dir_is_not_taken_for_this_ones(tmp_path, tracker):
    """Another install's gateway of the same account (its own HOME) leaves this one not running; a
    gateway on this install's state dir is its running one."""
    host = Host(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / ".openclaw").mkdir(parents=True)
    gateways = {}
    for name, home in (("other", elsewhere), ("own", host.home)):
        port = free_port()
        gateways[name] = subprocess.Popen([str(host.bin / "openclaw"), "gateway", "run", "--port", str(port)],
                                          env={**host.env, "HOME": str(home)})
        tracker.add(gateways[name].pid)
        wait_for(lambda: (home / ".openclaw" / "tmp" / f"openclaw-{os.getuid()}" / "gateway.state.lock").exists(), 15,
                 0.05, what=f"the {name} gateway's lock file")
        said = host.ctl("guard", "--detect").stdout
        want = (f"{host.home}/.openclaw, running (pid {gateways['own'].pid})" if name == "own"
                else f"{host.home}/.openclaw, not running")
        assert want in said, said
    for proc in gateways.values():
        proc.kill()
        proc.wait(10)


@pytest.mark.fresh_home   # what pulsed's first run makes and says
def test_init_and_pulseds_first_run_say_what_detect_found_in_one_line(tmp_path, pulsed):
    host = Host(tmp_path)
    guard_with = "guard with: pulsectl guard hermes / pulsectl guard litellm / pulsectl guard openclaw"
    init = host.ctl("--home", str(tmp_path / "inited"), "init")
    assert init.returncode == 0, init.stderr
    (line,) = [line for line in init.stdout.splitlines() if line.startswith("found ")]
    assert f"openclaw-gateway of {ME}: {host.home}/.openclaw, not running" in line and guard_with in line

    pulsed.start(env={"HOME": str(host.home), "PATH": host.env["PATH"]})
    (logged,) = [line for line in pulsed.log_text().splitlines() if "first run: found " in line]
    assert f"hermes-gateway of {ME}: {host.home}/.hermes, not running" in logged and guard_with in logged


def test_guard_appends_its_table_keeping_the_file_then_refuses_a_file_it_would_break(tmp_path):
    host = Host(tmp_path)
    init_home(host.pulse)
    mine = host.config.read_text() + "\n# the operator's own note: kept as written\n[log]\nlevel = \"debug\"\n"
    host.config.write_text(mine)

    dry = host.ctl("guard", "hermes", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    (table,) = tomllib.loads(dry.stdout)["process"]
    assert table["preset"] == "hermes-gateway" and table["env"]["API_SERVER_KEY"] == "sk-from-hermes-dotenv"
    assert host.config.read_text() == mine

    done = host.ctl("guard", "hermes")
    assert done.returncode == 0, done.stderr
    assert "pulsed is not running" in done.stdout
    now = host.config.read_text()
    assert now.startswith(mine) and "pulsectl guard hermes" in now[len(mine):]
    assert host.ctl("check-config").returncode == 0
    effective = host.ctl("config", "--effective")
    (hermes,) = tomllib.loads(effective.stdout)["process"]
    assert hermes["restart_exit_codes"] == [75] and hermes["stop_exit_codes"] == [78]
    assert hermes["pidfile"]["path"] == f"{host.home}/.hermes/gateway.pid"
    assert hermes["env"]["HOME"] == str(host.home) and hermes["env"]["HERMES_GATEWAY_MAX_STARTS"] == "0"
    assert tomllib.loads(effective.stdout)["log"]["level"] == "debug"

    again = host.ctl("guard", "hermes")
    assert again.returncode == 0 and "already guarded" in again.stdout
    assert host.config.read_text() == now

    broken = now + "[timings]\nheartbeat_msx = 100\n"           # the operator's typo, not yet noticed
    host.config.write_text(broken)
    refused = host.ctl("guard", "openclaw")
    assert refused.returncode == 78, refused.stdout + refused.stderr
    assert "left as it was" in refused.stderr and "heartbeat_ms" in refused.stderr
    assert host.config.read_text() == broken


@pytest.mark.daemon
def test_the_newcomer_lines_of_docs_guard_md_guard_a_fake_openclaw(tmp_path, tracker):
    """docs/guard.md's first block, line by line as written (the install aside: this venv is it)."""
    host = Host(tmp_path)
    (_, block), *_ = fenced_blocks(ROOT / "docs" / "guard.md", ("sh",))
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines[0].startswith("python3 -m venv") and lines[-1].startswith("pulsectl process status"), lines
    env = {**FAST, "PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "300", "PULSE_EXECUTOR_SCAN_INTERVAL_MS": "100"}
    lock = host.home / ".openclaw" / "tmp" / f"openclaw-{os.getuid()}" / "gateway.state.lock"
    try:
        for line in lines[1:-1]:
            words = line.split()
            assert words[0] == "pulsectl", line
            out = host.ctl(*words[1:], env=env)
            assert out.returncode == 0, f"{line}: {out.stdout}{out.stderr}"
            if words[1:2] == ["daemon"]:
                tracker.add(json.loads(host.ctl("status", "--json").stdout)["supervisor"]["pid"])
        status = wait_for(lambda: (r := host.ctl(*lines[-1].split()[1:])).returncode == 0 and r, 60,
                          interval=0.5, what=f"{lines[-1]!r} to say it is alive")
        pid = json.loads(lock.read_text())["pid"]
        assert str(pid) in status.stdout
        assert [p.pid for p in psutil.process_iter(["cmdline"])
                if str(host.bin / "openclaw") in " ".join(p.info["cmdline"] or [])] == [pid]   # one copy, Pulse's
    finally:
        host.ctl("stop")
        kill_keepers(host.pulse)
        if lock.exists():
            try:
                os.kill(json.loads(lock.read_text())["pid"], signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def test_guard_reloads_a_running_pulsed_which_starts_the_gateway_and_a_hand_written_table_counts(tmp_path, pulsed):
    host = Host(tmp_path)
    host.pulse = pulsed.home
    host.env["PULSE_HOME"] = str(pulsed.home)
    init_home(pulsed.home)
    # docs/gateways.md's way, by hand: a [[process]] on Hermes' pidfile is Hermes guarded already.
    with open(host.config, "a") as f:
        f.write(f'\n[[process]]\nname = "mine"\npidfile = {{ path = "{host.home}/.hermes/gateway.pid", key = "pid" }}\n')
    pulsed.start(env={"PULSE_WATCHER_INTERVAL_MS": "300", "PULSE_TICK_MS": "100"})
    detect = host.ctl("guard", "--detect").stdout
    assert "already guarded: [[process]] 'mine'" in detect and "pulsectl guard openclaw" in detect

    done = host.ctl("guard", "openclaw")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reloaded" in done.stdout and "openclaw-gateway" in done.stdout.split("reloaded", 1)[1], done.stdout
    lock = host.home / ".openclaw" / "tmp" / f"openclaw-{os.getuid()}" / "gateway.state.lock"
    try:
        vital = wait_for(lambda: pulsed.vital("process-alive:openclaw-gateway", lambda d: d.get("alive")), 30,
                         interval=0.2, what="the guarded gateway started and seen alive")
        # seen alive as the keeper's child at once; its lock file comes once its Python is up
        wait_for(lock.exists, 15, 0.05, what="the gateway's lock file")
        wait_for(lambda: json.loads(lock.read_text() or "{}").get("pid") == vital["pid"], 15, 0.05,
                 what=f"the lock file naming the pid seen alive ({vital['pid']})")
    finally:
        kill_keepers(pulsed.home)


def test_guard_refuses_to_pick_for_the_operator_and_changes_nothing(tmp_path):
    host = Host(tmp_path)
    (host.home / ".litellm").mkdir()
    (host.home / ".litellm" / "config.yaml").write_text("model_list: []\n")        # a second LiteLLM config
    two = host.ctl("guard", "litellm")
    # At least these two: a LiteLLM another test runs on this host is found as well.
    assert two.returncode == 1 and re.search(r"found \d+ of LiteLLM of one account", two.stderr), two.stderr
    assert 'preset = "litellm"' in two.stderr and "say which with --path" in two.stderr
    assert f"pulsectl guard litellm --path {host.litellm}" in host.ctl("guard", "--detect").stdout
    picked = host.ctl("guard", "litellm", "--path", str(host.litellm), "--dry-run")
    assert picked.returncode == 0 and f'config = ["{host.litellm}"]' in picked.stdout, picked.stderr
    elsewhere = host.ctl("guard", "litellm", "--path", str(tmp_path / "nowhere.yaml"))
    assert elsewhere.returncode == 1 and f"found no LiteLLM at {tmp_path / 'nowhere.yaml'}" in elsewhere.stderr
    none = host.ctl("guard", "openclaw", "--user", "no-such-account-h35")
    assert none.returncode == 1 and "found no OpenClaw of the account 'no-such-account-h35'" in none.stderr
    assert host.ctl("guard").returncode == 2                                         # --detect or a tool
    assert not host.pulse.exists()
