"""Root beside a hostile account: what an agent's own account can place on the host never turns Pulse's
root into its tool. Each test makes a real separate account (useradd; removed after), lets it do
what an agent with a shell could, and runs a real pulsed as root:

- a directory under a watched glob, and under each file kind's paths, swapped for a link to a
  directory only root may enter: root's files there are untouched, and what lies in the agent's own
  directory is trimmed with the agent's rights;
- the runtime directory's old, guessable name taken first (a directory, a link), and the recorded
  one replaced: pulsed starts elsewhere, or refuses saying why (exit 78), and chmods nothing;
- a look-alike of a guarded [[process]] under the agent's account while the real one is dead: the
  real one is restarted;
- a fresh root-run home promotes right after its first start (no bytecode in the engine's tree).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import zlib
from pathlib import Path

import pytest
from test_survival import run, snap

from pulse.core import config as configmod
from pulse.core.home import Paths
from pulse.core.wire.enginerpc import Effect, ProcessExit, Vital
from pulse.effects import files, kinds
from pulse.rules import survival
from support import init_home, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: makes an account and runs pulsed as root")

FAST = {"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "100"}
SYSTEM_PYTHON = "/usr/bin/python3"        # an interpreter any account can run (the test venv may be out of reach)


@pytest.fixture
def agent():
    """A real account of its own, as an agent runs under; removed after the test."""
    name = f"pa{os.getpid() % 100000}{os.urandom(2).hex()}"
    subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True, timeout=30)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


@pytest.fixture
def shared():
    """A directory every account may pass through (pytest's tmp_path is under a 0700 one); removed after."""
    path = Path(tempfile.mkdtemp(prefix="pulse-bp-", dir="/tmp"))
    os.chmod(path, 0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_agent(account, *argv: str) -> None:
    """Run argv as the agent's account: what it could do from its own shell."""
    out = subprocess.run(list(argv), user=account.pw_uid, group=account.pw_gid, extra_groups=[],
                         capture_output=True, text=True, timeout=30, cwd="/")
    assert out.returncode == 0, (argv, out.stderr)


def agent_dir(path: Path, account) -> Path:
    path.mkdir(mode=0o755)
    os.chown(path, account.pw_uid, account.pw_gid)
    return path


def roots_secrets(tmp_path: Path) -> Path:
    """A directory only root may enter, holding root's files: what an agent's link would point at."""
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    for name, body in (("secret.log", b"root's own log line\n" * 200), ("old.json", b'{"root": "only"}\n'),
                       ("app.json", b'{"root": "config"}\n')):
        (secret / name).write_bytes(body)
        os.chmod(secret / name, 0o600)
        os.utime(secret / name, (1_000_000_000, 1_000_000_000))   # old enough for any archive
    return secret


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in sorted(directory.iterdir())}


def emit(pulsed, kind: str, *args: str) -> dict:
    """An operator's effect through pulsectl, and its end event's data."""
    out = pulsed.ctl("emit", kind, *args, "--wait", "20")
    effect_id = out.stdout.split()[0] if out.stdout else None
    end = next((e for e in pulsed.events() if e["type"] in ("effect-acked", "effect-failed")
                and e["data"].get("effect_id") == effect_id), None)
    assert end is not None, (out.stdout, out.stderr)
    return {"type": end["type"], **end["data"]}


def swap_for_link(account, directory: Path, target: Path) -> None:
    """The agent moves its directory aside and puts a link to `target` in its place."""
    as_agent(account, "mv", str(directory), f"{directory}.real")
    as_agent(account, "ln", "-s", str(target), str(directory))


# -- escape 1: paths that cannot be redirected ---------------------------------------------------------------

def test_no_file_kind_or_watched_glob_reaches_roots_files_through_an_agents_link(pulsed, agent, shared, tmp_path):
    secret = roots_secrets(tmp_path)
    before = snapshot(secret)
    work = agent_dir(shared / "work", agent)
    logs, sessions, conf = (agent_dir(work / d, agent) for d in ("logs", "sessions", "conf"))
    app_log = logs / "app.log"
    as_agent(agent, "sh", "-c", f"head -c 4096 /dev/zero > {app_log}")
    as_agent(agent, "sh", "-c", f'echo "{{\\"agent\\": 1}}" > {conf / "app.json"}')
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [[watch.file]]
        name = "agentlogs"
        path = "{logs}/*.log"
        max_mb = 0.001
        action = "truncate"

        [[process]]
        name = "gw"
        match = "pulse-boundary-never-runs-{tmp_path.name}"
        restart = ["true"]
        config = ["{conf / 'app.json'}"]
    """))
    pulsed.start(env=FAST)
    assert pulsed.ctl("pause", "gw").returncode == 0      # its config is what is tested, not its restarts

    # Over max_mb in the agent's own directory: trimmed, with the agent's rights.
    trimmed = wait_for(lambda: [e["data"] for e in pulsed.events("effect-acked") if e["data"].get("kind") == "rotate-file"],
                       30, what="the agent's log trimmed")
    assert app_log.stat().st_size == 0 and app_log.stat().st_uid == agent.pw_uid
    kept = emit(pulsed, "keep-config", "--target", "gw")
    assert kept["type"] == "effect-acked", kept

    # The agent swaps each of its directories for a link to root's.
    for directory in (logs, sessions, conf):
        swap_for_link(agent, directory, secret)
    archive_to = work / "archive"
    as_agent(agent, "ln", "-s", str(secret), str(archive_to))

    # The survival layer trims nothing through the link, and the watcher matches nothing there.
    pulsed.wait_ticks(10)
    assert snapshot(secret) == before
    wait_for(lambda: [f for f in pulsed.status().files if f.name == "agentlogs" and f.files == 0], 20,
             what="the watched glob matching nothing through the link")
    refused = emit(pulsed, "rotate-file", "--target", f"{logs}/secret.log", "--param", "watch=agentlogs")
    assert refused["type"] == "effect-failed" and refused["reason"] == "refused", refused
    # cleanup through the link deletes nothing of root's
    cleaned = emit(pulsed, "cleanup", "--param", f'patterns=["{logs}/*.log", "{sessions}/*"]')
    assert cleaned["type"] == "effect-acked" and cleaned["removed"] == 0, cleaned
    # archive copies no secret out through a link, and plants nothing in root's directory through one
    out = emit(pulsed, "archive", "--param", f"from={sessions}", "--param", f"to={work / 'out'}",
               "--param", "older_than_h=0")
    assert out["type"] == "effect-failed" and out["reason"] == "refused" and "symbolic link" in out["error"], out
    old = work / "sessions.real" / "planted.json"
    as_agent(agent, "sh", "-c", f"echo planted > {old} && touch -d 2001-01-01 {old}")
    planted = emit(pulsed, "archive", "--param", f"from={work / 'sessions.real'}", "--param", f"to={archive_to}",
                   "--param", "older_than_h=0")
    assert planted["type"] == "effect-failed" and planted["reason"] == "refused", planted
    # restore-config writes nothing over root's file through the agent's link
    restored = emit(pulsed, "restore-config", "--target", "gw", "--param",
                    "files=" + json.dumps({str(conf / "app.json"): kept["files"][str(conf / "app.json")]["ref"]}))
    assert restored["type"] == "effect-failed" and restored["reason"] == "refused", restored

    assert snapshot(secret) == before                     # root's files: not one byte, not one mode changed
    assert stat.S_IMODE(secret.stat().st_mode) == 0o700 and old.exists()
    # and what was trimmed in the agent's own directory was trimmed with the agent's rights
    assert trimmed[0]["path"] == str(app_log) and trimmed[0]["as_uid"] == agent.pw_uid, trimmed


def test_a_hard_link_in_an_agents_directory_is_trimmed_with_the_agents_rights(tmp_path, agent, shared):
    """With fs.protected_hardlinks off, an agent could link root's file into its directory; the trim
    runs as the agent, so root's file is refused, never emptied (in-process: the effect itself)."""
    work = agent_dir(shared / "work", agent)
    rootfile = work / "root.log"                       # what a hard link to root's file looks like: root's, 0600
    rootfile.write_bytes(b"r" * 4096)
    os.chmod(rootfile, 0o600)
    home = tmp_path / "home"
    home.mkdir()
    cfg = configmod.slice_of(configmod.validate(configmod.decode(
        f'[[watch.file]]\nname = "w"\npath = "{work}/*.log"\naction = "truncate"\n'.encode(), "t"), "t"), "executor")
    ctx = kinds.EffectContext(cfg, home / "objects", 10, paths=Paths(home, tmp_path / "run"))
    with pytest.raises(kinds.EffectFailed) as err:
        files.run_rotate_file(Effect(kind="rotate-file", target=str(rootfile), params={"watch": "w"}), ctx)
    assert err.value.reason == "not-permitted", err.value.error
    assert rootfile.read_bytes() == b"r" * 4096


# -- escape 6: the runtime directory ------------------------------------------------------------------------

def old_runtime_name(home: Path, base: Path) -> Path:
    """The name every earlier pulsed gave its runtime directory: a function of the home an agent reads."""
    return base / f"pulse-0-{format(zlib.crc32(str(home).encode()), '08x')}"


def test_the_runtime_directory_cannot_be_taken_first_or_redirected(pulsed, agent, tmp_path, monkeypatch):
    base = Path(tempfile.mkdtemp(prefix="pulse-bp-tmp-", dir="/tmp"))
    os.chmod(base, 0o1777)                                 # a /tmp of its own: shared, sticky
    try:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
        env = {"TMPDIR": str(base), "PULSE_INSTANCES_DIR": str(tmp_path / "registry")}
        decoy = tmp_path / "decoy"
        decoy.mkdir(mode=0o755)                            # root's, open to all: a link would make pulsed chmod it
        init_home(pulsed.home)
        # the agent takes the old name first: a directory of its own, and beside it a link
        guessed = old_runtime_name(pulsed.home, base)
        as_agent(agent, "mkdir", "-m", "0777", str(guessed))
        as_agent(agent, "ln", "-s", str(decoy), str(base / f"pulse-0-{'0' * 8}"))
        pulsed.start(env=env)
        runtime = pulsed.paths.runtime
        assert runtime != guessed and runtime.parent == base and (runtime / "control.ipc").exists()
        st = os.lstat(runtime)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
        assert str(pulsed.home) not in runtime.name and format(zlib.crc32(str(pulsed.home).encode()), "08x") not in runtime.name
        assert pulsed.ctl("status").returncode == 0
        assert pulsed.terminate() == 0 and not runtime.exists()

        # the name it recorded, taken while it was down: a directory the agent made, then a link
        for place in (lambda: as_agent(agent, "mkdir", "-m", "0700", str(runtime)),
                      lambda: as_agent(agent, "ln", "-s", str(decoy), str(runtime))):
            place()
            pulsed.start(env=env, wait=False)
            assert pulsed.proc.wait(30) == 78
            said = (pulsed.home.parent / "pulsed.out").read_text()
            assert f"runtime directory {runtime}" in said and "pulsed did not make it" in said, said[-2000:]
            assert stat.S_IMODE(decoy.stat().st_mode) == 0o755 and not list(decoy.iterdir())
            os.rmdir(runtime) if not runtime.is_symlink() else runtime.unlink()
        assert guessed.stat().st_uid == agent.pw_uid       # the agent's own, left as it was
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- escape 7: a look-alike of a guarded process ----------------------------------------------------------

def test_a_look_alike_under_another_account_does_not_keep_a_dead_process_alive(pulsed, agent, tmp_path, tracker):
    marker = f"pulse-gw-{tmp_path.name}"
    argv = [SYSTEM_PYTHON, "-c", "import time; time.sleep(3600)", marker]
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [[process]]
        name = "gw"
        match = "{marker}"
        restart = {json.dumps(argv)}
        start_grace_s = 0.2

        [survival]
        process_backoff_base_s = 0.1
    """))
    pulsed.start(env=FAST)
    first = wait_for(lambda: [e["data"] for e in pulsed.events("effect-acked") if e["data"].get("kind") == "restart-process"],
                     30, what="the first start of gw")[0]
    tracker.add(first["pid"])
    decoy = subprocess.Popen(argv, user=agent.pw_uid, group=agent.pw_gid, extra_groups=[], cwd="/",
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
    tracker.add(decoy.pid)
    try:
        os.kill(first["pid"], signal.SIGKILL)
        again = wait_for(lambda: [e["data"] for e in pulsed.events("effect-acked")
                                  if e["data"].get("kind") == "restart-process" and e["data"].get("pid") != first["pid"]],
                         30, what="gw restarted while an agent's look-alike runs")[0]
        tracker.add(again["pid"])
        assert again["pid"] != decoy.pid and decoy.poll() is None    # the agent's process: not its, and not killed
        alive = wait_for(lambda: next((p for p in pulsed.status().processes if p.name == "gw" and p.pid), None), 10,
                         what="gw alive in status")
        assert alive.pid == again["pid"]
    finally:
        decoy.kill()
        decoy.wait(10)


def test_a_death_the_keeper_recorded_is_believed_over_an_older_match():
    """Pure: the watcher says alive (pid 9, started at 100) but the keeper recorded the death of what
    Pulse started (pid 41) at 200, after the last restart: that is a look-alike, and gw is restarted."""
    gw = survival.process_watchdog
    cfg = configmod.validate(configmod.decode(b'[[process]]\nname = "gw"\nmatch = "gw"\nrestart = ["gw"]\n', "t"), "t")
    seen = {"process-alive:gw": Vital("process-alive:gw", 999.0, {"alive": True, "pid": 9, "since": 100.0})}
    dead = run(gw, snap(vitals=seen, exits={"gw": ProcessExit(41, 200.0, None, "SIGKILL")}), cfg=cfg)[0]
    assert [(e.kind, e.target, e.params.get("pid")) for e in dead] == [("restart-process", "gw", 41)]
    launcher = run(gw, snap(vitals=seen, exits={"gw": ProcessExit(41, 200.0, 0)}), cfg=cfg)[0]
    assert launcher == []                                  # a clean exit: what it launched lives on
    newer = {"process-alive:gw": Vital("process-alive:gw", 999.0, {"alive": True, "pid": 9, "since": 300.0})}
    assert run(gw, snap(vitals=newer, exits={"gw": ProcessExit(41, 200.0, None, "SIGKILL")}), cfg=cfg)[0] == []


# -- the first promote of a fresh root-run home -------------------------------------------------------------

def test_a_fresh_home_promotes_right_after_its_first_start(pulsed, monkeypatch):
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)      # as a host runs it: bytecode on by default
    init_home(pulsed.home)
    pulsed.start()
    wait_for(lambda: pulsed.events("worker-ready", "engine"), 20, what="the engine loaded")
    assert not list((pulsed.home / "engine").rglob("__pycache__"))
    (pulsed.home / "staging" / "rules" / "fresh.py").write_text("RULES = []\n")
    out = pulsed.ctl("promote", "-m", "first promote", env={"PYTHONDONTWRITEBYTECODE": ""})
    assert out.returncode == 0, out.stderr
    assert not list((pulsed.home / "staging").rglob("__pycache__"))
    out = pulsed.ctl("engine", "log")
    assert "promote" in out.stdout, out.stdout


def test_an_agents_archive_or_cleanup_stays_in_the_directories_the_config_names(pulsed, tmp_path):
    """Allowed to agents, archive and cleanup act only where the operator's config names: a root
    directory named in nobody's config is refused whole, and survival's own paths still work."""
    secret = roots_secrets(tmp_path)
    before = snapshot(secret)
    sessions, kept = tmp_path / "sessions", tmp_path / "kept"
    sessions.mkdir()
    (sessions / "old.json").write_text("x")
    os.utime(sessions / "old.json", (1_000_000_000, 1_000_000_000))
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
        [survival]
        archive_from = "{sessions}"
        archive_to = "{kept}"

        [allow]
        kinds = ["noop", "archive", "cleanup"]
    """))
    (pulsed.home / "engine" / "rules" / "sweep.py").write_text(textwrap.dedent(f"""
        from pulse.engine.api import Effect
        done = set()
        def sweep(prev, curr, inner):
            out = []
            for kind, params in (("cleanup", {{"patterns": ["{secret}/*.log"]}}),
                                 ("archive", {{"from": "{secret}", "to": "{kept}/stolen", "older_than_h": 0}}),
                                 ("archive", {{"from": "{sessions}", "to": "{kept}", "older_than_h": 0}})):
                if (kind, str(params)) not in done:
                    done.add((kind, str(params)))
                    out.append(Effect(kind=kind, target="sweep", params=params))
            return out, None
        RULES = [sweep]
    """))
    subprocess.run(["git", "-C", str(pulsed.home / "engine"), "add", "-A"], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(pulsed.home / "engine"), "-c", "user.name=t", "-c", "user.email=t@t", "commit",
                    "-qm", "sweep"], check=True, capture_output=True)
    pulsed.start(env=FAST)
    ends = wait_for(lambda: (lambda e: e if len(e) >= 3 else None)(
        [e for e in pulsed.events() if e["type"] in ("effect-acked", "effect-failed")
         and e["data"].get("kind") in ("archive", "cleanup")]), 30, what="the engine's three effects ended")
    by_what = {(e["data"]["kind"], e["type"]): e["data"] for e in ends}
    assert "lies in no directory the config names" in by_what["cleanup", "effect-failed"]["error"]
    assert "lies in no directory the config names" in by_what["archive", "effect-failed"]["error"]
    assert by_what["archive", "effect-acked"]["moved"] == 1 and (kept / "old.json").exists()
    assert snapshot(secret) == before and not (kept / "stolen").exists()


