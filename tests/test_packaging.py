"""What `pip install .` installs: a host runs Pulse from a regular install, not the editable one the
tests run from, which finds every package in the source tree whatever setup.cfg lists."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_of_the_source_tree_is_listed_in_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = {line.strip() for line in cfg["options"]["packages"].splitlines() if line.strip()}
    # package_dir: "pulse.supervisor = supervisor" installs the top-level directory under pulse
    dirs = {line.split("=")[0].strip(): line.split("=")[1].strip()
            for line in cfg["options"]["package_dir"].splitlines() if "=" in line}
    found = set()
    for name, directory in dirs.items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory).parts
            if "__pycache__" in relative or relative[:1] == ("template",):
                continue            # pulse.engine's template: data a home is made from (package_data)
            dotted = ".".join((name, *relative))
            if not any(dotted.startswith(other + ".") or dotted == other for other in dirs if other != name
                       and other.startswith(name + ".")):   # a directory mapped on its own (pulse.engine)
                found.add(dotted)
    assert found - listed == set(), f"add to setup.cfg [options] packages: {sorted(found - listed)}"
