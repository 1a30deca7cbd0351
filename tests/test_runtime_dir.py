"""The runtime directory (/tmp/pulse-<uid>-<tag>, or under $XDG_RUNTIME_DIR) is removed when pulsed
stops cleanly, if it is empty, a real directory of ours (never through a symlink) and no other live
pulsed in the registry of running Pulses uses it. Real pulsed, real signals."""

from __future__ import annotations

import json
import os
import signal
import sys

from pulse.core import instances


def _registry(tmp_path):
    return {"PULSE_INSTANCES_DIR": str(tmp_path / "registry")}


def test_a_clean_stop_removes_the_empty_runtime_dir_and_a_kill_leaves_it(pulsed, tmp_path):
    pulsed.start(env=_registry(tmp_path))
    runtime = pulsed.paths.runtime
    assert runtime.is_dir() and list(runtime.glob("*.ipc"))
    assert pulsed.terminate() == 0
    assert not runtime.exists(), list(runtime.iterdir())
    assert "removed the runtime directory" in pulsed.log_text()
    # SIGKILLed, it can remove nothing; the next clean stop does.
    pulsed.start(env=_registry(tmp_path))
    pulsed.proc.send_signal(signal.SIGKILL)
    pulsed.proc.wait(10)
    assert runtime.is_dir()
    pulsed.start(env=_registry(tmp_path))
    assert pulsed.terminate() == 0 and not runtime.exists()


def test_a_runtime_dir_reached_through_a_symlink_or_not_empty_is_left(pulsed, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "rt"
    link.symlink_to(real)
    pulsed.start(env={**_registry(tmp_path), "PULSE_RUNTIME_DIR": str(link)})
    assert list(real.glob("*.ipc"))
    assert pulsed.terminate() == 0
    assert link.is_symlink() and real.is_dir()      # neither the link nor where it points
    left = tmp_path / "left"
    pulsed.start(env={**_registry(tmp_path), "PULSE_RUNTIME_DIR": str(left)})
    (left / "someone-else.txt").write_text("not pulsed's\n")
    assert pulsed.terminate() == 0
    assert (left / "someone-else.txt").exists()


def test_a_runtime_dir_another_live_pulsed_is_registered_with_is_left(pulsed, tmp_path):
    registry = tmp_path / "registry"
    shared = tmp_path / "shared"
    registry.mkdir(mode=0o700)
    # This test's own process stands for another live pulsed registered with the same directory.
    me = os.getpid()
    (registry / f"{me}.json").write_text(json.dumps({
        "name": "other", "home": str(tmp_path / "other"), "runtime": str(shared), "pid": me,
        "proc_start": instances.proc_start(me), "boot_id": instances.boot_id(), "started": 0}))
    pulsed.start(env={**_registry(tmp_path), "PULSE_RUNTIME_DIR": str(shared)})
    assert pulsed.terminate() == 0
    assert shared.is_dir()
    (registry / f"{me}.json").unlink()
    pulsed.start(env={**_registry(tmp_path), "PULSE_RUNTIME_DIR": str(shared)})
    assert pulsed.terminate() == 0
    assert not shared.exists()


def test_a_clean_stop_with_a_guarded_process_removes_it_and_the_keepers_server_ends(pulsed, tmp_path, tracker):
    """The keepers' server (which forks a keeper per start of a [[process]]) outlives pulsed by up to
    its CHECK_S: pulsed removes its socket and lock with its own files, and the server, finding its
    socket gone, ends; nothing of it is left in /tmp."""
    import psutil

    from pulse.effects import keepers
    from support import wait_for
    marker = f"pulse-runtime-test-{tmp_path.name}"
    pulsed.home.mkdir(exist_ok=True)
    argv = [sys.executable, "-c", "import time; time.sleep(3600)", marker]
    (pulsed.home / "config.toml").write_text(f'[[process]]\nname = "svc"\nmatch = "{marker}"\nrestart = {json.dumps(argv)}\n')
    pulsed.start(env=_registry(tmp_path))
    runtime = pulsed.paths.runtime
    wait_for(lambda: pulsed.vital("process-alive:svc", lambda d: d["alive"]), 30, what="svc started")
    title = keepers.server_title(str(pulsed.home))
    server = wait_for(lambda: [p for p in psutil.process_iter(["cmdline"])
                               if " ".join(p.info["cmdline"] or []).startswith(title)], 10, what="the keepers' server")[0]
    tracker.add(server.pid)
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or []):
            tracker.add(p.pid)
    assert (runtime / "keepers.sock").exists()
    assert pulsed.terminate() == 0
    assert not runtime.exists(), list(runtime.iterdir())
    server.wait(keepers.CHECK_S + 5)