def test_an_error_log_in_an_agents_directory_is_never_read_through_its_link(tmp_path, agent, shared):
    """The error-log watcher tails an agent's log; the agent swaps its directory for a link to
    root's, where a file of the same name holds root's lines: none of them reaches the vitals."""
    from pulse.sensing.builtin import ErrorLog
    secret = roots_secrets(tmp_path)
    (secret / "app.log").write_bytes(b"")
    os.chmod(secret / "app.log", 0o600)
    logs = agent_dir(agent_dir(shared / "work", agent) / "logs", agent)
    as_agent(agent, "sh", "-c", f"echo starting > {logs / 'app.log'}")
    watcher = ErrorLog(configmod.ErrorLogWatch(name="agent", path=str(logs / "app.log")), 100)
    try:
        assert watcher.collect()["matches"] == 0                  # the first read starts at the end
        as_agent(agent, "sh", "-c", f"echo 'ERROR agent line' >> {logs / 'app.log'}")
        assert watcher.collect()["lines"] == ["ERROR agent line"]
        swap_for_link(agent, logs, secret)
        with open(secret / "app.log", "ab") as f:
            f.write(b"ERROR root's secret line\n")
        for _ in range(2):
            seen = watcher.collect()
            assert seen["matches"] == 0 and not any("secret" in line for line in seen["lines"]), seen
    finally:
        watcher.close()


