"""pulsectl's click application: the group and its options; where each command lives is
pulse.cli.commandtable."""

from __future__ import annotations

import importlib
import sys

import click

from pulse import __version__
from pulse.cli.commandtable import COMMAND_MODULES, SHORT_HELP
from pulse.cli.context import Context, unusable_store
from pulse.cli.launch import DEFAULT_TIMEOUT_S, home_of
from pulse.core.leanimport import import_msgspec

pass_ctx = click.make_pass_decorator(Context)


class LazyGroup(click.Group):
    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, SHORT_HELP[name]) for name in self.list_commands(ctx)])

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMAND_MODULES:
            import difflib  # only a misspelt command
            close = difflib.get_close_matches(name, COMMAND_MODULES, n=1)
            ctx.fail(f"no command {name!r}" + (f"; did you mean {close[0]!r}?" if close else "") +
                     " (pulsectl --help lists them)")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context):
        """A store that cannot be used is one line naming the file and what to do, never a traceback."""
        try:
            return super().invoke(ctx)
        except Exception as err:
            code = unusable_store(err)
            if code is None:
                raise
            sys.exit(code)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = COMMAND_MODULES.get(name)
        if module is None:
            return None

        import_msgspec()   # before any command's module: nearly all need msgspec (--help needs none)
        commands = importlib.import_module(f"pulse.cli.{module}").COMMANDS
        return next(c for c in commands if c.name == name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
# readable=False: click would refuse a home it cannot list (exit 2) before any command runs, and an
# agent run's `pulsectl mcp`, under its own account, needs nothing from the home (the run hands it
# the gate's socket and its token); a command that does need the home says what it cannot reach (77).
@click.option("--home", envvar="PULSE_HOME", type=click.Path(file_okay=False, readable=False),
              help="Pulse home (default: $PULSE_HOME, else ~/.pulse).")
@click.option("-i", "--instance", metavar="NAME",
              help="The running Pulse called NAME (see `pulsectl instances`) instead of --home.")
@click.option("--timeout", default=DEFAULT_TIMEOUT_S, show_default=True, help="Seconds to wait for pulsed to answer.")
@click.version_option(__version__, prog_name="pulsectl")
@click.pass_context
def cli(ctx: click.Context, home: str | None, instance: str | None, timeout: float) -> None:
    """Inspect and steer Pulse, the supervisor of an AI agent's host."""
    if instance is not None:
        if ctx.get_parameter_source("home") == click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError("--home and --instance are exclusive")
        home = home_of(instance)
    ctx.obj = Context(home, timeout)
