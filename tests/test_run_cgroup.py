"""A run's identity is its cgroup, not its uid; and each run is bounded ([[agent]] limits).

Against a real pulsed running as root, with agent runs under a real second account (useradd) where
the escape needs one: two concurrent runs of one account, the second reading the first's token out
of /proc/<pid>/environ; a leftover that leaves its session, clears its environment and renames
itself; runs over their memory, pids and disk limits. The agents are small scripts the command
adapter runs, speaking the gate's wire protocol themselves (one JSON line each way).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from types import SimpleNamespace

import psutil
import pytest

from pulse.agents import runcgroup
from pulse.gate import server as gateserver
from pulse.gate.protocol import Hello
from pulse.gate.runs import RunTokens
from support import init_home, wait_for

SYSTEM_PYTHON = "/usr/bin/python3.11"     # the account runs it: the test venv may be out of its reach
LEFTOVER_NAME = "kworker/u8:3"

# argv: MODE DIR. hold: say hello with its own token, leave a leftover (double fork, setsid, empty
# environment, renamed), record both, wait for DIR/release. steal: wait for hold's record, read its
# token from /proc/<its pid>/environ and say hello with it, then with its own; record the replies.
AGENT = r"""
import ctypes, json, os, socket, subprocess, sys, time
mode, where = sys.argv[1], sys.argv[2]

def hello(token):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(os.environ["PULSE_GATE_SOCKET"])
    s.sendall(json.dumps({"op": "hello", "token": token, "agent": None}).encode() + b"\n")
    reply = json.loads(s.makefile("rb").readline() or b"null")
    s.close()
    return reply

def put(name, value):
    with open(os.path.join(where, name + ".tmp"), "w") as f:
        json.dump(value, f)
    os.rename(os.path.join(where, name + ".tmp"), os.path.join(where, name))

def wait(name):
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(where, name)) and time.monotonic() < deadline:
        time.sleep(0.02)

LEFTOVER = ("import ctypes, os, sys, time; ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0); "
            "open(sys.argv[2] + '.tmp', 'w').write(str(os.getpid())); os.rename(sys.argv[2] + '.tmp', sys.argv[2]); "
            "time.sleep(600)")

