"""Fixtures: a real pulsed on a temporary home, and a tracker that kills by pid what a test started."""

import os
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest

import support
from support import Pulsed, Tracker, kill_keepers

# Every pulsed of the run keeps its runtime directory (sockets, instance files) under one private
# directory made here and removed when the run ends: a SIGKILLed pulsed cannot remove its own.
RUN_DIR = tempfile.mkdtemp(prefix="pulse-tests-")
os.environ["XDG_RUNTIME_DIR"] = RUN_DIR
support.GOLDEN_HOME = Path(RUN_DIR) / "golden" / "home"


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    # pytest keeps its last runs' temporary homes for a post-mortem; none keeps its 32 MiB ballast file,
    # whichever fixture made the home (the `pulsed` fixture drops its own at once, to free the space early)
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is not None:
        for ballast in factory.getbasetemp().rglob("ballast"):
            ballast.unlink(missing_ok=True)


# A test that runs a pulsed (or the tracker's processes, or a real agent CLI) is a `daemon` test:
# `pytest -m "not daemon"` runs the rest, the pure tests, in well under a minute.
DAEMON_FIXTURES = {"pulsed", "tracker", "site", "litellm", "rig"}


def pytest_collection_modifyitems(items):
    for item in items:
        if DAEMON_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("realcli"):
            item.add_marker(pytest.mark.daemon)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=file_cost(items), reverse=True)     # stable: a file's own order is kept


# Under xdist (`-n auto --dist loadfile`, the README's command) each worker takes whole files in the
# order of the collection. Left to itself xdist orders them by their number of tests, which started
# the real gateways' five tests (3-5 minutes) among the last, to run alone while the other worker had
# nothing left: the longest files go first instead. Their seconds measured on 2 cores under load,
# serially, where known; else 30 s a realcli test, 3 s a daemon test, 0.1 s any other. A stale
# figure costs only order, but a missing one can cost the end of the run: test_mcp, estimated at 45 s
# (15 daemon tests), measured 416 s (its storm of 10,000 gate calls alone ~100 s) and ran among the last.
MEASURED_S = {"test_realcli_agents.py": 660, "test_mcp.py": 420, "test_realcli_gateways.py": 310, "test_fleet.py": 260,
              "test_web.py": 175, "test_realcli_telemetry.py": 135, "test_executor.py": 130, "test_survival_e2e.py": 125,
              "test_realcli_guard.py": 125, "test_supervisor.py": 110, "test_enginedir.py": 105, "test_kill_matrix.py": 100,
              "test_health.py": 60, "test_schedules.py": 55, "test_say_why.py": 55, "test_soak.py": 50,
              "test_power_loss.py": 80, "test_damaged_home.py": 50, "test_watchers.py": 50, "test_adapters.py": 50,
              "test_effect_failures.py": 40, "test_tick.py": 40, "test_policy.py": 40, "test_long_history.py": 35}
REALCLI_TEST_S = 30


def file_cost(items):
    estimate: dict[str, float] = {}
    for item in items:
        each = (REALCLI_TEST_S if item.get_closest_marker("realcli") else
                3.0 if item.get_closest_marker("daemon") else 0.1)
        estimate[item.path.name] = estimate.get(item.path.name, 0.0) + each

    def cost(item) -> float:
        return MEASURED_S.get(item.path.name, estimate[item.path.name])
    return cost


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.option.loadscopereorder = False      # the order above, not xdist's by number of tests


def pytest_runtest_setup(item):
    support.DAEMON_TEST = item.get_closest_marker("daemon") is not None
    support.FRESH_HOME = item.get_closest_marker("fresh_home") is not None


@pytest.fixture
def tracker():
    t = Tracker()
    yield t
    t.kill_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that ran a pulsed shows the end of its log beside the traceback."""
    report = yield
    pulsed = getattr(item, "funcargs", {}).get("pulsed")
    if report.when == "call" and report.failed and isinstance(pulsed, Pulsed):
        report.sections.append(("the end of pulse.log", "\n".join(pulsed.log_text().splitlines()[-100:])))
    return report


LONG_HISTORY_MIB = 40


@pytest.fixture
def nats_server(tmp_path, tracker):
    """One `nats-server -js` on loopback (tests/test_fleet.py's Nats), killed by pid at the end."""
    from tests.test_fleet import Nats
    server = Nats(tmp_path, tracker).start()
    yield server
    if server.proc.poll() is None:
        server.kill()


@pytest.fixture(scope="session")
def long_history(tmp_path_factory):
    """A home whose events.db holds LONG_HISTORY_MIB of a busy host's history, grown once per session
    (test_web_memory.grow_history: real schema, Pulse's own store functions). Never start a pulsed on
    it: copy it (copy_home)."""
    from test_web_memory import grow_history
    home = tmp_path_factory.mktemp("long-history") / "home"
    support.init_home(home)
    grow_history(home, LONG_HISTORY_MIB)
    (home / "ballast").unlink(missing_ok=True)
    return home


@pytest.fixture
def pulsed(tmp_path, tracker) -> Pulsed:
    """A pulsed, not yet started: call .start(env=...). Its home, if the test made none, is a copy of
    the run's golden home (what `pulsectl init` makes); mark a test `fresh_home` to have pulsed make it."""
    p = Pulsed(tmp_path / "home", tracker, golden=True)
    yield p
    if p.proc is not None:
        try:
            p.tree()
        except psutil.NoSuchProcess:
            pass
        if p.proc.poll() is None:
            p.proc.kill()
        p.proc.wait(10)
    kill_keepers(p.home)
    (p.home / "ballast").unlink(missing_ok=True)   # a failed test's home is kept; 32 MiB of it need not be
    # pulsed logs an illegal transition and runs on (supervisor/arbiter.py, _transition): a test fails on it
    bugs = [line for line in p.log_text().splitlines() if "BUG: illegal transition" in line]
    assert bugs == [], "pulsed took an edge its transition table does not allow"
