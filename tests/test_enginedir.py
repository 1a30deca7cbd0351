"""The engine directory: promote behind a gate, rollback, and what the running engine runs."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import threading

import psutil
import pytest

from pulse.engine import repo
from support import PULSECTL, init_home, wait_for

RULE = """
from pulse.engine.api import Effect
def {name}(prev, curr, inner):
    return [Effect(kind="noop", target="{name}")], None
RULES = [{name}]
"""


def git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def worktrees_while_added(repo) -> int:
    """The repo's worktrees, read while the gate may be adding one: git then can refuse the read (128)."""
    out = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True, timeout=30)
    return len(out.stdout.splitlines()) if out.returncode == 0 else 0


def tree_of(repo, ref: str) -> str:
    return git(repo, "rev-parse", f"{ref}^{{tree}}")


def running_commit(pulsed) -> str:
    return pulsed.events("worker-ready", "engine")[-1]["data"]["commit"]


def stage(pulsed, name: str, text: str) -> None:
    (pulsed.home / "staging" / name).write_text(text)


# An engine that takes longer than the suite's 3 s to be ready after a promote is rolled back by survival,
# as it should be: at a load of 5-6 on 2 cores one did, and the operator's promote and rollback, what these
# tests are about, were followed by survival's. The engine gets what a loaded host needs.
PATIENT = {"PULSE_TICK_MS": "200", "PULSE_READY_TIMEOUT_MS": "15000"}


def test_promote_reloads_the_engine_onto_the_new_tree_and_rollback_returns(pulsed):
    pulsed.start(env=PATIENT)
    engine = pulsed.worker("engine").pid
    before = git(pulsed.home / "engine", "rev-parse", "HEAD")
    assert running_commit(pulsed) == before
    stage(pulsed, "rules/fresh.py", RULE.format(name="fresh"))
    out = pulsed.ctl("promote", "-m", "add fresh")
    assert out.returncode == 0, out.stderr
    after = git(pulsed.home / "engine", "rev-parse", "HEAD")
    assert after != before and "restarting engine" in out.stdout
    pulsed.wait_replaced("engine", engine)
    wait_for(lambda: running_commit(pulsed) == after, 10, what="the engine running the promoted commit")
    wait_for(lambda: [e for e in pulsed.events("effect") if e["target"] == "fresh"], 10, what="the new rule acting")
    promote = pulsed.events("promote")[-1]["data"]
    assert (promote["before"], promote["after"]) == (before, after)
    assert (pulsed.home / "objects" / promote["snapshot"][7:9] / promote["snapshot"][9:]).exists()
    assert "engine at " + after[:12] in pulsed.ctl("status").stdout

    engine = pulsed.worker("engine").pid
    out = pulsed.ctl("rollback")
    assert out.returncode == 0, out.stderr
    pulsed.wait_replaced("engine", engine)
    head = git(pulsed.home / "engine", "rev-parse", "HEAD")
    assert tree_of(pulsed.home / "engine", head) == tree_of(pulsed.home / "engine", before)
    wait_for(lambda: running_commit(pulsed) == head, 10, what="the running engine back on the old tree")
    log = pulsed.ctl("engine", "log").stdout.splitlines()
    assert [line.split()[1] for line in log] == ["promote", "rollback"]


def test_a_failed_gate_leaves_main_and_the_running_engine_untouched(pulsed):
    pulsed.start()
    engine = pulsed.worker("engine").pid
    main_before = git(pulsed.home / "engine", "rev-parse", "HEAD")
    for path, text, check, where in (
            ("rules/broken.py", "def f(:\n", "compile failed", "rules/broken.py:1"),
            ("rules/boom.py", "x = 1\nraise RuntimeError('at import')\n", "import failed", "rules/boom.py:2"),
            ("tests/test_no.py", "def test_no():\n    assert False\n", "tests failed", "tests/test_no.py")):
        stage(pulsed, path, text)
        out = pulsed.ctl("promote")
        assert out.returncode == 1 and "main untouched" in out.stderr
        assert check in out.stderr and where in out.stderr, out.stderr
        assert path in git(pulsed.home / "staging", "status", "--porcelain")   # refused: staging as it was
        (pulsed.home / "staging" / path).unlink()
        assert git(pulsed.home / "engine", "rev-parse", "HEAD") == main_before
        assert not git(pulsed.home / "engine", "status", "--porcelain")
    assert pulsed.worker("engine").pid == engine and running_commit(pulsed) == main_before
    assert not pulsed.events("promote")
    assert git(pulsed.home / "engine", "worktree", "list").count("\n") == 1   # the candidate worktree is gone