if mode == "hold":
    own = hello(os.environ["PULSE_RUN_TOKEN"])
    marker = os.path.join(where, "leftover.pid")
    if os.fork() == 0:                       # a double fork: the run's leader is not its parent
        os.setsid()
        subprocess.Popen(["[" + sys.argv[3] + "]", "-c", LEFTOVER, sys.argv[3], marker], executable=sys.executable,
                         env={}, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        os._exit(0)
    wait("leftover.pid")
    put("a.json", {"pid": os.getpid(), "own": own, "leftover": int(open(marker).read())})
    wait("release")
elif mode == "steal":
    wait("a.json")
    with open(os.path.join(where, "a.json")) as f:
        victim = json.load(f)["pid"]
    with open(f"/proc/{victim}/environ", "rb") as f:
        environ = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    stolen = environ[b"PULSE_RUN_TOKEN"].decode()
    put("b.json", {"stolen": hello(stolen), "own": hello(os.environ["PULSE_RUN_TOKEN"])})
"""


@pytest.fixture
def account():
    """A real second account, made for this test and removed after it (needs root and useradd)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or not os.path.exists(SYSTEM_PYTHON):
        why = f"needs root, useradd and the system's python ({SYSTEM_PYTHON})"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    name = f"pt32{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True, timeout=30)
    try:
        yield name
    finally:
        remove_account(name)


def remove_account(name: str) -> None:
    """userdel, once no process of the account is left (a failed test may leave one: killed by pid)."""
    import pwd
    uid = pwd.getpwnam(name).pw_uid

    def theirs() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["uids", "status"])
                if p.info["uids"] and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE]
    for proc in theirs():
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    wait_for(lambda: not theirs(), 10, what=f"no process of {name} left")
    done = subprocess.run(["userdel", name], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def shared_dir():
    """A directory every account can traverse (tmp_path is under a 0700 one), removed after the test."""
    shared = tempfile.mkdtemp(prefix="pulse-t32-", dir="/tmp")
    os.chmod(shared, 0o711)
    try:
        yield shared
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def add_task(pulsed, agent: str, prompt: str) -> str:
    out = pulsed.ctl("task", "add", "--project", "ops", "--title", "confined", "--agent", agent, "--prompt", prompt)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split()[0].rstrip(":")


def task_end(pulsed, task: str, within_s: float = 90) -> dict:
    return wait_for(lambda: next((e for e in pulsed.events(target=task) if e["type"] in ("task-acked", "task-failed")),
                                 None), within_s, what=f"the end of {task}")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_no_cgroup_left(*runs: str) -> None:
    """No cgroup directory of these runs is left in any hierarchy (their `pulse` parent may hold others')."""
    left = {run: runcgroup.find(run) for run in runs}
    assert not {run: group.dirs for run, group in left.items() if group is not None}, left


def test_a_run_cannot_use_another_runs_token_and_its_leftovers_die_with_it(pulsed, account, shared_dir, tracker):
    """Runs A and B of one account at once: B reads A's token from /proc/<A's pid>/environ (same uid:
    the kernel lets it) and says hello with it: refused NOT_YOUR_RUN, because B's process is not in
    A's cgroup; B's own token works. A leaves a process behind that double-forked, called setsid,
    cleared its environment and renamed itself [kworker/u8:3]: it was in A's cgroup, and is dead
    (by pid) once A's task has ended. No cgroup of either run is left."""
    import pwd
    scripts = os.path.join(shared_dir, "scripts")
    os.mkdir(scripts, 0o755)
    script = os.path.join(scripts, "agent.py")
    with open(script, "w") as f:
        f.write(AGENT)
    os.chmod(script, 0o644)
    work = os.path.join(shared_dir, "work")
    os.mkdir(work)
    os.chown(work, pwd.getpwnam(account).pw_uid, -1)
    agents = "".join(
        f'[[agent]]\nname = "{name}"\nadapter = "command"\nmcp = false\nuser = "{account}"\ncwd = "{work}"\n'
        f'argv = ["{SYSTEM_PYTHON}", "{script}", "{mode}", "{work}", "{LEFTOVER_NAME}"]\ntimeout_s = 90\n'
        for name, mode in (("a", "hold"), ("b", "steal")))
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(
        agents + "[tasks]\nmax_failures = 1\n"
        f'[gate]\nsocket_dir = "{shared_dir}"\n[allow]\nkinds = ["noop", "agent-run", "task-add"]\n')
    pulsed.start()
    task_a = add_task(pulsed, "a", "hold")
    try:
        seen_a = wait_for(lambda: os.path.exists(os.path.join(work, "a.json"))
                          and json.load(open(os.path.join(work, "a.json"))), 60, what="run A's hello and leftover")
        leftover = psutil.Process(seen_a["leftover"])
        tracker.add(leftover.pid)
        run_a = next(e for e in pulsed.events(target=task_a) if e["type"] == "task-executing")["data"]["run"]
        # the leftover is what the escape made of it: its own session, no environment, a kernel thread's name
        assert leftover.name() == LEFTOVER_NAME and leftover.environ() == {}, (leftover.name(), leftover.environ())
        assert os.getsid(leftover.pid) == leftover.pid != os.getsid(seen_a["pid"])
        held_by = runcgroup.membership_of(leftover.pid)
        task_b = add_task(pulsed, "b", "steal")
        ended_b = task_end(pulsed, task_b)
    finally:
        open(os.path.join(work, "release"), "w").close()
    ended_a = task_end(pulsed, task_a)
    with open(os.path.join(work, "b.json")) as f:
        seen_b = json.load(f)
    assert seen_a["own"]["op"] == "welcome" and seen_a["own"]["task"] == task_a, seen_a
    # B presented A's live token from B's own process: refused, by the cgroup (the uid is the same)
    assert seen_b["stolen"]["op"] == "refused" and seen_b["stolen"]["code"] == "NOT_YOUR_RUN", seen_b
    assert "cgroup" in seen_b["stolen"]["message"], seen_b
    assert seen_b["own"]["op"] == "welcome" and seen_b["own"]["task"] == task_b, seen_b
    # A's end froze and killed its whole cgroup, which the leftover could not leave: it is gone (by pid)
    assert gone(leftover.pid), (leftover.pid, ended_a)
    assert all(path.endswith(f"/pulse/{run_a}") for path in (held_by["pids"], held_by["freezer"])), held_by
    run_b = ended_b["data"]["run"]
    assert_no_cgroup_left(run_a, run_b)


LIMITED = """
import os, subprocess, sys, time
mode = sys.argv[1]
if mode == "memory":                          # 512 MiB, every page written
    hog = b"x" * (512 * 1024 * 1024)
elif mode == "pids":                          # 64 processes where 16 may be
    kids = []
    for _ in range(64):
        try:
            kids.append(subprocess.Popen(["sleep", "60"]))
        except OSError:
            pass
elif mode == "disk":                          # 4 files of 1 MiB where 2 MiB may be added
    for n in range(4):
        with open(f"blob-{n}", "wb") as f:
            f.write(os.urandom(1024 * 1024))
elif mode.startswith("leave:"):               # a leftover out of its session, no environment, then its pid
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={}, start_new_session=True)
    with open(mode[6:] + ".tmp", "w") as f:
        f.write(str(left.pid))
    os.rename(mode[6:] + ".tmp", mode[6:])
time.sleep(60)                                # it would end only at its timeout
"""


def test_a_run_over_its_memory_pids_or_disk_limit_ends_with_that_reason(pulsed, tmp_path):
    """Three runs at once, each over one limit, each ending within seconds, failed with that limit's
    name as its reason (not the timeout's 30 s); nothing of them is left, cgroups included."""
    script = tmp_path / "limited.py"
    script.write_text(LIMITED)
    limits = {"memory": "memory_mb = 64", "pids": "pids = 16", "disk": "disk_mb = 2"}
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text("".join(
        f'[[agent]]\nname = "{mode}"\nadapter = "command"\nmcp = false\n'
        f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, "{mode}"]\ntimeout_s = 30\n'
        f"limits = {{ {line} }}\n" for mode, line in limits.items())
        + '[tasks]\nmax_failures = 1\n[allow]\nkinds = ["noop", "agent-run", "task-add"]\n')
    pulsed.start()
    tasks = {mode: add_task(pulsed, mode, "go over") for mode in limits}
    ended = {mode: task_end(pulsed, task, 60) for mode, task in tasks.items()}
    for mode, event in ended.items():
        assert event["type"] == "task-failed" and event["data"]["reason"] == mode, (mode, event["data"])
        assert event["data"]["run_ms"] < 25_000, (mode, event["data"])    # ended by Pulse, not its timeout
    assert "64 MiB" in ended["memory"]["data"]["error"] and "2 MiB" in ended["disk"]["data"]["error"], ended
    assert_no_cgroup_left(*(event["data"]["run"] for event in ended.values()))


