"""A way out of a crash loop, through a real pulsed, and a hold that outlives reloads.

Three processes that die about a second after each start: `stuck` while a "stuck session" file lies
in its cwd (its on_crash_loop removes it, so the one more start that follows it runs); `hopeless`
whatever happens (its on_crash_loop fails with code 3, the start after it dies too, and it is held
again); `plain` with no on_crash_loop (held once). Then two reloads, one of an unchanged file and
one that changes another table (the workers restart on it): what was held stays held, and no
on_crash_loop runs twice. And the argv itself, run by its effect kind as the process's own account."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid

import pytest

from pulse.core import config as configmod
from pulse.core.wire.enginerpc import Effect
from pulse.effects import kinds
from pulse.effects.kinds import EffectContext, EffectFailed
from support import init_home, notifications, wait_for

FAST = {"PULSE_TICK_MS": "200", "PULSE_WATCHER_INTERVAL_MS": "100", "PULSE_EXECUTOR_SCAN_INTERVAL_MS": "100"}
PY = json.dumps(sys.executable)



def effects_of(pulsed, kind: str, name: str) -> list[dict]:
    return [e for e in pulsed.events("effect", written=False) if e["data"]["kind"] == kind and e["target"] == name]


def ended(pulsed, effect: dict) -> dict | None:
    return next((e for t in ("effect-acked", "effect-failed") for e in pulsed.events(t, effect["target"], written=False)
                 if e["data"].get("effect_id") == effect["data"]["id"]), None)


def state(pulsed, name: str) -> str | None:
    return next((p.state for p in pulsed.status().processes if p.name == name), None)


def table(name: str, script, cwd, on_crash_loop: list[str] | None = None, extra: str = "") -> str:
    way_out = f"on_crash_loop = {json.dumps(on_crash_loop)}\n" if on_crash_loop else ""
    return textwrap.dedent(f"""
        [[process]]
        name = "{name}"
        match = "{script} {name}$"
        restart = [{PY}, "{script}", "{name}"]
        cwd = "{cwd}"
        start_grace_s = 0.3
        min_uptime_s = 5                  # a run is about 1 s (2-3 s on a loaded host): clearly quick
        max_restarts = 2
        restart_window_s = 120
        restart_backoff = {{ base_s = 0.5, max_s = 1 }}
    """) + way_out + extra


@pytest.mark.daemon
def test_a_crash_loop_held_fatal_runs_on_crash_loop_once_then_one_more_start_and_holds_survive_reloads(
        pulsed, tmp_path):
    script = tmp_path / "app.py"       # dies a second after starting while a stuck session is there
    script.write_text("import os, sys, time\n"
                      "if sys.argv[1] != 'stuck' or os.path.exists('stuck.session'):\n"
                      "    print('resuming session 42 ... crashed', flush=True)\n"
                      "    time.sleep(1)\n"
                      "    sys.exit(1)\n"
                      "print('serving', flush=True)\n"
                      "time.sleep(3600)\n")
    (tmp_path / "stuck.session").write_text("42")
    notes = tmp_path / "notes.jsonl"
    clear = [sys.executable, "-c", "import os; os.remove('stuck.session'); print('cleared session 42 in', os.getcwd())"]
    give_up = [sys.executable, "-c", "import sys; print('nothing to clear'); sys.exit(3)"]
    config = (f'[[notify]]\nkind = "file"\npath = "{notes}"\n' + table("stuck", script, tmp_path, clear)
              + table("hopeless", script, tmp_path, give_up) + table("plain", script, tmp_path))
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(config)
    pulsed.start(env=FAST)

    # stuck: held after its 2 failed starts, its on_crash_loop run once (in its cwd), then one more start that runs
    wait_for(lambda: (p := effects_of(pulsed, "restart-process", "stuck")) and len(p) == 3 and state(pulsed, "stuck")
             in ("starting", "running"), 40, what="stuck started once more after its on_crash_loop")
    (way_out,) = effects_of(pulsed, "on-crash-loop", "stuck")
    outcome = ended(pulsed, way_out)
    assert outcome["type"] == "effect-acked" and outcome["data"]["code"] == 0
    assert f"cleared session 42 in {tmp_path}" in outcome["data"]["tail"]
    starts = effects_of(pulsed, "restart-process", "stuck")
    assert [s["data"]["params"]["why"] for s in starts] == ["dead", "dead", "on-crash-loop"]
    assert starts[1]["ts"] < way_out["ts"] < outcome["ts"] < starts[2]["ts"]
    told = wait_for(lambda: notifications(notes, "process-fatal"), 10, what="stuck's fatal notification")
    first = [n for n in told if n["target"] == "stuck"]
    assert len(first) == 1 and "running its on_crash_loop" in first[0]["message"]
    wait_for(lambda: state(pulsed, "stuck") == "running", 15, what="stuck running past min_uptime_s")

    # hopeless: its on_crash_loop fails (code 3), the start after it dies too: held again, said again, once
    def held_again():
        said = [n for n in notifications(notes, "process-fatal") if n["target"] == "hopeless"]
        return len(said) == 2 and state(pulsed, "hopeless") == "fatal" and said
    said = wait_for(held_again, 40, what="hopeless held again after its one more start")
    assert "running its on_crash_loop" in said[0]["message"]
    assert "its on_crash_loop ran (exit code 3: nothing to clear) and the start after it died too" in said[1]["message"]
    (tried,) = effects_of(pulsed, "on-crash-loop", "hopeless")
    assert ended(pulsed, tried)["type"] == "effect-failed" and ended(pulsed, tried)["data"]["code"] == 3
    assert [s["data"]["params"]["why"] for s in effects_of(pulsed, "restart-process", "hopeless")] \
        == ["dead", "dead", "on-crash-loop"]
    wait_for(lambda: state(pulsed, "plain") == "fatal", 30, what="plain held")
    assert len(effects_of(pulsed, "restart-process", "plain")) == 2 and not effects_of(pulsed, "on-crash-loop", "plain")

    # two reloads: the file unchanged, then another table changed (the workers that read it restart)
    for text in (config, config.replace('name = "stuck"', 'name = "stuck"\nenv = { SESSION = "43" }')):
        (pulsed.home / "config.toml").write_text(text)
        done = pulsed.ctl("reload")
        assert done.returncode == 0, done.stdout + done.stderr
        ticks = len(pulsed.ticks())
        wait_for(lambda: len(pulsed.ticks()) >= ticks + 15, 30, what="15 ticks after the reload")
        assert state(pulsed, "plain") == "fatal" and state(pulsed, "hopeless") == "fatal"
    assert len(effects_of(pulsed, "restart-process", "plain")) == 2
    assert len(effects_of(pulsed, "restart-process", "hopeless")) == 3
    assert len(effects_of(pulsed, "on-crash-loop", "hopeless")) == 1
    assert len(effects_of(pulsed, "on-crash-loop", "stuck")) == 1
    assert len([n for n in notifications(notes, "process-fatal") if n["target"] in ("plain", "hopeless")]) == 3


@pytest.fixture
def account():
    """A real second account, made for this test and removed after it."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd")
    name = f"pw{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


