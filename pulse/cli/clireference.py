"""docs/cli.md, the reference of every `pulsectl` command and option, from click itself: each
command's help as `pulsectl … --help` prints it, at a fixed width. scripts/gen_docs.py writes it;
tests/test_doc_cli.py fails while the page differs, so run that after changing a command, an option
or a help text."""

from __future__ import annotations

from collections.abc import Iterator

import click

from pulse.cli.group import cli

# A fixed width, not the terminal's: the page is the same wherever it is written.
WIDTH = 100

HEAD = """\
# The `pulsectl` reference

<!-- generated from pulsectl's click commands by scripts/gen_docs.py: edit a command's help, then run it -->

Every command and option, with the help its `--help` prints. `--home DIR` (or `PULSE_HOME`),
`-i NAME` and `--timeout S` go before the command. What each part of Pulse does: [index.md](index.md).
"""


def commands(command: click.Command, ctx: click.Context) -> Iterator[tuple[click.Command, click.Context]]:
    """This command and, depth first in name order, every command under it that is not hidden."""
    yield command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from commands(sub, click.Context(sub, info_name=name, parent=ctx,
                                                       terminal_width=WIDTH, max_content_width=WIDTH))


def anchor(path: str) -> str:
    return path.replace(" ", "-")


def reference() -> str:
    root = click.Context(cli, info_name="pulsectl", terminal_width=WIDTH, max_content_width=WIDTH,
                         **cli.context_settings)
    found = list(commands(cli, root))
    paths = [ctx.command_path for _, ctx in found]
    out = [HEAD, "\n## Commands\n\n"]
    out += [f"- [`{path}`](#{anchor(path)})\n" for path in paths[1:]]
    for (command, ctx), path in zip(found, paths, strict=True):
        out.append(f"\n## {path}\n\n```text\n{command.get_help(ctx).rstrip()}\n```\n")
    return "".join(out)

