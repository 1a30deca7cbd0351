"""The effect-kind registry: one descriptor per built-in kind, enforced by the executor, checked
by check-config, and rendered as the rule author's reference."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import msgspec
import pytest

from pulse.core.wire import enginerpc
from pulse.effects import registry
from support import init_home, wait_for

BUILT_IN = {"noop", "exec", "notify", "signal", "restart-process", "restart-worker", "archive", "cleanup",
            "rotate-file", "trim-dir", "agent-run", "task-add", "engine-promote", "engine-rollback", "report", "keep-config",
            "stop-process", "on-crash-loop",
            "restore-config"}


def test_every_built_in_kind_has_one_full_descriptor():
    assert set(registry.all_kinds()) == BUILT_IN
    for name, kind in registry.all_kinds().items():
        assert kind.name == name and kind.doc and callable(kind.run)
        assert issubclass(kind.params, msgspec.Struct)
        assert kind.allow is None or kind.allow.__doc__, f"{name}: its allow-check says what it checks"
    assert registry.get("my-engine-kind") is None


def test_the_reference_documents_every_kind_and_param():
    text = registry.reference()
    for kind in registry.all_kinds().values():
        assert f"### `{kind.name}`" in text
        for field in msgspec.structs.fields(kind.params):
            assert f"`{field.encode_name}`" in text


@pytest.mark.parametrize("kind, params, named", [
    ("exec", {"argv": "ls -l"}, "params.argv"),
    ("exec", {"argv": []}, "params.argv"),
    ("exec", {"argv": ["ls"], "env": {"A": 1}}, "params.env"),
    ("signal", {"signal": 9}, "params.signal"),
    ("archive", {"to": "/x"}, "from"),
    ("notify", {"channels": "ops"}, "params.channels"),
])
def test_bad_params_name_the_field(kind, params, named):
    problem = registry.params_problem(enginerpc.Effect(kind=kind, params=params))
    assert problem is not None and named in problem and problem.startswith(kind)


def test_params_a_schema_does_not_name_are_kept_for_the_rule():
    assert registry.params_problem(enginerpc.Effect(kind="notify", params={"message": "m", "rule": "mine"})) is None


def test_an_effect_with_bad_params_fails_unrun_naming_the_field(pulsed):
    init_home(pulsed.home)
    pulsed.start()
    out = pulsed.ctl("emit", "exec", "--param", 'argv="touch /tmp/never"', "--wait", "10")
    assert out.returncode != 0
    failed = wait_for(lambda: pulsed.events("effect-failed"), 10, what="the effect failed")
    assert failed[0]["data"]["reason"] == "bad-params" and "params.argv" in failed[0]["data"]["error"]
    assert not pulsed.events("effect-executing"), "an effect with bad params is never claimed"


def test_check_config_refuses_a_kind_typo_with_a_suggestion(pulsed):
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text('[allow]\nkinds = ["noop", "notfy"]\n')
    out = pulsed.ctl("check-config")
    assert out.returncode == 78
    assert "$.allow.kinds: 'notfy' is no effect kind (did you mean 'notify'?)" in out.stderr
    reload = pulsed.ctl("reload")
    assert reload.returncode != 0 and "notfy" in reload.stderr


def test_check_config_accepts_a_kind_the_engine_declares(pulsed):
    init_home(pulsed.home)
    (pulsed.home / "engine" / "executors" / "mine.py").write_text(textwrap.dedent("""
        from pulse.engine.api import Executor

        class Deploy(Executor):
            kind = "deploy-site"

            def run(self, effect):
                return {}

        EXECUTORS = [Deploy()]
    """))
    (pulsed.home / "config.toml").write_text('[allow]\nkinds = ["noop", "deploy-site"]\n')
    out = pulsed.ctl("check-config")
    assert out.returncode == 0, out.stderr
    (pulsed.home / "config.toml").write_text('[allow]\nkinds = ["noop", "deploy-sit"]\n')
    out = pulsed.ctl("check-config")
    assert out.returncode == 78 and "did you mean 'deploy-site'?" in out.stderr



# -- what other layers know of a kind, said once here ---------------------------------------------------

def test_each_kind_says_whether_it_repairs_what_it_changes_and_whether_its_ack_proves_it():
    assert registry.repair_kinds() == {"restart-process", "archive", "cleanup", "rotate-file", "trim-dir", "exec", "engine-rollback",
                                       "restore-config"}
    assert registry.repair_kinds(registry.Repair.ENGINE) == {"engine-rollback"}
    assert registry.resource("restart-process", "gw") == registry.resource("signal", "gw") == "process:gw"
    assert registry.resource("restore-config", "gw") == registry.resource("keep-config", "gw") == "process:gw"
    assert registry.resource("restart-worker", "tick") == "worker:tick"
    assert registry.resource("engine-promote", None) == registry.resource("engine-rollback", "x") == "worker:engine"
    assert registry.resource("rotate-file", "/var/log/a.log") == "target:/var/log/a.log"
    assert registry.resource("exec", None) == "target:*" and registry.resource("my-engine-kind", "t") == "target:t"
    assert {k for k in registry.all_kinds() if registry.ack_verifies(k)} == {"noop", "notify", "keep-config"}
    assert {k for k in registry.all_kinds() if registry.tells_operator(k)} == {"notify", "report"}
    assert not registry.ack_verifies("my-engine-kind") and not registry.tells_operator("my-engine-kind")


def source_files() -> list:
    root = Path(__file__).resolve().parents[1]
    return sorted([*root.glob("pulse/**/*.py"), *root.glob("supervisor/*.py"), *root.glob("engine/*.py")])


def kind_name_sets(source: str) -> list[list[str]]:
    """Each set, tuple or list written out in `source` that holds two or more built-in kind names:
    a property of kinds (repair, resource, ...) typed again instead of read from the registry."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in registry.all_kinds()]
            if len(names) >= 2:
                out.append(names)
    return out


def test_no_set_of_kind_names_is_written_outside_the_registry():
    # the check finds what it is for
    assert kind_name_sets('REPAIRS = frozenset({"restart-process", "archive"})') == [["restart-process", "archive"]]
    assert kind_name_sets('ok = kind in ("notify", "report")') == [["notify", "report"]]
    found = {f"{path.parent.name}/{path.name}": sets for path in source_files()
             if path.name != "registry.py" and (sets := kind_name_sets(path.read_text()))}
    # The two allowed: [allow]'s default is configuration (the operator replaces it), and core,
    # which pulsed loads, cannot import the registry; the names of every built-in kind, for pulsectl
    # to check [allow] without importing every kind's module (test_cli_imports keeps it the registry's).
    assert set(found) == {"config/safety.py", "effects/__init__.py"}
    assert found["config/safety.py"] == [["noop", "notify", "restart-process", "signal", "agent-run", "task-add"]]


def test_an_agent_runs_resource_is_the_task_it_acts_on_and_target_and_params_must_agree():
    """The gate keys an agent-run write on the task the executor will run, whichever field names it."""
    assert registry.resource("agent-run", "task-3") == registry.resource("agent-run", None, {"task_id": 3}) \
        == registry.resource("agent-run", "3", {"task_id": "task-3"}) == "task:task-3"
    both = enginerpc.Effect(kind="agent-run", target="task-1", params={"task_id": "task-2"})
    assert "name different tasks" in registry.params_problem(both)
    assert registry.params_problem(enginerpc.Effect(kind="agent-run", target="task-1", params={"task_id": 1})) is None
    assert registry.resource("agent-run", "task-1", {"task_id": "task-2"}) == "task:*"    # refused anyway
