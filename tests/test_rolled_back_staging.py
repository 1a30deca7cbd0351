"""After a rollback, and survival's automatic one above all, staging still holds the rolled-back
tree: status and `pulsectl engine` say so, and the next promote refuses it unless --again."""

from __future__ import annotations

import subprocess

from pulse.engine import repo
from support import init_home, pulsectl


def ctl(home, *args: str) -> subprocess.CompletedProcess:
    return pulsectl(["--home", str(home), *args], timeout=120)


def test_an_automatic_rollback_leaves_staging_said_and_the_next_promote_refused(tmp_path):
    home = tmp_path / "home"
    paths = init_home(home)
    (paths.staging / "rules" / "zz_broken.py").write_text("def broken(prev, curr, inner):\n"
                                                           "    return inner(prev, curr)\n\nRULES = [broken]\n")
    assert ctl(home, "promote", "-m", "the broken rule").returncode == 0
    # what survival's engine-rollback effect does (pulse/effects/repairs.py)
    repo.rollback(paths, source="executor", reason="autoRollback: the engine errs since the promote")

    engine = ctl(home, "engine")
    assert engine.returncode == 0, engine.stderr
    assert "staging still holds what the rollback at" in engine.stdout and "autoRollback" in engine.stdout
    assert "A\trules/zz_broken.py" in engine.stdout and "undid: rules/zz_broken.py" in engine.stdout
    log = ctl(home, "engine", "log")
    assert "staging still holds what the rollback" in log.stderr and "rollback" in log.stdout   # the list stays on stdout
    note = __import__("pulse.cli.statusview", fromlist=["x"]).rolled_back_note(paths)
    assert note and "autoRollback" in note

    # the agent goes on editing staging beside the broken rule: that promote used to ship it again
    (paths.staging / "rules" / "zz_other.py").write_text("RULES = []\n")
    refused = ctl(home, "promote")
    assert refused.returncode == 1 and "rollback" in refused.stderr and "--again" in refused.stderr
    assert not (paths.engine / "rules" / "zz_broken.py").exists()
    assert (paths.staging / "rules" / "zz_other.py").exists()       # staging as it was
    again = ctl(home, "promote", "--again")
    assert again.returncode == 0, again.stderr
    assert (paths.engine / "rules" / "zz_broken.py").exists()
    assert repo.rolled_back_in_staging(paths) is None
    # rolled back again, then fixed in staging: that promotes without --again
    repo.rollback(paths, source="executor", reason="autoRollback")
    assert repo.rolled_back_in_staging(paths) is not None
    (paths.staging / "rules" / "zz_broken.py").write_text("# fixed\nRULES = []\n")
    (paths.staging / "rules" / "zz_other.py").unlink()          # this rollback undid it too: dropped
    fixed = ctl(home, "promote")
    assert fixed.returncode == 0, fixed.stderr