def test_promote_revives_a_failed_engine(pulsed):
    pulsed.start(env={"PULSE_TEST_INJECT": "engine:crash-before-ready*6"}, wait=False)
    pulsed.wait_state("engine", "failed", timeout=15)
    stage(pulsed, "rules/fresh.py", RULE.format(name="fresh"))
    assert pulsed.ctl("promote").returncode == 0
    pulsed.wait_state("engine", "running", timeout=10)


def test_rollback_restores_from_the_snapshot_when_git_is_damaged(tmp_path):
    home = tmp_path / "home"
    paths = init_home(home)
    (home / "staging" / "rules" / "one.py").write_text(RULE.format(name="one"))
    first = repo.promote(paths)
    (home / "staging" / "rules" / "two.py").write_text(RULE.format(name="two"))
    repo.promote(paths)
    shutil.rmtree(home / "engine" / ".git" / "objects")             # git can no longer read anything
    result = repo.rollback(paths, to=first.after)
    assert result.snapshot == first.snapshot
    assert (home / "engine" / "rules" / "one.py").exists() and not (home / "engine" / "rules" / "two.py").exists()


def test_concurrent_promotes_are_serialised(tmp_path):
    home = tmp_path / "home"
    paths = init_home(home)
    (home / "staging" / "rules" / "one.py").write_text(RULE.format(name="one"))
    git(home / "staging", "add", "-A")
    git(home / "staging", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    results, errors = [], []

    def attempt():
        try:
            results.append(repo.promote(paths, deploy=True))
        except repo.EngineDirError as err:
            errors.append(err)
    threads = [threading.Thread(target=attempt) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 1 and all(e.check == "staging" for e in errors)      # the others: nothing to promote
    assert git(home / "engine", "rev-parse", "HEAD") == results[0].after
    assert not git(home / "engine", "status", "--porcelain")


def start_dev(pulsed, tracker) -> tuple[str, subprocess.Popen, int]:
    """pulsed, then `pulsectl dev`: (main's head, the dev process, the dev engine's pid)."""
    pulsed.start(env=PATIENT)
    main_head = git(pulsed.home / "engine", "rev-parse", "HEAD")
    engine = pulsed.worker("engine").pid
    dev = subprocess.Popen([PULSECTL, "--home", str(pulsed.home), "dev"], stdout=subprocess.PIPE, text=True,
                           start_new_session=True)
    tracker.add(dev.pid)
    assert "dev mode" in dev.stdout.readline() + dev.stdout.readline()
    return main_head, dev, pulsed.wait_replaced("engine", engine).pid


def test_dev_mode_runs_staging_and_reloads_on_change(pulsed, tracker):
    import os
    import signal
    import time
    main_head, dev, engine = start_dev(pulsed, tracker)
    try:
        wait_for(lambda: pulsed.events("worker-ready", "engine")[-1]["data"]["pid"] == engine, 5,
                 what="the dev engine's ready")
        staged_head = git(pulsed.home / "staging", "rev-parse", "HEAD")
        assert running_commit(pulsed).startswith(staged_head)
        changed_at = time.monotonic()
        stage(pulsed, "rules/live.py", RULE.format(name="live"))
        engine = pulsed.wait_replaced("engine", engine, timeout=5).pid
        assert time.monotonic() - changed_at < 1.0      # "within a second of a file change" (0.2 s measured)
        wait_for(lambda: [e for e in pulsed.events("effect") if e["target"] == "live"], 10,
                 what="the staged rule acting without a promote")
        assert pulsed.worker("watcher").restarts == 0    # survival keeps guarding, untouched
    finally:
        dev.send_signal(signal.SIGTERM)
        dev.wait(15)
    pulsed.wait_replaced("engine", engine)
    wait_for(lambda: running_commit(pulsed) == main_head, 10, what="the engine back on main")
    assert not (pulsed.home / "dev").exists()
    assert not [f for f in os.listdir(pulsed.home / "engine" / "rules") if f == "live.py"]


def test_the_engine_killed_during_a_promote(pulsed):
    import os
    import signal
    pulsed.start()
    # A slow engine test keeps the gate busy long enough to kill the engine in the middle of it.
    stage(pulsed, "tests/test_slow.py", "import time\n\ndef test_slow():\n    time.sleep(1.5)\n")
    stage(pulsed, "rules/fresh.py", RULE.format(name="fresh"))
    promote = subprocess.Popen([PULSECTL, "--home", str(pulsed.home), "promote"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    pulsed.tracker.add(promote.pid)
    wait_for(lambda: worktrees_while_added(pulsed.home / "engine") >= 3, 10,
             what="the gate running on its candidate")
    os.kill(pulsed.worker("engine").pid, signal.SIGKILL)
    out, err = promote.communicate(timeout=60)
    assert promote.returncode == 0, err
    head = git(pulsed.home / "engine", "rev-parse", "HEAD")
    wait_for(lambda: pulsed.worker("engine").state == "running" and running_commit(pulsed) == head, 15,
             what="the engine running the promoted commit after all")


def test_a_promote_and_a_rollback_at_once_are_serialised(tmp_path):
    home = tmp_path / "home"
    paths = init_home(home)
    (home / "staging" / "rules" / "one.py").write_text(RULE.format(name="one"))
    first = repo.promote(paths)
    (home / "staging" / "rules" / "two.py").write_text(RULE.format(name="two"))
    git(home / "staging", "add", "-A")
    git(home / "staging", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "two")
    outcomes = []

    def promote():      # again: a rollback that wins the race leaves staging holding what it undid
        outcomes.append(("promote", repo.promote(paths, deploy=True, again=True)))

    def roll_back():
        outcomes.append(("rollback", repo.rollback(paths, to=first.before, source="executor",
                                                        reason="auto-rollback")))
    threads = [threading.Thread(target=promote), threading.Thread(target=roll_back)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(kind for kind, _ in outcomes) == ["promote", "rollback"]
    (kind_a, a), (kind_b, b) = outcomes
    assert b.before == a.after                      # the second started from where the first ended
    assert not git(home / "engine", "status", "--porcelain")
    expected = (home / "engine" / "rules" / "two.py").exists()
    assert expected == (kind_b == "promote")


def test_a_promote_after_a_rollback_runs_exactly_what_staging_has(tmp_path):
    """Promote a.py, roll back, add b.py in staging, promote: main is staging's tree, a.py included
    (a plain merge let the rollback's revert on main win, and a.py silently went missing)."""
    home = tmp_path / "home"
    paths = init_home(home)
    (home / "staging" / "rules" / "a.py").write_text(RULE.format(name="a"))
    repo.promote(paths)
    repo.rollback(paths)
    assert not (home / "engine" / "rules" / "a.py").exists()
    assert repo.staging_differs(paths) == ["A\trules/a.py"]      # what the rollback output lists
    (home / "staging" / "rules" / "b.py").write_text(RULE.format(name="b"))
    repo.promote(paths, again=True)     # a.py is what the rollback undid: shipped again only when asked
    assert tree_of(home / "engine", "HEAD") == tree_of(home / "engine", "staging")
    assert (home / "engine" / "rules" / "a.py").exists() and (home / "engine" / "rules" / "b.py").exists()
    assert repo.staging_differs(paths) == []


def test_rollback_says_what_staging_still_has_and_how_to_drop_or_keep_it(pulsed):
    init_home(pulsed.home)
    stage(pulsed, "rules/a.py", RULE.format(name="a"))
    assert pulsed.ctl("promote").returncode == 0
    out = pulsed.ctl("rollback")
    assert out.returncode == 0, out.stderr
    assert "A\trules/a.py" in out.stdout and "reset --hard main" in out.stdout and "promote" in out.stdout
    again = pulsed.ctl("rollback", "--to", "HEAD")
    assert again.returncode == 0 and "nothing rolled back" in again.stdout
    bad = pulsed.ctl("rollback", "--to", "no-such-commit")
    assert bad.returncode == 1 and bad.stderr.count("failed") == 1


@pytest.mark.parametrize("ending", ["SIGKILL", "SIGHUP"])
def test_dev_mode_ending_any_way_returns_the_engine_to_main(pulsed, tracker, ending):
    import signal
    main_head, dev, engine = start_dev(pulsed, tracker)
    assert "the engine runs staging" in pulsed.ctl("status").stdout
    dev.send_signal(getattr(signal, ending))
    dev.wait(15)
    pulsed.wait_replaced("engine", engine, timeout=5)
    wait_for(lambda: running_commit(pulsed) == main_head, 5, what="the engine back on main")
    assert "the engine runs staging" not in pulsed.ctl("status").stdout


def test_a_dev_is_live_by_pid_and_start_not_when_a_zombie_nor_when_another_process_has_its_pid(tmp_path):
    """The engine loads staging while `pulsectl dev` lives. One killed is over even as a zombie its
    shell has yet to reap (an engine started in that moment loaded staging and asked for a second
    restart); a marker whose pid now names another process (a dev killed with -9 leaves its marker,
    and pids are reused) is over too."""
    import signal

    from pulse.core.home import dev_marker_text, dev_pid, dev_pidfd
    paths = init_home(tmp_path / "home")
    dev = subprocess.Popen(["sleep", "60"])
    try:
        paths.dev_marker.write_text(dev_marker_text(dev.pid))
        assert dev_pid(paths) == dev.pid
        pidfd = dev_pidfd(paths)
        assert pidfd is not None and not select.select([pidfd], [], [], 0)[0]
        for stale in (f"{dev.pid}\n", f"{dev.pid} 1\n", "", "not a pid\n"):  # another start, none, garbage
            paths.dev_marker.write_text(stale)
            assert dev_pid(paths) is None and dev_pidfd(paths) is None, stale
        paths.dev_marker.write_text(dev_marker_text(dev.pid))
        dev.send_signal(signal.SIGKILL)
        wait_for(lambda: psutil.Process(dev.pid).status() == psutil.STATUS_ZOMBIE, 5, what="a zombie")
        assert select.select([pidfd], [], [], 0)[0], "the pidfd turns readable at the exit"
        os.close(pidfd)
        assert dev_pid(paths) is None and dev_pidfd(paths) is None
    finally:
        dev.kill()
        dev.wait(5)
    assert dev_pid(paths) is None


def test_a_refused_promote_shows_the_failing_assertion_and_leaves_staging_as_it_was(tmp_path):
    home = tmp_path / "home"
    paths = init_home(home)
    (home / "staging" / "tests" / "test_mine.py").write_text(
        "def test_the_answer():\n    answer = 41\n    assert answer == 42, 'the answer drifted'\n")
    before = git(home / "staging", "rev-parse", "HEAD")
    with pytest.raises(repo.EngineDirError) as err:
        repo.promote(paths)
    text = str(err.value)
    assert "FAILED tests/test_mine.py::test_the_answer" in text
    assert "assert answer == 42" in text and "the answer drifted" in text       # the assertion, not only FAILED
    assert git(home / "staging", "rev-parse", "HEAD") == before                 # no commit left behind
    assert "tests/test_mine.py" in git(home / "staging", "status", "--porcelain")   # the change, uncommitted


def test_the_gate_runs_the_engines_pytest_settings_not_the_callers_and_says_what_pytest_could_not_run(
        tmp_path, monkeypatch):
    home = tmp_path / "home"
    init_home(home)
    (home / "staging" / "tests" / "test_mine.py").write_text("def test_fine():\n    assert True\n")
    # whoever started pulsed asked for a report and a plugin: none of it is the engine's
    monkeypatch.setenv("PYTEST_ADDOPTS", f"-p no_such_plugin_of_the_caller --junitxml={tmp_path / 'callers.xml'}")
    monkeypatch.setenv("PYTEST_PLUGINS", "no_such_plugin_either")
    repo.check_tests(home / "staging")
    assert not (tmp_path / "callers.xml").exists()
    # the engine's own configuration applies, and a plugin it names that is missing is said as pytest says it
    (home / "staging" / "pytest.ini").write_text("[pytest]\naddopts = -p the_engines_missing_plugin\n")
    with pytest.raises(repo.EngineDirError) as err:
        repo.check_tests(home / "staging")
    assert "the_engines_missing_plugin" in str(err.value), str(err.value)


def test_a_rule_that_keeps_raising_reaches_the_log_coalesced(pulsed):
    from support import engine_rule
    engine_rule(pulsed, "broken", "def broken(prev, curr, inner):\n    raise RuntimeError('no disk here')\nRULES = [broken]\n")
    (pulsed.home / "config.toml").write_text("[store]\nerror_repeat_s = 0.5\n")
    pulsed.start(env={"PULSE_TICK_MS": "50", "PULSE_TICK_MS_MIN": "50"})

    def recorded() -> list[dict]:
        return [e for e in pulsed.events("error") if "no disk here" in e["data"]["message"]]
    wait_for(lambda: sum(e["data"]["count"] for e in recorded()) >= 10, 20, what="ten ticks of the same error")
    assert len(recorded()) < sum(e["data"]["count"] for e in recorded())   # events.db is not flooded either
    lines = [line for line in pulsed.log_text().splitlines() if "no disk here" in line]
    assert lines and len(lines) <= 3, lines      # the first, then at 10 (and 100): not one a tick


# An interpreter where pytest cannot be imported (None in sys.modules is how Python blocks a module).
PROMOTE_WITHOUT_PYTEST = """
import sys
sys.modules["pytest"] = None
from pathlib import Path
from pulse.core.home import Paths
from pulse.engine import repo
try:
    repo.promote(Paths.for_client(Path(sys.argv[1])))
except repo.EngineDirError as err:
    print(err)
"""


def test_a_promote_without_pytest_says_how_to_install_it_and_leaves_main(tmp_path):
    """pytest is not a dependency of Pulse itself: an engine with tests, promoted where it is missing,
    is refused naming what to install into which interpreter, not reported as a failing test."""
    import sys
    home = tmp_path / "home"
    init_home(home)
    (home / "staging" / "rules" / "one.py").write_text(RULE.format(name="one"))
    assert any((home / "staging" / "tests").glob("test_*.py"))       # the template's own tests
    before = git(home / "engine", "rev-parse", "HEAD")
    out = subprocess.run([sys.executable, "-c", PROMOTE_WITHOUT_PYTEST, str(home)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("tests failed: the engine has tests but pytest is not installed"), out.stdout
    assert f"{sys.executable} -m pip install 'pytest>=8'" in out.stdout
    assert "pulse-supervisor[engine-tests]" in out.stdout
    assert git(home / "engine", "rev-parse", "HEAD") == before


def test_pytest_is_an_extra_not_a_dependency():
    import configparser
    from pathlib import Path
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    def names(text):
        return [line.split(">")[0].split("=")[0].strip() for line in text.splitlines()
                if line.strip() and not line.strip().startswith("#")]
    assert "pytest" not in names(cfg["options"]["install_requires"])
    assert names(cfg["options.extras_require"]["engine-tests"]) == ["pytest"]
