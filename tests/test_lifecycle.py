"""A worker's lifecycle as data, without a daemon: the child specs say how workers differ, every
state change pulsed makes is an edge of the table, and an edge taken from a state it does not
leave is refused."""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec
import pytest

from pulse.core import childspecs as specs
from pulse.core import config as configmod
from pulse.core.childspecs import ChildSpec
from pulse.core.states import WorkerState
from pulse.core.wire.eventmsgs import EVENT_TYPES
from pulse.supervisor import child as lifecycle
from pulse.supervisor.child import EDGES, Child, Fail, IllegalTransition, Restart, check_transition, enter_state

SUPERVISOR = Path(__file__).resolve().parents[1] / "supervisor"


def timings(**values) -> configmod.SupervisorTimings:
    return configmod.slice_of(configmod.Config(timings=configmod.Timings(**values)), "supervisor").timings


# -- the child specs --------------------------------------------------------------------------------

def test_the_groups_other_modules_import_are_what_they_were():
    assert specs.CORE_WORKERS == ("watcher", "tick", "executor")
    assert specs.EVENT_WRITER == "eventlog"
    assert specs.SUPERVISED == ("eventlog", "watcher", "tick", "executor", "engine")
    assert specs.WORKERS == ("watcher", "tick", "executor", "engine")
    assert specs.STEERABLE == ("watcher", "tick", "executor", "engine", "web", "fleet", "telemetry")
    assert specs.LOG_SOURCES == ("pulsed", "forkserver", "eventlog", "watcher", "tick", "executor", "engine", "web",
                                  "fleet", "telemetry")


def test_every_worker_has_a_spec_a_slice_and_a_module_to_preload():
    from pulse.supervisor.forkserver import PRELOAD
    assert list(specs.CHILD_SPECS) == list(configmod.SLICES) == list(PRELOAD)


def test_a_worker_that_is_not_core_is_retried_by_a_timing_of_its_own_600_s_by_default():
    supervisor_keys = {f.name for f in msgspec.structs.fields(configmod.SupervisorTimings)}
    retried = {s.name: s.retry_key for s in specs.CHILD_SPECS.values() if not s.core}
    assert retried == {"eventlog": "eventlog_retry_after_failed_s", "engine": "engine_retry_after_failed_s",
                       "web": "web_retry_after_failed_s", "fleet": "fleet_retry_after_failed_s",
                       "telemetry": "telemetry_retry_after_failed_s"}
    assert set(retried.values()) <= supervisor_keys
    assert {getattr(configmod.Timings(), key) for key in retried.values()} == {600}


def test_each_failed_worker_waits_its_own_timing_and_a_core_one_escalates():
    t = timings(engine_retry_after_failed_s=1, eventlog_retry_after_failed_s=2, web_retry_after_failed_s=3,
                fleet_retry_after_failed_s=4, telemetry_retry_after_failed_s=5, intensity_restarts=0)
    decisions = {name: lifecycle.on_crash(Child(spec), 100.0, t) for name, spec in specs.CHILD_SPECS.items()}
    assert decisions == {"eventlog": Fail(2), "watcher": Fail(None), "tick": Fail(None), "executor": Fail(None),
                         "engine": Fail(1), "web": Fail(3), "fleet": Fail(4),
                         "telemetry": Fail(5)}


def test_a_crash_streak_restarts_at_once_then_backs_off():
    t = timings(restart_backoff_base_ms=100, restart_backoff_max_ms=400)
    engine = Child(specs.CHILD_SPECS["engine"])
    assert [lifecycle.on_crash(engine, 100.0 + n, t) for n in range(5)] == [
        Restart(0.0), Restart(0.1), Restart(0.2), Restart(0.4), Restart(0.4)]
    assert lifecycle.on_crash(engine, 105.0, t) == Fail(600)


@pytest.mark.parametrize("spec, says", [
    (dict(core=True, retry_after_failed_s=600), "has no retry"),
    (dict(listed=False), "nothing would ever start it again"),
    (dict(entry="pulse.workers.x"), "is not module:Class"),
    (dict(status_key="url"), "without a status field"),
])
def test_a_spec_that_contradicts_itself_is_refused(spec, says):
    with pytest.raises(ValueError, match=says):
        ChildSpec(**{"name": "x", "entry": "pulse.workers.x:X", "config": "XConfig", **spec})


