"""docs/cli.md is what scripts/gen_docs.py writes from pulsectl's click commands now: a command,
an option or a help text changed without regenerating the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

from pulse.cli import clireference as reference

ROOT = Path(__file__).resolve().parent.parent


def test_the_cli_reference_is_what_click_says_now():
    assert (ROOT / "docs" / "cli.md").read_text() == reference.reference(), "run scripts/gen_docs.py"


def test_the_help_pulsectl_prints_without_click_is_what_click_says_now():
    assert (ROOT / "pulse" / "cli" / "helptext.py").read_text() == reference.help_module(), "run scripts/gen_docs.py"


def test_the_cli_reference_has_every_command_and_every_option():
    import click

    from pulse.cli.group import COMMAND_MODULES, cli
    text = reference.reference()
    headings = set(re.findall(r"^## (pulsectl.*)$", text, flags=re.M))
    assert {f"pulsectl {name}" for name in COMMAND_MODULES} <= headings
    missing = []
    root = click.Context(cli, info_name="pulsectl", **cli.context_settings)
    for command, ctx in reference.commands(cli, root):
        section = text.split(f"\n## {ctx.command_path}\n", 1)[1].split("\n## ", 1)[0]
        missing += [f"{ctx.command_path} {opt}" for param in command.params if isinstance(param, click.Option)
                    and not param.hidden for opt in param.opts if opt not in section]
    assert missing == []