def test_an_interrupted_runs_cgroup_is_emptied_and_removed_by_the_next_executor(pulsed, tmp_path, tracker):
    """The executor dies (SIGKILL) while a run holds a leftover outside its process group with no
    environment: its successor, settling the orphan, kills what is in the run's cgroup and removes it."""
    import signal
    script, marker = tmp_path / "limited.py", tmp_path / "leftover.pid"
    script.write_text(LIMITED)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(
        f'[[agent]]\nname = "leaver"\nadapter = "command"\nmcp = false\n'
        f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, "{{prompt}}"]\ntimeout_s = 60\n'
        '[tasks]\nmax_failures = 1\n[allow]\nkinds = ["noop", "agent-run", "task-add"]\n')
    pulsed.start()
    task = add_task(pulsed, "leaver", f"leave:{marker}")
    leftover = int(wait_for(lambda: marker.exists() and marker.read_text(), 30, what="the leftover"))
    tracker.add(leftover)
    run = pulsed.events("task-executing", task)[0]["data"]["run"]
    assert runcgroup.find(run) is not None
    os.kill(pulsed.worker("executor").pid, signal.SIGKILL)
    wait_for(lambda: next((e for e in pulsed.events("effect-failed") if e["data"]["effect_id"] == run), None), 60,
             what="the orphan settled")
    assert gone(leftover)
    assert_no_cgroup_left(run)


