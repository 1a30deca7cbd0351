"""Several Pulses on one host: each pulsed registers itself while it runs; `pulsectl
instances` lists them (dead entries cleaned); `pulsectl -i NAME` selects one on every command;
`pulsectl systemd install --instance NAME` writes the template unit pulse@.service.

Two real pulsed at once, with a private registry (PULSE_INSTANCES_DIR) for the test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from test_systemd import analyze, one, parse, verify  # noqa: F401  (analyze is a fixture)

from pulse.core import instances
from support import PULSECTL, Pulsed, init_home, pulsectl, wait_for


def ctl(registry, *args, home=None):
    env = {**os.environ, "PULSE_INSTANCES_DIR": str(registry)}
    env.pop("PULSE_HOME", None)
    prefix = ["--home", str(home)] if home else []
    return pulsectl([*prefix, *args], timeout=30, env=env)


def listed(registry) -> list[dict]:
    out = ctl(registry, "instances", "--json")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.fixture
def two(tmp_path, tracker):
    registry = tmp_path / "registry"
    a, b = Pulsed(tmp_path / "alpha", tracker), Pulsed(tmp_path / "beta", tracker)
    init_home(b.home)
    (b.home / "config.toml").write_text('[pulse]\nname = "bee"\n')
    for p in (a, b):
        p.start(env={"PULSE_INSTANCES_DIR": str(registry)})
    yield registry, a, b
    for p in (a, b):
        if p.proc.poll() is None:
            p.terminate()


def test_two_pulses_run_side_by_side_and_are_listed_by_name(two):
    registry, a, b = two
    rows = listed(registry)
    assert [(r["name"], r["home"], r["pid"]) for r in rows] == [("alpha", str(a.home), a.proc.pid),
                                                                ("bee", str(b.home), b.proc.pid)]
    n = len(a.status().workers)
    assert [(r["state"], r["running"], r["total"]) for r in rows] == [("answering", n, n)] * 2
    # Nothing shared: sockets, lock, stores.
    assert a.paths.runtime != b.paths.runtime
    assert {p.name for p in a.paths.runtime.glob("*.ipc")} and not set(a.paths.runtime.glob("*.ipc")) & set(
        b.paths.runtime.glob("*.ipc"))
    assert a.paths.lock != b.paths.lock and a.paths.events_db != b.paths.events_db
    # -i NAME on any command: the status of the one named, a task in its store only.
    st = json.loads(ctl(registry, "-i", "bee", "status", "--json").stdout)
    assert st["supervisor"]["home"] == str(b.home) and st["supervisor"]["pid"] == b.proc.pid
    out = ctl(registry, "-i", "alpha", "task", "add", "--project", "p", "--title", "t", "--prompt", "x")
    assert out.returncode == 0, out.stderr
    assert a.events("task-created") and not b.events("task-created")
    out = ctl(registry, "-i", "nobody", "status")
    assert out.returncode == 1 and "no running Pulse instance named 'nobody' (running: alpha, bee)" in out.stderr
    out = ctl(registry, "-i", "bee", "status", home=a.home)
    assert out.returncode == 2 and "exclusive" in out.stderr
    # a home where nothing runs: the ones that do run are named, with how to pick one
    out = ctl(registry, "status", home=registry.parent / "nohome")
    assert out.returncode == 4 and (f"running on this host: alpha (home {a.home}), bee (home {b.home}): "
                                    "select one with pulsectl -i NAME") in out.stderr, out.stderr
    # The table a person reads.
    text = ctl(registry, "instances").stdout
    assert "alpha" in text and "bee" in text and f"{n}/{n}" in text


def test_a_stopped_pulse_leaves_the_list_and_a_killed_ones_entry_is_cleaned(two):
    registry, a, b = two
    assert b.terminate() == 0
    assert [r["name"] for r in listed(registry)] == ["alpha"]
    assert not (registry / f"{b.proc.pid}.json").exists()
    a.proc.send_signal(signal.SIGKILL)          # no chance to unregister
    a.proc.wait(10)
    wait_for(lambda: instances.proc_start(a.proc.pid) is None, 10, what="alpha gone")
    assert (registry / f"{a.proc.pid}.json").exists()
    assert listed(registry) == []
    assert not list(registry.glob("*.json"))      # cleaned as it was read
    assert ctl(registry, "instances").stdout.strip() == "no Pulse is running"


def test_the_registry_lives_beside_the_runtime_dirs(tmp_path, monkeypatch):
    monkeypatch.delenv("PULSE_INSTANCES_DIR", raising=False)
    private = tmp_path / "xdg"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    assert instances.registry_dir(private / "pulse-1234abcd") == private / "pulse-instances"
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    assert instances.registry_dir(shared / "pulse-x") == shared / f"pulse-{os.getuid()}-instances"
    assert instances.registry_dir(instances.SYSTEM_RUNTIME / "a") == instances.SYSTEM_REGISTRY
    assert instances.registry_dir(instances.SYSTEM_RUNTIME) == instances.SYSTEM_REGISTRY


def test_systemd_install_instance_writes_the_template_unit(tmp_path, analyze):  # noqa: F811  (the fixture)
    out = subprocess.run([PULSECTL, "systemd", "install", "--instance", "a", "--output", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    unit = tmp_path / "pulse@.service"
    assert f"wrote {unit}" in out.stdout and "systemctl enable --now pulse@a" in out.stdout
    keys = parse(unit)
    assert one(keys, "Service", "StateDirectory") == "pulse/%i"
    assert "PULSE_HOME=/var/lib/pulse/%i" in keys[("Service", "Environment")]
    assert "PULSE_RUNTIME_DIR=%t/pulsed/%i" in keys[("Service", "Environment")]
    assert one(keys, "Service", "RuntimeDirectory") == "pulsed/%i pulsed/instances"
    # Where its pulsed registers: the system registry, shared by every instance.
    assert instances.registry_dir(instances.SYSTEM_RUNTIME / "a") == instances.SYSTEM_REGISTRY
    shutil.copy(unit, tmp_path / "pulse@a.service")
    verify(analyze, tmp_path / "pulse@a.service")
    bad = subprocess.run([PULSECTL, "systemd", "install", "--instance", "../x", "--print"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "invalid instance name" in bad.stderr



def test_a_starting_pulse_removes_the_entries_of_pulses_that_are_gone(pulsed, tmp_path):
    registry = tmp_path / "registry"
    pulsed.start(env={"PULSE_INSTANCES_DIR": str(registry)})
    killed = pulsed.proc.pid
    pulsed.proc.send_signal(signal.SIGKILL)     # no chance to unregister
    pulsed.proc.wait(10)
    wait_for(lambda: instances.proc_start(killed) is None, 10, what="the killed pulsed gone")
    assert (registry / f"{killed}.json").exists()
    # Entries whose pid lives on in another process: this test's own, with another start time or boot.
    me, boot = os.getpid(), Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    for name, fields in (("reused", {"proc_start": "1"}), ("earlier-boot", {"boot_id": "not-this-boot"})):
        entry = {"name": name, "home": "/nowhere", "runtime": "/nowhere", "pid": me, "started": 0,
                 "proc_start": instances.proc_start(me), "boot_id": boot, **fields}
        (registry / f"{name}.json").write_text(json.dumps(entry))
    # No listing: the next pulsed on this registry cleans them as it registers.
    pulsed.start(env={"PULSE_INSTANCES_DIR": str(registry)})
    assert [p.name for p in registry.glob("*.json")] == [f"{pulsed.proc.pid}.json"]
    entry = json.loads((registry / f"{pulsed.proc.pid}.json").read_text())
    assert entry["boot_id"] == boot and entry["proc_start"] == instances.proc_start(pulsed.proc.pid)
    assert [r["pid"] for r in listed(registry)] == [pulsed.proc.pid]
    assert pulsed.terminate() == 0
