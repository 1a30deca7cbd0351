#!/usr/bin/env python3
"""Regenerate the generated parts of docs/: the effect kinds' reference in docs/rules.md, from
pulse.effects.registry; docs/config.md, the reference of every config key, from the keys'
descriptors in pulse/core/config/; docs/cli.md, every pulsectl command, from click.
tests/test_docs.py, test_config_reference.py and test_doc_cli.py fail while they differ, so run
this after changing the registry, a config key or a command."""

from __future__ import annotations

import sys
from pathlib import Path

from pulse.cli import clireference
from pulse.core import config
from pulse.core.config import reference
from pulse.effects import registry

DOCS = Path(__file__).resolve().parents[1] / "docs"
DOC = DOCS / "rules.md"
CONFIG_DOC = DOCS / "config.md"
CLI_DOC = DOCS / "cli.md"
BEGIN = "<!-- generated from pulse.effects.registry.reference(): edit the registry, then run scripts/gen_docs.py -->"
END = "<!-- end generated -->"


def generated(text: str) -> tuple[int, int]:
    """Where the generated section's body starts and ends in `text`."""
    start = text.index(BEGIN) + len(BEGIN) + 1
    return start, text.index(END, start)


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
