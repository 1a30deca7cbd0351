"""Fixtures: a real pulsed on a temporary home, and a tracker that kills by pid what a test started."""

import os
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest

import realtools
import support
from support import Pulsed, Tracker, kill_keepers

# Every pulsed of the run keeps its runtime directory (sockets, instance files) under one private
# directory made here and removed when the run ends: a SIGKILLed pulsed cannot remove its own.
RUN_DIR = tempfile.mkdtemp(prefix="pulse-tests-")
os.environ["XDG_RUNTIME_DIR"] = RUN_DIR
# The processes the tests start keep their temporary files there too (support.CHILD_TMPDIR): an agent
# run's scratch directory outlives a pulsed killed mid-run (its next start would remove it). pytest's
# own temporary homes stay where they were (tempfile has read TMPDIR already), kept for a post-mortem.
support.CHILD_TMPDIR = Path(RUN_DIR) / "tmp"
support.CHILD_TMPDIR.mkdir()
os.environ["TMPDIR"] = str(support.CHILD_TMPDIR)
support.GOLDEN_HOME = Path(RUN_DIR) / "golden" / "home"
# What the test workers share for the run (the LiteLLM proxy): the controller's directory, which the
# workers it starts inherit through the environment; the controller (or the only process) ends it all.
SHARED_DIR = Path(os.environ.setdefault("PULSE_TEST_SHARED_DIR", str(Path(RUN_DIR) / "shared")))
RUNS_THE_SESSION = not os.environ.get("PYTEST_XDIST_WORKER")
# OpenClaw's directories outside any TMPDIR: removed at the end if the run made them, by the process
# that ends last (xdist's controller, or the only one)
OPENCLAW_MADE_HERE = [path for path in realtools.OPENCLAW_OUTSIDE_TMPDIR if not path.exists()] \
    if RUNS_THE_SESSION else []


def pytest_sessionfinish(session, exitstatus):
    support.CTL_ZYGOTE.close()
    if RUNS_THE_SESSION:
        realtools.LiteLLM.stop_shared(SHARED_DIR / "litellm")
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    realtools.remove_openclaw_locks()
    for path in OPENCLAW_MADE_HERE:
        shutil.rmtree(path, ignore_errors=True)
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
# nothing left: the longest files go first instead. Their seconds measured with two workers on 2 cores
# at load 7-12 (a run's --junitxml, summed per file), where known; else 30 s a realcli test, 3 s a
# daemon test, 0.1 s any other. A stale figure costs only order, but a missing one can cost the end
# of the run: test_mcp, once estimated at 45 s, took 416 s and ran among the last.
MEASURED_S = {"test_realcli_guard.py": 430, "test_realcli_gateways.py": 270, "test_mcp.py": 175,
              "test_fleet.py": 155, "test_power_loss.py": 120, "test_soak.py": 90, "test_kill_matrix.py": 90,
              "test_realcli_telemetry.py": 85, "test_realcli_gate.py": 85, "test_web.py": 80,
              "test_supervisor.py": 60, "test_realcli_hermes.py": 55, "test_enginedir.py": 55,
              "test_health.py": 50, "test_realcli_codex.py": 50, "test_executor.py": 50, "test_schedules.py": 50,
              "test_gate_boundary.py": 45, "test_realcli_claude.py": 40, "test_survival_e2e.py": 40,
              "test_agent_bounds.py": 40, "test_fleet_cluster.py": 40, "test_reload.py": 35,
              "test_say_why.py": 35, "test_realcli_openclaw.py": 35, "test_telemetry_export.py": 30,
              "test_report.py": 30, "test_spend.py": 30, "test_runtime_dir.py": 30, "test_agents.py": 30,
              "test_tick.py": 25, "test_notify_outage.py": 25, "test_stall.py": 25,
              "test_config_rollback.py": 25, "test_history_retention.py": 25, "test_adapters.py": 20,
              "test_pipeline.py": 20, "test_instances.py": 15, "test_process_verbs.py": 15,
              "test_routing.py": 15, "test_cli_fastpath.py": 15, "test_process_way_out.py": 15}
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


# A daemon test mostly waits on pulsed (a file of them keeps 0.3-0.6 of a core busy), a real tool's
# test does not: an agent CLI, OpenClaw, Hermes or LiteLLM starting takes a core for seconds, and two
# of them at once on 2 cores is what their deadlines were measured at. So `-n auto` starts a worker
# more than there are cores, and no more than REALCLI_AT_ONCE realcli files run at a time: a worker
# that would take a third takes the next other file instead (PYTEST_XDIST_AUTO_NUM_WORKERS and
# PULSE_TEST_REALCLI_AT_ONCE override both).
REALCLI_AT_ONCE = int(os.environ.get("PULSE_TEST_REALCLI_AT_ONCE", "2"))


def pytest_xdist_auto_num_workers(config):
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None         # xdist's own hook reads it (this one, answering first, would hide it)
    return (os.cpu_count() or 1) + 1


def is_realcli_file(scope: str) -> bool:
    return Path(scope.split("::", 1)[0]).name.startswith("test_realcli_")


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RealcliSpread(LoadFileScheduling):
        def _assign_work_unit(self, node):
            running = sum(is_realcli_file(scope) and not all(unit.values())
                          for work in self.assigned_work.values() for scope, unit in work.items())
            if running >= REALCLI_AT_ONCE:
                other = next((scope for scope in self.workqueue if not is_realcli_file(scope)), None)
                if other is not None:
                    self.workqueue.move_to_end(other, last=False)
            super()._assign_work_unit(node)

    return RealcliSpread(config, log)


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
def litellm():
    """The run's one real LiteLLM proxy (mock_response "PONG"), started by the first realcli test that
    asks for it, in whichever test worker (it takes ~10 s to start), and stopped as the run ends: the
    agent CLIs' files (tests/test_realcli_claude.py, ...) share it."""
    from realtools import LiteLLM, require_tools
    require_tools("litellm")
    try:
        return LiteLLM.shared(SHARED_DIR / "litellm")
    except (RuntimeError, TimeoutError) as err:
        pytest.fail(str(err))


@pytest.fixture(scope="session")
def openclaw_tmp():
    """OpenClaw's TMPDIR, one for the run's every gateway: its launcher keeps node's compile cache
    there (warm, a start takes ~4 s and ~6 s of CPU less), and its terminal uploads; never /tmp. Not
    NODE_COMPILE_CACHE: with it set, the launcher respawns itself onto a cache directory of its own,
    and the gateway would not be the process Pulse started."""
    path = SHARED_DIR / "openclaw-tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def closed_port():
    """A loopback port that refuses connections (bound, never listening) for the test's length."""
    from realtools import ClosedPort
    port = ClosedPort()
    yield port.port
    port.close()


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
