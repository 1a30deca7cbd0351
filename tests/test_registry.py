"""The effect-kind registry: one descriptor per built-in kind, enforced by the executor, checked
by check-config, and rendered as the rule author's reference."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import msgspec
import pytest

from pulse.core.wire import enginerpc
from pulse.core.wire.eventmsgs import EffectKind
from pulse.effects import registry
from support import init_home, wait_for


def test_every_built_in_kind_has_one_full_descriptor():
    assert set(registry.all_kinds()) == set(EffectKind)    # every kind a rule may name runs here, and no other
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
    # The one allowed: [allow]'s default is configuration (the operator replaces it), and core,
    # which pulsed loads, cannot import the registry.
    assert set(found) == {"config/safety.py"}
    assert found["config/safety.py"] == [["noop", "notify", "restart-process", "signal", "agent-run", "task-add"]]


def test_an_agent_runs_resource_is_the_task_it_acts_on_and_target_and_params_must_agree():
    """The gate keys an agent-run write on the task the executor will run, whichever field names it."""
    assert registry.resource("agent-run", "task-3") == registry.resource("agent-run", None, {"task_id": 3}) \
        == registry.resource("agent-run", "3", {"task_id": "task-3"}) == "task:task-3"
    both = enginerpc.Effect(kind="agent-run", target="task-1", params={"task_id": "task-2"})
    assert "name different tasks" in registry.params_problem(both)
    assert registry.params_problem(enginerpc.Effect(kind="agent-run", target="task-1", params={"task_id": 1})) is None
    assert registry.resource("agent-run", "task-1", {"task_id": "task-2"}) == "task:*"    # refused anyway


# A new kind as a contributor would add it: its module in pulse/effects/ (here a temporary folder that
# joins pulse.effects' path, so the module is pulse.effects.touchkind and leaves no file in the tree)
# and a row of the registry (and the import it names), each put into its table's own source as that
# module is imported (a finder in a sitecustomize, so every process of the test sees them: pulsed, the
# forkserver's workers, pulsectl). Nothing else is written by hand: EffectKind's new member is what
# scripts/gen_docs.py writes from the registry (the checks below compare), as are the kinds'
# reference in docs/rules.md and the list of modules in docs/architecture.md.
NEW_KIND_EDITS = {
    "pulse.core.wire.effectkinds": [('    ENGINE_ROLLBACK = "engine-rollback"\n',
                                     '    ENGINE_ROLLBACK = "engine-rollback"\n    TOUCH_FILE = "touch-file"\n')],
    "pulse.effects.registry": [
        ("\nfrom pulse.effects import configfiles,", "\nfrom pulse.effects import touchkind\nfrom pulse.effects import configfiles,"),
        ("\n)}\n\n\n# The higher layers' kinds",
         '\n    Kind("touch-file", "Creates a file of <home>/touched/, or sets its mtime to now.", NoParams,'
         ' touchkind.run_touch_file, True, "the file\'s name"),\n)}\n\n\n# The higher layers\' kinds')],
}
KIND_SITECUSTOMIZE = textwrap.dedent("""\
    import importlib.abc, importlib.machinery, os, sys
    import pulse.effects
    pulse.effects.__path__.append(os.path.join(os.path.dirname(__file__), "effects"))
    EDITS = %r

    class NewKind(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name not in EDITS:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            spec.loader = self
            return spec

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            source = open(module.__spec__.origin).read()
            for anchor, new in EDITS[module.__name__]:
                assert source.count(anchor) == 1, f"{module.__name__}: the table moved: update this test"
                source = source.replace(anchor, new)
            exec(compile(source, module.__spec__.origin, "exec"), module.__dict__)

    sys.meta_path.insert(0, NewKind())
    """) % NEW_KIND_EDITS
TOUCH_KIND = textwrap.dedent('''\
    \"\"\"touch-file: a file of <home>/touched/ made, or its mtime set to now.\"\"\"

    import os

    from pulse.effects.kinds import EffectFailed


    def run_touch_file(effect, ctx):
        name = effect.target or ""
        if not name or "/" in name or name in (".", ".."):
            raise EffectFailed("bad-target", f"touch-file: {name!r} is no file name")
        (ctx.home / "touched").mkdir(exist_ok=True)
        fd = os.open(ctx.home / "touched" / name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            os.utime(fd)
        finally:
            os.close(fd)
        return {"name": name}
    ''')
# What the suite holds of every kind, asked with the new one in place: the kind names Pulse keeps agree
# (a list of them that the three edits do not reach fails here), and the reference documents it.
KIND_CHECKS = textwrap.dedent("""\
    import importlib.util, sys
    sys.path.insert(0, %r)
    import test_cli_imports, test_registry, test_wire
    from pulse.core.wire.eventmsgs import EffectKind
    from pulse.effects import registry
    test_wire.test_the_effect_kinds_are_every_kind_the_registry_runs()
    test_registry.test_every_built_in_kind_has_one_full_descriptor()
    test_registry.test_the_reference_documents_every_kind_and_param()
    test_registry.test_no_set_of_kind_names_is_written_outside_the_registry()
    test_cli_imports.test_built_in_kinds_named_for_pulsectl_are_the_registrys()
    print(EffectKind.TOUCH_FILE, "### `touch-file`" in registry.reference())
    spec = importlib.util.spec_from_file_location("gen_docs", %r)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    effects = gen.module_tables().split("#### `pulse/effects/`")[1].split("####")[0]
    print([row for row in effects.splitlines() if "touch" in row])
    import sitecustomize
    generated = open(sys.modules["pulse.core.wire.effectkinds"].__file__).read()
    for anchor, new in sitecustomize.EDITS["pulse.core.wire.effectkinds"]:
        generated = generated.replace(anchor, new)
    print("EffectKind as generated:", gen.effect_kinds_module() == generated)
    """) % (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "scripts" / "gen_docs.py"))


def test_a_kind_is_its_module_and_its_registry_row(pulsed, tmp_path):
    import os
    import subprocess
    import sys
    folder = tmp_path / "newkind"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(KIND_SITECUSTOMIZE)
    (folder / "effects").mkdir()
    (folder / "effects" / "touchkind.py").write_text(TOUCH_KIND)
    env = {"PYTHONPATH": str(folder)}
    checks = subprocess.run([sys.executable, "-c", KIND_CHECKS], env=dict(os.environ, **env), capture_output=True,
                            text=True, timeout=120)
    assert (checks.returncode, checks.stdout) == (0, "touch-file True\n['| `touchkind` | touch-file: a file of "
                                                  "<home>/touched/ made, or its mtime set to now. |']\n"
                                                  "EffectKind as generated: True\n"), checks.stderr
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text('[allow]\nkinds = ["noop", "touch-file"]\n')
    out = pulsed.ctl("check-config", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    pulsed.start(env=env)
    out = pulsed.ctl("emit", "touch-file", "--target", "hello", "--wait", "10", env=env)
    assert out.returncode == 0 and out.stdout.split()[-1] == "acked", out.stdout + out.stderr
    assert (pulsed.home / "touched" / "hello").is_file()
