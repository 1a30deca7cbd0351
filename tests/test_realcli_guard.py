"""The real gateways guarded by `pulsectl guard`, nothing written by hand but one documented key: a
HOME laid out as each tool's own install leaves it, `guard --detect` finds it, `guard TOOL` appends
its preset's table, a real pulsed starts the gateway, and it is healed.

- OpenClaw (~/.openclaw/openclaw.json): kill -9 → exactly one healthy gateway after, restarted once,
  as `dead`; a broken edit of openclaw.json, then SIGSTOP: the restart on the broken file dies, the
  known-good file is written back (the operator's version kept, the diff notified), one healthy gateway.
- Hermes (~/.hermes with its API server's port and key in .env): SIGUSR1 (exit 75) restarted at once,
  kill -9 and SIGSTOP healed; a broken config.yaml (exit 78 at its next start) undone; one copy each time.
- LiteLLM (a proxy already running on ~/litellm_config.yaml, picked with --path, for other LiteLLMs of
  this host are found too): adopted, kill -9 → one healthy copy again, restarted as `dead`; SIGSTOP →
  the frozen copy stopped and one healthy copy, restarted as `unhealthy`; a broken edit of its config
  (exit 1 at its next start) undone, the operator's version kept and the diff notified.

Pinned: OpenClaw 2026.9.6 on node 24.22.3, Hermes Agent 0.19.0, LiteLLM 1.108.7 (scripts/install_realcli.sh), the
versions the presets say they were tested on. Tools missing: skipped, or failed in CI (CI=true).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from test_realcli_gateways import FAST, healthy, measure, restarts, whys

import realtools
from realgateways import TAG, Hermes, OpenClaw, Proxy, base_env, elapsed, gone, kill_all, stop_pulsed
from realtools import SECRET_PREFIXES, free_port, node24_bin, offline_env, require_tools, tool
from support import PULSECTL, wait_for

pytestmark = pytest.mark.realcli
START_PERIOD_S = 60
READY_S = START_PERIOD_S + 60           # one start, with room for a loaded machine


class InstalledOpenClaw(OpenClaw):
    """OpenClaw as its own install leaves it: its state in ~/.openclaw of a HOME in the tmp dir."""

    def __init__(self, root, tag: str):
        require_tools("openclaw", "node24")
        self.root, self.tag = root, tag
        self.home = root / "user-home"
        self.state = realtools.openclaw_state(self.home / ".openclaw")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/readyz"
        self.config_path = self.state / "openclaw.json"
        self.write_config({"gateway": {"mode": "local", "port": self.port,
                                       "auth": {"mode": "token", "token": "guard-gateway-token"}},
                           "plugins": {"enabled": False}})


class InstalledHermes(Hermes):
    """Hermes as its own install leaves it: ~/.hermes of a HOME in the tmp dir, its API server's port
    and key in its .env (as `hermes` setup writes them)."""

    def __init__(self, root, tag: str):
        require_tools("hermes")
        self.root, self.tag = root, tag
        self.user_home = root / "user-home"
        self.home = self.user_home / ".hermes"
        self.home.mkdir(parents=True)
        (self.home / "config.yaml").write_text("security:\n  tirith_enabled: false\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/health"
        (self.home / ".env").write_text(f"API_SERVER_PORT={self.port}\nAPI_SERVER_KEY=sk-guard-hermes-0123456789abcdef\n")


class InstalledLiteLLM(Proxy):
    """LiteLLM as an operator runs it: its config in ~/litellm_config.yaml (every model a mock), the
    proxy started from a shell, on a free loopback port."""

    def __init__(self, root, tag: str):
        require_tools("litellm")
        self.root, self.tag = root, tag
        self.home = root / "user-home"
        self.home.mkdir(parents=True)
        self.port = free_port()
        self.config = self.home / "litellm_config.yaml"
        self.config.write_text(realtools.LiteLLM(root, self.port).config())
        self.env = {**base_env(self.home), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        self.url = f"http://127.0.0.1:{self.port}/health/liveliness"


def shell_of(home, pulse_home, *bins) -> dict:
    """The operator's shell: the tools on PATH, HOME the account's, no credentials."""
    shell = {k: v for k, v in os.environ.items() if not k.startswith(SECRET_PREFIXES)}
    shell.update(HOME=str(home), PULSE_HOME=str(pulse_home),
                 PATH=":".join([*map(str, bins), os.environ.get("PATH", "/usr/bin:/bin")]))
    return shell


def pulsectl(shell: dict, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([PULSECTL, *args], env=shell, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"pulsectl {' '.join(args)}: {out.stdout}{out.stderr}"
    return out


def service_env(tag: str, tmp_path) -> dict:
    """pulsed as a service would run: none of the shell's tool settings or credentials, its own HOME
    (the table pins the gateway's), the test's tag inherited by what it starts."""
    blank = {k: "" for k in os.environ if k.startswith(SECRET_PREFIXES)}
    # Pulse's own deadlines as shipped, not the suite's 3 s for a worker to be ready and 1.5 s of
    # silence: at a load of 16 on this 2-core host its workers took 4.5-5.3 s to be ready, and
    # pulsed killed every start. What these tests time is the gateways, not Pulse's start.
    lenient = {"PULSE_READY_TIMEOUT_MS": "20000", "PULSE_HUNG_AFTER_MS": "10000"}
    return {**FAST, **lenient, **blank, **offline_env(), TAG: tag, "HOME": str(tmp_path)}


def test_openclaw_guarded_by_pulsectl_guard_undoes_a_broken_edit_and_is_healed_after_sigstop_and_kill_9(
        tmp_path, pulsed, openclaw_tmp):
    """The openclaw-gateway preset keeps openclaw.json known good: once it is (pinned here), an edit
    that breaks it (cut short, as an editor killed mid-write leaves it) is undone when the gateway
    next starts on it and dies, the operator's version kept and the diff notified. Here the next
    start is the one after a SIGSTOP (the frozen gateway stopped): then one healthy gateway on the
    known-good file. Then kill -9: one healthy gateway after, restarted as `dead`."""
    tag = str(tmp_path)
    gw = InstalledOpenClaw(tmp_path / "openclaw", tag)
    shell = shell_of(gw.home, pulsed.home, node24_bin(), tool("openclaw").parent)
    name = "openclaw-gateway"
    try:
        assert "OpenClaw: openclaw-gateway of" in pulsectl(shell, "guard", "--detect").stdout
        guarded = pulsectl(shell, "guard", "openclaw").stdout
        assert 'preset = "openclaw-gateway"' in guarded and str(tool("openclaw")) in guarded
        # The one key an operator of a loaded host changes (docs/guard.md): OpenClaw took 25-60 s to be
        # ready on this shared 2-core host (load 12-18) against 7-11 s idle, and the preset's probes
        # stop a start not ready 30 s after it. What is healed, and how, is the preset's.
        replace_probe(pulsed.home / "config.toml", gw.url, START_PERIOD_S)

        t = time.monotonic()
        pulsed.start(env={**service_env(tag, tmp_path), "TMPDIR": str(openclaw_tmp)})
        first = healthy(pulsed, gw, name, set(), READY_S)          # not running: Pulse starts it
        started = elapsed(t)
        assert json.loads(gw.lock.read_text())["pid"] == first              # the preset's pidfile, {path, key}

        good = gw.config_path.read_bytes()
        kept = pinned(pulsed, name)
        assert list(kept["data"]["files"]) == [str(gw.config_path)]

        broken = good[: len(good) // 2]
        gw.config_path.write_bytes(broken)
        wait_for(lambda: (pulsed.vital(f"config:{name}") or {}).get("files", {}).get(str(gw.config_path), {})
                 .get("sha256") not in (None, kept["data"]["files"][str(gw.config_path)]["sha256"]),
                 30, what="the edit seen by Pulse")
        frozen_at, t = time.time(), time.monotonic()
        os.kill(first, signal.SIGSTOP)
        restored = wait_for(lambda: [e for e in pulsed.events("effect-acked") if e["data"].get("kind") == "restore-config"
                                     and e["ts"] > frozen_at], 3 * (5 + 2) + 10 + READY_S, what="openclaw.json restored")[0]
        second = healthy(pulsed, gw, name, {first}, READY_S, frozen_at)
        freeze_to_healthy = elapsed(t)
        assert gone(first), "the frozen gateway is still there"
        assert gw.config_path.read_bytes() == good
        (entry,) = restored["data"]["files"]
        assert open(entry["kept"], "rb").read() == broken          # the operator's version, kept
        said = whys(restarts(pulsed, name, frozen_at))
        assert said[0] == "unhealthy" and said[-1] == "config-restored", said
        told = wait_for(lambda: [e["data"]["params"] for e in pulsed.events("effect") if e["data"]["kind"] == "notify"
                                 and e["data"]["params"].get("diff") and e["ts"] > frozen_at], 20,
                        what="the restore notified with its diff")[0]
        assert f"--- {gw.config_path} (as it was: undone)" in told["diff"], told
        assert entry["kept"] in told["message"], told

        killed_at, t = time.time(), time.monotonic()
        os.kill(second, signal.SIGKILL)
        third = healthy(pulsed, gw, name, {first, second}, READY_S, killed_at)
        kill_to_healthy = elapsed(t)
        assert whys(restarts(pulsed, name, killed_at)) == ["dead"]
        assert [p.pid for p in gw.copies()] == [third]
        measure("openclaw-guarded", start_to_healthy=started, broken_and_frozen_to_healthy=freeze_to_healthy,
                restarts_after_freeze=said, kill_to_healthy=kill_to_healthy)
    finally:
        stop_pulsed(pulsed)
        kill_all(tag, pulsed.home)


def test_hermes_guarded_by_pulsectl_guard_is_restarted_on_75_and_healed_after_kill_9_sigstop_and_a_broken_edit(
        tmp_path, pulsed):
    """The hermes-gateway preset, as `guard hermes` writes it from ~/.hermes/.env: /health served with
    the key and port found there; SIGUSR1 (exit 75) restarted at once; kill -9 healed; SIGSTOP healed;
    a broken config.yaml undone at the start that fails on it (exit 78); one copy each time."""
    tag = str(tmp_path)
    hg = InstalledHermes(tmp_path / "hermes", tag)
    shell = shell_of(hg.user_home, pulsed.home, tool("hermes").parent)
    try:
        assert "Hermes: hermes-gateway of" in pulsectl(shell, "guard", "--detect").stdout
        guarded = pulsectl(shell, "guard", "hermes").stdout
        assert f'API_SERVER_PORT = "{hg.port}"' in guarded and "sk-guard-hermes" in guarded
        t = time.monotonic()
        pulsed.start(env=service_env(tag, tmp_path))
        name = "hermes-gateway"
        first = healthy(pulsed, hg, name, set(), READY_S)
        started = elapsed(t)
        assert json.loads(hg.pidfile.read_text())["pid"] == first
        good = (hg.home / "config.yaml").read_bytes()
        kept = pinned(pulsed, name)
        assert list(kept["data"]["files"]) == [str(hg.home / "config.yaml")]

        asked_at, t = time.time(), time.monotonic()
        os.kill(first, signal.SIGUSR1)
        second = healthy(pulsed, hg, name, {first}, READY_S, asked_at)
        usr1_to_healthy = elapsed(t)
        assert gone(first) and whys(restarts(pulsed, name, asked_at)) == ["exit-code"]

        killed_at, t = time.time(), time.monotonic()
        os.kill(second, signal.SIGKILL)
        third = healthy(pulsed, hg, name, {first, second}, READY_S, killed_at)
        kill_to_healthy = elapsed(t)
        assert whys(restarts(pulsed, name, killed_at)) == ["dead"]
        assert [p.pid for p in hg.copies()] == [third]

        # SIGSTOP: alive, its /health silent; found unhealthy, the frozen one stopped, one new one.
        frozen_at, t = time.time(), time.monotonic()
        os.kill(third, signal.SIGSTOP)
        fourth = healthy(pulsed, hg, name, {first, second, third}, 5 + 3 * (5 + 2) + READY_S, frozen_at)
        freeze_to_healthy = elapsed(t)
        assert gone(third), "the frozen gateway is still there"
        assert whys(restarts(pulsed, name, frozen_at)) == ["unhealthy"]
        assert [p.pid for p in hg.copies()] == [fourth]

        # A broken edit (a fatal config error: it exits 78 at its next start), then a restart it asks
        # for: the start on the broken file says 78, the known-good config.yaml is written back (the
        # operator's kept, the diff notified), and it serves again on it.
        hg.break_config()
        broken = (hg.home / "config.yaml").read_bytes()
        wait_for(lambda: (pulsed.vital(f"config:{name}") or {}).get("files", {}).get(str(hg.home / "config.yaml"), {})
                 .get("sha256") not in (None, kept["data"]["files"][str(hg.home / "config.yaml")]["sha256"]),
                 30, what="the edit seen by Pulse")
        edited_at, t = time.time(), time.monotonic()
        os.kill(fourth, signal.SIGUSR1)
        restored = wait_for(lambda: [e for e in pulsed.events("effect-acked") if e["data"].get("kind") == "restore-config"
                                     and e["ts"] > edited_at], READY_S, what="config.yaml restored")[0]
        fifth = healthy(pulsed, hg, name, {first, second, third, fourth}, READY_S, edited_at)
        broken_to_healthy = elapsed(t)
        assert (hg.home / "config.yaml").read_bytes() == good
        (entry,) = restored["data"]["files"]
        assert open(entry["kept"], "rb").read() == broken
        assert [e["data"]["code"] for e in pulsed.events("process-exited", name) if e["ts"] > edited_at][-1:] == [78]
        assert whys(restarts(pulsed, name, edited_at)) == ["exit-code", "config-restored"]
        told = wait_for(lambda: [e["data"]["params"] for e in pulsed.events("effect") if e["data"]["kind"] == "notify"
                                 and e["data"]["params"].get("diff") and e["ts"] > edited_at], 20,
                        what="the restore notified with its diff")[0]
        assert f"--- {hg.home / 'config.yaml'} (as it was: undone)" in told["diff"], told
        assert [p.pid for p in hg.copies()] == [fifth]
        measure("hermes-guarded", start_to_healthy=started, usr1_to_healthy=usr1_to_healthy,
                kill_to_healthy=kill_to_healthy, freeze_to_healthy=freeze_to_healthy,
                broken_edit_to_healthy=broken_to_healthy)
    finally:
        stop_pulsed(pulsed)
        kill_all(tag, pulsed.home)


def pinned(pulsed, name: str) -> dict:
    """The config the gateway serves on, pinned known good by the operator (`pulsectl process config
    NAME --pin`), as Pulse keeps it itself once the gateway has served on it for its start period and
    config_good_after_s, unhealthy never (tests/test_config_rollback.py): on a host so loaded that a
    start fails probes past its start period, that would take a start or more. The keep-config's ack."""
    asked = pulsed.ctl("process", "config", name, "--pin")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    return wait_for(lambda: [e for e in pulsed.events("effect-acked") if e["data"].get("kind") == "keep-config"],
                    30, what="the config pinned known good")[0]


def replace_probe(config, url: str, start_period_s: int) -> None:
    """The table `guard` wrote ends with its probe's url; give it a longer start period (the one key
    an operator of a loaded host changes, docs/guard.md)."""
    probe = f'health = {{ url = "{url}" }}'
    assert config.read_text().endswith(probe + "\n"), config.read_text()[-400:]
    config.write_text(config.read_text().removesuffix(probe + "\n")
                      + f'health = {{ url = "{url}", start_period_s = {start_period_s} }}\n')


def test_litellm_guarded_by_pulsectl_guard_is_healed_after_kill_9_sigstop_and_a_broken_edit(tmp_path, pulsed):
    """The litellm preset, as `guard litellm --path` writes it for the proxy running on
    ~/litellm_config.yaml (its argv and port as it runs), with the longer start period of a loaded
    host (LiteLLM took over 50 s to be ready here at a load of 15): Pulse adopts that proxy; SIGSTOP →
    its /health/liveliness stops answering, the frozen proxy is stopped and exactly one healthy proxy
    runs, restarted as `unhealthy`; kill -9 → exactly one healthy proxy after, restarted as `dead`;
    a broken edit of its config, then kill -9 → the start on it exits 1, the known-good config is
    written back (the operator's version kept, the diff notified), one healthy proxy again."""
    tag = str(tmp_path)
    llm = InstalledLiteLLM(tmp_path / "litellm", tag)
    shell = shell_of(llm.home, pulsed.home, tool("litellm").parent)
    name = "litellm"
    with open(tmp_path / "litellm" / "operator.log", "ab") as log:     # the operator's own start
        operators = subprocess.Popen(llm.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
    try:
        wait_for(lambda: operators.poll() is not None or llm.ready(), READY_S, what="the operator's LiteLLM ready")
        assert operators.poll() is None, (tmp_path / "litellm" / "operator.log").read_text()[-2000:]
        detected = pulsectl(shell, "guard", "--detect").stdout
        assert f"LiteLLM: litellm of {llm.home.owner()}: {llm.config}, running (pid {operators.pid}" in detected, detected
        guarded = pulsectl(shell, "guard", "litellm", "--path", str(llm.config)).stdout
        assert 'preset = "litellm"' in guarded and f'"--port", "{llm.port}"' in guarded, guarded
        replace_probe(pulsed.home / "config.toml", llm.url, START_PERIOD_S)

        t = time.monotonic()
        pulsed.start(env={**service_env(tag, tmp_path), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                          "NO_PROXY": "127.0.0.1,localhost"})
        first = healthy(pulsed, llm, name, set(), READY_S)
        adopted = elapsed(t)
        assert first == operators.pid and not restarts(pulsed, name), "Pulse did not adopt the running proxy"

        # Frozen at once: its first passing probe ended its start period.
        frozen_at, t = time.time(), time.monotonic()
        os.kill(first, signal.SIGSTOP)
        second = healthy(pulsed, llm, name, {first}, 3 * (5 + 2) + 10 + READY_S, frozen_at)
        freeze_to_healthy = elapsed(t)
        operators.wait(10)                              # stopped, and reaped: a zombie of ours is not a proxy
        assert whys(restarts(pulsed, name, frozen_at)) == ["unhealthy"]

        killed_at, t = time.time(), time.monotonic()
        os.kill(second, signal.SIGKILL)
        third = healthy(pulsed, llm, name, {first, second}, READY_S, killed_at)
        kill_to_healthy = elapsed(t)
        assert whys(restarts(pulsed, name, killed_at)) == ["dead"]
        assert [p.pid for p in llm.copies()] == [third]

        # A broken edit of its config (a YAML it cannot parse): the proxy serves on as it read it, until
        # its next start (after a kill -9 here), which exits 1 on it; the known-good config is written
        # back, the operator's version kept and the diff notified, and the proxy serves again.
        good = llm.config.read_bytes()
        kept = pinned(pulsed, name)
        assert list(kept["data"]["files"]) == [str(llm.config)]
        broken = good + b"model_list: [an edit cut short\n"
        llm.config.write_bytes(broken)
        wait_for(lambda: (pulsed.vital(f"config:{name}") or {}).get("files", {}).get(str(llm.config), {})
                 .get("sha256") not in (None, kept["data"]["files"][str(llm.config)]["sha256"]),
                 30, what="the edit seen by Pulse")
        broken_at, t = time.time(), time.monotonic()
        os.kill(third, signal.SIGKILL)
        restored = wait_for(lambda: [e for e in pulsed.events("effect-acked") if e["data"].get("kind") == "restore-config"
                                     and e["ts"] > broken_at], 2 * READY_S, what="litellm_config.yaml restored")[0]
        fourth = healthy(pulsed, llm, name, {first, second, third}, READY_S, broken_at)
        broken_to_healthy = elapsed(t)
        assert llm.config.read_bytes() == good
        (entry,) = restored["data"]["files"]
        assert open(entry["kept"], "rb").read() == broken          # the operator's version, kept
        said = whys(restarts(pulsed, name, broken_at))
        assert said[0] == "dead" and said[-1] == "config-restored", said
        told = wait_for(lambda: [e["data"]["params"] for e in pulsed.events("effect") if e["data"]["kind"] == "notify"
                                 and e["data"]["params"].get("diff") and e["ts"] > broken_at], 20,
                        what="the restore notified with its diff")[0]
        assert f"--- {llm.config} (as it was: undone)" in told["diff"] and "an edit cut short" in told["diff"], told
        assert entry["kept"] in told["message"], told
        assert [p.pid for p in llm.copies()] == [fourth]
        measure("litellm-guarded", adopted=adopted, kill_to_healthy=kill_to_healthy,
                freeze_to_healthy=freeze_to_healthy, broken_edit_to_healthy=broken_to_healthy,
                restarts_after_broken_edit=said)
    finally:
        stop_pulsed(pulsed)
        kill_all(tag, pulsed.home)
        if operators.poll() is None:
            operators.kill()
        operators.wait(10)


# What a gateway that crashed mid-turn leaves: the session Hermes will resume at its next start.
STUCK_SESSION = """
import os
from pathlib import Path
from gateway.config import Platform, load_gateway_config
from gateway.session import SessionSource, SessionStore
store = SessionStore(Path(os.environ["HERMES_HOME"]) / "sessions", load_gateway_config())
entry = store.get_or_create_session(SessionSource(platform=Platform.API_SERVER, chat_id="stuck-chat", user_id="op"))
assert store.suspend_recently_active() == 1      # what Hermes does at a start after a crash
print(entry.session_key)
"""


def routing_entry(hermes_home, key: str) -> dict:
    import sqlite3
    conn = sqlite3.connect(f"file:{hermes_home / 'state.db'}?mode=ro", uri=True)
    try:
        (entry_json,) = conn.execute("SELECT entry_json FROM gateway_routing WHERE session_key = ?", (key,)).fetchone()
    finally:
        conn.close()
    return json.loads(entry_json)


def test_the_hermes_presets_way_out_of_a_crash_loop_has_the_real_hermes_set_its_stuck_session_aside(tmp_path):
    """The hermes-gateway preset's on_crash_loop, run as Pulse runs it when the gateway is held for
    crash-looping (its argv, with the table's env): the session Hermes would resume at its next start
    (resume_pending after a crash, made by Hermes' own session store) is suspended by the real Hermes
    at that start (its stuck-loop rule, fed by the way out), so that start does not resume it.
    Pulse's side (held → on_crash_loop once → one more start) is test_guarded's."""
    from pulse.core import presets
    tag = str(tmp_path)
    hg = Hermes(tmp_path / "hermes", tag)
    python = tool("hermes").parent / "python"
    made = subprocess.run([str(python), "-c", STUCK_SESSION], env={**hg.env, TAG: tag}, capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    key = made.stdout.split()[-1]
    assert routing_entry(hg.home, key)["resume_pending"] and not routing_entry(hg.home, key)["suspended"]

    table = presets.applied({"preset": "hermes-gateway", "env": {"HOME": hg.env["HOME"], "HERMES_HOME": str(hg.home),
                                                                 "API_SERVER_KEY": "sk-unused"}})
    way_out = subprocess.run(table["on_crash_loop"], env={**os.environ, **table["env"]}, capture_output=True,
                             text=True, timeout=60)
    assert way_out.returncode == 0 and key in way_out.stdout, way_out.stdout + way_out.stderr

    log = tmp_path / "hermes" / "gateway.log"
    t = time.monotonic()
    with open(log, "ab") as out:
        gateway = subprocess.Popen(hg.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_for(lambda: gateway.poll() is not None or hg.ready(), READY_S, what="the Hermes gateway serving")
        assert gateway.poll() is None, log.read_text()[-3000:]
        ready = elapsed(t)
        entry = routing_entry(hg.home, key)
        assert entry["suspended"], (entry, log.read_text()[-3000:])
        assert not (hg.home / ".restart_failure_counts").exists()       # Hermes took the count, and cleared it
        measure("hermes-way-out", way_out=way_out.stdout.strip(), gateway_ready_s=ready)
    finally:
        kill_all(tag, tmp_path)
        gateway.wait(10)
