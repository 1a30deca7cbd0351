"""The effect-kind registry: one descriptor per built-in kind, enforced by the executor, checked
by check-config, and rendered as the rule author's reference."""

from __future__ import annotations

import textwrap

import msgspec
import pytest

from pulse.core import wire
from pulse.effects import registry
from support import init_home, wait_for

BUILT_IN = {"noop", "exec", "notify", "signal", "restart-process", "restart-worker", "archive", "cleanup",
            "agent-run", "task-add", "engine-promote", "engine-rollback", "report"}


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
    problem = registry.params_problem(wire.Effect(kind=kind, params=params))
    assert problem is not None and named in problem and problem.startswith(kind)


def test_params_a_schema_does_not_name_are_kept_for_the_rule():
    assert registry.params_problem(wire.Effect(kind="notify", params={"message": "m", "rule": "mine"})) is None


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

