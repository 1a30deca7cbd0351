"""pulsectl's click application: the group, its options, and where each command lives."""

from __future__ import annotations

import importlib
import sys

import click

from pulse import __version__
from pulse.cli.context import Context, unusable_store
from pulse.cli.launch import DEFAULT_TIMEOUT_S, home_of, import_msgspec

pass_ctx = click.make_pass_decorator(Context)


# One row per command: the module that defines it, and the one line `pulsectl --help` shows for it.
# Only the module of the command invoked is imported, so `pulsectl status` pays for click, zmq and
# msgspec, not for every other command's imports; and --help imports none of them, so the line is
# said here (tests/test_cli_imports.py holds it to the command's docstring: where the docstring's
# first sentence is longer than click's 45 characters, the line here is chosen shorter, since click
# would cut it with "..."). A new command is its module and its row here.
COMMAND_TABLE: dict[str, tuple[str, str]] = {
    "budget": ("budgetcmd", "Spend against limits per agent, today and this month; `budget reset AGENT`."),
    "check-config": ("configcmd", "Validate config.toml (and PULSE_* overrides)."),
    "config": ("configcmd", "Print the configuration pulsed would run with (--effective)."),
    "daemon": ("daemon", "Run pulsed without systemd."),
    "deploy": ("enginecmd", "Promote a staging tree that is already committed."),
    "dev": ("enginecmd", "Run the engine on staging, reloaded on every save."),
    "effects": ("pipeline", "Effects and their state."),
    "emit": ("pipeline", "Queue an effect by hand and ring the executor."),
    "engine": ("enginecmd", "The engine directory: alone, what main runs and what staging holds."),
    "events": ("pipeline", "Print events (-n, --type, --since, -f)."),
    "fleet": ("fleetcmd", "The Pulses of the fleet, over NATS JetStream (enable with [fleet] enabled = true)."),
    "gate": ("mcp", "The agent's safety gate: its sessions."),
    "gate-reset": ("mcp", "Reset a gate session, or an agent's."),
    "guard": ("guardcmd", "Guard OpenClaw, Hermes or LiteLLM (--detect)."),
    "init": ("init", "Create the Pulse home with working defaults (idempotent)."),
    "instances": ("roster", "List this user's running Pulses."),
    "logs": ("logcmd", "Print Pulse's log."),
    "mcp": ("mcp", "Serve the gated tools over MCP (stdio)."),
    "notify": ("maintenance", "Notifications."),
    "pause": ("maintenance", "Leave PROCESS alone (no restarts) for a while."),
    "process": ("processcmd", "A critical process ([[process]]): list, status, restart, stop, start, logs, config."),
    "promote": ("enginecmd", "Merge staging into main, checked."),
    "reload": ("workercmd", "Re-read config.toml; restart what changed."),
    "report": ("reportcmd", "What happened on this host, judged."),
    "restart": ("workercmd", "Restart WORKER (also revives a failed engine)."),
    "resume": ("maintenance", "Watch PROCESS again."),
    "rollback": ("enginecmd", "Return main to an earlier tree."),
    "schedule": ("schedulecmd", "Recurring tasks and effects ([[schedule]] in config.toml), run by the tick."),
    "start": ("workercmd", "Start WORKER (after a stop, or a failed engine)."),
    "status": ("status", "Show every worker's and process's state."),
    "stop": ("workercmd", "Stop WORKER, or pulsed itself."),
    "store": ("storecmd", "Check, back up or compact the home's stores."),
    "systemd": ("systemdcmd", "Run pulsed under systemd."),
    "task": ("taskcmd", "Tasks for agents: add, list, show, close."),
    "vitals": ("pipeline", "The latest vitals (KEY: one, or a prefix)."),
    "web": ("webcmd", "The operator's page and /metrics."),
}
COMMAND_MODULES = {name: module for name, (module, _) in COMMAND_TABLE.items()}
SHORT_HELP = {name: line for name, (_, line) in COMMAND_TABLE.items()}


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