def test_the_web_worker_runs_only_under_its_flag():
    web = specs.CHILD_SPECS["web"]
    off = configmod.slice_of(configmod.Config(), "supervisor")
    on = configmod.slice_of(configmod.Config(web=configmod.Web(enabled=True)), "supervisor")
    assert (lifecycle.runs(web, off), lifecycle.runs(web, on)) == (False, True)
    assert lifecycle.runs(specs.CHILD_SPECS["engine"], off)
    assert lifecycle.how_to_enable(web) == "[web] enabled = true"


# -- the transitions --------------------------------------------------------------------------------

@pytest.mark.parametrize("edge", EDGES, ids=lambda e: e.name)
def test_an_edge_leaves_exactly_its_sources(edge):
    for state in WorkerState:
        if state in edge.sources:
            check_transition(state, edge)
        else:
            with pytest.raises(IllegalTransition, match=f"edge {edge.name!r} taken from {state}"):
                check_transition(state, edge)


def test_an_illegal_transition_is_an_assertion_error():
    with pytest.raises(AssertionError):
        check_transition(WorkerState.STOPPED, lifecycle.READY)


def test_edges_have_unique_names_and_record_only_known_events():
    assert len({e.name for e in EDGES}) == len(EDGES)
    assert {e.event for e in EDGES if e.event} <= EVENT_TYPES
    supervisor_keys = {f.name for f in msgspec.structs.fields(configmod.SupervisorTimings)}
    assert set(lifecycle.STATE_TIMERS.values()) <= supervisor_keys


def test_entering_a_state_sets_its_timer():
    t = timings(ready_timeout_ms=10_000, stop_grace_ms=5_000)
    child = Child(specs.CHILD_SPECS["engine"])
    enter_state(child, lifecycle.START, 100.0, t)
    assert (child.state, child.deadline) == (WorkerState.STARTING, 110.0)
    enter_state(child, lifecycle.READY, 101.0, t)
    assert (child.state, child.deadline) == (WorkerState.RUNNING, None)
    enter_state(child, lifecycle.HANG, 102.0, t)
    assert (child.state, child.deadline) == (WorkerState.HUNG, 107.0)
    enter_state(child, lifecycle.CRASH_BACKOFF, 103.0, t, due=103.5)
    assert (child.state, child.deadline) == (WorkerState.BACKOFF, 103.5)
    enter_state(child, lifecycle.CANCEL, 104.0, t)
    assert (child.state, child.deadline) == (WorkerState.STOPPED, None)


def edges_taken(source: str) -> list[ast.expr]:
    """The edge argument of every _transition and spawn call in the arbiter's source."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("_transition",
                                                                                                       "spawn"):
            if isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
                out.append(node.args[1])
    return out


def names_in(expr: ast.expr) -> list[str]:
    if isinstance(expr, ast.IfExp):
        return names_in(expr.body) + names_in(expr.orelse)
    assert isinstance(expr, ast.Name), f"an edge not named from the table: {ast.unparse(expr)}"
    return [expr.id]


def test_every_edge_the_arbiter_takes_is_in_the_table():
    taken = [name for expr in edges_taken((SUPERVISOR / "arbiter.py").read_text()) for name in names_in(expr)]
    assert taken
    not_edges = [n for n in taken if n != "edge" and getattr(lifecycle, n, None) not in EDGES]
    assert not_edges == []
    assert {e.name for e in EDGES} == {getattr(lifecycle, n).name for n in taken if n != "edge"}, "an edge no one takes"


def test_no_state_is_set_but_by_entering_it():
    setters = []
    for path in SUPERVISOR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(function):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                    if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
                flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                if any(isinstance(e, ast.Attribute) and e.attr == "state" for e in flat):
                    setters.append(f"{path.name}:{function.name}")
    assert setters == ["child.py:enter_state"]