def test_the_gate_honours_a_token_only_from_inside_its_runs_cgroup():
    """identify and the per-call check (check_run_cgroup) against a real cgroup: a process inside
    it is the run; this test's own process, same uid, is not; a process inside it without a token
    is not the operator either (same uid); a run without a cgroup (none could be made) is checked by
    uid alone."""
    group = runcgroup.create(f"t32-{uuid.uuid4().hex[:12]}", SimpleNamespace(memory_mb=0, pids=0, cpu_percent=0))
    if group is None:
        pytest.skip("this host lets Pulse make no cgroup")
    join, fds = group.joiner()
    inside = subprocess.Popen(["sleep", "60"], preexec_fn=join)
    for fd in fds:
        os.close(fd)
    try:
        tokens = RunTokens()
        token = tokens.register(group.run, "alice", "task-1", None, group.membership)
        assert gateserver.identify(Hello(token=token), 0, 0, tokens, inside.pid)[:2] == ("alice", "task-1")
        for outsider in (os.getpid(), None):
            with pytest.raises(gateserver.Refused) as refused:
                gateserver.identify(Hello(token=token), 0, 0, tokens, outsider)
            assert refused.value.code == "NOT_YOUR_RUN"
        # without a token, a process of a run is still that run: never the operator, whatever its uid
        with pytest.raises(gateserver.Refused) as refused:
            gateserver.identify(Hello(token=None), 0, 0, tokens, inside.pid)
        assert refused.value.code == "NOT_OPERATOR" and group.run in refused.value.message
        assert gateserver.identify(Hello(token=None), 0, 0, tokens, os.getpid())[2] is None
        uncontained = tokens.register("run-2", "bob", "task-2")
        assert gateserver.identify(Hello(token=uncontained), 0, 0, tokens, os.getpid())[:2] == ("bob", "task-2")
    finally:
        assert group.freeze_and_kill() == 1
        inside.wait()
        group.remove()
    assert runcgroup.find(group.run) is None


@pytest.mark.parametrize("line, named", [("memory_mb = 8", "$.agent[0].limits.memory_mb"),
                                         ("pids = -1", "$.agent[0].limits.pids"),
                                         ("disk_gb = 2", "disk_gb")])
def test_a_bad_run_limit_is_named_and_the_defaults_are_stated(tmp_path, line, named):
    from pulse.core import config as configmod
    path = tmp_path / "config.toml"
    path.write_text(f'[[agent]]\nname = "a"\nadapter = "command"\nargv = ["true"]\nlimits = {{ {line} }}\n')
    with pytest.raises(configmod.ConfigError, match=named.replace("$", r"\$").replace("[", r"\[").replace("]", r"\]")):
        configmod.load(path)
    path.write_text('[[agent]]\nname = "a"\nadapter = "command"\nargv = ["true"]\nlimits = { pids = 0 }\n')
    limits = configmod.load(path).agent[0].limits
    assert (limits.memory_mb, limits.pids, limits.cpu_percent, limits.disk_mb) == (4096, 0, 100, 2048)
    sample = configmod.default_toml()
    limits = sample[sample.index("# [agent.limits]"):]
    assert all(f"# {key} = {value} " in limits for key, value in (("memory_mb", 4096), ("pids", 512), ("cpu_percent", 100),
                                                                  ("disk_mb", 2048)))


def test_the_v2_path_on_this_hosts_unified_hierarchy():
    """cgroup v2 as Pulse drives it where /sys/fs/cgroup is unified, tried on a hybrid host's own
    v2 mount (no controllers there: no limit is enforced, and none is claimed): a setsid'd child with
    no environment is inside, the gate's check holds it, cgroup.kill ends it, the directory goes."""
    from pathlib import Path
    unified = Path("/sys/fs/cgroup/unified")
    if runcgroup.mounts().get("") is None and not (unified / "cgroup.procs").exists():
        pytest.skip("no cgroup v2 hierarchy here")
    where = runcgroup.mounts() if "" in runcgroup.mounts() else {"": unified}
    group = runcgroup.create(f"t32v2-{uuid.uuid4().hex[:12]}", SimpleNamespace(memory_mb=64, pids=16, cpu_percent=50),
                             where)
    if group is None:
        pytest.skip("this host lets Pulse make no v2 cgroup")
    try:
        assert group.unified and group.enforced <= {"memory", "pids", "cpu"}
        join, fds = group.joiner()
        leader = subprocess.Popen(["sh", "-c", "setsid env -i sleep 60 & sleep 60"], preexec_fn=join)
        for fd in fds:
            os.close(fd)
        wait_for(lambda: len(group.members()) == 3, 10, what="the leader, its shell's child and the setsid one")
        assert all(group.holds(pid) for pid in group.members()) and not group.holds(os.getpid())
        assert group.freeze_and_kill() == 3 and not group.members()
        leader.wait(10)
    finally:
        group.remove()
    assert runcgroup.find(group.run, where) is None