def test_on_crash_loop_runs_as_the_process_s_user_in_its_cwd_and_says_its_code_and_output(account, tmp_path):
    shared = tempfile.mkdtemp(prefix="pulse-wayout-", dir="/tmp")
    os.chmod(shared, 0o711)
    try:
        def ctx(argv: list[str]) -> EffectContext:
            cfg = configmod.validate(configmod.decode(textwrap.dedent(f"""
                [[process]]
                name = "gw"
                match = "gw"
                restart = ["gw"]
                user = "{account}"
                cwd = "{shared}"
                env = {{ WHO = "the gateway" }}
                on_crash_loop = {json.dumps(argv)}
            """).encode(), "config.toml"), "config.toml")
            return EffectContext(configmod.slice_of(cfg, "executor"), tmp_path / "objects", 5.0)
        done = kinds.run_on_crash_loop(Effect(kind="on-crash-loop", target="gw"),
                                       ctx(["sh", "-c", "id -u; pwd; echo \"$WHO\""]))
        assert done["code"] == 0 and done["user"] == account
        assert done["tail"].split() == [str(pwd.getpwnam(account).pw_uid), shared, "the", "gateway"]
        with pytest.raises(EffectFailed) as failed:
            kinds.run_on_crash_loop(Effect(kind="on-crash-loop", target="gw"), ctx(["sh", "-c", "echo stuck; exit 3"]))
        assert failed.value.reason == "exit" and failed.value.data["code"] == 3 and "stuck" in failed.value.data["tail"]
    finally:
        shutil.rmtree(shared, ignore_errors=True)
