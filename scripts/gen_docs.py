#!/usr/bin/env python3
"""Regenerate the generated parts of docs/: the effect kinds' reference in docs/rules.md, from
pulse.effects.registry; docs/config.md, the reference of every config key, from the keys'
descriptors in pulse/core/config/; docs/cli.md, every pulsectl command, from click; the modules of
each package in docs/architecture.md, from each module's own docstring (its first sentence); and
two files of code: pulse/core/wire/effectkinds.py (`EffectKind`, the name of every kind the registry
knows, which the rules below the registry name kinds by) and pulse/cli/helptext.py (every command's
--help, which pulsectl prints without click). tests/test_docs.py,
test_config_reference.py and test_doc_cli.py fail while they differ, so run this after changing the
registry, a config key, a command or a module."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import re
import sys
from pathlib import Path

from pulse.cli import clireference
from pulse.core import config
from pulse.core.config import reference
from pulse.effects import registry

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DOC = DOCS / "rules.md"
CONFIG_DOC = DOCS / "config.md"
CLI_DOC = DOCS / "cli.md"
HELP_TEXT = ROOT / "pulse" / "cli" / "helptext.py"
BEGIN = "<!-- generated from pulse.effects.registry.reference(): edit the registry, then run scripts/gen_docs.py -->"
END = "<!-- end generated -->"
ARCHITECTURE_DOC = DOCS / "architecture.md"
MODULES_BEGIN = "<!-- generated from each module's docstring: run scripts/gen_docs.py -->"
EFFECT_KINDS = ROOT / "pulse" / "core" / "wire" / "effectkinds.py"
EFFECT_KINDS_HEAD = '''"""EffectKind: the name of every effect kind Pulse ships. Written by scripts/gen_docs.py from
pulse.effects.registry (its own rows, then the kinds of the layers above plugged in by entry point:
agent-run, task-add, report), never by hand: a new kind is its code and its registry row.

A rule names a kind as EffectKind.X, so a misspelt one is an AttributeError when the module loads,
not an effect no executor knows; `pulsectl check-config` knows every built-in kind from it, without
importing their modules. The rules are below the registry (the tick imports no executor), so the
names are written here, in core, rather than read from it. An engine's own kinds are its
executors' and stay plain strings. What each kind does: docs/rules.md."""

from __future__ import annotations

from pulse.core.wire.names import Name


class EffectKind(Name):
    """Every effect kind Pulse ships, by name (this module's docstring says whence)."""
'''
# Pulse's packages: supervisor/ and engine/ are installed as pulse.supervisor and pulse.engine
ROOT_PACKAGES = ("pulse", "pulse.supervisor", "pulse.engine")


def generated(text: str, begin: str = BEGIN) -> tuple[int, int]:
    """Where the generated section after `begin` starts and ends in `text`."""
    start = text.index(begin) + len(begin) + 1
    return start, text.index(END, start)


def first_sentence(doc: str) -> str:
    """A docstring's first sentence (of its first paragraph, on one line); its whole first paragraph
    when no sentence ends in it."""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    ended = re.match(r"(.+?\.)(\s|$)", paragraph)
    return (ended[1] if ended else paragraph).replace("|", "\\|")


def docstring(path: str) -> str:
    """A module's docstring, read from its source (nothing is imported); "" when it has none."""
    return ast.get_docstring(ast.parse(Path(path).read_text())) or ""


def search_path(package: str) -> list[str]:
    """Where a package's modules are: its __path__ once it is imported (which another folder may have
    been added to), else where its spec says."""
    if package in sys.modules:
        return list(sys.modules[package].__path__)
    return list(importlib.util.find_spec(package).submodule_search_locations)


def packages() -> list[tuple[str, dict[str, tuple[bool, str]]]]:
    """Every package of Pulse, by its dotted name, with its modules: name → (is a package, its
    docstring), walked from ROOT_PACKAGES (the engine's template/ is the agent's code, not Pulse's)."""
    found, todo = [], list(ROOT_PACKAGES)
    while todo:
        package = todo.pop(0)
        modules = {}
        for info in pkgutil.iter_modules(search_path(package)):
            name = f"{package}.{info.name}"
            if info.name == "__main__" or name in ROOT_PACKAGES:
                continue
            modules[info.name] = (info.ispkg, docstring(info.module_finder.find_spec(name).origin))
            if info.ispkg:
                todo.append(name)
        if package != "pulse":            # the layers themselves are the layer table's, written by hand
            found.append((package, dict(sorted(modules.items()))))
    return sorted(found, key=lambda p: folder_of(p[0]))


def folder_of(package: str) -> str:
    """The folder a package is in the source tree: pulse.supervisor is supervisor/."""
    parts = package.split(".")
    return "/".join(parts[1:] if parts[1:2] in (["supervisor"], ["engine"]) else parts) + "/"


def module_tables() -> str:
    """docs/architecture.md's tables of modules: for each package, each of its modules and what its
    docstring says it is."""
    out = []
    for package, modules in packages():
        out.append(f"#### `{folder_of(package)}`\n\n| module | what it is |\n|---|---|")
        out += [f"| `{name}{'/' if ispkg else ''}` | {first_sentence(doc) or '(no docstring)'} |"
                for name, (ispkg, doc) in modules.items()]
        out.append("")
    return "\n".join(out)


def effect_kinds_module() -> str:
    """pulse/core/wire/effectkinds.py as the registry says it now: a member per kind, named after it."""
    return EFFECT_KINDS_HEAD + "".join(f'    {name.upper().replace("-", "_")} = "{name}"\n'
                                       for name in registry.all_kinds())


def config_reference() -> str:
    """docs/config.md as the descriptors say it now."""
    return reference.reference(config.Config)


def main() -> int:
    text = DOC.read_text()
    start, end = generated(text)
    DOC.write_text(text[:start] + registry.reference() + text[end:])
    print(f"{DOC}: the effect kinds' reference regenerated")
    CONFIG_DOC.write_text(config_reference())
    print(f"{CONFIG_DOC}: the config reference regenerated")
    CLI_DOC.write_text(clireference.reference())
    print(f"{CLI_DOC}: the pulsectl reference regenerated")
    HELP_TEXT.write_text(clireference.help_module())
    print(f"{HELP_TEXT}: every command's --help regenerated")
    text = ARCHITECTURE_DOC.read_text()
    start, end = generated(text, MODULES_BEGIN)
    ARCHITECTURE_DOC.write_text(text[:start] + module_tables() + text[end:])
    print(f"{ARCHITECTURE_DOC}: the modules' tables regenerated")
    EFFECT_KINDS.write_text(effect_kinds_module())
    print(f"{EFFECT_KINDS}: EffectKind regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