def test_a_process_with_a_user_is_started_as_that_account(tmp_path, agent):
    """[[process]] user: the keeper starts `restart` as that account (its uid and primary group)."""
    home = tmp_path / "home"
    init_home(home)
    log = tmp_path / "process.log"
    out = subprocess.run([sys.executable, "-m", "pulse.effects.keeper", str(home), "gw", str(log),
                          "--user", agent.pw_name, "--", "sh", "-c", "echo $(id -u) $(id -g)"],
                         capture_output=True, text=True, timeout=60, cwd="/")
    said = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    ended = next(m for m in said if "code" in m)
    assert ended["code"] == 0 and ended["tail"].split() == [str(agent.pw_uid), str(agent.pw_gid)], (said, out.stderr)


def test_in_a_directory_a_group_shares_each_file_is_acted_on_as_its_owner(tmp_path, agent, shared):
    """A root directory the agent's group may write (/var/log is root:syslog 0775 on some hosts):
    the agent's file there is trimmed with the agent's rights, root's with root's, and a link the
    agent put there is never followed."""
    logs = shared / "logs"
    logs.mkdir(mode=0o775)
    os.chown(logs, 0, agent.pw_gid)
    os.chmod(logs, 0o775)
    as_agent(agent, "sh", "-c", f"head -c 3000 /dev/zero > {logs / 'agent.log'}")
    (logs / "root.log").write_bytes(b"r" * 3000)
    secret = roots_secrets(tmp_path)
    as_agent(agent, "ln", "-s", str(secret / "secret.log"), str(logs / "link.log"))
    home = tmp_path / "home"
    home.mkdir()
    cfg = configmod.slice_of(configmod.validate(configmod.decode(
        f'[[watch.file]]\nname = "w"\npath = "{logs}/*.log"\naction = "truncate"\n'.encode(), "t"), "t"), "executor")
    ctx = kinds.EffectContext(cfg, home / "objects", 10, paths=Paths(home, tmp_path / "run"))

    def trim(name):
        return files.run_rotate_file(Effect(kind="rotate-file", target=str(logs / name), params={"watch": "w"}), ctx)

    assert trim("agent.log")["as_uid"] == agent.pw_uid and (logs / "agent.log").stat().st_size == 0
    assert "as_uid" not in trim("root.log") and (logs / "root.log").stat().st_size == 0
    with pytest.raises(kinds.EffectFailed) as err:
        trim("link.log")
    assert err.value.reason == "refused" and (secret / "secret.log").stat().st_size > 0


def test_a_link_root_placed_where_only_root_writes_is_followed_and_an_agents_is_not(tmp_path, agent, shared):
    """/var/run -> /run, a merged /lib: a link in a directory only root may write is root's word and
    is followed, walked from / like any path; the same link in the agent's directory is not."""
    from pulse.core import safepath
    real = tmp_path / "real"
    real.mkdir()
    (real / "a.log").write_text("x")
    (tmp_path / "link").symlink_to("real")                       # relative, as /var/run's is
    assert [p for p, _, _ in safepath.regular_files(f"{tmp_path}/link/*.log")] == [f"{tmp_path}/link/a.log"]
    work = agent_dir(shared / "work", agent)
    as_agent(agent, "ln", "-s", str(real), str(work / "link"))
    assert safepath.regular_files(f"{work}/link/*.log") == []
    with pytest.raises(safepath.Refused):
        safepath.open_dir(f"{work}/link")
