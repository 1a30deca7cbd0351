"""[[process]] presets (pulse/core/presets): the settings the realcli tests run the real tools with,
merged under the table's own keys when config.toml is read, shown whole by `config --effective`."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import msgspec
import pytest

from pulse.core import config as configmod
from pulse.core import presets
from realgateways import readme_process
from support import pulsectl

ROOT = Path(__file__).resolve().parent.parent


def load(tmp_path, text: str, home: str = "/home/op") -> configmod.Config:
    path = tmp_path / "config.toml"
    path.write_text(text)
    import os
    old = os.environ.get("HOME")
    os.environ["HOME"] = home
    try:
        return configmod.load(path, {})
    finally:
        os.environ["HOME"] = old


def test_each_preset_is_the_readmes_tested_table_with_paths_of_the_account(tmp_path):
    config = load(tmp_path, """
        [[process]]
        preset = "openclaw-gateway"
        [[process]]
        preset = "hermes-gateway"
        env = { API_SERVER_KEY = "sk-test" }
        [[process]]
        preset = "litellm"
    """.replace("\n        ", "\n"))
    openclaw, hermes, litellm = config.process
    uid = __import__("os").getuid()
    assert openclaw.name == "openclaw-gateway" and openclaw.preset == "openclaw-gateway"
    assert openclaw.pidfile.path == f"/home/op/.openclaw/tmp/openclaw-{uid}/gateway.state.lock"
    assert openclaw.config == ["/home/op/.openclaw/openclaw.json"] and openclaw.env == {"HOME": "/home/op"}
    assert hermes.pidfile.path == "/home/op/.hermes/gateway.pid"
    for proc in (openclaw, hermes, litellm):
        documented = readme_process(proc.name)
        for key in ("restart", "start_grace_s", "restart_exit_codes", "stop_exit_codes", "match"):
            if key in documented:
                assert getattr(proc, key) == documented[key], (proc.name, key)
        assert {k: v for k, v in msgspec.to_builtins(proc.health).items() if v is not None} == documented["health"]
        if "pidfile" in documented:
            assert proc.pidfile.key == documented["pidfile"]["key"]
        for key, value in documented.get("env", {}).items():
            assert proc.env[key] == (value if key != "API_SERVER_KEY" else "sk-test"), key


def test_the_tables_own_keys_win_key_by_key(tmp_path):
    config = load(tmp_path, """
[[process]]
preset = "openclaw-gateway"
name = "gw"
user = "root"
match = "openclaw-gateway"
restart = ["/opt/openclaw", "gateway", "run"]
health = { start_period_s = 40, argv = ["true"] }
env = { OPENCLAW_STATE_DIR = "/srv/oc" }
""")
    (gw,) = config.process
    assert gw.name == "gw" and gw.match == "openclaw-gateway" and gw.pidfile is None      # match drops pidfile
    assert gw.restart == ["/opt/openclaw", "gateway", "run"]                               # a list replaces
    assert gw.health.argv == ["true"] and gw.health.url is None                            # argv drops url
    assert gw.health.start_period_s == 40 and gw.health.every_s == 5                       # the rest kept
    assert gw.env == {"HOME": "/root", "OPENCLAW_STATE_DIR": "/srv/oc"}                    # user's home
    assert gw.config == ["/root/.openclaw/openclaw.json"] and gw.start_grace_s == 8


def test_an_unknown_preset_names_the_table_and_the_known_ones(tmp_path):
    with pytest.raises(configmod.ConfigError) as err:
        load(tmp_path, '[[process]]\nname = "gw"\npreset = "openclaw"\n')
    said = str(err.value)
    assert "$.process[0].preset" in said and "'gw'" in said and "'openclaw'" in said
    assert "hermes-gateway, litellm, openclaw-gateway" in said


def test_what_a_preset_requires_is_asked_for_by_name(tmp_path):
    with pytest.raises(configmod.ConfigError, match=r"\$\.process\[0\]\.env\.API_SERVER_KEY: required.*pulsectl guard hermes"):
        load(tmp_path, '[[process]]\npreset = "hermes-gateway"\n')


def test_a_preset_table_is_validated_as_a_hand_written_one(tmp_path):
    with pytest.raises(configmod.ConfigError, match=r"\$\.process\[0\]\.health.*every_s|unknown key"):
        load(tmp_path, '[[process]]\npreset = "litellm"\nhealth = { every_secs = 1 }\n')


def test_each_preset_says_the_versions_install_realcli_pins():
    pins = dict(re.findall(r"^([A-Z0-9_]+)=(\S+)", (ROOT / "scripts/install_realcli.sh").read_text(), re.M))
    named = {"openclaw": "OPENCLAW", "node": "NODE24", "hermes-agent": "HERMES", "aiohttp": "HERMES_AIOHTTP",
             "litellm": "LITELLM"}
    assert presets.names() == ["hermes-gateway", "litellm", "openclaw-gateway"]
    for name in presets.names():
        tested = tomllib.loads((ROOT / "pulse/core/presets" / f"{name}.toml").read_text())["tested"]
        assert tested
        for tool, version in tested.items():
            assert pins[named[tool]] == version, (name, tool)


def test_config_effective_shows_the_merged_table(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[[process]]\npreset = "litellm"\nhealth = { every_s = 1 }\n')
    out = pulsectl(["--home", str(home), "config", "--effective"], timeout=60)
    assert out.returncode == 0, out.stderr
    (shown,) = tomllib.loads(out.stdout)["process"]
    assert shown["preset"] == "litellm" and shown["restart"][0] == "litellm"
    assert shown["health"] == {"url": "http://127.0.0.1:4000/health/liveliness", "every_s": 1, "timeout_s": 2,
                               "failures": 3, "start_period_s": 15}
