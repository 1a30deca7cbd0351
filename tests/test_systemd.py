"""The systemd units, rendered by the real `pulsectl systemd install` and checked by systemd itself.

`systemd-analyze verify` exits 0 on an unknown or misplaced key and only warns on
stderr, so every verify here fails on ANY stderr output. It exits 1 when the
ExecStart binary is missing: the units are rendered with this installation's
real pulsed. `systemd-analyze security --offline=yes` scores the sandbox.

systemd-analyze 252 does not resolve User= when it verifies (it runs nothing),
so the default rendering, with `User=pulse`, is verified as is even on a host
without that account; `--user-name` is checked separately.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

BIN = Path(sys.executable).parent
PULSED = str(BIN / "pulsed")
PULSECTL = str(BIN / "pulsectl")
TIMEOUT = 60          # seconds, for every subprocess a test runs
MAX_EXPOSURE = 5.0    # systemd-analyze security's "Overall exposure level", lower is better


@pytest.fixture
def analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze is not on PATH")
    return path


def pulsectl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PULSECTL, *args], capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, **(env or {})})


def install(out: Path, *args: str) -> Path:
    proc = pulsectl("systemd", "install", "--output", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    unit = out / "pulse.service"
    assert unit.is_file()
    assert f"wrote {unit}" in proc.stdout
    return unit


def parse(unit: Path) -> dict[tuple[str, str], list[str]]:
    """(section, key) -> values, in order; enough of systemd.syntax(7) for these units."""
    out: dict[tuple[str, str], list[str]] = {}
    section = None
    for line in unit.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault((section, key), []).append(value)
    return out


def one(keys: dict, section: str, key: str) -> str:
    values = keys.get((section, key))
    assert values and len(values) == 1, f"[{section}] {key}= should be set once, got {values}"
    return values[0]


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|min)?", value)
    assert m, value
    return int(m[1]) * {"ms": 0.001, "s": 1, None: 1, "min": 60}[m[2]]


def verify(analyze: str, unit: Path, user: bool = False, runtime_dir: Path | None = None) -> None:
    env = dict(os.environ)
    cmd = [analyze, "verify", str(unit)]
    if user:
        # The user manager's search paths need an XDG_RUNTIME_DIR, private as a real one.
        runtime_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(runtime_dir, 0o700)
        env["XDG_RUNTIME_DIR"] = str(runtime_dir)
        cmd = [analyze, "--user", "verify", str(unit)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=unit.parent)
    assert proc.returncode == 0 and proc.stderr == "", \
        f"{' '.join(cmd)} -> {proc.returncode}\n{proc.stderr}{proc.stdout}"


def exposure(analyze: str, unit: Path, user: bool = False, runtime_dir: Path | None = None) -> float:
    """Run `security --offline=yes --threshold` (which compares exposure x 10); return the score."""
    env = dict(os.environ)
    cmd = [analyze, "security", "--offline=yes", f"--threshold={int(MAX_EXPOSURE * 10)}", str(unit)]
    if user:
        runtime_dir.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime_dir)
        cmd.insert(1, "--user")
    proc = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT, env=env, cwd=unit.parent)
    out = proc.stdout.decode(errors="replace")
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out)
    assert m, out + proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, f"exposure {m[1]} is over the threshold {MAX_EXPOSURE}\n{out}"
    return float(m[1])


# -- rendering ---------------------------------------------------------------------------------


def test_system_unit_defaults(tmp_path):
    unit = install(tmp_path)
    text = unit.read_text()
    assert not re.search(r"@[A-Z_]+@", text), "a placeholder was left unfilled"
    keys = parse(unit)
    assert one(keys, "Service", "ExecStart") == PULSED
    assert one(keys, "Service", "User") == "pulse"
    assert one(keys, "Service", "Type") == "notify"
    assert one(keys, "Service", "NotifyAccess") == "main"
    assert one(keys, "Service", "Restart") == "always"
    assert one(keys, "Service", "RestartPreventExitStatus") == "78"
    assert one(keys, "Service", "KillMode") == "mixed"
    assert one(keys, "Service", "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one(keys, "Service", "OOMPolicy") == "continue"
    # Longer than pulsed's own stop grace (stop_grace_ms, 5 s) plus its SIGKILL sweep.
    assert seconds(one(keys, "Service", "TimeoutStopSec")) > 5 + 1
    assert seconds(one(keys, "Service", "WatchdogSec")) > 0
    assert seconds(one(keys, "Service", "RestartSec")) > 0
    # The start limit lives in [Unit] and must be able to trigger at this RestartSec.
    interval = seconds(one(keys, "Unit", "StartLimitIntervalSec"))
    burst = int(one(keys, "Unit", "StartLimitBurst"))
    assert interval > burst * seconds(one(keys, "Service", "RestartSec"))
    assert one(keys, "Service", "StateDirectory") == "pulse"
    assert one(keys, "Service", "RuntimeDirectory") == "pulsed"
    env = keys[("Service", "Environment")]
    assert "PULSE_HOME=/var/lib/pulse" in env and "PULSE_RUNTIME_DIR=%t/pulsed" in env
    # What Pulse needs must not be sandboxed away.
    for key in ("ProtectProc", "ProcSubset", "PrivateNetwork", "IPAddressDeny"):
        assert ("Service", key) not in keys, f"{key}= would break watching processes or the network"
    assert one(keys, "Service", "RestrictAddressFamilies").split() == ["AF_UNIX", "AF_INET", "AF_INET6",
                                                                      "AF_NETLINK"]


def test_user_name_and_options(tmp_path):
    keys = parse(install(tmp_path / "a", "--user-name", "agent_pulse"))
    assert one(keys, "Service", "User") == "agent_pulse"
    bad = pulsectl("systemd", "install", "--output", str(tmp_path / "b"), "--user-name", "x\nExecStartPre=/bin/sh")
    assert bad.returncode == 1 and "invalid user name" in bad.stderr
    assert not (tmp_path / "b" / "pulse.service").exists()
    assert pulsectl("systemd", "install", "--user", "--user-name", "x", "--print").returncode == 2
    assert pulsectl("systemd", "install", "--print", "--output", str(tmp_path / "c")).returncode == 2


def test_print_matches_output(tmp_path):
    for args in ((), ("--user",)):
        printed = pulsectl("systemd", "install", "--print", *args)
        assert printed.returncode == 0, printed.stderr
        assert printed.stdout == install(tmp_path / "-".join(("o",) + args), *args).read_text()


def test_user_unit_default_location(tmp_path):
    """--user writes $XDG_CONFIG_HOME/systemd/user/pulse.service and says what to run next."""
    proc = pulsectl("systemd", "install", "--user", env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert proc.returncode == 0, proc.stderr
    unit = tmp_path / "config" / "systemd" / "user" / "pulse.service"
    assert unit.is_file() and oct(unit.stat().st_mode & 0o777) == "0o644"
    assert "systemctl --user daemon-reload && systemctl --user enable --now pulse" in proc.stdout
    keys = parse(unit)
    assert one(keys, "Service", "ExecStart") == PULSED
    assert ("Service", "User") not in keys
    assert "PULSE_HOME=%h/.pulse" in keys[("Service", "Environment")]
    assert one(keys, "Install", "WantedBy") == "default.target"


def test_the_unit_takes_the_home_pulsectl_was_given(tmp_path):
    home = tmp_path / "agent-home"
    printed = pulsectl("--home", str(home), "systemd", "install", "--user", "--print")
    assert printed.returncode == 0, printed.stderr
    assert f"Environment=PULSE_HOME={home}\n" in printed.stdout and f"ReadWritePaths={home}\n" in printed.stdout
    assert f"ExecStartPre=+/bin/mkdir -p -m 0700 {home}\n" in printed.stdout and "%h/.pulse" not in printed.stdout
    refused = pulsectl("--home", str(home), "systemd", "install", "--print")     # the system unit's is fixed
    assert refused.returncode == 1 and "the system unit's home is /var/lib/pulse" in refused.stderr
    spaced = pulsectl("--home", str(tmp_path / "a b"), "systemd", "install", "--user", "--print")
    assert spaced.returncode == 1 and "take no spaces" in spaced.stderr


def test_system_next_steps(tmp_path):
    proc = pulsectl("systemd", "install", "--output", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "useradd --system --home-dir /var/lib/pulse --shell /usr/sbin/nologin pulse" in proc.stdout
    assert "systemctl daemon-reload && systemctl enable --now pulse" in proc.stdout


# -- checked by systemd ------------------------------------------------------------------------


def test_system_unit_verifies(analyze, tmp_path):
    verify(analyze, install(tmp_path))


def test_user_unit_verifies(analyze, tmp_path):
    verify(analyze, install(tmp_path / "out", "--user"), user=True, runtime_dir=tmp_path / "xdg-runtime")


def test_verify_catches_what_it_should(analyze, tmp_path):
    """The harness is honest: a key systemd 252 does not know, and a missing binary, both fail."""
    unit = install(tmp_path)
    good = unit.read_text()
    unit.write_text(good.replace("RestartSec=2s\n", "RestartSec=2s\nRestartSteps=5\n"))   # a v254 key
    with pytest.raises(AssertionError, match="Unknown key"):
        verify(analyze, unit)
    unit.write_text(good.replace(f"ExecStart={PULSED}\n", f"ExecStart={tmp_path}/no-such-pulsed\n"))
    with pytest.raises(AssertionError, match="no-such-pulsed"):
        verify(analyze, unit)


def test_odd_pulsed_path(analyze, tmp_path):
    """A virtualenv path with a space and a '%' survives unit quoting and specifier expansion."""
    from pulse.cli.systemdcmd import SYSTEM_TEMPLATE, render, template

    odd = tmp_path / "my venv 100%" / "bin"
    odd.mkdir(parents=True)
    (odd / "pulsed").symlink_to(PULSED)
    unit = tmp_path / "pulse.service"
    unit.write_text(render(template(SYSTEM_TEMPLATE), str(odd / "pulsed"), "pulse"))
    assert f'ExecStart="{odd}/pulsed"'.replace("%", "%%") in unit.read_text()
    verify(analyze, unit)


def test_security_exposure(analyze, tmp_path):
    system = exposure(analyze, install(tmp_path / "system"))
    user = exposure(analyze, install(tmp_path / "user", "--user"), user=True, runtime_dir=tmp_path / "xdg")
    assert system < MAX_EXPOSURE and user < MAX_EXPOSURE, (system, user)


# -- MemoryDenyWriteExecute=yes, for real --------------------------------------------------------

# systemd 252's MemoryDenyWriteExecute= filter (seccomp_memory_deny_write_execute): mmap with
# PROT_WRITE|PROT_EXEC, mprotect/pkey_mprotect with PROT_EXEC and shmat with SHM_EXEC fail (EPERM
# here; the rules, not the errno, are what matters). x86-64 only. It installs the filter, then
# execs argv[1:], so pulsed and every process it forks run under it.
MDWE_EXEC = r'''
import ctypes, os, struct, sys
LD, JEQ, JSET, AND, RET = 0x20, 0x15, 0x45, 0x54, 0x06
ALLOW, EPERM, ARG2 = 0x7FFF0000, 0x00050001, 32
code = [(LD, 4, None, None), (JEQ, 0xC000003E, "nr", "deny"),
        "nr", (LD, 0, None, None), (JEQ, 9, "mmap", "mprotect"),
        "mmap", (LD, ARG2, None, None), (AND, 6, None, None), (JEQ, 6, "deny", "allow"),
        "mprotect", (JEQ, 10, "exec", "pkey"),
        "pkey", (JEQ, 329, "exec", "shmat"),
        "exec", (LD, ARG2, None, None), (JSET, 4, "deny", "allow"),
        "shmat", (JEQ, 30, "shm", "allow"),
        "shm", (LD, ARG2, None, None), (JSET, 0o100000, "deny", "allow"),
        "deny", (RET, EPERM, None, None), "allow", (RET, ALLOW, None, None)]
labels, insns = {}, []
for item in code:
    if isinstance(item, str):
        labels[item] = len(insns)
    else:
        insns.append(item)
raw = b"".join(struct.pack("HBBI", op, labels[t] - i - 1 if t else 0, labels[f] - i - 1 if f else 0, k)
               for i, (op, k, t, f) in enumerate(insns))
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
buf = ctypes.create_string_buffer(raw)
prog = Prog(len(insns), ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(prog), 0, 0):   # NO_NEW_PRIVS, SECCOMP
    raise OSError(ctypes.get_errno(), "seccomp")
os.execv(sys.argv[1], sys.argv[1:])
'''


def test_pulsed_runs_under_memory_deny_write_execute(tmp_path):
    """The units set MemoryDenyWriteExecute=yes: pulsed and all its workers start, reload, stop under it."""
    if platform.machine() != "x86_64":
        pytest.skip("the MemoryDenyWriteExecute emulation here is written for x86-64")
    mmap_wx = ("import mmap\ntry:\n    mmap.mmap(-1, 4096, prot=7)\nexcept PermissionError:\n"
               "    print('refused')\n")
    probe = subprocess.run([sys.executable, "-c", MDWE_EXEC, sys.executable, "-c", mmap_wx],
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert probe.stdout == "refused\n", probe.stderr   # the filter is really in force

    home, notify = tmp_path / "home", tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    sock.bind(str(notify))
    env = {k: v for k, v in os.environ.items() if k not in ("WATCHDOG_USEC", "PULSE_RUNTIME_DIR")}
    env.update(PULSE_HOME=str(home), NOTIFY_SOCKET=str(notify), PULSE_STOP_GRACE_MS="2000")
    out = open(tmp_path / "pulsed.out", "wb")
    proc = subprocess.Popen([sys.executable, "-c", MDWE_EXEC, PULSED, "--no-log-stderr"], env=env,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    seen: dict[int, psutil.Process] = {}

    def track() -> list[psutil.Process]:
        try:
            procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for p in procs:
            seen.setdefault(p.pid, p)
        return procs

    def status_rc() -> int:
        return pulsectl("--home", str(home), "status").returncode

    try:
        deadline = time.monotonic() + 30
        messages = b""
        while b"READY=1" not in messages.split(b"\n"):
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            messages += b"\n" + sock.recv(4096)   # socket.timeout fails the test at the deadline
        deadline = time.monotonic() + 30
        while status_rc() != 0:                  # 0: every worker running, the engine too
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "pulsed.out").read_text()
            time.sleep(0.1)
        procs = track()
        assert len(procs) >= 5                   # pulsed, forkserver and the four workers
        for p in procs:
            fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{p.pid}/status").read_text().splitlines()
                          if ":\t" in line)
            assert fields["Seccomp"].strip() == "2", f"{p.cmdline()} is not under the filter"
        proc.send_signal(signal.SIGHUP)          # ExecReload=
        deadline = time.monotonic() + 10
        while "reloaded; " not in (home / "logs" / "pulse.log").read_text(errors="replace"):
            assert time.monotonic() < deadline and proc.poll() is None, "no reload after SIGHUP"
            time.sleep(0.05)
        assert proc.poll() is None and status_rc() == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0, (tmp_path / "pulsed.out").read_text()
        log = (home / "logs" / "pulse.log").read_text(errors="replace")
        assert "Operation not permitted" not in log and "Traceback" not in log, log
    finally:
        sock.close()
        track()
        for p in seen.values():
            try:
                p.kill()                          # psutil checks the create time: never a recycled pid
            except psutil.NoSuchProcess:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        out.close()
