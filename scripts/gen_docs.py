#!/usr/bin/env python3
"""Regenerate the generated parts of docs/: the effect kinds' reference in docs/rules.md, from
pulse.effects.registry. tests/test_docs.py fails while they differ, so run this after changing
the registry."""

from __future__ import annotations

import sys
from pathlib import Path

from pulse.effects import registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "rules.md"
BEGIN = "<!-- generated from pulse.effects.registry.reference(): edit the registry, then run scripts/gen_docs.py -->"
END = "<!-- end generated -->"


def generated(text: str) -> tuple[int, int]:
    """Where the generated section's body starts and ends in `text`."""
    start = text.index(BEGIN) + len(BEGIN) + 1
    return start, text.index(END, start)


def main() -> int:
    text = DOC.read_text()
    start, end = generated(text)
    DOC.write_text(text[:start] + registry.reference() + text[end:])
    print(f"{DOC}: the effect kinds' reference regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
